"""The Redis commands tenantkv answers on its RESP front door, and how.

Each entry turns a command's arguments into a :class:`~tenantkv.server.commands.Command`
and its parameters — so a Redis ``GET`` is prepared, admitted by the same
pipeline, charged the same units and answered from the same execution path as
a MessagePack ``get`` (``server/executor.py``) — plus a function that turns
the result into Redis's reply type. Parsing follows Redis: options are
case-insensitive, a wrong argument count or an unknown option is Redis's own
error text, a number that does not parse is ``value is not an integer or out
of range``.

Data model: strings with expiry, in the connection's bucket. Commands tenantkv
does not run (other types, scripting, ...) get Redis's own unknown-command
answer (``redis_docs.NOT_SUPPORTED`` says why, for docs/redis.md).

This module is the table: the entry type (:class:`RedisCommand`), the registry
(:data:`REDIS_COMMANDS`, which ``redis_strings``, ``redis_keyspace`` and
``redis_scan`` add their commands to), the argument parsers and replies the
command modules share, the RESP reply encoder (:class:`Encoder`), and the
string commands at the heart of it (GET, SET, MGET, MSET, DEL, INCR, ...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tenantkv import errors, protocol
from tenantkv.server import commands
from tenantkv.server.commands import MAX_KEYS_PER_COMMAND, Command, Session
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.records import HEADER_BYTES
from tenantkv.storage.string_ops import (
    CLEAR,
    KEEP,
    NOT_AN_INTEGER,
    AppendOp,
    Expiry,
    FlushOp,
    GetDelOp,
    GetExOp,
    IncrByOp,
    MultiDeleteOp,
    MultiSetOp,
    StringSetOp,
)

_CRLF = b"\r\n"


# -- replies ------------------------------------------------------------------------------


class Verbatim(str):
    """A RESP3 verbatim string (``=``; INFO's reply), a bulk string on RESP2."""


class Status(str):
    """A simple string (``+``) inside a nested reply: ``COMMAND DOCS`` flags, which
    redis-cli requires to be status replies."""


class Encoder:
    """Replies for one connection; ``version`` 2 or 3 (``HELLO`` may switch it).
    RESP3 types (null, map, double, boolean, set, verbatim) fall back to their
    RESP2 forms on a version-2 connection, exactly as Redis does."""

    def __init__(self, version: int = 2) -> None:
        self.version = version

    def simple(self, text: str) -> bytes:
        return b"+" + text.encode() + _CRLF

    def error(self, text: str) -> bytes:
        """``-PREFIX message``; CR and LF in the message become spaces."""
        return b"-" + text.replace("\r", " ").replace("\n", " ").encode() + _CRLF

    def integer(self, n: int) -> bytes:
        return b":%d\r\n" % n

    def bulk(self, data: bytes | str) -> bytes:
        if isinstance(data, str):
            data = data.encode()
        return b"$%d\r\n%b\r\n" % (len(data), data)

    def null(self) -> bytes:
        return b"_\r\n" if self.version >= 3 else b"$-1\r\n"

    def null_array(self) -> bytes:
        return b"_\r\n" if self.version >= 3 else b"*-1\r\n"

    def boolean(self, b: bool) -> bytes:
        if self.version >= 3:
            return b"#t\r\n" if b else b"#f\r\n"
        return b":1\r\n" if b else b":0\r\n"

    def double(self, x: float) -> bytes:
        text = repr(x).encode()
        return b",%b\r\n" % text if self.version >= 3 else self.bulk(text)

    def array(self, items: Sequence[Any]) -> bytes:
        return b"*%d\r\n" % len(items) + b"".join(self.value(i) for i in items)

    def set(self, items: Sequence[Any]) -> bytes:
        """A RESP3 set (``~``), an array on RESP2."""
        head = b"~%d\r\n" if self.version >= 3 else b"*%d\r\n"
        return head % len(items) + b"".join(self.value(i) for i in items)

    def map(self, items: Mapping[Any, Any]) -> bytes:
        """A RESP3 map (``%``), a flat key-value array on RESP2."""
        n = len(items)
        head = b"%%%d\r\n" % n if self.version >= 3 else b"*%d\r\n" % (2 * n)
        return head + b"".join(self.value(k) + self.value(v) for k, v in items.items())

    def verbatim(self, text: str) -> bytes:
        if self.version >= 3:
            data = b"txt:" + text.encode()
            return b"=%d\r\n%b\r\n" % (len(data), data)
        return self.bulk(text)

    def value(self, v: Any) -> bytes:
        """Any Python value as the natural RESP type."""
        if v is None:
            return self.null()
        if isinstance(v, bool):
            return self.boolean(v)
        if isinstance(v, int):
            return self.integer(v)
        if isinstance(v, float):
            return self.double(v)
        if isinstance(v, Verbatim):
            return self.verbatim(v)
        if isinstance(v, Status):
            return self.simple(v)
        if isinstance(v, (bytes, str)):
            return self.bulk(v)
        if isinstance(v, Mapping):
            return self.map(v)
        if isinstance(v, (list, tuple)):
            return self.array(v)
        raise TypeError(f"no RESP form for {type(v).__name__}")


# -- the table ----------------------------------------------------------------------


#: The most keys one multi-key command may name: the MessagePack mget's bound.
MAX_MULTI_KEYS = MAX_KEYS_PER_COMMAND

Reply = Callable[[Encoder, Any], bytes]


@dataclass(frozen=True, slots=True)
class RedisCommand:
    """One Redis command: its Redis arity (negative: at least), how its arguments
    become ``(Command, params)``, how the result becomes a reply, and what
    ``COMMAND INFO`` says of it."""

    name: str
    arity: int
    kind: Literal["read", "write", "session"]
    parse: Callable[[list[bytes]], dict[str, Any]]
    handler: Callable[..., Any]
    reply: Reply
    flags: tuple[str, ...] = ()
    keys: tuple[int, int, int] = (1, 1, 1)
    summary: str = ""
    group: str = "string"
    command: Command = field(init=False)

    def __post_init__(self) -> None:
        # The execution path checks parameter names against the Command's: the
        # parser's output is the contract, so declare every name it may produce.
        object.__setattr__(
            self,
            "command",
            Command(self.name, self.kind, PARAM_NAMES, self.handler, self.summary, self.reply),
        )


def read_command(
    name: str,
    arity: int,
    parse: Callable[[list[bytes]], dict[str, Any]],
    handler: Callable[..., Any],
    reply: Reply,
    keys: tuple[int, int, int],
    summary: str,
    group: str,
) -> RedisCommand:
    """A read command's entry (kind ``read``, flag ``readonly``), for the tables of
    read commands."""
    return RedisCommand(
        name, arity, "read", parse, handler, reply, ("readonly",), keys, summary, group
    )


PARAM_NAMES = frozenset(
    {"key", "keys", "value", "pairs", "expiry", "only", "get", "delta", "cursor", "match", "count"}
    | {"args", "start", "end", "offset", "dest", "replace"}
)
REDIS_COMMANDS: dict[str, RedisCommand] = {}


def _register(c: RedisCommand) -> None:
    REDIS_COMMANDS[c.name] = c


def arity_error(name: str) -> errors.BadValue:
    return errors.BadValue(f"wrong number of arguments for '{name}' command")


def syntax_error() -> errors.BadValue:
    return errors.BadValue("syntax error")


def parse_int(arg: bytes, message: str = NOT_AN_INTEGER) -> int:
    """An integer argument as Redis reads it (no spaces, no plus sign)."""
    if not re.fullmatch(rb"-?(0|[1-9][0-9]*)", arg) or not -(2**63) <= int(arg) < 2**63:
        raise errors.BadValue(message)
    return int(arg)


def _key(arg: bytes) -> bytes:
    if not 0 < len(arg) <= protocol.MAX_KEY_BYTES:
        raise errors.KeyTooLong(f"keys must be 1-{protocol.MAX_KEY_BYTES} bytes, got {len(arg)}")
    return arg


def _keys(args: list[bytes]) -> list[bytes]:
    if len(args) > MAX_MULTI_KEYS:
        raise errors.BadValue(f"at most {MAX_MULTI_KEYS} keys per command")
    return [_key(a) for a in args]


def _check_value(s: Session, value: bytes) -> bytes:
    limit = s.node.config.max_value_bytes
    if len(value) > limit:
        raise errors.ValueTooLarge(f"value of {len(value)} bytes exceeds max_value_bytes={limit}")
    return value


# -- replies ----------------------------------------------------------------------------


#: The reply a write answers most (a pipelined SET: one per request).
OK = b"+OK\r\n"


def _bulk_or_null(enc: Encoder, v: Any) -> bytes:
    if type(v) is bytes:  # (a hit: Encoder.bulk without its calls)
        return b"$%d\r\n%b\r\n" % (len(v), v)
    return enc.null() if v is None else enc.bulk(v)


def _integer(enc: Encoder, v: Any) -> bytes:
    return enc.integer(int(v))


def _ok(enc: Encoder, v: Any) -> bytes:
    return OK


def _array_of_bulks(enc: Encoder, v: Any) -> bytes:
    return b"*%d\r\n" % len(v) + b"".join(_bulk_or_null(enc, x) for x in v)


def _simple(enc: Encoder, v: Any) -> bytes:
    return enc.simple(str(v))


def _one_key(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1])}


def _many_keys(args: list[bytes]) -> dict[str, Any]:
    return {"keys": _keys(args[1:])}


def _headers(s: Session, b: BucketHandle, keys: list[bytes]) -> list[tuple[int, int] | None]:
    """The live records' (stored size, expiry) on views of them, no value copied;
    metered as the records read (what a read of each costs, whatever is copied)."""
    found = s.node.engine.headers(b, keys)
    s.read_sizes += [len(k) + h[0] for k, h in zip(keys, found, strict=True) if h is not None]
    return found


def _stored_value_bytes(s: Session, b: BucketHandle, key: bytes) -> int:
    """The size of ``key``'s value now, read on a view of its record: what a write
    that answers with the value it finds will hold and read (``WriteOp.reply_hint``).
    A pipeline of GETEX on a 10 MiB key held 600 MB of answers uncounted."""
    found = s.node.engine.headers(b, [key])[0]
    return 0 if found is None else max(0, found[0] - HEADER_BYTES)


# -- reads ---------------------------------------------------------------------------------


#: GET runs the MessagePack get (one handler for both doors: the hottest one);
#: its reply is the record's value (_record_value).
_get = commands.get


def _record_value(enc: Encoder, v: Any) -> bytes:
    """A GET's reply: the value of the record the MessagePack get found, or null."""
    if v is None:
        return enc.null()
    value = v["value"]
    return b"$%d\r\n%b\r\n" % (len(value), value)


def _mget(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    # The MessagePack mget's engine read: refused, having copied nothing big, when
    # the values exceed what one reply may carry (engine.MAX_RESULT_BYTES, from
    # the stored sizes); the floor is per key named either way.
    keys = p["keys"]
    s.read_keys = len(keys)
    out: list[bytes | None] = []
    for key, rec in zip(keys, s.node.engine.mget(b, keys), strict=True):
        if rec is None:
            out.append(None)
        else:
            s.read_sizes.append(len(key) + rec.stored_bytes)
            out.append(rec.value)
    return out


def _exists(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    s.read_keys = len(p["keys"])
    return sum(h is not None for h in _headers(s, b, p["keys"]))


def _strlen(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    (h,) = _headers(s, b, [p["key"]])
    return 0 if h is None else h[0] - HEADER_BYTES


def _type(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    (h,) = _headers(s, b, [p["key"]])
    return "none" if h is None else "string"


def _ttl_ms(s: Session, b: BucketHandle, key: bytes) -> int:
    """Redis's TTL answer in ms: -2 no key, -1 no expiry, else what is left."""
    (h,) = _headers(s, b, [key])
    if h is None:
        return -2
    if not h[1]:
        return -1
    return max(0, h[1] - s.node.engine.now_ms())


def _ttl(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    ms = _ttl_ms(s, b, p["key"])
    return ms if ms < 0 else (ms + 500) // 1000


def _pttl(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    return _ttl_ms(s, b, p["key"])


def _dbsize(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    return s.node.engine.bucket_entries(b.name)


for _name, _arity, _handler, _reply, _parse, _summary in (
    ("get", 2, _get, _record_value, _one_key, "Get the value of a key."),
    ("mget", -2, _mget, _array_of_bulks, _many_keys, "Get the values of all the given keys."),
    ("exists", -2, _exists, _integer, _many_keys, "Count how many of the keys exist."),
    ("strlen", 2, _strlen, _integer, _one_key, "Get the length of the value of a key."),
    ("type", 2, _type, _simple, _one_key, "Determine the type of a key."),
    ("ttl", 2, _ttl, _integer, _one_key, "Get the time to live of a key in seconds."),
    ("pttl", 2, _pttl, _integer, _one_key, "Get the time to live of a key in ms."),
):
    _register(
        RedisCommand(
            _name,
            _arity,
            "read",
            _parse,
            _handler,
            _reply,
            ("readonly", "fast"),
            (1, -1, 1) if _arity < 0 else (1, 1, 1),
            _summary,
            "generic" if _name in ("exists", "type", "ttl", "pttl") else "string",
        )
    )
_register(
    RedisCommand(
        "dbsize",
        1,
        "read",
        lambda args: {},
        _dbsize,
        _integer,
        ("readonly", "fast"),
        (0, 0, 0),
        "Return the number of keys in the bucket.",
        "server",
    )
)


# -- writes ----------------------------------------------------------------------------------


def _expiry_option(opt: bytes, arg: bytes, cmd: str) -> Expiry:
    n = parse_int(arg)
    if n <= 0:
        raise errors.BadValue(f"invalid expire time in '{cmd}' command")
    if opt == b"ex":
        return _relative(n * 1000, cmd)
    if opt == b"px":
        return _relative(n, cmd)
    if opt == b"exat":
        return _absolute(n * 1000, cmd)
    return _absolute(n, cmd)


def _relative(ms: int, cmd: str) -> Expiry:
    if ms > 2**62:
        raise errors.BadValue(f"invalid expire time in '{cmd}' command")
    return Expiry("relative", ms)


def _absolute(ms: int, cmd: str) -> Expiry:
    if ms > 2**62:
        raise errors.BadValue(f"invalid expire time in '{cmd}' command")
    return Expiry("absolute", ms)


def _set_parse(args: list[bytes]) -> dict[str, Any]:
    p: dict[str, Any] = {"key": _key(args[1]), "value": args[2], "expiry": CLEAR, "only": ""}
    seen_expiry = False
    i = 3
    while i < len(args):
        opt = args[i].lower()
        if opt in (b"nx", b"xx"):
            if p["only"]:
                raise syntax_error()
            p["only"] = opt.decode()
        elif opt == b"get":
            p["get"] = True
        elif opt == b"keepttl":
            if seen_expiry:
                raise syntax_error()
            p["expiry"], seen_expiry = KEEP, True
        elif opt in (b"ex", b"px", b"exat", b"pxat"):
            if seen_expiry or i + 1 >= len(args):
                raise syntax_error()
            p["expiry"], seen_expiry = _expiry_option(opt, args[i + 1], "set"), True
            i += 1
        else:
            raise syntax_error()
        i += 1
    return p


def _set(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    get = p.get("get", False)
    return StringSetOp(
        b,
        p["key"],
        _check_value(s, p["value"]),
        p["expiry"],
        p["only"],
        get=get,
        reply_hint=_stored_value_bytes(s, b, p["key"]) if get else 0,
    )


def _set_reply(enc: Encoder, v: Any) -> bytes:
    # (SET ... GET replies with _set_get_reply: see parse_call)
    return OK if v[0] else enc.null()


def _set_get_reply(enc: Encoder, v: Any) -> bytes:
    return _bulk_or_null(enc, v[1])


_register(
    RedisCommand(
        "set",
        -3,
        "write",
        _set_parse,
        _set,
        _set_reply,
        ("write", "denyoom"),
        summary="Set the string value of a key (EX PX EXAT PXAT NX XX KEEPTTL GET).",
    )
)
_register(
    RedisCommand(
        "setnx",
        3,
        "write",
        lambda args: {"key": _key(args[1]), "value": args[2], "expiry": CLEAR, "only": "nx"},
        _set,
        lambda enc, v: enc.integer(1 if v[0] else 0),
        ("write", "denyoom", "fast"),
        summary="Set the value of a key, only if the key does not exist.",
    )
)
for _name, _opt in (("setex", b"ex"), ("psetex", b"px")):
    _register(
        RedisCommand(
            _name,
            4,
            "write",
            (
                lambda opt, name: (
                    lambda args: {
                        "key": _key(args[1]),
                        "value": args[3],
                        "expiry": _expiry_option(opt, args[2], name),
                        "only": "",
                    }
                )
            )(_opt, _name),
            _set,
            _ok,
            ("write", "denyoom"),
            summary="Set the value and expiration of a key.",
        )
    )
_register(
    RedisCommand(
        "getset",
        3,
        "write",
        lambda args: {
            "key": _key(args[1]),
            "value": args[2],
            "expiry": CLEAR,
            "only": "",
            "get": True,
        },
        _set,
        _set_get_reply,
        ("write", "denyoom", "fast"),
        summary="Set the value of a key and return its old value.",
    )
)


def _mset_parse(args: list[bytes]) -> dict[str, Any]:
    if len(args) % 2 == 0:
        raise arity_error(args[0].decode(errors="replace").lower())
    pairs = [(_key(args[i]), args[i + 1]) for i in range(1, len(args), 2)]
    if len(pairs) > MAX_MULTI_KEYS:
        raise errors.BadValue(f"at most {MAX_MULTI_KEYS} keys per command")
    return {"pairs": pairs}


def _mset(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    for _, v in p["pairs"]:
        _check_value(s, v)
    return MultiSetOp(b, p["pairs"])


def _msetnx(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    for _, v in p["pairs"]:
        _check_value(s, v)
    return MultiSetOp(b, p["pairs"], only_new=True)


_register(
    RedisCommand(
        "mset",
        -3,
        "write",
        _mset_parse,
        _mset,
        _ok,
        ("write", "denyoom"),
        (1, -1, 2),
        "Set several keys at once, atomically.",
    )
)
_register(
    RedisCommand(
        "msetnx",
        -3,
        "write",
        _mset_parse,
        _msetnx,
        lambda enc, v: enc.integer(1 if v else 0),
        ("write", "denyoom"),
        (1, -1, 2),
        "Set several keys at once, only if none of them exists.",
    )
)

for _name in ("del", "unlink"):
    _register(
        RedisCommand(
            _name,
            -2,
            "write",
            _many_keys,
            lambda s, b, p: MultiDeleteOp(b, p["keys"]),
            _integer,
            ("write",),
            (1, -1, 1),
            "Delete keys.",
            "generic",
        )
    )
_register(
    RedisCommand(
        "getdel",
        2,
        "write",
        _one_key,
        lambda s, b, p: GetDelOp(b, p["key"], reply_hint=_stored_value_bytes(s, b, p["key"])),
        _bulk_or_null,
        ("write", "fast"),
        summary="Get the value of a key and delete it.",
    )
)


def _getex_parse(args: list[bytes]) -> dict[str, Any]:
    p: dict[str, Any] = {"key": _key(args[1])}
    if len(args) == 2:
        return p
    opt = args[2].lower()
    if opt == b"persist" and len(args) == 3:
        p["expiry"] = CLEAR
    elif opt in (b"ex", b"px", b"exat", b"pxat") and len(args) == 4:
        p["expiry"] = _expiry_option(opt, args[3], "getex")
    else:
        raise syntax_error()
    return p


def _getex(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    key = p["key"]
    return GetExOp(b, key, p.get("expiry", KEEP), reply_hint=_stored_value_bytes(s, b, key))


_register(
    RedisCommand(
        "getex",
        -2,
        "write",
        _getex_parse,
        _getex,
        _bulk_or_null,
        ("write", "fast"),
        summary="Get the value of a key and optionally set its expiration.",
    )
)


def _incr_parse(sign: int, by: bool) -> Callable[[list[bytes]], dict[str, Any]]:
    def parse(args: list[bytes]) -> dict[str, Any]:
        delta = parse_int(args[2]) if by else 1
        if sign < 0 and delta == -(2**63):
            raise errors.BadValue("decrement would overflow")
        return {"key": _key(args[1]), "delta": sign * delta}

    return parse


for _name, _arity, _sign, _by in (
    ("incr", 2, 1, False),
    ("decr", 2, -1, False),
    ("incrby", 3, 1, True),
    ("decrby", 3, -1, True),
):
    _register(
        RedisCommand(
            _name,
            _arity,
            "write",
            _incr_parse(_sign, _by),
            lambda s, b, p: IncrByOp(b, p["key"], p["delta"]),
            _integer,
            ("write", "denyoom", "fast"),
            summary="Increment or decrement the integer value of a key.",
        )
    )
_register(
    RedisCommand(
        "append",
        3,
        "write",
        lambda args: {"key": _key(args[1]), "value": args[2]},
        lambda s, b, p: AppendOp(b, p["key"], p["value"], s.node.config.max_value_bytes),
        _integer,
        ("write", "denyoom", "fast"),
        summary="Append a value to a key.",
    )
)
_register(
    RedisCommand(
        "flushdb",
        -1,
        "write",
        lambda args: _flush_parse(args),
        lambda s, b, p: FlushOp(b),
        _ok,
        ("write",),
        (0, 0, 0),
        "Delete every key of the bucket (needs the readwrite role).",
        "server",
    )
)


def _flush_parse(args: list[bytes]) -> dict[str, Any]:
    if len(args) > 2 or (len(args) == 2 and args[1].lower() not in (b"sync", b"async")):
        raise syntax_error()
    return {}


def parse_call(rc: RedisCommand, args: list[bytes]) -> tuple[dict[str, Any], Reply]:
    """One call's parameters (Redis's arity and syntax errors) and its reply function
    (``SET ... GET`` answers with the old value instead of OK)."""
    n = len(args)
    if (rc.arity >= 0 and n != rc.arity) or (rc.arity < 0 and n < -rc.arity):
        raise arity_error(rc.name)
    p = rc.parse(args)
    if p.get("get", False):  # (kept: the op then carries the old value)
        return p, _set_get_reply
    return p, rc.reply
