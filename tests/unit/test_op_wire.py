"""Writes as plain data (``serve --workers N``): every kind survives the trip to the
node's writer, applies there as it would have locally, and brings back its
result and metering fields."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from tenantkv import errors
from tenantkv.admission import rate_share
from tenantkv.storage import ops, string_ops, value_ops
from tenantkv.storage.engine import BucketHandle, Engine
from tenantkv.storage.op_wire import (
    KINDS,
    Refused,
    RemoteBatchOp,
    apply_outcome,
    apply_run_outcome,
    failed_outcome,
    item_from_wire,
    item_to_wire,
    op_from_wire,
    op_to_wire,
)
from tenantkv.storage.ops import WriteContext
from tenantkv.storage.string_ops import Expiry
from tenantkv.storage.transaction_ops import TransactionOp

H = BucketHandle("b", db=None)


def _samples() -> list[ops.WriteOp]:
    return [
        ops.SetOp(H, b"k", b"v", ttl=1.5, flags=7, cas=3, mode="add"),
        ops.DeleteOp(H, b"k", cas=9),
        ops.TouchOp(H, b"k", ttl=2),
        ops.CounterOp(H, b"n", 5, initial=1, ttl=0),
        ops.CreateBucketOp("nb", {"created_ms": 1, "throttle": {"reserved": 0}}),
        ops.DropBucketOp(H, {b"user:x": {"roles": {}}}),
        ops.PutSystemOp(
            b"user:x", {"a": 1}, expect="absent", on_present=errors.UserExists, what="user"
        ),
        ops.ExpireDueOp(limit=10),
        string_ops.StringSetOp(H, b"k", b"v", Expiry("relative", 1000), only="nx"),
        string_ops.MultiSetOp(H, [(b"a", b"1"), (b"b", b"2")], only_new=True),
        string_ops.MultiDeleteOp(H, [b"a", b"b"]),
        string_ops.GetDelOp(H, b"k"),
        string_ops.GetExOp(H, b"k", Expiry("absolute", 5)),
        string_ops.ExpireOp(H, b"k", Expiry("relative", 10), only=frozenset({"nx", "gt"})),
        string_ops.IncrByOp(H, b"n", -3),
        string_ops.AppendOp(H, b"k", b"more", max_value_bytes=100),
        string_ops.FlushOp(H),
        value_ops.SetRangeOp(H, b"k", 3, b"abc", max_value_bytes=100, reply_hint=5),
        value_ops.SetBitOp(H, b"k", 9, 1),
        value_ops.IncrByFloatOp(H, b"f", b"1.5"),
        value_ops.BitOpOp(H, "xor", b"d", [b"a", b"b"], max_value_bytes=100),
        value_ops.MoveOp(H, b"a", b"b", keep_source=True, replace=False),
        value_ops.BitFieldOp(H, b"k", [["incrby", True, 8, 0, 5, "sat"]]),
        TransactionOp(
            H, [], [["b", b"k", 7]], max_value_bytes=100
        ),  # (steps: test_transaction_ops)
    ]


def test_every_kind_is_covered_and_round_trips_through_msgpack() -> None:
    samples = _samples()
    assert {type(op).__name__ for op in samples} == set(KINDS)
    for op in samples:
        wire = msgpack.unpackb(msgpack.packb(op_to_wire(op)), strict_map_key=False)
        back = op_from_wire(wire, lambda name: BucketHandle(name, db=None))
        assert type(back) is type(op)
        for name in op.__dataclass_fields__:
            a, b = getattr(op, name), getattr(back, name)
            if isinstance(a, BucketHandle):
                assert (a.name, b.name) == ("b", "b")
            else:
                assert a == b, (type(op).__name__, name, a, b)


@pytest.mark.parametrize(
    "data",
    [None, [], ["SetOp"], ["NoSuchOp", []], ["SetOp", [1, 2]], "SetOp"],
)
def test_malformed_writes_are_refused_with_a_clear_error(data: object) -> None:
    with pytest.raises(ValueError):
        op_from_wire(data, lambda name: H)


def test_an_unknown_bucket_is_bucket_not_found() -> None:
    def bucket(name: str) -> BucketHandle:
        raise errors.BucketNotFound(f"bucket {name!r} does not exist")

    with pytest.raises(errors.BucketNotFound):
        op_from_wire(op_to_wire(ops.SetOp(H, b"k", b"v")), bucket)


def test_a_batch_applies_in_order_with_an_outcome_per_write(tmp_path: Path) -> None:
    eng = Engine(tmp_path / "data")
    try:
        with eng.env.begin(write=True) as txn:
            w = WriteContext(eng, txn, eng.now_ms())
            h = ops.CreateBucketOp("b", {"created_ms": 1}).apply(w)
        eng.buckets["b"] = h

        def send(op: ops.WriteOp) -> ops.WriteOp:
            return op_from_wire(
                msgpack.unpackb(msgpack.packb(op_to_wire(op))), lambda name: eng.bucket(name)
            )

        local = [
            ops.SetOp(h, b"k", b"v" * 5000),
            ops.SetOp(h, b"k", b"x", mode="add"),  # fails: exists
            string_ops.MultiSetOp(h, [(b"a", b"1"), (b"b", b"22")]),
        ]
        batch = RemoteBatchOp(
            [*(send(op) for op in local), Refused(errors.BadValue("could not decode"))]
        )
        with eng.env.begin(write=True) as txn:
            outcomes = batch.apply(WriteContext(eng, txn, eng.now_ms()))
        outcomes = msgpack.unpackb(msgpack.packb(outcomes))
        assert batch.op_count == 4
        r0, e0 = apply_outcome(local[0], outcomes[0])
        assert e0 is None and isinstance(r0, dict) and r0["cas"] > 0
        assert local[0].nbytes > 5000  # metering comes back
        _, e1 = apply_outcome(local[1], outcomes[1])
        assert isinstance(e1, errors.KeyExists)
        _, e2 = apply_outcome(local[2], outcomes[2])
        assert e2 is None and len(local[2].record_bytes) == 2
        assert outcomes[3][1]["codeName"] == "BadValue"
    finally:
        eng.close()


def _bucket_b(tmp_path: Path) -> tuple[Engine, BucketHandle]:
    eng = Engine(tmp_path / "data")
    with eng.env.begin(write=True) as txn:
        h = ops.CreateBucketOp("b", {"created_ms": 1}).apply(WriteContext(eng, txn, eng.now_ms()))
    eng.buckets["b"] = h
    return eng, h


def _trip(eng: Engine, local: ops.WriteOp) -> list[ops.WriteOp]:
    """``local`` to the node's writer and applied there in a batch; its outcomes back."""
    # (as the control channel reads it: a run's fields are maps by field index)
    wire = msgpack.unpackb(msgpack.packb(item_to_wire(local)), strict_map_key=False)
    batch = RemoteBatchOp([item_from_wire(wire, eng.bucket)])
    with eng.env.begin(write=True) as txn:
        outcomes = batch.apply(WriteContext(eng, txn, eng.now_ms()))
    assert batch.op_count == local.op_count
    return list(msgpack.unpackb(msgpack.packb(outcomes)))


def test_a_run_of_plain_sets_goes_as_one_item_and_answers_by_column(tmp_path: Path) -> None:
    eng, h = _bucket_b(tmp_path)
    try:
        local = ops.RunOp([ops.SetOp(h, b"k%d" % i, b"v" * i) for i in range(3)], 0)
        [outcome] = _trip(eng, local)
        _, errs, _, record_bytes = outcome
        assert errs is None and record_bytes is None  # nothing failed, no record lists
        got = apply_run_outcome(local, outcome)
        assert [r["cas"] for r in got] == [got[0]["cas"] + i for i in range(3)]  # in order
        assert [op.nbytes for op in local.ops] == [op.size_hint for op in local.ops]
        with eng.env.begin() as txn:
            assert txn.get(b"k2", db=h.db).endswith(b"vv")  # committed
    finally:
        eng.close()


def test_a_runs_failed_and_undecodable_writes_fail_in_their_places(tmp_path: Path) -> None:
    eng, h = _bucket_b(tmp_path)
    try:
        gone = BucketHandle("gone", db=None)
        local = ops.RunOp(
            [
                ops.SetOp(h, b"k", b"v"),
                ops.SetOp(h, b"k", b"x", mode="add"),  # fails: exists
                ops.SetOp(gone, b"k", b"v"),  # no such bucket on the writer's side
                string_ops.MultiSetOp(h, [(b"a", b"1"), (b"b", b"22")]),
            ],
            0,
        )
        [outcome] = _trip(eng, local)
        got = apply_run_outcome(local, outcome)
        assert isinstance(got[0], dict) and got[0]["cas"] > 0
        assert isinstance(got[1], errors.KeyExists)
        assert isinstance(got[2], errors.BucketNotFound)
        assert not isinstance(got[3], BaseException)
        assert len(local.ops[3].record_bytes) == 2  # metering comes back per write
        with pytest.raises(ValueError):
            apply_run_outcome(ops.RunOp(local.ops[:2], 0), outcome)  # not its outcome
    finally:
        eng.close()


def test_a_failed_transaction_fails_every_write_of_each_item() -> None:
    err = errors.StorageFull("disk full")
    run = ops.RunOp([ops.SetOp(H, b"a", b"v"), ops.SetOp(H, b"b", b"v")], 0)
    got = apply_run_outcome(run, failed_outcome(run, err))
    assert [type(e) for e in got] == [errors.StorageFull, errors.StorageFull]
    _, e = apply_outcome(ops.SetOp(H, b"a", b"v"), failed_outcome(ops.SetOp(H, b"a", b"v"), err))
    assert isinstance(e, errors.StorageFull)


def test_rate_shares_sum_to_one_and_follow_demand() -> None:
    assert rate_share.split(1000, {}) == {}
    assert rate_share.split(1000, {"0": 0, "1": 0}) == {"0": 0.5, "1": 0.5}
    for demands in (
        {"0": 5000.0, "1": 0.0},
        {"0": 5000.0, "1": 300.0},
        {"0": 200.0, "1": 300.0},
        {"0": 1.0, "1": 2.0, "2": 3.0, "3": 10_000.0},
    ):
        shares = rate_share.split(1000, demands)
        assert sum(shares.values()) == pytest.approx(1.0)
        floor = rate_share.MIN_SHARE / len(demands)
        assert all(s >= floor - 1e-12 for s in shares.values())
    busy = rate_share.split(1000, {"0": 5000.0, "1": 300.0})
    # The lighter worker gets what it asks for (with headroom), the other the rest.
    assert busy["1"] * 1000 == pytest.approx(300 * rate_share.HEADROOM)
    assert busy["0"] > busy["1"]


def _same_fields(a: ops.WriteOp, b: ops.WriteOp) -> None:
    assert type(b) is type(a)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, BucketHandle):
            assert x.name == y.name
        else:
            assert x == y, (type(a).__name__, name, x, y)


def test_a_run_of_every_kind_round_trips_by_field_segments() -> None:
    other = BucketHandle("c", db=None)
    sets = [
        ops.SetOp(H, b"k1", b"v1", ttl=2, flags=7),  # (then _samples(), a SetOp first)
        ops.SetOp(H, b"k2", b"v2", ttl=2.5, flags=7),  # a varying TTL, the same flags
        ops.SetOp(other, b"k3", b"v3", flags=7),  # another bucket: the bucket varies
    ]
    run = ops.RunOp([*sets, *_samples(), *sets], 0)
    wire = msgpack.unpackb(msgpack.packb(item_to_wire(run)), strict_map_key=False)
    segments = wire[1]
    assert [s[1] for s in segments[:2]] == [4, 1]  # consecutive writes of a kind together
    assert segments[0][3][3] == [2, 2.5, 0, 1.5]  # the TTLs as a column
    assert segments[-1][2][4] == 7 and 4 not in segments[-1][3]  # the same flags: once
    handles = {"b": H, "c": other}
    back = item_from_wire(wire, lambda name: handles[name])
    assert isinstance(back, ops.RunOp) and back.op_count == run.op_count
    for a, b in zip(run.ops, back.ops, strict=True):
        _same_fields(a, b)
    assert back.ops[2].bucket is other and back.ops[0].bucket is H


def test_a_run_decodes_each_write_apart_when_one_cannot_be() -> None:
    gone = BucketHandle("gone", db=None)
    run = ops.RunOp([ops.SetOp(H, b"a", b"1"), ops.SetOp(gone, b"b", b"2")], 0)
    wire = msgpack.unpackb(msgpack.packb(item_to_wire(run)), strict_map_key=False)

    def bucket(name: str) -> BucketHandle:
        if name != "b":
            raise errors.BucketNotFound(f"bucket {name!r} does not exist")
        return H

    first, second = item_from_wire(wire, bucket).ops  # type: ignore[attr-defined]
    assert type(first) is ops.SetOp and first.key == b"a"
    assert isinstance(second, Refused) and isinstance(second.error, errors.BucketNotFound)


@pytest.mark.parametrize(
    "segment",
    [None, [], ["NoSuchOp", 1, {}, {}], ["SetOp", 0, {}, {}], ["SetOp", 2, {0: "b"}, {}]],
)
def test_a_malformed_run_is_refused_with_a_clear_error(segment: object) -> None:
    run = item_from_wire(["run", [segment]], lambda name: H)
    assert isinstance(run, ops.RunOp)
    assert all(isinstance(op, Refused) for op in run.ops)
    assert all(isinstance(op.error, errors.BadValue) for op in run.ops)  # type: ignore[attr-defined]
