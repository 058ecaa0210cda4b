"""``COMMAND DOCS`` arguments: what redis-cli turns into its inline hints."""

from __future__ import annotations

import pytest

from tenantkv.server.doors.resp import LOCAL
from tenantkv.server.redis_commands import REDIS_COMMANDS, Encoder, Status
from tenantkv.server.redis_docs import SYNTAX, arguments

#: commands that take no argument at all
NO_ARGUMENTS = {"dbsize", "quit", "reset", "time", "randomkey"}
NO_ARGUMENTS |= {"multi", "exec", "discard", "unwatch"}
NO_ARGUMENTS |= {"asking"}


def test_every_command_has_its_arguments_documented() -> None:
    assert set(SYNTAX) | NO_ARGUMENTS == set(REDIS_COMMANDS) | set(LOCAL)
    for name in SYNTAX:
        assert arguments(name), name


def test_set_has_redis_shape() -> None:
    key, value, nx_xx, get, expiry = arguments("set")
    assert key == {"name": "key", "type": "key", "key_spec_index": 0}
    assert value == {"name": "value", "type": "string"}
    assert nx_xx["type"] == "oneof" and nx_xx["flags"] == ["optional"]
    assert [a["token"] for a in nx_xx["arguments"]] == ["NX", "XX"]
    assert get == {"name": "get", "type": "pure-token", "token": "GET", "flags": ["optional"]}
    assert expiry["arguments"][0] == {"name": "seconds", "type": "integer", "token": "EX"}
    assert expiry["arguments"][-1]["type"] == "pure-token"


def test_groups_and_repetition() -> None:
    (pairs,) = arguments("mset")
    assert pairs["type"] == "block" and pairs["flags"] == ["multiple"]
    assert [a["name"] for a in pairs["arguments"]] == ["key", "value"]
    (hello,) = arguments("hello")
    assert hello["type"] == "block" and hello["flags"] == ["optional"]
    assert hello["arguments"][1]["arguments"][0]["token"] == "AUTH"


def test_flags_encode_as_status_replies() -> None:
    flags = arguments("ping")[0]["flags"]
    assert all(isinstance(f, Status) for f in flags)
    assert Encoder(2).value(flags) == b"*1\r\n+optional\r\n"


@pytest.mark.parametrize("bad", ["[key:key", "key:key )", "...", "[|x:string]"])
def test_bad_syntax_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SYNTAX, "x", bad)
    with pytest.raises(ValueError):
        arguments("x")
