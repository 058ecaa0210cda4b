"""A tenant-throttle bucket's counters, and what each refill slice does to them:
the refill (each counter capped at one slice, unused share handed on to the
hungry buckets, the rest kept as node spare), the usage averages, and the credit
of a rate that changes inside a slice.

Why apart from the core (:mod:`tenantkv.admission.tenant_throttle`): this is the
arithmetic of one slice over plain state, readable and testable without the
request path around it. The rules and their bounds are in docs/throttling.md
("Inside the throttle": time, burst, timekeeping).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from tenantkv.admission.rate_allocation import RateNeed, water_fill
from tenantkv.admission.throttle_props import Limit, limit_rate
from tenantkv.admission.throttle_stats import WAIT_HISTOGRAM_BOUNDS_US

#: Weight of the newest slice in the usage average.
DEMAND_EWMA_ALPHA: Final = 0.5

_INF: Final = math.inf


class BucketCounters:
    """One bucket's mutable state: its counters, rates and usage (slots: the fast
    path reads it for every op)."""

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
        self.hard_rate = limit_rate(hard_limit)
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

    def demand(self) -> float:
        """Recent usage in units/s: the larger of the moving average and the last slice."""
        e, last = self.demand_ewma, self.demand_last
        return e if e > last else last

    def unthrottled(self) -> float:
        """Recent usage with the ``Unthrottled`` privilege in units/s, measured alike."""
        e, last = self.prio_ewma, self.prio_last
        return e if e > last else last

    def need(self, now: float, hard_rate: float) -> RateNeed:
        """What :func:`allocate_rates` knows of this bucket, with ``hard_rate`` as its
        hard limit (its own, or in lease mode the configured one)."""
        return RateNeed(
            self.reserved,
            hard_rate,
            self.weight,
            self.connections > 0,
            self.hungry_until > now,
            self.demand(),
            self.unthrottled(),
        )


def refill(
    buckets: Iterable[BucketCounters],
    n: int,
    since: float,
    slice_secs: float,
    *,
    limited: bool,
    unallocated_rate: float,
    free_rate: float,
    spare: float,
) -> float:
    """Credit every bucket ``n`` slices of its rate, each counter capped at one slice;
    return the node spare after it (``spare`` before).

    Share a bucket did not use (never its reservation) goes to the buckets
    that were hungry since ``since``, water-filled; what nobody takes becomes
    node spare. With ``limited`` off (no node capacity) nothing is shared.
    """
    if n <= 0:
        return spare
    burst = slice_secs
    dt = n * burst
    pool = unallocated_rate * dt if limited else 0.0
    hungry: list[BucketCounters] = []
    for b in buckets:
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
        return spare
    pool += spare
    if hungry and pool > 0.0:
        pool = _hand_on(hungry, pool, dt, since, burst, free_rate)
    return max(0.0, min(pool, free_rate * burst))


def _hand_on(
    hungry: list[BucketCounters], pool: float, dt: float, since: float, burst: float, free: float
) -> float:
    """Water-fill ``pool`` (units) between the ``hungry`` buckets, each within what
    its counter may hold; return what is left of it."""
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
    return pool


def step_usage(
    buckets: Iterable[BucketCounters], n: int, span: float, idle: float, most: float
) -> None:
    """Step every bucket's usage averages by what it used over ``span`` seconds
    (each rate counted at most ``most``), then, when ``n > 1`` slices passed,
    decay them by ``idle`` for the slices since, which were idle."""
    alpha = DEMAND_EWMA_ALPHA
    for b in buckets:
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
        b.demand_last, b.demand_ewma, b.prio_last, b.prio_ewma = s, e, p, q
        b.used_sample = b.prio_sample = 0


def credit_new_rate(b: BucketCounters, before: float, burst: float, rest: float) -> None:
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
