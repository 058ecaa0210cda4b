"""Redis's string arithmetic as pure functions: ranges, bits and float increments.

No storage here: the RESP handlers (``server/redis_strings.py``) read with them
and the write ops (``storage/value_ops.py``) write with them, and the tests hold
each to Redis 7.0's ``t_string.c`` / ``bitops.c`` (or to a plain model of it).
Indexes follow Redis: negative ones count from the end, then both ends are
clamped into the string.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from tenantkv import errors


def clamp_range(start: int, end: int, length: int) -> tuple[int, int] | None:
    """Redis's ``start``/``end`` (inclusive, negative from the end) clamped into a
    string of ``length``; None when the range is empty."""
    if start < 0 and end < 0 and start > end:
        return None
    if start < 0:
        start += length
    if end < 0:
        end += length
    start, end = max(start, 0), max(end, 0)
    end = min(end, length - 1)
    if start > end or length == 0:
        return None
    return start, end


def getrange(value: bytes, start: int, end: int) -> bytes:
    """GETRANGE / SUBSTR."""
    r = clamp_range(start, end, len(value))
    return b"" if r is None else value[r[0] : r[1] + 1]


def setrange(value: bytes, offset: int, data: bytes) -> bytes:
    """SETRANGE: ``data`` written at ``offset``, zero-padding a shorter value."""
    if len(value) < offset:
        value += bytes(offset - len(value))
    return value[:offset] + data + value[offset + len(data) :]


def getbit(value: bytes, offset: int) -> int:
    """GETBIT: bit 0 is the most significant bit of the first byte."""
    byte = offset >> 3
    if byte >= len(value):
        return 0
    return (value[byte] >> (7 - (offset & 7))) & 1


def setbit(value: bytes, offset: int, bit: int) -> tuple[bytes, int]:
    """SETBIT: the new value and the bit it replaced."""
    byte = offset >> 3
    if byte >= len(value):
        value += bytes(byte + 1 - len(value))
    old = (value[byte] >> (7 - (offset & 7))) & 1
    mask = 1 << (7 - (offset & 7))
    new = value[byte] | mask if bit else value[byte] & ~mask
    return value[:byte] + bytes((new,)) + value[byte + 1 :], old


def _edges(start: int, end: int, length: int, unit_bits: bool) -> tuple[int, int] | None:
    """BITCOUNT / BITPOS range in bits (``unit_bits``: BIT; else BYTE), clamped."""
    total = length * 8 if unit_bits else length
    if start < 0:
        start += total
    if end < 0:
        end += total
    start, end = max(start, 0), max(end, 0)
    end = min(end, total - 1)
    if start > end:
        return None
    return (start, end) if unit_bits else (start * 8, end * 8 + 7)


def bitcount(value: bytes, rng: tuple[int, int, bool] | None = None) -> int:
    """BITCOUNT over the whole value, or ``(start, end, BIT?)``."""
    if rng is None:
        return int.from_bytes(value, "big").bit_count()
    start, end, unit_bits = rng
    if start < 0 and end < 0 and start > end:
        return 0
    r = _edges(start, end, len(value), unit_bits)
    if r is None:
        return 0
    lo, hi = r
    chunk = int.from_bytes(value[lo >> 3 : (hi >> 3) + 1], "big")
    width = ((hi >> 3) - (lo >> 3) + 1) * 8
    chunk >>= 7 - (hi & 7)
    chunk &= (1 << (width - (lo & 7) - (7 - (hi & 7)))) - 1
    return chunk.bit_count()


def bitpos(value: bytes, bit: int, start: int | None, end: int | None, unit_bits: bool) -> int:
    """BITPOS: the first ``bit`` in the range; past the value counts as clear bits
    unless an end was given (Redis: -1 then)."""
    if start is None:
        start, end_given, end = 0, False, len(value) - 1
        unit_bits = False
    elif end is None:
        end_given, end = False, (len(value) * 8 + 7 if unit_bits else len(value) - 1)
    else:
        end_given = True
    r = _edges(start, end, len(value), unit_bits)
    if r is None:
        return -1
    return _first_bit(int.from_bytes(value, "big"), len(value) * 8, *r, bit, end_given)


def _first_bit(bits: int, total: int, lo: int, hi: int, bit: int, end_given: bool) -> int:
    """The first position in [lo, hi] holding ``bit``, from the big integer of the value."""
    width = hi - lo + 1
    window = (bits >> (total - 1 - hi)) & ((1 << width) - 1)
    if bit:
        if not window:
            return -1
        return lo + width - window.bit_length()
    inverted = window ^ ((1 << width) - 1)
    if inverted:
        return lo + width - inverted.bit_length()
    if end_given:
        return -1
    # No clear bit in the range: the value is taken as padded with zeros on the
    # right, so Redis answers the first bit past the range's last byte.
    return (hi | 7) + 1


def bitop(op: str, values: list[bytes]) -> bytes:
    """BITOP AND / OR / XOR / NOT: shorter values count as zero-padded."""
    size = max((len(v) for v in values), default=0)
    if size == 0:
        return b""
    if op == "not":
        return (int.from_bytes(values[0], "big") ^ ((1 << (8 * size)) - 1)).to_bytes(size, "big")
    ints = [int.from_bytes(v.ljust(size, b"\0"), "big") for v in values]
    acc = ints[0]
    for n in ints[1:]:
        acc = acc & n if op == "and" else acc | n if op == "or" else acc ^ n
    return acc.to_bytes(size, "big")


# -- INCRBYFLOAT: Redis's long double, emulated exactly --------------------------------------

#: Longest float string Redis reads (MAX_LONG_DOUBLE_CHARS).
MAX_FLOAT_CHARS = 5 * 1024
_MANTISSA_BITS = 64  # x87 extended precision, as Redis's long double on x86-64
_MAX_EXP = 16384
#: Decimal exponents a long double reaches (1.19e4932 down to 3.6e-4951 subnormal).
_MAX_DIGITS, _MIN_DIGITS = 4933, 4951
_FLOAT_RE = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INF_RE = re.compile(rb"[+-]?(?:inf|infinity)", re.I)
NOT_A_FLOAT = "value is not a valid float"


class _Inf(Exception):
    """A long double that overflowed."""


def _round_ld(x: Fraction) -> Fraction:
    """``x`` rounded to the nearest long double (ties to even); raises _Inf past its range."""
    if x == 0:
        return x
    sign, a = (1, x) if x > 0 else (-1, -x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    shift = e - (_MANTISSA_BITS - 1)
    scaled = a / Fraction(2) ** shift
    m = round(scaled)  # Fraction rounds half to even
    if m >> _MANTISSA_BITS:
        m >>= 1
        shift += 1
    if e >= _MAX_EXP:
        raise _Inf
    return sign * m * Fraction(2) ** shift


def parse_long_double(arg: bytes) -> Fraction | None:
    """A float as Redis's ``string2ld`` reads it (strtold, no spaces, no NaN, no
    overflow), rounded to a long double; None where Redis says not a valid float.
    Infinity is returned as None too, with the caller checking :func:`is_inf_arg`."""
    if not arg or len(arg) >= MAX_FLOAT_CHARS or not _FLOAT_RE.fullmatch(arg):
        return None
    try:
        dec = Decimal(arg.decode())
    except (InvalidOperation, ValueError):
        return None
    if dec and not -_MIN_DIGITS <= dec.adjusted() <= _MAX_DIGITS:
        return None  # past a long double's range (checked before 10**n is built)
    exact = Fraction(dec)
    try:
        value = _round_ld(exact)
    except _Inf:
        return None
    if exact != 0 and value == 0:
        return None  # underflow (ERANGE with a zero result)
    return value


def is_inf_arg(arg: bytes) -> bool:
    return bool(_INF_RE.fullmatch(arg))


def incrbyfloat(current: bytes | None, incr: bytes) -> bytes:
    """INCRBYFLOAT's new value, formatted as Redis does (``%.17Lf``, trailing zeros
    and point dropped)."""
    base = Fraction(0) if current is None else parse_long_double(current)
    if base is None and not (current is not None and is_inf_arg(current)):
        raise errors.NotANumber(NOT_A_FLOAT)
    if base is None or is_inf_arg(incr):
        raise errors.BadValue("increment would produce NaN or Infinity")
    step = parse_long_double(incr)
    if step is None:
        raise errors.BadValue(NOT_A_FLOAT)
    try:
        total = _round_ld(base + step)
    except _Inf:
        raise errors.BadValue("increment would produce NaN or Infinity") from None
    return format_long_double(total)


def format_long_double(x: Fraction) -> bytes:
    """``%.17Lf`` of ``x`` (exact, ties to even), trailing zeros dropped; ``-0`` is ``0``."""
    scaled = round(abs(x) * 10**17)
    digits = str(scaled).rjust(18, "0")
    text = f"{digits[:-17]}.{digits[-17:]}".rstrip("0").rstrip(".")
    if x < 0 and text != "0":
        text = "-" + text
    return text.encode()


def lcs(
    a: bytes, b: bytes, getlen: bool, getidx: bool, withlen: bool, minlen: int
) -> int | bytes | tuple[list[list[Any]], int]:
    """LCS, transcribed from Redis's ``lcsCommand``: the subsequence, its length
    (LEN), or (IDX) the matched ranges from the end backwards and the length.
    The caller bounds ``(len(a) + 1) * (len(b) + 1)``."""
    rows = [[0] * (len(b) + 1)]
    for i in range(1, len(a) + 1):
        prev, row, ai = rows[-1], [0], a[i - 1]
        for j in range(1, len(b) + 1):
            row.append(prev[j - 1] + 1 if ai == b[j - 1] else max(prev[j], row[j - 1]))
        rows.append(row)
    total = rows[len(a)][len(b)]
    if getlen and not getidx:
        return total
    out = bytearray(total)
    idx, i, j = total, len(a), len(b)
    matches: list[list[Any]] = []
    a_start = len(a)  # (len(a): no range open)
    a_end = b_start = b_end = 0
    while i > 0 and j > 0:
        emit = False
        if a[i - 1] == b[j - 1]:
            out[idx - 1] = a[i - 1]
            if a_start == len(a):
                a_start = a_end = i - 1
                b_start = b_end = j - 1
            elif a_start == i and b_start == j:
                a_start -= 1
                b_start -= 1
            else:
                emit = True
            if a_start == 0 or b_start == 0:
                emit = True
            idx, i, j = idx - 1, i - 1, j - 1
        else:
            if rows[i - 1][j] > rows[i][j - 1]:
                i -= 1
            else:
                j -= 1
            if a_start != len(a):
                emit = True
        if emit:
            match_len = a_end - a_start + 1
            if getidx and (minlen == 0 or match_len >= minlen):
                m: list[Any] = [[a_start, a_end], [b_start, b_end]]
                matches.append([*m, match_len] if withlen else m)
            a_start = len(a)
    if getidx:
        return matches, total
    return bytes(out)


# -- BITFIELD -----------------------------------------------------------------------------------

BITFIELD_TYPE_ERROR = (
    "Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
)


def bitfield_get(value: bytes, offset: int, bits: int, signed: bool) -> int:
    """The ``bits``-wide integer at bit ``offset`` (big-endian; past the end is zeros)."""
    first, last = offset >> 3, (offset + bits - 1) >> 3
    chunk = value[first : last + 1].ljust(last - first + 1, b"\0")
    n = int.from_bytes(chunk, "big") >> ((last + 1) * 8 - (offset + bits))
    n &= (1 << bits) - 1
    if signed and n >> (bits - 1):
        n -= 1 << bits
    return n


def bitfield_put(value: bytearray, offset: int, bits: int, n: int) -> None:
    """Write the low ``bits`` of ``n`` at bit ``offset`` of ``value`` (already long enough)."""
    first, last = offset >> 3, (offset + bits - 1) >> 3
    width = (last - first + 1) * 8
    shift = width - (offset - first * 8) - bits
    mask = ((1 << bits) - 1) << shift
    chunk = int.from_bytes(value[first : last + 1], "big")
    chunk = (chunk & ~mask) | ((n & ((1 << bits) - 1)) << shift)
    value[first : last + 1] = chunk.to_bytes(width // 8, "big")


def bitfield_fit(n: int, bits: int, signed: bool, overflow: str) -> int | None:
    """``n`` as the field holds it under an OVERFLOW policy (None: FAIL refused it)."""
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if lo <= n <= hi:
        return n
    if overflow == "fail":
        return None
    if overflow == "sat":
        return hi if n > hi else lo
    n &= (1 << bits) - 1
    return n - (1 << bits) if signed and n >> (bits - 1) else n


#: One BITFIELD operation: (opcode get/set/incrby, signed, bits, offset, value, overflow).
FieldOp = tuple[str, bool, int, int, int, str]


def bitfield(value: bytes, fops: list[FieldOp]) -> tuple[bytes, list[int | None]]:
    """Apply BITFIELD's operations in order: the new value (grown, zero-padded, to
    the farthest bit any SET or INCRBY reaches, as Redis grows it before it
    runs them) and each operation's answer."""
    reach = (
        max(((o[3] + o[2] - 1) >> 3) + 1 for o in fops if o[0] != "get")
        if any(o[0] != "get" for o in fops)
        else 0
    )
    data = bytearray(value.ljust(reach, b"\0"))
    out: list[int | None] = []
    for opcode, signed, bits, offset, arg, overflow in fops:
        old = bitfield_get(bytes(data), offset, bits, signed)
        if opcode == "get":
            out.append(old)
            continue
        if opcode == "set":
            raw = arg if signed else arg % (1 << 64)  # (Redis reads it as a uint64)
            new = bitfield_fit(raw, bits, signed, overflow)
        else:
            new = bitfield_fit(old + arg, bits, signed, overflow)
        if new is None:
            out.append(None)
            continue
        bitfield_put(data, offset, bits, new)
        out.append(old if opcode == "set" else new)
    return bytes(data), out
