"""Redis's SCAN and KEYS, and the glob patterns they (and CONFIG GET) match.

The bucket is an ordered index: a pattern with a literal prefix (``user:*``)
reads only that range; any other glob filters what is read. A pattern is
Redis's glob read as Redis's ``stringmatchlen`` reads it, compiled once per
(bucket, pattern) into a regular expression that runs in time linear in the
key, and charged as it is compiled. SCAN's cursors are numbers naming a stored
resume key (``scan_cursors``). Registered in
:data:`~tenantkv.server.redis_commands.REDIS_COMMANDS` beside their neighbours.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tenantkv import errors, protocol
from tenantkv.server import scan_cursors
from tenantkv.server.commands import Session, prefix_end
from tenantkv.server.redis_commands import (
    Encoder,
    RedisCommand,
    _register,
    parse_int,
    syntax_error,
)
from tenantkv.server.scan_cursors import parse_cursor
from tenantkv.storage.engine import BucketHandle, KeyRange
from tenantkv.storage.records import HEADER_BYTES

#: SCAN's default COUNT, and the most keys one SCAN call may examine.
SCAN_COUNT = 10
MAX_SCAN_COUNT = 1000
#: KEYS examines at most this many keys; past it the caller is told to use SCAN.
MAX_KEYS = 10_000


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
        keys, more = s.node.engine.scan_keys(b, KeyRange(start, end, after), limit=p["count"])
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
            keys, more = s.node.engine.scan_keys(b, KeyRange(start, end, after), limit=1000)
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
