"""The cluster map's assignment rule, sans-IO."""

from __future__ import annotations

from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo, SlotRange, next_map
from tenantkv.cluster.slots import SLOTS


def live(*names: str) -> dict[str, NodeInfo]:
    return {n: NodeInfo(n, "127.0.0.1", 7000 + i) for i, n in enumerate(names)}


def test_waits_for_min_nodes_then_spreads_evenly() -> None:
    first = next_map(ClusterMap(), live("a", "b"), min_nodes=3)
    assert first is not None and first.version == 1 and first.assigned() == 0
    second = next_map(first, live("a", "b", "c"), min_nodes=3)
    assert second is not None and second.version == 2
    assert second.assigned() == SLOTS
    assert [second.slots_of(n) for n in "abc"] == [5462, 5461, 5461]
    assert second.ranges == (
        SlotRange(0, 5461, "a"),
        SlotRange(5462, 10922, "b"),
        SlotRange(10923, 16383, "c"),
    )
    assert second.owner(0) == "a" and second.owner(10922) == "b" and second.owner(16383) == "c"
    assert next_map(second, live("a", "b", "c"), min_nodes=3) is None  # nothing to change


def test_a_node_that_goes_keeps_its_slots_marked_down() -> None:
    m = next_map(ClusterMap(), live("a", "b", "c"), min_nodes=1)
    assert m is not None
    down = next_map(m, live("a", "c"), min_nodes=1)
    assert down is not None and down.version == m.version + 1
    assert down.nodes["b"].up is False and down.ranges == m.ranges
    back = next_map(down, live("a", "b", "c"), min_nodes=1)
    assert back is not None and back.nodes["b"].up and back.ranges == m.ranges


def test_a_node_that_joins_a_full_map_gets_no_slots_without_a_rebalance() -> None:
    m = next_map(ClusterMap(), live("a"), min_nodes=1)
    assert m is not None and m.slots_of("a") == SLOTS
    joined = next_map(m, live("a", "b"), min_nodes=1)
    assert joined is not None and "b" in joined.nodes and joined.slots_of("b") == 0
    gone = next_map(joined, live("a"), min_nodes=1)
    assert gone is not None and "b" not in gone.nodes  # owned nothing: forgotten


def test_unowned_gaps_are_filled() -> None:
    m = ClusterMap(3, (SlotRange(100, 199, "a"),), live("a"))
    filled = next_map(m, live("a", "b"), min_nodes=1)
    assert filled is not None and filled.assigned() == SLOTS
    assert filled.owner(150) == "a"
    assert filled.slots_of("a") == 100 + (SLOTS - 100) // 2


def test_encode_decode_round_trip() -> None:
    m = next_map(ClusterMap(), live("a", "b"), min_nodes=1)
    assert m is not None
    assert ClusterMap.decode(m.encode()) == m
    summary = m.summary()
    assert summary["version"] == 1 and summary["slots_assigned"] == SLOTS
    assert summary["nodes"]["b"]["ranges"] == [[8192, 16383]]
