"""The tenant throttle: pure logic on a fake clock, the Trio adapter on autojump time.

Load is simulated per bucket over whole seconds: an *offered* bucket brings a
steady number of units per second (what it cannot run is dropped, as a
rejected client would), a *saturating* bucket (``None``) keeps asking until it
is throttled. Rates are averaged over whole seconds after a warm-up.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantkv.admission.rate_allocation import water_fill
from tenantkv.admission.tenant_throttle import TenantThrottle, read_units, write_units
from tenantkv.admission.throttle_counters import BucketCounters, refill
from tenantkv.admission.throttle_gate import TenantThrottleGate
from tenantkv.admission.throttle_stats import WAIT_HISTOGRAM_BOUNDS_US
from tenantkv.errors import (
    BadValue,
    BucketExists,
    BucketNotFound,
    DeadlineExceeded,
    HardLimitZero,
    ServerError,
    Throttled,
)
from tests.conftest import FakeClock

# --------------------------------------------------------------------------- helpers


def make(**kw: object) -> tuple[TenantThrottle, FakeClock]:
    clock = FakeClock()
    return TenantThrottle(clock, **kw), clock  # type: ignore[arg-type]


def add(th: TenantThrottle, name: str, *, connect: bool = True, **kw: object) -> None:
    th.add_bucket(name, **kw)  # type: ignore[arg-type]
    if connect:
        th.connection_opened(name)


def simulate(
    th: TenantThrottle,
    clock: FakeClock,
    offered: dict[str, float | None],
    seconds: int,
    *,
    tick: float = 0.01,
    cost: int | dict[str, int] = 10,
) -> dict[str, list[int]]:
    """Run ``seconds`` of load from ``clock.t``; return admitted units per whole second."""
    start = clock.t
    costs = cost if isinstance(cost, dict) else dict.fromkeys(offered, cost)
    backlog = dict.fromkeys(offered, 0.0)
    per_sec = {b: [0] * seconds for b in offered}
    names = list(offered)
    steps = round(seconds / tick)
    for step in range(steps):
        clock.t = start + step * tick
        sec = int(step * tick + 1e-9)
        k = step % len(names)  # rotate who asks first
        for b in names[k:] + names[:k]:
            c = costs[b]
            rate = offered[b]
            if rate is None:
                for _ in range(100_000):
                    if th.admission_wait(b) != 0.0:
                        break
                    th.charge(b, c, 0)
                    per_sec[b][sec] += c
            else:
                backlog[b] = min(backlog[b] + rate * tick, rate * tick + c)  # no hoarding
                while backlog[b] >= c and th.admission_wait(b) == 0.0:
                    th.charge(b, c, 0)
                    per_sec[b][sec] += c
                    backlog[b] -= c
    clock.t = start + seconds
    return per_sec


def mean_rate(per_sec: dict[str, list[int]], warmup: int = 2) -> dict[str, float]:
    return {b: sum(v[warmup:]) / (len(v) - warmup) for b, v in per_sec.items()}


def jain(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def retry_ms(exc: ServerError) -> int:
    assert exc.retry_after_ms is not None
    return exc.retry_after_ms


def near(value: float, target: float, rel: float = 0.02) -> bool:
    return abs(value - target) <= rel * target


# --------------------------------------------------------------------------- metering


def test_units_round_up_per_4k() -> None:
    assert read_units(0) == 0
    assert read_units(1) == 1
    assert read_units(4096) == 1
    assert read_units(4097) == 2
    assert write_units(0) == 0
    assert write_units(8192) == 2
    assert write_units(8193) == 3
    assert read_units(100, unit_size=10) == 10
    with pytest.raises(ValueError):
        read_units(-1)


def test_charge_counts_units_and_weighted_cost() -> None:
    th, _ = make(write_weight=3)
    add(th, "a", hard_limit=1_000_000)
    th.charge("a", 2, 5)
    th.charge("a", 1, 1)
    stats = th.statistics()
    b = stats.buckets["a"]
    assert (b.ru_total, b.wu_total) == (3, 6)
    assert b.units_used_window == (2 + 3 * 5) + (1 + 3 * 1)
    assert (stats.node.ru_total, stats.node.wu_total) == (3, 6)
    th.charge("gone", 4, 4)  # a bucket removed mid-operation: node totals only
    assert th.statistics().node.ru_total == 7


# --------------------------------------------------------------------------- properties


def test_default_node_is_unlimited_and_disabled() -> None:
    th, clock = make()
    add(th, "a")
    assert th.capacity is None
    assert not th.enabled
    for _ in range(1000):
        assert th.admission_wait("a") == 0.0
        th.charge("a", 1000, 1000)
    clock.t = 3.0
    assert th.admission_wait("a") == 0.0


def test_enabled_by_capacity_or_finite_hard_limit() -> None:
    th, _ = make()
    add(th, "a", reserved=100)  # a reservation of an unlimited node does not matter
    assert not th.enabled
    add(th, "b", hard_limit=100)
    assert th.enabled
    th.set_bucket("b", hard_limit=None)
    assert not th.enabled
    th.set_node(capacity=10)
    assert th.enabled


def test_bucket_defaults_come_from_node() -> None:
    th, _ = make(capacity=10_000, default_reserved=1666, default_hard_limit=5000)
    add(th, "a")
    assert th.bucket_limits("a") == (1666, 5000)
    th.set_node(default_reserved=0, default_hard_limit=None)
    assert th.bucket_limits("a") == (1666, 5000)  # defaults apply at creation
    add(th, "b", hard_limit=7)
    assert th.bucket_limits("b") == (0, 7)
    assert th.node_limits() == (10_000, 0, None)


def test_config_validation() -> None:
    th, _ = make(capacity=10_000)
    add(th, "a", reserved=100, hard_limit=200)
    with pytest.raises(BadValue, match="reserved can't exceed hard limit"):
        th.set_bucket("a", reserved=300)
    with pytest.raises(BadValue, match="reserved can't exceed hard limit"):
        th.set_bucket("a", hard_limit=50)
    with pytest.raises(BadValue, match="reserved can't exceed hard limit"):
        th.add_bucket("b", reserved=10, hard_limit=5)
    with pytest.raises(BadValue, match="reserved can't exceed hard limit"):
        th.set_node(default_reserved=10, default_hard_limit=5)
    with pytest.raises(BadValue):
        th.set_node(capacity=-1)
    with pytest.raises(BadValue):
        th.set_bucket("a", hard_limit=True)
    with pytest.raises(BadValue):
        th.set_bucket("a", weight=0)
    with pytest.raises(BucketExists):
        th.add_bucket("a")
    with pytest.raises(BucketNotFound):
        th.set_bucket("nope", reserved=1)
    with pytest.raises(BucketNotFound):
        th.admission_wait("nope")
    assert th.bucket_limits("a") == (100, 200)  # failed calls changed nothing
    th.remove_bucket("a")
    with pytest.raises(BucketNotFound):
        th.admission_wait("a")


def test_water_fill_is_max_min_fair() -> None:
    assert water_fill(90, [10, math.inf, math.inf], [1, 1, 1]) == [10, 40, 40]
    assert water_fill(90, [100, 100], [2, 1]) == [60, 30]
    assert water_fill(10, [3, 3], [1, 1]) == [3, 3]  # everyone satisfied, rest unused
    assert water_fill(0, [3], [1]) == [0.0]
    assert water_fill(5, [], []) == []


# --------------------------------------------------------------------------- the examples


def two_buckets_2000_8000() -> tuple[TenantThrottle, FakeClock]:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=2000, hard_limit=8000)
    add(th, "B", reserved=2000, hard_limit=8000)
    return th, clock


def test_example_a_using_3000_leaves_7000_for_b() -> None:
    th, clock = two_buckets_2000_8000()
    got = mean_rate(simulate(th, clock, {"A": 3000, "B": None}, 10))
    assert near(got["A"], 3000, 0.01)
    assert near(got["B"], 7000)


def test_example_a_using_3000_random_arrivals() -> None:
    """Same, with Poisson arrivals and random op sizes (1..19 units)."""
    th, clock = two_buckets_2000_8000()
    rnd = random.Random(7)
    events = [(0.0005, "B"), (rnd.expovariate(300), "A")]
    got = {"A": 0, "B": 0}
    while True:
        events.sort()
        t, b = events.pop(0)
        if t >= 10.0:
            break
        clock.t = t
        cost = rnd.randint(1, 19)
        wait = th.admission_wait(b)
        if wait == 0.0:
            th.charge(b, cost, 0)
            got[b] += cost if t >= 2.0 else 0
        if b == "B":
            events.append((t + (0.0005 if wait == 0.0 else wait), b))
        else:
            events.append((t + rnd.expovariate(300), b))
    a, b_ = got["A"] / 8, got["B"] / 8
    assert near(a, 3000, 0.05)  # Poisson noise in what A offers
    assert a + b_ >= 0.97 * 10_000  # the rest goes to B: work-conserving
    assert b_ <= 8000


def test_example_a_idle_b_reaches_hard_limit() -> None:
    th, clock = two_buckets_2000_8000()
    got = mean_rate(simulate(th, clock, {"A": 0, "B": None}, 10))
    assert near(got["B"], 8000)
    assert got["B"] <= 8000 * 1.005


def test_example_b_at_6000_a_can_use_4000() -> None:
    th, clock = two_buckets_2000_8000()
    got = mean_rate(simulate(th, clock, {"A": 4000, "B": 6000}, 10))
    assert near(got["A"], 4000)
    assert near(got["B"], 6000)


def test_example_b_at_6000_a_saturating_splits_the_free_pool_fairly() -> None:
    """Under contention the free pool is shared max-min fairly: both buckets want
    more than their 3000 share of it, so each gets reservation + 3000 = 5000
    (Couchbase's first-come sharing would give B its 6000 and A 4000)."""
    th, clock = two_buckets_2000_8000()
    got = mean_rate(simulate(th, clock, {"A": None, "B": 6000}, 10))
    assert near(got["A"], 5000)
    assert near(got["B"], 5000)
    assert got["A"] + got["B"] <= 10_000 * 1.005


def test_example_c_without_reservation_gets_the_free_pool() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=3000, hard_limit=6000)
    add(th, "B", reserved=2000, hard_limit=5000)
    add(th, "C", reserved=0, hard_limit=None)
    got = mean_rate(simulate(th, clock, {"A": 0, "B": 0, "C": None}, 10))
    assert near(got["C"], 5000)
    assert got["C"] <= 5000 * 1.005


# --------------------------------------------------------------------------- each rule


def test_reservation_runs_even_when_free_pool_is_exhausted() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=2000)
    add(th, "B")  # no reservation, eats the free pool
    got = mean_rate(simulate(th, clock, {"A": 1500, "B": None}, 8))
    assert near(got["A"], 1500, 0.01)
    # The 500 A leaves unused are not lent: a reservation is there when wanted.
    assert near(got["B"], 8000)


def test_reserved_bucket_gets_reservation_plus_fair_share() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=6000)
    add(th, "B")
    got = mean_rate(simulate(th, clock, {"A": None, "B": None}, 8))
    assert near(got["A"], 8000)
    assert near(got["B"], 2000)


def test_free_pool_exhausted_throttles_within_a_slice() -> None:
    th, clock = make(capacity=1000)
    add(th, "A")
    clock.t = 0.05
    used = 0
    while th.admission_wait("A") == 0.0:
        th.charge("A", 10, 0)
        used += 10
    assert used <= 100 + 10  # one slice of the whole node (+ one overshooting op)
    wait = th.admission_wait("A")
    assert 0 < wait <= 0.1
    clock.t += wait
    assert th.admission_wait("A") == 0.0


def test_hard_limit_accuracy_when_offered_3x() -> None:
    for capacity in (None, 100_000):
        th, clock = make(capacity=capacity)
        add(th, "A", hard_limit=1000)
        per_sec = simulate(th, clock, {"A": 3000}, 10, cost=7)
        total = sum(per_sec["A"])
        assert abs(total - 10_000) <= 0.03 * 10_000, (capacity, per_sec)
        assert all(near(x, 1000, 0.03) for x in per_sec["A"]), per_sec


def test_hard_limit_zero_is_fully_throttled() -> None:
    th, clock = make()
    add(th, "A", hard_limit=0)
    assert th.admission_wait("A") == math.inf
    clock.t = 100.0
    assert th.admission_wait("A") == math.inf
    assert th.admission_wait("A", unthrottled=True) == 0.0


def test_large_op_becomes_debt_paid_over_later_slices() -> None:
    th, clock = make()
    add(th, "A", hard_limit=1000)
    assert th.admission_wait("A") == 0.0
    th.charge("A", 5000, 0)  # 5 s worth in one op: admitted optimistically
    wait = th.admission_wait("A")
    # 4900 units of debt at 1000/s, repaid by whole slices
    assert wait == pytest.approx(5.0, abs=1e-3)
    clock.t = wait * 0.9
    assert th.admission_wait("A") > 0
    clock.t = wait
    assert th.admission_wait("A") == 0.0


def test_large_ops_honour_the_long_run_rate() -> None:
    th, clock = make()
    add(th, "A", hard_limit=1000)
    per_sec = simulate(th, clock, {"A": None}, 20, cost=3000)
    assert sum(per_sec["A"]) <= 1000 * 20 + 100 + 3000
    assert sum(per_sec["A"]) >= 1000 * 20 - 3000


def test_refill_comes_in_slices_not_whole_second_lumps() -> None:
    th, clock = make()
    add(th, "A", hard_limit=1000)
    while th.admission_wait("A") == 0.0:
        th.charge("A", 10, 0)
    admitted_at: list[float] = []
    for step in range(1, 61):  # 0.6 s in 10 ms ticks
        clock.t = step * 0.01
        while th.admission_wait("A") == 0.0:
            th.charge("A", 10, 0)
            admitted_at.append(clock.t)
    assert len(admitted_at) * 10 == 500
    per_slice = [
        sum(1 for t in admitted_at if k * 0.1 - 1e-9 <= t < (k + 1) * 0.1 - 1e-9) for k in range(6)
    ]
    assert per_slice == [0] + [10] * 5  # 100 units every 100 ms, from the next slice


def test_burst_after_idle_is_one_slice() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=2000, hard_limit=8000)
    clock.t = 5.03  # idle for 5 s
    used = 0
    while th.admission_wait("A") == 0.0:
        th.charge("A", 1, 0)
        used += 1
    # A's allowance rate is its reservation (it was idle); it turns hungry when
    # throttled, which grants its free-pool share for the rest of this slice.
    assert used <= 8000 * 0.1 + 1
    assert th.statistics().buckets["A"].hungry


def test_unthrottled_is_never_delayed_but_charged() -> None:
    th, clock = make()
    add(th, "A", hard_limit=100)
    for _ in range(50):
        assert th.admission_wait("A", unthrottled=True) == 0.0
        th.charge("A", 10, 0, unthrottled=True)
    stats = th.statistics()
    assert stats.buckets["A"].ru_total == 500
    assert stats.node.ru_total == 500
    wait = th.admission_wait("A")  # ordinary requests of the bucket pay the debt, up to 1 s
    assert 0.9 < wait <= 1.2
    clock.t = 1.0
    assert th.admission_wait("A", unthrottled=True) == 0.0


def test_unthrottled_usage_counts_against_the_node() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A")
    add(th, "B")
    start = clock.t
    got = {"A": 0, "B": 0}
    for step in range(1000):  # 10 s
        clock.t = start + step * 0.01
        for _ in range(6):  # A: 6000 units/s, all privileged
            assert th.admission_wait("A", unthrottled=True) == 0.0
            th.charge("A", 10, 0, unthrottled=True)
            got["A"] += 10 if step >= 200 else 0
        while th.admission_wait("B") == 0.0:
            th.charge("B", 10, 0)
            got["B"] += 10 if step >= 200 else 0
    assert got["A"] / 8 == 6000
    assert near(got["B"] / 8, 4000, 0.03)


def test_slow_start_lends_90_percent_of_reservation_until_connected() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=5000, connect=False)
    add(th, "B")
    assert th.statistics().buckets["A"].effective_reserved == pytest.approx(500)
    got = mean_rate(simulate(th, clock, {"A": 0, "B": None}, 4))
    assert near(got["B"], 9500)
    th.connection_opened("A")
    assert th.statistics().buckets["A"].effective_reserved == 5000
    # Within one slice A runs at its full reservation; B is back to the free pool.
    per_slice: list[int] = []
    for step in range(100):  # 1 s
        clock.t += 0.01
        if step % 10 == 0:
            per_slice.append(0)
        backlog = 50  # A offers 5000 units/s
        while backlog >= 10 and th.admission_wait("A") == 0.0:
            th.charge("A", 10, 0)
            per_slice[-1] += 10
            backlog -= 10
        while th.admission_wait("B") == 0.0:
            th.charge("B", 10, 0)
    assert all(units == 500 for units in per_slice[1:]), per_slice
    got = mean_rate(simulate(th, clock, {"A": 5000, "B": None}, 4), warmup=1)
    assert near(got["A"], 5000, 0.01)
    assert near(got["B"], 5000)
    th.connection_closed("A")
    assert th.statistics().buckets["A"].effective_reserved == pytest.approx(500)


def test_fair_share_ignores_request_size() -> None:
    th, clock = make(capacity=10_000)
    add(th, "small")
    add(th, "large")
    got = mean_rate(
        simulate(th, clock, {"small": None, "large": None}, 10, cost={"small": 1, "large": 97})
    )
    assert jain(got.values()) >= 0.999
    assert near(got["small"] + got["large"], 10_000)


def test_weighted_shares() -> None:
    th, clock = make(capacity=10_000)
    add(th, "gold", weight=3)
    add(th, "bronze")
    got = mean_rate(simulate(th, clock, {"gold": None, "bronze": None}, 8))
    assert near(got["gold"], 7500)
    assert near(got["bronze"], 2500)


def test_max_min_share_with_a_light_bucket() -> None:
    th, clock = make(capacity=9000)
    for name in "ABC":
        add(th, name)
    got = mean_rate(simulate(th, clock, {"A": 1000, "B": None, "C": None}, 10))
    assert near(got["A"], 1000, 0.01)
    assert near(got["B"], 4000)
    assert near(got["C"], 4000)


def test_removing_a_bucket_returns_its_share() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A")
    add(th, "B")
    got = mean_rate(simulate(th, clock, {"A": None, "B": None}, 4))
    assert near(got["A"], 5000)
    th.remove_bucket("B")
    got = mean_rate(simulate(th, clock, {"A": None}, 4), warmup=1)
    assert near(got["A"], 10_000)


def test_over_reservation_is_scaled_to_capacity() -> None:
    th, clock = make(capacity=6000)
    add(th, "A", reserved=6000)
    add(th, "B", reserved=3000)
    stats = th.statistics()
    assert stats.buckets["A"].effective_reserved == pytest.approx(4000)
    assert stats.buckets["B"].effective_reserved == pytest.approx(2000)
    assert stats.node.free_pool_units == 0
    got = mean_rate(simulate(th, clock, {"A": None, "B": None}, 6))
    assert near(got["A"], 4000)
    assert near(got["B"], 2000)


def test_unlimited_reservation_is_exempt_from_node_capacity() -> None:
    th, clock = make(capacity=1000)
    add(th, "A", reserved=None, hard_limit=None)  # (reserved can't exceed hard limit)
    add(th, "B")
    assert th.statistics().node.free_pool_units == 1000
    got = mean_rate(simulate(th, clock, {"A": 5000, "B": None}, 6))
    assert near(got["A"], 5000)
    assert near(got["B"], 1000)
    assert th.statistics().node.free_pool_used_window <= 1000 * 1.02


def test_property_change_applies_at_once() -> None:
    th, clock = make()
    add(th, "A", hard_limit=1000)
    got = mean_rate(simulate(th, clock, {"A": None}, 3), warmup=1)
    assert near(got["A"], 1000)
    th.set_bucket("A", hard_limit=4000)
    got = mean_rate(simulate(th, clock, {"A": None}, 3), warmup=1)
    assert near(got["A"], 4000)
    th.set_node(capacity=2000)
    got = mean_rate(simulate(th, clock, {"A": None}, 3), warmup=1)
    assert near(got["A"], 2000)


def test_statistics_snapshot() -> None:
    th, clock = make(capacity=10_000)
    add(th, "A", reserved=100, hard_limit=1000)
    th.charge("A", 150, 0)
    th.record_throttled("A", 0.0123, rejected=False)
    th.record_throttled("A", 7.0, rejected=True)
    th.record_throttled("A", 0.0, rejected=True, parked=False)
    stats = th.statistics()
    node, a = stats.node, stats.buckets["A"]
    assert node.capacity == 10_000
    assert node.free_pool_units == pytest.approx(9900)
    assert node.free_pool_used_window == 50  # 150 used, 100 of them reserved
    assert (node.throttle_count_total, node.reject_count_total) == (3, 2)
    assert (a.reserved, a.hard_limit, a.units_used_window) == (100, 1000, 150)
    assert (a.throttle_count_total, a.reject_count_total) == (3, 2)
    assert a.throttle_wait_micros_total == 12_300 + 7_000_000
    bins = dict(a.wait_histogram)
    assert len(a.wait_histogram) == len(WAIT_HISTOGRAM_BOUNDS_US) + 1
    assert bins[50_000] == 1 and bins[math.inf] == 1
    assert sum(bins.values()) == 2
    with pytest.raises(AttributeError):
        a.ru_total = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        stats.buckets["B"] = a  # type: ignore[index]
    add(th, "U", reserved=None)  # infinities are spelled "unlimited" in JSON
    doc = json.loads(json.dumps(th.statistics().as_dict(), allow_nan=False))
    assert doc["buckets"]["U"]["effective_reserved"] == "unlimited"
    assert doc["buckets"]["U"]["allowance_rate"] == "unlimited"
    assert doc["node"]["capacity"] == 10_000
    assert doc["buckets"]["A"]["hard_limit"] == 1000
    assert doc["buckets"]["A"]["wait_histogram_us"][-1] == ["+Inf", 1]
    clock.t = 1.5  # next whole-second window
    assert th.statistics().buckets["A"].units_used_window == 0
    assert th.statistics().buckets["A"].units_used_previous_window == 150


# --------------------------------------------------------------------------- Trio adapter


def gate_with(**kw: object) -> tuple[TenantThrottle, TenantThrottleGate]:
    th = TenantThrottle(trio.current_time, **kw)  # type: ignore[arg-type]
    return th, TenantThrottleGate(th)


def exhaust(th: TenantThrottle, bucket: str, cost: int = 10) -> None:
    while th.admission_wait(bucket) == 0.0:
        th.charge(bucket, cost, 0)


async def test_gate_fast_path_does_not_checkpoint(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with(capacity=10_000)
    add(th, "A")
    with trio.testing.assert_no_checkpoints():
        await gate.acquire("A")
        await gate.acquire("A", unthrottled=True)


async def test_gate_waits_fifo_then_admits(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=100)  # 10 units per slice
    exhaust(th, "A")
    order: list[tuple[int, float]] = []
    start = trio.current_time()

    async def request(i: int) -> None:
        await gate.acquire("A")
        order.append((i, trio.current_time() - start))
        th.charge("A", 10, 0)

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(request, i)
            await trio.sleep(0.001)  # arrive in order
        assert gate.waiting("A") == 5
    assert [i for i, _ in order] == [0, 1, 2, 3, 4]
    times = [t for _, t in order]
    assert times == sorted(times)
    assert times[-1] == pytest.approx(0.5, abs=0.1)  # one op per slice
    stats = th.statistics().buckets["A"]
    assert stats.throttle_count_total == 5
    assert stats.reject_count_total == 0
    assert stats.throttle_wait_micros_total > 0
    assert sum(n for _, n in stats.wait_histogram) == 5


async def test_gate_new_arrival_queues_behind_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """FIFO beats the fast path: allowance left is not for the newcomer first."""
    th, gate = gate_with()
    add(th, "A", hard_limit=10)
    exhaust(th, "A")
    th.charge("A", 20, 0)  # the first waiter sleeps ~3 s
    order: list[str] = []

    async def request(name: str) -> None:
        await gate.acquire("A")
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, "first")
        await trio.sleep(0.5)
        th.set_bucket("A", hard_limit=None)  # allowance now, but nobody told the head
        assert th.admission_wait("A") == 0.0
        nursery.start_soon(request, "second")
        await trio.sleep(0.1)
        assert order == [] and gate.waiting("A") == 2
        gate.wake("A")
    assert order == ["first", "second"]


async def test_gate_nonblocking_rejects_at_once(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=1000)
    add(th, "Z", hard_limit=0)
    exhaust(th, "A")
    start = trio.current_time()
    with pytest.raises(Throttled) as info:
        await gate.acquire("A", nonblocking=True)
    # the next refill is at most one slice away; the hint is spread over one more
    assert 0 < retry_ms(info.value) <= 200
    assert info.value.has_label("RetryableError")
    th.charge("A", 60_000, 0)  # a minute of cost: debt is never forgiven
    with pytest.raises(Throttled) as info:
        await gate.acquire("A", nonblocking=True)
    # the hint is the real wait, spread by at most a slice, not a blanket cap
    assert 60_000 <= retry_ms(info.value) <= 60_200
    with pytest.raises(HardLimitZero, match="hard_limit 0") as zero:
        await gate.acquire("Z", nonblocking=True)
    assert zero.value.labels == ()  # nothing to retry: an admin must act
    with pytest.raises(HardLimitZero):
        await gate.acquire("Z")  # blocking mode too: no pointless wait
    assert trio.current_time() == start
    assert th.statistics().buckets["A"].reject_count_total == 2


async def test_gate_max_wait_rejects_with_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with(max_wait_secs=5.0)
    add(th, "A", hard_limit=1000)
    exhaust(th, "A")
    th.charge("A", 8000, 0)  # ~8 s of debt: more than the 5 s bound
    start = trio.current_time()
    with pytest.raises(Throttled) as info:
        await gate.acquire("A")
    assert trio.current_time() == start  # known at once: no pointless sleep
    assert 5000 <= retry_ms(info.value) <= 10_200  # the real wait, spread; never less
    assert "exceeds throttle_max_wait_ms (5000 ms)" in info.value.errmsg
    th2, gate2 = gate_with(max_wait_secs=5.0)
    add(th2, "A", hard_limit=1000)
    exhaust(th2, "A")
    th2.charge("A", 3000, 0)  # ~3 s: fits, so it waits and runs
    await gate2.acquire("A")
    assert 2.9 <= trio.current_time() - start <= 3.2


async def test_gate_deadline(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=1000)
    exhaust(th, "A")
    th.charge("A", 1000, 0)  # ~1 s to wait
    now = trio.current_time()
    with pytest.raises(Throttled):
        await gate.acquire("A", deadline=now + 0.5)
    with pytest.raises(DeadlineExceeded):
        await gate.acquire("A", deadline=now - 0.001)
    await gate.acquire("A", deadline=now + 2.0)
    assert trio.current_time() - now == pytest.approx(1.0, abs=0.15)
    await gate.acquire("A", deadline=now - 1)  # admitted at once: the deadline is not ours


async def test_gate_waiter_behind_others_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with(max_wait_secs=5.0)
    add(th, "A", hard_limit=1000)
    exhaust(th, "A")
    th.charge("A", 800, 0)  # the head waits ~0.8 s
    start = trio.current_time()
    results: dict[str, object] = {}

    async def request(name: str, deadline: float | None) -> None:
        try:
            await gate.acquire("A", deadline=deadline)
            results[name] = trio.current_time() - start
        except Throttled as exc:
            results[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, "head", None)
        await trio.sleep(0.001)
        nursery.start_soon(request, "second", start + 0.3)
    assert isinstance(results["second"], Throttled)
    second = results["second"]
    assert isinstance(second, Throttled)
    assert retry_ms(second) > 0
    assert results["head"] == pytest.approx(0.8, abs=0.15)


async def test_gate_bucket_removal_wakes_every_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=1000)
    exhaust(th, "A")
    th.charge("A", 3000, 0)
    errors: list[BaseException] = []

    async def request() -> None:
        try:
            await gate.acquire("A")
        except BucketNotFound as exc:
            errors.append(exc)

    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(request)
            await trio.sleep(0.5)
            removed_at = trio.current_time()
            gate.bucket_removed("A")
    assert len(errors) == 4
    assert trio.current_time() == removed_at
    assert "A" not in th
    assert gate.waiting("A") == 0
    with pytest.raises(BucketNotFound):
        await gate.acquire("A")


async def test_gate_unthrottled_skips_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=100)
    exhaust(th, "A")
    th.charge("A", 200, 0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.acquire, "A")
        await trio.sleep(0.01)
        assert gate.waiting("A") == 1
        with trio.testing.assert_no_checkpoints():
            await gate.acquire("A", unthrottled=True)
        th.charge("A", 10, 0, unthrottled=True)
        nursery.cancel_scope.cancel()


async def test_gate_cancelled_head_passes_the_turn(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=100)
    exhaust(th, "A")
    th.charge("A", 200, 0)  # ~2 s
    done: list[float] = []

    async def second() -> None:
        await gate.acquire("A")
        done.append(trio.current_time())

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        head_scope = trio.CancelScope()

        async def head() -> None:
            with head_scope:
                await gate.acquire("A")

        nursery.start_soon(head)
        await trio.sleep(0.01)
        nursery.start_soon(second)
        await trio.sleep(0.5)
        head_scope.cancel()
    assert done and done[0] - start == pytest.approx(2.1, abs=0.2)
    assert gate.waiting("A") == 0


async def test_gate_wake_after_limit_raised(autojump_clock: trio.testing.MockClock) -> None:
    th, gate = gate_with()
    add(th, "A", hard_limit=10)
    exhaust(th, "A")
    th.charge("A", 20, 0)  # ~3 s at 10 units/s
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.acquire, "A")
        await trio.sleep(0.2)
        th.set_bucket("A", hard_limit=None)
        gate.wake("A")
    assert trio.current_time() - start == pytest.approx(0.2, abs=0.01)


async def test_gate_hard_limit_accuracy_when_offered_3x(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with(capacity=50_000)
    add(th, "A", hard_limit=1000)
    admitted = 0
    start = trio.current_time()

    async def client() -> None:
        nonlocal admitted
        while True:  # 3 clients x 100 ops/s x 10 units = 3x the hard limit
            await gate.acquire("A")
            th.charge("A", 10, 0)
            admitted += 10
            await trio.sleep(0.01)

    with trio.move_on_at(start + 10.0):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(client)
    assert abs(admitted - 10_000) <= 0.03 * 10_000, admitted


async def test_gate_paces_a_queue_through_the_slice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A bucket held at its hard limit by queued requests is admitted at its rate
    through each slice, not in a burst when the slice refills; what it gets per
    slice does not change."""
    th, gate = gate_with(capacity=50_000)
    add(th, "A", hard_limit=1000)  # 100 units a slice: ten 10-unit requests
    admitted: list[float] = []
    start = trio.current_time()

    async def client() -> None:
        while True:  # 10 clients x 100 ops/s x 10 units = 10x the hard limit
            await gate.acquire("A")
            th.charge("A", 10, 0)
            admitted.append(trio.current_time() - start)
            await trio.sleep(0.01)

    with trio.move_on_at(start + 3.0):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(client)
    assert abs(len(admitted) - 300) <= 12, len(admitted)  # 1000 units/s, within a slice
    slice_secs = th.slice_secs
    # After the first second: in no 10 ms is more than one slice's tenth admitted
    # (+1 at the edges); unpaced, a slice's ten went at its boundary.
    late = [t for t in admitted if t >= 1.0]
    busiest = max(sum(1 for u in late if t <= u < t + slice_secs / 10) for t in late)
    assert busiest <= 2, busiest


async def test_gate_fairness_one_waiter_vs_64(autojump_clock: trio.testing.MockClock) -> None:
    """Equal buckets share the free pool equally, whatever their concurrency."""
    th, gate = gate_with(capacity=10_000)
    add(th, "one")
    add(th, "many")
    units = {"one": 0, "many": 0}
    start = trio.current_time()

    async def client(bucket: str) -> None:
        while True:
            await gate.acquire(bucket)
            await trio.sleep(0.001)  # the operation itself
            th.charge(bucket, 4, 3)  # 4 RU + 2 x 3 WU = 10 units
            if trio.current_time() - start >= 2.0:  # after a 2 s warm-up
                units[bucket] += 10

    with trio.move_on_after(12.0):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client, "one")
            for _ in range(64):
                nursery.start_soon(client, "many")
    rates = [units["one"] / 10, units["many"] / 10]
    assert jain(rates) >= 0.99, rates
    assert sum(rates) == pytest.approx(10_000, rel=0.03)
    assert th.statistics().buckets["many"].throttle_count_total > 0


# --------------------------------------------------------------------------- invariants

limits = st.one_of(st.none(), st.integers(0, 5000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(100, 20_000),
    buckets=st.lists(
        st.tuples(st.integers(0, 3000), limits, st.booleans(), st.integers(1, 50)),
        min_size=1,
        max_size=5,
    ),
    steps=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.sampled_from(["load", "open", "close", "set", "idle", "unthrottled"]),
            st.integers(0, 5000),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_invariants_under_random_operations(
    capacity: int,
    buckets: list[tuple[int, int | None, bool, int]],
    steps: list[tuple[int, str, int]],
) -> None:
    """Whatever happens: waits are sane, and the node and hard limits hold over time."""
    th, clock = make(capacity=capacity)
    names: list[str] = []
    hard: dict[str, int | None] = {}
    for i, (reserved, hard_limit, connected, _) in enumerate(buckets):
        if hard_limit is not None and reserved > hard_limit:
            reserved = hard_limit
        name = f"b{i}"
        add(th, name, reserved=reserved, hard_limit=hard_limit, connect=connected)
        names.append(name)
        hard[name] = hard_limit
    cost = {f"b{i}": b[3] for i, b in enumerate(buckets)}
    used = dict.fromkeys(names, 0)
    privileged = 0
    start = clock.t
    for index, action, amount in steps:
        name = names[index % len(names)]
        clock.t += 0.013 + amount / 100_000
        if action == "load":
            for _ in range(200):
                wait = th.admission_wait(name)
                assert wait >= 0.0 and not math.isnan(wait)
                if wait:
                    break
                th.charge(name, cost[name], 0)
                used[name] += cost[name]
        elif action == "unthrottled":
            assert th.admission_wait(name, unthrottled=True) == 0.0
            th.charge(name, amount % 50, 0, unthrottled=True)
            privileged += amount % 50
        elif action == "open":
            th.connection_opened(name)
        elif action == "close":
            th.connection_closed(name)
        elif action == "set":
            th.set_bucket(name, reserved=0, hard_limit=hard[name])
        else:
            clock.t += amount / 1000
    elapsed = clock.t - start
    slices = elapsed / 0.1 + 2
    # Per bucket: hard limit over time, plus one slice of burst and one op of overshoot.
    for name in names:
        h = hard[name]
        if h is not None:
            assert used[name] <= h * 0.1 * slices + cost[name], (name, used[name])
    # Node: at most one slice of burst per slice, plus overshoot and privileged work.
    total = sum(used.values())
    overshoot = sum(cost.values()) * (len(steps) + 1)
    assert total <= capacity * 0.1 * (slices + 1) + overshoot + privileged
    stats = th.statistics()
    json.dumps(stats.as_dict(), allow_nan=False)
    for b in stats.buckets.values():
        assert b.allowance is None or not math.isnan(b.allowance)


def test_unthrottled_use_leaves_at_most_one_second_of_debt() -> None:
    """An unthrottled burst on a hard-100 bucket drove its allowance to -18,970 and
    its other users waited 57 s. It is still charged and accounted, but the debt it
    leaves is bounded by one refill window (UNTHROTTLED_DEBT_SECS)."""
    clock = FakeClock()
    th = TenantThrottle(clock)
    th.add_bucket("B", reserved=0, hard_limit=100)
    for _ in range(300):  # 3,000 units in no time: 30 s of the hard limit
        assert th.admission_wait("B", unthrottled=True) == 0.0
        th.charge("B", 10, 0, unthrottled=True)
    st = th.statistics().buckets["B"]
    assert st.ru_total == 3000  # all of it metered
    wait = th.admission_wait("B")
    assert 0.0 < wait <= 1.2  # a normal user waits about 1 s (one refill window), not 30


def test_status_means_what_the_docs_say() -> None:
    """free_pool_units is capacity - reservations even with unthrottled use;
    allowance_rate never exceeds the hard limit; a reserved-0 bucket on an
    unlimited node has effective_reserved 0, not "unlimited"."""
    clock = FakeClock()
    th = TenantThrottle(clock, capacity=1000)
    th.add_bucket("A", reserved=200, hard_limit=100_000)
    th.add_bucket("B", reserved=0, hard_limit=100)
    th.connection_opened("A")
    for _ in range(20):  # unthrottled use on B sets capacity aside for it
        th.admission_wait("B", unthrottled=True)
        th.charge("B", 50, 0, unthrottled=True)
    clock.t += 0.25
    st = th.statistics()
    assert st.node.free_pool_units == pytest.approx(800)
    assert st.node.free_pool_available_units is not None
    assert st.node.free_pool_available_units <= 800
    rate = st.buckets["B"].allowance_rate
    assert rate is not None and rate <= 100
    unlimited = TenantThrottle(FakeClock())
    unlimited.add_bucket("C", reserved=0, hard_limit=None)
    assert unlimited.statistics().buckets["C"].effective_reserved == 0.0


def test_an_unthrottled_burst_does_not_hold_other_buckets_at_zero() -> None:
    """Above node capacity, another bucket stayed at 0 for 5-10 s after an
    unthrottled burst. The burst is accounted, but the other bucket is served
    again within about a second, at its share."""
    clock = FakeClock()
    th = TenantThrottle(clock, capacity=1000)
    for name in ("U", "O"):
        th.add_bucket(name, reserved=0, hard_limit=None)
        th.connection_opened(name)
    while clock.t < 3.0:  # 5,000 units/s of unthrottled work for 3 s
        th.admission_wait("U", unthrottled=True)
        th.charge("U", 50, 0, unthrottled=True)
        clock.t += 0.01
    start, first, served = clock.t, None, 0
    while clock.t < start + 5.0:
        if th.admission_wait("O") == 0.0:
            th.charge("O", 10, 0)
            served += 10
            first = clock.t - start if first is None else first
        clock.t += 0.001
    assert first is not None and first < 1.0
    assert served >= 0.9 * 1000 * 5 * 0.9  # ~its whole share of the node once U stopped
    assert th.statistics().buckets["U"].ru_total >= 15_000  # and U's burst was accounted


# --------------------------------------------------------------------------- writes in flight


def run_writes(
    th: TenantThrottle,
    clock: FakeClock,
    bucket: str,
    *,
    cost: int,
    in_flight: int,
    seconds: float,
    latency: float = 0.05,
    tick: float = 0.001,
) -> list[tuple[float, int]]:
    """Clients keeping ``in_flight`` writes of ``cost`` units each in flight: a write
    is admitted at its cost (write_wait, reserve), charged ``latency`` later when
    durable (charge with ``reserved``). Returns (admitted at, cost) per write."""
    admitted: list[tuple[float, int]] = []
    flying: list[tuple[float, int]] = []
    start = clock.t
    while clock.t < start + seconds:
        for done in [f for f in flying if f[0] <= clock.t]:
            flying.remove(done)
            wu = done[1] // th.write_weight
            th.charge(bucket, 0, wu, reserved=done[1])
        while len(flying) < in_flight and th.write_wait(bucket, cost) == 0.0:
            reserved = th.reserve(bucket, cost)
            assert reserved == cost
            flying.append((clock.t + latency, cost))
            admitted.append((clock.t, cost))
        clock.t += tick
    return admitted


@pytest.mark.parametrize("cost", [202, 402])  # 400 KB and 800 KB values, write_weight 2
def test_writes_in_flight_cannot_overshoot_the_hard_limit(cost: int) -> None:
    """8 connections x 4 writes in flight on a bucket at hard limit 100 got 7-9x the
    limit: each was admitted while the counter was positive and charged only once
    durable, the debt beyond 5 s forgiven. Admitted at their known cost, reserved
    at once, the writes keep to the limit: over 40 s at most hard x (T + a slice)
    plus one write."""
    th, clock = make()
    add(th, "W", reserved=0, hard_limit=100)
    admitted = run_writes(th, clock, "W", cost=cost, in_flight=32, seconds=40.0)
    total = sum(c for _, c in admitted)
    assert total <= 100 * 40.1 + cost, total
    assert total >= 100 * 40 - cost  # and the bucket still gets its limit
    # The steady rate (between the first and the last admission) is the limit.
    first, last = admitted[0][0], admitted[-1][0]
    rate = sum(c for _, c in admitted[1:]) / (last - first)
    assert rate <= 100 * 1.03, rate
    st = th.statistics().buckets["W"]
    assert st.wu_total * 2 <= total  # charged exactly what was reserved


def test_a_write_waits_while_the_writes_in_flight_owe_the_bucket() -> None:
    th, _clock = make()
    add(th, "W", reserved=0, hard_limit=100)
    assert th.write_wait("W", 200) == 0.0
    th.reserve("W", 200)  # in flight, not yet charged
    wait = th.write_wait("W", 200)
    assert 1.9 <= wait <= 2.01  # the 190 units it owes, repaid at 100 units/s
    assert th.admission_wait("W") == pytest.approx(wait)  # a read waits as well
    th.charge("W", 0, 100, reserved=200)  # durable: nothing more to pay
    assert th.write_wait("W", 200) == pytest.approx(wait)


def test_a_write_that_never_ran_is_refunded_and_a_cheaper_one_settles() -> None:
    th, _clock = make()
    add(th, "W", reserved=0, hard_limit=100)
    th.reserve("W", 200)
    th.refund("W", 200)  # refused after admission: "not executed" costs nothing
    assert th.admission_wait("W") == 0.0
    assert th.statistics().buckets["W"].allowance == pytest.approx(10.0)  # one slice
    th.reserve("W", 8)
    th.charge("W", 0, 1, reserved=8)  # it wrote less than its size hint said
    assert th.statistics().buckets["W"].allowance == pytest.approx(8.0)


def test_debt_is_never_forgiven() -> None:
    """A read whose size was known only after it ran used to leave at most
    max_debt_secs of debt; the rest was forgiven. It is repaid now, all of it."""
    th, _clock = make(max_debt_secs=5.0)
    add(th, "R", reserved=0, hard_limit=100)
    th.charge("R", 2000, 0)  # 20 s of the hard limit
    assert 19.9 <= th.admission_wait("R") <= 20.01


def test_a_big_write_runs_when_the_bucket_owes_nothing_then_is_repaid() -> None:
    """A write costing more than throttle_max_request_secs x hard limit is admitted
    once the bucket's counter is full (no debt, nothing in flight, nothing spent this
    slice), alone; its debt is then repaid before anything else runs."""
    th, clock = make(max_debt_secs=5.0)
    add(th, "B", reserved=0, hard_limit=100)  # most per ordinary write: 500 units
    assert th.max_request_units("B") == 500.0
    th.charge("B", 1, 0)  # one unit spent this slice: not full
    wait = th.write_wait("B", 600)
    assert 0.0 < wait <= 0.1 + 1e-3  # full again at the next refill
    assert th.write_wait("B", 400) == 0.0  # an ordinary write still runs at once
    clock.t += wait
    assert th.write_wait("B", 600) == 0.0
    th.reserve("B", 600)
    assert th.write_wait("B", 600) > 5.8  # repaid first: 590 units at 100 units/s
    assert th.admission_wait("B") > 5.8


# --------------------------------------------------------------------------- timekeeping


def test_moving_averages_advance_by_the_slices_elapsed() -> None:
    """A single slice of unthrottled use at the node's capacity, then silence: one
    moving-average step per call (not per slice) kept the other bucket at half its
    rate for as long as nobody called. After a second of silence it is all back."""
    th, clock = make(capacity=1000)
    add(th, "U", reserved=0)
    add(th, "O", reserved=0)
    clock.t = 0.0
    for _ in range(10):  # 1,000 units/s within one slice
        th.admission_wait("U", unthrottled=True)
        th.charge("U", 10, 0, unthrottled=True)
    clock.t = 0.15
    th.admission_wait("O")  # samples the slice of the burst
    clock.t = 1.25  # then 11 slices with no call at all
    th.charge("O", 1, 0)
    free = th.statistics().node.free_pool_available_units  # what U's use leaves to share
    assert free is not None and free >= 0.95 * 1000, free


async def test_an_unknown_wait_waits_a_slice_at_a_time_not_a_10_s_hint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """While unthrottled use takes the node's capacity, another bucket's rate is 0:
    a wait nobody can predict. A non-blocking request is told to come back at the
    next recompute (at most two slices), a blocking one waits it out a slice at a
    time and runs as soon as the rate is back."""
    th, gate = gate_with(capacity=1000)
    add(th, "U", reserved=0)
    add(th, "O", reserved=0)

    async def burst(until: float) -> None:
        while trio.current_time() < until:
            th.admission_wait("U", unthrottled=True)
            th.charge("U", 20, 0, unthrottled=True)  # 2,000 units/s
            await trio.sleep(0.01)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(burst, start + 1.0)
        await trio.sleep(0.5)
        exhaust(th, "O")
        assert th.admission_wait("O") == math.inf
        with pytest.raises(Throttled) as info:
            await gate.acquire("O", nonblocking=True)
        assert 0 < retry_ms(info.value) <= 200
        await gate.acquire("O")  # waits for the burst to stop, then runs
        assert trio.current_time() - start < 1.0 + 1.0
        th.charge("O", 10, 0)
    await trio.sleep(1.0)  # within a second of the burst's end: the whole node
    rate = th.statistics().buckets["O"].allowance_rate
    assert rate is not None and rate >= 0.95 * 1000, rate


async def test_an_unknown_wait_past_the_bound_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with(capacity=1000, max_wait_secs=0.5)
    add(th, "U", reserved=0)
    add(th, "O", reserved=0)
    exhaust(th, "O")

    async def burst() -> None:
        while True:
            th.admission_wait("U", unthrottled=True)
            th.charge("U", 20, 0, unthrottled=True)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(burst)
        await trio.sleep(0.3)
        start = trio.current_time()
        with pytest.raises(Throttled) as info:
            await gate.acquire("O")
        assert 0.4 <= trio.current_time() - start <= 0.5 + 1e-6
        assert retry_ms(info.value) <= 200
        assert "allowance rate is 0 for now" in info.value.errmsg
        assert "throttle_max_wait_ms (500 ms)" in info.value.errmsg
        nursery.cancel_scope.cancel()


async def test_unthrottled_use_holding_the_hard_limit_fails_other_requests_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A normal user's GET on a bucket its unthrottled user keeps at the hard limit
    parked 4.1 s, then failed with 'the wait (1000 ms) exceeds throttle_max_wait_ms
    (5000 ms)'. Nothing else can run while that use goes on: it fails at once, its
    message states the real numbers and the hint how soon the debt is repaid once
    that use stops (about a second)."""
    th, gate = gate_with()
    add(th, "B", reserved=0, hard_limit=100)

    async def unthrottled() -> None:
        while True:
            th.admission_wait("B", unthrottled=True)
            th.charge("B", 3, 0, unthrottled=True)  # 300 units/s
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(unthrottled)
        await trio.sleep(1.0)
        start = trio.current_time()
        with pytest.raises(Throttled) as info:
            await gate.acquire("B")
        assert trio.current_time() == start  # at once
        assert "unthrottled use" in info.value.errmsg
        assert "(100 units/s)" in info.value.errmsg
        assert 0 < retry_ms(info.value) <= 1200
        nursery.cancel_scope.cancel()


async def test_a_wait_that_grew_while_parked_says_how_long_it_parked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    th, gate = gate_with(max_wait_secs=5.0)
    add(th, "A", hard_limit=1000)
    exhaust(th, "A")
    th.charge("A", 3000, 0)  # ~3 s: it parks
    start = trio.current_time()

    async def more_debt() -> None:
        await trio.sleep(1.0)
        th.charge("A", 4000, 0)  # now ~6 s from here: past the bound

    async with trio.open_nursery() as nursery:
        nursery.start_soon(more_debt)
        with pytest.raises(Throttled) as info:
            await gate.acquire("A")
    waited = trio.current_time() - start
    msg = info.value.errmsg
    assert f"after {math.ceil(waited * 1000 - 1e-6)} ms parked" in msg, msg
    assert "outlasts throttle_max_wait_ms (5000 ms)" in msg
    wait_ms = int(msg.split("the wait (")[1].split(" ms")[0])
    assert waited * 1000 + wait_ms > 5000  # the numbers agree: it would outlast the bound
    assert wait_ms <= retry_ms(info.value) <= wait_ms + 101


# --------------------------------------------------------------------------- one slice's arithmetic


def _counters(name: str, rate: float, credit: float, hungry_until: float) -> BucketCounters:
    b = BucketCounters(name, 0, None, 1.0)
    b.rate, b.res_rate, b.credit, b.hungry_until = rate, 0.0, credit, hungry_until
    return b


def test_refill_hands_unused_share_to_the_hungry_and_keeps_the_rest_as_spare() -> None:
    full = _counters("full", 100.0, 10.0, -math.inf)  # its counter holds one slice: 10
    hungry = _counters("hungry", 100.0, -5.0, 1.0)
    spare = refill(
        [full, hungry], 1, 0.0, 0.1, limited=True, unallocated_rate=0.0, free_rate=1000.0, spare=0.0
    )
    # "full" could not hold its 10 new units: they go to "hungry", on top of its own 10.
    assert (full.credit, hungry.credit, hungry.bonus, spare) == (10.0, 15.0, 100.0, 0.0)
    idle = _counters("idle", 100.0, 10.0, -math.inf)
    spare = refill(
        [idle], 1, 0.0, 0.1, limited=True, unallocated_rate=0.0, free_rate=50.0, spare=0.0
    )
    assert (idle.credit, spare) == (10.0, 5.0)  # nobody hungry: spare, at most a slice of free
    kept = refill([idle], 0, 0.0, 0.1, limited=True, unallocated_rate=0, free_rate=50.0, spare=3.0)
    assert kept == 3.0  # no slice boundary passed: nothing moves
