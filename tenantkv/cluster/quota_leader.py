"""Per-bucket quota leaders: who splits each limited bucket's limits between
the nodes (docs/cluster.md, "Tenant limits across the cluster").

The office (:class:`QuotaOffices`): etcd key ``<prefix>/quota/<bucket>``, whose
value is the leader's node name, created under the leader's node lease with
the create-if-absent transaction of the coordinator's campaign. A leader that
dies loses its offices with its lease; every node watches ``quota/`` and
claims a bucket that has none. Claims are staggered by a hash of bucket and
node, so the buckets' leaders spread over the nodes rather than all going to
the quickest. One office per bucket rather than one allocator for all: a
bucket's allocation needs only its own reports (capacity is per node, so
buckets do not compete across nodes), and the work spreads.

The leader (:class:`QuotaLeader`): a
:class:`~tenantkv.admission.quota_lease.LimitAllocator` whose "workers" are the
nodes, fed with their reports and answering each with its shares.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final

import trio

from tenantkv.admission.quota_lease import (
    LEASE_SLICES,
    BucketLease,
    BucketUse,
    LimitAllocator,
    lease_to_wire,
    usage_from_wire,
)
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import ThrottleProps
from tenantkv.cluster.etcd import Compare, Etcd, EtcdError, KeyValue, delete_op, put_op
from tenantkv.cluster.membership import RETRY_SECS, Member
from tenantkv.cluster.quota_node import limited

log = logging.getLogger("tenantkv.cluster")

#: How often a node looks for limited buckets with no leader (seconds).
CLAIM_PERIOD_SECS: Final = 0.2
#: A node of rank r (by a hash of bucket and node, among the nodes up in its
#: map) claims a leaderless bucket once it has been leaderless r + 1 times this
#: long (so a node that just joined sees the others in the map first).
CLAIM_STAGGER_SECS: Final = 0.3


class QuotaLeader:
    """This node as the quota leader of the buckets ``led()`` names.

    A bucket newly led here is **warming** for ``LEASE_SLICES`` slices: its
    reports are taken but its shares not yet given (they are ``pending`` in the
    answer: the node keeps what it holds). By then the shares the previous leader
    gave have run out and every live node has reported, so the first shares given
    here are computed with all of them and never stack on the previous leader's.
    """

    def __init__(self, throttle: TenantThrottle, led: Callable[[], set[str]]) -> None:
        self.throttle = throttle
        self.led = led
        self.allocator = LimitAllocator(self._props())
        #: bucket -> when it was first led here (this office)
        self._since: dict[str, float] = {}

    def _props(self) -> ThrottleProps:
        props = self.throttle.props()
        led = self.led()
        buckets = {n: p for n, p in props.buckets.items() if n in led and limited(p)}
        return ThrottleProps(props.node, MappingProxyType(buckets), props.slice_secs)

    def report(
        self, node: str, usage: dict[str, BucketUse], now: float
    ) -> tuple[dict[str, BucketLease], set[str]]:
        """``node``'s report of its use of the buckets led here: its shares, and the
        buckets whose shares are pending (warming; the node keeps its own)."""
        props = self._props()
        if props != self.allocator.props:
            self.allocator.set_props(props)
        for name in list(self._since):
            if name not in props.buckets:
                del self._since[name]
        warm_until = LEASE_SLICES * props.slice_secs
        pending = {
            name for name in props.buckets if now - self._since.setdefault(name, now) < warm_until
        }
        mine = {b: u for b, u in usage.items() if b in props.buckets}
        lease = self.allocator.report(node, mine, now)
        return {b: x for b, x in lease.items() if b not in pending}, pending & set(usage)

    def answer(self, node: str, report: object) -> dict[str, Any]:
        """The wire form of :meth:`report` (a peer's message): the lease with the
        pending buckets' names; ``ValueError`` if the report is malformed."""
        usage = usage_from_wire(report)
        lease, pending = self.report(node, usage, trio.current_time())
        return {**lease_to_wire(lease), "pending": sorted(pending)}

    def status(self) -> dict[str, Any]:
        return self.allocator.statistics()


class QuotaOffices:
    """Which node leads each bucket's quota, as etcd says; and this node's claims."""

    def __init__(self, etcd: Etcd, member: Member, buckets: Callable[[], list[str]]) -> None:
        self.etcd = etcd
        self.member = member
        #: the limited buckets this node knows (those it claims offices for)
        self.buckets = buckets
        self.prefix = member.settings.key("quota") + b"/"
        #: bucket -> (leader's node name, the lease its office is under)
        self.leaders: dict[str, tuple[str, int]] = {}
        #: bucket -> when this node first saw it leaderless
        self._leaderless: dict[str, float] = {}
        self.etcd_errors = 0

    def leader_of(self, bucket: str) -> str | None:
        held = self.leaders.get(bucket)
        return None if held is None else held[0]

    def led(self) -> set[str]:
        """The buckets this node leads: offices under its current lease."""
        me, lease = self.member.me.name, self.member.lease
        return {b for b, held in self.leaders.items() if held == (me, lease)}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow)
            task_status.started()
            while True:
                await self._claim()
                await trio.sleep(CLAIM_PERIOD_SECS)

    async def _follow(self) -> None:
        """Keep :attr:`leaders` current: read ``quota/``, then watch it."""
        while True:
            try:
                kvs, revision = await self.etcd.range(self.prefix, prefix=True)
                self.leaders = dict(self._office(kv) for kv in kvs)
                async with self.etcd.watch(
                    self.prefix, prefix=True, start_revision=revision + 1
                ) as watch:
                    async for events in watch:
                        for event in events:
                            if event.type == "PUT":
                                name, held = self._office(event.kv)
                                self.leaders[name] = held
                            else:
                                self.leaders.pop(self._bucket(event.kv.key), None)
            except EtcdError as exc:
                self.etcd_errors += 1
                log.warning("quota offices: %s (retrying)", exc)
                await trio.sleep(RETRY_SECS)

    def _bucket(self, key: bytes) -> str:
        return key[len(self.prefix) :].decode()

    def _office(self, kv: KeyValue) -> tuple[str, tuple[str, int]]:
        return self._bucket(kv.key), (kv.value.decode(), kv.lease)

    async def _claim(self) -> None:
        """Claim the limited buckets that have had no leader for this node's turn;
        give up the offices of buckets no longer limited (or dropped)."""
        if not self.member.lease_valid() or self.member.me.name not in self.member.map.nodes:
            return  # (claims wait for the map: the stagger ranks the nodes in it)
        now = trio.current_time()
        wanted = set(self.buckets())
        try:
            for bucket in sorted(wanted):
                if bucket in self.leaders:
                    self._leaderless.pop(bucket, None)
                    continue
                since = self._leaderless.setdefault(bucket, now)
                if now - since >= (self._rank(bucket) + 1) * CLAIM_STAGGER_SECS:
                    await self._take(bucket)
            for bucket in self.led() - wanted:
                await self.etcd.txn([], [delete_op(self.prefix + bucket.encode())])
                self.leaders.pop(bucket, None)
        except EtcdError as exc:
            self.etcd_errors += 1
            log.warning("quota offices: %s", exc)

    async def _take(self, bucket: str) -> None:
        key = self.prefix + bucket.encode()
        me, lease = self.member.me.name, self.member.lease
        result = await self.etcd.txn([Compare.absent(key)], [put_op(key, me.encode(), lease)])
        if result.succeeded:
            self.leaders[bucket] = (me, lease)
            self._leaderless.pop(bucket, None)
            log.info("node %s leads the quota of bucket %r", me, bucket)

    def _rank(self, bucket: str) -> int:
        """This node's place among the nodes up for ``bucket`` (0: claims at once)."""
        me = self.member.me.name
        up = {n for n, info in self.member.map.nodes.items() if info.up} | {me}

        def key(node: str) -> bytes:
            return hashlib.sha1(f"{bucket}\0{node}".encode()).digest()

        return sorted(up, key=key).index(me)
