"""Throughput probing: size the read and write ticket pools by what the storage delivers.

MongoDB's throughput probing, applied to the two
:class:`~tenantkv.admission.execution_tickets.TicketHolder` pools, plus a
*probing boost* of ours (below). Every
``throughput_probing_concurrency_adjustment_interval_ms`` (100 ms) the
:func:`run_probing` loop calls :meth:`ThroughputProber.probe`, which measures

    throughput = operations finished in both pools since the last probe / elapsed seconds

(the first probe, and the first after any outside change of the sizes, only
records a baseline) and moves one step of a small state machine:

``stable``
    Record the throughput as the baseline. If a pool is below the maximum and
    its peak use since the last stable probe reached its size (it ran out of
    tickets), probe **up**: sizes for ``stable concurrency x (1 + step)``.
    Otherwise, if a pool's peak use is above the minimum, probe **down**: sizes
    for ``stable concurrency x (1 - step)``, just below what is used. Otherwise
    stay.
``up`` / ``down`` (one interval after the step)
    If the throughput beat the baseline, the probed sizes were better: the
    stable concurrency moves towards them as a moving average,
    ``w x (read + write sizes) + (1 - w) x stable``, and the baseline becomes
    this throughput. Either way the sizes go back to those of the stable
    concurrency and the state to ``stable``.
``fixed``
    ``storage_engine_concurrent_read_transactions`` or
    ``storage_engine_concurrent_write_transactions`` is set (non-zero): probing
    is off, that pool has the fixed size, a pool left at 0 keeps the size of
    the stable concurrency.

Sizes from a total (the *stable concurrency* is a total over both pools, a float)
    ``reads = clamp(round(total x ratio))``, ``writes = clamp(round(total x
    (1 - ratio)))`` with ``clamp`` to ``[min, max]`` and halves rounded up. When
    an up or down step would leave a pool's size unchanged, that pool moves by
    one instead (within ``[min, max]``), so small pools still probe.

Probing boost (not MongoDB's; like TCP slow start)
    MongoDB's fixed step moves the stable concurrency by at most ``w x step``
    = 2 % per successful probe (one every two intervals, so ~10 %/s), and at
    small sizes a one-ticket step often gains less than the measurement noise:
    from the minimum it took 30 s and more to reach the sizes the storage
    wants (``python -m bench probing``). So successes in a row speed it up:
    after ``n`` successful probes in a row in one direction (the *streak*), the
    next probe that way steps by ``min(max step, step x 2**n)`` (down: also at
    most 0.5, the sizes never drop below half) and, if it succeeds too, moves
    the stable concurrency with the weight ``min(1, w x 2**n)``. A failed
    probe, a probe the other way, a stable probe that probes nothing and any
    resize by :meth:`ThroughputProber.configure` end the streak (``n = 0``), so
    around the optimum, where probes fail about every other time, it probes as
    MongoDB does. ``throughput_probing_max_step_multiple`` <= ``step``: no boost,
    exactly MongoDB's probing. From 4 + 4 tickets it doubles the pools with each
    successful probe after the fourth (8 -> ~600 tickets in 2 s on a synthetic
    storage, where MongoDB's probing needs 30 s to reach 256).
    A caution: a doubling step may land past the optimum of a storage that gets
    slower beyond it, and while the pools run out of tickets (below the
    maximum) probing only probes up (MongoDB's rule), so it stays there until
    the load leaves tickets unused.

Parameters (server parameters; :data:`PROBING_PARAMETERS` holds default, range
and help of each; :func:`validate_probing_param` checks one value,
:func:`validate_probing_params` a set of them plus ``min <= max``)

    ====================================================== ======= ==================
    name                                                   default range
    ====================================================== ======= ==================
    throughput_probing_initial_concurrency                 256     >= 0 (0: 2 x CPUs)
    throughput_probing_min_concurrency                     4       >= 1, <= max
    throughput_probing_max_concurrency                     128     >= 1, >= min
    throughput_probing_read_write_ratio                    0.5     [0, 1]
    throughput_probing_concurrency_moving_average_weight   0.2     (0, 1]
    throughput_probing_step_multiple                       0.1     [0.01, 0.5]
    throughput_probing_max_step_multiple                   1.0     [0.01, 4] (boost)
    throughput_probing_concurrency_adjustment_interval_ms  100     >= 10
    storage_engine_concurrent_read_transactions            0       >= 0 (0: probing)
    storage_engine_concurrent_write_transactions           0       >= 0 (0: probing)
    ====================================================== ======= ==================

    (The server's own defaults for initial and max are 1024 and 512:
    ``tenantkv.config.SERVER_PROBING_DEFAULTS``.)
    The initial concurrency is a total over both pools, clamped to
    ``[2 x min, 2 x max]`` (a warning is logged when an explicit value is out of
    that range). :meth:`ThroughputProber.configure` applies changed values at run
    time, all or nothing: min, max or ratio reset the sizes to the stable
    concurrency (clamped to the new bounds); an initial concurrency replaces the
    stable concurrency; the fixed sizes switch probing off or back on; weight,
    step, max step and interval apply from the next probe. Any resize restarts
    the throughput measurement.

Monitor (:meth:`ThroughputProber.statistics`, the ``throughput_probing`` section)
    ``times_probed_stable/up/down`` count probes made in each state;
    ``times_increased/decreased`` count successful probes that raised/lowered the
    stable concurrency and ``total_amount_increased/decreased`` add up by how
    much (in tickets, a float); plus the current ``read_concurrency`` and
    ``write_concurrency``, ``stable_concurrency``, ``stable_throughput`` (ops/s)
    and ``state``; the boost's ``streak`` and ``streak_direction`` (``up``,
    ``down``, ``none``) and ``last_step_multiple`` (the step of the latest
    probe, boost included). Each change of the sizes logs one INFO line on the
    ``tenantkv.admission`` logger, e.g.
    ``execution tickets: read 32→35, write 32→35 (probing up)``.

Server integration
    ``prober = ThroughputProber(reads, writes, **params)`` once (it sizes the
    pools at once), ``nursery.start_soon(run_probing, prober)``;
    ``set_parameter`` of any name above: ``prober.configure(**{name: value})``
    (it raises :class:`~tenantkv.errors.BadValue` naming the parameter);
    ``prober.parameters()`` for ``get_parameter``; ``prober.statistics()`` for
    ``server_status``. The prober needs of a pool only :class:`ProbedPool`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, Protocol

import trio

from tenantkv.admission.gate import ParameterTable
from tenantkv.errors import BadValue
from tenantkv.records import fields_dict

log = logging.getLogger("tenantkv.admission")

INITIAL_CONCURRENCY: Final = "throughput_probing_initial_concurrency"
MIN_CONCURRENCY: Final = "throughput_probing_min_concurrency"
MAX_CONCURRENCY: Final = "throughput_probing_max_concurrency"
READ_WRITE_RATIO: Final = "throughput_probing_read_write_ratio"
MOVING_AVERAGE_WEIGHT: Final = "throughput_probing_concurrency_moving_average_weight"
STEP_MULTIPLE: Final = "throughput_probing_step_multiple"
MAX_STEP_MULTIPLE: Final = "throughput_probing_max_step_multiple"
ADJUSTMENT_INTERVAL_MS: Final = "throughput_probing_concurrency_adjustment_interval_ms"
FIXED_READS: Final = "storage_engine_concurrent_read_transactions"
FIXED_WRITES: Final = "storage_engine_concurrent_write_transactions"


@dataclass(frozen=True, slots=True)
class ProbingParameter:
    """One server parameter: its default and range (``None``: unbounded)."""

    name: str
    kind: type  # int or float
    default: int | float
    minimum: float | None
    maximum: float | None
    help: str
    #: The minimum itself is excluded (``(0, 1]``).
    minimum_open: bool = False

    def describe(self) -> str:
        """The accepted values in words, as the error messages say them."""
        what = "an integer" if self.kind is int else "a number"
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            left = "(" if self.minimum_open else "["
            return f"{what} in {left}{_num(lo)}, {_num(hi)}]"
        if lo is not None:
            return f"{what} {'>' if self.minimum_open else '>='} {_num(lo)}"
        return what


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


PROBING_PARAMETERS: Final[Mapping[str, ProbingParameter]] = MappingProxyType(
    {
        p.name: p
        for p in (
            ProbingParameter(
                INITIAL_CONCURRENCY,
                int,
                # Not MongoDB's 2 x CPUs: a write holds its ticket until its group
                # commit is durable, so the write pool bounds the commit batch;
                # starting at 2 x CPUs (4 here) cut durable SET throughput ~10x until
                # probing had grown it (measured). Probing shrinks it if that is better.
                256,
                0,
                None,
                "Tickets over both pools at start (0 = 2 x CPU count), "
                "clamped to [2 x min, 2 x max].",
            ),
            ProbingParameter(MIN_CONCURRENCY, int, 4, 1, None, "Fewest tickets in each pool."),
            ProbingParameter(MAX_CONCURRENCY, int, 128, 1, None, "Most tickets in each pool."),
            ProbingParameter(
                READ_WRITE_RATIO, float, 0.5, 0.0, 1.0, "Share of the tickets that go to reads."
            ),
            ProbingParameter(
                MOVING_AVERAGE_WEIGHT,
                float,
                0.2,
                0.0,
                1.0,
                "Weight of a better probed concurrency in the stable concurrency.",
                minimum_open=True,
            ),
            ProbingParameter(
                STEP_MULTIPLE, float, 0.1, 0.01, 0.5, "Relative size of one probing step."
            ),
            ProbingParameter(
                MAX_STEP_MULTIPLE,
                float,
                # Not in MongoDB: its fixed step grows the pools ~2 % per successful
                # probe, too slow from the minimum (python -m bench probing).
                1.0,
                0.01,
                4.0,
                "Probing boost: the largest relative step (a down-step at most 0.5) after "
                "successive successful probes in one direction, each doubling the step and "
                "the moving-average weight; <= the step multiple: no boost (MongoDB's "
                "probing).",
            ),
            ProbingParameter(
                ADJUSTMENT_INTERVAL_MS, int, 100, 10, None, "Milliseconds between two probes."
            ),
            ProbingParameter(
                FIXED_READS, int, 0, 0, None, "Fixed read ticket pool size; non-zero: no probing."
            ),
            ProbingParameter(
                FIXED_WRITES, int, 0, 0, None, "Fixed write ticket pool size; non-zero: no probing."
            ),
        )
    }
)


def validate_probing_param(name: str, value: object) -> int | float:
    """Check one parameter's value; return it normalised (``float`` for ratios).

    Raises :class:`BadValue` naming the parameter and its range. The cross-check
    ``min <= max`` needs both values: :func:`validate_probing_params`.
    """
    spec = PROBING_PARAMETERS.get(name)
    if spec is None:
        raise BadValue(f"unknown execution control parameter {name!r}")
    ok_type = not isinstance(value, bool) and (
        isinstance(value, int)
        if spec.kind is int
        else isinstance(value, int | float) and math.isfinite(value)
    )
    if not ok_type:
        raise BadValue(f"{name} must be {spec.describe()}, got {value!r}")
    v = value if spec.kind is int else float(value)  # type: ignore[arg-type]
    lo, hi = spec.minimum, spec.maximum
    if (
        (lo is not None and (v <= lo if spec.minimum_open else v < lo))  # type: ignore[operator]
        or (hi is not None and v > hi)  # type: ignore[operator]
    ):
        raise BadValue(f"{name} must be {spec.describe()}, got {value!r}")
    return v  # type: ignore[return-value]


def validate_probing_params(
    params: Mapping[str, object], current: Mapping[str, int | float] | None = None
) -> dict[str, int | float]:
    """Check a set of parameters (changes over ``current``); return the checked changes.

    Besides each range: ``throughput_probing_min_concurrency`` must not exceed
    ``throughput_probing_max_concurrency`` once the changes are applied.
    """
    checked = {name: validate_probing_param(name, value) for name, value in params.items()}
    base: dict[str, Any] = {n: p.default for n, p in PROBING_PARAMETERS.items()}
    base.update(current or {})
    base.update(checked)
    lo, hi = base[MIN_CONCURRENCY], base[MAX_CONCURRENCY]
    if lo > hi:
        raise BadValue(
            f"{MIN_CONCURRENCY} ({lo}) must not exceed {MAX_CONCURRENCY} ({hi})",
        )
    return checked


#: Parameters whose change resets the pool sizes (besides the initial concurrency).
_RESIZING: Final = frozenset(
    {MIN_CONCURRENCY, MAX_CONCURRENCY, READ_WRITE_RATIO, FIXED_READS, FIXED_WRITES}
)


def _round(x: float) -> int:
    """Round halves up (as C's ``round`` for non-negative values), not to even."""
    return math.floor(x + 0.5)


def _boost(streak: int) -> float:
    """``2 ** streak``, the probing boost's factor (the exponent bounded: a streak
    may run on for long, the factor is capped by its use anyway)."""
    return 2.0 ** min(streak, 32)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on every platform
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- the prober


class ProbedPool(Protocol):
    """What the prober needs of a ticket pool (TicketHolder has it; tests use fakes)."""

    @property
    def total_tickets(self) -> int: ...

    @property
    def finished_processing(self) -> int: ...

    def peak_used_and_reset(self) -> int: ...

    def resize(self, total_tickets: int) -> None: ...


class ProbingState(Enum):
    STABLE = "stable"
    UP = "up"
    DOWN = "down"
    #: Probing is off: a fixed pool size is configured.
    FIXED = "fixed"


@dataclass(frozen=True, slots=True)
class ProbingStatistics:
    """What :meth:`ThroughputProber.statistics` returns (an immutable snapshot)."""

    state: ProbingState
    read_concurrency: int
    write_concurrency: int
    stable_concurrency: float
    #: Baseline throughput in operations per second.
    stable_throughput: float
    times_probed_stable: int
    times_probed_up: int
    times_probed_down: int
    times_increased: int
    times_decreased: int
    total_amount_increased: float
    total_amount_decreased: float
    #: Probing boost: successful probes in a row in one direction (0: no streak) ...
    streak: int
    #: ... and that direction (``"up"``, ``"down"``; ``"none"`` without a streak).
    streak_direction: str
    #: Relative step of the latest probe up or down, boost included (0.0: none yet).
    last_step_multiple: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``throughput_probing`` section of ``server_status``)."""
        return {
            **fields_dict(self),
            "state": self.state.value,
            "stable_concurrency": round(self.stable_concurrency, 3),
            "stable_throughput": round(self.stable_throughput, 3),
            "total_amount_increased": round(self.total_amount_increased, 3),
            "total_amount_decreased": round(self.total_amount_decreased, 3),
            "last_step_multiple": round(self.last_step_multiple, 4),
        }


class ThroughputProber:
    """Resizes a read and a write pool by measured throughput; pure, see the module doc.

    ``params`` are server parameters by their full names (unset ones take
    their defaults); ``cpu_count`` overrides the CPUs counted for an initial
    concurrency of 0. Sizes the pools at once.
    """

    def __init__(
        self,
        read: ProbedPool,
        write: ProbedPool,
        *,
        cpu_count: int | None = None,
        **params: object,
    ) -> None:
        self._read = read
        self._write = write
        self._cpus = cpu_count if cpu_count is not None else _cpu_count()
        checked = validate_probing_params(params)
        self._params: dict[str, Any] = {n: p.default for n, p in PROBING_PARAMETERS.items()}
        self._params.update(checked)
        self._state = ProbingState.STABLE
        self._stable = self._initial_concurrency()
        self._stable_throughput = 0.0
        #: ``(time, finished)`` the next throughput is measured from; None: no baseline.
        self._last: tuple[float, int] | None = None
        self._times_probed_stable = 0
        self._times_probed_up = 0
        self._times_probed_down = 0
        self._times_increased = 0
        self._times_decreased = 0
        self._amount_increased = 0.0
        self._amount_decreased = 0.0
        #: Probing boost: successful probes in a row in direction ``_streak_dir`` (+1/-1).
        self._streak = 0
        self._streak_dir = 0
        #: The streak the probe in progress was sized with (its weight if it succeeds).
        self._probe_streak = 0
        self._last_step = 0.0
        self._last_info = -math.inf
        self._unlogged = 0
        #: time of the current probe (the log rate limit runs on the prober's clock)
        self._now = 0.0
        self._apply_mode("initial")

    # ------------------------------------------------------------------ reading

    @property
    def state(self) -> ProbingState:
        return self._state

    @property
    def enabled(self) -> bool:
        """False while a fixed pool size is configured."""
        return self._state is not ProbingState.FIXED

    @property
    def stable_concurrency(self) -> float:
        return self._stable

    @property
    def interval_secs(self) -> float:
        return self._params[ADJUSTMENT_INTERVAL_MS] / 1000.0

    def parameters(self) -> dict[str, int | float]:
        """Every parameter's value in force, by name."""
        return dict(self._params)

    def statistics(self) -> ProbingStatistics:
        return ProbingStatistics(
            state=self._state,
            read_concurrency=self._read.total_tickets,
            write_concurrency=self._write.total_tickets,
            stable_concurrency=self._stable,
            stable_throughput=self._stable_throughput,
            times_probed_stable=self._times_probed_stable,
            times_probed_up=self._times_probed_up,
            times_probed_down=self._times_probed_down,
            times_increased=self._times_increased,
            times_decreased=self._times_decreased,
            total_amount_increased=self._amount_increased,
            total_amount_decreased=self._amount_decreased,
            streak=self._streak,
            streak_direction={1: "up", -1: "down"}.get(self._streak_dir, "none")
            if self._streak
            else "none",
            last_step_multiple=self._last_step,
        )

    # ------------------------------------------------------------------ configuration

    def parameter_table(self) -> ParameterTable:
        """Its parameters by their full setting names (``throughput_probing_*``, and
        the fixed pool sizes)."""
        return {
            name: (lambda n: lambda v: self.configure(**{n: v}))(name)
            for name in PROBING_PARAMETERS
        }

    def configure(self, **params: object) -> None:
        """Apply changed parameters now, all or nothing (:class:`BadValue` changes none)."""
        checked = validate_probing_params(params, self._params)
        changed = {n: v for n, v in checked.items() if v != self._params[n]}
        self._params.update(checked)
        if INITIAL_CONCURRENCY in checked:
            self._stable = self._initial_concurrency()
        elif MIN_CONCURRENCY in changed or MAX_CONCURRENCY in changed:
            self._stable = self._clamp_total(self._stable)
        if INITIAL_CONCURRENCY in checked or changed.keys() & _RESIZING:
            self._apply_mode("parameter change")

    def _clamp_total(self, total: float) -> float:
        p = self._params
        return min(max(total, 2.0 * p[MIN_CONCURRENCY]), 2.0 * p[MAX_CONCURRENCY])

    def _initial_concurrency(self) -> float:
        value = self._params[INITIAL_CONCURRENCY]
        total = float(value or 2 * self._cpus)
        clamped = self._clamp_total(total)
        if value and clamped != total:
            log.warning(
                "%s %d is outside [2 x %s, 2 x %s] = [%d, %d]; using %d",
                INITIAL_CONCURRENCY,
                value,
                MIN_CONCURRENCY,
                MAX_CONCURRENCY,
                2 * self._params[MIN_CONCURRENCY],
                2 * self._params[MAX_CONCURRENCY],
                clamped,
            )
        return clamped

    def _apply_mode(self, reason: str) -> None:
        """Probing on: sizes of the stable concurrency; off: the fixed sizes."""
        reads, writes = self._split(self._stable)
        fixed_r, fixed_w = self._params[FIXED_READS], self._params[FIXED_WRITES]
        if fixed_r or fixed_w:
            self._state = ProbingState.FIXED
            self._set_sizes(fixed_r or reads, fixed_w or writes, "fixed sizes")
        else:
            self._state = ProbingState.STABLE
            self._set_sizes(reads, writes, reason)
        self._last = None  # a resize (or none): measure afresh either way
        self._streak = 0

    # ------------------------------------------------------------------ probing

    def probe(self, now: float, finished_total: int | None = None) -> ProbingState:
        """One probing step at time ``now`` (seconds); returns the new state.

        ``finished_total`` is the operations finished in both pools so far
        (default: the pools' ``finished_processing``).
        """
        self._now = now
        if self._state is ProbingState.FIXED:
            return self._state
        finished = finished_total if finished_total is not None else self._finished()
        last = self._last
        if last is None or finished < last[1]:
            self._last = (now, finished)  # first run (or counters reset): baseline only
            return self._state
        elapsed = now - last[0]
        if elapsed <= 0.0:
            return self._state  # no time passed: wait for the next run
        throughput = (finished - last[1]) / elapsed
        if self._state is ProbingState.STABLE:
            self._probe_stable(throughput)
        elif self._state is ProbingState.UP:
            self._probe_result(throughput, "up")
            self._times_probed_up += 1
        else:
            self._probe_result(throughput, "down")
            self._times_probed_down += 1
        if finished_total is None:
            finished = self._finished()
        self._last = (now, finished)
        return self._state

    def _finished(self) -> int:
        return self._read.finished_processing + self._write.finished_processing

    def _probe_stable(self, throughput: float) -> None:
        self._stable_throughput = throughput
        mx, mn = self._params[MAX_CONCURRENCY], self._params[MIN_CONCURRENCY]
        reads, writes = self._read.total_tickets, self._write.total_tickets
        read_peak = self._read.peak_used_and_reset()
        write_peak = self._write.peak_used_and_reset()
        if (reads < mx and read_peak >= reads) or (writes < mx and write_peak >= writes):
            self._state = ProbingState.UP  # a pool ran out of tickets: try more
            self._step(+1, "probing up")
        elif read_peak > mn or write_peak > mn:
            self._state = ProbingState.DOWN  # room to spare: try just below the use
            self._step(-1, "probing down")
        else:
            self._streak = 0  # nothing to probe: the streak is over
        self._times_probed_stable += 1

    def _boosted(self) -> bool:
        return self._params[MAX_STEP_MULTIPLE] > self._params[STEP_MULTIPLE]

    def _step_multiple(self, direction: int) -> float:
        """The relative step of a probe in ``direction`` now: the step multiple,
        doubled for each success of the streak in that direction (probing boost)
        up to the maximum (down: and 0.5)."""
        step = self._params[STEP_MULTIPLE]
        if not self._boosted() or self._streak_dir != direction:
            return step
        cap = self._params[MAX_STEP_MULTIPLE]
        if direction < 0:
            cap = min(cap, 0.5)
        return min(cap, step * _boost(self._streak))

    def _step(self, direction: int, reason: str) -> None:
        if self._streak_dir != direction:
            self._streak = 0  # a probe the other way ends the streak
        self._probe_streak = self._streak
        step = self._step_multiple(direction)
        self._last_step = step
        if step > self._params[STEP_MULTIPLE]:
            reason = f"{reason}, boost x{step / self._params[STEP_MULTIPLE]:.3g}"
        reads, writes = self._split(self._stable * (1.0 + direction * step))
        if reads == self._read.total_tickets:
            reads = self._bound(reads + direction)
        if writes == self._write.total_tickets:
            writes = self._bound(writes + direction)
        self._set_sizes(reads, writes, reason)

    def _probe_result(self, throughput: float, direction: str) -> None:
        sign = 1 if direction == "up" else -1
        if throughput > self._stable_throughput:
            probed = self._read.total_tickets + self._write.total_tickets
            weight = self._params[MOVING_AVERAGE_WEIGHT]
            if self._boosted():
                weight = min(1.0, weight * _boost(self._probe_streak))
            # one more success this way: the next probe this way steps further
            self._streak = self._probe_streak + 1
            self._streak_dir = sign
            old = self._stable
            self._stable = self._clamp_total(weight * probed + (1.0 - weight) * old)
            self._stable_throughput = throughput
            if self._stable > old:
                self._times_increased += 1
                self._amount_increased += self._stable - old
            elif self._stable < old:
                self._times_decreased += 1
                self._amount_decreased += old - self._stable
            reason = f"probe {direction} raised throughput"
        else:
            self._streak = 0
            reason = f"probe {direction} did not raise throughput"
        self._state = ProbingState.STABLE
        self._set_sizes(*self._split(self._stable), reason)

    # ------------------------------------------------------------------ sizes

    def _bound(self, n: int) -> int:
        p = self._params
        return min(max(n, p[MIN_CONCURRENCY]), p[MAX_CONCURRENCY])

    def _split(self, total: float) -> tuple[int, int]:
        ratio = self._params[READ_WRITE_RATIO]
        return self._bound(_round(total * ratio)), self._bound(_round(total * (1.0 - ratio)))

    def _set_sizes(self, reads: int, writes: int, reason: str) -> None:
        old_r, old_w = self._read.total_tickets, self._write.total_tickets
        if (reads, writes) == (old_r, old_w):
            return
        if reads != old_r:
            self._read.resize(reads)
        if writes != old_w:
            self._write.resize(writes)
        # Under steady load probing moves the sizes every interval (a step, then
        # back): INFO at most once a second so the log stays readable; the
        # lines in between go to DEBUG and the next INFO line counts them.
        args: tuple[object, ...] = (old_r, reads, old_w, writes, reason)
        fmt = "execution tickets: read %d→%d, write %d→%d (%s)"
        now = self._now
        if now - self._last_info >= 1.0:
            if self._unlogged:
                log.info(fmt + "; %d more changes since the last line", *args, self._unlogged)
            else:
                log.info(fmt, *args)
            self._last_info, self._unlogged = now, 0
        else:
            log.debug(fmt, *args)
            self._unlogged += 1


# --------------------------------------------------------------------------- Trio adapter


async def run_probing(
    prober: ThroughputProber,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Probe every ``interval_secs`` on Trio's clock until cancelled.

    Start it with ``nursery.start_soon(run_probing, prober)`` (or ``start``). A
    changed interval applies from the next sleep. Should a probe ever raise, the
    error is logged and probing stops, leaving the pools at their sizes.
    """
    task_status.started()
    try:
        prober.probe(trio.current_time())
        while True:
            await trio.sleep(prober.interval_secs)
            prober.probe(trio.current_time())
    except Exception:
        log.exception("throughput probing failed; execution ticket pools keep their sizes")
