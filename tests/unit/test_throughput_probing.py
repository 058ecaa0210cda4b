"""Throughput probing: the pure prober on synthetic pools and counts, the loop on autojump time.

The scenarios follow MongoDB's ``throughput_probing_test.cpp``: a baseline
probe, then one probe per 100 ms "interval" with a chosen finished count, so a
count that grows faster than before is a throughput increase.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable

import pytest
import trio
import trio.lowlevel
import trio.testing

from tenantkv.admission.execution_tickets import TicketHolder
from tenantkv.admission.throughput_probing import (
    ADJUSTMENT_INTERVAL_MS,
    FIXED_READS,
    FIXED_WRITES,
    INITIAL_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_STEP_MULTIPLE,
    MIN_CONCURRENCY,
    MOVING_AVERAGE_WEIGHT,
    PROBING_PARAMETERS,
    READ_WRITE_RATIO,
    STEP_MULTIPLE,
    ProbingState,
    ThroughputProber,
    run_probing,
    validate_probing_param,
    validate_probing_params,
)
from tenantkv.errors import BadValue

STABLE, UP, DOWN, FIXED = (
    ProbingState.STABLE,
    ProbingState.UP,
    ProbingState.DOWN,
    ProbingState.FIXED,
)


class FakePool:
    """A synthetic ticket pool: the test sets its peak use."""

    def __init__(self) -> None:
        self.total_tickets = 0
        self.peak = 0
        self.finished_processing = 0

    def resize(self, total_tickets: int) -> None:
        self.total_tickets = total_tickets

    def peak_used_and_reset(self) -> int:
        peak, self.peak = self.peak, 0
        return peak


class Rig:
    """A prober over two fake pools, its baseline taken; ``run`` is one interval later."""

    def __init__(self, initial: int, **params: object) -> None:
        self.read = FakePool()
        self.write = FakePool()
        params.setdefault(INITIAL_CONCURRENCY, initial)
        self.prober = ThroughputProber(self.read, self.write, cpu_count=4, **params)
        self.t = 0.0
        assert self.prober.probe(self.t, 0) is STABLE  # baseline only

    def run(self, finished: int) -> ProbingState:
        self.t += 0.1
        return self.prober.probe(self.t, finished)

    @property
    def sizes(self) -> tuple[int, int]:
        return self.read.total_tickets, self.write.total_tickets

    def stats(self) -> dict[str, object]:
        return self.prober.statistics().as_dict()


# --------------------------------------------------------------------------- probing up / down


def test_probe_up_succeeds_settles_between() -> None:
    rig = Rig(64)
    assert rig.sizes == (32, 32)
    rig.read.peak = 32  # reads ran out of tickets
    assert rig.run(1) is UP
    assert rig.sizes == (35, 35)
    assert rig.run(3) is STABLE  # 20 ops/s beat the 10 ops/s baseline
    r, w = rig.sizes
    assert 32 < r < 35 and 32 < w < 35
    s = rig.prober.statistics()
    assert s.stable_concurrency == pytest.approx(0.2 * 70 + 0.8 * 64)
    assert s.stable_throughput == pytest.approx(20.0)
    assert (s.times_probed_stable, s.times_probed_up, s.times_probed_down) == (1, 1, 0)
    assert (s.times_increased, s.times_decreased) == (1, 0)
    assert s.total_amount_increased == pytest.approx(1.2)
    assert s.total_amount_decreased == 0.0


def test_probe_up_fails_returns() -> None:
    rig = Rig(64)
    rig.read.peak = 32
    rig.run(1)
    assert rig.sizes == (35, 35)
    assert rig.run(2) is STABLE  # 10 ops/s again: no better
    assert rig.sizes == (32, 32)
    s = rig.prober.statistics()
    assert (s.times_probed_up, s.times_increased, s.total_amount_increased) == (1, 0, 0.0)
    assert s.stable_concurrency == 64.0


def test_probe_down_succeeds_settles_between() -> None:
    rig = Rig(64)
    rig.read.peak = 31  # tickets to spare
    assert rig.run(1) is DOWN
    assert rig.sizes == (29, 29)
    assert rig.run(3) is STABLE
    r, w = rig.sizes
    assert 29 < r < 32 and 29 < w < 32
    s = rig.prober.statistics()
    assert (s.times_probed_stable, s.times_probed_up, s.times_probed_down) == (1, 0, 1)
    assert (s.times_increased, s.times_decreased) == (0, 1)
    assert s.total_amount_decreased == pytest.approx(1.2)


def test_probe_down_fails_returns() -> None:
    rig = Rig(64)
    rig.read.peak = 31
    rig.run(1)
    assert rig.run(2) is STABLE
    assert rig.sizes == (32, 32)
    s = rig.prober.statistics()
    assert (s.times_probed_down, s.times_decreased) == (1, 0)


def test_at_max_exhausted_probes_down() -> None:
    rig = Rig(256)
    assert rig.sizes == (128, 128)
    rig.read.peak = 128
    rig.write.peak = 128
    assert rig.run(1) is DOWN
    assert rig.sizes == (115, 115)
    s = rig.prober.statistics()
    assert (s.times_probed_stable, s.times_probed_up) == (1, 0)


def test_at_min_with_low_use_nothing_changes(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(8)
    assert rig.sizes == (4, 4)
    rig.read.peak = 3
    with caplog.at_level(logging.INFO, logger="tenantkv.admission"):
        assert rig.run(1) is STABLE
    assert rig.sizes == (4, 4)
    assert rig.prober.statistics().times_probed_stable == 1
    assert not caplog.records


def test_at_min_small_step_still_moves_by_one() -> None:
    # The MongoDB scenario: weight 0.3 takes two successful probes to gain a ticket.
    # Two successes in a row: without the boost (max step = step) for MongoDB's figures.
    rig = Rig(8, **{STEP_MULTIPLE: 0.1, MOVING_AVERAGE_WEIGHT: 0.3, MAX_STEP_MULTIPLE: 0.1})
    assert round(4 * 1.1) == 4  # the step alone would not reach the next integer
    rig.read.peak = 4
    assert rig.run(1) is UP
    assert rig.sizes == (5, 5)
    rig.run(3)
    assert rig.sizes == (4, 4)  # stable 8.6: not enough yet
    assert rig.prober.stable_concurrency == pytest.approx(8.6)
    rig.read.peak = 4
    rig.run(4)
    assert rig.sizes == (5, 5)
    rig.run(6)
    assert rig.sizes == (5, 5)  # stable 9.02: now it is
    assert rig.prober.stable_concurrency == pytest.approx(9.02)
    assert rig.prober.statistics().times_increased == 2


def test_read_write_ratio_write_pool_exhausted() -> None:
    rig = Rig(64)
    rig.prober.configure(**{READ_WRITE_RATIO: 0.67})
    assert rig.sizes == (43, 21)
    assert rig.run(0) is STABLE  # the resize restarted the measurement: baseline only
    assert rig.prober.statistics().times_probed_stable == 0
    rig.write.peak = 21
    assert rig.run(1) is UP
    r, w = rig.sizes
    assert r > 32 and w < 32 and r + w > 64 and r > w
    assert rig.run(3) is STABLE
    r2, w2 = rig.sizes
    assert 32 < r2 < r and w2 <= w and w2 < 32 and r2 + w2 > 64 and r2 > w2
    assert rig.prober.statistics().times_increased == 1


def test_read_heavy_moves_the_clamped_write_pool_by_one() -> None:
    rig = Rig(16, **{READ_WRITE_RATIO: 0.9})
    assert rig.sizes == (14, 4)  # writes clamped up to the minimum
    assert math.floor(4 * 1.1 + 0.5) == 4
    rig.write.peak = 4
    assert rig.run(1) is UP
    assert rig.sizes[0] > 14
    assert rig.sizes[1] == 5


def test_read_heavy_down_keeps_the_write_pool_at_min() -> None:
    rig = Rig(16, **{READ_WRITE_RATIO: 0.9})
    rig.read.peak = 13
    assert rig.run(1) is DOWN
    # MongoDB would nudge writes to 3, below the minimum; we keep the bound.
    assert rig.sizes == (13, 4)


def test_write_heavy_moves_the_clamped_read_pool_by_one() -> None:
    rig = Rig(16, **{READ_WRITE_RATIO: 0.1})
    assert rig.sizes == (4, 14)
    rig.read.peak = 4
    assert rig.run(1) is UP
    assert rig.sizes[0] == 5
    assert rig.sizes[1] > 14


def test_write_heavy_down_keeps_the_read_pool_at_min() -> None:
    rig = Rig(16, **{READ_WRITE_RATIO: 0.1})
    rig.write.peak = 13
    assert rig.run(1) is DOWN
    assert rig.sizes == (4, 13)


def test_nudge_respects_max() -> None:
    # Writes at the maximum, reads exhausted below it: writes cannot grow.
    rig = Rig(64, **{MAX_CONCURRENCY: 32, READ_WRITE_RATIO: 0.25})
    assert rig.sizes == (16, 32)  # 48 writes wanted, clamped
    rig.read.peak = 16
    assert rig.run(1) is UP
    assert rig.sizes == (18, 32)


# --------------------------------------------------------------------------- probing boost


class Load:
    """Drives a :class:`Rig` a probe at a time: ``probe(ops)`` counts ``ops`` finished in
    the interval up to the probe (its throughput x 0.1 s), with every pool run out of
    tickets in it (``exhausted``: probing goes up) or one below its size (it goes down)."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.finished = 0

    def probe(self, ops: int, *, exhausted: bool = True) -> ProbingState:
        r, w = self.rig.sizes
        self.rig.read.peak, self.rig.write.peak = (r, w) if exhausted else (r - 1, w - 1)
        self.finished += ops
        return self.rig.run(self.finished)

    def cycle(self, *, better: bool, up: bool = True, ops: int = 1000) -> None:
        """A stable probe (the baseline: ``ops``), then the probe's result."""
        assert self.probe(ops, exhausted=up) is (UP if up else DOWN)
        assert self.probe(ops + 1 if better else ops, exhausted=up) is STABLE
        self.rig.read.peak = self.rig.write.peak = 0


def test_boost_doubles_step_and_weight_while_probes_succeed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig(64, **{MAX_CONCURRENCY: 512})  # step 0.1, weight 0.2, max step 1.0: defaults
    load = Load(rig)
    stable = 64.0
    # (step, weight, probed sizes) of each successful probe up in a row
    for step, weight, probed in [
        (0.1, 0.2, 35),  # 64 x 1.1 = 70.4: MongoDB's step
        (0.2, 0.4, 39),  # 65.2 x 1.2 = 78.24
        (0.4, 0.8, 49),  # 70.32 x 1.4 = 98.4
        (0.8, 1.0, 83),  # 92.46 x 1.8 = 166.4
        (1.0, 1.0, 166),  # 166 x 2: the maximum step
        (1.0, 1.0, 332),
    ]:
        with caplog.at_level(logging.DEBUG, logger="tenantkv.admission"):
            assert load.probe(1000) is UP
            assert rig.sizes == (probed, probed)
            assert rig.prober.statistics().last_step_multiple == pytest.approx(step)
            assert load.probe(1001) is STABLE
        stable = weight * 2 * probed + (1 - weight) * stable
        assert rig.prober.stable_concurrency == pytest.approx(stable)
    assert stable == pytest.approx(664)
    s = rig.stats()
    assert (s["streak"], s["streak_direction"], s["times_increased"]) == (6, "up", 6)
    assert "probing up, boost x10" in caplog.text


def test_boost_resets_on_a_failed_probe() -> None:
    rig = Rig(64)
    load = Load(rig)
    load.cycle(better=True)
    load.cycle(better=True)
    assert (rig.stats()["streak"], rig.stats()["last_step_multiple"]) == (2, 0.2)
    load.cycle(better=False)  # a probe up by 0.4 that did not pay
    assert (rig.stats()["streak"], rig.stats()["streak_direction"]) == (0, "none")
    assert rig.stats()["last_step_multiple"] == 0.4
    stable = rig.prober.stable_concurrency
    assert load.probe(1000) is UP
    assert rig.prober.statistics().last_step_multiple == 0.1  # MongoDB's step again
    assert sum(rig.sizes) == round(stable * 1.1 / 2) * 2
    load.probe(1001)
    assert rig.stats()["streak"] == 1


def test_boost_resets_on_a_change_of_direction() -> None:
    rig = Rig(64)
    load = Load(rig)
    load.cycle(better=True)
    load.cycle(better=True)
    assert (rig.stats()["streak"], rig.stats()["streak_direction"]) == (2, "up")
    stable = rig.prober.stable_concurrency  # 70.32
    assert load.probe(1000, exhausted=False) is DOWN
    assert rig.stats()["last_step_multiple"] == 0.1  # not 0.4: a new direction
    assert rig.stats()["streak"] == 0
    assert sum(rig.sizes) == 2 * round(stable * 0.9 / 2)
    load.probe(1001, exhausted=False)  # the probe down paid: weight 0.2, not 0.8
    assert rig.prober.stable_concurrency == pytest.approx(0.8 * stable + 0.2 * 64)
    assert (rig.stats()["streak"], rig.stats()["streak_direction"]) == (1, "down")
    load.cycle(better=True, up=False)
    assert (rig.stats()["streak"], rig.stats()["last_step_multiple"]) == (2, 0.2)
    load.cycle(better=True)  # up again: the down streak is over
    assert (rig.stats()["streak"], rig.stats()["streak_direction"]) == (1, "up")
    assert rig.stats()["last_step_multiple"] == 0.1


def test_boost_resets_when_nothing_is_probed_or_the_sizes_are_reset() -> None:
    rig = Rig(64)
    load = Load(rig)
    load.cycle(better=True)
    rig.read.peak = rig.write.peak = 2  # no pool ran out, none used above the minimum
    assert rig.run(load.finished) is STABLE
    assert rig.stats()["streak"] == 0
    load.cycle(better=True)
    rig.prober.configure(**{READ_WRITE_RATIO: 0.6})  # a resize
    assert rig.stats()["streak"] == 0


def test_boost_down_steps_at_most_halve() -> None:
    rig = Rig(1024, **{MAX_CONCURRENCY: 512, MAX_STEP_MULTIPLE: 4.0})
    load = Load(rig)
    steps = []
    for _ in range(5):
        load.cycle(better=True, up=False)
        steps.append(rig.stats()["last_step_multiple"])
    assert steps == [0.1, 0.2, 0.4, 0.5, 0.5]  # not 0.8 and 1.6: never below half
    assert rig.prober.stable_concurrency == 158.0  # 1024 -> 1003.6 -> 923 -> 628 -> 314


def test_boost_up_steps_up_to_the_maximum() -> None:
    rig = Rig(8, **{MAX_CONCURRENCY: 100_000, MAX_STEP_MULTIPLE: 4.0})
    load = Load(rig)
    steps = []
    for _ in range(8):
        load.cycle(better=True)
        steps.append(rig.stats()["last_step_multiple"])
    assert steps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0])


@pytest.mark.parametrize("max_step", [0.01, 0.05, 0.1])
def test_no_boost_when_max_step_is_not_above_the_step(max_step: float) -> None:
    rig = Rig(64, **{MAX_STEP_MULTIPLE: max_step})
    load = Load(rig)
    stable = 64.0
    for _ in range(6):
        assert load.probe(1000) is UP
        probed = sum(rig.sizes)
        assert probed == 2 * round(stable * 1.1 / 2)  # MongoDB's step, never less
        assert load.probe(1001) is STABLE
        stable = 0.2 * probed + 0.8 * stable  # and MongoDB's weight
        assert rig.prober.stable_concurrency == pytest.approx(stable)
    assert rig.stats()["streak"] == 6  # counted all the same
    assert rig.stats()["last_step_multiple"] == 0.1


def test_max_step_applies_at_runtime() -> None:
    rig = Rig(64)
    load = Load(rig)
    assert rig.prober.parameters()[MAX_STEP_MULTIPLE] == 1.0
    load.cycle(better=True)
    load.cycle(better=True)
    rig.prober.configure(**{MAX_STEP_MULTIPLE: 0.1})  # boost off: no resize, next probe
    assert rig.prober.parameters()[MAX_STEP_MULTIPLE] == 0.1
    assert rig.prober.state is STABLE and rig.stats()["streak"] == 2
    load.cycle(better=True)
    assert rig.stats()["last_step_multiple"] == 0.1
    rig.prober.configure(**{MAX_STEP_MULTIPLE: 0.25})  # back on, capped at 0.25
    load.cycle(better=True)
    assert rig.stats()["last_step_multiple"] == 0.25  # streak 3: 0.8, capped
    with pytest.raises(BadValue) as ei:
        rig.prober.configure(**{MAX_STEP_MULTIPLE: 4.5, STEP_MULTIPLE: 0.2})
    assert MAX_STEP_MULTIPLE in ei.value.errmsg
    assert rig.prober.parameters()[MAX_STEP_MULTIPLE] == 0.25
    assert rig.prober.parameters()[STEP_MULTIPLE] == 0.1


# A deterministic synthetic storage for whole runs: throughput k x min(c, optimum) for c
# operations at once, then (``decline``) falling as (optimum / c) ** decline past the
# optimum; every interval's count is off by up to ±3 % (pseudo-random, fixed seed).


def storage(optimum: float, decline: float = 0.0, k: float = 100.0) -> Callable[[float], float]:
    def rate(c: float) -> float:
        return k * c if c <= optimum else k * optimum * (optimum / c) ** decline

    return rate


class Simulation:
    """A prober on fake pools under a load; ``run`` advances by 100 ms probes.

    ``demand`` operations per pool want tickets (peak use = min(size, demand): below
    the size, probing probes down); ``rate`` gives the storage's throughput for the
    operations running (both pools).
    """

    def __init__(self, seed: int = 7, **params: object) -> None:
        self.read, self.write = FakePool(), FakePool()
        self.prober = ThroughputProber(self.read, self.write, cpu_count=2, **params)
        self.rng = random.Random(seed)
        self.t = 0.0
        self.finished = 0.0
        self.prober.probe(self.t, 0)

    def run(
        self, seconds: float, rate: Callable[[float], float], demand: Callable[[int], int]
    ) -> list[tuple[float, float]]:
        """``seconds`` of probes; each probe's (time, stable concurrency)."""
        out = []
        for _ in range(round(seconds / 0.1)):
            r, w = self.read.total_tickets, self.write.total_tickets
            self.read.peak, self.write.peak = min(r, demand(r)), min(w, demand(w))
            running = self.read.peak + self.write.peak
            self.finished += rate(running) * 0.1 * self.rng.uniform(0.97, 1.03)
            self.t += 0.1
            self.prober.probe(self.t, int(self.finished))
            out.append((self.t, self.prober.stable_concurrency))
        return out


def saturated(size: int) -> int:
    """The bench's closed loop: more operations than tickets, always."""
    return 10**6


def _time_to(trace: list[tuple[float, float]], ok: Callable[[float], bool]) -> float | None:
    """When the stable concurrency first met ``ok`` and kept to it to the end."""
    first = None
    for t, stable in trace:
        if not ok(stable):
            first = None
        elif first is None:
            first = t
    return first


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_boost_reaches_the_optimum_from_the_minimum_within_10_s(seed: int) -> None:
    # From 4 + 4 tickets, a storage best at 256 operations (and no worse past it).
    rate = storage(256)
    best = rate(256)
    from_min = {INITIAL_CONCURRENCY: 8, MAX_CONCURRENCY: 512}
    boosted = Simulation(seed, **from_min)
    trace = boosted.run(10.0, rate, saturated)
    reached = _time_to(trace, lambda c: rate(c) >= 0.95 * best)
    assert reached is not None and reached <= 3.0  # 1.6 s: 8 successful probes up
    # MongoDB's probing (no boost): ~2 % per successful probe, 8 -> 29 in 10 s (11 %
    # of the best); it reaches 95 % after 31 s.
    mongodb = Simulation(seed, **from_min, **{MAX_STEP_MULTIPLE: 0.1})
    trace = mongodb.run(10.0, rate, saturated)
    assert _time_to(trace, lambda c: rate(c) >= 0.95 * best) is None
    assert rate(trace[-1][1]) < 0.15 * best


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_boost_shrinks_quickly_when_the_optimum_drops(seed: int) -> None:
    # Settled at 256 on a storage best at 256; then the workload switches to one best
    # at 16 that thrashes past it (throughput ~ 1 / sqrt(c)). The load never runs the
    # pools out (peak use one below the size, as in MongoDB's tests), so probing probes
    # down; up probes never happen here.
    def below(size: int) -> int:
        return size - 1

    def run(**params: object) -> tuple[float | None, float]:
        sim = Simulation(seed, **{INITIAL_CONCURRENCY: 256, MAX_CONCURRENCY: 512}, **params)
        before = sim.run(5.0, storage(256), below)
        assert 240 <= before[-1][1] <= 260  # probes down below 256 do not pay
        rate = storage(16, decline=0.5)
        trace = sim.run(20.0, rate, below)
        # 95 % of the new best (c - 2 operations run: peak use is one below each size)
        reached = _time_to(trace, lambda c: rate(c - 2) >= 0.95 * rate(16))
        return (None if reached is None else reached - 5.0), trace[-1][1]

    reached, final = run()
    assert reached is not None and reached <= 2.0  # 1.6 s: 256 -> 20 in 6 probes down
    assert 16 <= final <= 20
    # MongoDB's probing: down ~2 % per successful probe, 256 -> ~40 in 20 s; it
    # reaches 95 % after 28 s.
    reached, final = run(**{MAX_STEP_MULTIPLE: 0.1})
    assert reached is None and final > 32


# --------------------------------------------------------------------------- measurement


def test_no_elapsed_time_no_decision() -> None:
    rig = Rig(64)
    rig.read.peak = 32
    assert rig.prober.probe(rig.t, 5) is STABLE  # same instant: wait
    assert rig.sizes == (32, 32)
    assert rig.prober.statistics().times_probed_stable == 0
    assert rig.run(6) is UP  # measured from the baseline: 60 ops/s


def test_counter_going_backwards_restarts_baseline() -> None:
    rig = Rig(64)
    rig.run(10)
    rig.read.peak = 32
    assert rig.run(3) is STABLE  # fewer than before: a new baseline, no decision
    assert rig.prober.statistics().times_probed_stable == 1


def test_reads_finished_counts_from_real_holders() -> None:
    reads, writes = TicketHolder(0, name="read"), TicketHolder(0, name="write")
    prober = ThroughputProber(reads, writes, **{INITIAL_CONCURRENCY: 64})
    assert (reads.total_tickets, writes.total_tickets) == (32, 32)
    prober.probe(0.0)
    held = [reads.try_acquire() for _ in range(32)]
    for t in held:
        t.release()  # type: ignore[union-attr]
    writes.try_acquire().release()  # type: ignore[union-attr]
    assert prober.probe(0.1) is UP  # reads peaked at 32
    assert prober.statistics().stable_throughput == pytest.approx(330.0)
    assert (reads.total_tickets, writes.total_tickets) == (35, 35)


def test_size_change_logs_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(64)
    rig.read.peak = 32
    rig.t += 5  # well past the initial sizing's INFO line
    with caplog.at_level(logging.DEBUG, logger="tenantkv.admission"):
        rig.run(1)
        rig.run(3)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "execution tickets: read 32→35, write 32→35 (probing up)",
        "execution tickets: read 35→33, write 35→33 (probe up raised throughput)",
    ]
    # at most one INFO line a second: the quick second change goes to DEBUG
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.DEBUG]


def test_statistics_record() -> None:
    rig = Rig(64)
    d = rig.stats()
    assert d == {
        "state": "stable",
        "read_concurrency": 32,
        "write_concurrency": 32,
        "stable_concurrency": 64.0,
        "stable_throughput": 0.0,
        "times_probed_stable": 0,
        "times_probed_up": 0,
        "times_probed_down": 0,
        "times_increased": 0,
        "times_decreased": 0,
        "total_amount_increased": 0.0,
        "total_amount_decreased": 0.0,
        "streak": 0,
        "streak_direction": "none",
        "last_step_multiple": 0.0,
    }
    with pytest.raises(AttributeError):
        rig.prober.statistics().times_probed_up = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- initial concurrency


def test_default_initial_is_the_maximum() -> None:
    read, write = FakePool(), FakePool()
    ThroughputProber(read, write, cpu_count=2)
    assert (read.total_tickets, write.total_tickets) == (128, 128)


def test_initial_zero_is_twice_the_cpus() -> None:
    read, write = FakePool(), FakePool()
    zero = {"throughput_probing_initial_concurrency": 0}
    ThroughputProber(read, write, cpu_count=8, **zero)
    assert (read.total_tickets, write.total_tickets) == (8, 8)
    ThroughputProber(read, write, **zero)  # the machine's own count, within bounds
    assert 4 <= read.total_tickets <= 128


def test_initial_from_few_cpus_is_clamped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    read, write = FakePool(), FakePool()
    with caplog.at_level(logging.WARNING, logger="tenantkv.admission"):
        ThroughputProber(read, write, cpu_count=1, throughput_probing_initial_concurrency=0)
    assert (read.total_tickets, write.total_tickets) == (4, 4)
    assert not caplog.records


@pytest.mark.parametrize(("initial", "sizes"), [(2, (4, 4)), (1000, (128, 128))])
def test_explicit_initial_outside_range_warns(
    caplog: pytest.LogCaptureFixture, initial: int, sizes: tuple[int, int]
) -> None:
    read, write = FakePool(), FakePool()
    with caplog.at_level(logging.WARNING, logger="tenantkv.admission"):
        ThroughputProber(read, write, **{INITIAL_CONCURRENCY: initial})
    assert (read.total_tickets, write.total_tickets) == sizes
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert INITIAL_CONCURRENCY in record.getMessage()
    assert "[8, 256]" in record.getMessage()


# --------------------------------------------------------------------------- parameters

GOOD_BAD: list[tuple[str, list[object], list[object]]] = [
    (INITIAL_CONCURRENCY, [0, 1, 1000], [-1, 1.5, True, "8", None]),
    (MIN_CONCURRENCY, [1, 4, 128], [0, -3, 2.0]),
    (MAX_CONCURRENCY, [1, 128, 10_000], [0, -1, 128.0]),
    (READ_WRITE_RATIO, [0, 0.0, 0.67, 1, 1.0], [-0.01, 1.01, math.nan, math.inf, False, "0.5"]),
    (MOVING_AVERAGE_WEIGHT, [0.001, 0.2, 1], [0, 0.0, 1.5, -0.1]),
    (STEP_MULTIPLE, [0.01, 0.1, 0.5], [0.0099, 0.51, 0]),
    (MAX_STEP_MULTIPLE, [0.01, 0.1, 1, 1.0, 4], [0.0099, 4.01, 0, -1.0, math.inf, True, "1"]),
    (ADJUSTMENT_INTERVAL_MS, [10, 100, 60_000], [9, 0, 10.5]),
    (FIXED_READS, [0, 7], [-1, 1.0]),
    (FIXED_WRITES, [0, 7], [-1, 1.0]),
]


@pytest.mark.parametrize(("name", "good", "bad"), GOOD_BAD)
def test_parameter_ranges(name: str, good: list[object], bad: list[object]) -> None:
    for value in good:
        assert validate_probing_param(name, value) == value
    for value in bad:
        with pytest.raises(BadValue) as ei:
            validate_probing_param(name, value)
        assert name in ei.value.errmsg
        assert PROBING_PARAMETERS[name].describe() in ei.value.errmsg
    assert {n for n, _, _ in GOOD_BAD} == set(PROBING_PARAMETERS)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (STEP_MULTIPLE, 0.6, f"{STEP_MULTIPLE} must be a number in [0.01, 0.5], got 0.6"),
        (MAX_STEP_MULTIPLE, 5, f"{MAX_STEP_MULTIPLE} must be a number in [0.01, 4], got 5"),
        (MOVING_AVERAGE_WEIGHT, 0, f"{MOVING_AVERAGE_WEIGHT} must be a number in (0, 1], got 0"),
        (READ_WRITE_RATIO, 2, f"{READ_WRITE_RATIO} must be a number in [0, 1], got 2"),
        (MIN_CONCURRENCY, 0, f"{MIN_CONCURRENCY} must be an integer >= 1, got 0"),
        (ADJUSTMENT_INTERVAL_MS, 5, f"{ADJUSTMENT_INTERVAL_MS} must be an integer >= 10, got 5"),
        (FIXED_READS, -1, f"{FIXED_READS} must be an integer >= 0, got -1"),
    ],
)
def test_parameter_messages(name: str, value: object, message: str) -> None:
    with pytest.raises(BadValue) as ei:
        validate_probing_param(name, value)
    assert ei.value.errmsg == message


def test_ratio_is_normalised_to_float() -> None:
    v = validate_probing_param(READ_WRITE_RATIO, 1)
    assert v == 1.0 and isinstance(v, float)


def test_unknown_parameter() -> None:
    with pytest.raises(BadValue, match="unknown"):
        validate_probing_param("throughput_probing_speed", 1)


def test_min_must_not_exceed_max() -> None:
    validate_probing_params({MIN_CONCURRENCY: 8, MAX_CONCURRENCY: 8})
    with pytest.raises(BadValue) as ei:
        validate_probing_params({MIN_CONCURRENCY: 10, MAX_CONCURRENCY: 8})
    assert ei.value.errmsg == f"{MIN_CONCURRENCY} (10) must not exceed {MAX_CONCURRENCY} (8)"
    with pytest.raises(BadValue):
        validate_probing_params({MAX_CONCURRENCY: 3})  # against the default min 4
    with pytest.raises(BadValue):
        ThroughputProber(FakePool(), FakePool(), **{MIN_CONCURRENCY: 200})


def test_configure_is_all_or_nothing() -> None:
    rig = Rig(64)
    before = rig.prober.parameters()
    with pytest.raises(BadValue):
        rig.prober.configure(**{STEP_MULTIPLE: 0.2, MIN_CONCURRENCY: 200})
    with pytest.raises(BadValue):
        rig.prober.configure(**{STEP_MULTIPLE: 0.2, "nonsense": 1})
    assert rig.prober.parameters() == before
    assert rig.sizes == (32, 32)


def test_configure_bounds_ratio_and_initial() -> None:
    rig = Rig(64)
    rig.prober.configure(**{MIN_CONCURRENCY: 8})
    assert rig.sizes == (32, 32)
    rig.prober.configure(**{MAX_CONCURRENCY: 16})
    assert rig.sizes == (16, 16)
    assert rig.prober.stable_concurrency == 32.0  # clamped to 2 x max
    rig.prober.configure(**{MAX_CONCURRENCY: 128, MIN_CONCURRENCY: 4, INITIAL_CONCURRENCY: 40})
    assert rig.sizes == (20, 20)
    assert rig.prober.parameters()[INITIAL_CONCURRENCY] == 40
    rig.prober.configure(**{STEP_MULTIPLE: 0.5, ADJUSTMENT_INTERVAL_MS: 250})
    assert rig.sizes == (20, 20)
    assert rig.prober.interval_secs == 0.25
    rig.read.peak = 20
    rig.run(0)  # baseline again (the last resize restarted the measurement)
    rig.read.peak = 20
    assert rig.run(1) is UP
    assert rig.sizes == (30, 30)  # the new step: 40 x 1.5


def test_configure_mid_probe_returns_to_stable() -> None:
    rig = Rig(64)
    rig.read.peak = 32
    assert rig.run(1) is UP
    rig.prober.configure(**{READ_WRITE_RATIO: 0.5})  # unchanged: nothing happens
    assert rig.prober.state is UP
    rig.prober.configure(**{READ_WRITE_RATIO: 0.75})
    assert rig.prober.state is STABLE
    assert rig.sizes == (48, 16)


def test_fixed_sizes_turn_probing_off_and_on() -> None:
    rig = Rig(64)
    rig.prober.configure(**{FIXED_READS: 10})
    assert rig.prober.state is FIXED and not rig.prober.enabled
    assert rig.sizes == (10, 32)  # writes keep the stable concurrency's size
    rig.read.peak = 10
    assert rig.run(5) is FIXED
    assert rig.sizes == (10, 32)
    rig.prober.configure(**{FIXED_WRITES: 3})
    assert rig.sizes == (10, 3)
    assert rig.stats()["state"] == "fixed"
    rig.prober.configure(**{FIXED_READS: 0, FIXED_WRITES: 0})
    assert rig.prober.state is STABLE and rig.sizes == (32, 32)
    rig.read.peak = 32
    assert rig.run(6) is STABLE  # baseline first
    rig.read.peak = 32
    assert rig.run(7) is UP


def test_fixed_from_the_start() -> None:
    read, write = FakePool(), FakePool()
    prober = ThroughputProber(
        read, write, **{FIXED_READS: 64, FIXED_WRITES: 16, INITIAL_CONCURRENCY: 20}
    )
    assert prober.state is FIXED
    assert (read.total_tickets, write.total_tickets) == (64, 16)


# --------------------------------------------------------------------------- the Trio loop


async def test_run_probing_probes_every_interval(autojump_clock: trio.testing.MockClock) -> None:
    reads, writes = TicketHolder(0, name="read"), TicketHolder(0, name="write")
    prober = ThroughputProber(reads, writes, **{INITIAL_CONCURRENCY: 16})

    async def worker(pool: TicketHolder) -> None:
        while True:
            ticket = await pool.acquire()
            # A storage that slows down as more run at once (12 is its sweet spot).
            await trio.sleep(0.001 * max(1.0, (reads.out + writes.out) / 12))
            ticket.release()
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for _ in range(40):
            nursery.start_soon(worker, reads)
            nursery.start_soon(worker, writes)
        await nursery.start(run_probing, prober)
        await trio.sleep(1.05)
        s = prober.statistics()
        assert s.times_probed_stable + s.times_probed_up + s.times_probed_down == 10
        prober.configure(**{ADJUSTMENT_INTERVAL_MS: 500})
        await trio.sleep(1.0)
        s2 = prober.statistics()
        probes = s2.times_probed_stable + s2.times_probed_up + s2.times_probed_down
        assert 11 <= probes <= 13
        nursery.cancel_scope.cancel()
    assert 4 <= reads.total_tickets <= 128 and 4 <= writes.total_tickets <= 128
    assert s2.times_probed_up > 0  # the pools ran out: it probed for more


async def test_run_probing_stops_on_error(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(FakePool):
        def peak_used_and_reset(self) -> int:
            raise RuntimeError("boom")

    prober = ThroughputProber(Broken(), FakePool(), **{INITIAL_CONCURRENCY: 16})
    with caplog.at_level(logging.ERROR, logger="tenantkv.admission"), trio.fail_after(5):
        await run_probing(prober)  # returns: the second probe raised
    assert "throughput probing failed" in caplog.text
