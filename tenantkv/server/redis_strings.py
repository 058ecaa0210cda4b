"""Redis's range, bit and float string commands: GETRANGE, SUBSTR, SETRANGE,
GETBIT, SETBIT, BITCOUNT, BITPOS, BITOP, INCRBYFLOAT and LCS.

Registered in :data:`~tenantkv.server.redis_commands.REDIS_COMMANDS` like their
neighbours, so they are admitted, charged and answered on the same path: a
read is charged the read units of the record it read, a write the write units
of the record it wrote plus the read units of what it read (``reply_hint``),
and writes go through group commit (``storage/value_ops.py``). Offsets and
results are bounded by ``max_value_bytes`` where Redis bounds them by its
``proto-max-bulk-len``, with Redis's words. Arguments are parsed in Redis's
order, so a bad one gets the error Redis gives first.
"""

from __future__ import annotations

from typing import Any

from tenantkv import errors
from tenantkv.server.commands import Session
from tenantkv.server.redis_commands import (
    Encoder,
    RedisCommand,
    _bulk_or_null,
    _integer,
    _key,
    _keys,
    _register,
    _stored_value_bytes,
    parse_int,
    read_command,
    syntax_error,
)
from tenantkv.storage import bit_ops
from tenantkv.storage.engine import MAX_RESULT_BYTES, BucketHandle
from tenantkv.storage.value_ops import (
    TOO_BIG,
    BitFieldOp,
    BitOpOp,
    IncrByFloatOp,
    SetBitOp,
    SetRangeOp,
)

#: This module's commands (registered in REDIS_COMMANDS as the module ends).
COMMANDS: list[RedisCommand] = []
BIT_OFFSET_ERROR = "bit offset is not an integer or out of range"
BIT_ERROR = "bit is not an integer or out of range"
#: LCS compares every byte of one value with every byte of the other in Python
#: (~0.1 us a cell): at most this many cells, ~60 ms of the event loop, and
#: charged a read floor per 4,096 cells on top of the values read.
MAX_LCS_CELLS = 250_000
LCS_CELLS_PER_FLOOR = 4096
#: The most bytes of source values one BITOP may read (the writer holds them all
#: at once): what one MGET may return.
MAX_BITOP_BYTES = MAX_RESULT_BYTES


def _value(s: Session, b: BucketHandle, key: bytes) -> bytes | None:
    """The live value of ``key``, metered as the record read."""
    found = s.node.engine.get_value_in(s.read_txn(), b, key)
    if found is None:
        return None
    s.read_sizes.append(len(key) + found[1])
    return found[0]


def _bit_offset(s: Session, arg: bytes) -> int:
    offset = parse_int(arg, BIT_OFFSET_ERROR)
    if offset < 0 or offset >> 3 >= s.node.config.max_value_bytes:
        raise errors.BadValue(BIT_OFFSET_ERROR)
    return offset


# -- reads ---------------------------------------------------------------------------------


def _getrange_parse(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1]), "start": parse_int(args[2]), "end": parse_int(args[3])}


def _getrange(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    value = _value(s, b, p["key"])
    return b"" if value is None else bit_ops.getrange(value, p["start"], p["end"])


def _getbit(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    offset = _bit_offset(s, p["args"][2])
    value = _value(s, b, p["key"])
    return 0 if value is None else bit_ops.getbit(value, offset)


def _unit(arg: bytes) -> bool:
    """BIT (True) or BYTE, as Redis reads the range's unit."""
    unit = arg.lower()
    if unit not in (b"bit", b"byte"):
        raise syntax_error()
    return unit == b"bit"


def _bitcount(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    args = p["args"]
    value = _value(s, b, p["key"])  # Redis looks the key up first: a miss is 0
    if value is None:
        return 0
    if len(args) == 2:
        return bit_ops.bitcount(value)
    if len(args) not in (4, 5):
        raise syntax_error()
    start, end = parse_int(args[2]), parse_int(args[3])
    if start < 0 and end < 0 and start > end:
        return 0
    return bit_ops.bitcount(value, (start, end, len(args) == 5 and _unit(args[4])))


def _bitpos(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """BITPOS: the bit is checked before the key is looked up, the range after."""
    args = p["args"]
    bit = parse_int(args[2])
    if bit not in (0, 1):
        raise errors.BadValue("The bit argument must be 1 or 0.")
    value = _value(s, b, p["key"])
    if value is None:
        return -1 if bit else 0
    if len(args) == 3:
        return bit_ops.bitpos(value, bit, None, None, False)
    if len(args) > 6:
        raise syntax_error()
    start = parse_int(args[3])
    unit_bits = len(args) == 6 and _unit(args[5])
    end = parse_int(args[4]) if len(args) >= 5 else None
    return bit_ops.bitpos(value, bit, start, end, unit_bits)


def _lcs_parse(args: list[bytes]) -> dict[str, Any]:
    return {"keys": [_key(args[1]), _key(args[2])], "args": args}


def _lcs_options(args: list[bytes]) -> tuple[bool, bool, bool, int]:
    """(LEN, IDX, WITHMATCHLEN, MINMATCHLEN) as Redis reads them."""
    getlen = getidx = withlen = False
    minlen = 0
    j = 3
    while j < len(args):
        opt = args[j].lower()
        if opt == b"idx":
            getidx = True
        elif opt == b"len":
            getlen = True
        elif opt == b"withmatchlen":
            withlen = True
        elif opt == b"minmatchlen" and j + 1 < len(args):
            minlen = max(0, parse_int(args[j + 1]))
            j += 1
        else:
            raise syntax_error()
        j += 1
    if getlen and getidx:
        raise errors.BadValue("If you want both the length and indexes, please just use IDX.")
    return getlen, getidx, withlen, minlen


def _lcs(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    a = _value(s, b, p["keys"][0]) or b""
    c = _value(s, b, p["keys"][1]) or b""
    s.read_keys = 2
    getlen, getidx, withlen, minlen = _lcs_options(p["args"])
    cells = (len(a) + 1) * (len(c) + 1)
    if cells > MAX_LCS_CELLS:
        raise errors.BadValue(
            f"Insufficient memory, transient memory for LCS exceeds {MAX_LCS_CELLS} cells "
            "(the values' lengths plus one, multiplied)"
        )
    s.read_keys += cells // LCS_CELLS_PER_FLOOR
    return bit_ops.lcs(a, c, getlen, getidx, withlen, minlen)


def _lcs_reply(enc: Encoder, v: Any) -> bytes:
    if isinstance(v, int):
        return enc.integer(v)
    if isinstance(v, bytes):
        return enc.bulk(v)
    return enc.map({"matches": v[0], "len": v[1]})


def _register_reads() -> None:
    """The read commands' table entries, as GET's are declared."""
    one = (1, 1, 1)
    for name, arity, parse, handler, reply, summary in (
        ("getrange", 4, _getrange_parse, _getrange, _bulk_or_null, "Get part of a value."),
        ("substr", 4, _getrange_parse, _getrange, _bulk_or_null, "Get part of a value."),
        ("getbit", 3, _key_args, _getbit, _integer, "Get the bit at an offset of a value."),
        ("bitcount", -2, _key_args, _bitcount, _integer, "Count the set bits of a value."),
        ("bitpos", -3, _key_args, _bitpos, _integer, "Find the first set or clear bit."),
    ):
        group = "string" if name in ("getrange", "substr") else "bitmap"
        COMMANDS.append(read_command(name, arity, parse, handler, reply, one, summary, group))
    COMMANDS.append(
        RedisCommand(
            "lcs",
            -3,
            "read",
            _lcs_parse,
            _lcs,
            _lcs_reply,
            ("readonly",),
            (1, 2, 1),
            f"The longest common subsequence of two values (at most {MAX_LCS_CELLS} cells).",
        )
    )


def _key_args(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1]), "args": args}


# -- writes ----------------------------------------------------------------------------------


def _setrange_parse(args: list[bytes]) -> dict[str, Any]:
    offset = parse_int(args[2])
    if offset < 0:
        raise errors.BadValue("offset is out of range")
    return {"key": _key(args[1]), "offset": offset, "value": args[3]}


def _setrange(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    limit = s.node.config.max_value_bytes
    if p["value"] and p["offset"] + len(p["value"]) > limit:
        raise errors.ValueTooLarge(TOO_BIG)  # refused before it is admitted, as Redis
    key = p["key"]
    hint = _stored_value_bytes(s, b, key)
    return SetRangeOp(b, key, p["offset"], p["value"], limit, reply_hint=hint)


def _setbit(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    args = p["args"]
    offset = _bit_offset(s, args[2])
    bit = parse_int(args[3], BIT_ERROR)
    if bit not in (0, 1):
        raise errors.BadValue(BIT_ERROR)
    key = p["key"]
    return SetBitOp(b, key, offset, bit, reply_hint=_stored_value_bytes(s, b, key))


def _bitop_parse(args: list[bytes]) -> dict[str, Any]:
    op = args[1].lower()
    if op not in (b"and", b"or", b"xor", b"not"):
        raise syntax_error()
    if op == b"not" and len(args) != 4:
        raise errors.BadValue("BITOP NOT must be called with a single source key.")
    return {"only": op.decode(), "key": _key(args[2]), "keys": _keys(args[3:])}


def _bitop(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    keys = p["keys"]
    hint = sum(_stored_value_bytes(s, b, k) for k in keys)
    if hint > MAX_BITOP_BYTES:
        raise errors.BadValue(
            f"BITOP's source values hold {hint} bytes, more than {MAX_BITOP_BYTES} in one command"
        )
    limit = s.node.config.max_value_bytes
    return BitOpOp(b, p["only"], p["key"], keys, limit, reply_hint=hint)


def _incrbyfloat(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    return IncrByFloatOp(b, p["key"], p["value"])


def _field_type(arg: bytes) -> tuple[bool, int]:
    """A BITFIELD type (``i1``-``i64``, ``u1``-``u63``) as (signed, bits)."""
    if arg[:1] not in (b"i", b"u"):
        raise errors.BadValue(bit_ops.BITFIELD_TYPE_ERROR)
    signed = arg[:1] == b"i"
    bits = parse_int(arg[1:], bit_ops.BITFIELD_TYPE_ERROR) if arg[1:] else 0
    if not 1 <= bits <= (64 if signed else 63):
        raise errors.BadValue(bit_ops.BITFIELD_TYPE_ERROR)
    return signed, bits


def _field_offset(s: Session, arg: bytes, bits: int) -> int:
    """A BITFIELD offset (``#n``: the n-th field of this width), bounded so the
    field's last byte fits within max_value_bytes."""
    offset = parse_int(arg[1:] if arg[:1] == b"#" else arg, BIT_OFFSET_ERROR)
    if arg[:1] == b"#":
        offset *= bits
    if offset < 0 or (offset + bits - 1) >> 3 >= s.node.config.max_value_bytes:
        raise errors.BadValue(BIT_OFFSET_ERROR)
    return offset


def _field_ops(s: Session, args: list[bytes]) -> list[bit_ops.FieldOp]:
    """BITFIELD's operations, read in Redis's order and with its errors."""
    fops: list[bit_ops.FieldOp] = []
    overflow = "wrap"
    j = 2
    while j < len(args):
        sub, left = args[j].lower(), len(args) - j - 1
        if sub == b"overflow" and left >= 1:
            overflow = args[j + 1].lower().decode(errors="replace")
            if overflow not in ("wrap", "sat", "fail"):
                raise errors.BadValue("Invalid OVERFLOW type specified")
            j += 2
            continue
        if not ((sub == b"get" and left >= 2) or (sub in (b"set", b"incrby") and left >= 3)):
            raise syntax_error()
        signed, bits = _field_type(args[j + 1])
        offset = _field_offset(s, args[j + 2], bits)
        arg = parse_int(args[j + 3]) if sub != b"get" else 0
        fops.append((sub.decode(), signed, bits, offset, arg, overflow))
        j += 3 if sub == b"get" else 4
    return fops


def _bitfield(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    fops = _field_ops(s, p["args"])
    hint = _stored_value_bytes(s, b, p["key"])
    return BitFieldOp(b, p["key"], [list(o) for o in fops], reply_hint=hint)


def _bitfield_ro(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    fops = _field_ops(s, p["args"])
    if any(o[0] != "get" for o in fops):
        raise errors.BadValue("BITFIELD_RO only supports the GET subcommand")
    return bit_ops.bitfield(_value(s, b, p["key"]) or b"", fops)[1]


def _fields_reply(enc: Encoder, v: Any) -> bytes:
    return b"*%d\r\n" % len(v) + b"".join(enc.null() if n is None else enc.integer(n) for n in v)


def _register_writes() -> None:
    """The write commands' table entries, as SET's are declared."""
    flags = ("write", "denyoom")
    for name, arity, parse, handler, reply, group, summary in (
        (
            "setrange",
            4,
            _setrange_parse,
            _setrange,
            _integer,
            "string",
            "Overwrite part of a value.",
        ),
        ("setbit", 4, _key_args, _setbit, _integer, "bitmap", "Set or clear a bit of a value."),
        (
            "bitfield",
            -2,
            _key_args,
            _bitfield,
            _fields_reply,
            "bitmap",
            "Read, set or increment integer fields of a value (GET alone writes nothing).",
        ),
        (
            "incrbyfloat",
            3,
            lambda args: {"key": _key(args[1]), "value": args[2]},
            _incrbyfloat,
            _bulk_or_null,
            "string",
            "Increment the float value of a key.",
        ),
    ):
        COMMANDS.append(
            RedisCommand(
                name, arity, "write", parse, handler, reply, flags, (1, 1, 1), summary, group
            )
        )
    COMMANDS.append(
        RedisCommand(
            "bitop",
            -4,
            "write",
            _bitop_parse,
            _bitop,
            _integer,
            flags,
            (2, -1, 1),
            "Bitwise AND, OR, XOR or NOT of values, stored in a key.",
            "bitmap",
        )
    )


_register_reads()
_register_writes()
COMMANDS.append(
    RedisCommand(
        "bitfield_ro",
        -2,
        "read",
        _key_args,
        _bitfield_ro,
        _fields_reply,
        ("readonly", "fast"),
        (1, 1, 1),
        "Read integer fields of a value.",
        "bitmap",
    )
)

for _c in COMMANDS:
    _register(_c)
