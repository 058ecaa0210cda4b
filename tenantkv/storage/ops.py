"""Write operations, applied by the group-commit writer inside its transaction.

Each op validates everything before it writes, so one that raises leaves the
shared batch transaction untouched; its error goes to its own caller only.
``nbytes`` after ``apply`` is what the op wrote (key + record), for metering.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

import lmdb
import msgpack

from tenantkv import errors
from tenantkv.storage import records
from tenantkv.storage.engine import BUCKET_DB_PREFIX, BucketHandle, Engine
from tenantkv.storage.records import Record

_HEADER_BYTES = records.HEADER_BYTES

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: A stored integer as Redis reads one (string2ll): 0, or an optional minus and
#: ASCII digits without a leading zero; no plus sign, spaces or underscores
#: (Python's int() accepts all three).
_INT64_RE = re.compile(rb"0|-?[1-9][0-9]{0,18}")


def parse_int64(data: bytes) -> int | None:
    """The signed 64-bit integer ``data`` spells exactly, or None."""
    if not _INT64_RE.fullmatch(data):
        return None
    value = int(data)
    return value if INT64_MIN <= value <= INT64_MAX else None


class WriteContext:
    """What an op sees while the writer applies it."""

    __slots__ = ("_expiry_index_empty", "earliest_expiry_ms", "engine", "now_ms", "txn")

    def __init__(self, engine: Engine, txn: lmdb.Transaction, now_ms: int) -> None:
        self.engine = engine
        self.txn = txn
        self.now_ms = now_ms
        #: the earliest expiry this batch wrote (0: none): the pager's wake-up hint
        self.earliest_expiry_ms = 0
        #: whether the expiry index was empty when the batch began (None: not asked)
        self._expiry_index_empty: bool | None = None

    def expiry_index_empty(self) -> bool:
        """No key of any bucket has an expiry, this batch's writes included: asked
        of LMDB once per batch (the index's entry count), then kept up to date by
        the batch's own expiries (``earliest_expiry_ms``)."""
        if self.earliest_expiry_ms:
            return False
        empty = self._expiry_index_empty
        if empty is None:
            empty = self._expiry_index_empty = not self.txn.stat(self.engine.expiry)["entries"]
        return empty

    def next_cas(self, n: int = 1) -> int:
        """The next CAS value; with ``n``, the first of the next ``n`` (consecutive)."""
        eng = self.engine
        if eng.cas_counter + n > eng.cas_ceiling:
            eng.reserve_cas_block(self.txn, n)
        first = eng.cas_counter + 1
        eng.cas_counter += n
        return first

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        """What runs inside applies all or nothing: in a nested LMDB transaction,
        aborted if it raises — and with it what this process counted meanwhile
        (the CAS block, this batch's expiry hints), so the batch's other writes
        go on as if it had never run."""
        eng, parent = self.engine, self.txn
        saved = (eng.cas_counter, eng.cas_ceiling, self._expiry_index_empty)
        earliest = self.earliest_expiry_ms
        self.txn = eng.env.begin(write=True, parent=parent)
        try:
            yield
        except BaseException:
            self.txn.abort()
            eng.cas_counter, eng.cas_ceiling, self._expiry_index_empty = saved
            self.earliest_expiry_ms = earliest
            raise
        else:
            self.txn.commit()
        finally:
            self.txn = parent


class WriteOp:
    """Base: subclasses implement ``apply``; ``exempt`` marks internal/admin work."""

    exempt: bool = False
    #: commits a change other worker processes must reload (users, buckets,
    #: throttle properties, parameters: see tenantkv.server.shared_state)
    shared_state: ClassVar[bool] = False
    nbytes: int = 0
    #: Rough size for batch bounding and map growth.
    size_hint: int = 64
    #: Keys the op acts on, and (multi-key ops) the bytes of each record it wrote:
    #: metering and the throttle's floor count per key, as for single-key ops.
    keys_touched: int = 1
    record_bytes: tuple[int, ...] | list[int] = ()
    #: writes this queued item carries (a worker's message of writes: many)
    op_count: int = 1
    #: Bytes of a stored value the op's answer carries (GETDEL, GETEX, SET ... GET),
    #: read from the stored record when the op is built: in ``size_hint``, so the
    #: answer is held as a write in flight is, and charged as read units.
    reply_hint: int = 0

    def apply(self, w: WriteContext) -> Any:
        raise NotImplementedError

    def plain_flags(self) -> int | None:
        """The client flags of the record this op writes if it is a plain set (an
        upsert of ``key`` to ``value`` with no expiry, no condition and no answer
        read from the old record), which :func:`_plain_sets` may write in bulk; None
        when it is anything else."""
        return None

    def plain_result(self, cas: int) -> Any:
        """What ``apply`` returns for a plain set that wrote CAS ``cas``."""
        raise NotImplementedError


class RunOp(WriteOp):
    """A run of one connection's writes queued as one item (``server/write_run.py``):
    applied in order in the commit's transaction, each with its own outcome.

    One item instead of one per write: the writer takes, applies and hands back
    a run at once, and the event loop makes one queue entry and runs one
    callback for it. ``apply`` returns each write's result, or the
    :class:`~tenantkv.errors.TenantKVError` it raised, in the run's order (an
    error fails that write only, as it would alone).
    """

    __slots__ = ("op_count", "ops", "size_hint")

    def __init__(self, ops: list[WriteOp], size_hint: int) -> None:
        self.ops = ops
        self.size_hint = size_hint
        self.op_count = len(ops)

    def apply(self, w: WriteContext) -> list[Any]:
        plain = _plain_sets(w, self.ops)
        if plain is not None:
            return plain
        out: list[Any] = []
        for op in self.ops:
            try:
                out.append(op.apply(w))
            except errors.TenantKVError as exc:
                out.append(exc)
        return out


def _plain_sets(w: WriteContext, ops: list[WriteOp]) -> list[Any] | None:
    """Apply a run of plain sets (see :meth:`WriteOp.plain_flags`: a MessagePack
    ``set`` or a RESP ``SET`` without options) to one bucket, while no key has an
    expiry, as one ``putmulti``; None, having applied nothing, when the run is
    anything else or the node keeps a slot index (cluster mode: each key is
    indexed as it is written). What each would do alone — the next CAS value, a
    plain put — in one pass instead of the four calls each makes (``apply``,
    ``upsert``, ``next_cas``, the expiry check): the writer's Python per write
    holds the GIL the event loop needs, and one C call for the run releases it
    once instead of once per key."""
    first: Any = ops[0]
    h = getattr(first, "bucket", None)
    if h is None or h.dropped or w.engine.slots is not None:
        return None
    flags: list[int] = []
    for op in ops:
        f = op.plain_flags()
        if f is None or op.bucket is not h:  # type: ignore[attr-defined]
            return None
        flags.append(f)
    if not w.expiry_index_empty():
        return None
    sets = cast(list[Any], ops)
    first_cas = w.next_cas(len(sets))
    cas = range(first_cas, first_cas + len(sets))
    header = records.HEADER.pack  # (records.encode, inline)
    items = [
        (op.key, header(c, 0, f) + op.value) for op, c, f in zip(sets, cas, flags, strict=True)
    ]
    for op in sets:
        op.nbytes = op.size_hint
    with w.txn.cursor(h.db) as cursor:
        cursor.putmulti(items)
    return [op.plain_result(c) for op, c in zip(sets, cas, strict=True)]


def _stored(w: WriteContext, h: BucketHandle, key: bytes) -> Record | None:
    raw = w.txn.get(key, None, h.db)  # (key, default, db): positional is ~60 ns cheaper
    return None if raw is None else records.decode(raw)


def _stored_and_live(
    w: WriteContext, h: BucketHandle, key: bytes
) -> tuple[Record | None, Record | None]:
    """(stored, live): the record as stored (maybe expired) and as a reader sees it."""
    old = _stored(w, h, key)
    return old, (old if old is not None and old.live(w.now_ms) else None)


def _put(
    w: WriteContext,
    h: BucketHandle,
    key: bytes,
    old: Record | None,
    value: bytes,
    expiry_ms: int,
    flags: int,
) -> int:
    """Write a record and keep the expiry index in step; returns the new CAS."""
    if w.engine.slots is not None:  # cluster mode: the key by its slot (first: a fence)
        w.engine.slots.added(w.txn, h.name, key)
    cas = w.next_cas()
    raw = records.encode(value, cas, expiry_ms, flags)
    w.txn.put(key, raw, db=h.db)
    if old is not None and old.expiry_ms and old.expiry_ms != expiry_ms:
        w.txn.delete(records.expiry_key(old.expiry_ms, h.name, key), db=w.engine.expiry)
    if expiry_ms and (old is None or old.expiry_ms != expiry_ms):
        w.txn.put(records.expiry_key(expiry_ms, h.name, key), b"", db=w.engine.expiry)
        if not w.earliest_expiry_ms or expiry_ms < w.earliest_expiry_ms:
            w.earliest_expiry_ms = expiry_ms
    return cas


def upsert(
    w: WriteContext,
    h: BucketHandle,
    key: bytes,
    value: bytes,
    expiry_ms: int,
    flags: int,
    *,
    need_old: bool = True,
) -> tuple[int, bytes | memoryview | None]:
    """Put a record whatever was there: one B-tree operation that also returns the
    old record (``replace``), needed to keep the expiry index in step. Returns
    ``(cas, the old stored record or None)``; ``expiry_ms`` must be 0 or in the
    future. A caller that does not need the old record says ``need_old=False``:
    while no key has an expiry, a record without one is then a plain ``put``
    (~200 ns less than ``replace``, which looks the old record up), and the old
    record comes back as None."""
    cas = w.next_cas()
    record = records.encode(value, cas, expiry_ms, flags)
    if w.engine.slots is not None:  # cluster mode: the key by its slot
        w.engine.slots.added(w.txn, h.name, key)
    # Positional arguments: ~60 ns cheaper than db= (once per plain set).
    if not need_old and not expiry_ms and w.expiry_index_empty():
        w.txn.put(key, record, True, True, False, h.db)  # (dupdata, overwrite, append, db)
        return cas, None
    old_raw = w.txn.replace(key, record, h.db)
    if old_raw is not None:
        old_expiry = records.HEADER.unpack_from(old_raw)[1]
        if old_expiry and old_expiry != expiry_ms:
            w.txn.delete(records.expiry_key(old_expiry, h.name, key), db=w.engine.expiry)
        elif old_expiry == expiry_ms and expiry_ms:
            return cas, old_raw
    if expiry_ms:
        w.txn.put(records.expiry_key(expiry_ms, h.name, key), b"", db=w.engine.expiry)
        if not w.earliest_expiry_ms or expiry_ms < w.earliest_expiry_ms:
            w.earliest_expiry_ms = expiry_ms
    return cas, old_raw


#: Records deleted, per bucket, by this process's writer (an engine's): WATCH of
#: a key absent at the time records its bucket's count, and EXEC fails if it
#: moved (server/transaction.py) — a key created and deleted meanwhile leaves
#: no other trace. In memory: watches do not outlive the writer's process.
DELETES: weakref.WeakKeyDictionary[Engine, dict[str, int]] = weakref.WeakKeyDictionary()


def count_delete(w: WriteContext, bucket: str) -> None:
    counts = DELETES.get(w.engine)
    if counts is None:
        counts = DELETES[w.engine] = {}
    counts[bucket] = counts.get(bucket, 0) + 1


def _delete(w: WriteContext, h: BucketHandle, key: bytes, old: Record) -> None:
    if w.engine.slots is not None:  # (first: a fenced slot refuses)
        w.engine.slots.deleting(w.txn, h.name, key)
    w.txn.delete(key, db=h.db)
    count_delete(w, h.name)
    if old.expiry_ms:
        w.txn.delete(records.expiry_key(old.expiry_ms, h.name, key), db=w.engine.expiry)


def _check_bucket(h: BucketHandle) -> None:
    if h.dropped:
        raise errors.BucketNotFound(f"bucket {h.name!r} was deleted")


def _expect(live: Record | None, cas: int = 0) -> Record:
    """The live record a write needs (with ``cas``: that version of it)."""
    if live is None:
        raise errors.KeyNotFound("key does not exist")
    if cas and live.cas != cas:
        raise errors.CasMismatch(f"cas is {live.cas}, not {cas}")
    return live


def expiry_from_ttl(now_ms: int, ttl: float) -> int:
    return 0 if not ttl else now_ms + int(ttl * 1000)


@dataclass(slots=True, eq=False)
class KeyOp(WriteOp):
    """Base of the ops on one key of one bucket: their first two fields (first on
    the wire too: a subclass's own fields follow them) and the read that opens
    their ``apply``."""

    bucket: BucketHandle
    key: bytes

    def read(self, w: WriteContext) -> tuple[BucketHandle, Record | None, Record | None]:
        """(the bucket, the key's record as stored, as a reader sees it: see
        :func:`_stored_and_live`); raises if the bucket was deleted."""
        h = self.bucket
        if h.dropped:
            _check_bucket(h)  # raises
        old, live = _stored_and_live(w, h, self.key)
        return h, old, live


@dataclass(slots=True, eq=False, init=False)
class SetOp(KeyOp):
    """``set`` (``add``, ``replace``, with ``cas``: only over that version): its CAS."""

    value: bytes
    ttl: float = 0
    flags: int = 0
    cas: int = 0
    mode: Literal["upsert", "add", "replace"] = "upsert"
    nbytes: int = 0
    #: the stored record's bytes, computed once: read for every write several
    #: times on its way (back-pressure, batch bounds, map growth)
    size_hint: int = field(init=False, default=0)

    def __init__(
        self,
        bucket: BucketHandle,
        key: bytes,
        value: bytes,
        ttl: float = 0,
        flags: int = 0,
        cas: int = 0,
        mode: Literal["upsert", "add", "replace"] = "upsert",
        nbytes: int = 0,
    ) -> None:
        # The dataclass's own __init__ plus __post_init__, in one frame: one is
        # built per SET, and this is half the bytecode of the generated pair.
        self.bucket = bucket
        self.key = key
        self.value = value
        self.ttl = ttl
        self.flags = flags
        self.cas = cas
        self.mode = mode
        self.nbytes = nbytes
        self.size_hint = len(key) + len(value) + _HEADER_BYTES

    def plain_flags(self) -> int | None:
        return None if self.ttl or self.cas or self.mode != "upsert" else self.flags

    def plain_result(self, cas: int) -> Any:
        return {"cas": cas}

    def apply(self, w: WriteContext) -> Any:
        h = self.bucket
        if h.dropped:
            _check_bucket(h)  # raises
        self.nbytes = self.size_hint
        if self.mode == "upsert" and not self.cas:
            # The hot case (a plain set): one B-tree operation, no read first.
            expiry_ms = expiry_from_ttl(w.now_ms, self.ttl) if self.ttl else 0
            cas = upsert(w, h, self.key, self.value, expiry_ms, self.flags, need_old=False)[0]
            return {"cas": cas}
        old, live = _stored_and_live(w, h, self.key)
        if self.mode == "add" and live is not None:
            raise errors.KeyExists("key already exists")
        if self.mode == "replace" or self.cas:
            _expect(live, self.cas)
        cas = _put(w, h, self.key, old, self.value, expiry_from_ttl(w.now_ms, self.ttl), self.flags)
        return {"cas": cas}


@dataclass(slots=True, eq=False)
class DeleteOp(KeyOp):
    """``delete`` (with ``cas``: only that version): whether a live record was deleted."""

    cas: int = 0
    nbytes: int = 0

    def apply(self, w: WriteContext) -> Any:
        h, old, live = self.read(w)
        if self.cas:
            _expect(live, self.cas)
        if old is not None:
            _delete(w, h, self.key, old)
        if live is None:
            return False
        self.nbytes = len(self.key)
        return True


@dataclass(slots=True, eq=False)
class TouchOp(KeyOp):
    """``touch``: a live record's expiry set anew (``ttl`` 0: none); its new CAS."""

    ttl: float = 0
    nbytes: int = 0

    def apply(self, w: WriteContext) -> Any:
        h, _, stored = self.read(w)
        live = _expect(stored)
        expiry = expiry_from_ttl(w.now_ms, self.ttl)
        cas = _put(w, h, self.key, live, live.value, expiry, live.flags)
        self.nbytes = len(self.key) + live.stored_bytes
        return {"cas": cas}


@dataclass(slots=True, eq=False)
class CounterOp(KeyOp):
    """``incr`` / ``decr``: a missing key starts at ``initial`` (refused if
    None) with ``ttl``; an existing one keeps its expiry and flags."""

    delta: int
    initial: int | None = None
    ttl: float = 0
    nbytes: int = 0

    def apply(self, w: WriteContext) -> Any:
        h, old, live = self.read(w)
        if live is None:
            if self.initial is None:
                raise errors.KeyNotFound("key does not exist and no initial value was given")
            value = self.initial
            expiry, flags = expiry_from_ttl(w.now_ms, self.ttl), 0
        else:
            current = parse_int64(live.value)
            if current is None:
                raise errors.NotANumber("value is not a decimal integer")
            value = current + self.delta
            expiry, flags = live.expiry_ms, live.flags
        if not INT64_MIN <= value <= INT64_MAX:
            raise errors.BadValue("counter would leave the signed 64-bit range")
        data = str(value).encode()
        cas = _put(w, h, self.key, old, data, expiry, flags)
        self.nbytes = len(self.key) + records.HEADER_BYTES + len(data)
        return {"value": value, "cas": cas}


# -- system (exempt) -----------------------------------------------------------


@dataclass(slots=True, eq=False)
class CreateBucketOp(WriteOp):
    name: str
    props: dict[str, Any]
    shared_state: ClassVar[bool] = True
    exempt: bool = True

    def apply(self, w: WriteContext) -> Any:
        key = b"bucket:" + self.name.encode()
        if w.txn.get(key, db=w.engine.system) is not None:
            raise errors.BucketExists(f"bucket {self.name!r} already exists")
        try:
            db = w.engine.env.open_db(BUCKET_DB_PREFIX + self.name.encode(), txn=w.txn)
        except lmdb.DbsFullError:
            raise errors.BadValue("the node holds its maximum number of buckets") from None
        w.txn.put(key, msgpack.packb(self.props), db=w.engine.system)
        return BucketHandle(self.name, db, dict(self.props))


@dataclass(slots=True, eq=False)
class DropBucketOp(WriteOp):
    """Drops the bucket's database; its expiry-index entries are left for the
    pager, which discards entries of buckets that no longer exist.

    ``system_puts`` are system records rewritten in the same transaction: the
    user records whose roles on the bucket are revoked, so a bucket re-created
    under the same name never inherits an old grant, even across a crash."""

    handle: BucketHandle
    system_puts: dict[bytes, Any] = field(default_factory=dict)
    shared_state: ClassVar[bool] = True
    exempt: bool = True

    def apply(self, w: WriteContext) -> Any:
        w.txn.drop(self.handle.db, delete=True)
        w.txn.delete(b"bucket:" + self.handle.name.encode(), db=w.engine.system)
        for key, value in self.system_puts.items():
            w.txn.put(key, msgpack.packb(value), db=w.engine.system)
        return True


@dataclass(slots=True, eq=False)
class PutSystemOp(WriteOp):
    """Put (or with ``value`` None, delete) a system record. ``expect`` guards
    against concurrent changes: "absent", "present" or None (don't care)."""

    key: bytes
    value: Any
    expect: Literal["absent", "present"] | None = None
    shared_state: ClassVar[bool] = True
    exempt: bool = True
    on_absent: type[errors.ServerError] = errors.InternalError
    on_present: type[errors.ServerError] = errors.InternalError
    what: str = ""

    def apply(self, w: WriteContext) -> Any:
        cur = w.txn.get(self.key, db=w.engine.system)
        if self.expect == "absent" and cur is not None:
            raise self.on_present(f"{self.what} already exists")
        if self.expect == "present" and cur is None:
            raise self.on_absent(f"{self.what} does not exist")
        if self.value is None:
            w.txn.delete(self.key, db=w.engine.system)
        else:
            w.txn.put(self.key, msgpack.packb(self.value), db=w.engine.system)
        return True


@dataclass(slots=True, eq=False)
class ExpireDueOp(WriteOp):
    """Reclaim up to ``limit`` expired records (the expiry pager's step)."""

    limit: int = 10_000
    exempt: bool = True
    removed: int = field(default=0)
    #: (bucket, key) of each record it removed: client-side caching tells their readers
    removed_keys: list[tuple[str, bytes]] = field(default_factory=list, init=False)

    def apply(self, w: WriteContext) -> Any:
        upto = records.expiry_prefix_upto(w.now_ms)
        cur = w.txn.cursor(db=w.engine.expiry)
        done: list[bytes] = []
        if cur.first():
            for raw_key, _ in cur:
                ikey = bytes(raw_key)
                if ikey >= upto or len(done) >= self.limit:
                    break
                done.append(ikey)
        removed = 0
        self.removed_keys = []  # (applied again if the transaction is retried)
        for ikey in done:
            expiry_ms, bname, key = records.parse_expiry_key(ikey)
            w.txn.delete(ikey, db=w.engine.expiry)
            h = w.engine.buckets.get(bname)
            if h is None or h.dropped:
                continue
            old = _stored(w, h, key)
            if old is not None and old.expiry_ms == expiry_ms:
                w.txn.delete(key, db=h.db)
                count_delete(w, h.name)
                if w.engine.slots is not None:
                    w.engine.slots.removed(w.txn, h.name, key)
                removed += 1
                self.removed_keys.append((bname, key))
        self.removed = removed
        return {"scanned": len(done), "removed": removed}
