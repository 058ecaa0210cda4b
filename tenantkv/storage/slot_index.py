"""The slot index: every key of every bucket by its cluster slot, so that one
slot's keys can be listed, counted and dropped without scanning the others.

One LMDB database, ``__slots__``, keyed ``bucket + NUL + slot (2 bytes,
big-endian) + key`` with empty values: one bucket's keys of a slot are one
range (a tenant's ``CLUSTER COUNTKEYSINSLOT`` reads its own keys only), and a
slot's keys for all buckets are one range per bucket. Bucket names hold no
NUL (``validate_bucket_name``).

It is kept only on a node in a cluster (``Engine(slot_index=True)``). The
write path pays, per key written, a CRC16 (~0.2 µs) and one more B-tree put
in the same transaction (the entry is put again on an overwrite: the fast
path of a plain SET does not look the old record up), and a delete when a key
goes; a single node pays an attribute test. A marker in the system database
says the index is complete: a data directory that served without it is
indexed in full when it joins a cluster, and a node leaving cluster mode drops
the index (its writes would no longer keep it).

A bucket's drop leaves its entries behind: readers skip entries whose bucket
or key is gone, and dropping the slot removes them.

A slot moving away (tenantkv.cluster.rebalance) is also watched here, since
every write of a key passes through :meth:`SlotIndex.added` or
:meth:`SlotIndex.deleting` in the writer's transaction: the keys written or
deleted since its copy began are noted (a *dirty set* per slot, bounded by
:data:`MAX_DIRTY_KEYS`; beyond it the slot is marked overflowed and its copy
starts again), and a *fenced* slot refuses writes with ``SlotMoving`` before
the op changes anything. Both are changed only by ops on the writer thread
(:class:`~tenantkv.storage.slot_ops.MoveControlOp`), so a change is ordered
with every write: writes before it are committed when it returns, writes after
it see it.
"""

from __future__ import annotations

import logging
from typing import Any

from tenantkv import errors
from tenantkv.cluster.slots import key_slot

log = logging.getLogger("tenantkv.storage")

SLOTS_DB = b"__slots__"
#: In the system database while the index covers every key.
COMPLETE_KEY = b"meta:slot_index"
#: Keys a moving slot's dirty set holds at most; past it the slot's copy starts
#: over (a slot written faster than it can be copied).
MAX_DIRTY_KEYS = 100_000


def entry(bucket: str, key: bytes) -> bytes:
    return slot_prefix(bucket, key_slot(key)) + key


def slot_prefix(bucket: str, slot: int) -> bytes:
    """The first bytes of every entry of ``bucket``'s keys in ``slot``."""
    return bucket.encode() + b"\0" + slot.to_bytes(2, "big")


def parse_entry(raw: bytes) -> tuple[str, bytes]:
    """(bucket, key) of an index entry."""
    bucket, _, rest = raw.partition(b"\0")
    return bucket.decode(), rest[2:]


class SlotIndex:
    def __init__(self, engine: Any, db: Any) -> None:
        #: the Engine (not imported: the engine imports this module)
        self.engine = engine
        self.db = db
        #: moving slot -> (bucket, key) written or deleted since its copy began
        self.dirty: dict[int, set[tuple[str, bytes]]] = {}
        #: moving slots whose dirty set overflowed (their copy must start over)
        self.overflowed: set[int] = set()
        #: slots that refuse writes (a move's switch)
        self.fenced: set[int] = set()
        #: internal ops (a slot dropped or imported) pass a fence
        self.bypass = False

    @classmethod
    def open(cls, engine: Any, *, enabled: bool) -> SlotIndex | None:
        """The index when ``enabled`` (built first if incomplete), else None (and an
        index left by a cluster run is dropped)."""
        with engine.env.begin() as txn:
            complete = txn.get(COMPLETE_KEY, db=engine.system) is not None
        if not enabled and not complete:
            return None  # (no write transaction: a worker process must not open one)
        with engine.env.begin(write=True) as txn:
            if not enabled:
                if complete:
                    txn.drop(engine.env.open_db(SLOTS_DB, txn=txn), delete=True)
                    txn.delete(COMPLETE_KEY, db=engine.system)
                    log.info("slot index dropped: not in a cluster")
                return None
            db = engine.env.open_db(SLOTS_DB, txn=txn)
            if not complete:
                txn.drop(db, delete=False)
                n = 0
                for h in engine.buckets.values():
                    for key in txn.cursor(db=h.db).iternext(values=False):
                        txn.put(entry(h.name, key), b"", db=db)
                        n += 1
                txn.put(COMPLETE_KEY, b"1", db=engine.system)
                log.info("slot index built: %d keys", n)
        return cls(engine, db)

    # -- the write path (in the writer's transaction) -----------------------------------

    def added(self, txn: Any, bucket: str, key: bytes) -> None:
        """A key written (call it before the write: a fenced slot raises)."""
        slot = key_slot(key)
        if self.dirty or self.fenced:
            self._moving(slot, bucket, key)
        txn.put(slot_prefix(bucket, slot) + key, b"", db=self.db)

    def deleting(self, txn: Any, bucket: str, key: bytes) -> None:
        """A key deleted by a write (before the delete: a fenced slot raises)."""
        if self.dirty or self.fenced:
            self._moving(key_slot(key), bucket, key)
        self.removed(txn, bucket, key)

    def removed(self, txn: Any, bucket: str, key: bytes) -> None:
        """A key gone (expired: its copy, if moving, expires too)."""
        txn.delete(entry(bucket, key), db=self.db)

    def _moving(self, slot: int, bucket: str, key: bytes) -> None:
        if slot in self.fenced and not self.bypass:
            raise errors.SlotMoving(
                f"slot {slot} is switching to another node; try again in a moment",
                retry_after_ms=50,
            )
        keys = self.dirty.get(slot)
        if keys is not None and slot not in self.overflowed:
            keys.add((bucket, key))
            if len(keys) > MAX_DIRTY_KEYS:
                self.overflowed.add(slot)
                keys.clear()

    # -- reads ----------------------------------------------------------------------------

    def keys(
        self,
        slot: int,
        *,
        limit: int = 1000,
        after: tuple[str, bytes] | None = None,
        bucket: str | None = None,
    ) -> list[tuple[str, bytes]]:
        """Up to ``limit`` (bucket, key) pairs of ``slot`` — of every bucket, or of
        ``bucket`` — by bucket name then key, after the pair ``after`` (a cursor:
        the last pair given). Entries whose bucket or key is gone are skipped."""
        out: list[tuple[str, bytes]] = []
        engine = self.engine
        names = sorted(engine.buckets) if bucket is None else [bucket]
        if after is not None:
            names = [n for n in names if n >= after[0]]
        with engine.txn_lock, engine.env.begin() as txn:
            cur = txn.cursor(db=self.db)
            for name in names:
                h = engine.buckets.get(name)
                if h is None or h.dropped:
                    continue
                prefix = slot_prefix(name, slot)
                start = entry(*after) if after is not None and after[0] == name else prefix
                if not cur.set_range(start):
                    break
                for raw in cur.iternext(values=False):
                    if not raw.startswith(prefix) or len(out) >= limit:
                        break
                    key = raw[len(prefix) :]
                    if (name, key) != after and txn.get(key, db=h.db) is not None:
                        out.append((name, key))
                if len(out) >= limit:
                    break
        return out

    def count(self, slot: int, *, bucket: str | None = None) -> int:
        """How many keys ``slot`` holds (every bucket's, or ``bucket``'s): reads
        that slot's entries only."""
        n = 0
        after: tuple[str, bytes] | None = None
        while batch := self.keys(slot, after=after, bucket=bucket):
            n += len(batch)
            after = batch[-1]
        return n
