"""The Redis string and keyspace commands on the MessagePack door: one entry per
method, classed as its Redis command, its parameters spelled as Redis's arguments."""

from __future__ import annotations

import pytest

from tenantkv import errors
from tenantkv.server import msgpack_strings
from tenantkv.server.doors.msgpack import MsgpackDoor
from tenantkv.server.redis_commands import REDIS_COMMANDS


def test_every_method_is_in_the_messagepack_table_with_its_redis_class() -> None:
    for method, (name, _) in msgpack_strings.METHODS.items():
        assert MsgpackDoor.commands[method].kind == REDIS_COMMANDS[name].kind, method


LCS = {"key": b"a", "key2": b"b", "len": True, "minmatchlen": 2}
BITOP = {"op": "and", "dest": b"d", "keys": [b"a", "b"]}


@pytest.mark.parametrize(
    "method, params, argv",
    [
        ("getrange", {"key": "k", "start": 0, "end": -1}, [b"getrange", b"k", b"0", b"-1"]),
        ("setrange", {"key": b"k", "offset": 3, "value": "v"}, [b"setrange", b"k", b"3", b"v"]),
        ("bitcount", {"key": b"k"}, [b"bitcount", b"k"]),
        (
            "bitcount",
            {"key": b"k", "start": 1, "end": 2, "unit": "bit"},
            [b"bitcount", b"k", b"1", b"2", b"bit"],
        ),
        ("lcs", LCS, [b"lcs", b"a", b"b", b"LEN", b"MINMATCHLEN", b"2"]),
        ("copy", {"key": b"a", "dest": b"b", "replace": False}, [b"copy", b"a", b"b"]),
        ("bitop", BITOP, [b"bitop", b"and", b"d", b"a", b"b"]),
        ("incrbyfloat", {"key": b"f", "delta": 0.1}, [b"incrbyfloat", b"f", b"0.1"]),
    ],
)
def test_parameters_become_the_redis_arguments(
    method: str, params: dict[str, object], argv: list[bytes]
) -> None:
    assert msgpack_strings.redis_args(method, params) == argv


@pytest.mark.parametrize(
    "method, params, message",
    [
        ("getrange", {"key": b"k", "start": "0", "end": 1}, "'start' must be an integer"),
        ("getrange", {"key": b"k", "end": 1}, "missing parameter 'start'"),
        ("copy", {"key": b"k", "dest": b"d", "replace": 1}, "'replace' must be true or false"),
        ("bitop", {"op": "or", "dest": b"d", "keys": []}, "non-empty list of keys"),
        ("incrbyfloat", {"key": b"k", "delta": "1"}, "'delta' must be a number"),
        ("setrange", {"key": b"", "offset": 0, "value": b"v"}, "'key' must be 1-"),
    ],
)
def test_a_wrong_parameter_is_named(method: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(errors.TenantKVError, match=message):
        msgpack_strings.redis_args(method, params)
