"""Write permits: per-bucket write semaphores whose size follows the commit backlog.

EvidentDB's admission control, applied to tenantkv's group-commit writer.

Why
    Every write goes through one group-commit writer thread (DESIGN.md §3).
    When writes arrive faster than batches become durable, its queue grows:
    that backlog, the **lag** (writes queued but not yet durable, provided by
    the server through a callable), is pure latency for every tenant and
    memory for the server. Rejecting would be premature (the writer may catch
    up within milliseconds); instead the number of writes each bucket may have
    in flight shrinks while the lag is high, so the backlog drains and the
    writers that keep pushing wait *before* their write is queued, not after.

The capacity (the same for every bucket, since the writer is shared)::

    lag <= target_lag      capacity = max_capacity
    lag >= critical_lag    capacity = min_capacity
    in between             capacity = min + (max - min) x (1 - (lag - target) / (critical - target))

rounded down, never below ``min_capacity``. It is a per-bucket bound: each
bucket may hold ``capacity`` permits, so a bucket that floods the writer is
held to its ``capacity`` while a quiet bucket still gets its own
(``min_capacity > 0`` guarantees every bucket progress even at critical lag).

Re-evaluation
    :meth:`WritePermitGate.run` (a tiny Trio task) samples the lag every
    ``adjustment_interval_ms`` (default 10 ms) and applies the new capacity.
    Why 10 ms: a group-commit batch takes ~0.1-3 ms, so one interval spans
    roughly 3-100 batches. Shorter, and the sample would chase the sawtooth of
    single batches (a batch just taken vs. just committed) and make the
    capacity flap; longer, and a burst could queue many intervals' worth of
    writes before anyone reacts (at 100k writes/s, 10 ms is 1000 writes, the
    default target). While writes come, the task costs ~100 wake-ups per
    second. Once :data:`QUIET_SAMPLES` samples in a row found nothing queued
    and the capacity at its maximum, nothing can change it until a write comes:
    the task sleeps until the next write asks for a permit, which wakes it to
    sample at once. (Those wake-ups were 1.1 % of a core on an idle daemon.)

Permits
    A write takes a permit at admission and holds it until durable (release
    is synchronous, from any task: the group-commit callback). FIFO per
    bucket: a newcomer takes a permit at once only if one is free and nobody
    waits; a released permit passes straight to the head waiter. When the
    capacity grows, waiters are woken at once; when it shrinks, holders keep
    their permits and finish (nothing is revoked): new permits are handed out
    only once ``in_use < capacity`` again. Waiting is unbounded here: the
    caller bounds it with its deadline (a cancel scope); a cancelled waiter
    simply leaves the queue.

Logging
    Each capacity change is logged on ``tenantkv.admission`` (old -> new, lag).
    At INFO at most once per :data:`LOG_MIN_INTERVAL_SECS`: under sustained
    overload the capacity may change every interval (100 times a second), so
    changes in between go to DEBUG and the next INFO line says how many there
    were. ``adjustments`` in the statistics counts every change.

Statistics
    Per bucket: capacity, in use, waiting, permits granted, how many had to
    wait and a histogram of those waits (µs); node: the parameters, the
    current capacity, the last lag sampled, evaluations and adjustments.

Server integration
    ``WritePermitGate.create(lambda: writer.lag, ...)``; ``await nursery.start(gate.run)``;
    ``add_bucket`` / ``remove_bucket`` from the bucket hooks. For a write, on
    the sync fast path ``p = gate.try_acquire(bucket)`` (``None``: take the async
    path, ``p = await gate.acquire(bucket)``), then ``gate.release(p)`` in the
    group-commit callback, exactly once, whatever the outcome. Exempt
    (admin/internal) writes skip the gate.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, Final

import trio

from tenantkv.admission.gate import ParameterTable, trio_clock
from tenantkv.admission.waiters import Waiter, observe_wait, park, unqueue, wake
from tenantkv.errors import BadValue, BucketExists, BucketNotFound, DeadlineExceeded
from tenantkv.records import fields_dict, histogram_to_wire

log = logging.getLogger("tenantkv.admission")

DEFAULT_TARGET_LAG: Final = 1024
DEFAULT_CRITICAL_LAG: Final = 8192
DEFAULT_MIN_CAPACITY: Final = 4
# As many as a bucket queue's slots: permits only bind once the writer lags.
DEFAULT_MAX_CAPACITY: Final = 512
DEFAULT_ADJUSTMENT_INTERVAL_MS: Final = 10
MAX_LAG: Final = 1_000_000_000
MAX_CAPACITY: Final = 65_536
MAX_ADJUSTMENT_INTERVAL_MS: Final = 60_000
#: Samples in a row at rest (nothing queued, the capacity at its maximum) after
#: which the sampler sleeps until a write comes: 100 ms at the default interval,
#: so steady writes keep it ticking and a quiet node pays nothing.
QUIET_SAMPLES: Final = 10
#: At most one INFO line about capacity changes per this many seconds.
LOG_MIN_INTERVAL_SECS: Final = 1.0
#: Upper bounds (µs) of the permit-wait histogram bins; a last bin counts the rest.
WAIT_HISTOGRAM_BOUNDS_US: Final[tuple[int, ...]] = (
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
)

#: The settings' names: ``write_permit_`` and the parameter's.
_PARAM: Final = "write_permit_"


def capacity_for_lag(
    lag: float, *, target_lag: int, critical_lag: int, min_capacity: int, max_capacity: int
) -> int:
    """The permits per bucket for ``lag`` (the formula of the module doc)."""
    if lag <= target_lag:
        return max_capacity
    if lag >= critical_lag:
        return min_capacity
    # min + (max - min) * (critical - lag) / (critical - target), floored, in exact
    # integer arithmetic for an integer lag.
    extra = (max_capacity - min_capacity) * (critical_lag - lag) // (critical_lag - target_lag)
    return max(min_capacity, min_capacity + int(extra))


def _check_int(key: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadValue(f"{_PARAM}{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class PermitSettings:
    """The write-permit parameters (the ``write_permit_*`` settings), checked as
    a whole when made: :class:`BadValue` names the setting that does not fit."""

    target_lag: int = DEFAULT_TARGET_LAG
    critical_lag: int = DEFAULT_CRITICAL_LAG
    min_capacity: int = DEFAULT_MIN_CAPACITY
    max_capacity: int = DEFAULT_MAX_CAPACITY
    adjustment_interval_ms: int = DEFAULT_ADJUSTMENT_INTERVAL_MS

    def __post_init__(self) -> None:
        _check_int("target_lag", self.target_lag, 0, MAX_LAG)
        _check_int("critical_lag", self.critical_lag, 1, MAX_LAG)
        _check_int("min_capacity", self.min_capacity, 1, MAX_CAPACITY)
        _check_int("max_capacity", self.max_capacity, 1, MAX_CAPACITY)
        _check_int(
            "adjustment_interval_ms", self.adjustment_interval_ms, 1, MAX_ADJUSTMENT_INTERVAL_MS
        )
        if self.critical_lag <= self.target_lag:
            raise BadValue(
                f"{_PARAM}critical_lag ({self.critical_lag}) must be greater than "
                f"{_PARAM}target_lag ({self.target_lag})"
            )
        if self.max_capacity < self.min_capacity:
            raise BadValue(
                f"{_PARAM}max_capacity ({self.max_capacity}) must be at least "
                f"{_PARAM}min_capacity ({self.min_capacity})"
            )

    @classmethod
    def from_config(cls, cfg: Any) -> PermitSettings:
        """The settings ``write_permit_<name>`` of a :class:`~tenantkv.config.Config`."""
        return cls(**{f.name: getattr(cfg, _PARAM + f.name) for f in fields(cls)})

    def capacity(self, lag: float) -> int:
        """The permits per bucket for ``lag`` (the formula of the module doc)."""
        return capacity_for_lag(
            lag,
            target_lag=self.target_lag,
            critical_lag=self.critical_lag,
            min_capacity=self.min_capacity,
            max_capacity=self.max_capacity,
        )

    def as_dict(self) -> dict[str, int]:
        """By setting name (``write_permit_target_lag``...)."""
        return {_PARAM + f.name: getattr(self, f.name) for f in fields(self)}


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True)
class BucketPermitStatistics:
    """One bucket's permits (an immutable snapshot)."""

    bucket: str
    capacity: int
    in_use: int
    waiting: int
    #: Permits handed out (at once or after waiting).
    granted: int
    #: Of those, how many had to wait; and the total of their waits.
    waited: int
    wait_micros_total: int
    #: Waiters that went away (deadline, client gone) before a permit.
    interrupted: int
    #: ``(upper bound in µs, count)`` per bin of the waits; the last bound is ``inf``.
    wait_histogram: tuple[tuple[float, int], ...]

    def as_dict(self) -> dict[str, Any]:
        d = fields_dict(self, left_out=("bucket", "wait_histogram"))
        d["wait_histogram_us"] = histogram_to_wire(self.wait_histogram)
        return d


@dataclass(frozen=True, slots=True)
class WritePermitStatistics:
    """What :meth:`WritePermits.statistics` returns."""

    settings: PermitSettings
    #: Permits per bucket now.
    capacity: int
    #: The lag sampled last (``None`` before the first evaluation).
    last_lag: int | None
    #: Lag samples taken / capacity changes made.
    evaluations: int
    adjustments: int
    buckets: Mapping[str, BucketPermitStatistics]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``write_permits`` section of ``server_status``)."""
        return {
            "node": {
                **self.settings.as_dict(),
                "capacity": self.capacity,
                "last_lag": self.last_lag,
                "evaluations": self.evaluations,
                "adjustments": self.adjustments,
            },
            "buckets": {name: b.as_dict() for name, b in self.buckets.items()},
        }


# --------------------------------------------------------------------------- the core


class BucketPermits:
    """One bucket's semaphore; also the handle a permit holder releases."""

    __slots__ = (
        "bucket",
        "granted",
        "histogram",
        "in_use",
        "interrupted",
        "removed",
        "wait_us_total",
        "waited",
        "waiters",
    )

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.in_use = 0
        self.waiters: deque[Waiter] = deque()
        self.granted = 0
        self.waited = 0
        self.wait_us_total = 0
        self.interrupted = 0
        self.removed = False
        self.histogram = [0] * (len(WAIT_HISTOGRAM_BOUNDS_US) + 1)

    def __repr__(self) -> str:
        return f"<BucketPermits {self.bucket!r} in use {self.in_use} waiting {len(self.waiters)}>"


class WritePermits:
    """Lag-driven per-bucket write permits; pure logic (see the module doc).

    ``clock`` returns seconds; :class:`WritePermitGate` needs ``trio.current_time``.
    Methods that can free permits return the waiters to wake.
    """

    def __init__(self, clock: Callable[[], float], settings: PermitSettings | None = None) -> None:
        self._clock = clock
        self.settings = settings or PermitSettings()
        self._capacity = self.settings.max_capacity  # no backlog is known yet
        self._last_lag: int | None = None
        self._evaluations = 0
        self._adjustments = 0
        self._last_log = -math.inf
        self._unlogged = 0
        self._buckets: dict[str, BucketPermits] = {}

    # ------------------------------------------------------------------ properties

    @property
    def at_rest(self) -> bool:
        """The last sample found nothing queued and the capacity at its maximum."""
        return self._last_lag == 0 and self._capacity == self.settings.max_capacity

    @property
    def capacity(self) -> int:
        """Permits per bucket now."""
        return self._capacity

    @property
    def adjustment_interval_secs(self) -> float:
        return self.settings.adjustment_interval_ms / 1000

    def __contains__(self, bucket: object) -> bool:
        return bucket in self._buckets

    # ------------------------------------------------------------------ buckets

    def add_bucket(self, name: str) -> None:
        if name in self._buckets:
            raise BucketExists(f"bucket {name!r} already exists")
        self._buckets[name] = BucketPermits(name)

    def remove_bucket(self, name: str) -> list[Waiter]:
        """Forget a bucket; returns its waiters (to wake: they fail with BucketNotFound)."""
        p = self._buckets.pop(name, None)
        if p is None:
            return []
        p.removed = True
        woken = list(p.waiters)
        p.waiters.clear()
        return woken

    def permits(self, bucket: str) -> BucketPermits:
        p = self._buckets.get(bucket)
        if p is None:
            raise BucketNotFound(f"bucket {bucket!r} not found")
        return p

    # ------------------------------------------------------------------ lag and configuration

    def adjust(self, lag: int) -> list[Waiter]:
        """Apply the capacity for ``lag`` (sampled now); returns the waiters it admits."""
        self._last_lag = lag
        self._evaluations += 1
        return self._apply(self.settings.capacity(lag), lag)

    def configure(self, **changes: int | None) -> list[Waiter]:
        """Change parameters at runtime, by :class:`PermitSettings` field name
        (``None`` = unchanged); all or nothing.

        The combination is validated as a whole (e.g. a new ``critical_lag``
        against the current ``target_lag``). The capacity is recomputed at once
        from the last lag; returns the waiters that admits.
        """
        unknown = set(changes) - {f.name for f in fields(PermitSettings)}
        if unknown:
            raise BadValue(f"no write permit parameter {sorted(unknown)}")
        self.settings = replace(
            self.settings, **{k: v for k, v in changes.items() if v is not None}
        )
        lag = self._last_lag
        cap = self.settings.max_capacity if lag is None else self.settings.capacity(lag)
        return self._apply(cap, lag)

    # ------------------------------------------------------------------ hot path

    def try_acquire(self, bucket: str) -> BucketPermits | None:
        """Take a permit if one is free and nobody waits; ``None``: take the slow path."""
        p = self._buckets.get(bucket)
        if p is None:
            raise BucketNotFound(f"bucket {bucket!r} not found")
        if p.in_use < self._capacity and not p.waiters:
            p.in_use += 1
            p.granted += 1
            return p
        return None

    def room(self, p: BucketPermits) -> int:
        """How many more permits of ``p`` a run of writes holding some may take
        now: the free ones, 0 while anybody waits — what that many
        :meth:`try_acquire` calls in a row would grant."""
        return max(self._capacity - p.in_use, 0) if not p.waiters else 0

    def add(self, p: BucketPermits, n: int) -> None:
        """Count ``n`` more permits of ``p`` taken, within :meth:`room` (nothing
        having run since it was asked)."""
        p.in_use += n
        p.granted += n

    def release_many(self, p: BucketPermits, n: int) -> list[Waiter]:
        """Give ``n`` permits back at once (a run's, :meth:`add`), as ``n``
        :meth:`release` calls would; returns the waiters they pass to."""
        if not p.waiters:
            p.in_use -= n
            return []
        woken = []
        for _ in range(n):
            waiter = self.release(p)
            if waiter is not None:
                woken.append(waiter)
        return woken

    def release(self, p: BucketPermits) -> Waiter | None:
        """Give a permit back; returns the waiter it passes to (the adapter wakes it)."""
        if p.waiters and p.in_use <= self._capacity:
            waiter = p.waiters.popleft()  # the permit passes on: in_use is unchanged
            self._granted(p, waiter)
            return waiter
        p.in_use -= 1
        return None

    # ------------------------------------------------------------------ slow path

    def enqueue(self, bucket: str) -> tuple[BucketPermits, Waiter | None]:
        """``(p, None)``: a permit now; ``(p, waiter)``: wait until ``waiter.granted``."""
        p = self.permits(bucket)
        if p.in_use < self._capacity and not p.waiters:
            p.in_use += 1
            p.granted += 1
            return p, None
        waiter = Waiter(self._clock())
        p.waiters.append(waiter)
        return p, waiter

    def abandon(self, p: BucketPermits, waiter: Waiter) -> None:
        """``waiter`` went away before it got a permit."""
        unqueue(p.waiters, waiter)
        p.interrupted += 1

    # ------------------------------------------------------------------ stats

    def statistics(self) -> WritePermitStatistics:
        bounds: tuple[float, ...] = (*WAIT_HISTOGRAM_BOUNDS_US, math.inf)
        buckets = {
            name: BucketPermitStatistics(
                bucket=name,
                capacity=self._capacity,
                in_use=p.in_use,
                waiting=len(p.waiters),
                granted=p.granted,
                waited=p.waited,
                wait_micros_total=p.wait_us_total,
                interrupted=p.interrupted,
                wait_histogram=tuple(zip(bounds, p.histogram, strict=True)),
            )
            for name, p in self._buckets.items()
        }
        return WritePermitStatistics(
            settings=self.settings,
            capacity=self._capacity,
            last_lag=self._last_lag,
            evaluations=self._evaluations,
            adjustments=self._adjustments,
            buckets=MappingProxyType(buckets),
        )

    # ------------------------------------------------------------------ internals

    def _apply(self, capacity: int, lag: int | None) -> list[Waiter]:
        old = self._capacity
        if capacity == old:
            return []
        self._capacity = capacity
        self._adjustments += 1
        self._log_change(old, capacity, lag)
        if capacity < old:
            return []  # holders finish; nothing is revoked
        woken: list[Waiter] = []
        for p in self._buckets.values():
            while p.waiters and p.in_use < capacity:
                waiter = p.waiters.popleft()
                p.in_use += 1
                self._granted(p, waiter)
                woken.append(waiter)
        return woken

    def _granted(self, p: BucketPermits, waiter: Waiter) -> None:
        waiter.granted = True
        p.granted += 1
        p.waited += 1
        us = max(0, round((self._clock() - waiter.enqueued) * 1e6))
        p.wait_us_total += us
        observe_wait(p.histogram, WAIT_HISTOGRAM_BOUNDS_US, us)

    def _log_change(self, old: int, new: int, lag: int | None) -> None:
        now = self._clock()
        args = (old, new, lag, self.settings.target_lag, self.settings.critical_lag)
        fmt = "write permit capacity %d -> %d per bucket (lag %s, target %d, critical %d)"
        if now - self._last_log >= LOG_MIN_INTERVAL_SECS:
            if self._unlogged:
                log.info(fmt + "; %d more changes since the last line", *args, self._unlogged)
            else:
                log.info(fmt, *args)
            self._last_log = now
            self._unlogged = 0
        else:
            log.debug(fmt, *args)
            self._unlogged += 1


# --------------------------------------------------------------------------- Trio adapter


class WritePermitGate:
    """Trio adapter for :class:`WritePermits`: parks waiters, runs the lag sampler.

    The core's clock must be ``trio.current_time``; ``lag`` returns the current
    group-commit backlog (writes queued and not yet durable).
    """

    def __init__(self, permits: WritePermits, lag: Callable[[], int]) -> None:
        self.permits = permits
        self._lag = lag
        #: set while the sampler sleeps until a write comes (see the module doc)
        self._resting: trio.Event | None = None
        #: :meth:`WritePermits.room` and :meth:`WritePermits.add`: a run's writes
        #: (the core's own methods: nothing to wake, and a call less each)
        self.room = permits.room
        self.add = permits.add

    @classmethod
    def create(
        cls, lag: Callable[[], int], settings: PermitSettings | None = None
    ) -> WritePermitGate:
        return cls(WritePermits(trio_clock(), settings), lag)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-evaluate the capacity every ``adjustment_interval_ms``, forever.

        Start it with ``nursery.start``: the first evaluation is done by then.
        """
        permits = self.permits
        self._wake(permits.adjust(self._lag()))
        task_status.started()
        quiet = 0
        while True:
            quiet = quiet + 1 if permits.at_rest else 0
            if quiet >= QUIET_SAMPLES:
                resting = self._resting = trio.Event()
                await resting.wait()
                quiet = 0
            else:
                await trio.sleep(permits.adjustment_interval_secs)
            self._wake(permits.adjust(self._lag()))

    def _rouse(self) -> None:
        """A write asks for a permit: the resting sampler samples again."""
        resting, self._resting = self._resting, None
        if resting is not None:
            resting.set()

    def try_acquire(self, bucket: str) -> BucketPermits | None:
        """:meth:`WritePermits.try_acquire`: a permit now, or ``None``."""
        if self._resting is not None:
            self._rouse()
        return self.permits.try_acquire(bucket)

    def release(self, p: BucketPermits, n: int = 1) -> None:
        """Give back ``n`` permits of ``p`` (sync; from any task, exactly once per
        permit)."""
        if n == 1:
            waiter = self.permits.release(p)
            if waiter is not None:
                waiter.event.set()
            return
        for waiter in self.permits.release_many(p, n):
            waiter.event.set()

    async def acquire(self, bucket: str, *, deadline: float | None = None) -> BucketPermits:
        """Return the bucket's permits holding one for this write; FIFO wait if need be.

        No checkpoint when a permit is free at once. Raises
        :class:`DeadlineExceeded` when ``deadline`` (Trio time) passes first and
        :class:`BucketNotFound` if the bucket is (or gets) removed. Cancelled,
        the waiter leaves the queue (and passes on a permit granted at that
        very moment).
        """
        permits = self.permits
        if self._resting is not None:
            self._rouse()
        p, waiter = permits.enqueue(bucket)
        if waiter is None:
            return p
        if await park(
            waiter,
            deadline=deadline,
            give_back=lambda: self.release(p),
            abandon=lambda: permits.abandon(p, waiter),
        ):
            return p
        if p.removed:
            raise BucketNotFound(f"bucket {bucket!r} was removed")
        permits.abandon(p, waiter)
        raise DeadlineExceeded("the request's deadline passed while it waited for a write permit")

    def add_bucket(self, name: str) -> None:
        self.permits.add_bucket(name)

    def remove_bucket(self, name: str) -> None:
        """Forget ``name``; its waiters fail with BucketNotFound."""
        self._wake(self.permits.remove_bucket(name))

    def configure(self, **changes: int | None) -> None:
        """:meth:`WritePermits.configure`; a new interval applies from the next tick."""
        self._wake(self.permits.configure(**changes))

    def statistics(self) -> WritePermitStatistics:
        return self.permits.statistics()

    def parameter_table(self) -> ParameterTable:
        return {
            key: (lambda k: lambda v: self.configure(**{k: v}))(key)
            for key in (f.name for f in fields(PermitSettings))
        }

    _wake = staticmethod(wake)
