"""Authentication and authorization.

The permission matrix: every command in ``tenantkv.server.commands.COMMANDS``, by
{admin, readwrite user, read user, user of another bucket, unthrottled user}, by
{the tenants' bucket, another bucket}, each cell allowed or refused exactly as
the table in ``docs/security.md`` says. The expectation comes from the small
rule table below (:data:`ALLOWED`), which must equal the doc's table row by row;
the doc must list every command.

Then failed-login limiting (per source address, before any scrypt is spent),
and a search of the log and the status document for every password used.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

from tenantkv import config as config_mod
from tenantkv import errors
from tenantkv.server import auth
from tenantkv.server.doors.msgpack import MsgpackDoor
from tenantkv.server.node import Node
from tenantkv.server.role import SingleProcess
from tenantkv.storage.engine import Engine
from tests.conftest import ADMIN_PASSWORD, Daemon

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
#: The MessagePack door's commands (Redis's string commands included). Cluster-internal
#: commands are the node login's alone (tests/cluster/test_peer.py checks that every
#: user is refused them) and register only where the cluster package is imported.
COMMANDS = {name: c for name, c in MsgpackDoor.commands.items() if c.kind != "internal"}
TIMEOUT = 20

# -- the rule table (mirrors docs/security.md) ---------------------------------------

#: What a user holds on the bucket a command acts on.
COLUMNS = ("admin", "readwrite", "read", "no role")
#: Who may run each class of command.
ALLOWED: dict[str, set[str]] = {
    "read": {"admin", "readwrite", "read"},
    "write": {"admin", "readwrite"},
    "session": {"admin", "readwrite", "read", "no role"},
    "admin": {"admin"},
}
#: Commands whose rule differs from their class's.
OVERRIDES: dict[str, set[str]] = {"select_bucket": {"admin", "readwrite", "read"}}


def allowed(command: str, column: str) -> bool:
    return column in OVERRIDES.get(command, ALLOWED[COMMANDS[command].kind])


def doc_table() -> dict[str, tuple[str, dict[str, bool]]]:
    """command -> (class, column -> allowed) from the table in docs/security.md."""
    rows: dict[str, tuple[str, dict[str, bool]]] = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\|\s*`([A-Za-z_]+)`\s*\|(.*)\|\s*$", line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(2).split("|")]
        if len(cells) != 1 + len(COLUMNS) or cells[1] not in ("yes", "no"):
            continue  # another table of the page
        assert m.group(1) not in rows, f"{m.group(1)} listed twice"
        rows[m.group(1)] = (
            cells[0],
            {c: v == "yes" for c, v in zip(COLUMNS, cells[1:], strict=True)},
        )
    return rows


def test_the_doc_lists_every_command_with_the_rules_of_this_test() -> None:
    table = doc_table()
    assert set(table) == set(COMMANDS), (
        f"missing from docs/security.md: {sorted(set(COMMANDS) - set(table))}; "
        f"not commands: {sorted(set(table) - set(COMMANDS))}"
    )
    for name, (kind, cells) in table.items():
        assert kind == COMMANDS[name].kind, name
        assert cells == {c: allowed(name, c) for c in COLUMNS}, name


# -- personas and buckets --------------------------------------------------------------

OWN, OTHER = "mx-own", "mx-other"
PERSONAS: dict[str, dict[str, Any]] = {
    "admin": {"user": "admin", "password": ADMIN_PASSWORD, "admin": True, "roles": {}},
    "readwrite user": {"user": "mx-rw", "password": "pw-rw", "roles": {OWN: "readwrite"}},
    "read user": {"user": "mx-ro", "password": "pw-ro", "roles": {OWN: "read"}},
    "user of another bucket": {
        "user": "mx-else",
        "password": "pw-else",
        "roles": {OTHER: "readwrite"},
    },
    "unthrottled user": {
        "user": "mx-unth",
        "password": "pw-unth",
        "roles": {OWN: "readwrite"},
        "unthrottled": True,
    },
}
TARGETS = {"own bucket": OWN, "other bucket": OTHER}


def column(persona: dict[str, Any], bucket: str) -> str:
    if persona.get("admin"):
        return "admin"
    return persona["roles"].get(bucket, "no role")


@pytest.fixture(scope="module")
def mx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("matrix") / "data", extra_args=["--enable-test-commands"]
    ).start()
    with d.client() as c:
        for b in (OWN, OTHER):
            c.create_bucket(b)
            c.select_bucket(b)
            c.set("mx", b"seed")
        for p in PERSONAS.values():
            if not p.get("admin"):
                c.create_user(
                    p["user"],
                    p["password"],
                    roles=p["roles"],
                    unthrottled=p.get("unthrottled", False),
                )
    yield d
    d.kill()


class Args:
    """Valid arguments for each command, making throwaway buckets and users as needed,
    so an allowed cell succeeds and a wrongly allowed one harms nothing shared."""

    def __init__(self, d: Daemon, tmp: Path) -> None:
        self.d = d
        self.tmp = tmp
        self.n = itertools.count()

    def _throwaway_bucket(self) -> str:
        name = f"mx-tmp-{next(self.n)}"
        with self.d.client() as c:
            c.create_bucket(name)
        return name

    def _throwaway_user(self) -> str:
        name = f"mx-tmpu-{next(self.n)}"
        with self.d.client() as c:
            c.create_user(name, "pw")
        return name

    def __call__(self, command: str, bucket: str) -> dict[str, Any]:
        table: dict[str, Callable[[], dict[str, Any]]] = {
            "get": lambda: {"key": b"mx"},
            "exists": lambda: {"key": b"mx"},
            "mget": lambda: {"keys": [b"mx"]},
            "scan": lambda: {"prefix": b"mx"},
            "set": lambda: {"key": b"mx", "value": b"seed"},
            "delete": lambda: {"key": b"mx-absent"},
            "touch": lambda: {"key": b"mx", "ttl": 0},
            "incr": lambda: {"key": b"mx-ctr", "initial": 0},
            "decr": lambda: {"key": b"mx-ctr", "initial": 0},
            "getrange": lambda: {"key": b"mx", "start": 0, "end": 1},
            "strlen": lambda: {"key": b"mx"},
            "getbit": lambda: {"key": b"mx", "offset": 0},
            "bitcount": lambda: {"key": b"mx"},
            "bitpos": lambda: {"key": b"mx", "bit": 1},
            "lcs": lambda: {"key": b"mx", "key2": b"mx"},
            "randomkey": dict,
            "setrange": lambda: {"key": b"mx-str", "offset": 0, "value": b"x"},
            "append": lambda: {"key": b"mx-str", "value": b"x"},
            "getdel": lambda: {"key": b"mx-gone"},
            "incrbyfloat": lambda: {"key": b"mx-float", "delta": 1.5},
            "setbit": lambda: {"key": b"mx-bits", "offset": 0, "bit": 1},
            "bitop": lambda: {"op": "or", "dest": b"mx-or", "keys": [b"mx"]},
            "copy": lambda: {"key": b"mx", "dest": b"mx-copy", "replace": True},
            # (sorted: copy makes mx-copy, rename moves it, renamenx moves that once)
            "rename": lambda: {"key": b"mx-copy", "dest": b"mx-renamed"},
            "renamenx": lambda: {"key": b"mx-renamed", "dest": b"mx-renamed2"},
            "ping": dict,
            "whoami": dict,
            "multi": dict,
            "exec": dict,
            "discard": dict,
            "watch": lambda: {"keys": [b"mx"]},
            "unwatch": dict,
            "transaction": lambda: {"ops": [["get", {"key": b"mx"}]]},
            "cluster_map": dict,
            "select_bucket": lambda: {"bucket": bucket},
            "create_bucket": lambda: {"name": f"mx-new-{next(self.n)}"},
            "delete_bucket": lambda: {"name": self._throwaway_bucket()},
            "list_buckets": dict,
            "create_user": lambda: {"name": f"mx-newu-{next(self.n)}", "password": "pw"},
            "delete_user": lambda: {"name": self._throwaway_user()},
            "update_user": lambda: {"name": self._throwaway_user(), "unthrottled": False},
            "list_users": dict,
            "server_status": dict,
            "SetNodeThrottleProperties": lambda: {"json": "{}"},
            "GetNodeThrottleProperties": dict,
            "SetBucketThrottleProperties": lambda: {"bucket": bucket, "json": "{}"},
            "GetBucketThrottleProperties": lambda: {"bucket": bucket},
            "set_parameter": lambda: {"name": "log_level", "value": "info"},
            "get_parameter": lambda: {"name": "log_level"},
            "watch_events": lambda: {"bucket": bucket, "timeout_ms": 0},
            "set_bucket_queue": lambda: {"bucket": bucket, "class": "read"},
            "backup": lambda: {"path": str(self.tmp / f"backup-{next(self.n)}")},
            # (this node is in no cluster: allowed is its BadValue, past the gate)
            "cluster_rebalance": dict,
            "cluster_node_remove": lambda: {"name": "node2"},
            "configure_fail_point": lambda: {"name": "failCommand", "mode": "off"},
        }
        assert command in table, f"add valid arguments for the new command {command!r} here"
        return table[command]()


def raw_call(d: Daemon, persona: dict[str, Any], command: str, args: dict[str, Any]) -> Any:
    """One request on a connection of its own, without the client's deadline (which
    would be ``timeout_ms``: watch_events waits exactly that long when idle)."""
    hello = {"user": persona["user"], "password": persona["password"]}
    if not persona.get("admin"):
        hello["bucket"] = next(iter(persona["roles"]))
    with socket.create_connection((d.host, d.port), timeout=TIMEOUT) as s:
        s.sendall(msgpack.packb([0, 0, "hello", hello]) + msgpack.packb([0, 1, command, args]))
        u = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            assert data, "connection closed"
            u.feed(data)
            responses = list(u)
            if responses and responses[-1][1] == 1:
                err = responses[-1][2]
                if err is not None:
                    raise errors.from_wire(err, command=command)
                return responses[-1][3]


#: the transaction commands that need MULTI before them, or leave it open, run as
#: a pair on the connection so that none leaves it in MULTI for the next cell
MULTI_PAIRS = {
    "multi": ("multi", "discard"),
    "exec": ("multi", "exec"),
    "discard": ("multi", "discard"),
}


def run_cell(
    d: Daemon, c: Any, persona: dict[str, Any], command: str, args: dict[str, Any], selected: bool
) -> str:
    """'allowed' or 'refused' (Unauthorized); anything else fails the test."""
    if COMMANDS[command].kind in ("read", "write") and not selected:
        return "refused"  # the bucket could not be selected: the command cannot reach it
    try:
        if "timeout_ms" in args:
            raw_call(d, persona, command, args)
        elif command in MULTI_PAIRS:  # (each needs or opens MULTI: closed again here)
            for name in MULTI_PAIRS[command]:
                c.command(name)
        else:
            c.command(command, **args)
    except errors.Unauthorized:
        return "refused"
    except errors.BadValue as exc:
        if "in no cluster" not in exc.errmsg:
            raise
        # The gate let it through; the cluster commands then find no cluster.
    return "allowed"


def test_permission_matrix(mx: Daemon, tmp_path: Path) -> None:
    args = Args(mx, tmp_path)
    wrong: list[str] = []
    cells = 0
    for (pname, persona), (tname, bucket) in itertools.product(PERSONAS.items(), TARGETS.items()):
        col = column(persona, bucket)
        hello_bucket = None if persona.get("admin") else next(iter(persona["roles"]))
        with mx.client(
            user=persona["user"],
            password=persona["password"],
            bucket=hello_bucket,
            timeout=TIMEOUT,
            max_overload_retries=0,
        ) as c:
            me = c.command("whoami")
            assert me["unthrottled"] == bool(persona.get("unthrottled"))
            try:
                c.select_bucket(bucket)
                selected = True
            except errors.Unauthorized:
                selected = False
            # Selecting is the only way to a bucket, and hello is the same gate.
            assert selected == (col != "no role"), (pname, tname)
            if not selected:
                with pytest.raises(errors.Unauthorized):
                    mx.client(user=persona["user"], password=persona["password"], bucket=bucket)
            for command in sorted(COMMANDS):
                if command == "select_bucket":
                    got = "allowed" if selected else "refused"
                else:
                    got = run_cell(mx, c, persona, command, args(command, bucket), selected)
                cells += 1
                want = "allowed" if allowed(command, col) else "refused"
                if got != want:
                    wrong.append(f"{pname} / {tname} / {command}: {got}, expected {want}")
                if selected and COMMANDS[command].kind == "session":
                    c.select_bucket(bucket)  # keep the target selected for the data commands
    assert not wrong, "\n".join(wrong)
    assert cells == len(COMMANDS) * len(PERSONAS) * len(TARGETS)


def test_data_of_another_bucket_is_untouched(mx: Daemon) -> None:
    """After the matrix (module order): the refused writes left OTHER as the admin made it."""
    with mx.client(bucket=OTHER) as c:
        assert c.get("mx") == b"seed"


# -- failed-login limiting: Accounts.authenticate in process ----------------------------------


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Node, list[str]]]:
    """A Node over a real engine, without a writer thread (users are put in directly);
    the list records every scrypt run."""
    cfg = config_mod.Config().with_values(
        {"data_dir": str(tmp_path), "login_failure_limit": 3, "login_failure_window_secs": 60.0}
    )
    engine = Engine(tmp_path)
    n = Node(cfg, engine, role=SingleProcess())
    n.accounts.persist_known_good = False  # no writer here
    hashed: list[str] = []

    def counting(password: str, salt: bytes) -> bytes:
        # A hash that costs no time: the login delays are what the tests time, and
        # a real scrypt takes 40-200 ms on a loaded machine.
        hashed.append(password)
        return hashlib.sha256(salt + password.encode()).digest()

    monkeypatch.setattr(auth, "hash_password", counting)
    n.accounts.users["alice"] = auth.new_user("alice", "right")
    hashed.clear()
    yield n, hashed
    engine.close()


async def test_a_failure_is_held_and_refuses_its_pair_only(node: tuple[Node, list[str]]) -> None:
    """auth_delay, grown: the wrong password waits; the pair is refused (before any
    scrypt) while it waits; the right password from another pair goes at once."""
    n, hashed = node
    n.accounts.users["bob"] = auth.new_user("bob", "right")
    t0 = trio.current_time()
    with pytest.raises(errors.AuthenticationFailed):
        await n.accounts.authenticate("alice", "wrong", peer="192.0.2.1")
    assert 0.1 <= trio.current_time() - t0 < 0.5  # scrypt, then login_delay_ms
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_fails, n, "alice", "wrong2", "192.0.2.1")  # held 0.2 s
        await trio.sleep(0.05)
        with pytest.raises(errors.TooManyLoginFailures) as exc_info:
            await n.accounts.authenticate("alice", "right", peer="192.0.2.1")  # even the right one
        assert 0 < (exc_info.value.retry_after_ms or 0) <= 200
        # Refused in its delay: not replayed by the client's overload policy; or
        # (the guess still hashing) while the pair's other login is verified:
        # retryable, since it ran no hash. Either way, before any scrypt.
        assert exc_info.value.labels in ((), (errors.SYSTEM_OVERLOADED, errors.RETRYABLE))
        t1 = trio.current_time()
        assert (await n.accounts.authenticate("bob", "right", peer="192.0.2.1")).name == "bob"
        assert (await n.accounts.authenticate("alice", "right", peer="192.0.2.2")).name == "alice"
        assert trio.current_time() - t1 < 0.5  # neither was held (two scrypts)
    assert len(hashed) == 1 + 4  # bob made, four logins hashed: none for the refused one
    st = n.accounts.login_statistics()
    assert (st["failures"], st["refused"], st["hashes"]) == (2, 1, 4)


async def _fails(n: Node, user: str, password: str, peer: str) -> None:
    with pytest.raises(errors.AuthenticationFailed):
        await n.accounts.authenticate(user, password, peer=peer)


async def test_concurrent_guesses_for_one_pair_reach_scrypt_once(
    node: tuple[Node, list[str]],
) -> None:
    n, hashed = node
    outcomes: list[str] = []

    async def guess(i: int) -> None:
        try:
            await n.accounts.authenticate("alice", f"guess{i}", peer="192.0.2.3")
        except errors.TenantKVError as exc:
            outcomes.append(exc.code_name)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(guess, i)
    assert len(hashed) == 1
    assert outcomes.count("AuthenticationFailed") == 1
    assert outcomes.count("TooManyLoginFailures") == 49


async def test_the_pool_refuses_excess_cheaply_and_the_known_good_go_first(
    node: tuple[Node, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many addresses guessing at once: at most login_hash_concurrency scrypts run,
    at most login_hash_queue wait, the rest are refused at once (retryable); a
    user known at its address does not wait for them."""
    n, _hashed = node
    n.config = n.config.with_values({"login_hash_queue": 4, "login_hash_concurrency": 2})
    running = [0, 0]
    real = auth.hash_password
    gate = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def slow(password: str, salt: bytes) -> bytes:
        running[0] += 1
        running[1] = max(running[1], running[0])
        try:
            if password != "right":  # the guesses hold their hash slots until the gate
                trio.from_thread.run(gate.wait, trio_token=token)
            return real(password, salt)
        finally:
            running[0] -= 1

    monkeypatch.setattr(auth, "hash_password", slow)
    n.accounts.gate.limiter.load_known_good([("alice", "192.0.2.1", 10.0)])  # type: ignore[attr-defined]
    codes: list[str] = []
    order: list[str] = []

    async def guess(i: int) -> None:
        try:
            await n.accounts.authenticate("alice", f"g{i}", peer=f"198.51.100.{i}")
        except errors.TenantKVError as exc:
            codes.append(exc.code_name if exc.labels else "failed")
            if not exc.labels:  # hashed (not refused): in the order it was served
                order.append(f"g{i}")

    async def alice() -> None:
        await n.accounts.authenticate("alice", "right", peer="192.0.2.1")
        order.append("alice")

    async def until(done: Callable[[], bool]) -> None:
        # Polled, not slept for: threads start late on a loaded machine.
        while not done():  # noqa: ASYNC110 (set by threads and by other tasks)
            await trio.sleep(0.001)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(guess, i)
            await until(lambda: running[0] == 2 and len(codes) == 20 - 2 - 4)
            nursery.start_soon(alice)
            await until(lambda: "alice" in order)  # while both hash slots are held
            refused = codes.count("TooManyLoginFailures")
            gate.set()
    assert refused == 20 - 2 - 4  # two hashing, four waiting
    assert running[1] == 3  # and alice, in the hash kept for known-good pairs
    assert order.index("alice") == 0


async def test_concurrent_logins_with_one_credential_share_one_scrypt(
    node: tuple[Node, list[str]],
) -> None:
    n, hashed = node
    users: list[str] = []

    async def login() -> None:
        users.append((await n.accounts.authenticate("alice", "right", peer="192.0.2.4")).name)

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            for _ in range(40):
                nursery.start_soon(login)
    assert users == ["alice"] * 40 and len(hashed) == 1
    assert n.accounts.login_statistics()["failures"] == 0


# -- failed-login limiting and secrets on the real daemon --------------------------------


@pytest.fixture
def chatty(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon of its own (it gets blocked), logging at DEBUG."""
    d = Daemon(tmp_path / "data", extra_args=["--log-level", "debug"]).start()
    yield d
    d.kill()


def test_login_limit_on_the_daemon_and_no_secrets_anywhere(chatty: Daemon) -> None:
    d = chatty
    secrets = ["Sup3r-Secret-Pa55", "An0ther-Secret-Pa55", "Wr0ng-Guess-Pa55", ADMIN_PASSWORD]
    with d.client() as c:
        c.create_bucket("s")
        c.create_user("sam", secrets[0], roles={"s": "readwrite"})
        c.create_user("sue", secrets[1], roles={"s": "read"}, admin=False)
        c.command("set_parameter", name="login_failure_limit", value=3)
        # A window far longer than three guesses take on a loaded machine (each a
        # connection, a scrypt at low priority and a hold): they must count together.
        c.command("set_parameter", name="login_failure_window_secs", value=60.0)
    for _ in range(5):  # successful logins do not count
        with d.client(user="sam", password=secrets[0], bucket="s") as u:
            u.set("k", b"v")
    t0 = time.monotonic()
    for user in ("sam", "nobody", secrets[1]):  # a password typed as a user name, too
        with pytest.raises(errors.AuthenticationFailed):
            d.client(user=user, password=secrets[2], bucket="s")
    # Each answer was held longer (0.1 + 0.2 + 0.4 s: the address's failures; a
    # floor, which load only lengthens)...
    assert time.monotonic() - t0 >= 0.7
    # ...but no one with the right password is refused or held: not sue, who never
    # logged in from this address, not sam, whose name the guesses used. Proved by
    # the node's counters, not a clock (two logins took over 1.5 s on a loaded
    # machine): an answer is held only after the limiter counts a failure
    # (LoginLimiter.end; its unit tests show a success after the address's failures
    # is held 0), and a refusal is counted too. The admin's own logins are successes.
    with d.client() as c:
        before = c.server_status()["authentication"]
    assert before["failures"] == 3 and before["refused"] == 0, before
    with d.client(user="sue", password=secrets[1], bucket="s") as u:
        assert u.get("k") == b"v"
    with d.client(user="sam", password=secrets[0], bucket="s") as u:
        assert u.get("k") == b"v"
    with d.client() as c:
        status = c.server_status()
        users = c.list_users()
        params = c.command("get_parameter")
    auth_st = status["authentication"]
    assert auth_st["failures"] == 3 and auth_st["refused"] == 0
    shown = json.dumps([status, users, params], default=repr)
    log = d.log()
    assert "failed logins from 127.0.0.1" in log  # the WARNING names the address
    for secret in secrets:
        assert secret not in shown, f"a password in the status or user list: {secret}"
        assert secret not in log, f"a password in the log: {secret}"
    assert "hash" not in json.dumps(users) and "salt" not in json.dumps(users)
