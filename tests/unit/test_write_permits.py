"""Write permits: the capacity formula, the pure core, and the Trio adapter's lag loop."""

from __future__ import annotations

import json
import logging
import math
from fractions import Fraction

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tenantkv.admission.write_permits import (
    DEFAULT_ADJUSTMENT_INTERVAL_MS,
    DEFAULT_MAX_CAPACITY,
    QUIET_SAMPLES,
    WAIT_HISTOGRAM_BOUNDS_US,
    BucketPermits,
    PermitSettings,
    Waiter,
    WritePermitGate,
    WritePermits,
    capacity_for_lag,
)
from tenantkv.errors import BadValue, BucketExists, BucketNotFound
from tests.conftest import FakeClock

PARAMS = {"target_lag": 100, "critical_lag": 200, "min_capacity": 2, "max_capacity": 10}


def core(**kw: int) -> tuple[WritePermits, FakeClock]:
    clock = FakeClock(50.0)
    wp = WritePermits(clock, PermitSettings(**{**PARAMS, **kw}))
    wp.add_bucket("a")
    wp.add_bucket("b")
    return wp, clock


class LagSource:
    """A fake group-commit backlog the test sets."""

    def __init__(self) -> None:
        self.lag = 0

    def __call__(self) -> int:
        return self.lag


# --------------------------------------------------------------------------- the formula


@pytest.mark.parametrize(
    ("lag", "capacity"),
    [
        (0, 10),
        (100, 10),  # at target: still max
        (101, 9),  # 2 + floor(8 * 99 / 100)
        (150, 6),  # half way: 2 + 4
        (175, 4),
        (199, 2),  # 2 + floor(0.08)
        (200, 2),  # at critical: min
        (10_000, 2),
    ],
)
def test_capacity_for_lag(lag: int, capacity: int) -> None:
    assert capacity_for_lag(lag, **PARAMS) == capacity


def test_capacity_for_lag_with_target_zero_and_min_equal_max() -> None:
    assert capacity_for_lag(0, target_lag=0, critical_lag=10, min_capacity=1, max_capacity=11) == 11
    assert capacity_for_lag(5, target_lag=0, critical_lag=10, min_capacity=1, max_capacity=11) == 6
    assert capacity_for_lag(5, target_lag=0, critical_lag=10, min_capacity=7, max_capacity=7) == 7


@given(
    st.integers(0, 1000),
    st.integers(1, 1000),
    st.integers(1, 100),
    st.integers(0, 100),
    st.lists(st.integers(0, 3000), min_size=2, max_size=10),
)
def test_capacity_is_monotone_and_bounded(
    target: int, span: int, lo: int, extra: int, lags: list[int]
) -> None:
    p = {
        "target_lag": target,
        "critical_lag": target + span,
        "min_capacity": lo,
        "max_capacity": lo + extra,
    }
    caps = [capacity_for_lag(lag, **p) for lag in sorted(lags)]
    assert all(lo <= c <= lo + extra for c in caps)
    assert caps == sorted(caps, reverse=True)
    # Exactly the documented formula, rounded down.
    for lag in lags:
        if target < lag < target + span:
            # Fraction: a float reference lands on the wrong side of a whole number
            # (1 + 25 * (1 - 4/5) = 5.999...) where the code's integer arithmetic does not.
            exact = lo + extra * (1 - Fraction(lag - target, span))
            assert capacity_for_lag(lag, **p) == math.floor(exact)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"max_capacity": 1, "min_capacity": 2},
            r"write_permit_max_capacity \(1\) must be at least write_permit_min_capacity \(2\)",
        ),
        ({"min_capacity": 0}, r"write_permit_min_capacity must be an integer in \[1, 65536\]"),
        (
            {"critical_lag": 100},
            r"write_permit_critical_lag \(100\) must be greater than write_permit_target_lag",
        ),
        ({"critical_lag": 50}, "must be greater than write_permit_target_lag"),
        ({"target_lag": -1}, r"write_permit_target_lag must be an integer in \[0, "),
        ({"target_lag": 1.5}, "write_permit_target_lag"),
        ({"max_capacity": True}, "write_permit_max_capacity"),
        (
            {"adjustment_interval_ms": 0},
            r"write_permit_adjustment_interval_ms must be an integer in \[1, 60000\], got 0",
        ),
    ],
)
def test_validation_messages(kw: dict[str, object], message: str) -> None:
    with pytest.raises(BadValue, match=message):
        WritePermits(FakeClock(), PermitSettings(**{**PARAMS, **kw}))  # type: ignore[arg-type]
    wp, _ = core()
    with pytest.raises(BadValue, match=message):
        wp.configure(**kw)  # type: ignore[arg-type]
    assert wp.statistics().settings.critical_lag == 200  # all or nothing


def test_configure_validates_against_current_values() -> None:
    wp, _ = core()
    with pytest.raises(BadValue, match=r"critical_lag \(300\) must be greater.*target_lag \(400\)"):
        wp.configure(critical_lag=300, target_lag=400)
    wp.configure(target_lag=400, critical_lag=800)  # moved together: fine
    s = wp.statistics()
    assert (s.settings.target_lag, s.settings.critical_lag) == (400, 800)


def test_defaults_are_sane() -> None:
    wp = WritePermits(FakeClock())
    s = wp.statistics().settings
    assert s.adjustment_interval_ms == DEFAULT_ADJUSTMENT_INTERVAL_MS
    assert 0 < s.min_capacity <= s.max_capacity == DEFAULT_MAX_CAPACITY
    assert 0 <= s.target_lag < s.critical_lag
    assert wp.capacity == s.max_capacity  # nothing known yet: no restriction


# --------------------------------------------------------------------------- pure core


def test_lag_lowers_and_raises_capacity() -> None:
    wp, _ = core()
    assert wp.capacity == 10
    wp.adjust(150)
    assert wp.capacity == 6
    wp.adjust(5000)
    assert wp.capacity == 2
    wp.adjust(0)
    assert wp.capacity == 10
    wp.adjust(0)  # unchanged: not an adjustment
    s = wp.statistics()
    assert (s.evaluations, s.adjustments, s.last_lag) == (4, 3, 0)


def test_permits_fifo_and_hand_off() -> None:
    wp, _ = core(max_capacity=2)
    p = wp.try_acquire("a")
    assert isinstance(p, BucketPermits)
    assert wp.try_acquire("a") is p
    assert wp.try_acquire("a") is None
    assert wp.try_acquire("b") is not None  # another bucket has its own permits
    _, w1 = wp.enqueue("a")
    _, w2 = wp.enqueue("a")
    assert wp.release(p) is w1 and w1 is not None and w1.granted
    assert p.in_use == 2
    assert wp.try_acquire("a") is None  # w2 waits: nobody overtakes it
    assert wp.release(p) is w2
    assert wp.release(p) is None and wp.release(p) is None
    assert p.in_use == 0


def test_a_run_adds_permits_and_gives_them_back_as_one_by_one() -> None:
    wp, _ = core(max_capacity=3)
    p = wp.try_acquire("a")
    assert p is not None and wp.room(p) == 2
    wp.add(p, 2)
    assert wp.room(p) == 0 and p.in_use == 3
    _, w1 = wp.enqueue("a")
    p.in_use -= 1
    assert wp.room(p) == 0  # nobody overtakes a waiter
    p.in_use += 1
    assert wp.release_many(p, 3) == [w1] and w1 is not None and w1.granted
    assert p.in_use == 1
    assert wp.release_many(p, 1) == [] and p.in_use == 0
    assert p.granted == 4


def test_growing_capacity_admits_waiters() -> None:
    wp, clock = core()
    wp.adjust(10_000)  # capacity 2
    for _ in range(2):
        wp.try_acquire("a")
    waiters = [wp.enqueue("a")[1] for _ in range(5)]
    other = [wp.enqueue("b")[1] for _ in range(1)]  # b has 2 free: admitted at once
    assert other == [None]
    clock.t += 0.002
    woken = wp.adjust(150)  # capacity 6: four more for a
    assert woken == waiters[:4]
    s = wp.statistics().buckets["a"]
    assert (s.capacity, s.in_use, s.waiting, s.granted, s.waited) == (6, 6, 1, 6, 4)
    assert s.wait_micros_total == 4 * 2000
    hist = dict(s.wait_histogram)
    assert hist[10_000] == 4  # 2 ms waits land in the (1 ms, 10 ms] bin


def test_shrinking_lets_holders_finish() -> None:
    wp, _ = core()
    p = wp.permits("a")
    for _ in range(10):
        assert wp.try_acquire("a") is p
    _, w = wp.enqueue("a")
    assert wp.adjust(10_000) == []  # capacity 2: nothing revoked
    assert p.in_use == 10
    for left in range(9, 1, -1):
        assert wp.release(p) is None
        assert p.in_use == left
    assert wp.release(p) is w  # under the new capacity: hand-off resumes
    assert p.in_use == 2


def test_configure_recomputes_from_the_last_lag() -> None:
    wp, _ = core()
    wp.adjust(150)
    assert wp.capacity == 6
    wp.configure(max_capacity=18)  # 2 + 16 * 0.5
    assert wp.capacity == 10
    wp.configure(critical_lag=1000)  # 2 + 16 * 850 / 900
    assert wp.capacity == 17


def test_abandon_and_remove_bucket() -> None:
    wp, _ = core(max_capacity=1, min_capacity=1)
    p = wp.try_acquire("a")
    assert p is not None
    _, w1 = wp.enqueue("a")
    _, w2 = wp.enqueue("a")
    assert w1 is not None and w2 is not None
    wp.abandon(p, w1)
    assert wp.statistics().buckets["a"].interrupted == 1
    assert wp.remove_bucket("a") == [w2]
    assert p.removed and "a" not in wp
    assert wp.release(p) is None  # a late release is harmless
    with pytest.raises(BucketNotFound):
        wp.try_acquire("a")
    with pytest.raises(BucketExists):
        wp.add_bucket("b")
    assert wp.remove_bucket("zzz") == []


def test_statistics_as_dict_is_json() -> None:
    wp, _ = core()
    wp.adjust(120)
    wp.try_acquire("a")
    doc = wp.statistics().as_dict()
    json.dumps(doc)
    assert doc["node"] == {
        "write_permit_target_lag": 100,
        "write_permit_critical_lag": 200,
        "write_permit_min_capacity": 2,
        "write_permit_max_capacity": 10,
        "write_permit_adjustment_interval_ms": DEFAULT_ADJUSTMENT_INTERVAL_MS,
        "capacity": 8,
        "last_lag": 120,
        "evaluations": 1,
        "adjustments": 1,
    }
    a = doc["buckets"]["a"]
    assert (a["capacity"], a["in_use"], a["waiting"]) == (8, 1, 0)
    assert [le for le, _ in a["wait_histogram_us"]] == [*WAIT_HISTOGRAM_BOUNDS_US, "+Inf"]


def test_capacity_changes_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    wp, clock = core()
    caplog.set_level(logging.DEBUG, logger="tenantkv.admission")
    wp.adjust(150)
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.getMessage() for r in info] == [
        "write permit capacity 10 -> 6 per bucket (lag 150, target 100, critical 200)"
    ]
    assert info[0].name == "tenantkv.admission"
    # Flapping within a second: DEBUG lines, then one INFO line that counts them.
    for lag in (160, 170, 180):
        clock.t += 0.01
        wp.adjust(lag)
    assert [r.levelno for r in caplog.records] == [logging.INFO] + [logging.DEBUG] * 3
    clock.t += 1.0
    wp.adjust(0)
    last = caplog.records[-1]
    assert last.levelno == logging.INFO
    assert last.getMessage().endswith("; 3 more changes since the last line")
    assert "10" in last.getMessage() and "lag 0" in last.getMessage()
    assert wp.statistics().adjustments == 5


# --------------------------------------------------------------------------- Trio adapter


async def test_run_loop_follows_the_lag(autojump_clock: trio.testing.MockClock) -> None:
    lag = LagSource()
    gate = WritePermitGate.create(lag, PermitSettings(**PARAMS, adjustment_interval_ms=10))
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.run)
        assert gate.permits.capacity == 10
        lag.lag = 150
        await trio.sleep(0.015)  # one interval later
        assert gate.permits.capacity == 6
        lag.lag = 300
        await trio.sleep(0.01)
        assert gate.permits.capacity == 2
        lag.lag = 0
        await trio.sleep(0.01)
        assert gate.permits.capacity == 10
        gate.configure(adjustment_interval_ms=1000)
        await trio.sleep(0.01)  # the pending 10 ms tick still comes
        lag.lag = 150
        await trio.sleep(0.5)
        assert gate.permits.capacity == 10  # the next sample is due at ~1 s
        await trio.sleep(0.6)
        assert gate.permits.capacity == 6
        nursery.cancel_scope.cancel()
    s = gate.statistics()
    assert s.adjustments == 4 and s.last_lag == 150


async def test_waiters_woken_when_lag_drops(autojump_clock: trio.testing.MockClock) -> None:
    lag = LagSource()
    lag.lag = 10_000
    gate = WritePermitGate.create(lag, PermitSettings(**PARAMS, adjustment_interval_ms=10))
    gate.add_bucket("a")
    admitted: list[float] = []
    held: list[BucketPermits] = []

    async def write() -> None:
        p = await gate.acquire("a")
        admitted.append(trio.current_time())
        held.append(p)  # holds its permit until "durable" (never, here)

    async with trio.open_nursery() as nursery:
        await nursery.start(gate.run)
        t0 = trio.current_time()
        async with trio.open_nursery() as writers:
            for _ in range(10):
                writers.start_soon(write)
            await trio.sleep(0.105)  # off the 10 ms ticks, to keep the order plain
            assert len(admitted) == 2  # critical lag: min capacity
            assert gate.statistics().buckets["a"].waiting == 8
            lag.lag = 150  # the writer caught up half-way
            await trio.sleep(0.02)
            assert len(admitted) == 6
            lag.lag = 0
        nursery.cancel_scope.cancel()
    assert len(admitted) == 10
    # woken at the first sample after each change
    assert [round(t - t0, 3) for t in admitted] == [0.0] * 2 + [0.11] * 4 + [0.13] * 4
    s = gate.statistics().buckets["a"]
    assert (s.in_use, s.waiting, s.waited) == (10, 0, 8)
    assert sum(n for _, n in s.wait_histogram) == 8
    for p in held:
        gate.release(p)
    assert gate.statistics().buckets["a"].in_use == 0


async def test_release_from_another_task_and_no_checkpoint(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = WritePermitGate.create(LagSource(), PermitSettings(**PARAMS))
    gate.add_bucket("a")
    gate.configure(max_capacity=2, min_capacity=1)
    with trio.testing.assert_no_checkpoints():
        p = await gate.acquire("a")
        assert gate.try_acquire("a") is p
    done: list[str] = []

    async def group_commit_callback() -> None:
        await trio.sleep(0.003)  # the batch became durable
        done.append("durable")
        gate.release(p)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(group_commit_callback)
        p3 = await gate.acquire("a")
        done.append("third admitted")
    assert done == ["durable", "third admitted"]
    gate.release(p3)
    gate.release(p)
    assert gate.statistics().buckets["a"].in_use == 0


async def test_cancelled_waiter_and_removed_bucket(autojump_clock: trio.testing.MockClock) -> None:
    gate = WritePermitGate.create(
        LagSource(), PermitSettings(**{**PARAMS, "min_capacity": 1, "max_capacity": 1})
    )
    gate.add_bucket("a")
    p = gate.try_acquire("a")
    assert p is not None
    with trio.move_on_after(0.5):  # the write's deadline
        await gate.acquire("a")
    s = gate.statistics().buckets["a"]
    assert (s.waiting, s.interrupted, s.in_use) == (0, 1, 1)

    async def remove_soon() -> None:
        await trio.sleep(0.1)
        gate.remove_bucket("a")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(remove_soon)
        with pytest.raises(BucketNotFound, match="was removed"):
            await gate.acquire("a")
    gate.release(p)


@given(
    st.lists(
        st.tuples(st.sampled_from(["acquire", "release", "abandon", "lag"]), st.integers(0, 300)),
        max_size=80,
    )
)
def test_no_free_permit_while_someone_waits(steps: list[tuple[str, int]]) -> None:
    wp, clock = core()
    p = wp.permits("a")
    held = 0
    waiting: list[Waiter] = []
    for action, n in steps:
        clock.t += 0.001
        if action == "acquire":
            _, w = wp.enqueue("a")
            if w is None:
                held += 1
            else:
                waiting.append(w)
        elif action == "release" and held:
            held -= 1
            wp.release(p)
        elif action == "abandon" and waiting:
            w = waiting[n % len(waiting)]
            if not w.granted:
                waiting.remove(w)
                wp.abandon(p, w)
        elif action == "lag":
            wp.adjust(n)
        held += sum(1 for w in waiting if w.granted)
        waiting = [w for w in waiting if not w.granted]
        assert p.in_use == held
        assert len(p.waiters) == len(waiting)
        assert not (p.waiters and p.in_use < wp.capacity)  # work-conserving
        assert 2 <= wp.capacity <= 10


async def test_the_sampler_rests_while_nothing_is_queued_until_a_write_comes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A quiet node pays no wake-ups: after QUIET_SAMPLES samples at rest the
    sampler sleeps, and the next write's admission wakes it to sample at once."""
    lag = LagSource()
    gate = WritePermitGate.create(lag, PermitSettings(**PARAMS, adjustment_interval_ms=10))
    gate.add_bucket("a")
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.run)
        await trio.sleep(1.0)
        resting = gate.statistics().evaluations
        assert resting == QUIET_SAMPLES
        await trio.sleep(10.0)
        assert gate.statistics().evaluations == resting  # no wake-ups while quiet
        # Writes come, and the writer lags: the first write wakes the sampler,
        # which follows the lag again at every interval.
        lag.lag = 150
        p = gate.try_acquire("a")
        assert p is not None
        await trio.sleep(0.001)
        assert gate.statistics().evaluations == resting + 1
        assert gate.permits.capacity == 6
        await trio.sleep(0.1)
        assert gate.statistics().evaluations == resting + 11
        # The waiting path wakes it too.
        lag.lag = 0
        await trio.sleep(0.3)
        resting = gate.statistics().evaluations
        await trio.sleep(1.0)
        assert gate.statistics().evaluations == resting
        assert gate.permits.capacity == 10
        await gate.acquire("a")
        await trio.sleep(0.001)
        assert gate.statistics().evaluations == resting + 1
        nursery.cancel_scope.cancel()
