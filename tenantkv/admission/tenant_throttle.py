"""Tenant throttle: per-bucket unit quotas (node capacity, reservation, hard limit).

The Couchbase KV throttling model, made fair between buckets.

Units
    Every operation is metered after it ran: ``RU = ceil(read bytes / 4096)``,
    ``WU = ceil(written bytes / 4096)`` (a delete costs 1 WU) and its cost is
    ``RU + write_weight * WU`` (``write_weight`` defaults to 2). The server calls
    :meth:`TenantThrottle.charge` with the units; :func:`read_units` and
    :func:`write_units` compute them.

Properties (all in units per second; ``None`` means "unlimited")
    node ``capacity``
        What the node may serve per second. ``None`` (the default) switches the
        node-level throttle off; only finite bucket hard limits still apply.
    bucket ``reserved``
        Guaranteed to the bucket. The **free pool** is ``capacity - sum(reserved)``.
        A reservation a bucket leaves unused is *not* lent to others (the
        Couchbase guarantee: it is there the moment the tenant wants it).
        ``reserved=None`` would exempt the bucket from node capacity; the admin
        commands refuse it (throttle_props: a reservation is finite), so only
        data saved by an older version can carry it.
    bucket ``hard_limit``
        Never exceeded over time, whatever the free pool holds. ``0`` throttles
        the bucket completely.

Decision (:meth:`TenantThrottle.admission_wait`, before each operation)
    Every request is bounded before it runs and pays for what it did after. An
    operation is admitted while its bucket has allowance left (``> 0``). A
    write's cost is known before it runs, so it is admitted at that cost
    (:meth:`TenantThrottle.write_wait`) and the cost is taken from the counters
    at once (:meth:`TenantThrottle.reserve`): writes in flight are paid for and
    cannot overshoot. After an operation ran it is charged what it did (a
    write: the difference from what was reserved). What it cost beyond the
    allowance is **debt**: repaid in full from later refills before the bucket
    runs again — debt is never forgiven — so the long-run rate honours every
    limit even for operations far larger than a slice's allowance. A write
    costing more than ``max_debt_secs`` of the hard limit runs only when its
    bucket owes nothing (its hard counter full).

    * the ``Unthrottled`` privilege is never delayed but always charged, against
      its bucket and, through the bucket's share, against the node;
    * usage below the reservation always runs;
    * usage beyond it runs from the bucket's share of the free pool and is
      throttled when that share is spent (the free pool is exhausted for it);
    * a finite hard limit throttles the bucket once it is reached.

How the free pool is shared (the part that is fairer than Couchbase)
    Couchbase hands the free pool out first come, first served, so the tenant
    with the most connections and the biggest requests wins. Here every bucket
    has its own allowance counter refilled at its own **allowance rate**::

        rate = reservation + share of the free pool        (capped at hard_limit)

    where the shares are *water-filled* (max-min fair, optionally weighted)
    between the buckets that want more than their reservation. A bucket's
    *demand* is unlimited while it is **hungry** (it was throttled recently or
    has waiters); otherwise it is ``1.25 x`` its measured recent usage. So a
    bucket's share depends on neither how many connections or waiters it has
    nor on its request sizes: each request only spends its own bucket's counter.

    The rates are recomputed every slice and at once when something changes (a
    bucket turns hungry, a connection opens, a property is set). Share that a
    bucket's counter could not hold because the bucket did not use it (never
    its reservation) is handed on at refill time to the hungry buckets,
    again water-filled, and what nobody takes stays in a small node **spare**
    that any bucket may use first come, first served. That keeps the scheme
    work-conserving: capacity nobody uses goes to whoever wants it.

Time
    Counters are refilled lazily (no background task) in slices of
    ``slice_secs`` (default 100 ms), aligned to multiples of it on the clock:
    the first call after one or more slice boundaries credits every bucket
    ``rate x slice_secs`` per boundary crossed, so the per-second rate arrives
    in tenths, never as a whole-second lump, and a late call loses nothing.
    When a rate changes inside a slice (a bucket turns hungry, a connection
    opens, a property is set) the difference is credited or debited pro rata
    for the rest of that slice, so the change takes effect at once.

Burst (exactly what a bucket may take at once)
    * A bucket's counter holds at most one slice of its allowance rate:
      ``rate x slice_secs`` (800 units at 8000 units/s). After any idle
      period that is all it can take at once. A bucket that turns hungry
      inside the slice gets its higher rate for the rest of that slice, so the
      bound is one slice of the higher rate. On top of that comes the cost of
      the one operation that found the counter positive (a write reserved as
      admitted, a read charged after), recorded as debt and repaid first.
    * A finite hard limit has a counter of its own, capped at
      ``hard_limit x slice_secs``: in any interval of ``T`` seconds a bucket is
      admitted at most ``hard_limit x (T + 2 x slice_secs)`` units (one full
      counter plus every refill inside the interval) plus that one operation's
      overshoot, which again is repaid.
    * Redistributed unused share may top a hungry bucket's counter up to at
      most ``(rate + min(hard_limit - rate, free pool)) x slice_secs`` (after
      repaying its debt), and the node spare never exceeds
      ``free pool x slice_secs``.
    * ``Unthrottled`` work is never held back, so it has no burst bound; it
      is charged (as debt of its bucket) all the same.

Slow start
    A bucket with no open connection keeps only 10 % of its reservation; the
    rest joins the free pool. :meth:`TenantThrottle.connection_opened` gives
    the full reservation back at once (the new rate applies from that instant,
    so within one refill slice the bucket runs at its full reservation).

Over-reservation
    If the (effective) reservations add up to more than the capacity, they are
    scaled down proportionally so that the node capacity still holds.

Waiting (:class:`TenantThrottleGate`, the Trio adapter at the bottom)
    A throttled request parks FIFO in its bucket's queue. Only the head of the
    queue keeps time: it sleeps until the instant :meth:`TenantThrottle.admission_wait`
    predicted, re-checks, and on success hands the head to the next waiter. The
    wait is bounded by the request's deadline and by ``max_wait_secs``
    (server parameter ``throttle_max_wait_ms``); a request that cannot be
    admitted within that bound fails with :class:`~tenantkv.errors.Throttled`
    (``retryAfterMs`` set) as soon as that is known, without sleeping first; a
    request that must wait although its deadline has already passed gets
    :class:`~tenantkv.errors.DeadlineExceeded`. Non-blocking connections get
    ``Throttled`` at once. A hint is the predicted wait spread by at most one
    slice. Predictions count the bucket's own unthrottled use as going on: when
    it takes all of the bucket's rate, other requests fail at once (hint: how
    soon the debt is repaid once it stops). A wait with no prediction (a rate of
    0 for now) is waited out a slice at a time, within the bound; a non-blocking
    request is told the next recompute. Removing a bucket wakes its waiters with
    :class:`~tenantkv.errors.BucketNotFound`.

Timekeeping
    Usage is averaged per slice: at a call after ``n`` slice boundaries, the
    moving averages take ``n`` steps (the usage sampled ran in the first slice,
    the others were idle); use past the node's capacity counts at the capacity.

Across workers (``serve --workers N``, :mod:`tenantkv.admission.quota_lease`)
    Each worker reports :meth:`TenantThrottle.usage` to the supervisor, which
    allocates the node's rates with the same :func:`allocate_rates` and leases
    each worker a share; :meth:`TenantThrottle.apply_lease` puts the throttle in
    **lease mode**, where the rates come from the lease and everything else (the
    refill, spill, debt and the per-request path) stays as described here.
    ``on_demand_event`` asks for an early report (first connection, newly
    hungry); the caller should report from its own task, not from inside it.

Server integration (what :mod:`tenantkv.server` calls)
    ``TenantThrottle(trio.current_time, ...)`` once; ``add_bucket`` /
    ``remove_bucket`` via ``TenantThrottleGate.bucket_removed`` (wakes waiters);
    ``connection_opened/closed`` when a session selects / leaves a bucket;
    ``gate.try_acquire(bucket, ...)`` or ``await gate.acquire(bucket, ...)``
    before an operation (the gate protocol of :mod:`tenantkv.admission.gate`);
    ``throttle.charge(bucket, ru, wu, unthrottled=..., reserved=...)`` after it
    (a write: ``gate.try_acquire(..., cost=)`` then ``gate.reserve`` before it);
    ``gate.wake()`` after ``set_node`` / ``set_bucket`` so waiters re-check at
    once; ``gate.statistics()`` for ``server_status``.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, Literal, NamedTuple

import trio

from tenantkv.admission.gate import ADMITTED, Admitted, ParameterTable
from tenantkv.admission.waiters import observe_wait
from tenantkv.errors import (
    BadValue,
    BucketExists,
    BucketNotFound,
    DeadlineExceeded,
    HardLimitZero,
    ServerError,
    Throttled,
)

#: A unit limit: a non-negative int, or ``None`` for "unlimited".
Limit = int | None

#: The wire spelling of an unlimited limit.
UNLIMITED: Final = "unlimited"

DEFAULT_UNIT_SIZE: Final = 4096
DEFAULT_WRITE_WEIGHT: Final = 2
DEFAULT_SLICE_SECS: Final = 0.1
DEFAULT_MAX_WAIT_SECS: Final = 5.0
#: Most debt a bucket may carry, in seconds of its rate (``throttle_max_request_secs``);
#: also the most one request may cost, in seconds of the bucket's hard limit.
DEFAULT_MAX_DEBT_SECS: Final = 5.0
#: Most debt unthrottled use may leave on its bucket, in seconds of the bucket's
#: rate: one refill window's worth (the spirit of the origin's one-second slots).
#: Unthrottled work is never delayed, so without this bound a burst of it locked
#: the bucket's other users out for as long as it took to repay (57 s seen).
UNTHROTTLED_DEBT_SECS: Final = 1.0
#: Share of its reservation a bucket keeps while it has no open connection.
SLOW_START_FRACTION: Final = 0.1
#: A non-hungry bucket's demand is this times its recent usage (room to grow
#: without being throttled first; what it leaves unused is redistributed).
DEMAND_HEADROOM: Final = 1.25
#: Weight of the newest slice in the usage average.
DEMAND_EWMA_ALPHA: Final = 0.5
#: A throttled bucket stays hungry this many slices past its predicted wake-up.
HUNGRY_HOLD_SLICES: Final = 3
#: Added to every predicted wait so a waiter wakes just *after* the refill
#: instant despite floating-point rounding.
WAKE_GUARD_SECS: Final = 1e-6
#: Bound of ``retryAfterMs`` for a non-blocking rejection.
NONBLOCKING_MAX_RETRY_MS: Final = 1000
#: Upper bounds (µs) of the wait-time histogram bins; a last bin counts the rest.
WAIT_HISTOGRAM_BOUNDS_US: Final[tuple[int, ...]] = (
    100,
    1_000,
    10_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
)

_INF: Final = math.inf


class _Unset(Enum):
    UNSET = "UNSET"


#: Sentinel for "leave unchanged" / "use the node default".
UNSET: Final = _Unset.UNSET
_Opt = Literal[_Unset.UNSET]


def read_units(nbytes: int, unit_size: int = DEFAULT_UNIT_SIZE) -> int:
    """Read units for ``nbytes`` read: ``ceil(nbytes / unit_size)``; 0 bytes cost 0."""
    if nbytes < 0 or unit_size <= 0:
        raise ValueError(f"bad read size {nbytes} / unit {unit_size}")
    return -(-nbytes // unit_size)


def write_units(nbytes: int, unit_size: int = DEFAULT_UNIT_SIZE) -> int:
    """Write units for ``nbytes`` written: ``ceil(nbytes / unit_size)``; 0 bytes cost 0.

    A delete writes no value but still costs 1 WU; the server passes that itself.
    """
    if nbytes < 0 or unit_size <= 0:
        raise ValueError(f"bad write size {nbytes} / unit {unit_size}")
    return -(-nbytes // unit_size)


def water_fill(total: float, caps: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Split ``total`` max-min fairly: item ``i`` gets at most ``caps[i]``.

    Items that want less than their weighted fair level get what they want; the
    rest share what is left in proportion to their weights. Runs in O(n log n).
    """
    n = len(caps)
    out = [0.0] * n
    if n == 0 or total <= 0.0:
        return out
    order = sorted(range(n), key=lambda i: caps[i] / weights[i])
    remaining = total
    wsum = float(sum(weights))
    for pos, i in enumerate(order):
        level = remaining / wsum
        if caps[i] <= level * weights[i]:
            out[i] = caps[i]
            remaining -= caps[i]
            wsum -= weights[i]
        else:
            for j in order[pos:]:
                out[j] = level * weights[j]
            break
    return out


# --------------------------------------------------------------------------- allocation


class RateNeed(NamedTuple):
    """What the allocation of allowance rates knows of one bucket: its properties and
    what its users did lately (one process's view, or the sum over every worker's).
    A named tuple: one is built per bucket at every recompute."""

    #: configured reservation (``None``: exempt from node capacity)
    reserved: Limit
    #: hard limit as a rate (``inf``: unlimited)
    hard_rate: float
    weight: float
    #: has at least one open connection (else slow start)
    connected: bool
    #: throttled recently or has waiters: its demand is unlimited
    hungry: bool
    #: recent usage in units/s (the larger of the moving average and the last slice)
    demand: float
    #: recent usage with the ``Unthrottled`` privilege in units/s (set aside first)
    unthrottled: float


@dataclass(frozen=True, slots=True)
class RateAllocation:
    """What :func:`allocate_rates` returns, item ``i`` for ``needs[i]``."""

    #: allowance rates (units/s; ``inf``: unlimited)
    rates: list[float]
    #: reservations in force (after slow start and over-reservation scaling)
    reserved_rates: list[float]
    #: the free pool left after reservations and unthrottled use (``inf``: no capacity)
    free_rate: float
    #: what of it no bucket wanted
    unallocated_rate: float


def allocate_rates(capacity: Limit, needs: Sequence[RateNeed], slice_secs: float) -> RateAllocation:
    """Every bucket's allowance rate: reservation + water-filled free share, capped at
    its hard limit (the module docstring's rules). Pure: :meth:`TenantThrottle._recompute`
    calls it with the process's own view, the multi-worker allocator
    (:mod:`tenantkv.admission.quota_lease`) with the node's, so they cannot diverge.
    """
    if capacity is None:
        # No free pool: everything counts as reserved, each bucket runs to its hard limit.
        return RateAllocation([b.hard_rate for b in needs], [_INF] * len(needs), _INF, 0.0)
    cap = float(capacity)
    rates = [b.hard_rate for b in needs]  # what an exempt bucket (reserved None) keeps
    res_rates = [_INF] * len(needs)
    members: list[int] = []
    wanted: list[float] = []
    for i, b in enumerate(needs):
        if b.reserved is not None:
            members.append(i)
            wanted.append(float(b.reserved) * (1.0 if b.connected else SLOW_START_FRACTION))
    total = sum(wanted)
    scale = cap / total if total > cap else 1.0
    min_demand = 1.0 / slice_secs  # one unit per slice: room to start
    floors: list[float] = []
    caps: list[float] = []
    weights: list[float] = []
    for i, r in zip(members, wanted, strict=True):
        b = needs[i]
        res = res_rates[i] = r * scale
        # Unthrottled usage cannot be held back: set it aside first.
        floor = b.unthrottled if b.unthrottled > res else res
        floors.append(floor)
        want = _INF if b.hungry else DEMAND_HEADROOM * b.demand + min_demand
        if b.hard_rate < want:
            want = b.hard_rate
        caps.append(want - floor if want > floor else 0.0)
        weights.append(b.weight)
    free = max(0.0, cap - sum(floors))
    extras = water_fill(free, caps, weights)
    for i, floor, extra in zip(members, floors, extras, strict=True):
        rates[i] = floor + extra
    return RateAllocation(rates, res_rates, free, max(0.0, free - sum(extras)))


# --------------------------------------------------------------------------- leases


@dataclass(frozen=True, slots=True)
class BucketUse:
    """One process's use of one bucket, now (what a worker reports each slice)."""

    connections: int
    #: throttled recently or has waiters
    hungry: bool
    #: units/s it used lately: the demand measure of :func:`allocate_rates`
    demand: float
    #: units/s of that with the ``Unthrottled`` privilege
    unthrottled: float


@dataclass(frozen=True, slots=True)
class BucketLease:
    """One worker's share of one bucket's node allowance, until the next lease
    (units/s; ``inf`` allowed): its allowance rate, the part of it that is
    reservation, and its share of the bucket's hard limit."""

    rate: float
    reserved_rate: float
    hard_rate: float


def _check_limit(name: str, value: object) -> Limit:
    """Validate a :data:`Limit` given through the Python API."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadValue(f"{name} must be a non-negative integer or unlimited, got {value!r}")
    return value


def _le(a: Limit, b: Limit) -> bool:
    """``a <= b`` where ``None`` is infinity."""
    if b is None:
        return True
    return a is not None and a <= b


def _wire(limit: Limit) -> int | str:
    return UNLIMITED if limit is None else limit


def _wire_float(value: float | None) -> float | str:
    """JSON has no infinity: spell it (and ``None``) ``"unlimited"``."""
    return UNLIMITED if value is None or math.isinf(value) else value


def _rate(limit: Limit) -> float:
    return _INF if limit is None else float(limit)


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True)
class BucketThrottleStatistics:
    """One bucket's throttle counters (an immutable snapshot)."""

    name: str
    reserved: Limit
    hard_limit: Limit
    weight: float
    connections: int
    #: Reservation in force now (after slow start and over-reservation scaling);
    #: ``inf`` when the node capacity or the bucket's reservation is unlimited.
    effective_reserved: float
    #: Current allowance rate in units/s (``None``: unlimited).
    allowance_rate: float | None
    #: Allowance left now (negative: debt; ``None``: unlimited).
    allowance: float | None
    hungry: bool
    ru_total: int
    wu_total: int
    #: Cost units charged in the current whole-second window / the one before.
    units_used_window: int
    units_used_previous_window: int
    throttle_count_total: int
    throttle_wait_micros_total: int
    reject_count_total: int
    #: ``(upper bound in µs, count)`` per bin; the last bound is ``inf``.
    wait_histogram: tuple[tuple[float, int], ...]
    #: Requests parked at the gate right now (the core has none: 0).
    waiting: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "reserved": _wire(self.reserved),
            "hard_limit": _wire(self.hard_limit),
            "weight": self.weight,
            "connections": self.connections,
            "effective_reserved": _wire_float(self.effective_reserved),
            "allowance_rate": _wire_float(self.allowance_rate),
            "allowance": _wire_float(self.allowance),
            "hungry": self.hungry,
            "ru_total": self.ru_total,
            "wu_total": self.wu_total,
            "units_used_window": self.units_used_window,
            "units_used_previous_window": self.units_used_previous_window,
            "throttle_count_total": self.throttle_count_total,
            "throttle_wait_micros_total": self.throttle_wait_micros_total,
            "reject_count_total": self.reject_count_total,
            "wait_histogram_us": [
                ["+Inf" if math.isinf(le) else int(le), n] for le, n in self.wait_histogram
            ],
            "waiting": self.waiting,
        }


@dataclass(frozen=True, slots=True)
class NodeThrottleStatistics:
    """The node's throttle counters (an immutable snapshot)."""

    enabled: bool
    capacity: Limit
    default_reserved: Limit
    default_hard_limit: Limit
    write_weight: int
    slice_secs: float
    max_wait_secs: float
    #: Free pool in units/s: capacity minus reservations in force (``None``: unlimited).
    free_pool_units: float | None
    #: What of it is left to share now, after capacity set aside for unthrottled use.
    free_pool_available_units: float | None
    #: Factor every reservation is scaled by because they exceed the capacity (1.0: none).
    reservation_scale: float
    #: Cost units charged beyond reservations in the current whole-second window.
    free_pool_used_window: int
    #: Unused share no hungry bucket took, usable first come first served.
    spare_units: float
    ru_total: int
    wu_total: int
    throttle_count_total: int
    reject_count_total: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "capacity": _wire(self.capacity),
            "default_throttle_reserved_units": _wire(self.default_reserved),
            "default_throttle_hard_limit": _wire(self.default_hard_limit),
            "write_weight": self.write_weight,
            "slice_ms": round(self.slice_secs * 1000),
            "throttle_max_wait_ms": round(self.max_wait_secs * 1000),
            "free_pool_units": _wire_float(self.free_pool_units),
            "free_pool_available_units": _wire_float(self.free_pool_available_units),
            "reservation_scale": round(self.reservation_scale, 6),
            "free_pool_used_window": self.free_pool_used_window,
            "spare_units": self.spare_units,
            "ru_total": self.ru_total,
            "wu_total": self.wu_total,
            "throttle_count_total": self.throttle_count_total,
            "reject_count_total": self.reject_count_total,
        }


@dataclass(frozen=True, slots=True)
class ThrottleStatistics:
    """What :meth:`TenantThrottle.statistics` returns."""

    node: NodeThrottleStatistics
    buckets: Mapping[str, BucketThrottleStatistics]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``tenant_throttle`` section of ``server_status``)."""
        return {
            "node": self.node.as_dict(),
            "buckets": {name: b.as_dict() for name, b in self.buckets.items()},
        }


# --------------------------------------------------------------------------- the gate


class _Bucket:
    """Mutable per-bucket state (slots: the fast path reads it for every op)."""

    __slots__ = (
        "bonus",
        "connections",
        "credit",
        "demand_ewma",
        "demand_last",
        "hard",
        "hard_limit",
        "hard_rate",
        "histogram",
        "hungry_until",
        "name",
        "prio_ewma",
        "prio_last",
        "prio_sample",
        "rate",
        "reject_count",
        "res_rate",
        "reserved",
        "ru_total",
        "throttle_count",
        "used_prev_window",
        "used_refill",
        "used_sample",
        "used_window",
        "wait_us_total",
        "weight",
        "wu_total",
    )

    def __init__(self, name: str, reserved: Limit, hard_limit: Limit, weight: float) -> None:
        self.name = name
        self.reserved = reserved
        self.hard_limit = hard_limit
        self.weight = weight
        self.connections = 0
        # Rates in units/s. ``credit``/``hard`` start infinite and are set to a
        # full slice by the first _recompute (a new bucket may start at once).
        self.hard_rate = _rate(hard_limit)
        self.rate = _INF
        self.res_rate = 0.0
        self.credit = _INF
        self.hard = _INF
        self.hungry_until = -_INF
        #: Redistributed share received at the last refill, as a rate (units/s).
        self.bonus = 0.0
        # usage since the last refill / demand sample / in the current window
        self.used_refill = 0
        self.used_sample = 0
        self.prio_sample = 0
        self.used_window = 0
        self.used_prev_window = 0
        self.demand_ewma = 0.0
        self.demand_last = 0.0
        self.prio_ewma = 0.0
        self.prio_last = 0.0
        self.ru_total = 0
        self.wu_total = 0
        self.throttle_count = 0
        self.wait_us_total = 0
        self.reject_count = 0
        self.histogram = [0] * (len(WAIT_HISTOGRAM_BOUNDS_US) + 1)


class TenantThrottle:
    """Per-bucket unit quotas; pure logic with an injected clock (see the module doc).

    ``clock`` returns seconds (any origin); the Trio adapter needs it to be
    ``trio.current_time``. Limits are units per second, ``None`` = unlimited.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        capacity: Limit = None,
        default_reserved: Limit = 0,
        default_hard_limit: Limit = None,
        write_weight: int = DEFAULT_WRITE_WEIGHT,
        slice_secs: float = DEFAULT_SLICE_SECS,
        max_wait_secs: float = DEFAULT_MAX_WAIT_SECS,
        max_debt_secs: float = DEFAULT_MAX_DEBT_SECS,
    ) -> None:
        if not 0.0 < slice_secs <= 0.1:
            raise ValueError(f"slice_secs must be in (0, 0.1], got {slice_secs}")
        if isinstance(write_weight, bool) or not isinstance(write_weight, int) or write_weight < 0:
            raise ValueError(f"write_weight must be a non-negative int, got {write_weight!r}")
        self._clock = clock
        self._capacity = _check_limit("capacity", capacity)
        self._default_reserved = _check_limit("default_throttle_reserved_units", default_reserved)
        self._default_hard = _check_limit("default_throttle_hard_limit", default_hard_limit)
        if not _le(self._default_reserved, self._default_hard):
            raise BadValue("default reserved can't exceed hard limit")
        self._write_weight = write_weight
        self._slice = slice_secs
        self._hold = HUNGRY_HOLD_SLICES * slice_secs
        #: Longest a request may wait for its turn (server ``throttle_max_wait_ms``).
        self.max_wait_secs = max_wait_secs
        #: Debt bound and largest request, in seconds of a bucket's rate / hard limit.
        self.max_debt_secs = max_debt_secs
        self._buckets: dict[str, _Bucket] = {}
        now = clock()
        self._window = math.floor(now)
        self._last_sample = now
        self._slice_idx = self._slice_index(now)
        self._next_slice = (self._slice_idx + 1) * slice_secs
        self._free_rate = _INF if capacity is None else float(capacity)
        self._unallocated_rate = 0.0
        self._spare = 0.0
        self._enabled = capacity is not None
        self._ru_total = 0
        self._wu_total = 0
        self._free_used_window = 0
        self._throttle_count = 0
        self._reject_count = 0
        #: Lease mode (``serve --workers N``): each bucket's rates as the supervisor
        #: leased them to this worker (None: this process allocates on its own).
        self._lease: dict[str, BucketLease] | None = None
        #: How many workers share the node: a bucket the lease does not mention
        #: runs on 1/N of what this process alone would give it.
        self._lease_workers = 1
        #: Called in lease mode when a bucket gets its first connection or newly
        #: turns hungry: the caller reports :meth:`usage` at once, not a slice later.
        self.on_demand_event: Callable[[], None] | None = None

    # ------------------------------------------------------------------ properties

    @property
    def enabled(self) -> bool:
        """False when nothing can ever be throttled: the server may skip admission.

        (It should still :meth:`charge`, to keep the unit totals.)
        """
        return self._enabled

    @property
    def capacity(self) -> Limit:
        return self._capacity

    @property
    def clock(self) -> Callable[[], float]:
        """The clock the throttle reads (Trio's in the server)."""
        return self._clock

    @property
    def slice_secs(self) -> float:
        """Length of one refill slice."""
        return self._slice

    @property
    def write_weight(self) -> int:
        return self._write_weight

    def bucket_limits(self, name: str) -> tuple[Limit, Limit]:
        """``(reserved, hard_limit)`` as set for bucket ``name``."""
        b = self._get(name)
        return b.reserved, b.hard_limit

    def node_limits(self) -> tuple[Limit, Limit, Limit]:
        """``(capacity, default_reserved, default_hard_limit)``."""
        return self._capacity, self._default_reserved, self._default_hard

    def __contains__(self, name: object) -> bool:
        return name in self._buckets

    # ------------------------------------------------------------------ leases (workers)

    def rate_needs(self, use: Mapping[str, BucketUse]) -> dict[str, RateNeed]:
        """Every bucket's properties joined with ``use`` (a bucket missing from it
        counts as unused): the input of :func:`allocate_rates` for the node."""
        idle = BucketUse(0, False, 0.0, 0.0)
        needs: dict[str, RateNeed] = {}
        for name, b in self._buckets.items():
            u = use.get(name, idle)
            needs[name] = RateNeed(
                reserved=b.reserved,
                hard_rate=_rate(b.hard_limit),
                weight=b.weight,
                connected=u.connections > 0,
                hungry=u.hungry,
                demand=u.demand,
                unthrottled=u.unthrottled,
            )
        return needs

    @property
    def leased(self) -> bool:
        """True once :meth:`apply_lease` was called: the rates come from the lease."""
        return self._lease is not None

    def usage(self) -> dict[str, BucketUse]:
        """This process's use of every bucket, now: what a worker reports to the
        supervisor (:class:`~tenantkv.admission.quota_lease.QuotaAllocator`)."""
        now = self._catch_up()
        return {
            name: BucketUse(
                connections=b.connections,
                hungry=b.hungry_until > now,
                demand=max(b.demand_ewma, b.demand_last),
                unthrottled=max(b.prio_ewma, b.prio_last),
            )
            for name, b in self._buckets.items()
        }

    def apply_lease(self, lease: Mapping[str, BucketLease], *, workers: int | None = None) -> None:
        """Enter (or refresh) lease mode: take each bucket's rates from ``lease``.

        A bucket the lease does not mention (created, or first used here, since the
        supervisor computed it) runs on a provisional share until the next lease:
        1/``workers`` of what this process alone would allocate it (``workers``:
        how many workers share the node; None keeps the last value, at first 1).
        The rest of the current slice is credited or debited pro rata, as for any
        rate change; waiters are woken by the caller (``TenantThrottleGate.wake``).
        """
        if workers is not None:
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
                raise ValueError(f"workers must be a positive int, got {workers!r}")
            self._lease_workers = workers
        now = self._catch_up()
        if self._lease is None:
            # The spare came from this process's own allocation of the whole node;
            # from now on only the worker's unused share feeds it.
            self._spare = 0.0
        self._lease = dict(lease)
        self._recompute(now)

    # ------------------------------------------------------------------ configuration

    def add_bucket(
        self,
        name: str,
        *,
        reserved: Limit | _Opt = UNSET,
        hard_limit: Limit | _Opt = UNSET,
        weight: float = 1.0,
    ) -> None:
        """Register a bucket; unset limits take the node defaults (as of now)."""
        if name in self._buckets:
            raise BucketExists(f"bucket {name!r} already exists")
        res = self._default_reserved if reserved is UNSET else _check_limit("reserved", reserved)
        hard = self._default_hard if hard_limit is UNSET else _check_limit("hard_limit", hard_limit)
        if not _le(res, hard):
            raise BadValue(f"bucket {name!r}: reserved can't exceed hard limit")
        self._check_weight(weight)
        self._catch_up()
        self._buckets[name] = _Bucket(name, res, hard, float(weight))
        self._reconfigure()

    def remove_bucket(self, name: str) -> None:
        """Forget a bucket (its share returns to the others at once)."""
        self._get(name)
        self._catch_up()
        del self._buckets[name]
        self._reconfigure()

    def set_node(
        self,
        *,
        capacity: Limit | _Opt = UNSET,
        default_reserved: Limit | _Opt = UNSET,
        default_hard_limit: Limit | _Opt = UNSET,
    ) -> None:
        """Change node properties. New defaults apply to buckets added later."""
        cap = self._capacity if capacity is UNSET else _check_limit("capacity", capacity)
        res = (
            self._default_reserved
            if default_reserved is UNSET
            else _check_limit("default_throttle_reserved_units", default_reserved)
        )
        hard = (
            self._default_hard
            if default_hard_limit is UNSET
            else _check_limit("default_throttle_hard_limit", default_hard_limit)
        )
        if not _le(res, hard):
            raise BadValue(
                "default_throttle_reserved_units: reserved can't exceed hard limit "
                f"(default_throttle_hard_limit {_wire(hard)})"
            )
        self._catch_up()
        self._capacity, self._default_reserved, self._default_hard = cap, res, hard
        self._reconfigure()

    def set_bucket(
        self,
        name: str,
        *,
        reserved: Limit | _Opt = UNSET,
        hard_limit: Limit | _Opt = UNSET,
        weight: float | _Opt = UNSET,
    ) -> None:
        """Change a bucket's properties; unset ones keep their value."""
        b = self._get(name)
        res = b.reserved if reserved is UNSET else _check_limit("reserved", reserved)
        hard = b.hard_limit if hard_limit is UNSET else _check_limit("hard_limit", hard_limit)
        if not _le(res, hard):
            raise BadValue(
                f"bucket {name!r}: reserved can't exceed hard limit "
                f"(reserved {_wire(res)}, hard_limit {_wire(hard)})"
            )
        if weight is not UNSET:
            self._check_weight(weight)
        self._catch_up()
        b.reserved = res
        if hard != b.hard_limit:
            b.hard_limit = hard
            b.hard_rate = _rate(hard)
            cap = b.hard_rate * self._slice
            # Keep debt; a raised limit does not hand out a fresh burst.
            b.hard = _INF if hard is None else min(b.hard, cap)
        if weight is not UNSET:
            b.weight = float(weight)
        self._reconfigure()

    def connection_opened(self, bucket: str) -> None:
        """A connection selected ``bucket``: the first one ends slow start."""
        b = self._get(bucket)
        b.connections += 1
        if b.connections == 1:
            self._recompute(self._catch_up())
            if self._lease is not None and self.on_demand_event is not None:
                self.on_demand_event()

    def connection_closed(self, bucket: str) -> None:
        """A connection left ``bucket``; with none left it falls back to slow start."""
        b = self._buckets.get(bucket)
        if b is None or b.connections == 0:
            return
        b.connections -= 1
        if b.connections == 0:
            self._recompute(self._catch_up())

    # ------------------------------------------------------------------ hot path

    def admission_wait(self, bucket: str, *, unthrottled: bool = False) -> float:
        """``0.0`` if an operation on ``bucket`` may run now, else seconds to wait.

        The wait is a prediction (the rates may change meanwhile): re-check at
        that time. ``inf`` means "not before a property changes" (hard limit 0).
        Raises :class:`BucketNotFound` for an unknown bucket.
        """
        b = self._buckets.get(bucket)
        if b is not None and b.credit > 0.0 and b.hard > 0.0:
            # Allowance left: admit without reading the clock (~7 % of a pipelined
            # GET, measured). Refills only add credit, and charge() after the
            # operation advances the slices.
            return 0.0
        now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
            b = self._buckets.get(bucket)
        if b is None:
            raise BucketNotFound(f"bucket {bucket!r} not found")
        if unthrottled or (b.hard > 0.0 and (b.credit > 0.0 or self._spare > 0.0)):
            return 0.0
        return self._throttled(b, now)

    def write_wait(self, bucket: str, cost: float) -> float:
        """:meth:`admission_wait` for a write whose cost (``cost`` units) is known
        before it runs, from its value: ``0.0`` when it may run now — and then the
        caller reserves that cost (:meth:`reserve`) before anything else runs.

        A write is admitted while its bucket has allowance left, as any request;
        since every write admitted before it was reserved at its cost, in flight
        or not, the debt it may leave is less than its own cost: writes in flight
        cannot overshoot. A write costing more than :meth:`max_request_units` (a
        *big write*) is admitted only when its bucket owes nothing — its hard-limit
        counter full: no debt, nothing in flight, nothing spent since the last
        refill — and its debt is then repaid before anything else on the bucket
        runs. ``inf``: not before something changes (:meth:`admission_wait`).
        """
        wait = self.admission_wait(bucket)
        if wait != 0.0 or cost <= self.max_request_units(bucket):
            return wait
        now = self._catch_up()  # (the fast check above reads no clock)
        b = self._buckets[bucket]
        hr = b.hard_rate
        full = hr * self._slice
        short = full - b.hard - full * 1e-9  # (a refill clips the counter at ``full``)
        if short <= 0.0 or hr == _INF:
            return 0.0
        b.hungry_until = max(b.hungry_until, now + self._hold)
        return self._time_to_positive(short, hr, now) + WAKE_GUARD_SECS

    def reserve(self, bucket: str, cost: int, *, unthrottled: bool = False) -> int:
        """Spend a write's known cost from its bucket's counters the moment
        :meth:`write_wait` admitted it (before it runs): the units reserved, which
        the caller passes to :meth:`charge` as ``reserved`` once the write ran, to
        settle the difference (0: nothing reserved — throttling off, an
        ``unthrottled`` user, no such bucket). No bound on the debt it leaves:
        debt is never forgiven."""
        if unthrottled or not self._enabled or cost <= 0:
            return 0
        b = self._buckets.get(bucket)
        if b is None:
            return 0
        now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
        self._spend(b, float(cost), None)
        return cost

    def refund(self, bucket: str, units: int) -> None:
        """Give back ``units`` a write reserved and never ran (a later gate refused
        it: "not executed" costs nothing); a counter never grows past one slice."""
        b = self._buckets.get(bucket)
        if b is not None and units > 0:
            self._give_back(b, float(units))

    def run_allowance(self, bucket: str, *, unthrottled: bool = False) -> float:
        """Just after an operation on ``bucket`` was admitted: the units the
        operations run right after it — back to back, with nothing else touching
        the throttle in between — may cost in all before one of them would need
        more than the fast check. Operation ``i`` of such a run is admitted, as
        :meth:`admission_wait` would admit it, exactly when the costs of the
        operations before it sum to less than this (credit and hard allowance both
        still positive); ``inf`` when nothing limits them (throttling off, an
        unthrottled user). Charging the run's total once then leaves the same
        state as charging each operation: before the crossing one, no charge can
        dip into the spare pool or the debt bound.
        """
        if unthrottled or not self._enabled:
            return _INF
        b = self._buckets.get(bucket)
        if b is None:
            return 0.0
        c, h = b.credit, b.hard
        return (c if c < h else h) if c > 0.0 and h > 0.0 else 0.0

    def max_request_units(self, bucket: str) -> float:
        """The most a write on ``bucket`` may cost and still be admitted while the
        bucket has allowance left: ``max_debt_secs`` of its hard limit, so the debt
        it leaves stays below that; a costlier one waits until the bucket owes
        nothing (:meth:`write_wait`). ``inf`` when the hard limit is unlimited or 0
        (a 0 limit throttles everything anyway)."""
        b = self._buckets.get(bucket)
        if b is None:
            return _INF
        # The configured limit, not a worker's leased share of it.
        hard_rate = b.hard_rate if self._lease is None else _rate(b.hard_limit)
        if hard_rate == _INF or hard_rate <= 0.0:
            return _INF
        return max(hard_rate * self.max_debt_secs, 1.0)

    def charge(
        self,
        bucket: str,
        ru: int,
        wu: int,
        *,
        unthrottled: bool = False,
        min_cost: int = 0,
        now: float | None = None,
        reserved: int = 0,
    ) -> None:
        """Account an operation that ran: ``ru`` read and ``wu`` write units.

        ``ru``/``wu`` are metered as given (what a bill counts: a miss reads
        nothing); the throttle cost is at least ``min_cost`` units, so an operation
        that ran always spends something (``min_op_units``: misses and failed
        writes are held to the limits like hits). Pass ``unthrottled=True`` for
        operations admitted with the privilege, so their usage is set aside from
        the free pool before it is shared. ``now`` is the throttle clock's reading
        when the caller has one (the operations of one received chunk are charged
        at the chunk's instant: one clock read per chunk, not per operation).
        ``reserved``: what :meth:`reserve` spent for it when it was admitted (writes):
        only the difference is spent now, or given back.

        Debt is never forgiven: what an operation cost beyond its allowance is
        repaid from later refills, however large (reads are bounded before they
        run by their own rules). Only unthrottled use, which is never held back,
        leaves at most :data:`UNTHROTTLED_DEBT_SECS` of its bucket's rate.
        """
        cost = ru + self._write_weight * wu
        if cost < min_cost:
            cost = min_cost
        self._ru_total += ru
        self._wu_total += wu
        if now is None:
            now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
        b = self._buckets.get(bucket)
        if b is None:  # removed while the operation ran
            return
        b.ru_total += ru
        b.wu_total += wu
        b.used_refill += cost
        b.used_sample += cost
        if unthrottled:
            b.prio_sample += cost
        before = b.used_window
        after = before + cost
        b.used_window = after
        res = b.res_rate
        if after > res:
            self._free_used_window += round(after - (before if before > res else res))
        if reserved:
            owed = cost - reserved
            if owed < 0:
                self._give_back(b, float(-owed))
                return
            cost = owed
        c = b.credit
        h = b.hard
        if c >= cost and h >= cost:
            # Within both allowances (an unlimited bucket's are infinite): nothing
            # to take from the spare, no debt to bound.
            b.credit = c - cost
            b.hard = h - cost
            return
        self._spend(b, float(cost), UNTHROTTLED_DEBT_SECS if unthrottled else None)

    def _spend(self, b: _Bucket, cost: float, bound_secs: float | None) -> None:
        """Take ``cost`` from ``b``'s counters, beyond its own allowance from the node
        spare first; what is left is debt, bounded to ``bound_secs`` of the rates
        only for unthrottled use (None: never forgiven)."""
        c = b.credit
        h = b.hard
        spare = self._spare
        if c < cost and spare > 0.0:
            # Overshoot beyond the bucket's own allowance comes from the spare first.
            take = cost - c if c > 0.0 else cost
            if take > spare:
                take = spare
            self._spare = spare - take
            c += take
        c -= cost
        h -= cost
        if bound_secs is not None:
            # Unthrottled work is never held back: the debt it leaves its bucket's
            # other users is one refill window, not minutes of lockout.
            if h < 0.0 and h < -b.hard_rate * bound_secs:
                h = -b.hard_rate * bound_secs
            if c < 0.0 and c < -b.rate * bound_secs:
                c = -b.rate * bound_secs
        b.credit = c
        b.hard = h

    def _give_back(self, b: _Bucket, units: float) -> None:
        """Return ``units`` reserved and not spent to ``b``'s counters, never past
        one slice of their rates (what a refill would allow)."""
        burst = self._slice
        if b.credit != _INF:
            b.credit = min(b.credit + units, max(b.credit, b.rate * burst))
        if b.hard != _INF:
            b.hard = min(b.hard + units, max(b.hard, b.hard_rate * burst))

    # ------------------------------------------------------------------ waits & stats

    def paced_wait(self, bucket: str) -> float:
        """For a request at the head of ``bucket``'s queue that :meth:`admission_wait`
        admits: seconds until the allowance, earned evenly through the slice
        instead of a slice at a time, would admit it too (0.0: now).

        A slice's refill comes at once at its start; a queue that drained it there
        would run the bucket's whole slice in a burst, holding the event loop
        from every other bucket for milliseconds at each boundary. Paced, a
        queued bucket runs in a steady trickle at its rate. Only waiting requests
        are paced, so the fast path and what is admitted per slice do not change:
        by the slice's end the paced allowance is the allowance.
        """
        b = self._buckets.get(bucket)
        if b is None or not self._enabled:
            return 0.0
        # When what is left of each counter is no more than what the rest of the
        # slice earns: the slice's end, less the time the counter lasts at its rate.
        at = 0.0
        hr = b.hard_rate
        if 0.0 < hr < _INF:
            at = self._next_slice - b.hard / hr
        r = b.rate + b.bonus
        if 0.0 < r < _INF and self._spare <= 0.0:
            at = max(at, self._next_slice - b.credit / r)
        wait = at - self._clock()
        return wait if wait > PACE_MIN_SECS else 0.0

    def estimate_wait(self, bucket: str) -> float:
        """Like :meth:`admission_wait`'s answer but without counting as demand (0.0 = now)."""
        now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
        b = self._get(bucket)
        if b.hard > 0.0 and (b.credit > 0.0 or self._spare > 0.0):
            return 0.0
        return self._predict(b, now)

    def record_throttled(
        self, bucket: str, waited_secs: float, *, rejected: bool, parked: bool = True
    ) -> None:
        """Count one request that could not run at once (called by the adapter).

        ``waited_secs`` is how long it was parked; ``parked=False`` for a request
        rejected without waiting (it does not enter the wait histogram).
        """
        self._throttle_count += 1
        if rejected:
            self._reject_count += 1
        b = self._buckets.get(bucket)
        if b is None:
            return
        b.throttle_count += 1
        if rejected:
            b.reject_count += 1
        if parked:
            us = max(0, round(waited_secs * 1e6))
            b.wait_us_total += us
            observe_wait(b.histogram, WAIT_HISTOGRAM_BOUNDS_US, us)

    def statistics(self) -> ThrottleStatistics:
        """An immutable snapshot of every counter (trio's ``statistics()`` convention)."""
        now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
        bounds: tuple[float, ...] = (*WAIT_HISTOGRAM_BOUNDS_US, _INF)
        buckets = {
            name: BucketThrottleStatistics(
                name=name,
                reserved=b.reserved,
                hard_limit=b.hard_limit,
                weight=b.weight,
                connections=b.connections,
                # What the docs call them: the reservation in force (the configured
                # one when capacity is unlimited and nothing is scaled), and the rate
                # the bucket may actually spend (never above its hard limit, even
                # while unthrottled use sets capacity aside for it).
                effective_reserved=(
                    float(b.reserved or 0) if self._capacity is None else b.res_rate
                ),
                allowance_rate=None if math.isinf(rate := min(b.rate, b.hard_rate)) else rate,
                allowance=None if math.isinf(min(b.credit, b.hard)) else min(b.credit, b.hard),
                hungry=b.hungry_until > now,
                ru_total=b.ru_total,
                wu_total=b.wu_total,
                units_used_window=b.used_window,
                units_used_previous_window=b.used_prev_window,
                throttle_count_total=b.throttle_count,
                throttle_wait_micros_total=b.wait_us_total,
                reject_count_total=b.reject_count,
                wait_histogram=tuple(zip(bounds, b.histogram, strict=True)),
            )
            for name, b in self._buckets.items()
        }
        node = NodeThrottleStatistics(
            enabled=self._enabled,
            capacity=self._capacity,
            default_reserved=self._default_reserved,
            default_hard_limit=self._default_hard,
            write_weight=self._write_weight,
            slice_secs=self._slice,
            max_wait_secs=self.max_wait_secs,
            free_pool_units=(
                None
                if self._capacity is None
                else max(
                    0.0,
                    self._capacity
                    - sum(b.res_rate for b in self._buckets.values() if b.reserved is not None),
                )
            ),
            free_pool_available_units=None if self._capacity is None else self._free_rate,
            reservation_scale=self._reservation_scale(),
            free_pool_used_window=self._free_used_window,
            spare_units=self._spare,
            ru_total=self._ru_total,
            wu_total=self._wu_total,
            throttle_count_total=self._throttle_count,
            reject_count_total=self._reject_count,
        )
        return ThrottleStatistics(node=node, buckets=MappingProxyType(buckets))

    def _reservation_scale(self) -> float:
        """capacity / Σ reservations when they exceed it, else 1.0 (what
        :meth:`_recompute` scales every reservation by)."""
        if self._capacity is None:
            return 1.0
        total = sum(float(b.reserved or 0) for b in self._buckets.values())
        return self._capacity / total if total > self._capacity else 1.0

    # ------------------------------------------------------------------ internals

    def _get(self, name: str) -> _Bucket:
        b = self._buckets.get(name)
        if b is None:
            raise BucketNotFound(f"bucket {name!r} not found")
        return b

    @staticmethod
    def _check_weight(weight: object) -> None:
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise BadValue(f"weight must be a positive number, got {weight!r}")
        if math.isinf(weight):
            raise BadValue("weight must be finite")

    def _slice_index(self, now: float) -> int:
        idx = math.floor(now / self._slice)
        return idx + 1 if (idx + 1) * self._slice <= now else idx

    def _catch_up(self) -> float:
        """Process slice boundaries passed since the last call; return the time."""
        now = self._clock()
        if now >= self._next_slice:
            self._advance(now)
        return now

    def _reconfigure(self) -> None:
        self._enabled = self._capacity is not None or any(
            b.hard_limit is not None for b in self._buckets.values()
        )
        self._recompute(self._clock())

    def _throttled(self, b: _Bucket, now: float) -> float:
        """Slow path of :meth:`admission_wait`: mark demand, predict the wait."""
        if b.hungry_until <= now:
            # Newly hungry: its share grows from this instant, not the next slice.
            b.hungry_until = now + self._hold
            self._recompute(now)
            if self._lease is not None and self.on_demand_event is not None:
                self.on_demand_event()
            if b.hard > 0.0 and (b.credit > 0.0 or self._spare > 0.0):
                return 0.0
        wait = self._predict(b, now)
        until = now + min(wait, self.max_wait_secs) + self._hold
        if until > b.hungry_until:
            b.hungry_until = until
        return wait

    def _predict(self, b: _Bucket, now: float, *, gross: bool = False) -> float:
        """Seconds until the slice refills bring ``b``'s counters above zero, at
        their rates less what the bucket's own unthrottled use goes on spending
        (``gross``: without that use, as once it stops). ``inf``: not at these
        rates (a rate of 0, or unthrottled use that takes all of it)."""
        p = 0.0 if gross else (b.prio_ewma if b.prio_ewma > b.prio_last else b.prio_last)
        wait = 0.0
        if b.credit <= 0.0 and self._spare <= 0.0:
            wait = self._time_to_positive(-b.credit, b.rate + b.bonus - p, now)
        if b.hard <= 0.0:
            wait = max(wait, self._time_to_positive(-b.hard, b.hard_rate - p, now))
        if self._lease is not None and wait > self._slice and b.hard_limit != 0:
            # Leased rates are this worker's share until the next lease, at most a
            # slice away (sooner once this bucket turns hungry here): a prediction
            # from the share alone (a new connection's zero share, say) would send
            # clients away for seconds the node would serve them in. A hard limit
            # of 0 stays "never" (HardLimitZero). But a debt is never repaid faster
            # than at the node's whole hard limit: that wait is certain.
            least = 0.0
            if b.hard <= 0.0:
                least = self._time_to_positive(-b.hard, _rate(b.hard_limit) - p, now)
            wait = least if least > self._slice else self._slice
        return wait + WAKE_GUARD_SECS

    def unthrottled_hold(self, bucket: str) -> tuple[float, float]:
        """Why :meth:`admission_wait` said ``inf`` for a bucket whose limit is not 0:
        ``(unthrottled rate, allowance rate)`` when the bucket's own unthrottled use
        (never held back) spends all the allowance rate of a counter that is spent —
        no other request on it can run while that use goes on — else ``(0.0, 0.0)``
        (the rate is 0 for now: the rates are recomputed every slice)."""
        b = self._get(bucket)
        p = b.prio_ewma if b.prio_ewma > b.prio_last else b.prio_last
        if p <= 0.0:
            return 0.0, 0.0
        if b.hard <= 0.0 and 0.0 < b.hard_rate <= p:
            return p, b.hard_rate
        r = b.rate + b.bonus
        if b.credit <= 0.0 and self._spare <= 0.0 and 0.0 < r <= p:
            return p, r
        return 0.0, 0.0

    def gross_wait(self, bucket: str) -> float:
        """The wait :meth:`admission_wait` would predict without the bucket's own
        unthrottled use: how soon its debt is repaid once that use stops."""
        return self._predict(self._get(bucket), self._catch_up(), gross=True)

    def until_next_slice(self) -> float:
        """Seconds to the next refill, when the rates are next recomputed."""
        return self._next_slice - self._catch_up() + WAKE_GUARD_SECS

    def _time_to_positive(self, deficit: float, rate: float, now: float) -> float:
        if rate <= 0.0:
            return _INF
        boundaries = math.floor(deficit / (rate * self._slice)) + 1
        return (self._next_slice - now) + (boundaries - 1) * self._slice

    def _advance(self, now: float) -> None:
        """At the first call after slice boundaries: refill, sample, recompute rates."""
        idx = self._slice_index(now)
        n = idx - self._slice_idx
        since = self._slice_idx * self._slice
        ended = self._next_slice  # the end of the slice every usage sampled ran in
        self._slice_idx = idx
        self._next_slice = (idx + 1) * self._slice
        self._refill(n, since)
        # Usage is sampled over the real time between calls, which jitters.
        alpha = DEMAND_EWMA_ALPHA
        if n <= 1:
            span = max(now - self._last_sample, self._slice / 2)
            idle = 1.0  # (the averages take this one step)
        else:
            # Slices passed with no call at all: the usage sampled ran in the slice
            # the last call was in (every call first advances), and the slices
            # since were idle. The averages take one step per slice, so a burst
            # that stopped is forgotten at the rate the slices pass, not at the
            # rate calls come (16 s once after an unthrottled burst).
            span = max(ended - self._last_sample, self._slice / 2)
            idle = (1.0 - alpha) ** (n - 1)
        self._last_sample = now
        # Use past the node's capacity claims nothing more of it, so the averages
        # count it at most at the capacity: once an (unthrottled) burst far past it
        # stops, the capacity comes back to the others within a few slices, not
        # after the average has halved its way down from many times the capacity.
        most = _INF if self._capacity is None else float(self._capacity)
        for b in self._buckets.values():
            s = b.used_sample / span
            if s > most:
                s = most
            e = b.demand_ewma + alpha * (s - b.demand_ewma)
            p = b.prio_sample / span
            if p > most:
                p = most
            q = b.prio_ewma + alpha * (p - b.prio_ewma)
            if n > 1:
                e *= idle
                q *= idle
                s = p = 0.0  # the last slice was idle
            b.demand_last = s
            b.demand_ewma = e
            b.prio_last = p
            b.prio_ewma = q
            b.used_sample = 0
            b.prio_sample = 0
        window = math.floor(now)
        if window != self._window:
            adjacent = window == self._window + 1
            for b in self._buckets.values():
                b.used_prev_window = b.used_window if adjacent else 0
                b.used_window = 0
            self._free_used_window = 0
            self._window = window
        self._recompute(now)

    def _refill(self, n: int, since: float) -> None:
        """Credit every bucket ``n`` slices of its rate, each counter capped at one slice.

        Share a bucket did not use (never its reservation) goes to the buckets
        that were hungry, water-filled; what nobody takes becomes node spare.
        """
        if n <= 0:
            return
        burst = self._slice
        dt = n * burst
        limited = self._capacity is not None
        pool = self._unallocated_rate * dt if limited else 0.0
        hungry: list[_Bucket] = []
        for b in self._buckets.values():
            hr = b.hard_rate
            if hr != _INF:
                h = b.hard + hr * dt
                cap = hr * burst
                b.hard = cap if h > cap else h
            b.bonus = 0.0
            r = b.rate
            if r == _INF:
                b.used_refill = 0
                continue
            c = b.credit + r * dt
            cap = r * burst
            if c > cap:
                if limited:
                    unused_res = b.res_rate * dt - b.used_refill
                    spill = c - cap - (unused_res if unused_res > 0.0 else 0.0)
                    if spill > 0.0:
                        pool += spill
                c = cap
            b.credit = c
            b.used_refill = 0
            if b.hungry_until > since:
                hungry.append(b)
        if not limited:
            return
        pool += self._spare
        free = self._free_rate
        if hungry and pool > 0.0:
            rooms: list[float] = []
            for b in hungry:
                room_rate = min(b.hard_rate - b.rate, free)
                span = min(dt, b.hungry_until - since)
                top = (b.rate + room_rate) * burst - b.credit
                rooms.append(max(0.0, min(room_rate * span, top)))
            gifts = water_fill(pool, rooms, [b.weight for b in hungry])
            for b, g in zip(hungry, gifts, strict=True):
                if g > 0.0:
                    b.credit += g
                    b.bonus = g / dt
                    pool -= g
        self._spare = max(0.0, min(pool, free * burst))

    def _need(self, b: _Bucket, now: float, hard_rate: float) -> RateNeed:
        return RateNeed(
            reserved=b.reserved,
            hard_rate=hard_rate,
            weight=b.weight,
            connected=b.connections > 0,
            hungry=b.hungry_until > now,
            demand=max(b.demand_ewma, b.demand_last),
            unthrottled=max(b.prio_ewma, b.prio_last),
        )

    def _recompute(self, now: float) -> None:
        """Set every bucket's allowance rate: reservation + water-filled free share
        (:func:`allocate_rates`), or in lease mode the leased rates.

        The current slice was credited at the old rates; the difference for the
        rest of it is credited (or debited) now, so a change takes effect at once.
        """
        buckets = list(self._buckets.values())
        if self._lease is not None:
            self._recompute_leased(buckets, now)
            return
        old = [b.rate for b in buckets]
        alloc = allocate_rates(
            self._capacity,
            [
                RateNeed(
                    b.reserved,
                    b.hard_rate,
                    b.weight,
                    b.connections > 0,
                    b.hungry_until > now,
                    b.demand_ewma if b.demand_ewma > b.demand_last else b.demand_last,
                    b.prio_ewma if b.prio_ewma > b.prio_last else b.prio_last,
                )
                for b in buckets
            ],
            self._slice,
        )
        for b, rate, res_rate in zip(buckets, alloc.rates, alloc.reserved_rates, strict=True):
            b.rate = rate
            b.res_rate = res_rate
        free = self._free_rate = alloc.free_rate
        self._unallocated_rate = alloc.unallocated_rate
        if self._capacity is None:
            self._spare = 0.0
        elif self._spare > free * self._slice:
            self._spare = free * self._slice
        burst = self._slice
        rest = self._next_slice - now
        for b, before in zip(buckets, old, strict=True):
            _credit_new_rate(b, before, burst, rest)
            if b.hard_rate == _INF:
                b.hard = _INF
            elif b.hard == _INF:
                b.hard = b.hard_rate * burst

    def _recompute_leased(self, buckets: list[_Bucket], now: float) -> None:
        """Lease mode: the rates come from the lease, a bucket it does not mention
        gets its provisional share. The local refill (spill to hungry buckets, spare)
        only moves this worker's own share around, so the node sums still hold."""
        lease = self._lease
        assert lease is not None
        old = [b.rate for b in buckets]
        old_hard = [b.hard_rate for b in buckets]
        workers = float(self._lease_workers)
        alone: RateAllocation | None = None
        if any(b.name not in lease for b in buckets):
            # What this process alone would give, with the configured hard limits.
            alone = allocate_rates(
                self._capacity,
                [self._need(b, now, _rate(b.hard_limit)) for b in buckets],
                self._slice,
            )
        free = 0.0
        for i, b in enumerate(buckets):
            limit = _rate(b.hard_limit)
            share = lease.get(b.name)
            if share is not None:
                rate, res_rate, hard_rate = share.rate, share.reserved_rate, share.hard_rate
            else:
                assert alone is not None
                rate = alone.rates[i] / workers
                res_rate = alone.reserved_rates[i] / workers
                hard_rate = limit / workers
            b.rate = rate
            b.res_rate = res_rate
            # A limit lowered since the lease was computed applies at once.
            b.hard_rate = hard_rate if hard_rate < limit else limit
            if b.reserved is not None and rate > res_rate:
                free += rate - res_rate
        if self._capacity is None:
            self._free_rate = _INF
            self._spare = 0.0
        else:
            self._free_rate = free
            if self._spare > free * self._slice:
                self._spare = free * self._slice
        # Capacity no bucket wanted stays with the supervisor: a worker that needs
        # more turns hungry and gets it with the next lease.
        self._unallocated_rate = 0.0
        burst = self._slice
        rest = self._next_slice - now
        for b, before, hard_before in zip(buckets, old, old_hard, strict=True):
            _credit_new_rate(b, before, burst, rest)
            hr = b.hard_rate
            if hr == _INF:
                b.hard = _INF
            elif b.hard == _INF:
                b.hard = hr * burst
            else:
                # A raised share counts from now; a lowered one clips the counter to
                # one slice of it at once, so the workers' counters never hold more
                # than one slice of the node's hard limit between them.
                if hr > hard_before:
                    b.hard += (hr - hard_before) * rest
                if b.hard > hr * burst:
                    b.hard = hr * burst


def _credit_new_rate(b: _Bucket, before: float, burst: float, rest: float) -> None:
    """The current slice was credited at rate ``before``: credit (or debit) the
    ``rest`` of it at the bucket's new rate; a new bucket starts with one slice.
    No clipping: a counter within one slice of the old rate stays within one
    slice of the new rate (rest <= slice)."""
    r = b.rate
    if r == _INF:
        b.credit = _INF
    elif b.credit == _INF:
        b.credit = r * burst
    elif r != before and before != _INF:
        b.credit += (r - before) * rest


# --------------------------------------------------------------------------- Trio adapter


class _Waiter:
    """One parked request: its wake-up event and whether its bucket vanished."""

    __slots__ = ("event", "removed")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.removed = False


def _spread(wait: float, slice_secs: float) -> float:
    """A retry hint spread over the next refill: every rejected client is told a
    different moment, so their retries do not all land on the same refill (and
    crowd out first attempts there). Never sooner than the predicted wait, and
    at most one slice later."""
    return wait + random.random() * slice_secs


#: A paced wait shorter than this admits now (a timer for less is all overhead).
PACE_MIN_SECS: Final = 20e-6


def _retry_after_ms(wait: float) -> int:
    """``retryAfterMs`` for a predicted wait: never shorter than the wait itself
    (a hint that is too short only brings a retry that fails again), at least 1.
    Callers never pass an unknown wait (``inf``): they resolve it first."""
    if wait == _INF:
        return NONBLOCKING_MAX_RETRY_MS
    return max(1, math.ceil((wait - WAKE_GUARD_SECS) * 1000.0))


def _ms(secs: float) -> int:
    return max(0, math.ceil(secs * 1000.0 - 1e-6))


class TenantThrottleGate:
    """Trio adapter for :class:`TenantThrottle`: waits FIFO per bucket.

    The throttle's clock must be ``trio.current_time``. No background task: the
    head of each bucket's queue sleeps until the throttle's predicted refill and
    re-checks; the others park on an event until they reach the head.

    A wait the throttle cannot predict (``inf``: a rate of 0 for now, which the
    next slice's recompute may change) is waited out a slice at a time, within
    the request's bound; it never becomes a long hint.
    """

    def __init__(self, throttle: TenantThrottle) -> None:
        self.throttle = throttle
        self._queues: dict[str, deque[_Waiter]] = {}

    def waiting(self, bucket: str) -> int:
        """How many requests are parked for ``bucket``."""
        queue = self._queues.get(bucket)
        return len(queue) if queue else 0

    def try_acquire(
        self,
        bucket: str,
        *,
        unthrottled: bool = False,
        nonblocking: bool = False,
        turn: bool = False,
        cost: int = 0,
    ) -> Admitted | None:
        """:data:`ADMITTED` if an operation on ``bucket`` may run now (allowance left
        and nobody parked ahead of it, or ``unthrottled``), else None. The fast path:
        no clock read while the bucket has allowance.

        ``cost``: a write's cost, known before it runs (:meth:`TenantThrottle.write_wait`);
        the caller then reserves it (:meth:`reserve`) before anything else runs.

        ``turn``: the caller comes right after one of its own requests was
        admitted on the waiting path, with nothing run in between (the rest of a
        received chunk): the others parked do not count as ahead of it, only the
        allowance does. The queue then takes turns a connection's chunk at a
        time, not a request at a time.

        When waiting could not help — a ``nonblocking`` request, a hard limit of
        0, or the bucket's own unthrottled use taking all its allowance — it
        raises the rejection :meth:`acquire` would raise, at once: a refused
        request then costs no coroutine, no second pass through the gates.
        """
        throttle = self.throttle
        if unthrottled:
            throttle.admission_wait(bucket, unthrottled=True)  # charged later, never delayed
            return ADMITTED
        if not throttle._enabled:  # the attribute, not the property: a call less per op
            return ADMITTED
        if not turn and self._queues.get(bucket):  # others parked ahead of it (FIFO)
            if not nonblocking:
                return None
            wait = throttle.estimate_wait(bucket)
        else:
            wait = throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
            if wait == 0.0:
                return ADMITTED
        refused = self._refused_at_once(bucket, wait, nonblocking)
        if refused is not None:
            raise refused
        return None

    def reserve(self, bucket: str, cost: int, *, unthrottled: bool = False) -> int:
        """:meth:`TenantThrottle.reserve`: right after a write costing ``cost`` was
        admitted, before anything else runs."""
        return self.throttle.reserve(bucket, cost, unthrottled=unthrottled)

    def _refused_at_once(
        self, bucket: str, wait: float, nonblocking: bool, *, count: bool = True
    ) -> ServerError | None:
        """The rejection of a request that must not wait: none on a bucket whose hard
        limit is 0 (HardLimitZero), none while the bucket's own unthrottled use
        takes all its allowance (Throttled), or a non-blocking one (Throttled);
        counted (unless ``count`` is off: a parked request is counted as it leaves)."""
        throttle = self.throttle
        if wait == _INF:
            if throttle.bucket_limits(bucket)[1] == 0:
                # Not "retry later": nothing will ever pass until an operator acts.
                if count:
                    throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
                return HardLimitZero(
                    f"bucket {bucket!r} has hard_limit 0: nothing runs on it until an admin "
                    "raises it (set-bucket-throttle)"
                )
            used, rate = throttle.unthrottled_hold(bucket)
            if used > 0.0:
                if count:
                    throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
                return self._held(bucket, used, rate)
            wait = throttle.until_next_slice()  # unknown: the next recompute may tell
        if nonblocking:
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            return Throttled(
                f"bucket {bucket!r} is over its unit allowance",
                retry_after_ms=_retry_after_ms(_spread(wait, throttle.slice_secs)),
            )
        return None

    def release(self, hold: Admitted, /) -> None:
        """Nothing to give back: the operation is charged after it ran
        (:meth:`TenantThrottle.charge`)."""

    def parameter_table(self) -> ParameterTable:
        def max_wait_ms(ms: int) -> None:
            self.throttle.max_wait_secs = ms / 1000

        def max_request_secs(secs: float) -> None:
            self.throttle.max_debt_secs = secs

        return {"max_wait_ms": max_wait_ms, "max_request_secs": max_request_secs}

    def statistics(self) -> ThrottleStatistics:
        """The throttle's statistics with each bucket's parked requests."""
        st = self.throttle.statistics()
        buckets = {
            name: replace(b, waiting=self.waiting(name)) if name in self._queues else b
            for name, b in st.buckets.items()
        }
        return ThrottleStatistics(st.node, buckets)

    async def acquire(
        self,
        bucket: str,
        *,
        unthrottled: bool = False,
        deadline: float | None = None,
        nonblocking: bool = False,
        cost: int = 0,
    ) -> Admitted:
        """Return when an operation on ``bucket`` may run.

        Does not checkpoint when it admits at once (allowance left, nobody queued
        ahead). Raises :class:`Throttled` when the wait would outlast ``deadline``
        (absolute trio time) or ``max_wait_secs``, or at once if ``nonblocking``;
        :class:`DeadlineExceeded` if it must wait and ``deadline`` already passed;
        :class:`BucketNotFound` if the bucket is (or gets) removed. ``cost``: a
        write's known cost (:meth:`try_acquire`); the caller reserves it.
        """
        throttle = self.throttle
        if unthrottled:
            throttle.admission_wait(bucket, unthrottled=True)  # never delayed, never queued
            return ADMITTED
        queue = self._queues.get(bucket)
        if queue:
            wait = throttle.estimate_wait(bucket)  # FIFO: queue behind the others
        else:
            wait = throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
            if wait == 0.0:
                return ADMITTED
        refused = self._refused_at_once(bucket, wait, nonblocking)
        if refused is not None:
            raise refused
        unknown = wait == _INF
        if unknown:
            wait = throttle.until_next_slice()
        start = trio.current_time()
        if deadline is not None and deadline <= start:
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            raise DeadlineExceeded("the request's deadline passed before it could be admitted")
        limit = start + throttle.max_wait_secs
        if deadline is not None and deadline < limit:
            limit = deadline
        if start + wait > limit:
            # Sleeping just to fail would hold the client for nothing.
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            raise self._throttled(
                bucket, wait, deadline is not None and deadline < limit + 1e-9, unknown=unknown
            )
        if queue is None:
            queue = self._queues[bucket] = deque()
        waiter = _Waiter()
        queue.append(waiter)
        rejected = False
        try:
            by_deadline = deadline is not None and deadline <= limit
            await self._wait_turn(bucket, queue, waiter, limit, start, by_deadline, cost)
        except Throttled:
            rejected = True
            raise
        finally:
            self._leave(bucket, queue, waiter)
            throttle.record_throttled(bucket, trio.current_time() - start, rejected=rejected)
        return ADMITTED

    async def _wait_turn(
        self,
        bucket: str,
        queue: deque[_Waiter],
        waiter: _Waiter,
        limit: float,
        start: float,
        by_deadline: bool,
        cost: int,
    ) -> None:
        throttle = self.throttle
        while True:
            if waiter.removed:
                raise BucketNotFound(f"bucket {bucket!r} was removed")
            waiter.event = trio.Event()
            head = queue[0] is waiter
            if head:
                wait = (
                    throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
                )
                now = trio.current_time()
                if wait == 0.0:
                    # Admitted; queued requests go at the bucket's rate, though.
                    wait = throttle.paced_wait(bucket)
                    if wait == 0.0 or now + wait > limit:
                        return
                else:
                    unknown = wait == _INF
                    if unknown:
                        refused = self._refused_at_once(bucket, wait, False, count=False)
                        if refused is not None:
                            raise refused
                        wait = throttle.until_next_slice()
                    if now + wait > limit:
                        raise self._throttled(
                            bucket, wait, by_deadline, unknown=unknown, waited=now - start
                        )
                wake_at = now + wait
            else:
                wake_at = limit
            with trio.move_on_at(wake_at) as scope:
                await waiter.event.wait()
            timed_out = scope.cancelled_caught and not head and not waiter.removed
            if timed_out and queue[0] is not waiter:
                # Out of time while others were still ahead.
                now = trio.current_time()
                wait = throttle.estimate_wait(bucket)
                unknown = wait == _INF
                if unknown:
                    wait = throttle.until_next_slice()
                raise self._throttled(
                    bucket,
                    wait,
                    by_deadline,
                    unknown=unknown,
                    waited=now - start,
                    behind=queue.index(waiter) if waiter in queue else 0,
                )

    def _held(self, bucket: str, used: float, rate: float) -> ServerError:
        """The rejection of a request on a bucket whose own unthrottled use spends
        all of its allowance: it fails at once — no wait can be predicted to end
        within a bound — with the hint of how soon the bucket's debt is repaid
        once that use stops (one refill window at most)."""
        throttle = self.throttle
        gross = throttle.gross_wait(bucket)
        if gross == _INF:
            gross = throttle.until_next_slice()
        return Throttled(
            f"bucket {bucket!r} is over its unit allowance: its unthrottled use "
            f"({used:.0f} units/s) takes all of its rate ({rate:.0f} units/s), so nothing "
            f"else runs on it while that goes on; once it stops, its debt is repaid in "
            f"{_ms(gross)} ms",
            retry_after_ms=_retry_after_ms(_spread(gross, throttle.slice_secs)),
        )

    def _throttled(
        self,
        bucket: str,
        wait: float,
        by_deadline: bool,
        *,
        unknown: bool = False,
        waited: float = 0.0,
        behind: int = 0,
    ) -> ServerError:
        """A :class:`Throttled` error whose ``retryAfterMs`` is the real wait, spread
        by at most a slice (never a blanket cap), and whose message states the real
        numbers: the wait, the bound it passed, and how long the request waited."""
        throttle = self.throttle
        bound = (
            "the request's deadline"
            if by_deadline
            else f"throttle_max_wait_ms ({_ms(throttle.max_wait_secs)} ms)"
        )
        hint = _retry_after_ms(_spread(wait, throttle.slice_secs))
        if unknown:
            why = (
                f"its allowance rate is 0 for now (the rates are recomputed every "
                f"{_ms(throttle.slice_secs)} ms)"
            )
        else:
            why = f"the wait ({_ms(wait)} ms)"
        if behind:
            what = (
                f"after {_ms(waited)} ms parked behind {behind} earlier requests, "
                f"its turn does not come within {bound}"
            )
        elif waited > 0.0:
            what = f"after {_ms(waited)} ms parked, {why} outlasts {bound}"
        elif unknown:
            what = f"{why}, and none comes within {bound}"
        else:
            what = f"{why} exceeds {bound}"
        return Throttled(
            f"bucket {bucket!r} is over its unit allowance: {what}", retry_after_ms=hint
        )

    def _leave(self, bucket: str, queue: deque[_Waiter], waiter: _Waiter) -> None:
        was_head = bool(queue) and queue[0] is waiter
        if waiter in queue:
            queue.remove(waiter)
        if not queue:
            if self._queues.get(bucket) is queue:
                del self._queues[bucket]
        elif was_head:
            queue[0].event.set()  # the next in line takes over

    def wake(self, bucket: str | None = None) -> None:
        """Make the head waiter(s) re-check now, e.g. after a property change."""
        names = list(self._queues) if bucket is None else [bucket]
        for name in names:
            queue = self._queues.get(name)
            if queue:
                queue[0].event.set()

    def bucket_removed(self, name: str) -> None:
        """The bucket is gone: forget it and fail its waiters with BucketNotFound."""
        if name in self.throttle:
            self.throttle.remove_bucket(name)
        queue = self._queues.pop(name, None)
        for waiter in queue or ():
            waiter.removed = True
            waiter.event.set()
