"""Rate leases: one node's tenant limits kept by several worker processes (sans-IO).

``serve --workers N`` (issue 19) runs N workers, each with its own
:class:`~tenantkv.admission.tenant_throttle.TenantThrottle` admitting the
requests of the connections the kernel gave it. A bucket's reservation and hard
limit and the node capacity are promises about the node, so the supervisor
decides how much of each bucket every worker may spend. In the spirit of
CockroachDB's distributed token bucket, but leasing **rates** rather than
tokens, because the throttle is rate-based (every bucket's counter is refilled
each slice at its allowance rate). Nothing here does I/O or reads a clock: the
caller passes ``now`` and carries the messages however it likes.

Reports (worker -> supervisor, :func:`usage_to_wire`)
    Every slice (100 ms), and at once when a bucket gets its first connection on
    the worker or newly turns hungry there (``TenantThrottle.on_demand_event``),
    a worker sends :meth:`TenantThrottle.usage`: per bucket its connections,
    whether it is hungry (throttled recently or has waiters), its demand rate and
    its unthrottled rate, the measures a single process allocates by.

Allocation (the supervisor, :class:`QuotaAllocator`)
    The reports of the live workers are summed per bucket (connections, demand,
    unthrottled; hungry if any worker is) and each bucket's **node rate** comes
    from :func:`~tenantkv.admission.rate_allocation.allocate_rates`, the very
    function a single process uses: reservation + water-filled share of the free
    pool, capped at the hard limit, slow start for a bucket nobody is connected
    to. So the node behaves as one throttle would. One step is added: a single
    process hands what a bucket left unused of its share (never its reservation)
    to the hungry buckets at each refill; across workers that share sits on
    another worker's counter, so the supervisor **lends** it ahead: the headroom
    a bucket that is not hungry has above its demand, water-filled between the
    hungry buckets within their hard limits.

Split (one bucket's node rate between the workers)
    Each worker first gets its unthrottled rate (it cannot be held back), then
    the rest is water-filled: a worker hungry on the bucket may take any amount,
    any other at most ``DEMAND_HEADROOM x`` its demand + one unit per slice, in
    proportion to its connections to the bucket. What is left after those caps
    goes to the workers in proportion to their connections (a reservation is
    there the moment a connection wants it, wherever it landed). The shares add
    up to the node rate exactly, so the sum can exceed neither the capacity nor
    a hard limit. The reserved and hard rates are split in the same proportions.
    A worker with no connection, demand or hunger on a bucket gets nothing, and
    its lease does not mention the bucket.

Leases (supervisor -> worker, :func:`lease_to_wire`)
    Per bucket a :class:`BucketLease` (rate, reserved rate, hard rate), applied
    with :meth:`TenantThrottle.apply_lease`: the worker's throttle takes those
    rates instead of computing them and otherwise runs as before (pro-rata
    credit for the rest of the slice, refill, spill of its own unused share to
    its own hungry buckets, debt), so the per-request path does not change. The
    answer to a report is the reporter's lease; the leases of the other workers
    that moved by more than ``PUSH_TOLERANCE`` (:meth:`QuotaAllocator.pending`)
    are pushed with it, so a change one worker's report causes holds everywhere
    within one message delay.

Why the limits hold, and the bounds where they lag
    * Every allocation's shares of a bucket sum to its node rate, and the node
      rates sum to at most the capacity (plus what is lent, below), so leases
      computed together never promise more than one throttle would. A worker's
      counters stay within one slice of its shares; a lowered hard share clips
      its counter at once.
    * One round trip of lag: a worker that turns hungry keeps its old share
      until the answer to its event report arrives; the shares the others give
      up reach them by push in the same round trip.
    * Lending is prospective: if a bucket that was lent from grows into its
      headroom, the node may run over capacity by that growth until the next
      allocation (at most a slice plus the round trip) sees its new demand.
    * Provisional share: a bucket a worker's lease does not mention (new, or
      first connected there) runs at ``1/N`` of what the worker alone would
      allocate it (``apply_lease(workers=N)``), until the answer to its event
      report arrives. Each such share is at most ``1/N`` of the hard limit and
      a worker's provisional shares together at most ``1/N`` of the capacity, so
      all N workers together add at most one node rate (one hard limit) for one
      round trip plus one slice of counter.
    * A dead worker: the supervisor is told (:meth:`QuotaAllocator.forget`) or
      it stops reporting and is dropped after ``LEASE_SLICES`` slices of the
      others' reports (not of the supervisor's time: reports queued while the
      supervisor was held up are not silence, :meth:`QuotaAllocator.report`); its share
      goes to the others with the next allocation. What it had not spent dies
      with it; what it spent in its last slice may be spent again by the others
      in that slice (at most one slice of its share).
    * The allocation costs O(buckets x workers); it runs on events and at most
      once a slice otherwise (a report in between gets the last lease).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tenantkv.admission.rate_allocation import (
    DEMAND_HEADROOM,
    BucketLease,
    BucketUse,
    RateAllocation,
    RateNeed,
    allocate_rates,
    rate_needs,
    water_fill,
)
from tenantkv.admission.throttle_props import BucketProps, ThrottleProps, limit_rate, rate_to_wire

__all__ = [
    "LEASE_SLICES",
    "WIRE_VERSION",
    "BucketLease",
    "BucketUse",
    "LimitAllocator",
    "QuotaAllocator",
    "lease_from_wire",
    "lease_to_wire",
    "split_limits",
    "usage_from_wire",
    "usage_to_wire",
]

#: A worker that has not reported for this many slices is forgotten.
LEASE_SLICES: Final = 3
#: A worker's lease is pushed (:meth:`QuotaAllocator.pending`) once one of its
#: shares moved by more than this fraction of the larger of old and new share.
PUSH_TOLERANCE: Final = 0.02
#: Version of the report and lease messages (``"v"``).
WIRE_VERSION: Final = 1
#: Split weight of a worker with demand but no connection left (its last
#: requests draining): enough to be in the split, too little to matter.
_DRAINING_WEIGHT: Final = 0.01

_INF: Final = math.inf


@dataclass(slots=True)
class _Report:
    use: dict[str, BucketUse]
    at: float


class QuotaAllocator:
    """The supervisor's side: turns the workers' reports into their leases.

    ``props``: the node's and the buckets' properties (the committed ones); the
    caller gives the new ones to :meth:`set_props` when they change. ``lend``
    False: no lending ahead (:func:`_lend`), for a single worker, whose own refill
    already hands what a bucket leaves unused to its hungry buckets (lending too
    would hand it twice).
    """

    def __init__(self, props: ThrottleProps, *, lend: bool = True) -> None:
        self.props = props
        self._lend = lend
        self._reports: dict[str, _Report] = {}
        #: The clock a worker's silence is measured on: it follows the callers'
        #: ``now`` but moves at most one slice per report, so reports that waited
        #: in a queue while this process was held up do not find the others
        #: silent (:meth:`report`).
        self._silence_clock = 0.0
        self._last_now: float | None = None
        #: The latest lease of every live worker, and the last one it was sent.
        self._leases: dict[str, dict[str, BucketLease]] = {}
        self._sent: dict[str, dict[str, BucketLease]] = {}
        self._computed_at = -_INF
        #: An allocation ran since :meth:`pending` last looked.
        self._fresh = False
        #: Recompute at the next report whatever the time (a worker left, ...).
        self._dirty = True
        #: Per bucket: (node rate, reserved rate, hard rate) of the latest allocation.
        self._node: dict[str, tuple[float, float, float]] = {}
        #: The node's free pool left after reservations, as of the latest allocation.
        self._free_rate = _INF
        #: Per bucket, this node's share of a cluster's limits (:meth:`set_limits`).
        self._limits: dict[str, BucketLease] = {}

    @property
    def workers(self) -> list[str]:
        """The live workers (those whose reports count), in the order they came."""
        return list(self._reports)

    def report(
        self, worker: str, usage: Mapping[str, BucketUse], now: float
    ) -> dict[str, BucketLease]:
        """Take ``worker``'s report made at ``now`` and return its new lease.

        Every worker's lease is recomputed from the latest report of every live
        worker (:meth:`pending` has the others' that moved, to push them). The
        allocation costs O(buckets x workers), so it runs at once only on an
        event (a bucket's first connection on the worker, a bucket newly hungry
        there, a worker come or gone, :meth:`invalidate`) and otherwise at most
        once a slice; in between a report gets the lease computed last.
        """
        use = dict(usage)
        previous = self._reports.get(worker)
        slice_secs = self.props.slice_secs
        # Silence is counted in the reports this allocator handles, not in its
        # caller's time alone: after a hold-up of this process, the first report
        # handled would otherwise find every other worker silent and take their
        # shares while they still spend their leases (their own reports are
        # next in the queue). A worker that is really silent is still dropped
        # after LEASE_SLICES slices of the others' reports.
        if self._last_now is not None:
            self._silence_clock += min(max(now - self._last_now, 0.0), slice_secs)
        self._last_now = now
        self._reports[worker] = _Report(use, self._silence_clock)
        horizon = self._silence_clock - LEASE_SLICES * slice_secs
        for name in [w for w, r in self._reports.items() if r.at < horizon]:
            self.forget(name)
        if (
            self._dirty
            or previous is None
            or now - self._computed_at >= slice_secs
            or _event(previous.use, use)
        ):
            self._allocate()
            self._computed_at = now
            self._dirty = False
        lease = self._sent[worker] = self._leases.get(worker, {})
        return dict(lease)

    def invalidate(self) -> None:
        """Recompute at the next report, whatever the time."""
        self._dirty = True

    def set_props(self, props: ThrottleProps) -> None:
        """Allocate by ``props`` from the next report on (a property changed)."""
        self.props = props
        self._dirty = True

    def set_limits(self, limits: Mapping[str, BucketLease]) -> None:
        """Allocate each bucket named in ``limits`` with its ``reserved_rate`` and
        ``hard_rate`` in place of its configured reservation and hard limit (never
        above them): a cluster node's share of the cluster's limits, leased by the
        bucket's quota leader (tenantkv.cluster.quota_node). The node's allocation
        among its buckets and the split below it run unchanged on those limits."""
        new = dict(limits)
        if new != self._limits:
            self._limits = new
            self._dirty = True

    def pending(self) -> dict[str, dict[str, BucketLease]]:
        """The other live workers' leases that moved since each was last sent (a
        share by more than ``PUSH_TOLERANCE``, or a bucket came or went): the caller
        pushes them after a report, so a change that one worker's report caused
        (its hunger taking share from the others) holds everywhere within one
        message delay, not at the others' next reports. Counted as sent."""
        out: dict[str, dict[str, BucketLease]] = {}
        if not self._fresh:  # nothing moved since the last call
            return out
        self._fresh = False
        for worker, lease in self._leases.items():
            if _moved(self._sent.get(worker), lease):
                out[worker] = dict(lease)
                self._sent[worker] = lease
        return out

    def lease(self, worker: str) -> dict[str, BucketLease]:
        """``worker``'s latest lease (empty for an unknown worker)."""
        return dict(self._leases.get(worker, {}))

    def forget(self, worker: str) -> None:
        """``worker`` is gone: its share goes to the others with their next leases."""
        if self._reports.pop(worker, None) is not None:
            self._dirty = True
        self._leases.pop(worker, None)
        self._sent.pop(worker, None)

    def _allocate(self) -> None:
        props = self.props
        slice_secs = props.slice_secs
        # Sum the reports per bucket: the node as one process would see it.
        per_bucket: dict[str, list[tuple[str, BucketUse]]] = {}
        for worker, rep in self._reports.items():
            for name, use in rep.use.items():
                per_bucket.setdefault(name, []).append((worker, use))
        node_use = {
            name: BucketUse(
                connections=sum(u.connections for _, u in uses),
                hungry=any(u.hungry for _, u in uses),
                demand=sum(u.demand for _, u in uses),
                unthrottled=sum(u.unthrottled for _, u in uses),
            )
            for name, uses in per_bucket.items()
        }
        needs = _limited(rate_needs(props, node_use), self._limits)
        names = list(needs)
        alloc = allocate_rates(props.node.capacity, [needs[n] for n in names], slice_secs)
        rates = _lend(alloc, [needs[n] for n in names]) if self._lend else list(alloc.rates)
        self._free_rate = alloc.free_rate
        leases: dict[str, dict[str, BucketLease]] = {w: {} for w in self._reports}
        self._node = {}
        for i, name in enumerate(names):
            rate, res, hard = rates[i], alloc.reserved_rates[i], needs[name].hard_rate
            self._node[name] = (rate, res, hard)
            for worker, share in _split(rate, res, hard, per_bucket.get(name, []), slice_secs):
                leases[worker][name] = share
        self._leases = leases
        self._fresh = True

    def statistics(self) -> dict[str, Any]:
        """A JSON-ready dict for the status document: per bucket the node rates and
        each worker's share (``"unlimited"`` for infinity)."""
        buckets: dict[str, Any] = {}
        for name, (rate, res, hard) in self._node.items():
            shares = {
                w: rate_to_wire(lease[name].rate)
                for w, lease in self._leases.items()
                if name in lease
            }
            buckets[name] = {
                "node_rate": rate_to_wire(rate),
                "reserved_rate": rate_to_wire(res),
                "hard_rate": rate_to_wire(hard),
                "shares": shares,
            }
        return {
            "workers": self.workers,
            "buckets": buckets,
            "free_rate": rate_to_wire(self._free_rate),
        }


class LimitAllocator(QuotaAllocator):
    """A bucket's quota leader in a cluster: the same reports, leases, pushes and
    forgetting as :class:`QuotaAllocator`, with the cluster's nodes as its
    "workers", but what it splits is each bucket's **limits** (reservation and
    hard limit, :func:`split_limits`), not a node's capacity: capacity stays per
    node, so buckets do not compete across nodes and each node allocates its own
    capacity among its buckets within the limits it is leased. ``props``: the
    buckets this leader leads (the node part is not read)."""

    def _allocate(self) -> None:
        slice_secs = self.props.slice_secs
        per_bucket: dict[str, list[tuple[str, BucketUse]]] = {}
        for node, rep in self._reports.items():
            for name, use in rep.use.items():
                if name in self.props.buckets:
                    per_bucket.setdefault(name, []).append((node, use))
        leases: dict[str, dict[str, BucketLease]] = {n: {} for n in self._reports}
        self._node = {}
        for name, props in self.props.buckets.items():
            hard = limit_rate(props.hard_limit)
            res = _INF if props.reserved is None else float(props.reserved)
            self._node[name] = (hard, res, hard)
            for node, share in split_limits(props, per_bucket.get(name, []), slice_secs):
                leases[node][name] = share
        self._leases = leases
        self._free_rate = _INF
        self._fresh = True


def split_limits(
    props: BucketProps, uses: list[tuple[str, BucketUse]], slice_secs: float
) -> list[tuple[str, BucketLease]]:
    """One bucket's limits split between the nodes that use it: the hard limit as
    :func:`_split` splits a bucket's rate between workers (hungry nodes may take
    any amount, the others their demand with headroom, the rest by connections),
    the reservation in the same proportions; the headroom the quiet nodes leave
    unused is lent to the hungry ones (:func:`_lend_headroom`). Without a hard limit the reservation
    alone is split so, and every share's hard rate is unlimited. The shares' rates
    are their hard rates. A reservation of ``None`` (exempt from capacity) is
    ``inf`` in every share: the node keeps its own ``None``."""
    hard = limit_rate(props.hard_limit)
    res = _INF if props.reserved is None else float(props.reserved)
    if not math.isinf(hard):
        return _lend_headroom(_split(hard, res, hard, uses, slice_secs), dict(uses))
    base = 0.0 if props.reserved is None else float(props.reserved)
    return [
        (node, BucketLease(_INF, share.reserved_rate, _INF))
        for node, share in _split(base, res, base, uses, slice_secs)
    ]


def _lend_headroom(
    shares: list[tuple[str, BucketLease]], uses: dict[str, BucketUse]
) -> list[tuple[str, BucketLease]]:
    """The hungry nodes' shares plus the headroom the others leave above their
    demand (their room to grow, ``DEMAND_HEADROOM``), by connections: without it
    a hard limit driven 80/10/10 was held ~7 % under, the quiet nodes' headroom
    unused. Lent ahead, as :func:`_lend` lends capacity: should a quiet node grow
    into its headroom, the bucket runs over its limit by that growth until its
    next report (a slice and a round trip)."""
    hungry = [i for i, (node, _) in enumerate(shares) if uses[node].hungry]
    if not hungry:
        return shares
    lendable = 0.0
    for node, share in shares:
        u = uses[node]
        if not u.hungry:
            lendable += max(0.0, share.hard_rate - max(u.demand, u.unthrottled))
    if lendable <= 0.0:
        return shares
    weights = [float(max(uses[shares[i][0]].connections, 1)) for i in hungry]
    wsum = sum(weights)
    out = list(shares)
    for i, w in zip(hungry, weights, strict=True):
        node, share = out[i]
        gift = lendable * w / wsum
        out[i] = (node, BucketLease(share.rate + gift, share.reserved_rate, share.hard_rate + gift))
    return out


def _limited(needs: dict[str, RateNeed], limits: Mapping[str, BucketLease]) -> dict[str, RateNeed]:
    """``needs`` with each bucket named in ``limits`` held to its share of them."""
    for name, share in limits.items():
        need = needs.get(name)
        if need is None:
            continue
        reserved = need.reserved
        if reserved is not None and share.reserved_rate < reserved:
            reserved = share.reserved_rate
        hard = share.hard_rate if share.hard_rate < need.hard_rate else need.hard_rate
        needs[name] = need._replace(reserved=reserved, hard_rate=hard)
    return needs


def _lend(alloc: RateAllocation, needs: list[RateNeed]) -> list[float]:
    """The node rates plus what the hungry buckets are lent of the others' headroom.

    A single process hands the share a bucket left unused (never its reservation)
    to the hungry buckets at each refill. Across workers that unused share sits
    on another worker's counter, so the supervisor lends it ahead instead: the
    headroom a bucket that is not hungry has above its demand, water-filled
    between the hungry buckets within their hard limits and the free pool.
    """
    rates = list(alloc.rates)
    if math.isinf(alloc.free_rate):
        return rates
    lendable = 0.0
    hungry: list[int] = []
    for i, b in enumerate(needs):
        if b.reserved is None or math.isinf(rates[i]):
            continue
        if b.hungry:
            hungry.append(i)
        else:
            used = max(alloc.reserved_rates[i], b.demand, b.unthrottled)
            lendable += max(0.0, rates[i] - used)
    if lendable > 0.0 and hungry:
        rooms = [max(0.0, min(needs[i].hard_rate - rates[i], alloc.free_rate)) for i in hungry]
        gifts = water_fill(lendable, rooms, [needs[i].weight for i in hungry])
        for i, gift in zip(hungry, gifts, strict=True):
            rates[i] += gift
    return rates


def _split(
    rate: float,
    res: float,
    hard: float,
    uses: list[tuple[str, BucketUse]],
    slice_secs: float,
) -> list[tuple[str, BucketLease]]:
    """One bucket's node rates split between the workers (the module docstring)."""
    active = [
        (w, u)
        for w, u in uses
        if u.connections > 0 or u.hungry or u.demand > 0.0 or u.unthrottled > 0.0
    ]
    if not active:
        return []
    if rate == _INF:
        return [(w, BucketLease(_INF, _INF, hard)) for w, _ in active]
    weights = [float(u.connections) if u.connections > 0 else _DRAINING_WEIGHT for _, u in active]
    wsum = sum(weights)
    # Unthrottled work cannot be held back: its rate first (scaled if it exceeds the rate).
    floors = [u.unthrottled for _, u in active]
    fsum = sum(floors)
    if fsum > rate:
        floors = [f * rate / fsum for f in floors]
        fsum = rate
    min_demand = 1.0 / slice_secs
    caps = [
        _INF if u.hungry else max(0.0, DEMAND_HEADROOM * u.demand + min_demand - f)
        for (_, u), f in zip(active, floors, strict=True)
    ]
    rest = max(0.0, rate - fsum)
    extras = water_fill(rest, caps, weights)
    # What the caps left goes by connections, so the shares sum to the node rate.
    left = rest - sum(extras)
    shares = [f + e + left * wt / wsum for f, e, wt in zip(floors, extras, weights, strict=True)]
    out: list[tuple[str, BucketLease]] = []
    for (w, _), share, wt in zip(active, shares, weights, strict=True):
        part = share / rate if rate > 0.0 else wt / wsum
        out.append((w, BucketLease(share, _part(res, part), _part(hard, part))))
    return out


def _event(before: dict[str, BucketUse], now: dict[str, BucketUse]) -> bool:
    """A bucket got its first connection or turned hungry between two reports."""
    for name, u in now.items():
        if u.connections > 0 or u.hungry:
            b = before.get(name)
            if (
                b is None
                or (u.connections > 0 and b.connections == 0)
                or (u.hungry and not b.hungry)
            ):
                return True
    return False


def _moved(sent: dict[str, BucketLease] | None, lease: dict[str, BucketLease]) -> bool:
    if sent is None or sent.keys() != lease.keys():
        return True
    for name, new in lease.items():
        old = sent[name]
        for a, b in ((old.rate, new.rate), (old.hard_rate, new.hard_rate)):
            if a != b and (
                math.isinf(a) or math.isinf(b) or abs(a - b) > PUSH_TOLERANCE * max(a, b)
            ):
                return True
    return False


def _part(total: float, part: float) -> float:
    """``total x part`` where a zero part of an infinite total is zero."""
    return total * part if part > 0.0 else 0.0


# --------------------------------------------------------------------------- wire


def usage_to_wire(usage: Mapping[str, BucketUse]) -> dict[str, Any]:
    """A report as a plain msgpack-able dict::

    {"v": 1, "buckets": {name: [connections, hungry, demand, unthrottled]}}
    """
    return {
        "v": WIRE_VERSION,
        "buckets": {
            name: [u.connections, u.hungry, float(u.demand), float(u.unthrottled)]
            for name, u in usage.items()
        },
    }


def usage_from_wire(d: object) -> dict[str, BucketUse]:
    """The report :func:`usage_to_wire` made; :class:`ValueError` if malformed."""
    out: dict[str, BucketUse] = {}
    for name, item in _buckets(d, "report", 4):
        connections, hungry, demand, unthrottled = item
        if isinstance(connections, bool) or not isinstance(connections, int) or connections < 0:
            raise ValueError(
                f"report: bucket {name!r}: connections must be an int >= 0, got {connections!r}"
            )
        if not isinstance(hungry, bool):
            raise ValueError(f"report: bucket {name!r}: hungry must be a bool, got {hungry!r}")
        out[name] = BucketUse(
            connections,
            hungry,
            _rate_in(demand, f"report: bucket {name!r}: demand", finite=True),
            _rate_in(unthrottled, f"report: bucket {name!r}: unthrottled", finite=True),
        )
    return out


def lease_to_wire(lease: Mapping[str, BucketLease]) -> dict[str, Any]:
    """A lease as a plain msgpack-able dict (rates may be ``inf``)::

    {"v": 1, "buckets": {name: [rate, reserved_rate, hard_rate]}}
    """
    return {
        "v": WIRE_VERSION,
        "buckets": {
            name: [float(x.rate), float(x.reserved_rate), float(x.hard_rate)]
            for name, x in lease.items()
        },
    }


def lease_from_wire(d: object) -> dict[str, BucketLease]:
    """The lease :func:`lease_to_wire` made; :class:`ValueError` if malformed."""
    out: dict[str, BucketLease] = {}
    for name, item in _buckets(d, "lease", 3):
        where = f"lease: bucket {name!r}"
        out[name] = BucketLease(
            _rate_in(item[0], f"{where}: rate", finite=False),
            _rate_in(item[1], f"{where}: reserved_rate", finite=False),
            _rate_in(item[2], f"{where}: hard_rate", finite=False),
        )
    return out


def _buckets(d: object, what: str, fields: int) -> list[tuple[str, list[Any] | tuple[Any, ...]]]:
    """Check the envelope; return ``(name, fields)`` per bucket."""
    if not isinstance(d, dict):
        raise ValueError(f"{what}: expected a map, got {type(d).__name__}")
    if d.get("v") != WIRE_VERSION:
        raise ValueError(f"{what}: unsupported version {d.get('v')!r} (expected {WIRE_VERSION})")
    buckets = d.get("buckets")
    if not isinstance(buckets, dict):
        raise ValueError(f"{what}: 'buckets' must be a map, got {type(buckets).__name__}")
    out: list[tuple[str, list[Any] | tuple[Any, ...]]] = []
    for name, item in buckets.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{what}: a bucket name must be a non-empty string, got {name!r}")
        if not isinstance(item, list | tuple) or len(item) != fields:
            raise ValueError(f"{what}: bucket {name!r}: expected {fields} fields, got {item!r}")
        out.append((name, item))
    return out


def _rate_in(value: object, where: str, *, finite: bool) -> float:
    """A rate from the wire: a number >= 0, not NaN (and finite where asked)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number, got {value!r}")
    x = float(value)
    if math.isnan(x) or x < 0.0 or (finite and math.isinf(x)):
        bound = "a finite number >= 0" if finite else "a number >= 0 (inf allowed)"
        raise ValueError(f"{where} must be {bound}, got {value!r}")
    return x
