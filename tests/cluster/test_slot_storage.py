"""Storage by slot: the index follows every write path, and one slot's keys are
listed, counted and dropped for all buckets without touching the others."""

from __future__ import annotations

from pathlib import Path

from tenantkv.cluster.slots import key_slot
from tenantkv.storage.ops import DeleteOp, DropBucketOp, ExpireDueOp, RunOp, SetOp
from tenantkv.storage.slot_ops import DropSlotOp
from tenantkv.storage.string_ops import FlushOp, MultiSetOp, StringSetOp
from tests.unit.test_storage import Store

SLOT = key_slot(b"{t}")


def tagged(i: int) -> bytes:
    return b"{t}:%d" % i  # all in SLOT


def test_the_index_follows_every_write_and_drop_takes_one_slot(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", slot_index=True)
    try:
        a, b = store.bucket("a"), store.bucket("b")
        for i in range(5):
            store.ok(SetOp(a, tagged(i), b"v"))
        store.ok(StringSetOp(b, tagged(100), b"plain redis set"))  # the upsert fast path
        store.ok(MultiSetOp(b, [(tagged(101), b"x"), (b"other", b"y")]))
        store.ok(SetOp(a, b"elsewhere", b"v"))
        index = store.engine.slots
        assert index is not None
        assert index.count(SLOT) == 7
        assert (("a", tagged(0)) in index.keys(SLOT)) and (("b", tagged(101)) in index.keys(SLOT))
        # Paged through, in order, nothing twice.
        page1 = index.keys(SLOT, limit=4)
        page2 = index.keys(SLOT, limit=4, after=page1[-1])
        assert len(page1) == 4 and len(page2) == 3 and not set(page1) & set(page2)
        assert page1 + page2 == sorted(page1 + page2)  # by bucket, then key
        assert index.count(SLOT, bucket="b") == 2  # one tenant's keys only

        store.ok(DeleteOp(a, tagged(0)))
        store.ok(SetOp(a, tagged(1), b"v", ttl=1))
        store.clock.ms += 5_000
        assert store.ok(ExpireDueOp())["removed"] == 1
        assert index.count(SLOT) == 5

        assert store.ok(DropSlotOp(SLOT)) == 5
        assert index.count(SLOT) == 0
        assert store.get(tagged(2), "a") is None and store.get(tagged(100), "b") is None
        # The other slots' keys are untouched.
        assert store.get(b"elsewhere", "a") is not None and store.get(b"other", "b") is not None
        assert index.count(key_slot(b"other")) == 1
    finally:
        store.close()


def test_dropped_buckets_and_flushes_leave_nothing_visible(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", slot_index=True)
    try:
        a = store.bucket("a")
        store.ok(SetOp(a, tagged(1), b"v"))
        b = store.bucket("b")
        store.ok(SetOp(b, tagged(2), b"v"))
        store.ok(FlushOp(b))
        a.dropped = True
        store.ok(DropBucketOp(a))
        del store.engine.buckets["a"]
        index = store.engine.slots
        assert index is not None and index.keys(SLOT) == []
        assert store.ok(DropSlotOp(SLOT)) == 0
    finally:
        store.close()


def test_built_when_joining_dropped_when_leaving(tmp_path: Path) -> None:
    path = tmp_path / "db"
    single = Store(path)
    try:
        a = single.bucket("a")
        for i in range(3):
            single.ok(SetOp(a, tagged(i), b"v"))
        assert single.engine.slots is None
    finally:
        single.close()
    joined = Store(path, slot_index=True)  # the data directory joins a cluster
    try:
        assert joined.engine.slots is not None and joined.engine.slots.count(SLOT) == 3
        joined.ok(SetOp(joined.engine.bucket("a"), tagged(9), b"v"))
    finally:
        joined.close()
    left = Store(path)  # a single node again: the index is dropped
    try:
        assert left.engine.slots is None
        left.ok(SetOp(left.engine.bucket("a"), tagged(10), b"v"))
    finally:
        left.close()
    again = Store(path, slot_index=True)  # rebuilt in full: the key written meanwhile too
    try:
        assert again.engine.slots is not None and again.engine.slots.count(SLOT) == 5
    finally:
        again.close()


def test_a_run_of_plain_sets_is_indexed_key_by_key(tmp_path: Path) -> None:
    """The bulk write of a run of plain sets (one putmulti) is off in cluster mode:
    every key of the run reaches the slot index, from either door's SET."""
    store = Store(tmp_path / "db", slot_index=True)
    try:
        a = store.bucket("a")
        for door_set in (SetOp, StringSetOp):  # a run of one door's plain sets
            run = [door_set(a, tagged(i), b"v") for i in range(3)]
            store.ok(RunOp(list(run), sum(op.size_hint for op in run)))
            assert store.engine.slots is not None and store.engine.slots.count(SLOT) == 3
    finally:
        store.close()
