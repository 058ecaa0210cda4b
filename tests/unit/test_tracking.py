"""The client-side caching table (tenantkv.server.tracking): who is told of which
change, once; BCAST prefixes; whole-bucket changes; the key bound; and the keys
each kind of write op reports."""

from __future__ import annotations

from typing import Any

from tenantkv.server.tracking import Tracker, TrackingTable, changes_of
from tenantkv.storage.ops import DeleteOp, DropBucketOp, ExpireDueOp, PutSystemOp, RunOp, SetOp
from tenantkv.storage.slot_ops import DropSlotOp
from tenantkv.storage.string_ops import FlushOp, MultiDeleteOp, MultiSetOp
from tenantkv.storage.transaction_ops import TransactionOp
from tenantkv.storage.value_ops import BitOpOp, MoveOp


def tracker(
    table: TrackingTable, conn_id: int, bucket: str = "b", **kw: Any
) -> tuple[Tracker, list[Any]]:
    got: list[Any] = []
    t = Tracker(table, conn_id, lambda: bucket, got.append, **kw)
    table.start(t, bucket)
    return t, got


def test_a_change_is_pushed_once_to_each_reader_then_forgotten() -> None:
    table = TrackingTable()
    a, got_a = tracker(table, 1)
    b, got_b = tracker(table, 2)
    table.remember(a, "b", [b"k", b"j"])
    table.remember(b, "b", [b"k"])
    assert table.count == 2
    table.changed([("b", [b"k", b"x"])])
    assert got_a == [[b"k"]] and got_b == [[b"k"]]
    table.changed([("b", [b"k"])])  # not read again: nothing
    assert got_a == [[b"k"]] and table.count == 1


def test_other_buckets_and_stopped_trackers_are_not_told() -> None:
    table = TrackingTable()
    a, got = tracker(table, 1)
    table.remember(a, "b", [b"k"])
    table.changed([("other", [b"k"])])
    assert got == []
    table.stop(1)
    table.changed([("b", [b"k"])])
    assert got == [] and table.count == 0


def test_a_whole_bucket_change_pushes_null_to_its_trackers() -> None:
    table = TrackingTable()
    a, got_a = tracker(table, 1)
    b, got_b = tracker(table, 2, "c")
    table.remember(a, "b", [b"k", b"j"])
    table.remember(b, "c", [b"k"])
    table.changed([("b", None)])
    assert got_a == [None] and got_b == []
    assert table.count == 1


def test_bcast_pushes_matching_prefixes_without_reads() -> None:
    table = TrackingTable()
    _, got = tracker(table, 1, bcast=True, prefixes=[b"user:", b"cart:"])
    _, got_all = tracker(table, 2, bcast=True)
    table.changed([("b", [b"user:1", b"misc", b"cart:9"])])
    assert got == [[b"user:1", b"cart:9"]]
    assert got_all == [[b"user:1", b"misc", b"cart:9"]]
    table.changed([("other", [b"user:1"])])
    assert len(got) == 1


def test_optin_and_optout_follow_client_caching() -> None:
    table = TrackingTable()
    t, got_in = tracker(table, 1, optin=True)
    t.command([b"GET", b"a"], (1, 1, 1))
    t.caching = True
    t.command([b"GET", b"b"], (1, 1, 1))
    t.command([b"GET", b"c"], (1, 1, 1))  # (yes held for one command only)
    table.changed([("b", [b"a", b"b", b"c"])])
    assert got_in == [[b"b"]]
    out, got = tracker(table, 2, optout=True)
    out.caching = False
    out.command([b"MGET", b"x", b"y"], (1, -1, 1))
    out.command([b"MGET", b"x", b"y"], (1, -1, 1))
    table.changed([("b", [b"x", b"y"])])
    assert got == [[b"x", b"y"]]


def test_the_table_is_bounded_by_evicting_with_an_invalidation() -> None:
    table = TrackingTable(max_keys=3)
    a, got = tracker(table, 1)
    table.remember(a, "b", [b"k1", b"k2", b"k3"])
    table.remember(a, "b", [b"k4"])
    assert table.count == 3 and table.evicted == 1
    assert got == [[b"k1"]]  # the oldest went, its reader told first
    table.remember(a, "b", [b"k4"])  # (already held: no eviction)
    assert table.evicted == 1


def test_a_tenant_reading_keys_by_the_million_evicts_its_own() -> None:
    """Eviction takes from the bucket that holds the most keys: another tenant's
    few cached keys are not pushed out by one tenant's flood of reads."""
    table = TrackingTable(max_keys=4)
    victim, victim_got = tracker(table, 1)
    flood, flood_got = tracker(table, 2)
    table.remember(victim, "quiet", [b"precious"])
    table.remember(flood, "loud", [b"f1", b"f2", b"f3"])
    table.remember(flood, "loud", [b"f4", b"f5", b"f6"])
    assert victim_got == [] and flood_got == [[b"f1"], [b"f2"], [b"f3"]]
    assert table.count == 4


def test_start_and_stop_report_activity_once() -> None:
    table = TrackingTable()
    seen: list[bool] = []
    table.on_active = seen.append
    tracker(table, 1)
    tracker(table, 2)
    table.stop(1)
    table.stop(2)
    table.stop(2)
    assert seen == [True, False]


def test_changes_of_every_kind_of_write() -> None:
    """Each write reports the keys it changed (read from the op as built); an
    emptied or dropped bucket reports None (everything); system records none."""
    h: Any = _Handle("b")
    ops: list[Any] = [
        SetOp(h, b"s", b"v"),
        DeleteOp(h, b"d"),
        MultiSetOp(h, [(b"m1", b"1"), (b"m2", b"2")]),
        MultiDeleteOp(h, [b"x1", b"x2"]),
        MoveOp(h, b"src", b"dst"),
        BitOpOp(h, "and", b"dest", [b"in1", b"in2"], 100),
        FlushOp(h),
        DropBucketOp(h, {}),
        PutSystemOp(b"user:x", None),
        RunOp([SetOp(h, b"r1", b"v"), SetOp(h, b"r2", b"v")], 0),
        TransactionOp(h, [SetOp(h, b"t1", b"v")]),
    ]
    expired = ExpireDueOp()
    expired.removed_keys = [("b", b"e1"), ("c", b"e2")]
    ops.append(expired)
    moved_away = DropSlotOp(7)
    moved_away.removed_keys = [("b", b"slot7")]
    ops.append(moved_away)
    assert list(changes_of(ops)) == [
        ("b", [b"s"]),
        ("b", [b"d"]),
        ("b", [b"m1", b"m2"]),
        ("b", [b"x1", b"x2"]),
        ("b", [b"src", b"dst"]),
        ("b", [b"dest"]),
        ("b", None),
        ("b", None),
        ("b", [b"r1"]),
        ("b", [b"r2"]),
        ("b", [b"t1"]),
        ("b", [b"e1"]),
        ("c", [b"e2"]),
        ("b", [b"slot7"]),
    ]


class _Handle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dropped = False
