"""Rate leases (``serve --workers N``) in a simulator, against the ideal single throttle.

N worker :class:`TenantThrottle`\\ s in lease mode and one :class:`QuotaAllocator`
share a fake clock. Simulated clients sit on connections of one bucket on one
worker and offer 1-unit operations in closed loop: while admitted they go on
(an admitted run is charged at once, :meth:`TenantThrottle.run_allowance`); a
throttled one retries after the predicted wait. Every worker reports each slice
(staggered) and at once on an event; reports and leases travel through the wire
helpers and msgpack with a configurable delay each way. The **ideal** is one
non-leased throttle fed the same clients.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest

from tenantkv.admission.quota_lease import (
    BucketLease,
    BucketUse,
    QuotaAllocator,
    lease_from_wire,
    lease_to_wire,
    usage_from_wire,
    usage_to_wire,
)
from tenantkv.admission.rate_allocation import RateNeed, allocate_rates
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import ThrottleProps
from tests.conftest import FakeClock

SLICE = 0.1
TICK = 0.001
#: what one client can offer per second when nothing holds it back (pipelined)
CLIENT_MAX = 50_000.0
#: from a write's admission to its charge (its commit)
WRITE_LATENCY = 0.05


@dataclass
class Clients:
    """``connections`` clients of ``bucket`` on ``worker`` from ``start`` to ``stop``,
    offering ``rate`` units/s in all (None: as fast as they are admitted)."""

    bucket: str
    worker: int
    connections: int = 1
    rate: float | None = None
    start: float = 0.0
    stop: float = math.inf
    backlog: float = 0.0
    retry_at: float = 0.0
    open: bool = False
    #: a writer instead: each connection keeps ``in_flight`` writes of this many
    #: units in flight, each admitted at its cost (write_wait, reserve) and charged
    #: ``WRITE_LATENCY`` later, when durable (charge with ``reserved``)
    write_cost: int = 0
    in_flight: int = 4
    flying: list[float] = field(default_factory=list)


@dataclass
class Result:
    #: admitted units per bucket per slice
    slices: dict[str, list[int]]
    allocator: QuotaAllocator | None = None
    leases: list[tuple[float, int, dict[str, BucketLease]]] = field(default_factory=list)
    #: leases pushed to a worker that had not just reported
    pushed: int = 0

    def total(self, bucket: str, start: float = 0.0, end: float = math.inf) -> int:
        v = self.slices[bucket]
        return sum(v[round(start / SLICE) : len(v) if end == math.inf else round(end / SLICE)])

    def rate(self, bucket: str, start: float, end: float) -> float:
        return self.total(bucket, start, end) / (end - start)

    def per_second(self, bucket: str) -> list[int]:
        v = self.slices[bucket]
        per = round(1 / SLICE)
        return [sum(v[k : k + per]) for k in range(0, len(v) - per + 1, per)]


def simulate(
    buckets: dict[str, dict[str, Any]],
    clients: list[Clients],
    *,
    workers: int,
    seconds: float,
    capacity: int | None = 10_000,
    delay: float = 0.001,
    ideal: bool = False,
    die: dict[int, float] | None = None,
    tell: bool = True,
) -> Result:
    """Run the clients for ``seconds``; ``ideal``: one non-leased throttle takes every
    client. ``die[i] = t``: worker i stops at t (the supervisor is told after ``delay``
    if ``tell``, else it notices the silence)."""
    clock = FakeClock()
    n = 1 if ideal else workers

    def throttle() -> TenantThrottle:
        th = TenantThrottle(clock, capacity=capacity, slice_secs=SLICE)
        for name, props in buckets.items():
            th.add_bucket(name, **props)
        return th

    ths = [throttle() for _ in range(n)]
    allocator = None if ideal else QuotaAllocator(throttle().props())
    events: set[int] = set()
    die = die or {}
    dead: set[int] = set()
    queue: list[tuple[float, int, str, int, bytes]] = []
    seq = 0
    result = Result({b: [0] * round(seconds / SLICE) for b in buckets}, allocator)

    def send(at: float, kind: str, worker: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (at + delay, seq, kind, worker, msgpack.packb(payload)))

    if not ideal:
        for i, th in enumerate(ths):
            th.apply_lease({}, workers=n)
            th.on_demand_event = lambda i=i: events.add(i)  # type: ignore[misc]
    next_report = [(i + 0.5) * SLICE / n for i in range(n)]
    steps = round(seconds / TICK)
    for k in range(steps):
        now = clock.t = k * TICK
        slot = int(now / SLICE + 1e-9)
        for i, t in die.items():
            if now >= t and i not in dead:
                dead.add(i)
                if tell:
                    send(now, "forget", i, None)
        while queue and queue[0][0] <= now + 1e-9:
            _, _, kind, i, raw = heapq.heappop(queue)
            assert allocator is not None
            if kind == "report":
                lease = allocator.report(f"w{i}", usage_from_wire(msgpack.unpackb(raw)), now)
                send(now, "lease", i, lease_to_wire(lease))
                for other, pushed in allocator.pending().items():
                    result.pushed += 1
                    send(now, "lease", int(other[1:]), lease_to_wire(pushed))
            elif kind == "forget":
                allocator.forget(f"w{i}")
            elif i not in dead:
                lease = lease_from_wire(msgpack.unpackb(raw))
                ths[i].apply_lease(lease)
                result.leases.append((now, i, lease))
                for c in clients:  # the gate wakes its waiters to re-check
                    if c.worker == i:
                        c.retry_at = now
        for c in clients:
            w = 0 if ideal else c.worker
            if w in dead:
                continue
            th = ths[w]
            if not c.open:
                if c.start <= now < c.stop:
                    c.open = True
                    for _ in range(c.connections):
                        th.connection_opened(c.bucket)
                else:
                    continue
            elif now >= c.stop:
                c.open = False
                for _ in range(c.connections):
                    th.connection_closed(c.bucket)
                continue
            if c.write_cost:
                while c.flying and c.flying[0] <= now + 1e-9:
                    c.flying.pop(0)
                    th.charge(c.bucket, 0, c.write_cost // 2, reserved=c.write_cost, now=now)
                while now >= c.retry_at and len(c.flying) < c.connections * c.in_flight:
                    wait = th.write_wait(c.bucket, c.write_cost)
                    if wait > 0.0:
                        c.retry_at = now + wait
                        break
                    assert th.reserve(c.bucket, c.write_cost) == c.write_cost
                    c.flying.append(now + WRITE_LATENCY)
                    result.slices[c.bucket][slot] += c.write_cost
                continue
            if c.rate is None:
                want = c.connections * CLIENT_MAX * TICK
            else:
                c.backlog = min(c.backlog + c.rate * TICK, c.rate * TICK + 1.0)  # no hoarding
                want = c.backlog
            if now < c.retry_at:
                continue
            got = 0
            while want - got >= 1.0:
                wait = th.admission_wait(c.bucket)
                if wait > 0.0:
                    c.retry_at = now + wait
                    break
                allowance = th.run_allowance(c.bucket)
                run = int(want - got) if allowance == math.inf else max(1, math.ceil(allowance))
                run = min(run, int(want - got))
                th.charge(c.bucket, run, 0, now=now)
                got += run
            if c.rate is not None:
                c.backlog -= got
            result.slices[c.bucket][slot] += got
        if ideal:
            continue
        for i in range(n):
            if i in dead:
                continue
            if now >= next_report[i] or i in events:
                if now >= next_report[i]:
                    next_report[i] += SLICE
                events.discard(i)
                send(now, "report", i, usage_to_wire(ths[i].usage()))
    return result


def jain(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def spread(bucket: str, connections: int, workers: int, **kw: Any) -> list[Clients]:
    """``connections`` of ``bucket`` spread as evenly as possible over the workers;
    a ``rate`` is split in proportion."""
    rate = kw.pop("rate", None)
    out = []
    for w in range(workers):
        c = connections // workers + (1 if w < connections % workers else 0)
        if c:
            r = None if rate is None else rate * c / connections
            out.append(Clients(bucket, w, c, r, **kw))
    return out


def both(make: Any, **kw: Any) -> tuple[Result, Result]:
    """The scenario with leases and on the ideal single throttle (fresh clients each)."""
    buckets, clients = make()
    leased = simulate(buckets, clients, **kw)
    buckets, clients = make()
    return leased, simulate(buckets, clients, ideal=True, **kw)


# --------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_hard_limit_holds_within_3_percent(workers: int) -> None:
    # Offered 3x its hard limit from every worker, next to a bucket filling the node.
    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return (
            {"H": {"hard_limit": 2000}, "F": {}},
            spread("H", 2 * workers, workers, rate=6000.0) + spread("F", workers, workers),
        )

    leased, ideal = both(make, workers=workers, seconds=10.0, capacity=20_000)
    total = leased.total("H")
    assert abs(total - 20_000) <= 0.03 * 20_000, (total, ideal.total("H"))
    assert max(leased.per_second("H")[1:]) <= 2000 * 1.03, leased.per_second("H")
    # The node as a whole is still work-conserving: F gets the rest.
    assert leased.total("F", 1.0) >= 0.97 * ideal.total("F", 1.0)


def slope(result: Result, bucket: str) -> float:
    """Least-squares slope of the bucket's cumulative admitted units (units/s): its
    steady rate, free of where a window's edges cut a write of seconds of cost."""
    points, total = [], 0
    for k, n in enumerate(result.slices[bucket]):
        total += n
        points.append(((k + 1) * SLICE, total))
    mx = sum(t for t, _ in points) / len(points)
    my = sum(u for _, u in points) / len(points)
    sxy = sum((t - mx) * (u - my) for t, u in points)
    return sxy / sum((t - mx) ** 2 for t, _ in points)


@pytest.mark.parametrize("cost", [202, 402])  # 400 KB and 800 KB values
@pytest.mark.parametrize("workers", [1, 2])
def test_writes_in_flight_keep_to_the_hard_limit_across_workers(workers: int, cost: int) -> None:
    """8 connections x 4 large writes in flight at hard limit 100 got 8.9-9.8x the
    limit on --workers 2: admitted while a worker's counter was positive, charged
    once durable, the excess forgiven. Each worker admits a write at its cost
    against its share and reserves it at once: the node keeps to the limit."""
    result = simulate(
        {"W": {"hard_limit": 100, "reserved": 0}},
        spread("W", 8, workers, write_cost=cost),
        workers=workers,
        seconds=40.0,
        capacity=None,
    )
    total = result.total("W")
    # At most the limit over the time plus, per worker, one slice and one write.
    assert total <= 100 * 40 + workers * (10 + cost), total
    assert slope(result, "W") <= 100 * 1.03, slope(result, "W")
    assert total >= 100 * 40 * 0.9  # and the bucket gets its limit


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_reservation_holds_under_a_10x_neighbour_on_another_worker(workers: int) -> None:
    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        # R on worker 0; the neighbour's connections on every other worker.
        neighbour = spread("N", 8 * (workers - 1), workers - 1, rate=20_000.0)
        for c in neighbour:
            c.worker += 1
        return {"R": {"reserved": 2000}, "N": {}}, [Clients("R", 0, 1, 2000.0), *neighbour]

    leased, ideal = both(make, workers=workers, seconds=10.0)
    got = leased.rate("R", 0.0, 10.0)
    assert got >= 0.97 * 2000, (got, ideal.rate("R", 0.0, 10.0))
    node = [r + n for r, n in zip(leased.per_second("R"), leased.per_second("N"), strict=True)]
    assert max(node[1:]) <= 10_000 * 1.03, node
    # What R leaves of its headroom is lent to N across workers, as one process spills it.
    assert leased.rate("N", 1.0, 10.0) >= 0.97 * ideal.rate("N", 1.0, 10.0)


@pytest.mark.parametrize("delay", [0.005, 0.02])
def test_limits_hold_with_slower_messages(delay: float) -> None:
    # 4 workers; the hard-limited bucket and the reserved one, messages 5 / 20 ms each way.
    buckets = {"H": {"hard_limit": 2000}, "R": {"reserved": 2000}, "N": {}}
    clients = [
        *spread("H", 8, 4, rate=6000.0),
        Clients("R", 0, 1, 2000.0),
        *spread("N", 6, 3, rate=20_000.0),
    ]
    for c in clients[-3:]:
        c.worker += 1
    r = simulate(buckets, clients, workers=4, seconds=6.0, delay=delay)
    assert abs(r.total("H") - 12_000) <= 0.03 * 12_000
    assert max(r.per_second("H")[1:]) <= 2000 * 1.03
    assert r.rate("R", 0.0, 6.0) >= 0.97 * 2000


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_one_connection_and_64_connections_share_fairly(workers: int) -> None:
    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return {"one": {}, "many": {}}, [Clients("one", 0), *spread("many", 64, workers)]

    leased, ideal = both(make, workers=workers, seconds=6.0)
    rates = [leased.rate("one", 1.0, 6.0), leased.rate("many", 1.0, 6.0)]
    assert jain(rates) >= 0.99, rates
    assert sum(rates) == pytest.approx(10_000, rel=0.03), rates
    assert jain([ideal.rate("one", 1.0, 6.0), ideal.rate("many", 1.0, 6.0)]) >= 0.99


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_skewed_placement_follows_demand_not_connections(workers: int) -> None:
    # 90 % of R's connections sit nearly idle on worker 0; its one busy connection is
    # on the last worker, next to a neighbour wanting the whole node.
    last = workers - 1

    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return (
            {"R": {"reserved": 3000}, "N": {}},
            [
                Clients("R", 0, 9, 100.0),
                Clients("R", last, 1),
                *spread("N", 4 * workers, workers),
            ],
        )

    leased, ideal = both(make, workers=workers, seconds=6.0)
    got, want = leased.rate("R", 1.0, 6.0), ideal.rate("R", 1.0, 6.0)
    assert got >= 0.97 * want, (got, want)
    assert got >= 0.97 * 3000
    total = got + leased.rate("N", 1.0, 6.0)
    assert total == pytest.approx(10_000, rel=0.03)


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_bursts_track_the_ideal(workers: int) -> None:
    # B bursts for 0.5 s every 1.5 s on one worker; A runs steadily on the others.
    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        bursts = [
            Clients("B", 0, 4, None, start=1.0 + 1.5 * k, stop=1.5 + 1.5 * k) for k in range(5)
        ]
        return {"A": {"reserved": 1000}, "B": {}}, [
            *spread("A", 4 * workers, workers, rate=6000.0),
            *bursts,
        ]

    leased, ideal = both(make, workers=workers, seconds=8.0)
    node = [a + b for a, b in zip(leased.slices["A"], leased.slices["B"], strict=True)]
    ideal_node = [a + b for a, b in zip(ideal.slices["A"], ideal.slices["B"], strict=True)]
    # Work-conserving but for the node's spare: one slice of unused free pool that
    # the ideal hands a new burst at once stays, under leases, with the worker
    # that left it unused (its own buckets spend it later).
    assert sum(node[10:]) >= 0.92 * sum(ideal_node[10:]), (sum(node), sum(ideal_node))
    per_sec = [sum(node[k : k + 10]) for k in range(len(node) - 9)]  # every 1 s window
    assert max(per_sec[10:]) <= 10_000 * 1.03, max(per_sec)
    for k in range(5):
        # From the second slice of each burst B runs at its share, as in the ideal.
        burst = range(11 + 15 * k, 15 + 15 * k)
        got = [leased.slices["B"][s] for s in burst]
        want = [ideal.slices["B"][s] for s in burst]
        assert min(got) >= 0.97 * min(want), (k, got, want)
        # Its first slice gets at least that share (the ideal adds the node's spare).
        assert leased.slices["B"][10 + 15 * k] >= 0.97 * min(want)


@pytest.mark.parametrize("tell", [True, False])
def test_a_dead_workers_share_returns_within_3_slices(tell: bool) -> None:
    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return {"H": {"hard_limit": 4000}, "F": {}}, [*spread("H", 8, 4), *spread("F", 4, 4)]

    buckets, clients = make()
    r = simulate(buckets, clients, workers=4, seconds=8.0, die={0: 4.03}, tell=tell)
    # The hard limit is never exceeded, before, during or after the death.
    per_sec = [sum(r.slices["H"][k : k + 10]) for k in range(len(r.slices["H"]) - 9)]
    assert max(per_sec[10:]) <= 4000 * 1.03, max(per_sec)
    # Within 3 slices of the death the survivors run H at the whole hard limit again.
    back = 4.0 + 4 * SLICE
    assert r.slices["H"][round(back / SLICE)] >= 0.97 * 400, r.slices["H"][38:48]
    assert r.rate("H", back, 8.0) >= 0.97 * 4000
    assert r.allocator is not None and r.allocator.workers == ["w1", "w2", "w3"]


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_slow_start_first_connection_gets_its_reservation_within_a_slice(workers: int) -> None:
    delay = 0.002
    opened = 3.05

    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return (
            {"S": {"reserved": 4000}, "B": {}},
            [
                Clients("S", workers - 1, 1, 4000.0, start=opened),
                *spread("B", 2 * workers, workers),
            ],
        )

    leased, ideal = both(make, workers=workers, seconds=5.0, delay=delay)
    # Before: S keeps 10 % of its reservation, the rest went to B.
    assert leased.rate("B", 1.0, 3.0) == pytest.approx(9600, rel=0.03)
    # From one slice plus the round trip after its first connection, S runs at 4000/s.
    first = math.ceil((opened + SLICE + 2 * delay) / SLICE)
    got = leased.slices["S"][first : round(5.0 / SLICE)]
    assert min(got) >= 0.97 * 400, (got, ideal.slices["S"][30:40])


@pytest.mark.parametrize("workers", [2, 4, 16])
def test_provisional_shares_stay_within_their_bound(workers: int) -> None:
    # Every worker gets the bucket's first connections at once while the leases
    # take 30 ms each way: they run on their provisional 1/N until the answer.
    delay = 0.03

    def make() -> tuple[dict[str, dict[str, Any]], list[Clients]]:
        return {"H": {"hard_limit": 1000}}, spread("H", workers, workers, start=1.0)

    buckets, clients = make()
    r = simulate(buckets, clients, workers=workers, seconds=3.0, capacity=None, delay=delay)
    # Bound: at most one hard limit more than the limit itself, for one round trip
    # plus one slice of counter: <= H x (T + slice) + H x (2 delay + slice).
    first = r.total("H", 1.0, 1.5)
    assert first <= 1000 * (0.5 + SLICE) + 1000 * (2 * delay + SLICE), first
    assert abs(r.total("H", 1.0, 3.0) - 2000) <= 0.03 * 2000 + 1000 * (2 * delay + SLICE)
    # ... and what one worker runs provisionally is 1/N of the limit.
    th = TenantThrottle(FakeClock(), slice_secs=SLICE)
    th.add_bucket("H", hard_limit=1000)
    th.apply_lease({}, workers=workers)
    th.connection_opened("H")
    assert th.statistics().buckets["H"].allowance_rate == pytest.approx(1000 / workers)


def test_a_leased_wait_is_never_predicted_past_the_next_lease() -> None:
    """A worker whose share of a bucket is 0 (a new connection, before its lease)
    refuses a non-blocking request with a hint of at most a slice, not the
    'no end in sight' of a zero rate; a hard limit of 0 is still 'never'."""
    clock = FakeClock(10.0)
    th = TenantThrottle(clock, slice_secs=SLICE)
    th.add_bucket("H", hard_limit=1000)
    th.add_bucket("Z", hard_limit=0)
    th.apply_lease({"H": BucketLease(0.0, 0.0, 0.0), "Z": BucketLease(0.0, 0.0, 0.0)}, workers=2)
    th.connection_opened("H")
    th.charge("H", 50, 0)  # the counters run dry
    wait = th.admission_wait("H")
    assert 0.0 < wait <= SLICE + 0.01, wait
    assert th.admission_wait("Z") == math.inf
    # Without a lease (one process) a zero rate really has no end in sight.
    one = TenantThrottle(clock, slice_secs=SLICE)
    one.add_bucket("H", hard_limit=1000)
    one.charge("H", 500, 0)
    assert one.admission_wait("H") > SLICE


# --------------------------------------------------------------------------- the allocator


def allocator(capacity: int | None = 10_000, **buckets: dict[str, Any]) -> QuotaAllocator:
    return QuotaAllocator(props(capacity, **buckets))


def props(capacity: int | None = 10_000, **buckets: dict[str, Any]) -> ThrottleProps:
    """The properties a throttle with these buckets has (the allocator's input)."""
    th = TenantThrottle(FakeClock(), capacity=capacity, slice_secs=SLICE)
    for name, bucket in buckets.items():
        th.add_bucket(name, **bucket)
    return th.props()


def use(
    connections: int = 1, hungry: bool = False, demand: float = 0.0, unthrottled: float = 0.0
) -> BucketUse:
    return BucketUse(connections, hungry, demand, unthrottled)


def test_node_rates_are_the_single_process_allocation() -> None:
    qa = allocator(A={"reserved": 2000}, B={"hard_limit": 3000})
    qa.report("w0", {"A": use(1, True), "B": use(2, demand=100.0)}, 0.0)
    qa.report("w1", {"A": use(3, False, 500.0), "B": use(1, True)}, 0.0)
    needs = [
        RateNeed(2000, math.inf, 1.0, True, True, 500.0, 0.0),
        RateNeed(0, 3000.0, 1.0, True, True, 100.0, 0.0),
    ]
    want = allocate_rates(10_000, needs, SLICE)
    stats = qa.statistics()["buckets"]
    assert stats["A"]["node_rate"] == pytest.approx(want.rates[0])
    assert stats["B"]["node_rate"] == pytest.approx(want.rates[1])
    for name in ("A", "B"):
        assert sum(stats[name]["shares"].values()) == pytest.approx(stats[name]["node_rate"])


def test_split_caps_by_demand_unless_hungry_then_by_connections() -> None:
    qa = allocator(A={"reserved": 0, "hard_limit": 9000})
    qa.report("w0", {"A": use(9, demand=100.0)}, 0.0)
    qa.report("w1", {"A": use(1, hungry=True, demand=1000.0)}, 0.0)
    l0, l1 = qa.lease("w0")["A"], qa.lease("w1")["A"]
    assert l0.rate == pytest.approx(1.25 * 100 + 10)  # its demand + headroom
    assert l0.rate + l1.rate == pytest.approx(9000)  # A is hungry: the whole hard limit
    assert l0.hard_rate + l1.hard_rate == pytest.approx(9000)
    # Nobody hungry: what the caps leave goes by connections (no event: the
    # allocation waits for the next slice, then applies).
    qa.report("w1", {"A": use(1, demand=100.0)}, 0.05)
    assert qa.lease("w1")["A"] == l1
    qa.report("w1", {"A": use(1, demand=100.0)}, 0.1)
    l0, l1 = qa.lease("w0")["A"], qa.lease("w1")["A"]
    assert l0.rate + l1.rate == pytest.approx(qa.statistics()["buckets"]["A"]["node_rate"])
    assert l0.rate > l1.rate


def test_events_and_invalidate_reallocate_at_once() -> None:
    qa = allocator(A={}, B={})
    qa.report("w0", {"A": use(1, True), "B": use(1, True)}, 0.0)
    assert qa.lease("w0")["A"].rate == pytest.approx(5000)
    # Within the slice and with no event, a report gets the last lease...
    qa.props = props(A={"hard_limit": 1000}, B={})
    qa.report("w0", {"A": use(1, True), "B": use(1, True)}, 0.01)
    assert qa.lease("w0")["A"].rate == pytest.approx(5000)
    qa.invalidate()  # ... and a new one at once when the caller says so
    qa.report("w0", {"A": use(1, True), "B": use(1, True)}, 0.02)
    assert qa.lease("w0")["A"].rate == pytest.approx(1000)
    qa.set_props(props(A={"hard_limit": 2000}, B={}))  # new properties: at once too
    qa.report("w0", {"A": use(1, True), "B": use(1, True)}, 0.03)
    assert qa.lease("w0")["A"].rate == pytest.approx(2000)
    # A bucket newly hungry on a worker is an event: reallocated at once.
    qa.report("w1", {"B": use(1)}, 0.04)
    lease = qa.report("w1", {"B": use(1, True)}, 0.05)
    assert lease["B"].rate + qa.lease("w0")["B"].rate == pytest.approx(8000)
    assert set(qa.pending()) == {"w0"}  # w0's B share moved: push it
    assert qa.pending() == {}


def test_unused_bucket_is_left_out_of_the_lease_and_unlimited_stays_unlimited() -> None:
    qa = allocator(capacity=None, A={}, B={"hard_limit": 100})
    lease = qa.report("w0", {"A": use(1), "B": use(0)}, 0.0)
    assert lease == {"A": BucketLease(math.inf, math.inf, math.inf)}


def test_forget_and_silence_drop_a_worker() -> None:
    qa = allocator(A={})
    for w in ("w0", "w1", "w2"):
        qa.report(w, {"A": use(1, True)}, 0.0)
    assert qa.lease("w0")["A"].rate == pytest.approx(10_000 / 3)
    qa.forget("w2")
    assert qa.report("w0", {"A": use(1, True)}, 0.1)["A"].rate == pytest.approx(5000)
    # w1 last reported at 0.0: after 3 more slices of w0's reports it is gone.
    for t in (0.2, 0.3):
        assert qa.report("w0", {"A": use(1, True)}, t)["A"].rate == pytest.approx(5000)
    assert qa.report("w0", {"A": use(1, True)}, 0.31)["A"].rate == pytest.approx(10_000)
    assert qa.workers == ["w0"]
    assert qa.lease("w1") == {}


def test_a_late_allocator_forgets_nobody() -> None:
    """Reports wait in the queue while the allocator's process is held up (a
    loaded machine): the first one handled after the hold-up must not find the
    others silent, or its worker would get their shares while they still spend
    their leases (the node over its hard limit until the push)."""
    qa = allocator(A={"reserved": 0, "hard_limit": 2000})
    sent = {}
    t = 0.0
    for _ in range(10):
        for w in ("w0", "w1"):
            sent[w] = qa.report(w, {"A": use(4, True, 3000.0)}, t)
            t += SLICE / 2
    t += 4 * SLICE  # the hold-up: both workers' next reports wait in the queue
    sent["w0"] = qa.report("w0", {"A": use(4, True, 3000.0)}, t)
    assert sent["w0"]["A"].hard_rate + sent["w1"]["A"].hard_rate <= 2000 * 1.0001
    assert qa.workers == ["w0", "w1"]
    # A worker that is really silent is still dropped after 3 slices of the other's reports.
    for _ in range(4):
        t += SLICE
        sent["w0"] = qa.report("w0", {"A": use(4, True, 3000.0)}, t)
    assert qa.workers == ["w0"] and sent["w0"]["A"].hard_rate == pytest.approx(2000)


def test_unthrottled_use_is_set_aside_for_its_worker() -> None:
    qa = allocator(A={})
    qa.report("w0", {"A": use(1, True, 3000.0, unthrottled=3000.0)}, 0.0)
    qa.report("w1", {"A": use(50, True, 9000.0)}, 0.0)
    assert qa.lease("w0")["A"].rate >= 3000


def test_leased_throttle_runs_its_share_and_reports_events() -> None:
    clock = FakeClock()
    th = TenantThrottle(clock, capacity=10_000, slice_secs=SLICE)
    th.add_bucket("A", reserved=1000)
    calls: list[int] = []
    th.on_demand_event = lambda: calls.append(1)
    th.connection_opened("A")  # not leased yet: no event
    assert not th.leased and calls == []
    th.apply_lease({"A": BucketLease(500.0, 250.0, math.inf)})
    assert th.leased
    assert th.statistics().buckets["A"].allowance_rate == 500.0
    assert th.statistics().buckets["A"].effective_reserved == 250.0
    clock.t = 0.05
    used = 0
    while th.admission_wait("A") == 0.0:
        th.charge("A", 1, 0)
        used += 1
    assert used == 50  # one slice of the leased rate (credited pro rata at the lease)
    assert calls == [1]  # newly hungry
    u = th.usage()["A"]
    assert u.hungry and u.connections == 1
    th.add_bucket("B")
    th.connection_opened("B")
    assert calls == [1, 1]  # first connection


# --------------------------------------------------------------------------- wire


def test_wire_round_trip() -> None:
    usage = {"a": BucketUse(3, True, 12.5, 0.0), "b": BucketUse(0, False, 0.0, 1.0)}
    lease = {"a": BucketLease(100.0, 0.0, math.inf), "b": BucketLease(math.inf, math.inf, math.inf)}
    for _ in range(2):  # msgpack keeps inf
        assert usage_from_wire(msgpack.unpackb(msgpack.packb(usage_to_wire(usage)))) == usage
        assert lease_from_wire(msgpack.unpackb(msgpack.packb(lease_to_wire(lease)))) == lease
        assert (
            lease_from_wire(msgpack.unpackb(msgpack.packb(lease_to_wire(lease)), use_list=False))
            == lease
        )


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ([], "expected a map"),
        ({"v": 2, "buckets": {}}, "unsupported version"),
        ({"v": 1}, "'buckets' must be a map"),
        ({"v": 1, "buckets": {"": [1, True, 0.0, 0.0]}}, "non-empty string"),
        ({"v": 1, "buckets": {"a": [1, True, 0.0]}}, "expected 4 fields"),
        ({"v": 1, "buckets": {"a": [-1, True, 0.0, 0.0]}}, "connections"),
        ({"v": 1, "buckets": {"a": [True, True, 0.0, 0.0]}}, "connections"),
        ({"v": 1, "buckets": {"a": [1, 1, 0.0, 0.0]}}, "hungry"),
        ({"v": 1, "buckets": {"a": [1, True, math.nan, 0.0]}}, "demand"),
        ({"v": 1, "buckets": {"a": [1, True, math.inf, 0.0]}}, "demand"),
        ({"v": 1, "buckets": {"a": [1, True, 0.0, "x"]}}, "unthrottled"),
    ],
)
def test_malformed_reports_are_refused(message: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        usage_from_wire(message)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (None, "expected a map"),
        ({"v": 1, "buckets": []}, "'buckets' must be a map"),
        ({"v": 1, "buckets": {"a": [1.0, 1.0]}}, "expected 3 fields"),
        ({"v": 1, "buckets": {"a": [-1.0, 0.0, 0.0]}}, "rate"),
        ({"v": 1, "buckets": {"a": [1.0, math.nan, 0.0]}}, "reserved_rate"),
        ({"v": 1, "buckets": {"a": [1.0, 0.0, "inf"]}}, "hard_rate"),
    ],
)
def test_malformed_leases_are_refused(message: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        lease_from_wire(message)
