"""Accounts.reload (another worker's or another cluster node's change): an
unchanged user keeps its object, so a login being verified against it is not
failed by a reload made for something else."""

from __future__ import annotations

import dataclasses
from typing import Any

from tenantkv.server import auth
from tenantkv.server.accounts import Accounts


async def _no_write(op: Any) -> None:
    raise AssertionError("reload writes nothing")


def _user(name: str, uid: str, roles: dict[str, str] | None = None) -> auth.User:
    return auth.User(name, b"salt" * 4, b"hash" * 8, False, False, roles or {}, uid)


def test_reload_keeps_unchanged_users_and_takes_changed_ones() -> None:
    alice, bob = _user("alice", "a1"), _user("bob", "b1")
    accounts = Accounts(
        {"alice": alice, "bob": bob},
        config=lambda: None,  # type: ignore[arg-type,return-value]
        write=_no_write,
        sessions=[],
        data_dir="/nonexistent",
    )
    new_bob = dataclasses.replace(bob, roles={"shop": "read"})
    accounts.reload({"alice": _user("alice", "a1"), "bob": new_bob, "carol": _user("carol", "c1")})
    assert accounts.users["alice"] is alice  # equal: the object a login verifies against
    assert accounts.users["bob"] is new_bob
    assert set(accounts.users) == {"alice", "bob", "carol"}
    assert accounts.epoch == 1
    epoch = accounts.epoch
    accounts.reload(dict(accounts.users))
    assert accounts.epoch == epoch  # nothing changed: sessions need not re-check
