"""Tenant throttle: per-bucket unit quotas (node capacity, reservation, hard limit).

Why: the Couchbase KV throttling model, made fair between buckets. Every
operation is charged in units after it ran; each bucket's counter is refilled
every slice at its allowance rate (reservation + max-min fair share of the free
pool, capped at its hard limit), and an operation runs while its bucket's
counter is positive; what it cost beyond that is debt, repaid before the bucket
runs again. Pure logic with an injected clock: the waiting is in
:mod:`tenantkv.admission.throttle_gate`, the allocation arithmetic in
:mod:`tenantkv.admission.rate_allocation`, a slice's arithmetic on the counters in
:mod:`tenantkv.admission.throttle_counters`, the records in
:mod:`tenantkv.admission.throttle_stats` and :mod:`tenantkv.admission.throttle_props`.

The rules, the exact burst bounds and how the server calls it are in
docs/throttling.md ("Inside the throttle" for this module's theory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import Final, Literal

from tenantkv.admission.rate_allocation import (
    BucketLease,
    BucketUse,
    RateAllocation,
    allocate_rates,
)
from tenantkv.admission.throttle_counters import (
    DEMAND_EWMA_ALPHA,
    BucketCounters,
    credit_new_rate,
    refill,
    step_usage,
)
from tenantkv.admission.throttle_props import (
    DEFAULT_SLICE_SECS,
    BucketProps,
    Limit,
    NodeProps,
    ThrottleProps,
    check_limit,
    limit_le,
    limit_rate,
    limit_to_wire,
)
from tenantkv.admission.throttle_stats import (
    WAIT_HISTOGRAM_BOUNDS_US,
    BucketThrottleStatistics,
    NodeThrottleStatistics,
    ThrottleStatistics,
)
from tenantkv.admission.waiters import observe_wait
from tenantkv.errors import (
    BadValue,
    BucketExists,
    BucketNotFound,
)

DEFAULT_UNIT_SIZE: Final = 4096
DEFAULT_WRITE_WEIGHT: Final = 2
DEFAULT_MAX_WAIT_SECS: Final = 5.0
#: Most debt a bucket may carry, in seconds of its rate (``throttle_max_request_secs``);
#: also the most one request may cost, in seconds of the bucket's hard limit.
DEFAULT_MAX_DEBT_SECS: Final = 5.0
#: Most debt unthrottled use may leave on its bucket, in seconds of the bucket's
#: rate: one refill window's worth (the spirit of the origin's one-second slots).
#: Unthrottled work is never delayed, so without this bound a burst of it locked
#: the bucket's other users out for as long as it took to repay (57 s seen).
UNTHROTTLED_DEBT_SECS: Final = 1.0
#: A throttled bucket stays hungry this many slices past its predicted wake-up.
HUNGRY_HOLD_SLICES: Final = 3
#: Added to every predicted wait so a waiter wakes just *after* the refill
#: instant despite floating-point rounding.
WAKE_GUARD_SECS: Final = 1e-6
#: Bound of ``retryAfterMs`` for a non-blocking rejection.
NONBLOCKING_MAX_RETRY_MS: Final = 1000

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


# --------------------------------------------------------------------------- the core


class TenantThrottle:
    """Per-bucket unit quotas; pure logic with an injected clock (docs/throttling.md).

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
        self._capacity = check_limit("capacity", capacity)
        self._default_reserved = check_limit("default_throttle_reserved_units", default_reserved)
        self._default_hard = check_limit("default_throttle_hard_limit", default_hard_limit)
        if not limit_le(self._default_reserved, self._default_hard):
            raise BadValue("default reserved can't exceed hard limit")
        self._write_weight = write_weight
        self._slice = slice_secs
        self._hold = HUNGRY_HOLD_SLICES * slice_secs
        #: Longest a request may wait for its turn (server ``throttle_max_wait_ms``).
        self.max_wait_secs = max_wait_secs
        #: Debt bound and largest request, in seconds of a bucket's rate / hard limit.
        self.max_debt_secs = max_debt_secs
        self._buckets: dict[str, BucketCounters] = {}
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

    def props(self) -> ThrottleProps:
        """The node's and every bucket's properties, as a frozen record (what the
        multi-worker allocator computes from: :mod:`tenantkv.admission.quota_lease`)."""
        node = NodeProps(self._capacity, self._default_reserved, self._default_hard)
        buckets = {
            n: BucketProps(b.reserved, b.hard_limit, b.weight) for n, b in self._buckets.items()
        }
        return ThrottleProps(node, MappingProxyType(buckets), self._slice)

    def __contains__(self, name: object) -> bool:
        return name in self._buckets

    # ------------------------------------------------------------------ leases (workers)

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
                demand=b.demand(),
                unthrottled=b.unthrottled(),
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
        rate change; waiters are woken by the caller (the gate's ``wake``).
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
        res = self._default_reserved if reserved is UNSET else check_limit("reserved", reserved)
        hard = self._default_hard if hard_limit is UNSET else check_limit("hard_limit", hard_limit)
        if not limit_le(res, hard):
            raise BadValue(f"bucket {name!r}: reserved can't exceed hard limit")
        self._check_weight(weight)
        self._catch_up()
        self._buckets[name] = BucketCounters(name, res, hard, float(weight))
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
        cap = self._capacity if capacity is UNSET else check_limit("capacity", capacity)
        res = (
            self._default_reserved
            if default_reserved is UNSET
            else check_limit("default_throttle_reserved_units", default_reserved)
        )
        hard = (
            self._default_hard
            if default_hard_limit is UNSET
            else check_limit("default_throttle_hard_limit", default_hard_limit)
        )
        if not limit_le(res, hard):
            raise BadValue(
                "default_throttle_reserved_units: reserved can't exceed hard limit "
                f"(default_throttle_hard_limit {limit_to_wire(hard)})"
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
        res = b.reserved if reserved is UNSET else check_limit("reserved", reserved)
        hard = b.hard_limit if hard_limit is UNSET else check_limit("hard_limit", hard_limit)
        if not limit_le(res, hard):
            raise BadValue(
                f"bucket {name!r}: reserved can't exceed hard limit "
                f"(reserved {limit_to_wire(res)}, hard_limit {limit_to_wire(hard)})"
            )
        if weight is not UNSET:
            self._check_weight(weight)
        self._catch_up()
        b.reserved = res
        if hard != b.hard_limit:
            b.hard_limit = hard
            b.hard_rate = limit_rate(hard)
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
        self._catch_up()
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
        hard_rate = b.hard_rate if self._lease is None else limit_rate(b.hard_limit)
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

    def _spend(self, b: BucketCounters, cost: float, bound_secs: float | None) -> None:
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

    def _give_back(self, b: BucketCounters, units: float) -> None:
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
        now = self._catch_up()
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
        now = self._catch_up()
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

    def _get(self, name: str) -> BucketCounters:
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

    def _throttled(self, b: BucketCounters, now: float) -> float:
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

    def _predict(self, b: BucketCounters, now: float, *, gross: bool = False) -> float:
        """Seconds until the slice refills bring ``b``'s counters above zero, at
        their rates less what the bucket's own unthrottled use goes on spending
        (``gross``: without that use, as once it stops). ``inf``: not at these
        rates (a rate of 0, or unthrottled use that takes all of it)."""
        p = 0.0 if gross else b.unthrottled()
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
                least = self._time_to_positive(-b.hard, limit_rate(b.hard_limit) - p, now)
            wait = least if least > self._slice else self._slice
        return wait + WAKE_GUARD_SECS

    def unthrottled_hold(self, bucket: str) -> tuple[float, float]:
        """Why :meth:`admission_wait` said ``inf`` for a bucket whose limit is not 0:
        ``(unthrottled rate, allowance rate)`` when the bucket's own unthrottled use
        (never held back) spends all the allowance rate of a counter that is spent —
        no other request on it can run while that use goes on — else ``(0.0, 0.0)``
        (the rate is 0 for now: the rates are recomputed every slice)."""
        b = self._get(bucket)
        p = b.unthrottled()
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
        self._sample(n, now, ended)
        self._roll_window(now)
        self._recompute(now)

    def _refill(self, n: int, since: float) -> None:
        """Credit every bucket ``n`` slices of its rate (:func:`refill`)."""
        self._spare = refill(
            self._buckets.values(),
            n,
            since,
            self._slice,
            limited=self._capacity is not None,
            unallocated_rate=self._unallocated_rate,
            free_rate=self._free_rate,
            spare=self._spare,
        )

    def _sample(self, n: int, now: float, ended: float) -> None:
        """Step every bucket's usage averages over the ``n`` slices that passed; the
        usage sampled ran in the slice that ``ended``."""
        # Usage is sampled over the real time between calls, which jitters.
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
            idle = (1.0 - DEMAND_EWMA_ALPHA) ** (n - 1)
        self._last_sample = now
        # Use past the node's capacity claims nothing more of it, so the averages
        # count it at most at the capacity: once an (unthrottled) burst far past it
        # stops, the capacity comes back to the others within a few slices, not
        # after the average has halved its way down from many times the capacity.
        most = _INF if self._capacity is None else float(self._capacity)
        step_usage(self._buckets.values(), n, span, idle, most)

    def _roll_window(self, now: float) -> None:
        """Start a new whole-second usage window when ``now`` is in a later one."""
        window = math.floor(now)
        if window != self._window:
            adjacent = window == self._window + 1
            for b in self._buckets.values():
                b.used_prev_window = b.used_window if adjacent else 0
                b.used_window = 0
            self._free_used_window = 0
            self._window = window

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
            self._capacity, [b.need(now, b.hard_rate) for b in buckets], self._slice
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
            credit_new_rate(b, before, burst, rest)
            if b.hard_rate == _INF:
                b.hard = _INF
            elif b.hard == _INF:
                b.hard = b.hard_rate * burst

    def _recompute_leased(self, buckets: list[BucketCounters], now: float) -> None:
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
                [b.need(now, limit_rate(b.hard_limit)) for b in buckets],
                self._slice,
            )
        free = 0.0
        for i, b in enumerate(buckets):
            limit = limit_rate(b.hard_limit)
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
            credit_new_rate(b, before, burst, rest)
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


#: A paced wait shorter than this admits now (a timer for less is all overhead).
PACE_MIN_SECS: Final = 20e-6
