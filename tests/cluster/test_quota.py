"""Tenant limits across a cluster, in process: three nodes' throttles, their
:class:`NodeQuota` and a :class:`QuotaLeader` on Trio's mock clock.

Each simulated node is a real :class:`TenantThrottle` (Trio's clock) run by a
real :class:`NodeQuota`; reports travel to the leader through msgpack (the wire
forms a peer carries) after ``DELAY``. Clients are tasks on one node each,
offering 1-unit operations: closed loop (as fast as admitted) or at a rate
(open loop, at most a millisecond's backlog). Rates come from the throttles'
own charged units (``ru_total``) over a window, as the server's status shows
them.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from tenantkv.admission.quota_lease import (
    BucketUse,
    LimitAllocator,
    QuotaAllocator,
    split_limits,
)
from tenantkv.admission.rate_allocation import BucketLease
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import BucketProps
from tenantkv.cluster.quota_leader import QuotaLeader
from tenantkv.cluster.quota_node import (
    NodeQuota,
    QuotaUnreachable,
    Send,
    fallback_share,
    limited,
)

SLICE = 0.1
DELAY = 0.002
TICK = 0.001
NODES = ("n0", "n1", "n2")


@dataclass
class Cluster:
    """Three nodes; ``n0`` leads every limited bucket unless ``leader`` is None."""

    buckets: dict[str, dict[str, Any]]
    capacity: int | None = None
    leader: str | None = "n0"
    throttles: dict[str, TenantThrottle] = field(default_factory=dict)
    quotas: dict[str, NodeQuota] = field(default_factory=dict)
    leaders: dict[str, QuotaLeader] = field(default_factory=dict)
    #: the leader answers nobody while True (dead, or cut off)
    cut: bool = False

    def start(self) -> None:
        for name in NODES:
            th = TenantThrottle(trio.current_time, capacity=self.capacity, slice_secs=SLICE)
            for bucket, props in self.buckets.items():
                th.add_bucket(bucket, **props)
            self.throttles[name] = th
            led = lambda me=name: set(self.buckets) if me == self.leader else set()  # noqa: E731
            self.leaders[name] = QuotaLeader(th, led)
            self.quotas[name] = NodeQuota(
                th,
                me=name,
                nodes_up=lambda: len(NODES),
                leader_of=lambda b: self.leader,
                local=self.leaders[name].report,
                transport=lambda leader, me=name: self.channel(me, leader),
            )

    @asynccontextmanager
    async def channel(self, node: str, leader: str) -> AsyncIterator[Send]:
        async def send(report: dict[str, Any]) -> Any:
            await trio.sleep(DELAY)
            if self.cut:
                raise QuotaUnreachable(f"{leader} does not answer")
            wire = msgpack.unpackb(msgpack.packb(report))
            answer = self.leaders[leader].answer(node, wire)
            await trio.sleep(DELAY)
            return msgpack.unpackb(msgpack.packb(answer))

        if self.cut:
            raise QuotaUnreachable(f"{leader} is not reachable")
        yield send

    def charged(self, bucket: str) -> dict[str, int]:
        return {n: th.statistics().buckets[bucket].ru_total for n, th in self.throttles.items()}


async def client(
    th: TenantThrottle, bucket: str, until: float, rate: float | None = None, connections: int = 1
) -> None:
    """Offer 1-unit operations on ``bucket`` until ``until``: at ``rate`` units/s,
    or (None) as fast as they are admitted."""
    for _ in range(connections):
        th.connection_opened(bucket)
    backlog = 0.0
    try:
        while trio.current_time() < until:
            want = 50.0 if rate is None else min(backlog + rate * TICK, rate * TICK + 1.0)
            backlog = want
            while backlog >= 1.0:
                wait = th.admission_wait(bucket)
                if wait > 0.0:
                    break
                allowance = th.run_allowance(bucket)
                run = int(backlog) if math.isinf(allowance) else max(1, math.ceil(allowance))
                run = min(run, int(backlog))
                th.charge(bucket, run, 0)
                backlog -= run
            if rate is None:
                backlog = 0.0
            await trio.sleep(TICK)
    finally:
        for _ in range(connections):
            th.connection_closed(bucket)


async def measure(
    cluster: Cluster,
    loads: dict[str, list[tuple[str, float | None, int]]],
    *,
    warmup: float = 2.0,
    window: float = 5.0,
) -> dict[str, dict[str, float]]:
    """Run ``loads`` (per bucket: ``(node, rate, connections)``) and return each
    bucket's charged units/s per node over ``window`` after ``warmup``."""
    cluster.start()
    start = trio.current_time()
    end = start + warmup + window
    async with trio.open_nursery() as nursery:
        for q in cluster.quotas.values():
            await nursery.start(q.run)
        for bucket, specs in loads.items():
            for node, rate, conns in specs:
                nursery.start_soon(client, cluster.throttles[node], bucket, end, rate, conns)
        await trio.sleep(warmup)
        before = {b: cluster.charged(b) for b in loads}
        await trio.sleep(window)
        after = {b: cluster.charged(b) for b in loads}
        nursery.cancel_scope.cancel()
    return {b: {n: (after[b][n] - before[b][n]) / window for n in NODES} for b in loads}


def total(rates: dict[str, float]) -> float:
    return sum(rates.values())


# --------------------------------------------------------------------------- pure parts


def test_fallback_share_is_one_nth_and_keeps_unlimited_and_exempt() -> None:
    share = fallback_share(BucketProps(300, 1000), 3)
    assert share.hard_rate * 3 == pytest.approx(1000)
    assert share.reserved_rate * 3 == pytest.approx(300)
    free = fallback_share(BucketProps(None, None), 3)
    assert math.isinf(free.hard_rate) and math.isinf(free.reserved_rate)
    assert fallback_share(BucketProps(0, 10), 0).hard_rate == 10  # no map yet: alone
    assert limited(BucketProps(0, 10)) and limited(BucketProps(5, None))
    assert not limited(BucketProps(0, None)) and not limited(BucketProps(None, None))


def use(connections: int = 1, hungry: bool = False, demand: float = 0.0) -> BucketUse:
    return BucketUse(connections, hungry, demand, 0.0)


def test_split_limits_follows_demand_and_splits_the_reservation_alike() -> None:
    shares = dict(
        split_limits(
            BucketProps(500, 1000),
            [("a", use(1, hungry=True)), ("b", use(1, demand=100.0)), ("c", use(1, demand=100.0))],
            SLICE,
        )
    )
    assert sum(s.reserved_rate for s in shares.values()) == pytest.approx(500)
    # The quiet nodes get their demand with headroom (1.25 x 100 + 1 unit a slice),
    # the hungry one the rest, and is lent the headroom they leave above their
    # demand: the shares' sum exceeds the limit by it, their use does not.
    assert shares["b"].hard_rate == pytest.approx(135)
    assert shares["a"].hard_rate == pytest.approx(730 + 2 * 35)
    assert sum(s.hard_rate for s in shares.values()) == pytest.approx(1070)
    assert shares["a"].reserved_rate == pytest.approx(365)
    # All hungry: by connections.
    hungry = dict(
        split_limits(
            BucketProps(0, 1000),
            [("a", use(8, True)), ("b", use(1, True)), ("c", use(1, True))],
            SLICE,
        )
    )
    assert [hungry[n].hard_rate for n in "abc"] == pytest.approx([800, 100, 100])
    # No hard limit: the reservation alone is split; every hard share unlimited.
    open_ = dict(
        split_limits(BucketProps(600, None), [("a", use(2, True)), ("b", use(1, True))], SLICE)
    )
    assert [open_[n].reserved_rate for n in "ab"] == pytest.approx([400, 200])
    assert all(math.isinf(s.hard_rate) for s in open_.values())
    # A node that does not use the bucket gets no share (it runs at 1/N).
    assert split_limits(BucketProps(0, 1000), [("a", use(0))], SLICE) == []


def test_limit_allocator_leases_nodes_their_shares_and_forgets_the_silent() -> None:
    props = TenantThrottle(lambda: 0.0, slice_secs=SLICE)
    props.add_bucket("h", hard_limit=900)
    alloc = LimitAllocator(props.props())
    alloc.report("a", {"h": use(1, True)}, 0.0)
    lease = alloc.report("b", {"h": use(2, True)}, 0.0)
    assert lease["h"].hard_rate == pytest.approx(600)
    assert alloc.lease("a")["h"].hard_rate == pytest.approx(300)
    # "a" goes silent for LEASE_SLICES slices of b's reports: its share goes to "b".
    for t in (0.1, 0.2, 0.3, 0.4):
        lease = alloc.report("b", {"h": use(2, True)}, t)
    assert lease["h"].hard_rate == pytest.approx(900)
    assert alloc.workers == ["b"]


def test_set_limits_holds_a_bucket_to_its_share_within_the_node_allocation() -> None:
    th = TenantThrottle(lambda: 0.0, capacity=1000, slice_secs=SLICE)
    th.add_bucket("h", reserved=600, hard_limit=900)
    th.add_bucket("f")
    alloc = QuotaAllocator(th.props())
    alloc.set_limits({"h": BucketLease(300, 200, 300)})
    lease = alloc.report("node", {"h": use(1, True), "f": use(1, True)}, 0.0)
    assert lease["h"].hard_rate == 300 and lease["h"].rate == pytest.approx(300)
    assert lease["h"].reserved_rate == pytest.approx(200)
    assert lease["f"].rate == pytest.approx(700)  # the node's capacity is the node's
    # A share above the configured limits never raises them.
    alloc.set_limits({"h": BucketLease(5000, 5000, 5000)})
    lease = alloc.report("node", {"h": use(1, True), "f": use(1, True)}, 0.0)
    assert lease["h"].hard_rate == 900


# --------------------------------------------------------------------------- the cluster


async def test_fallback_alone_holds_each_node_to_one_third(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = Cluster({"h": {"hard_limit": 1000}}, leader=None)
    rates = await measure(cluster, {"h": [("n0", None, 8), ("n1", None, 1), ("n2", None, 1)]})
    for n in NODES:
        assert rates["h"][n] == pytest.approx(1000 / 3, rel=0.03)
    assert all(s == "fallback" for _, s in cluster.quotas["n0"].shares.values())


async def test_fallback_is_below_the_limit_for_uneven_load(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 1,500 offered 80/10/10: the quiet nodes cannot use their thirds.
    cluster = Cluster({"h": {"hard_limit": 1000}}, leader=None)
    rates = await measure(cluster, {"h": [("n0", 1200.0, 8), ("n1", 150.0, 1), ("n2", 150.0, 1)]})
    assert total(rates["h"]) == pytest.approx(1000 / 3 + 300, rel=0.03)


@pytest.mark.parametrize(
    ("split", "conns"),
    [
        ((1200.0, 150.0, 150.0), (8, 1, 1)),  # 80/10/10, just above the limit
        ((2400.0, 300.0, 300.0), (8, 1, 1)),  # ... at twice it
        ((None, 100.0, 100.0), (1, 1, 1)),  # quiet nodes well under a third
        ((None, None, None), (1, 1, 1)),  # even, closed loop
    ],
)
async def test_the_leader_holds_the_hard_limit_cluster_wide(
    autojump_clock: trio.testing.MockClock,
    split: tuple[float | None, ...],
    conns: tuple[int, ...],
) -> None:
    cluster = Cluster({"h": {"hard_limit": 1000}})
    rates = await measure(
        cluster, {"h": [(n, r, c) for n, r, c in zip(NODES, split, conns, strict=True)]}
    )
    assert total(rates["h"]) == pytest.approx(1000, rel=0.03)
    assert all(s == "leader" for _, s in cluster.quotas["n1"].shares.values())
    if split[0] is None and split[1] is None:
        for n in NODES:
            assert rates["h"][n] == pytest.approx(1000 / 3, rel=0.05)


@pytest.mark.parametrize("leader", ["n0", None])
async def test_a_reservation_holds_under_a_10x_neighbour(
    autojump_clock: trio.testing.MockClock, leader: str | None
) -> None:
    # Capacity 550 a node. Q (reserved 500) offers 500 at 80/10/10; the noisy
    # bucket is driven closed loop on 10x the connections on every node. At 1/N
    # (no leader) Q's busy node reserves it 167 of the 400 it needs there.
    cluster = Cluster({"q": {"reserved": 500}, "noisy": {}}, capacity=550, leader=leader)
    rates = await measure(
        cluster,
        {
            "q": [("n0", 400.0, 8), ("n1", 50.0, 1), ("n2", 50.0, 1)],
            "noisy": [(n, None, 80) for n in NODES],
        },
    )
    if leader is None:
        assert total(rates["q"]) < 0.95 * 500
    else:
        assert total(rates["q"]) >= 0.97 * 500
    for n in NODES:  # the node capacity is the node's (an unused reservation is kept)
        assert rates["q"][n] + rates["noisy"][n] <= 550 * 1.01
        if leader is not None:
            assert rates["q"][n] + rates["noisy"][n] == pytest.approx(550, rel=0.03)


async def test_without_the_leader_nodes_fall_back_to_one_nth_within_lease_slices(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cluster = Cluster({"h": {"hard_limit": 900}})
    cluster.start()
    quota = cluster.quotas["n1"]
    end = trio.current_time() + 3.0
    async with trio.open_nursery() as nursery:
        for q in cluster.quotas.values():
            await nursery.start(q.run)
        nursery.start_soon(client, cluster.throttles["n0"], "h", end, None, 8)
        nursery.start_soon(client, cluster.throttles["n1"], "h", end, 100.0, 1)
        await trio.sleep(1.0)
        assert quota.shares["h"][1] == "leader"
        assert quota.shares["h"][0].hard_rate == pytest.approx(100)  # by connections, 1 of 9
        cluster.cut = True
        cut_at = trio.current_time()
        for _ in range(100):
            if quota.shares["h"][1] != "leader":
                break
            await trio.sleep(0.01)
        waited = trio.current_time() - cut_at
        assert waited <= (3 + 1) * SLICE + 0.05  # LEASE_SLICES + the round it noticed in
        assert quota.shares["h"][0].hard_rate == pytest.approx(300)
        assert quota.report_failures > 0
        nursery.cancel_scope.cancel()


async def test_a_new_leader_warms_up_before_its_shares_so_they_never_stack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 80/10/10 closed loop; the office moves from n0 to n1 (n0 left gracefully:
    # its last shares are still held). The new leader's first shares, computed
    # from one report, would give the whole limit to the first node to report.
    cluster = Cluster({"h": {"hard_limit": 1000}})
    cluster.start()
    end = trio.current_time() + 4.0
    per_slice: list[int] = []
    async with trio.open_nursery() as nursery:
        for q in cluster.quotas.values():
            await nursery.start(q.run)
        for node, conns in zip(NODES, (8, 1, 1), strict=True):
            nursery.start_soon(client, cluster.throttles[node], "h", end, None, conns)
        await trio.sleep(1.5)
        last = sum(cluster.charged("h").values())
        for k in range(20):
            if k == 2:
                cluster.leader = "n1"
            await trio.sleep(SLICE)
            now = sum(cluster.charged("h").values())
            per_slice.append(now - last)
            last = now
        nursery.cancel_scope.cancel()
    # Within one slice's burst of the limit over every half second of the move.
    for k in range(len(per_slice) - 4):
        assert sum(per_slice[k : k + 5]) <= 1000 * 0.5 + 1000 * SLICE, per_slice
    assert sum(per_slice[-5:]) == pytest.approx(500, rel=0.05)
    assert cluster.quotas["n2"].shares["h"][1] == "leader"
