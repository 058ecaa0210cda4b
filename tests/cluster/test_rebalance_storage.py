"""A moving slot in storage: the dirty set the writer keeps, the fence it
enforces, and records imported as they were stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tenantkv import errors
from tenantkv.cluster.slots import key_slot
from tenantkv.storage import records
from tenantkv.storage.ops import CreateBucketOp, DeleteOp, ExpireDueOp, SetOp
from tenantkv.storage.slot_index import MAX_DIRTY_KEYS
from tenantkv.storage.slot_ops import DropSlotOp, ImportOp, MoveControlOp
from tests.unit.test_storage import Store

SLOT = key_slot(b"{t}")


def tagged(i: int) -> bytes:
    return b"{t}:%d" % i  # all in SLOT


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db", slot_index=True)
    yield s
    s.close()


def test_writes_and_deletes_of_a_tracked_slot_are_noted_and_taken(store: Store) -> None:
    b = store.bucket("b")
    store.ok(SetOp(b, tagged(0), b"before"))  # (before tracking: the copy takes it)
    store.ok(MoveControlOp("track", [SLOT]))
    store.ok(SetOp(b, tagged(1), b"v"))
    store.ok(DeleteOp(b, tagged(0)))
    store.ok(SetOp(b, b"other slot", b"v"))
    take = MoveControlOp("take", [SLOT], limit=1)
    store.ok(take)
    assert len(take.taken) == 1 and take.left == 1 and take.lost == []
    again = MoveControlOp("take", [SLOT], limit=10)
    store.ok(again)
    assert set(take.taken + again.taken) == {("b", tagged(0)), ("b", tagged(1))}
    assert again.left == 0
    # A slot never tracked (the source restarted) is lost: its copy starts over.
    lost = MoveControlOp("take", [SLOT + 1], limit=10)
    store.ok(lost)
    assert lost.lost == [SLOT + 1]
    store.ok(MoveControlOp("end", [SLOT]))
    gone = MoveControlOp("take", [SLOT], limit=10)
    store.ok(gone)
    assert gone.lost == [SLOT]


def test_a_fenced_slot_refuses_writes_in_the_writer_and_internal_ops_pass(
    store: Store,
) -> None:
    b = store.bucket("b")
    store.ok(SetOp(b, tagged(1), b"v", ttl=1))
    store.ok(MoveControlOp("track", [SLOT]))
    store.ok(MoveControlOp("fence", [SLOT]))
    with pytest.raises(errors.SlotMoving):
        store.ok(SetOp(b, tagged(2), b"v"))
    with pytest.raises(errors.SlotMoving):
        store.ok(DeleteOp(b, tagged(1)))
    assert store.get(tagged(2)) is None and store.get(tagged(1)) is not None  # nothing ran
    store.ok(SetOp(b, b"other", b"v"))  # other slots write on
    store.clock.ms += 5_000
    assert store.ok(ExpireDueOp())["removed"] == 1  # expiry goes on (the copy expires too)
    assert store.ok(DropSlotOp(SLOT)) == 0  # (internal: passes the fence)
    store.ok(MoveControlOp("track", [SLOT]))  # (a new copy lifts the fence)
    store.ok(SetOp(b, tagged(2), b"v"))


def test_a_dirty_set_that_overflows_makes_its_slot_lost(store: Store) -> None:
    store.bucket("b")
    store.ok(MoveControlOp("track", [SLOT]))
    index = store.engine.slots
    assert index is not None
    index.dirty[SLOT].update(("b", b"x%d" % i) for i in range(MAX_DIRTY_KEYS))
    store.ok(SetOp(store.engine.buckets["b"], tagged(1), b"v"))
    take = MoveControlOp("take", [SLOT], limit=10)
    store.ok(take)
    assert take.lost == [SLOT] and take.taken == []


def test_imported_records_keep_cas_expiry_and_flags_and_raise_the_cas_counter(
    store: Store,
) -> None:
    b = store.bucket("b")
    store.ok(SetOp(b, tagged(9), b"stale"))
    cas = store.engine.cas_counter + 1_000_000
    expiry = store.clock.ms + 60_000
    raw = records.encode(b"moved", cas, expiry, 7)
    expired = records.encode(b"old", cas + 1, store.clock.ms - 1, 0)
    assert (
        store.ok(
            ImportOp(
                [
                    ("b", tagged(1), raw, None),
                    ("b", tagged(2), expired, None),
                    ("b", tagged(9), None, None),
                ]
            )
        )
        == 3
    )
    rec = store.get(tagged(1))
    assert rec is not None and (rec.value, rec.cas, rec.expiry_ms, rec.flags) == (
        b"moved",
        cas,
        expiry,
        7,
    )
    assert store.get(tagged(2)) is None and store.get(tagged(9)) is None
    store.ok(SetOp(b, tagged(3), b"later"))
    later = store.get(tagged(3))
    assert later is not None and later.cas > cas + 1  # a later write gets a larger CAS
    assert store.engine.slots is not None and store.engine.slots.count(SLOT) == 2
    # A bucket this node has not got yet: refused (copied again), never skipped.
    with pytest.raises(errors.NodeUnavailable):
        store.ok(ImportOp([("nope", tagged(1), raw, None)]))
    # A key gone from a bucket neither node has: nothing to do.
    assert store.ok(ImportOp([("nope", tagged(1), None, None)])) == 1


def test_a_dropped_buckets_records_never_land_in_the_bucket_made_again(store: Store) -> None:
    # The target holds bucket "b" as made again (created_ms 2) while a page of
    # the source's "b" of before (created_ms 1) is in flight, or the other way
    # round: refused until both nodes hold the same one, then copied again.
    store.engine.buckets["b"] = store.ok(CreateBucketOp("b", {"created_ms": 2}))
    raw = records.encode(b"of the dropped bucket", 5, 0, 0)
    for made in (1, None):
        for item in (("b", tagged(1), raw, made), ("b", tagged(2), None, made)):
            with pytest.raises(errors.NodeUnavailable, match="dropped and created again"):
                store.ok(ImportOp([item]))
    assert store.get(tagged(1)) is None
    store.ok(SetOp(store.engine.bucket("b"), tagged(2), b"of the bucket made again"))
    assert store.ok(ImportOp([("b", tagged(1), raw, 2), ("b", tagged(2), None, 2)])) == 2
    rec = store.get(tagged(1))
    assert rec is not None and rec.value == b"of the dropped bucket"
    assert store.get(tagged(2)) is None
