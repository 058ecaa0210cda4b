"""Writes that change part of a value or move a whole record: Redis's SETRANGE,
SETBIT, INCRBYFLOAT, BITOP, COPY and RENAME.

Like every :class:`~tenantkv.storage.ops.WriteOp` they are applied by the
group-commit writer in its transaction, validate before they write, and are
acknowledged once durable; with ``--workers N`` they travel to the node's
writer as plain data (``storage/op_wire.py``). A multi-key op reads and writes
all its keys in the one transaction, so RENAME and COPY are atomic.

Metering: ``nbytes`` is the record written (a changed byte rewrites the whole
value, as LMDB does); ``reply_hint`` is the stored bytes the op reads, taken
from the records' headers when the op is built, so they are admitted and
charged as read units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tenantkv import errors
from tenantkv.storage import bit_ops, records
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import (
    WriteContext,
    WriteOp,
    _check_bucket,
    _delete,
    _put,
    _stored_and_live,
)
from tenantkv.storage.string_ops import ValueRewriteOp, _write

#: Redis's answer when a result would pass the largest value (its proto-max-bulk-len;
#: ours is max_value_bytes).
TOO_BIG = "string exceeds maximum allowed size (proto-max-bulk-len)"


def _bounded(data: bytes, limit: int) -> bytes:
    if len(data) > limit:
        raise errors.ValueTooLarge(TOO_BIG)
    return data


@dataclass(slots=True, eq=False)
class SetRangeOp(ValueRewriteOp):
    """SETRANGE: the value's length after writing ``value`` at ``offset``."""

    offset: int
    value: bytes
    max_value_bytes: int
    reply_hint: int = 0
    nbytes: int = 0

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        end = max(self.reply_hint, self.offset + len(self.value))
        return len(self.key) + records.HEADER_BYTES + end + self.reply_hint

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        if not self.value:  # nothing to write: the length as it is
            return None, 0 if current is None else len(current)
        if self.offset + len(self.value) > self.max_value_bytes:
            raise errors.ValueTooLarge(TOO_BIG)
        data = bit_ops.setrange(current or b"", self.offset, self.value)
        return data, len(data)


@dataclass(slots=True, eq=False)
class SetBitOp(ValueRewriteOp):
    """SETBIT: the bit's previous value (the value grows, zero-padded)."""

    offset: int
    bit: int
    reply_hint: int = 0
    nbytes: int = 0

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        end = max(self.reply_hint, (self.offset >> 3) + 1)
        return len(self.key) + records.HEADER_BYTES + end + self.reply_hint

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        return bit_ops.setbit(current or b"", self.offset, self.bit)


@dataclass(slots=True, eq=False)
class IncrByFloatOp(ValueRewriteOp):
    """INCRBYFLOAT: the new value as Redis formats it; the expiry is kept."""

    incr: bytes
    nbytes: int = 0

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        data = bit_ops.incrbyfloat(current, self.incr)
        return data, data


class _WritesDest(WriteOp):
    """An op that writes ``dest`` from values it reads (BITOP, COPY, RENAME): it holds
    what it reads (``reply_hint``) and writes as much again."""

    dest: bytes

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return len(self.dest) + records.HEADER_BYTES + 2 * self.reply_hint


@dataclass(slots=True, eq=False)
class BitOpOp(_WritesDest):
    """BITOP: ``dest`` set to the operation over ``keys`` (deleted when the result
    is empty, as in Redis); returns the result's length."""

    bucket: BucketHandle
    op: str
    dest: bytes
    keys: list[bytes]
    max_value_bytes: int
    reply_hint: int = 0
    nbytes: int = 0
    record_bytes: list[int] = field(default_factory=list)

    @property
    def keys_touched(self) -> int:  # type: ignore[override]
        return len(self.keys) + 1

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        values = []
        for key in self.keys:
            _, live = _stored_and_live(w, h, key)
            values.append(live.value if live is not None else b"")
        data = _bounded(bit_ops.bitop(self.op, values), self.max_value_bytes)
        old, _ = _stored_and_live(w, h, self.dest)
        if data:
            self.record_bytes = [_write(w, h, self.dest, old, data, 0, keep_flags=False)]
        elif old is not None:
            _delete(w, h, self.dest, old)
            self.record_bytes = [len(self.dest)]
        self.nbytes = sum(self.record_bytes)
        return len(data)


@dataclass(slots=True, eq=False)
class MoveOp(_WritesDest):
    """COPY (``keep_source``) and RENAME / RENAMENX, in one transaction: the record's
    value, expiry and client flags go to ``dest``.

    Returns 1 / 0 for COPY and RENAMENX (0: ``dest`` exists and may not be
    replaced), True for RENAME; a missing source raises Redis's ``no such key``
    for RENAME(NX) and answers 0 for COPY."""

    bucket: BucketHandle
    source: bytes
    dest: bytes
    keep_source: bool = False
    replace: bool = True
    reply_hint: int = 0
    nbytes: int = 0
    record_bytes: list[int] = field(default_factory=list)

    @property
    def keys_touched(self) -> int:  # type: ignore[override]
        return 2

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        src_old, src = _stored_and_live(w, h, self.source)
        if src is None:
            if self.keep_source:
                return 0
            raise errors.KeyNotFound("no such key")
        if self.source == self.dest:  # (COPY refuses this before it is built)
            return True if self.replace else 0
        dst_old, dst = _stored_and_live(w, h, self.dest)
        if dst is not None and not self.replace:
            return 0
        # The value, its expiry and its client flags, as one record.
        _put(w, h, self.dest, dst_old, src.value, src.expiry_ms, src.flags)
        self.record_bytes = [len(self.dest) + records.HEADER_BYTES + len(src.value)]
        if not self.keep_source:
            assert src_old is not None
            _delete(w, h, self.source, src_old)
            self.record_bytes.append(len(self.source))
        self.nbytes = sum(self.record_bytes)
        return 1 if self.keep_source or not self.replace else True


@dataclass(slots=True, eq=False)
class BitFieldOp(ValueRewriteOp):
    """BITFIELD (GET alone writes nothing): each operation's answer, the value grown to
    the farthest bit written (even when OVERFLOW FAIL refused the write, as
    Redis grows it first). ``fops`` are :data:`bit_ops.FieldOp` as lists."""

    fops: list[list[Any]]
    reply_hint: int = 0
    nbytes: int = 0

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        reach = max((((o[3] + o[2] - 1) >> 3) + 1 for o in self.fops if o[0] != "get"), default=0)
        return len(self.key) + records.HEADER_BYTES + max(reach, self.reply_hint) + self.reply_hint

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        fops = [
            (str(o[0]), bool(o[1]), int(o[2]), int(o[3]), int(o[4]), str(o[5])) for o in self.fops
        ]
        data, out = bit_ops.bitfield(current or b"", fops)
        written = data != current and any(o[0] != "get" for o in fops)
        return data if written else None, out
