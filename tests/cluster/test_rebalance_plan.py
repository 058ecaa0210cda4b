"""Rebalance without I/O: which slots move where, and the map's move states."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
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
from tenantkv.cluster.routing import HOLD_POLL_SECS, HOLD_SECS, Router
from tenantkv.cluster.slots import SLOTS, key_slot
from tenantkv.server.held import Held


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


# -- a request of a moving slot is held, then answered as the map says ---------------


class DoorStub:
    """What routing touches of an executor: its door, its user, its answers."""

    def __init__(self, *, resp: bool = True, in_multi: bool = False) -> None:
        kinds = {"set": "write", "get": "read", "incr": "write"}
        self.door = SimpleNamespace(
            protocol_name="resp" if resp else "msgpack",
            commands={name: SimpleNamespace(kind=kind) for name, kind in kinds.items()},
        )
        self.user = object()
        self.asking = False
        self.in_multi = in_multi
        self.answers: list[tuple[int, errors.ServerError]] = []
        self.refused_in_multi: list[str] = []

    def charge_floor(self, keys: int) -> None:
        pass

    def fail(self, msgid: int, method: str, exc: errors.ServerError, **kw: Any) -> None:
        self.answers.append((msgid, exc))

    def transaction_refused(self, method: str) -> None:
        self.refused_in_multi.append(method)


def one_routed(router: Router, ex: DoorStub, req: tuple[int, str, Any]) -> Any:
    (out,) = router.route(ex, iter([req]))
    return out


async def settle_in_background(nursery: trio.Nursery, held: Held, ex: DoorStub) -> list[Any]:
    box: list[Any] = []

    async def run() -> None:
        box.append(await held.settle(ex))  # type: ignore[arg-type]

    nursery.start_soon(run)
    await trio.sleep(0.2)
    assert box == [] and ex.answers == []  # still held: nothing answered yet
    return box


@pytest.mark.parametrize("resp", [True, False])
async def test_a_switching_slots_request_is_held_then_moved(
    resp: bool, autojump_clock: trio.testing.MockClock
) -> None:
    source, _ = moving_router("switch")
    ex = DoorStub(resp=resp)
    held = one_routed(source, ex, (1, "get", {"key": KEY}))
    assert isinstance(held, Held) and held[1] == "get"
    async with trio.open_nursery() as nursery:
        box = await settle_in_background(nursery, held, ex)
        member = source.member
        committed = commit_move(member.map, member.map.moves[0])
        assert committed is not None
        member.map, event = replace(committed, version=10), member.map_event
        member.map_event = trio.Event()
        event.set()  # (Member._take does this for a map from etcd)
    assert box == [None]
    ((msgid, exc),) = ex.answers
    assert msgid == 1 and isinstance(exc, errors.NotMyPartition)
    if resp:
        assert exc.redis_text() == f"MOVED {key_slot(KEY)} 10.0.0.1:7218"


async def test_a_fenced_write_is_served_here_when_the_move_is_given_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source, _ = moving_router("copy")
    source.fenced.add(key_slot(KEY))
    ex = DoorStub()
    assert one_routed(source, ex, (2, "get", {"key": KEY})) == (2, "get", {"key": KEY})
    req = (3, "set", {"key": KEY, "value": b"v"})
    held = one_routed(source, ex, req)
    async with trio.open_nursery() as nursery:
        box = await settle_in_background(nursery, held, ex)
        source.fenced.clear()  # move_end: no new map, the hold looks again by itself
    assert box == [req] and ex.answers == []


async def test_a_move_that_outlasts_the_hold_answers_tryagain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source, _ = moving_router("switch")
    ex = DoorStub()
    held = one_routed(source, ex, (4, "set", {"key": KEY, "value": b"v"}))
    t0 = trio.current_time()
    assert await held.settle(ex) is None  # type: ignore[arg-type]
    assert trio.current_time() - t0 == pytest.approx(HOLD_SECS, abs=HOLD_POLL_SECS)
    ((_, exc),) = ex.answers
    assert isinstance(exc, errors.SlotMoving) and exc.redis_text().startswith("TRYAGAIN")


async def test_inside_multi_a_moving_slot_is_refused_at_once() -> None:
    source, _ = moving_router("switch")
    ex = DoorStub(in_multi=True)
    assert list(source.route(ex, iter([(5, "incr", {"key": KEY})]))) == []
    assert ex.refused_in_multi == ["incr"]
    assert isinstance(ex.answers[0][1], errors.SlotMoving)
