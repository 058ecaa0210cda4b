"""The cluster map: which node owns each of the 16,384 slots, and where nodes are.

One JSON document in etcd, changed only by the coordinator, each change one
etcd transaction on the map's revision and a version one higher than the last
(clients and nodes compare versions to know which map is newer). A slot has an
active node; replicas slot in beside it later.

The assignment rule (sans-IO, here): slots with no owner are spread in
contiguous ranges over the nodes that are up, once at least ``min_nodes`` are.
A node that goes down keeps its slots, marked down: without replicas its data
is on it alone, so its slots are unavailable until it returns (moving them
would answer "no such key" for acknowledged writes). A node that joins when
every slot has an owner gets slots from a rebalance, which moves data first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from tenantkv.cluster.slots import SLOTS


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A member as it registers itself: name, where clients reach it, and whether
    its lease is alive."""

    name: str
    host: str
    port: int
    resp_port: int | None = None
    up: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "resp_port": self.resp_port, "up": self.up}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> NodeInfo:
        return cls(
            name,
            str(data["host"]),
            int(data["port"]),
            data.get("resp_port"),
            bool(data.get("up", True)),
        )


@dataclass(frozen=True, slots=True)
class SlotRange:
    """Slots ``start`` to ``end`` inclusive (Redis's way of writing ranges)."""

    start: int
    end: int
    node: str

    def __len__(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True, slots=True)
class ClusterMap:
    version: int = 0
    ranges: tuple[SlotRange, ...] = ()
    nodes: dict[str, NodeInfo] = field(default_factory=dict)

    def owner(self, slot: int) -> str | None:
        """The node that serves ``slot``, or None while it is unassigned."""
        lo, hi = 0, len(self.ranges)
        while lo < hi:  # ranges are sorted and disjoint
            mid = (lo + hi) // 2
            r = self.ranges[mid]
            if slot < r.start:
                hi = mid
            elif slot > r.end:
                lo = mid + 1
            else:
                return r.node
        return None

    def slots_of(self, node: str) -> int:
        return sum(len(r) for r in self.ranges if r.node == node)

    def assigned(self) -> int:
        return sum(len(r) for r in self.ranges)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": self.version,
                "ranges": [[r.start, r.end, r.node] for r in self.ranges],
                "nodes": {n: info.to_json() for n, info in sorted(self.nodes.items())},
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ClusterMap:
        doc = json.loads(data)
        return cls(
            int(doc["version"]),
            tuple(SlotRange(int(s), int(e), str(n)) for s, e, n in doc["ranges"]),
            {n: NodeInfo.from_json(n, info) for n, info in doc["nodes"].items()},
        )

    def summary(self) -> dict[str, Any]:
        """The map as ``status`` and ``cluster-status`` show it."""
        return {
            "version": self.version,
            "slots_assigned": self.assigned(),
            "nodes": {
                name: {
                    "address": f"{info.host}:{info.port}",
                    "resp_address": f"{info.host}:{info.resp_port}" if info.resp_port else None,
                    "up": info.up,
                    "slots": self.slots_of(name),
                    "ranges": [[r.start, r.end] for r in self.ranges if r.node == name],
                }
                for name, info in sorted(self.nodes.items())
            },
        }


def next_map(current: ClusterMap, live: dict[str, NodeInfo], min_nodes: int) -> ClusterMap | None:
    """The map the coordinator should write given the live members, or None when
    ``current`` already says it all. Members that left stay, marked down, while
    they own slots; ones that own none are forgotten."""
    nodes = dict(live)
    owners = {r.node for r in current.ranges}
    for name, info in current.nodes.items():
        if name not in nodes and name in owners:
            nodes[name] = replace(info, up=False)
    ranges = current.ranges
    up = sorted(n for n, info in nodes.items() if info.up)
    if current.assigned() < SLOTS and len(up) >= max(min_nodes, 1):
        ranges = _assign_unowned(ranges, up)
    if nodes == current.nodes and ranges == current.ranges:
        return None
    return ClusterMap(current.version + 1, ranges, nodes)


def _assign_unowned(ranges: tuple[SlotRange, ...], up: list[str]) -> tuple[SlotRange, ...]:
    """Spread the slots no range covers over ``up`` in contiguous, even shares."""
    gaps: list[tuple[int, int]] = []
    nxt = 0
    for r in ranges:
        if r.start > nxt:
            gaps.append((nxt, r.start - 1))
        nxt = r.end + 1
    if nxt < SLOTS:
        gaps.append((nxt, SLOTS - 1))
    free = [slot for start, end in gaps for slot in range(start, end + 1)]
    share, extra = divmod(len(free), len(up))
    new: list[SlotRange] = list(ranges)
    at = 0
    for i, name in enumerate(up):
        count = share + (1 if i < extra else 0)
        new += _runs(free[at : at + count], name)
        at += count
    return tuple(sorted(new, key=lambda r: r.start))


def _runs(slots: list[int], node: str) -> list[SlotRange]:
    """Sorted slots as the fewest ranges."""
    runs: list[SlotRange] = []
    for slot in slots:
        if runs and runs[-1].end == slot - 1:
            runs[-1] = SlotRange(runs[-1].start, slot, node)
        else:
            runs.append(SlotRange(slot, slot, node))
    return runs
