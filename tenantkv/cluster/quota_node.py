"""A cluster node's part of its buckets' limits (docs/cluster.md, "Tenant limits
across the cluster").

A bucket's reservation and hard limit are promises about the cluster, but each
node admits its own clients. So on every node each limited bucket is held to
this node's **share** of its limits (:class:`~tenantkv.admission.rate_allocation.BucketLease`:
``reserved_rate`` and ``hard_rate``), and the shares of all nodes sum to at most
the limits:

- **leased**: the bucket's quota leader (tenantkv.cluster.quota_leader) splits
  the limits between the nodes by their reports, as the supervisor of
  ``serve --workers N`` splits a node's rates between its workers;
- **fallback** ``1/N``: with no lease from the leader for ``LEASE_SLICES``
  slices (leader dead and not yet replaced, etcd down, network cut, or the
  leader has not yet seen this node use the bucket), ``N`` the nodes up in the
  map this node holds. The N shares sum to the limit with no communication.

How a share holds: through the very path the workers' leases take. The node
runs an in-process :class:`~tenantkv.admission.quota_lease.QuotaAllocator`
with one worker (the node's throttle) whose buckets are allocated with their
share in place of their configured limits (:meth:`QuotaAllocator.set_limits`),
and the throttle applies its answer (:meth:`TenantThrottle.apply_lease`). The
node's allocation of its own capacity among its buckets is the one a single
process runs, and the per-request path does not change. A bucket that lease
does not mention (first used since the last allocation) runs at the throttle's
provisional ``1/N`` share: within the fallback too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import trio

from tenantkv.admission.quota_lease import (
    LEASE_SLICES,
    BucketLease,
    BucketUse,
    QuotaAllocator,
    lease_from_wire,
    usage_to_wire,
)
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import BucketProps, limit_rate, rate_to_wire

log = logging.getLogger("tenantkv.cluster")

#: The name of the node's one "worker" in its in-process allocator.
_SELF: Final = "node"
_INF: Final = math.inf

#: Sends this node's report (``usage_to_wire``) to a leader and returns its answer
#: (``lease_to_wire`` and ``pending``); raises :class:`QuotaUnreachable` if it cannot.
Send = Callable[[dict[str, Any]], Awaitable[Any]]
#: Opens a channel to the named leader (its ``Send``, for as long as the context
#: lasts); raises :class:`QuotaUnreachable` if it cannot.
Transport = Callable[[str], AbstractAsyncContextManager[Send]]
#: The leader's side, in process: ``(node, usage, now) -> (lease, pending)``.
LocalLeader = Callable[[str, dict[str, BucketUse], float], tuple[dict[str, BucketLease], set[str]]]


class QuotaUnreachable(Exception):
    """A report did not reach the bucket's leader, or got no answer."""


def limited(props: BucketProps) -> bool:
    """Has the bucket a limit to hold across the cluster (a hard limit, or a
    reservation above 0)? Others are the same on every node: no leader, no share."""
    return props.hard_limit is not None or bool(props.reserved)


def fallback_share(props: BucketProps, nodes: int) -> BucketLease:
    """``1/nodes`` of the bucket's reservation and hard limit (``inf`` for an
    exempt reservation, which the node keeps as ``None``)."""
    n = max(1, nodes)
    hard = limit_rate(props.hard_limit) / n
    res = _INF if props.reserved is None else props.reserved / n
    return BucketLease(hard, res, hard)


class NodeQuota:
    """This node's shares of its limited buckets, applied to its throttle.

    ``nodes_up``: nodes up in the map this node holds; ``leader_of``: the node
    that leads a bucket's quota (None: none known); ``local``: this node's
    leader, for the buckets it leads itself; ``transport``: to the others
    (None: every other leader is unreachable, so those buckets run at 1/N).
    With neither, every limited bucket runs at 1/N: the fallback alone.
    """

    def __init__(
        self,
        throttle: TenantThrottle,
        *,
        me: str,
        nodes_up: Callable[[], int],
        leader_of: Callable[[str], str | None],
        local: LocalLeader | None = None,
        transport: Transport | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.throttle = throttle
        self.me = me
        self.nodes_up = nodes_up
        self.leader_of = leader_of
        self.local = local
        self.transport = transport
        self.wake = wake
        self._allocator = QuotaAllocator(throttle.props(), lend=False)
        #: Per bucket: the leader's share and when it came (this node's clock).
        self._leased: dict[str, tuple[BucketLease, float]] = {}
        #: The shares in force (as of the last :meth:`apply`) and where each came from.
        self.shares: dict[str, tuple[BucketLease, str]] = {}
        self._reporters: set[str] = set()
        self._wakeup = trio.Event()
        self.reports_sent = 0
        self.report_failures = 0
        #: leader's shares that ran out (no newer answer within the horizon)
        self.shares_expired = 0

    @property
    def horizon_secs(self) -> float:
        """How long a leader's share holds without a newer one."""
        return LEASE_SLICES * self.throttle.slice_secs

    # -- the shares ----------------------------------------------------------------

    def limits(self, now: float) -> dict[str, BucketLease]:
        """Each limited bucket's share now: the leader's while fresh, else 1/N."""
        n = self.nodes_up()
        out: dict[str, BucketLease] = {}
        shares: dict[str, tuple[BucketLease, str]] = {}
        for name, props in self.throttle.props().buckets.items():
            if not limited(props):
                continue
            leased = self._leased.get(name)
            if leased is not None and now - leased[1] <= self.horizon_secs:
                out[name], source = leased[0], "leader"
            else:
                if leased is not None:  # no newer answer in time: it runs out
                    del self._leased[name]
                    self.shares_expired += 1
                out[name], source = fallback_share(props, n), "fallback"
            shares[name] = (out[name], source)
        self.shares = shares
        return out

    def take(
        self,
        buckets: list[str],
        lease: dict[str, BucketLease],
        now: float,
        pending: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """A leader's answer for ``buckets``: a bucket it gave no share (it has not
        seen this node use it) runs at 1/N until it does; a pending one (a new
        leader warming up) keeps what it holds, until that runs out."""
        for name in buckets:
            share = lease.get(name)
            if name in pending:
                continue
            if share is None:
                self._leased.pop(name, None)
            else:
                self._leased[name] = (share, now)

    def apply(self) -> None:
        """Report to the local leader, then hold every bucket to its share: the
        node's allocation among its buckets, within the shares, as the throttle's
        lease (the module docstring)."""
        throttle = self.throttle
        now = throttle.clock()
        usage = throttle.usage()
        mine = self._led_by(self.me) if self.local is not None else []
        if self.local is not None and mine:
            report = {b: usage[b] for b in mine if b in usage}
            lease, pending = self.local(self.me, report, now)
            self.take(mine, lease, now, pending)
        props = throttle.props()
        if props != self._allocator.props:
            self._allocator.set_props(props)
        self._allocator.set_limits(self.limits(now))
        lease = self._allocator.report(_SELF, usage, now)
        throttle.apply_lease(lease, workers=max(1, self.nodes_up()))
        self.wake()

    def _led_by(self, leader: str) -> list[str]:
        return [
            name
            for name, props in self.throttle.props().buckets.items()
            if limited(props) and self.leader_of(name) == leader
        ]

    # -- running -------------------------------------------------------------------

    def demand_event(self) -> None:
        """The throttle saw a bucket newly hungry: allocate and report now."""
        woken, self._wakeup = self._wakeup, trio.Event()
        woken.set()

    async def _next_round(self) -> None:
        """Until the next slice, or sooner on a demand event."""
        with trio.move_on_after(self.throttle.slice_secs):
            await self._wakeup.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply the shares every slice (and on demand events), and keep one
        reporter per other leader this node's buckets have."""
        self.throttle.on_demand_event = self.demand_event
        self.apply()
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                self._start_reporters(nursery)
                await self._next_round()
                self.apply()

    def _start_reporters(self, nursery: trio.Nursery) -> None:
        if self.transport is None:
            return
        for name, props in self.throttle.props().buckets.items():
            leader = self.leader_of(name) if limited(props) else None
            if leader is not None and leader != self.me and leader not in self._reporters:
                self._reporters.add(leader)
                nursery.start_soon(self._report_to, leader)

    async def _report_to(self, leader: str) -> None:
        """Report to ``leader`` each slice while it leads a bucket of this node,
        on one channel; a failed one is opened again a slice later."""
        assert self.transport is not None
        try:
            while self._led_by(leader):
                try:
                    async with self.transport(leader) as send:
                        await self._reports(leader, send)
                except (QuotaUnreachable, ValueError) as exc:
                    self.report_failures += 1
                    log.debug("quota report to %s: %s", leader, exc)
                    await self._next_round()
        finally:
            self._reporters.discard(leader)

    async def _reports(self, leader: str, send: Send) -> None:
        while buckets := self._led_by(leader):
            usage = self.throttle.usage()
            report = {b: usage[b] for b in buckets if b in usage}
            # Not cut short at the horizon: a slow answer lets the share run out
            # into 1/N (limits()), and a cancelled call would cost a new session.
            answer = await send(usage_to_wire(report))
            lease, pending = lease_from_wire(answer), _pending(answer)
            self.reports_sent += 1
            self.take(buckets, lease, self.throttle.clock(), pending)
            self.apply()
            await self._next_round()

    def status(self) -> dict[str, Any]:
        """Per limited bucket: its leader and this node's share (for ``status``)."""
        return {
            "reports_sent": self.reports_sent,
            "report_failures": self.report_failures,
            "shares_expired": self.shares_expired,
            "buckets": {
                name: {
                    "leader": self.leader_of(name),
                    "source": source,
                    "reserved_rate": rate_to_wire(share.reserved_rate),
                    "hard_rate": rate_to_wire(share.hard_rate),
                }
                for name, (share, source) in self.shares.items()
            },
        }


def _pending(answer: Any) -> set[str]:
    """The buckets a leader's answer says are pending; ``ValueError`` if malformed."""
    names = answer.get("pending", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"lease: 'pending' must be a list of bucket names, got {names!r}")
    return set(names)
