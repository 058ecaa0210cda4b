"""The cluster clients' pipelines: each node gets its part in one batch, the
answers come back in the order queued, and a part refused with NotMyPartition
is sent again by a fresh map — only what did not run.

Sans-IO first (batches and settle), then against 3 real nodes and a real etcd."""

from __future__ import annotations

from typing import Any

import pytest

from tenantkv import errors
from tenantkv.client.cluster import AsyncClusterClient, ClusterClient, SlotMap
from tenantkv.client.cluster_pipeline import batches, settle
from tenantkv.client.core import Call
from tests.conftest import ADMIN_PASSWORD, Daemon

from .test_client_plan import DOC, SEED, A, B, mget
from .test_routing_e2e import BUCKET, key_on, owner_of
from .test_routing_e2e import cluster as routing_cluster

#: the 3 nodes of the routing tests (a module's own: the fixture is module-scoped)
cluster = routing_cluster

# -- sans-IO -------------------------------------------------------------------------


def get(key: bytes) -> Call[Any]:
    return Call("get", {"key": key}, lambda r: r, True)


def test_batches_group_by_node_in_queued_order_and_split_an_mget() -> None:
    m = SlotMap(DOC)  # b"bar" → A, b"foo" → B
    calls = [get(b"foo"), get(b"bar"), mget([b"bar", b"foo"]), get(b"{foo}2")]
    out = batches(calls, range(4), m, SEED)
    assert [(i, p.method, p.params) for i, (_, p, _) in out[B]] == [
        (0, "get", {"key": b"foo"}),
        (2, "mget", {"keys": [b"foo"]}),
        (3, "get", {"key": b"{foo}2"}),
    ]
    assert [(i, p.params) for i, (_, p, _) in out[A]] == [
        (1, {"key": b"bar"}),
        (2, {"keys": [b"bar"]}),
    ]
    assert list(batches(calls, [1], m, SEED)) == [A]  # only the calls asked for


def test_settle_joins_keeps_errors_in_place_and_names_the_refused() -> None:
    m = SlotMap(DOC)
    calls = [get(b"foo"), get(b"bar"), mget([b"bar", b"foo"]), get(b"{foo}2")]
    by_node = batches(calls, range(4), m, SEED)
    refused = errors.NotMyPartition("slot 12182 is another node's")
    broken = errors.NotANumber("not a number")
    answers = {B: [b"F", [b"f"], refused], A: [broken, [b"b"]]}
    results: list[Any] = [None] * 4
    assert settle(by_node, answers, results) == [3]
    assert results[:3] == [b"F", broken, [b"b", b"f"]]  # the mget joined in key order
    assert results[3] is refused  # kept there should no redirect be left

    # An mget one of whose parts was refused goes again whole (it is a read).
    answers = {B: [b"F", refused, b"x"], A: [b"B", [b"b"]]}
    assert settle(by_node, answers, results) == [2]


# -- against a cluster ---------------------------------------------------------------


def open_cluster_client(d: Daemon) -> ClusterClient:
    return ClusterClient(
        d.host, d.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
    )


def stale_for(cc: ClusterClient | AsyncClusterClient, d: Daemon, wrong: Daemon) -> SlotMap:
    """The client's map with ``d``'s ranges given to ``wrong``: only the calls
    for ``d``'s keys are sent to the wrong node (and refused)."""
    with d.client(bucket=BUCKET) as c:
        doc = c.command("cluster_map")
    names = {(n["host"], n["port"]): name for name, n in doc["nodes"].items()}
    mine, theirs = names[(d.host, d.port)], names[(wrong.host, wrong.port)]
    doc["ranges"] = [[s, e, theirs if n == mine else n] for s, e, n in doc["ranges"]]
    return SlotMap(doc)


def test_a_pipeline_over_three_nodes_answers_in_the_order_queued(cluster: list[Daemon]) -> None:
    keys = [f"pl:{i}".encode() for i in range(60)]
    with open_cluster_client(cluster[0]) as cc:
        assert len({cc.map.node_of(k) for k in keys}) == 3
        with cc.pipeline() as p:
            for k in keys:
                p.set(k, k + b"=1")
            for k in keys:
                p.set(k, k + b"=2")  # a key's commands keep their order on its node
            p.mget(keys)
            p.get(b"pl:absent")
        assert p.results[-2] == [k + b"=2" for k in keys]
        assert p.results[-1] is None and len(p.results) == 122
        for k in keys[:12]:
            with owner_of(cluster, k).client(bucket=BUCKET) as c:
                assert c.get(k) == k + b"=2"  # stored on its slot's node

        # A failed command keeps its place; the others ran.
        p = cc.pipeline(raise_on_error=False)
        p.incr(keys[0])  # not a number
        p.incr(b"pl:n", initial=5)
        p.get(keys[1])
        out = p.execute()
        assert isinstance(out[0], errors.ServerError) and out[1:] == [5, keys[1] + b"=2"]
        p = cc.pipeline()
        p.incr(keys[0])
        p.incr(b"pl:n")
        with pytest.raises(errors.ServerError):
            p.execute()  # raised after every answer is in
        assert p.results[1] == 6 and cc.get(b"pl:n") == b"6"


def test_a_refused_part_is_sent_again_by_a_fresh_map_and_only_it(cluster: list[Daemon]) -> None:
    n0, n1, n2 = cluster
    counters = [key_on(cluster, d, f"once{i}") for d in cluster for i in range(4)]
    with open_cluster_client(n0) as cc:
        cc.map = stale_for(cc, n1, wrong=n2)  # n1's keys go to n2: refused there
        p = cc.pipeline()
        for k in counters:
            p.incr(k, initial=1)  # not idempotent: a resend of what ran would show
        p.mget(counters)
        assert p.execute()[:-1] == [1] * len(counters)
        assert p.results[-1] == [b"1"] * len(counters)
        assert cc.map_refreshes == 1
    for k in counters:
        with owner_of(cluster, k).client(bucket=BUCKET) as c:
            assert c.get(k) == b"1"  # each ran exactly once, on its node


def test_an_empty_pipeline_sends_nothing(cluster: list[Daemon]) -> None:
    with open_cluster_client(cluster[0]) as cc:
        assert cc.pipeline().execute() == []


async def test_async_pipeline_sends_each_node_its_batch_and_follows_the_map(
    cluster: list[Daemon],
) -> None:
    n0, n1, n2 = cluster
    keys = [f"apl:{i}".encode() for i in range(45)]
    async with AsyncClusterClient(
        n2.host, n2.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
    ) as cc:
        async with cc.pipeline() as p:
            for k in keys:
                p.set(k, b"a")
            for k in keys:
                p.append(k, b"b")  # order on each node: "ab", never "b" then "a"
            p.mget(keys)
        assert p.results[-1] == [b"ab"] * len(keys)

        cc.map = stale_for(cc, n0, wrong=n1)
        p = cc.pipeline(raise_on_error=False)
        for k in keys:
            p.incr(k + b":n", initial=7)
        p.incr(keys[0])  # not a number: an error in its place
        out = await p.execute()
        assert out[:-1] == [7] * len(keys) and isinstance(out[-1], errors.ServerError)
        assert cc.map_refreshes == 1
    for k in keys[:9]:
        with owner_of(cluster, k).client(bucket=BUCKET) as c:
            assert c.get(k) == b"ab"
        with owner_of(cluster, k + b":n").client(bucket=BUCKET) as c:
            assert c.get(k + b":n") == b"7"
