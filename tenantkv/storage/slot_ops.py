"""Writes on one cluster slot's keys, for all buckets (see :mod:`.slot_index`):
a slot dropped, records imported (a slot moving here), and the moving slots'
dirty sets and fences changed in order with every write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tenantkv import errors
from tenantkv.storage import records
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteContext, WriteOp, _delete, _stored
from tenantkv.storage.slot_index import SlotIndex, parse_entry, slot_prefix

#: Keys one DropSlotOp deletes: a slot bigger than this is dropped by several
#: ops (several commits), so that no one transaction grows without bound.
DROP_BATCH = 10_000


class DropSlotOp(WriteOp):
    """Delete up to :data:`DROP_BATCH` keys of ``slot`` (every bucket; a sequence:
    of each slot in turn), with their expiry and index entries. Returns how many
    keys went; the caller repeats while that is the batch."""

    exempt = True  # internal work (a slot moved away): never throttled

    def __init__(self, slot: int | Sequence[int]) -> None:
        self.slots = (slot,) if isinstance(slot, int) else tuple(slot)
        self.slot = self.slots[0]
        #: (bucket, key) of each record it removed: client-side caching tells their readers
        self.removed_keys: list[tuple[str, bytes]] = []

    def apply(self, w: WriteContext) -> Any:
        index = w.engine.slots
        if index is None:
            return 0
        index.bypass = True  # (a slot dropped here is not this node's: no fence applies)
        try:
            return self._drop(w, index)
        finally:
            index.bypass = False

    def _drop(self, w: WriteContext, index: SlotIndex) -> int:
        cur = w.txn.cursor(db=index.db)
        found: list[bytes] = []
        for slot in self.slots:
            for name in sorted(w.engine.buckets):  # (a dropped bucket's entries stay)
                prefix = slot_prefix(name, slot)
                if cur.set_range(prefix):
                    for item in cur.iternext(values=False):
                        raw = bytes(item)
                        if not raw.startswith(prefix) or len(found) >= DROP_BATCH:
                            break
                        found.append(raw)
        dropped = 0
        self.removed_keys = []  # (applied again if the transaction is retried)
        for raw in found:
            bucket, key = parse_entry(raw)
            h = w.engine.buckets[bucket]
            old = None if h.dropped else _stored(w, h, key)
            if old is not None:
                _delete(w, h, key, old)  # (the index entry with it)
                dropped += 1
                self.removed_keys.append((bucket, key))
            else:
                w.txn.delete(raw, db=index.db)  # stale: the key is gone
        self.keys_touched = max(1, dropped)
        return dropped


#: One imported record: (bucket, key, the record as stored — header and value —
#: or None: the key is gone, the bucket's incarnation on the node it comes from).
Imported = tuple[str, bytes, bytes | None, Any]


def incarnation(h: BucketHandle | None) -> Any:
    """Which bucket of a name this is: its ``created_ms``, the same on every node
    (cluster metadata carries it) and new when the name is dropped and created
    again (None: no such bucket)."""
    return None if h is None or h.dropped else h.props.get("created_ms")


class ImportOp(WriteOp):
    """Write records copied from a slot's previous node as they are (value, CAS,
    expiry, flags), or delete keys that went there. No charge and no fence: the
    slot is not served here until the map says so. This node's CAS counter is
    raised past every CAS imported, so that a later write of the key here gets
    a larger one (WATCH and CAS compare them)."""

    exempt = True

    def __init__(self, items: Sequence[Imported]) -> None:
        self.items = items
        self.size_hint = sum(len(k) + len(r or b"") for _, k, r, _ in items) + 64
        self.keys_touched = max(1, len(items))

    def apply(self, w: WriteContext) -> Any:
        index = w.engine.slots
        if index is None:
            raise errors.BadValue("this node keeps no slot index: it is in no cluster")
        index.bypass = True
        try:
            for bucket, key, raw, made in self.items:
                _import(w, bucket, key, raw, made)
        finally:
            index.bypass = False
        return len(self.items)


def _import(w: WriteContext, bucket: str, key: bytes, raw: bytes | None, made: Any) -> None:
    h = w.engine.buckets.get(bucket)
    # Made on another node a moment ago and not here yet, or dropped and made
    # again on one of the two nodes and not yet on the other (metadata follows
    # etcd): the page is refused and copied again once both hold the same
    # bucket, never skipped, and a dropped bucket's records never land in the
    # bucket made again under its name.
    if h is None or h.dropped:
        if raw is None and made is None:
            return  # a key gone from a bucket that neither node has: nothing to delete
        raise errors.NodeUnavailable(f"bucket {bucket!r} is not on this node yet")
    if incarnation(h) != made:
        raise errors.NodeUnavailable(
            f"bucket {bucket!r} here is not the one the records come from "
            "(dropped and created again): copied again once both nodes follow etcd"
        )
    old = _stored(w, h, key)
    rec = None if raw is None else records.decode(raw)
    if rec is None or (rec.expiry_ms and rec.expiry_ms <= w.now_ms):
        if old is not None:
            _delete(w, h, key, old)
        return
    eng = w.engine
    if rec.cas > eng.cas_counter:
        w.next_cas(rec.cas - eng.cas_counter)
    assert eng.slots is not None
    eng.slots.added(w.txn, h.name, key)
    w.txn.put(key, bytes(raw or b""), db=h.db)
    if old is not None and old.expiry_ms and old.expiry_ms != rec.expiry_ms:
        w.txn.delete(records.expiry_key(old.expiry_ms, h.name, key), db=eng.expiry)
    if rec.expiry_ms and (old is None or old.expiry_ms != rec.expiry_ms):
        w.txn.put(records.expiry_key(rec.expiry_ms, h.name, key), b"", db=eng.expiry)
        if not w.earliest_expiry_ms or rec.expiry_ms < w.earliest_expiry_ms:
            w.earliest_expiry_ms = rec.expiry_ms


class MoveControlOp(WriteOp):
    """Change the moving slots' state in order with every write (the writer runs
    it between two ops): ``track`` starts each slot's dirty set afresh (and lifts
    its fence), ``take`` removes up to ``limit`` keys from the slots' dirty sets
    (kept in :attr:`taken`: they are read once this op has committed, and so has
    every write noted before), ``fence`` makes the slots refuse writes, ``end``
    forgets them. Applied again if its transaction is retried: ``taken`` keeps
    what an aborted attempt took."""

    exempt = True

    def __init__(self, action: str, slots: Sequence[int], limit: int = 0) -> None:
        if action not in ("track", "take", "fence", "end"):
            raise ValueError(action)
        self.action, self.slots, self.limit = action, tuple(slots), limit
        self.taken: list[tuple[str, bytes]] = []
        #: (take) slots not tracked (this node restarted) or overflowed: copy again
        self.lost: list[int] = []
        #: (take) keys left in the dirty sets after this take
        self.left = 0

    def apply(self, w: WriteContext) -> Any:
        index = w.engine.slots
        if index is None:
            raise errors.BadValue("this node keeps no slot index: it is in no cluster")
        if self.action == "track":
            for slot in self.slots:
                index.dirty[slot] = set()
                index.overflowed.discard(slot)
                index.fenced.discard(slot)
        elif self.action == "fence":
            index.fenced.update(self.slots)
        elif self.action == "end":
            for slot in self.slots:
                index.dirty.pop(slot, None)
                index.overflowed.discard(slot)
                index.fenced.discard(slot)
        else:
            self._take(index)
        return None

    def _take(self, index: SlotIndex) -> None:
        self.lost = [s for s in self.slots if s not in index.dirty or s in index.overflowed]
        self.left = 0
        for slot in self.slots:
            keys = index.dirty.get(slot)
            if not keys or slot in self.lost:
                continue
            while keys and len(self.taken) < self.limit:
                self.taken.append(keys.pop())
            self.left += len(keys)
