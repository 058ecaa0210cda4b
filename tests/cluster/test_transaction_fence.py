"""A transaction over several slots while one of them is fenced (its switch to
another node, ``cluster/rebalance.py``): all of it or none of it. SlotMoving is
retryable — the client sends the transaction again — so a transaction whose
other steps had applied would apply them twice (an INCR counted twice)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tenantkv import errors
from tenantkv.cluster.slots import key_slot
from tenantkv.storage import string_ops
from tenantkv.storage.ops import SetOp
from tenantkv.storage.slot_ops import MoveControlOp
from tenantkv.storage.transaction_ops import ReadStep, TransactionOp
from tests.unit.test_storage import Store

FENCED = b"{moving}:k"
OTHER = b"{staying}:k"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db", slot_index=True)
    try:
        yield s
    finally:
        s.close()


def test_a_transaction_touching_a_fenced_slot_applies_nothing(store: Store) -> None:
    assert key_slot(FENCED) != key_slot(OTHER)
    b = store.bucket("b")
    store.ok(SetOp(b, OTHER, b"1"))
    cas_before = store.engine.cas_counter
    store.ok(MoveControlOp("track", [key_slot(FENCED)]))
    store.ok(MoveControlOp("fence", [key_slot(FENCED)]))
    steps = [
        string_ops.IncrByOp(b, OTHER, 1),  # before the fenced write: must not stay
        ReadStep("resp:get", {"key": OTHER}),
        SetOp(b, FENCED, b"v"),
        SetOp(b, b"{staying}:new", b"v"),  # after it
    ]
    with pytest.raises(errors.SlotMoving):
        store.ok(TransactionOp(b, steps, [], 1 << 20))
    assert store.get(OTHER).value == b"1"
    assert store.get(b"{staying}:new") is None and store.get(FENCED) is None
    # The batch around it commits as usual, with CAS values the engine still
    # counts from where the aborted steps left them (none of theirs is kept).
    (_, refused), (done, error) = store.run(
        TransactionOp(b, steps, [], 1 << 20), SetOp(b, b"{staying}:after", b"v")
    )
    assert isinstance(refused, errors.SlotMoving) and error is None
    assert done["cas"] > cas_before and store.get(b"{staying}:after") is not None
    assert store.get(OTHER).value == b"1"
    # Once the switch is over (here: the move given up), the same transaction runs.
    store.ok(MoveControlOp("end", [key_slot(FENCED)]))
    out = store.ok(TransactionOp(b, steps, [], 1 << 20))
    assert [o[1] for o in out] == [None] * 4
    assert store.get(OTHER).value == b"2" and store.get(FENCED).value == b"v"


def test_a_fence_elsewhere_leaves_a_transaction_as_it_was(store: Store) -> None:
    b = store.bucket("b")
    store.ok(MoveControlOp("track", [key_slot(FENCED)]))
    store.ok(MoveControlOp("fence", [key_slot(FENCED)]))
    steps = [
        SetOp(b, OTHER, b"x"),
        string_ops.IncrByOp(b, OTHER, 1),  # a runtime error: that step's only
        SetOp(b, b"{staying}:2", b"y"),
    ]
    out = store.ok(TransactionOp(b, steps, [], 1 << 20))
    assert [o[1] is None for o in out] == [True, False, True]
    assert store.get(OTHER).value == b"x" and store.get(b"{staying}:2").value == b"y"
