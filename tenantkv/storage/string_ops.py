"""Write operations with Redis's string semantics, for the RESP front door.

They are applied by the group-commit writer like every other
:class:`~tenantkv.storage.ops.WriteOp` (validated before anything is written;
acknowledged once durable), so a Redis ``SET`` shares commits with MessagePack
``set``\\ s. Error messages are Redis's own words (the RESP layer puts ``ERR``
in front), so clients that match on them keep working.

Expiry is absolute wall-clock milliseconds, as stored in every record; an
:class:`Expiry` says how a command changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tenantkv import errors
from tenantkv.storage import records
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import (
    INT64_MAX,
    INT64_MIN,
    KeyOp,
    WriteContext,
    WriteOp,
    _check_bucket,
    _delete,
    _put,
    _stored,
    _stored_and_live,
    parse_int64,
    upsert,
)
from tenantkv.storage.records import Record

NOT_AN_INTEGER = "value is not an integer or out of range"


@dataclass(frozen=True, slots=True)
class Expiry:
    """How a write changes a key's expiry: ``clear`` it (a plain SET), ``keep`` it
    (KEEPTTL, INCR, APPEND), set it ``ms`` from now (``relative``: EX, PX) or at
    ``ms`` since the epoch (``absolute``: EXAT, PXAT)."""

    mode: Literal["clear", "keep", "relative", "absolute"] = "clear"
    ms: int = 0

    def at(self, now_ms: int, old: Record | None) -> int:
        """The new ``expiry_ms`` (0: none)."""
        if self.mode == "keep":
            return old.expiry_ms if old is not None else 0
        if self.mode == "relative":
            return now_ms + self.ms
        if self.mode == "absolute":
            return self.ms
        return 0


CLEAR = Expiry()
KEEP = Expiry("keep")


def _remove(w: WriteContext, h: BucketHandle, key: bytes) -> Record | None:
    """Delete the key's record (an expired one too); returns it if it was live."""
    old, live = _stored_and_live(w, h, key)
    if old is not None:
        _delete(w, h, key, old)
    return live


def _write(
    w: WriteContext,
    h: BucketHandle,
    key: bytes,
    old: Record | None,
    value: bytes,
    expiry_ms: int,
    *,
    keep_flags: bool = True,
) -> int:
    """Put ``value`` (an expiry already past deletes the key, as Redis does);
    returns the bytes written, for metering. A changed value keeps the record's
    client flags (set over MessagePack) unless it replaces the record whole."""
    if expiry_ms and expiry_ms <= w.now_ms:
        if old is not None:
            _delete(w, h, key, old)
        return len(key)
    flags = old.flags if keep_flags and old is not None else 0
    _put(w, h, key, old, value, expiry_ms, flags)
    return len(key) + records.HEADER_BYTES + len(value)


class ValueRewriteOp(KeyOp):
    """Base of the ops that rewrite one key's value, its expiry and flags kept
    (INCR, APPEND, SETRANGE, SETBIT, INCRBYFLOAT, BITFIELD): ``apply`` reads the
    live value (None: no key), asks :meth:`rewrite` for the new value and the
    answer, and writes the new value unless it is None."""

    __slots__ = ()

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        """(the new value or None to write nothing, the answer); raises to refuse."""
        raise NotImplementedError

    def apply(self, w: WriteContext) -> Any:
        h, old, live = self.read(w)
        data, answer = self.rewrite(None if live is None else live.value)
        if data is not None:
            self.nbytes = _write(w, h, self.key, old, data, KEEP.at(w.now_ms, live))
        return answer


@dataclass(slots=True, eq=False)
class StringSetOp(KeyOp):
    """SET with NX / XX, an expiry and GET; SETNX, SETEX, PSETEX and GETSET are its
    spellings. Returns ``(written, old value or None)``."""

    value: bytes
    expiry: Expiry = CLEAR
    only: Literal["", "nx", "xx"] = ""
    nbytes: int = 0
    #: the answer carries the old value (GET, GETSET); else it is not copied
    get: bool = False
    reply_hint: int = 0

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return len(self.key) + len(self.value) + records.HEADER_BYTES + self.reply_hint

    def plain_flags(self) -> int | None:
        # A plain SET: the record's client flags are 0, as ``apply`` writes them.
        return 0 if not self.only and not self.get and self.expiry.mode == "clear" else None

    def plain_result(self, cas: int) -> Any:
        return True, None

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        if not self.only and self.expiry.mode != "keep":
            expiry = self.expiry.at(w.now_ms, None)
            if not expiry or expiry > w.now_ms:
                # A plain SET (maybe with EX/PX/EXAT/PXAT): no condition on the old
                # record, so one B-tree operation writes it and returns the old one.
                _, old_raw = upsert(w, h, self.key, self.value, expiry, 0)
                self.nbytes = len(self.key) + records.HEADER_BYTES + len(self.value)
                if old_raw is None or not self.get:
                    return True, None
                old_expiry = records.HEADER.unpack_from(old_raw)[1]
                live = not old_expiry or old_expiry > w.now_ms
                return True, bytes(old_raw[records.HEADER_BYTES :]) if live else None
        old, live = _stored_and_live(w, h, self.key)
        previous = live.value if live is not None and self.get else None
        if (self.only == "nx" and live is not None) or (self.only == "xx" and live is None):
            return False, previous
        expiry = self.expiry.at(w.now_ms, live)
        self.nbytes = _write(w, h, self.key, old, self.value, expiry, keep_flags=False)
        return True, previous


@dataclass(slots=True, eq=False)
class MultiSetOp(WriteOp):
    """MSET (and MSETNX with ``only_new``: nothing is written if any key exists),
    all keys in one transaction. Returns whether it wrote."""

    bucket: BucketHandle
    pairs: list[tuple[bytes, bytes]]
    only_new: bool = False
    nbytes: int = 0
    record_bytes: list[int] = field(default_factory=list)

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return sum(len(k) + len(v) + records.HEADER_BYTES for k, v in self.pairs)

    @property
    def keys_touched(self) -> int:  # type: ignore[override]
        return len(self.pairs)

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        olds = [_stored_and_live(w, h, k) for k, _ in self.pairs]
        if self.only_new and any(live is not None for _, live in olds):
            return False
        written: dict[bytes, int] = {}
        for (key, value), (old, _) in zip(self.pairs, olds, strict=True):
            if key in written:  # a key given twice: the last value wins, as in Redis
                old = _stored(w, h, key)
            written[key] = _write(w, h, key, old, value, 0, keep_flags=False)
        self.record_bytes = list(written.values())
        self.nbytes = sum(self.record_bytes)
        return True


@dataclass(slots=True, eq=False)
class MultiDeleteOp(WriteOp):
    """DEL / UNLINK: how many of the keys existed (and are now gone)."""

    bucket: BucketHandle
    keys: list[bytes]
    nbytes: int = 0
    record_bytes: list[int] = field(default_factory=list)

    @property
    def keys_touched(self) -> int:  # type: ignore[override]
        return len(self.keys)

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        deleted = 0
        for key in self.keys:
            if _remove(w, h, key) is not None:
                deleted += 1
                self.record_bytes.append(len(key))  # 1 WU per key deleted, as DELETE
        self.nbytes = sum(self.record_bytes)
        return deleted


class _AnswersValue(KeyOp):
    """An op on ``key`` whose answer is the value it read (GETDEL, GETEX): held as
    the write is (``reply_hint``)."""

    __slots__ = ()

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return len(self.key) + records.HEADER_BYTES + self.reply_hint


@dataclass(slots=True, eq=False)
class GetDelOp(_AnswersValue):
    """GETDEL: the value, deleted; None if there was none."""

    nbytes: int = 0
    reply_hint: int = 0

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        live = _remove(w, h, self.key)
        if live is None:
            return None
        self.nbytes = len(self.key)
        return live.value


@dataclass(slots=True, eq=False)
class GetExOp(_AnswersValue):
    """GETEX with an option: the value, its expiry changed (``clear``: PERSIST)."""

    expiry: Expiry
    nbytes: int = 0
    reply_hint: int = 0

    def apply(self, w: WriteContext) -> Any:
        h, old, live = self.read(w)
        if live is None:
            return None
        self.nbytes = _write(w, h, self.key, old, live.value, self.expiry.at(w.now_ms, live))
        return live.value


@dataclass(slots=True, eq=False)
class ExpireOp(KeyOp):
    """EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (with NX / XX / GT / LT) and PERSIST
    (``expiry`` clear). Returns 1 if the expiry was changed, else 0."""

    expiry: Expiry
    #: the conditions given (``nx``, ``xx``, ``gt``, ``lt``); all must hold
    only: frozenset[str] = frozenset()
    nbytes: int = 0

    def apply(self, w: WriteContext) -> Any:
        h, old, live = self.read(w)
        if live is None:
            return 0
        new = self.expiry.at(w.now_ms, live)
        current = live.expiry_ms
        if self.expiry.mode == "clear":
            if not current:
                return 0
        else:
            # A key without an expiry counts as an infinite one for GT and LT.
            only = self.only
            if ("nx" in only and current) or ("xx" in only and not current):
                return 0
            if "gt" in only and (not current or new <= current):
                return 0
            if "lt" in only and current and new >= current:
                return 0
        self.nbytes = _write(w, h, self.key, old, live.value, new)
        return 1


@dataclass(slots=True, eq=False)
class IncrByOp(ValueRewriteOp):
    """INCR, INCRBY, DECR, DECRBY: a missing key counts as 0; the expiry is kept."""

    delta: int
    nbytes: int = 0

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        number = 0
        if current is not None:
            parsed = parse_int64(current)
            if parsed is None:
                raise errors.NotANumber(NOT_AN_INTEGER)
            number = parsed
        value = number + self.delta
        if not INT64_MIN <= value <= INT64_MAX:
            raise errors.BadValue("increment or decrement would overflow")
        return str(value).encode(), value


@dataclass(slots=True, eq=False)
class AppendOp(ValueRewriteOp):
    """APPEND: the length of the value after appending (a missing key starts empty)."""

    value: bytes
    max_value_bytes: int
    nbytes: int = 0

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return len(self.key) + len(self.value) + records.HEADER_BYTES

    def rewrite(self, current: bytes | None) -> tuple[bytes | None, Any]:
        data = (current or b"") + self.value
        if len(data) > self.max_value_bytes:
            raise errors.ValueTooLarge("string exceeds maximum allowed size")
        return data, len(data)


@dataclass(slots=True, eq=False)
class FlushOp(WriteOp):
    """FLUSHDB: every key of one bucket, deleted in one transaction."""

    bucket: BucketHandle
    nbytes: int = 0

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        _check_bucket(h)
        with w.txn.cursor(db=h.db) as cur:
            rows = [(bytes(k), records.decode(bytes(v))) for k, v in cur]
        for key, rec in rows:
            _delete(w, h, key, rec)
            self.nbytes += len(key)
        return True
