"""Rebalance without I/O: which slots move where, and the map's move states."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import (
    ClusterMap,
    NodeInfo,
    Rebalance,
    SlotMove,
    SlotRange,
    next_map,
)
from tenantkv.cluster.membership import ClusterSettings, Member
from tenantkv.cluster.rebalance import (
    StaleMove,
    begin_move,
    commit_move,
    finish,
    reassign,
    request,
    switch_move,
)
from tenantkv.cluster.rebalance_plan import BATCH_SLOTS, done, next_batch, plan, slots_to_move
from tenantkv.cluster.routing import Router
from tenantkv.cluster.slots import SLOTS, key_slot


def live(*names: str) -> dict[str, NodeInfo]:
    return {n: NodeInfo(n, "127.0.0.1", 7000 + i) for i, n in enumerate(names)}


def three_then_four() -> ClusterMap:
    m = next_map(ClusterMap(), live("a", "b", "c"), min_nodes=3)
    assert m is not None
    joined = next_map(m, live("a", "b", "c", "d"), min_nodes=3)
    assert joined is not None and joined.slots_of("d") == 0
    return joined


def apply_all(m: ClusterMap, drain: tuple[str, ...] = ()) -> ClusterMap:
    """Move every planned batch (as the mover would, without the data)."""
    m = replace(m, rebalance=Rebalance(drain, 0, slots_to_move(m, drain)))
    while (batch := next_batch(m, drain)) is not None:
        started = begin_move(m, batch)
        assert started is not None and started.moves == (batch,)
        switched = switch_move(started, batch)
        assert switched is not None and switched.moves[0].phase == "switch"
        done = commit_move(switched, batch)
        assert done is not None and not done.moves
        m = done
    return m


def test_a_fourth_node_gets_an_even_share_from_the_other_three() -> None:
    m = three_then_four()
    moves = plan(m)
    assert sum(len(mv) for mv in moves) == SLOTS // 4  # 4096: only what must move
    assert {mv.target for mv in moves} == {"d"}
    assert {mv.source for mv in moves} == {"a", "b", "c"}
    after = apply_all(m)
    assert sorted(after.slots_of(n) for n in "abcd") == [4096] * 4
    assert after.assigned() == SLOTS
    # Few ranges each: the highest slots of each giver moved.
    assert all(len([r for r in after.ranges if r.node == n]) <= 3 for n in "abcd")
    assert plan(after) == []
    assert after.rebalance is not None and after.rebalance.moved == 4096


def test_batches_are_contiguous_and_bounded() -> None:
    m = three_then_four()
    batch = next_batch(m)
    assert batch is not None and len(batch) == BATCH_SLOTS
    assert all(m.owner(s) == batch.source for s in batch.slots())
    assert next_batch(m, limit=10) == SlotMove(batch.start, batch.start + 9, batch.source, "d")


def test_removing_a_node_moves_all_its_slots_to_the_others_evenly() -> None:
    m = next_map(ClusterMap(), live("a", "b", "c", "d"), min_nodes=4)
    assert m is not None
    asked = request(m, ("b",))
    assert asked is not None and asked.rebalance == Rebalance(("b",), 0, 4096)
    after = apply_all(m, ("b",))
    assert after.slots_of("b") == 0
    assert sorted(after.slots_of(n) for n in "acd") == [5461, 5461, 5462]
    gone = finish(after)
    assert gone is not None and "b" not in gone.nodes and gone.removed == ("b",)
    assert gone.rebalance is None
    # While it stays registered it stays out; once its key went it is forgotten.
    assert next_map(gone, live("a", "b", "c", "d"), 1) is None
    forgotten = next_map(gone, live("a", "c", "d"), 1)
    assert forgotten is not None and forgotten.removed == ()


def test_a_down_node_gives_nothing_and_cannot_be_removed() -> None:
    m = next_map(ClusterMap(), live("a", "b", "c"), min_nodes=3)
    assert m is not None
    down = next_map(m, live("a", "c"), 1)
    assert down is not None
    joined = next_map(down, live("a", "c", "d"), 1)
    assert joined is not None
    moves = plan(joined)
    assert all(mv.source != "b" and mv.target != "b" for mv in moves)
    # b keeps its share in the count: the rest waits for it (not done).
    assert sum(len(mv) for mv in moves) == 2 * (5461 - 4096) + 1
    after = apply_all(joined)
    assert after.slots_of("b") == 5461 and not done(after, ())
    assert slots_to_move(after) == 5461 - 4096
    back = next_map(after, live("a", "b", "c", "d"), 1)
    assert back is not None and done(apply_all(back), ())
    with pytest.raises(errors.BadValue, match="down"):
        request(joined, ("b",))
    with pytest.raises(errors.BadValue, match="no node"):
        request(joined, ("zz",))


def test_a_balanced_cluster_needs_no_rebalance() -> None:
    m = next_map(ClusterMap(), live("a", "b", "c"), min_nodes=3)
    assert m is not None
    assert plan(m) == [] and request(m, ()) is None


def test_the_map_round_trips_its_move_states() -> None:
    m = three_then_four()
    moving = replace(
        m,
        moves=(SlotMove(10, 20, "a", "d", "switch"),),
        rebalance=Rebalance(("c",), 5, 99),
        removed=("x",),
    )
    again = ClusterMap.decode(moving.encode())
    assert again == moving
    assert again.move_of(15) == moving.moves[0] and again.move_of(21) is None
    assert ClusterMap.decode(m.encode()).moves == ()  # (older maps: no move fields)
    progress = again.progress()
    assert progress == {
        "moved": 5,
        "total": 99,
        "drain": ["c"],
        "moving": [[10, 20, "a", "d", "switch"]],
    }


def test_a_move_is_one_at_a_time_and_stale_ones_are_refused() -> None:
    m = replace(three_then_four(), rebalance=Rebalance())
    batch = next_batch(m)
    assert batch is not None
    started = begin_move(m, batch)
    assert started is not None
    assert begin_move(started, batch) is None  # one move at a time
    other = SlotMove(0, 5, "a", "d")
    with pytest.raises(StaleMove):
        switch_move(started, other)
    with pytest.raises(StaleMove):
        commit_move(m, batch)


def test_reassign_merges_ranges() -> None:
    m = ClusterMap(1, (SlotRange(0, 9, "a"), SlotRange(10, 19, "b")), live("a", "b"))
    assert reassign(m, SlotMove(10, 14, "b", "a")) == (
        SlotRange(0, 14, "a"),
        SlotRange(15, 19, "b"),
    )


# -- the door's answers while a slot moves (routing, sans-IO) -------------------------


def moving_router(phase: str, *, target_owns: bool = True) -> tuple[Router, Router]:
    """Routers of the source "a" and the target "b" while slots 0-99 move a -> b."""
    ranges = (SlotRange(0, 8191, "a"), SlotRange(8192, 16383, "b"))
    if not target_owns:
        ranges = (SlotRange(0, 16383, "a"),)
    nodes = {n: NodeInfo(n, "10.0.0.1", 7207 + 10 * i, 7208 + 10 * i) for i, n in enumerate("ab")}
    m = ClusterMap(9, ranges, nodes, (SlotMove(0, 99, "a", "b", phase),))
    out = []
    for me in "ab":
        member = Member(Any, ClusterSettings(("http://e",), me), nodes[me])  # type: ignore[arg-type]
        member.map = m
        member.lease_deadline = trio.current_time() + 10
        out.append(Router(member))
    return out[0], out[1]


KEY = b"k126"  # slot 58: among the moving ones
assert key_slot(KEY) < 100


async def test_a_fenced_slot_refuses_writes_and_serves_reads() -> None:
    source, _ = moving_router("copy")
    assert source.refusal([KEY], resp=True, write=True) is None
    source.fenced.add(key_slot(KEY))
    refused = source.refusal([KEY], resp=True, write=True)
    assert isinstance(refused, errors.SlotMoving) and refused.has_label(errors.RETRYABLE)
    assert refused.redis_text().startswith("TRYAGAIN")
    assert source.refusal([KEY], resp=True, write=False) is None  # reads go on


async def test_a_switching_slot_says_tryagain_and_the_target_takes_asking() -> None:
    source, target = moving_router("switch")
    for resp in (True, False):  # (-TRYAGAIN, not -ASK: routing.py says why)
        refused = source.refusal([KEY], resp=resp, write=False)
        assert isinstance(refused, errors.SlotMoving), resp
    assert source.refusal([KEY], resp=True).redis_text().startswith("TRYAGAIN")  # type: ignore[union-attr]
    moved = target.refusal([KEY], resp=True)
    assert isinstance(moved, errors.NotMyPartition) and moved.redis_text().startswith("MOVED")
    assert target.refusal([KEY], resp=True, asking=True) is None
    # ASKING does nothing for a slot that is not switching to this node.
    assert isinstance(target.refusal([b"bar"], resp=True, asking=True), errors.NotMyPartition)
