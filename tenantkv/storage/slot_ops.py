"""Writes on one cluster slot's keys, for all buckets (see :mod:`.slot_index`)."""

from __future__ import annotations

from typing import Any

from tenantkv.storage.ops import WriteContext, WriteOp, _delete, _stored
from tenantkv.storage.slot_index import parse_entry, slot_prefix

#: Keys one DropSlotOp deletes: a slot bigger than this is dropped by several
#: ops (several commits), so that no one transaction grows without bound.
DROP_BATCH = 10_000


class DropSlotOp(WriteOp):
    """Delete up to :data:`DROP_BATCH` keys of ``slot`` (every bucket), with their
    expiry and index entries. Returns how many keys went; the caller repeats
    while that is the batch."""

    exempt = True  # internal work (a slot moved away): never throttled

    def __init__(self, slot: int) -> None:
        self.slot = slot
        #: (bucket, key) of each record it removed: client-side caching tells their readers
        self.removed_keys: list[tuple[str, bytes]] = []

    def apply(self, w: WriteContext) -> Any:
        index = w.engine.slots
        if index is None:
            return 0
        cur = w.txn.cursor(db=index.db)
        found: list[bytes] = []
        for name in sorted(w.engine.buckets):  # (a dropped bucket's entries stay: skipped)
            prefix = slot_prefix(name, self.slot)
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
