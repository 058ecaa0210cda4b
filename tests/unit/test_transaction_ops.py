"""A transaction as one write operation (storage/transaction_ops.py): its steps
applied in order in one write transaction, reads seeing the earlier writes,
watched keys checked first, a runtime error confined to its step; and the same
through the wire form a worker sends to the node's writer (``--workers N``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tenantkv import errors
from tenantkv.server import transaction_reads
from tenantkv.storage import ops, string_ops
from tenantkv.storage.engine import BucketHandle, Engine
from tenantkv.storage.op_wire import RemoteBatchOp, apply_outcome, op_from_wire, op_to_wire
from tenantkv.storage.ops import WriteContext
from tenantkv.storage.transaction_ops import ReadStep, TransactionOp, read_handler


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Engine]:
    e = Engine(tmp_path / "data")
    with e.env.begin(write=True) as txn:
        h = ops.CreateBucketOp("b", {"created_ms": 1}).apply(WriteContext(e, txn, e.now_ms()))
    e.buckets["b"] = h
    try:
        yield e
    finally:
        e.close()


def apply(eng: Engine, op: ops.WriteOp) -> Any:
    with eng.env.begin(write=True) as txn:
        return op.apply(WriteContext(eng, txn, eng.now_ms()))


def test_steps_apply_in_order_and_reads_see_earlier_writes(eng: Engine) -> None:
    h = eng.bucket("b")
    apply(eng, ops.SetOp(h, b"text", b"abc"))
    steps: list[Any] = [
        ops.SetOp(h, b"k", b"1"),
        string_ops.IncrByOp(h, b"k", 1),
        ReadStep("resp:get", {"key": b"k"}),
        string_ops.IncrByOp(h, b"text", 1),  # a runtime error: that step's only
        ReadStep("msgpack:mget", {"keys": [b"k", b"none"]}),
        ReadStep("resp:exists", {"keys": [b"k", b"text", b"none"]}),
    ]
    out = apply(eng, TransactionOp(h, steps, [], 1 << 20))
    assert [o[1] is None for o in out] == [True, True, True, False, True, True]
    assert out[2][0]["value"] == b"2" and out[2][4]  # read sizes metered
    assert errors.from_wire(out[3][1]).errmsg.startswith("value is not an integer")
    assert out[4][0][0]["value"] == b"2" and out[4][0][1] is None and out[4][5] == 2
    assert out[5][0] == 2
    assert eng.get(h, b"k").value == b"2"


def test_a_changed_watched_key_applies_nothing(eng: Engine) -> None:
    h = eng.bucket("b")
    cas = apply(eng, ops.SetOp(h, b"w", b"1"))["cas"]
    txn = TransactionOp(h, [ops.SetOp(h, b"x", b"1")], [["b", b"w", cas], ["b", b"gone", 0]])
    assert apply(eng, txn) is not None and eng.get(h, b"x") is not None
    apply(eng, ops.SetOp(h, b"w", b"2"))
    txn = TransactionOp(h, [ops.SetOp(h, b"y", b"1")], [["b", b"w", cas]])
    assert apply(eng, txn) is None and eng.get(h, b"y") is None
    txn = TransactionOp(h, [ops.SetOp(h, b"y", b"1")], [["b", b"gone", 5]])
    assert apply(eng, txn) is None


def test_the_wire_form_round_trips_and_applies_as_locally(eng: Engine) -> None:
    h = eng.bucket("b")
    local = TransactionOp(
        h,
        [ops.SetOp(h, b"k", b"v" * 5000), ReadStep("resp:strlen", {"key": b"k"})],
        [["b", b"k", 0]],
        1 << 20,
    )
    wire = msgpack.unpackb(msgpack.packb(op_to_wire(local)))
    remote = op_from_wire(wire, eng.bucket)
    assert isinstance(remote, TransactionOp) and isinstance(remote.steps[1], ReadStep)
    outcomes = apply(eng, RemoteBatchOp([remote]))
    result, error = apply_outcome(local, msgpack.unpackb(msgpack.packb(outcomes[0])))
    assert error is None and result[1][0] == 5000 and result[0][2] > 5000


@pytest.mark.parametrize(
    "steps",
    [
        "x",
        [["ReadStep", ["resp:no-such-read", {}]]],
        [["TransactionOp", [["b"], [], [], 0, 0]]],
        [["NoSuchOp", []]],
    ],
)
def test_malformed_steps_are_refused(eng: Engine, steps: Any) -> None:
    with pytest.raises(ValueError):
        op_from_wire(["TransactionOp", ["b", steps, [], 0, 0]], eng.bucket)


def test_every_read_command_of_both_doors_may_be_queued() -> None:
    transaction_reads.register()
    assert read_handler("resp:get") and read_handler("msgpack:get")
    with pytest.raises(ValueError):
        read_handler("resp:set")  # a write is an op, never a read step


def test_an_unexpected_failure_of_a_read_fails_its_step_only(eng: Engine) -> None:
    h = BucketHandle("b", eng.bucket("b").db)
    out = apply(eng, TransactionOp(h, [ReadStep("resp:get", {"key": 5})], []))
    assert errors.from_wire(out[0][1]).code_name in ("InternalError", "BadValue")


def test_reads_past_the_reply_bound_fail_and_the_writes_still_apply(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenantkv.storage import transaction_ops

    monkeypatch.setattr(transaction_ops, "MAX_READ_BYTES", 25_000)
    h = eng.bucket("b")
    steps: list[Any] = [ops.SetOp(h, b"big", b"x" * 10_000)]
    steps += [ReadStep("resp:get", {"key": b"big"}) for _ in range(3)]
    steps.append(ops.SetOp(h, b"after", b"1"))
    out = apply(eng, TransactionOp(h, steps, []))
    assert [o[1] is None for o in out] == [True, True, True, False, True]
    assert "more than 25000 bytes" in errors.from_wire(out[3][1]).errmsg
    assert eng.get(h, b"after") is not None


def test_a_watched_key_that_expired_fails_even_before_it_is_reclaimed(tmp_path: Path) -> None:
    """Before the expiry pager removes an expired record, it is still stored: a key
    watched while absent and since set with a TTL that ran out, or watched while
    live and since expired, fails the watch (Redis since 6.0.9); an expired record
    watched as it is, and left alone, passes."""
    now = [1_000_000]
    eng = Engine(tmp_path / "data", now_ms=lambda: now[0])
    try:
        with eng.env.begin(write=True) as txn:
            w = WriteContext(eng, txn, eng.now_ms())
            eng.buckets["b"] = ops.CreateBucketOp("b", {"created_ms": 1}).apply(w)
        h = eng.bucket("b")

        def watch_holds(key: bytes, token: int) -> bool:
            return apply(eng, TransactionOp(h, [], [["b", key, token]])) is not None

        apply(eng, ops.SetOp(h, b"created", b"v", ttl=0.001))  # absent when watched
        live = apply(eng, ops.SetOp(h, b"live", b"v", ttl=1))["cas"]
        now[0] += 5_000  # both expired, neither reclaimed
        assert not watch_holds(b"created", 0)
        assert not watch_holds(b"live", live)
        assert watch_holds(b"live", -live)  # watched once expired: unchanged since
    finally:
        eng.close()
