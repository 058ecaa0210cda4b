"""Redis's string arithmetic (``storage/bit_ops.py``) against plain models: a value
as a list of bits, ranges clamped as Redis's ``t_string.c`` / ``bitops.c``
clamp them, and long double arithmetic checked on values it holds exactly."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from tenantkv.storage import bit_ops

values = st.binary(max_size=64)
ints = st.integers(min_value=-600, max_value=600)


def bits_of(value: bytes) -> list[int]:
    return [(byte >> (7 - i)) & 1 for byte in value for i in range(8)]


def clamp(start: int, end: int, n: int) -> tuple[int, int] | None:
    """Redis's range rule, written out."""
    if start < 0 and end < 0 and start > end:
        return None
    start = max(start + n if start < 0 else start, 0)
    end = min(max(end + n if end < 0 else end, 0), n - 1)
    return None if start > end or n == 0 else (start, end)


@given(values, ints, ints)
def test_getrange(value: bytes, start: int, end: int) -> None:
    r = clamp(start, end, len(value))
    assert bit_ops.getrange(value, start, end) == (b"" if r is None else value[r[0] : r[1] + 1])


@given(values, st.integers(0, 100), st.binary(max_size=20))
def test_setrange(value: bytes, offset: int, data: bytes) -> None:
    model = bytearray(value)
    if len(model) < offset + len(data):
        model += bytes(offset + len(data) - len(model))
    model[offset : offset + len(data)] = data
    got = bit_ops.setrange(value, offset, data)
    assert got == bytes(model)[: max(len(value), offset + len(data))]


@given(values, st.integers(0, 700), st.sampled_from([0, 1]))
def test_setbit_and_getbit(value: bytes, offset: int, bit: int) -> None:
    model = bits_of(value)
    old = model[offset] if offset < len(model) else 0
    new, previous = bit_ops.setbit(value, offset, bit)
    assert previous == old == bit_ops.getbit(value, offset)
    assert bit_ops.getbit(new, offset) == bit
    assert len(new) == max(len(value), offset // 8 + 1)


@given(values, ints, ints, st.booleans())
def test_bitcount(value: bytes, start: int, end: int, unit_bits: bool) -> None:
    bits = bits_of(value)
    r = clamp(start, end, len(bits) if unit_bits else len(value))
    if r is None:
        want = 0
    else:
        lo, hi = r if unit_bits else (r[0] * 8, r[1] * 8 + 7)
        want = sum(bits[lo : hi + 1])
    assert bit_ops.bitcount(value, (start, end, unit_bits)) == want
    assert bit_ops.bitcount(value) == sum(bits)


@given(values, st.sampled_from([0, 1]), st.none() | ints, st.none() | ints, st.booleans())
def test_bitpos(
    value: bytes, bit: int, start: int | None, end: int | None, unit_bits: bool
) -> None:
    if start is None:
        end = None
    bits = bits_of(value)
    got = bit_ops.bitpos(value, bit, start, end, unit_bits and start is not None)
    unit_bits = unit_bits and start is not None
    total = len(bits) if unit_bits else len(value)
    s = 0 if start is None else start
    e = (total - 1) if end is None else end
    s = max(s + total if s < 0 else s, 0)
    e = min(max(e + total if e < 0 else e, 0), total - 1)
    if s > e:
        assert got == -1
        return
    lo, hi = (s, e) if unit_bits else (s * 8, e * 8 + 7)
    hits = [i for i in range(lo, hi + 1) if bits[i] == bit]
    if hits:
        assert got == hits[0]
    elif bit == 0 and end is None:
        assert got == (hi | 7) + 1  # past the range: the value is taken as zero-padded
    else:
        assert got == -1


@given(values, st.integers(0, 600), st.integers(1, 64), st.booleans(), st.integers(-(2**64), 2**64))
def test_bitfield_put_then_get(value: bytes, offset: int, bits: int, signed: bool, n: int) -> None:
    data = bytearray(value.ljust((offset + bits + 7) // 8, b"\0"))
    before = bits_of(bytes(data))
    bit_ops.bitfield_put(data, offset, bits, n)
    after = bits_of(bytes(data))
    field = n & ((1 << bits) - 1)
    assert after[offset : offset + bits] == [(field >> (bits - 1 - i)) & 1 for i in range(bits)]
    assert after[:offset] == before[:offset] and after[offset + bits :] == before[offset + bits :]
    want = field - (1 << bits) if signed and field >> (bits - 1) else field
    assert bit_ops.bitfield_get(bytes(data), offset, bits, signed) == want


@given(st.lists(values, min_size=1, max_size=4), st.sampled_from(["and", "or", "xor"]))
def test_bitop(vals: list[bytes], op: str) -> None:
    size = max(len(v) for v in vals)
    padded = [v.ljust(size, b"\0") for v in vals]
    want = bytearray(padded[0])
    for v in padded[1:]:
        for i, byte in enumerate(v):
            want[i] = (
                want[i] & byte if op == "and" else want[i] | byte if op == "or" else want[i] ^ byte
            )
    assert bit_ops.bitop(op, vals) == bytes(want)


@given(
    st.integers(-(10**12), 10**12),
    st.integers(0, 3),
    st.integers(-(10**12), 10**12),
    st.integers(0, 3),
)
def test_incrbyfloat_on_exact_values(a: int, ad: int, b: int, bd: int) -> None:
    """Halves and quarters are exact in a long double: the sum prints exactly."""
    x, y = Fraction(a, 2**ad), Fraction(b, 2**bd)
    text = lambda f: str(Decimal(f.numerator) / Decimal(f.denominator))  # noqa: E731  (exact)
    got = bit_ops.incrbyfloat(text(x).encode(), text(y).encode())
    assert Fraction(got.decode()) == x + y
    assert not got.endswith(b".") and (b"." not in got or not got.endswith(b"0"))


def test_long_double_formatting() -> None:
    assert bit_ops.incrbyfloat(b"10.50", b"0.1") == b"10.6"
    assert bit_ops.incrbyfloat(None, b"1e3") == b"1000"
    assert bit_ops.incrbyfloat(b"-0", b"0") == b"0"
    assert bit_ops.incrbyfloat(b"1", b"-1") == b"0"
    assert bit_ops.parse_long_double(b"1e5000") is None  # past a long double's range
    assert bit_ops.parse_long_double(b" 1") is None


def test_huge_exponents_are_refused_before_they_are_built() -> None:
    """``1e999999999`` would be a billion-digit integer as an exact fraction."""
    assert bit_ops.parse_long_double(b"1e999999999") is None
    assert bit_ops.parse_long_double(b"1e-999999999") is None
    assert bit_ops.parse_long_double(b"1e4932") is not None
