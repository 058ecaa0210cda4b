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

A rebalance in progress shows in the map too (tenantkv.cluster.rebalance): the
slots moving now (:class:`SlotMove`, each with its phase), the goal being
worked towards (:class:`Rebalance`: nodes to empty, slots moved and to move),
and the nodes removed with ``node-remove`` (kept out of the map while they stay
registered).
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


#: A move's phases: ``copy`` (the target copies the slots and catches up while
#: the source serves them) and ``switch`` (the source has stopped writing them and
#: the target holds every write: the source answers ``-ASK``, the target takes
#: ``ASKING`` commands for them; the next map gives the target the slots).
PHASES = ("copy", "switch")


@dataclass(frozen=True, slots=True)
class SlotMove:
    """Slots ``start`` to ``end`` moving from ``source`` to ``target``."""

    start: int
    end: int
    source: str
    target: str
    phase: str = "copy"

    def __len__(self) -> int:
        return self.end - self.start + 1

    def slots(self) -> range:
        return range(self.start, self.end + 1)

    def to_json(self) -> list[Any]:
        return [self.start, self.end, self.source, self.target, self.phase]

    @classmethod
    def from_json(cls, data: list[Any]) -> SlotMove:
        start, end, source, target, phase = data
        if phase not in PHASES:
            raise ValueError(f"unknown move phase {phase!r}")
        return cls(int(start), int(end), str(source), str(target), phase)


@dataclass(frozen=True, slots=True)
class Rebalance:
    """The rebalance the coordinator works on: ``drain`` lists nodes to empty
    (``node-remove``; removed from the map once empty), ``moved`` and ``total``
    count slots (``total`` grows if the plan grows)."""

    drain: tuple[str, ...] = ()
    moved: int = 0
    total: int = 0
    #: slots per batch (0: the default, rebalance_plan.BATCH_SLOTS)
    batch: int = 0

    def to_json(self) -> dict[str, Any]:
        doc = {"drain": list(self.drain), "moved": self.moved, "total": self.total}
        return {**doc, "batch": self.batch} if self.batch else doc

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rebalance:
        return cls(
            tuple(data.get("drain", ())),
            int(data["moved"]),
            int(data["total"]),
            int(data.get("batch", 0)),
        )


@dataclass(frozen=True, slots=True)
class ClusterMap:
    version: int = 0
    ranges: tuple[SlotRange, ...] = ()
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    #: slots moving now (a rebalance's current batch)
    moves: tuple[SlotMove, ...] = ()
    #: the rebalance in progress, if any
    rebalance: Rebalance | None = None
    #: nodes taken out with node-remove, kept out while they stay registered
    removed: tuple[str, ...] = ()

    def move_of(self, slot: int) -> SlotMove | None:
        for m in self.moves:
            if m.start <= slot <= m.end:
                return m
        return None

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
        doc: dict[str, Any] = {
            "version": self.version,
            "ranges": [[r.start, r.end, r.node] for r in self.ranges],
            "nodes": {n: info.to_json() for n, info in sorted(self.nodes.items())},
        }
        if self.moves:
            doc["moves"] = [m.to_json() for m in self.moves]
        if self.rebalance is not None:
            doc["rebalance"] = self.rebalance.to_json()
        if self.removed:
            doc["removed"] = list(self.removed)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> ClusterMap:
        doc = json.loads(data)
        rebalance = doc.get("rebalance")
        return cls(
            int(doc["version"]),
            tuple(SlotRange(int(s), int(e), str(n)) for s, e, n in doc["ranges"]),
            {n: NodeInfo.from_json(n, info) for n, info in doc["nodes"].items()},
            tuple(SlotMove.from_json(m) for m in doc.get("moves", ())),
            None if rebalance is None else Rebalance.from_json(rebalance),
            tuple(doc.get("removed", ())),
        )

    def progress(self) -> dict[str, Any] | None:
        """The rebalance's progress as ``status`` shows it, or None when none runs."""
        r = self.rebalance
        if r is None:
            return None
        return {
            "moved": r.moved,
            "total": r.total,
            "drain": list(r.drain),
            "moving": [m.to_json() for m in self.moves],
        }

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
            "rebalance": self.progress(),
            "removed": list(self.removed),
        }


def next_map(current: ClusterMap, live: dict[str, NodeInfo], min_nodes: int) -> ClusterMap | None:
    """The map the coordinator should write given the live members, or None when
    ``current`` already says it all. Members that left stay, marked down, while
    they own slots; ones that own none are forgotten."""
    removed = tuple(n for n in current.removed if n in live)  # (forgotten once gone)
    nodes = {n: info for n, info in live.items() if n not in removed}
    owners = {r.node for r in current.ranges}
    for name, info in current.nodes.items():
        if name not in nodes and name in owners:
            nodes[name] = replace(info, up=False)
    ranges = current.ranges
    up = sorted(n for n, info in nodes.items() if info.up)
    if current.assigned() < SLOTS and len(up) >= max(min_nodes, 1):
        ranges = _assign_unowned(ranges, up)
    if nodes == current.nodes and ranges == current.ranges and removed == current.removed:
        return None
    return replace(
        current, version=current.version + 1, ranges=ranges, nodes=nodes, removed=removed
    )


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
