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
answer (:data:`NOT_SUPPORTED` says why, for docs/redis.md).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tenantkv import errors, protocol
from tenantkv.resp import Encoder
from tenantkv.server import commands, redis_cluster, redis_keyspace, redis_strings, scan_cursors
from tenantkv.server.commands import Session, prefix_end
from tenantkv.server.redis_base import (
    MAX_MULTI_KEYS,
    OK,
    PARAM_NAMES,
    REDIS_COMMANDS,
    RedisCommand,
    Reply,
    _array_of_bulks,
    _bulk_or_null,
    _check_value,
    _headers,
    _integer,
    _key,
    _many_keys,
    _ok,
    _one_key,
    _register,
    _simple,
    _stored_value_bytes,
    arity_error,
    parse_int,
    syntax_error,
)
from tenantkv.server.scan_cursors import parse_cursor
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.records import HEADER_BYTES
from tenantkv.storage.string_ops import (
    CLEAR,
    KEEP,
    AppendOp,
    ExpireOp,
    Expiry,
    FlushOp,
    GetDelOp,
    GetExOp,
    IncrByOp,
    MultiDeleteOp,
    MultiSetOp,
    StringSetOp,
)

#: Re-exported: the table and its entry type live in ``redis_base`` (so that the
#: command modules need not import this one); callers import them from here.
__all__ = [
    "MAX_MULTI_KEYS",
    "PARAM_NAMES",
    "REDIS_COMMANDS",
    "RedisCommand",
    "Reply",
    "arity_error",
    "parse_int",
    "syntax_error",
]

#: SCAN's default COUNT, and the most keys one SCAN call may examine.
SCAN_COUNT = 10
MAX_SCAN_COUNT = 1000
#: KEYS examines at most this many keys; past it the caller is told to use SCAN.
MAX_KEYS = 10_000

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


# -- SCAN and KEYS: the ordered index, a prefix where the pattern has one -----------------

_GLOB_SPECIAL = frozenset(b"*?[\\")


def glob_prefix(pattern: bytes) -> bytes:
    """The literal bytes a Redis glob pattern starts with (what every match starts with)."""
    out = bytearray()
    for c in pattern:
        if c in _GLOB_SPECIAL:
            break
        out.append(c)
    return bytes(out)


#: Longest MATCH / KEYS / CONFIG GET pattern accepted. A pattern is read in one
#: pass (time linear in its length) and compiled once per distinct pattern and
#: bucket (:func:`compiled_glob`). No key is longer than protocol.MAX_KEY_BYTES
#: (250), so 512 bytes holds a pattern for any key with room for escapes and
#: classes, and bounds a fresh pattern's compiling to ~2 ms of the event loop
#: (a class costs Python's ``re`` 10-35 us to compile: see :func:`compile_floors`).
MAX_PATTERN_BYTES = 512
#: Compiling a pattern costs one read floor (``min_op_units``) per class in it,
#: and one per this many of its bytes, plus one (:func:`compile_floors`).
PATTERN_UNIT_BYTES = 64
#: Compiled patterns kept, per (bucket, pattern), least recently used dropped
#: first: at most MAX_PATTERN_BYTES each plus its compiled form, ~1 MiB in all.
PATTERN_CACHE_SIZE = 256

Matcher = Callable[[bytes], bool]
#: A pattern position: the bytes it takes (a star is None).
_Position = frozenset[int] | None
_ANY = frozenset(range(256))


def _signed(c: int) -> int:
    """A byte as Redis's ``char`` compares it in a range (signed on x86-64 and
    most builds): ``[a-\xff]`` is the bytes from -1 to 97."""
    return c - 256 if c >= 128 else c


def glob_positions(pattern: bytes) -> list[_Position]:
    """What each position of a Redis glob takes, read as Redis's
    ``stringmatchlen`` (``util.c``) reads it — case-sensitive, as KEYS and SCAN
    use it — in one pass:

    - ``*`` any run of bytes, ``?`` any one byte, ``\\x`` the byte ``x`` (a
      trailing ``\\`` is itself);
    - ``[...]`` one byte of a class: ``^`` first negates it, ``\\x`` is ``x``,
      ``a-z`` a range whose ends are swapped when reversed (``[z-a]`` is
      ``[a-z]``), compared as signed chars; the first ``]`` closes it, so ``[]``
      takes nothing and ``[^]`` anything; an unclosed class runs to the end of
      the pattern (``x[`` matches no key, ``k[1-`` is ``k`` then ``1`` or ``-``).
    """
    out: list[_Position] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == 0x2A:  # *
            out.append(None)
        elif c == 0x3F:  # ?
            out.append(_ANY)
        elif c == 0x5B:  # [
            i += 1
            negate = i < n and pattern[i] == 0x5E  # ^
            if negate:
                i += 1
            members: set[int] = set()
            while i < n:
                c = pattern[i]
                if c == 0x5C and i + 1 < n:  # \x
                    i += 1
                    members.add(pattern[i])
                elif c == 0x5D:  # ]
                    break
                elif i + 2 < n and pattern[i + 1] == 0x2D:  # a-z
                    lo, hi = sorted((_signed(c), _signed(pattern[i + 2])))
                    members.update(b & 0xFF for b in range(lo, hi + 1))
                    i += 2
                else:
                    members.add(c)
                i += 1
            out.append(_ANY - members if negate else frozenset(members))
        else:
            if c == 0x5C and i + 1 < n:  # \x
                i += 1
            out.append(frozenset((pattern[i],)))
        i += 1
    return out


def _byte(b: int) -> bytes:
    """One byte in a regex: itself when it is a letter or digit (the cheapest to
    parse), else escaped."""
    return bytes((b,)) if 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122 else b"\\x%02x" % b


def _atom(taken: frozenset[int]) -> bytes:
    """One position as a regex atom: a byte, any byte, or a class of runs."""
    if len(taken) == 256:
        return b"."
    if not taken:
        return b"(?!)"
    if len(taken) == 1:
        return _byte(next(iter(taken)))
    parts = []
    ordered = sorted(taken)
    first = prev = ordered[0]
    for b in (*ordered[1:], -2):
        if b != prev + 1:
            parts.append(_byte(first) if first == prev else _byte(first) + b"-" + _byte(prev))
            first = b
        prev = b
    return b"[" + b"".join(parts) + b"]"


def glob_matcher(pattern: bytes) -> Matcher:
    """Redis's glob (:func:`glob_positions`) as a test of a whole key, compiled
    in time linear in the pattern's length, matching in time linear in the
    key's length times the pattern's.

    Not one regex: ``.*a.*a.*b``-like translations backtrack exponentially in
    Python's ``re`` (a 60-byte key held the event loop for seconds). The
    pattern is cut at its stars into fixed-length segments: the first must
    match the key's start, the last its end, and each one between goes at its
    earliest match after the one before — where a match exists at all, the
    earliest leaves the most room for the rest, since a star takes anything.
    (Redis's own backtracking answers the same for every key: a star never
    needs to take the empty end of a key, since what follows it takes a byte.)
    """
    if len(pattern) > MAX_PATTERN_BYTES:
        raise errors.BadValue(f"pattern longer than {MAX_PATTERN_BYTES} bytes")
    segments: list[list[frozenset[int]]] = [[]]  # positions, cut at the stars
    for pos in glob_positions(pattern):
        if pos is None:
            if segments[-1] or len(segments) == 1:  # (consecutive stars are one)
                segments.append([])
        else:
            segments[-1].append(pos)
    if sum(len(seg) for seg in segments) > protocol.MAX_KEY_BYTES:
        return _never  # more bytes than any key holds
    if any(not pos for seg in segments for pos in seg):
        return _never  # a class that takes no byte ([], x[)
    rx = [re.compile(b"".join(_atom(p) for p in seg), re.S) for seg in segments]
    if len(rx) == 1:
        whole = rx[0]
        return lambda key: whole.fullmatch(key) is not None
    head, mids, tail = rx[0], rx[1:-1], rx[-1]
    head_len, tail_len = len(segments[0]), len(segments[-1])

    def match(key: bytes) -> bool:
        end = len(key) - tail_len
        if end < head_len or head.match(key) is None or tail.fullmatch(key, end) is None:
            return False
        pos = head_len
        for mid in mids:
            m = mid.search(key, pos, end)
            if m is None:
                return False
            pos = m.end()
        return True

    return match


_compiled: OrderedDict[tuple[str, bytes], Matcher] = OrderedDict()


def compiled_glob(bucket: str, pattern: bytes) -> tuple[Matcher, int]:
    """:func:`glob_matcher` of ``pattern``, compiled once while it stays among the
    :data:`PATTERN_CACHE_SIZE` last used, and the read floors compiling it cost
    (:func:`compile_floors`; 0 when it was cached). Kept per bucket: what one
    tenant's request costs never depends on what another one asked."""
    key = (bucket, pattern)
    matcher = _compiled.get(key)
    if matcher is not None:
        _compiled.move_to_end(key)
        return matcher, 0
    matcher = glob_matcher(pattern)  # (refuses one too long, before it is kept)
    _compiled[key] = matcher
    if len(_compiled) > PATTERN_CACHE_SIZE:
        _compiled.popitem(last=False)
    return matcher, compile_floors(pattern)


def compile_floors(pattern: bytes) -> int:
    """The read floors compiling ``pattern`` costs: one, one per
    :data:`PATTERN_UNIT_BYTES` of it, and one per ``[`` — each class is ~10-35 us
    of Python's ``re`` compiler, a GET's order; literals, ``?`` and stars are a
    few us each. A pattern refused for its length costs the same."""
    return 1 + len(pattern) // PATTERN_UNIT_BYTES + pattern.count(b"[")


def _never(key: bytes) -> bool:
    return False


def _scan_parse(args: list[bytes]) -> dict[str, Any]:
    p: dict[str, Any] = {"cursor": parse_cursor(args[1]), "match": None, "count": SCAN_COUNT}
    i = 2
    while i < len(args):
        opt = args[i].lower()
        if i + 1 >= len(args):
            raise syntax_error()
        if opt == b"match":
            p["match"] = args[i + 1]
        elif opt == b"count":
            count = parse_int(args[i + 1])
            if count < 1:
                raise syntax_error()
            p["count"] = min(count, MAX_SCAN_COUNT)
        elif opt == b"type":
            p["only"] = args[i + 1].lower()
        else:
            raise syntax_error()
        i += 2
    return p


def _range(s: Session, match: bytes | None) -> tuple[bytes, bytes | None, Matcher | None]:
    """(start, end, filter) of the keys a pattern can match: a prefix pattern
    (``user:*``) is a key range and needs no filter. A pattern compiled now
    costs its floors (:func:`compiled_glob`), counted in ``s.read_keys``."""
    if match is None or match == b"*":
        return b"", None, None
    prefix = glob_prefix(match)
    end = prefix_end(prefix) if prefix else None
    if match == prefix + b"*" and prefix:
        return prefix, end, None
    try:
        matches, floors = compiled_glob(s.bucket or "", match)
    except errors.BadValue:
        s.read_keys += compile_floors(match)  # (refused unread: it was received)
        raise
    s.read_keys += floors
    return prefix, end, matches


def _examined(s: Session, keys: list[bytes]) -> None:
    """Meter the keys a scan examined — each key and its record's header, what was
    read of it — at a read floor each (``read_keys``), matched or not."""
    s.read_sizes += [len(key) + HEADER_BYTES for key in keys]
    s.read_keys += len(keys)


def _scan(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    s.read_keys = 0
    try:
        start, end, matches = _range(s, p["match"])
        cursor = p["cursor"]
        if p.get("only", b"string") != b"string" or cursor >= scan_cursors.END:
            return [b"0", []]  # every key is a string; past the end of any scan
        table = scan_cursors.cursors(str(s.node.engine.path))
        after = table.resume(b.name, cursor) if cursor else None
        keys, more = s.node.engine.scan_keys(b, start=start, end=end, after=after, limit=p["count"])
        _examined(s, keys)
    finally:
        s.read_keys = max(1, s.read_keys)
    following = table.issue(b.name, keys[-1]) if more and keys else 0
    return [b"%d" % following, keys if matches is None else [k for k in keys if matches(k)]]


def _keys_cmd(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    s.read_keys = 0
    start, end, matches = _range(s, p["match"])
    out: list[bytes] = []
    after = None
    examined = 0
    try:
        while True:
            keys, more = s.node.engine.scan_keys(b, start=start, end=end, after=after, limit=1000)
            _examined(s, keys)
            out += keys if matches is None else (k for k in keys if matches(k))
            examined += len(keys)
            if not more or not keys:
                return out
            if examined >= MAX_KEYS:
                raise errors.BadValue(
                    f"KEYS would examine more than {MAX_KEYS} keys in this bucket; use SCAN"
                )
            after = keys[-1]
    finally:
        s.read_keys = max(1, s.read_keys)


def _scan_reply(enc: Encoder, v: Any) -> bytes:
    return b"*2\r\n" + enc.bulk(v[0]) + b"*%d\r\n" % len(v[1]) + b"".join(enc.bulk(k) for k in v[1])


_register(
    RedisCommand(
        "scan",
        -2,
        "read",
        _scan_parse,
        _scan,
        _scan_reply,
        ("readonly",),
        (0, 0, 0),
        "Iterate the keys of the bucket, in key order.",
        "generic",
    )
)
_register(
    RedisCommand(
        "keys",
        2,
        "read",
        lambda args: {"match": args[1]},
        _keys_cmd,
        lambda enc, v: b"*%d\r\n" % len(v) + b"".join(enc.bulk(k) for k in v),
        ("readonly",),
        (0, 0, 0),
        f"Find the keys matching a pattern (at most {MAX_KEYS} examined).",
        "generic",
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


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Redis's command families tenantkv does not run, each with why (docs/redis.md,
#: "Not supported", lists the same). One rule answers them all: Redis's own
#: ``ERR unknown command '<name>', with args beginning with: ...`` — what a Redis
#: server without that command (renamed away, its module not loaded) answers,
#: so clients and tools treat them as they already treat a missing command.
NOT_SUPPORTED: dict[str, tuple[str, frozenset[str]]] = {
    family: (why, _words(names))
    for family, why, names in (
        (
            "lists, hashes, sets, sorted sets, streams, HyperLogLog, geo",
            "tenantkv stores strings only",
            """
            lpush rpush lpushx rpushx lpop rpop llen lrange lindex lset lrem ltrim linsert
            lpos lmove blpop brpop brpoplpush blmove rpoplpush lmpop blmpop
            hset hget hmset hmget hgetall hdel hlen hexists hkeys hvals hincrby
            hincrbyfloat hsetnx hstrlen hscan hrandfield
            sadd srem smembers sismember smismember scard spop srandmember smove sinter
            sunion sdiff sinterstore sunionstore sdiffstore sscan sintercard
            zadd zrem zrange zrangebyscore zrevrange zrevrangebyscore zscore zincrby zcard
            zcount zrank zrevrank zpopmin zpopmax bzpopmin bzpopmax zscan zrangestore
            zunionstore zinterstore zunion zinter zdiff zdiffstore zintercard zmscore
            zlexcount zrangebylex zrevrangebylex zremrangebyrank zremrangebyscore
            zremrangebylex zrandmember zmpop bzmpop
            xadd xrange xrevrange xlen xread xreadgroup xgroup xack xdel xtrim xinfo
            xclaim xautoclaim xpending xsetid
            pfadd pfcount pfmerge pfdebug pfselftest
            geoadd geodist geohash geopos georadius georadius_ro georadiusbymember
            georadiusbymember_ro geosearch geosearchstore
            sort sort_ro
            """,
        ),
        (
            "scripting and functions",
            "a script would run tenant code on the event loop, outside the admission path",
            "eval evalsha eval_ro evalsha_ro script function fcall fcall_ro",
        ),
        (
            "modules",
            "no modules are loaded",
            "module",
        ),
        (
            "DUMP and RESTORE",
            "Redis's serialization format is not tenantkv's record",
            "dump restore restore-asking migrate",
        ),
        (
            "server, replication and cluster administration",
            "they act beyond one tenant's bucket; `tenantkv-admin` and `status` do this",
            """
            flushall shutdown debug save bgsave bgrewriteaof lastsave replicaof slaveof sync
            psync monitor move swapdb acl latency memory slowlog failover readonly
            readwrite wait waitaof
            """,
        ),
        (
            "transactions",
            "not yet: they come with the connection-layer rework",
            "multi exec discard watch unwatch",
        ),
        (
            "pub/sub",
            "no channels: tenantkv is a store, not a broker",
            "subscribe psubscribe ssubscribe unsubscribe punsubscribe sunsubscribe publish "
            "spublish pubsub",
        ),
    )
}

# The range, bit and float string commands and the keyspace commands, from their
# own modules.
for _c in (*redis_strings.COMMANDS, *redis_keyspace.COMMANDS, *redis_cluster.COMMANDS):
    _register(_c)
