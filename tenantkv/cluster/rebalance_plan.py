"""Which slots a rebalance moves where: sans-IO, from the map alone.

The goal: every node that is up and not being removed holds an even share of
the slots (``16384 // n``, the first ``16384 % n`` of them, by how many they
hold now, one more), and nodes being removed (``drain``) hold none. Nodes above
their share give their highest slots to nodes below theirs, so that every
node's slots stay few contiguous ranges. A node that is down keeps its share
in the count but gives nothing (its data is on it alone) and takes nothing
until it is back: the moves it is part of wait (``movable``); unassigned slots
are the coordinator's ordinary assignment, not the rebalance's.
"""

from __future__ import annotations

from tenantkv.cluster.cluster_map import ClusterMap, SlotMove

#: Slots moved together: copied, fenced and switched as one batch (one map
#: write per phase). Small enough that a batch's fence (its final catch-up and
#: two map writes) stays far below a second; large enough that the per-batch
#: round trips do not dominate a move of many keys.
BATCH_SLOTS = 256


def plan(m: ClusterMap, drain: tuple[str, ...] = (), *, movable: bool = True) -> list[SlotMove]:
    """The moves, as ranges each from one node to one, that reach the goal; with
    ``movable`` only those whose nodes are both up (the others wait)."""
    owned: dict[str, list[int]] = {}
    for r in m.ranges:
        owned.setdefault(r.node, []).extend(range(r.start, r.end + 1))
    receivers = [n for n in sorted(m.nodes) if n not in drain]
    if not [n for n in receivers if m.nodes[n].up]:
        return []
    assigned = sum(len(v) for v in owned.values())
    share, extra = divmod(assigned, len(receivers))
    # The nodes holding most now keep the extra slot: fewest moves.
    by_size = sorted(receivers, key=lambda n: (-len(owned.get(n, [])), n))
    quota = {n: share + (1 if i < extra else 0) for i, n in enumerate(by_size)}
    given: list[tuple[int, str]] = []
    for node in sorted(owned):
        info = m.nodes.get(node)
        if info is None or (movable and not info.up):
            continue  # a down node's slots stay (its data is there alone)
        excess = len(owned[node]) - quota.get(node, 0)
        if excess > 0:
            given += [(slot, node) for slot in owned[node][-excess:]]
    moves: list[SlotMove] = []
    at = 0
    for node in receivers:
        need = quota[node] - len(owned.get(node, []))
        if need <= 0 or (movable and not m.nodes[node].up):
            continue
        for slot, source in given[at : at + need]:
            last = moves[-1] if moves else None
            if last and last.end == slot - 1 and last.source == source and last.target == node:
                moves[-1] = SlotMove(last.start, slot, source, node)
            else:
                moves.append(SlotMove(slot, slot, source, node))
        at += need
    return moves


def next_batch(
    m: ClusterMap, drain: tuple[str, ...] = (), limit: int = BATCH_SLOTS
) -> SlotMove | None:
    """The next batch to move: the plan's first range, at most ``limit`` slots."""
    moves = plan(m, drain)
    if not moves:
        return None
    first = moves[0]
    end = min(first.end, first.start + limit - 1)
    return SlotMove(first.start, end, first.source, first.target)


def slots_to_move(m: ClusterMap, drain: tuple[str, ...] = ()) -> int:
    """Slots the goal moves, those waiting for a node that is down included."""
    return sum(len(mv) for mv in plan(m, drain, movable=False))


def done(m: ClusterMap, drain: tuple[str, ...]) -> bool:
    """Is the goal reached: nothing to move, down nodes counted (their moves wait)?"""
    return not plan(m, drain, movable=False)
