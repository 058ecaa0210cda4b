"""Allocation arithmetic of the tenant throttle: how a node's unit capacity is
split into each bucket's allowance rate (reservation + max-min fair share of the
free pool, capped at the hard limit), and the records it reads and writes.

Pure functions of plain records, with no clock and no state, so the one
process's throttle (:mod:`tenantkv.admission.tenant_throttle`), the supervisor's
allocator (:mod:`tenantkv.admission.quota_lease`) and the front-door rate shares
(:mod:`tenantkv.admission.rate_share`) compute with the same code and cannot
diverge. The rules are in docs/throttling.md ("Inside the throttle").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from tenantkv.admission.throttle_props import Limit, ThrottleProps, limit_rate

#: Share of its reservation a bucket keeps while it has no open connection.
SLOW_START_FRACTION: Final = 0.1
#: A non-hungry bucket's demand is this times its recent usage (room to grow
#: without being throttled first; what it leaves unused is redistributed).
DEMAND_HEADROOM: Final = 1.25

_INF: Final = math.inf


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

    #: configured reservation (``None``: exempt from node capacity); a cluster node's
    #: share of the cluster's reservation may be fractional
    reserved: float | None
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
    its hard limit (docs/throttling.md, "How the free pool is shared"). Pure: the
    throttle's ``_recompute`` calls it with the process's own view, the multi-worker allocator
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


def rate_needs(props: ThrottleProps, use: Mapping[str, BucketUse]) -> dict[str, RateNeed]:
    """Every bucket's properties joined with ``use`` (a bucket missing from it
    counts as unused): the input of :func:`allocate_rates` for the node."""
    idle = BucketUse(0, False, 0.0, 0.0)
    needs: dict[str, RateNeed] = {}
    for name, b in props.buckets.items():
        u = use.get(name, idle)
        needs[name] = RateNeed(
            reserved=b.reserved,
            hard_rate=limit_rate(b.hard_limit),
            weight=b.weight,
            connected=u.connections > 0,
            hungry=u.hungry,
            demand=u.demand,
            unthrottled=u.unthrottled,
        )
    return needs
