"""The RESP door's string and keyspace commands on the MessagePack door.

One implementation per command for both doors: a MessagePack request such as
``getrange {key, start, end}`` is spelled as the Redis command it names
(``GETRANGE key start end``), parsed by that command's parser and run by its
handler — so both doors share the arguments' rules, the errors, the storage
op, and the admission and charging (bounded before, charged after) of the one
:class:`~tenantkv.server.commands.Command` path. Parameters are typed (a key is
bytes or a string, an offset an integer, a flag a boolean); a wrong type is a
``BadValue`` naming it, as for every MessagePack command.

Results are the handler's: bytes, integers, nil; a write's is what its op
returns (``rename`` true, ``copy`` / ``renamenx`` 1 or 0, ``incrbyfloat``
the new value as decimal bytes, as Redis prints it). docs/protocol.md lists
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tenantkv import errors
from tenantkv.server import commands, redis_keyspace, redis_strings
from tenantkv.server.commands import COMMON_PARAMS, Command, Session, key_param
from tenantkv.server.redis_commands import REDIS_COMMANDS, RedisCommand, parse_call

if TYPE_CHECKING:
    from tenantkv.storage.engine import BucketHandle


#: What a parameter is: one key, a list of keys, an integer, a number, bytes, a
#: word (``and``, ``bit``), a flag (a boolean naming a Redis word) or an option
#: (a Redis word and its integer).
Kind = Literal["key", "keys", "int", "float", "bytes", "word", "flag", "option"]


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter: its name, its kind, and for an option the Redis word that
    introduces it (``LEN``, ``REPLACE``, ``MINMATCHLEN n``)."""

    name: str
    kind: Kind
    word: bytes = b""
    required: bool = True


def _p(name: str, kind: Kind) -> Param:
    return Param(name, kind)


def _opt(name: str, kind: Kind, word: bytes = b"") -> Param:
    return Param(name, kind, word, required=False)


KEY, VALUE = _p("key", "key"), _p("value", "bytes")
RANGE = (_opt("start", "int"), _opt("end", "int"), _opt("unit", "word"))
#: Each MessagePack method: the Redis command it runs, and its parameters in the
#: Redis command's order.
METHODS: dict[str, tuple[str, tuple[Param, ...]]] = {
    "getrange": ("getrange", (KEY, _p("start", "int"), _p("end", "int"))),
    "setrange": ("setrange", (KEY, _p("offset", "int"), VALUE)),
    "append": ("append", (KEY, VALUE)),
    "strlen": ("strlen", (KEY,)),
    "getdel": ("getdel", (KEY,)),
    "incrbyfloat": ("incrbyfloat", (KEY, _p("delta", "float"))),
    "getbit": ("getbit", (KEY, _p("offset", "int"))),
    "setbit": ("setbit", (KEY, _p("offset", "int"), _p("bit", "int"))),
    "bitcount": ("bitcount", (KEY, *RANGE)),
    "bitpos": ("bitpos", (KEY, _p("bit", "int"), *RANGE)),
    "bitop": ("bitop", (_p("op", "word"), _p("dest", "key"), _p("keys", "keys"))),
    "lcs": (
        "lcs",
        (
            _p("key", "key"),
            _p("key2", "key"),
            _opt("len", "flag", b"LEN"),
            _opt("idx", "flag", b"IDX"),
            _opt("minmatchlen", "option", b"MINMATCHLEN"),
            _opt("withmatchlen", "flag", b"WITHMATCHLEN"),
        ),
    ),
    "copy": ("copy", (KEY, _p("dest", "key"), _opt("replace", "flag", b"REPLACE"))),
    "rename": ("rename", (KEY, _p("dest", "key"))),
    "renamenx": ("renamenx", (KEY, _p("dest", "key"))),
    "randomkey": ("randomkey", ()),
}


def _int(p: dict[str, Any], name: str) -> bytes:
    v = p[name]
    if type(v) is not int:
        raise errors.BadValue(f"{name!r} must be an integer, got {errors.shown(v)}")
    return b"%d" % v


def _arg(p: dict[str, Any], param: Param) -> list[bytes]:
    """The Redis arguments one parameter becomes (none for an absent option)."""
    name, kind = param.name, param.kind
    if name not in p or p[name] is None:
        if param.required:
            raise errors.BadValue(f"missing parameter {name!r}")
        return []
    v = p[name]
    if kind == "key":
        return [key_param(p, name)]
    if kind == "int":
        return [_int(p, name)]
    if kind == "option":
        return [param.word, _int(p, name)]
    if kind == "flag":
        if type(v) is not bool:
            raise errors.BadValue(f"{name!r} must be true or false, got {errors.shown(v)}")
        return [param.word] if v else []
    if kind == "float":
        if type(v) not in (int, float):
            raise errors.BadValue(f"{name!r} must be a number, got {errors.shown(v)}")
        return [repr(v).encode()]
    if kind == "keys":
        if not isinstance(v, list) or not v:
            raise errors.BadValue(f"{name!r} must be a non-empty list of keys")
        return [key_param({name: k}, name) for k in v]
    if isinstance(v, str):
        return [v.encode()]
    if not isinstance(v, bytes):
        raise errors.BadValue(f"{name!r} must be bytes or a string, got {errors.shown(v)}")
    return [v]


def redis_args(method: str, p: dict[str, Any]) -> list[bytes]:
    """A MessagePack request's parameters as the Redis command's arguments."""
    name, params = METHODS[method]
    args = [name.encode()]
    for param in params:
        args += _arg(p, param)
    return args


def _handler(method: str, rc: RedisCommand) -> Callable[..., Any]:
    def run(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
        params, _ = parse_call(rc, redis_args(method, p))
        return rc.handler(s, b, params)

    run.__name__ = method
    return run


#: The command modules whose Redis commands these run (imported so that they
#: have joined REDIS_COMMANDS).
TABLE_MODULES = (redis_keyspace, redis_strings)


def door_commands() -> dict[str, Command]:
    """The MessagePack door's entries for :data:`METHODS`, classed (read, write)
    as their Redis commands."""
    out: dict[str, Command] = {}
    for method, (name, params) in METHODS.items():
        rc = REDIS_COMMANDS[name]
        names = frozenset(p.name for p in params) | COMMON_PARAMS
        out[method] = Command(method, rc.kind, names, _handler(method, rc), rc.summary)
    return out


def register() -> None:
    """Add :func:`door_commands` to the MessagePack door's table (the door calls
    it as it is imported)."""
    commands.COMMANDS.update(door_commands())
