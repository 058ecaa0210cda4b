"""Redis's keyspace commands on strings: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT,
PERSIST, COPY, RENAME, RENAMENX, TOUCH, EXPIRETIME, PEXPIRETIME, RANDOMKEY,
OBJECT and MEMORY USAGE.

Registered beside their neighbours in
:data:`~tenantkv.server.redis_commands.REDIS_COMMANDS`: reads are charged the
records they read, RENAME and COPY are one write op each (one transaction:
atomic) charged the record written plus the record read. The bucket is the
only database, so ``COPY ... DB 0`` is the bucket itself and any other index
is out of range.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tenantkv import errors
from tenantkv.server.commands import Session
from tenantkv.server.redis_commands import (
    Encoder,
    RedisCommand,
    _bulk_or_null,
    _headers,
    _integer,
    _key,
    _many_keys,
    _ok,
    _one_key,
    _register,
    _stored_value_bytes,
    parse_int,
    read_command,
    syntax_error,
)
from tenantkv.storage.engine import BucketHandle, KeyRange
from tenantkv.storage.ops import parse_int64
from tenantkv.storage.records import HEADER_BYTES
from tenantkv.storage.string_ops import CLEAR, ExpireOp, Expiry
from tenantkv.storage.value_ops import MoveOp

#: This module's commands (registered in REDIS_COMMANDS as the module ends).
COMMANDS: list[RedisCommand] = []
#: RANDOMKEY draws from this many keys after a random point of the index.
RANDOMKEY_WINDOW = 16
_rng = random.Random()


def _two_keys(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1]), "dest": _key(args[2])}


def _move(keep: bool, replace: bool) -> Any:
    def handler(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
        hint = _stored_value_bytes(s, b, p["key"])
        replace_now = p.get("replace", replace)
        return MoveOp(b, p["key"], p["dest"], keep, replace_now, reply_hint=hint)

    return handler


def _copy_parse(args: list[bytes]) -> dict[str, Any]:
    """COPY's options in Redis's order: REPLACE, DB (only the bucket's own, 0), then
    the same-key check."""
    p = _two_keys(args)
    j = 3
    while j < len(args):
        opt = args[j].lower()
        if opt == b"replace":
            p["replace"] = True
        elif opt == b"db" and j + 1 < len(args):
            if parse_int(args[j + 1]) != 0:
                raise errors.BadValue("DB index is out of range")
            j += 1
        else:
            raise syntax_error()
        j += 1
    if p["key"] == p["dest"]:
        raise errors.BadValue("source and destination objects are the same")
    return p


def _expiretime(unit_ms: int) -> Any:
    def handler(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
        (h,) = _headers(s, b, [p["key"]])
        if h is None:
            return -2
        return h[1] // unit_ms if h[1] else -1

    return handler


def _random_key(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """One of the keys at a random point of the ordered index: the first
    :data:`RANDOMKEY_WINDOW` keys at or after a random string between the first
    and last keys (wrapping to the first), one of them drawn at random. O(log n)
    and bounded, but not uniform: keys after a gap in the key space come up more
    often. Charged a read floor per key examined, as SCAN is."""
    engine = s.node.engine
    first, _ = engine.scan_keys(b, limit=1)
    if not first:
        s.read_keys = 1
        return None
    last = engine.last_key(b) or first[0]
    lo = int.from_bytes(first[0][:8].ljust(8, b"\0"), "big")
    hi = int.from_bytes(last[:8].ljust(8, b"\xff"), "big")
    probe = _rng.randint(lo, max(lo, hi)).to_bytes(8, "big")
    window, _ = engine.scan_keys(b, KeyRange(probe), limit=RANDOMKEY_WINDOW)
    if len(window) < RANDOMKEY_WINDOW:
        window += engine.scan_keys(b, limit=RANDOMKEY_WINDOW - len(window))[0]
    s.read_keys = 1 + len(window)
    s.read_sizes += [len(k) + HEADER_BYTES for k in window]
    return _rng.choice(window)


def _encoding(value_len: int, value: bytes | None) -> str:
    """What Redis's OBJECT ENCODING says of a string as SET stores it: ``int`` for
    an integer of at most 20 characters, ``embstr`` up to 44 bytes, else ``raw``."""
    if value is not None and value_len <= 20 and parse_int64(value) is not None:
        return "int"
    return "embstr" if value_len <= 44 else "raw"


OBJECT_HELP = [
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Print this help.",
]
NO_LFU = (
    "An LFU maxmemory policy is not selected, access frequency not tracked. Please note "
    "that when switching between policies at runtime LRU and LFU data will take some "
    "time to adjust."
)


def _object_parse(args: list[bytes]) -> dict[str, Any]:
    """OBJECT's subcommand, with Redis 7.0's errors for an unknown one or a wrong
    argument count (it checks both before the command runs)."""
    sub = args[1].lower()
    arity = {b"help": 2, b"encoding": 3, b"freq": 3, b"idletime": 3, b"refcount": 3}.get(sub)
    if arity is None:
        shown = args[1].decode(errors="replace")[:128]
        raise errors.BadValue(f"unknown subcommand '{shown}'. Try OBJECT HELP.")
    if len(args) != arity:
        raise errors.BadValue(f"wrong number of arguments for 'object|{sub.decode()}' command")
    if sub == b"help":
        return {"only": "help"}
    return {"only": sub.decode(), "key": _key(args[2])}


def _object(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """OBJECT's subcommands; a missing key is nil, as in Redis, before any error."""
    sub = p["only"]
    if sub == "help":
        return ("help", OBJECT_HELP)
    (h,) = _headers(s, b, [p["key"]])
    if h is None:
        return None
    if sub == "freq":
        raise errors.BadValue(NO_LFU)
    if sub == "idletime":
        raise errors.BadValue("tenantkv does not track access times: OBJECT IDLETIME is not kept")
    if sub == "refcount":
        return 1
    size = h[0] - HEADER_BYTES
    value = None
    if size <= 20:
        found = s.node.engine.get_value_in(s.read_txn(), b, p["key"])
        value = None if found is None else found[0]
    return ("status", _encoding(size, value))


def _object_reply(enc: Encoder, v: Any) -> bytes:
    if v is None:
        return enc.null()
    if isinstance(v, int):
        return enc.integer(v)
    kind, what = v
    if kind == "help":
        return b"*%d\r\n" % len(what) + b"".join(enc.simple(line) for line in what)
    return enc.bulk(what)


def _memory_parse(args: list[bytes]) -> dict[str, Any]:
    """``MEMORY USAGE key [SAMPLES n]`` (what ``redis-cli --memkeys`` sends); the
    other subcommands are about the server's allocator, not a tenant's keys."""
    sub = args[1].lower()
    if sub != b"usage":
        shown = args[1].decode(errors="replace")[:128]
        raise errors.BadValue(f"unknown subcommand '{shown}'. Try MEMORY HELP.")
    if len(args) < 3:
        raise errors.BadValue("wrong number of arguments for 'memory|usage' command")
    if len(args) == 5 and args[3].lower() == b"samples":
        parse_int(args[4])  # (a string has no elements to sample)
    elif len(args) != 3:
        raise errors.BadValue("syntax error")
    return {"key": _key(args[2])}


def _memory(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """A key's bytes as stored: the key and its record (header and value)."""
    (h,) = _headers(s, b, [p["key"]])
    return None if h is None else len(p["key"]) + h[0]


def _integer_or_null(enc: Encoder, v: Any) -> bytes:
    return enc.null() if v is None else enc.integer(v)


def _register_all() -> None:
    """The table entries: COPY and RENAME(NX) are writes, the others reads."""
    for name, arity, parse, handler, reply, summary in (
        ("copy", -3, _copy_parse, _move(True, False), _integer, "Copy a key's value."),
        ("rename", 3, _two_keys, _move(False, True), _ok, "Rename a key."),
        ("renamenx", 3, _two_keys, _move(False, False), _integer, "Rename a key if new."),
    ):
        COMMANDS.append(
            RedisCommand(
                name,
                arity,
                "write",
                parse,
                handler,
                reply,
                ("write",),
                (1, 2, 1),
                summary,
                "generic",
            )
        )
    for name, arity, parse, handler, reply, keys, summary in (
        ("touch", -2, _many_keys, _touch, _integer, (1, -1, 1), "Count the keys that exist."),
        ("expiretime", 2, _one, _expiretime(1000), _integer, (1, 1, 1), "Expiry in unix s."),
        ("pexpiretime", 2, _one, _expiretime(1), _integer, (1, 1, 1), "Expiry in unix ms."),
        ("randomkey", 1, lambda a: {}, _random_key, _bulk_or_null, (0, 0, 0), "A random key."),
        ("object", -2, _object_parse, _object, _object_reply, (2, 2, 1), "Inspect a key."),
        ("memory", -2, _memory_parse, _memory, _integer_or_null, (2, 2, 1), "A key's bytes."),
    ):
        COMMANDS.append(read_command(name, arity, parse, handler, reply, keys, summary, "generic"))


def _one(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1])}


def _touch(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    s.read_keys = len(p["keys"])
    return sum(h is not None for h in _headers(s, b, p["keys"]))


_register_all()


# -- EXPIRE and PERSIST ------------------------------------------------------------------


def _expire_parse(unit_ms: int, absolute: bool) -> Callable[[list[bytes]], dict[str, Any]]:
    def parse(args: list[bytes]) -> dict[str, Any]:
        n = parse_int(args[2])
        only: set[str] = set()
        for opt in args[3:]:
            o = opt.lower().decode(errors="replace")
            if o not in ("nx", "xx", "gt", "lt"):
                raise errors.BadValue(f"Unsupported option {opt.decode(errors='replace')}")
            only.add(o)
        if "nx" in only and len(only) > 1:
            raise errors.BadValue("NX and XX, GT or LT options at the same time are not compatible")
        if {"gt", "lt"} <= only:
            raise errors.BadValue("GT and LT options at the same time are not compatible")
        ms = n * unit_ms
        if abs(ms) > 2**62:
            raise errors.BadValue(f"invalid expire time in '{args[0].decode().lower()}' command")
        # A time in the past deletes the key (the op writes an expiry already due);
        # 0 means "no expiry" in a record, so the earliest is 1 ms after the epoch.
        expiry = Expiry("absolute", max(ms, 1)) if absolute else Expiry("relative", ms)
        return {"key": _key(args[1]), "expiry": expiry, "only": frozenset(only)}

    return parse


def _expire_op(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    expiry: Expiry = p["expiry"]
    if expiry.mode == "relative" and expiry.ms <= 0:
        expiry = Expiry("absolute", 1)  # already due: the key goes
    return ExpireOp(b, p["key"], expiry, p["only"])


for _name, _unit, _abs in (
    ("expire", 1000, False),
    ("pexpire", 1, False),
    ("expireat", 1000, True),
    ("pexpireat", 1, True),
):
    _register(
        RedisCommand(
            _name,
            -3,
            "write",
            _expire_parse(_unit, _abs),
            _expire_op,
            _integer,
            ("write", "fast"),
            summary="Set a key's time to live.",
            group="generic",
        )
    )
_register(
    RedisCommand(
        "persist",
        2,
        "write",
        _one_key,
        lambda s, b, p: ExpireOp(b, p["key"], CLEAR, frozenset()),
        _integer,
        ("write", "fast"),
        summary="Remove the expiration from a key.",
        group="generic",
    )
)

for _c in COMMANDS:
    _register(_c)
