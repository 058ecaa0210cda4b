"""The ownership check's decisions, sans-IO (a map and a lease, no etcd)."""

from __future__ import annotations

import math
from typing import Any

import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo, SlotRange
from tenantkv.cluster.membership import ClusterSettings, Member
from tenantkv.cluster.redis_view import nodes, shards, slots
from tenantkv.cluster.routing import Router, node_id, request_keys
from tenantkv.cluster.slots import key_slot

MAP = ClusterMap(
    7,
    (SlotRange(0, 8191, "a"), SlotRange(8192, 16383, "b")),
    {"a": NodeInfo("a", "10.0.0.1", 7207, 7208), "b": NodeInfo("b", "10.0.0.2", 7207, 7208)},
)


def router(lease_secs: float = 10) -> Router:
    member = Member(Any, ClusterSettings(("http://e",), "a"), MAP.nodes["a"])  # type: ignore[arg-type]
    member.map = MAP
    member.lease_deadline = trio.current_time() + lease_secs if lease_secs else -math.inf
    return Router(member)


def test_request_keys() -> None:
    assert request_keys({"key": b"k"}) == [b"k"]
    assert request_keys({"key": "k"}) == [b"k"]  # the MessagePack door takes str keys
    assert request_keys({"keys": [b"a", b"b"]}) == [b"a", b"b"]
    assert request_keys({"pairs": [(b"a", b"1"), (b"b", b"2")]}) == [b"a", b"b"]
    assert request_keys({"key": b"a", "dest": b"b"}) == [b"a", b"b"]
    assert request_keys({"prefix": b"p"}) is None  # a scan names no key
    assert request_keys({"key": 5}) is None  # wrong: the command's own check says so


async def test_own_other_and_crossslot() -> None:
    r = router()
    foo, bar = b"foo", b"bar"  # slots 12182 (b) and 5061 (a)
    assert r.refusal([bar], resp=True) is None
    moved = r.refusal([foo], resp=True)
    assert isinstance(moved, errors.NotMyPartition)
    assert moved.redis_text() == "MOVED 12182 10.0.0.2:7208"
    assert moved.to_wire()["mapVersion"] == 7 and moved.to_wire()["owner"] == "10.0.0.2:7208"
    msgpack = r.refusal([foo], resp=False)
    assert isinstance(msgpack, errors.NotMyPartition) and msgpack.owner == "10.0.0.2:7207"
    cross = r.refusal([bar, b"{bar}x", b"zz"], resp=True)
    assert key_slot(b"zz") != key_slot(bar)
    assert isinstance(cross, errors.CrossSlot) and cross.redis_text().startswith("CROSSSLOT")
    # The MessagePack door: several slots are fine while this node serves them all.
    assert r.refusal([bar, b"{bar}x"], resp=False) is None


async def test_fenced_without_a_lease_and_down_nodes() -> None:
    fenced = router(lease_secs=0)
    refused = fenced.refusal([b"bar"], resp=True, write=True)
    assert isinstance(refused, errors.NodeUnavailable) and "lease lapsed" in refused.errmsg
    assert refused.redis_text().startswith("CLUSTERDOWN")
    # Reads of its own slots go on, on the map it holds (etcd down: data serves).
    assert fenced.refusal([b"bar"], resp=True, write=False) is None
    r = router()
    r.member.map = ClusterMap(
        8, MAP.ranges, {**MAP.nodes, "b": NodeInfo("b", "10.0.0.2", 7207, 7208, up=False)}
    )
    down = r.refusal([b"foo"], resp=False)
    assert isinstance(down, errors.NodeUnavailable) and "node b is down" in down.errmsg
    assert errors.RETRYABLE in down.labels
    r.member.map = ClusterMap(9, (SlotRange(0, 100, "a"),), MAP.nodes)
    unassigned = r.refusal([b"foo"], resp=False)
    assert isinstance(unassigned, errors.NodeUnavailable) and "not assigned" in unassigned.errmsg


def test_redis_views() -> None:
    assert slots(MAP) == [
        [0, 8191, ["10.0.0.1", 7208, node_id("a")]],
        [8192, 16383, ["10.0.0.2", 7208, node_id("b")]],
    ]
    assert shards(MAP)[1]["slots"] == [8192, 16383]
    lines = nodes(MAP, "a").splitlines()
    assert lines[0] == (
        f"{node_id('a')} 10.0.0.1:7208@17208,a myself,master - 0 0 7 connected 0-8191"
    )
    assert lines[1].endswith(" master - 0 0 7 connected 8192-16383")
    assert len(node_id("a")) == 40
