"""The cluster node: the process's :class:`~tenantkv.server.node.Role` with
``serve --cluster``.

It is the whole server in one process, as :class:`SingleProcess` is, plus its
membership (:class:`~tenantkv.cluster.membership.Member`): it joins after the
node has loaded and before it announces itself, says which node it is in the
ready file, ``whoami`` and ``status``, and leaves (revoking its lease, so the
map marks it down at once) when it drains.
"""

from __future__ import annotations

import contextlib
import socket
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.etcd import Etcd
from tenantkv.cluster.membership import ClusterSettings, Member
from tenantkv.cluster.metadata import MetadataStore
from tenantkv.cluster.peer import load_secret
from tenantkv.cluster.quota_leader import QuotaLeader, QuotaOffices
from tenantkv.cluster.quota_node import NodeQuota, limited
from tenantkv.cluster.quota_report import peer_transport
from tenantkv.cluster.rebalance import Mover, SlotJanitor, move_slots
from tenantkv.cluster.routing import Router
from tenantkv.config import Config
from tenantkv.server.node import Node
from tenantkv.server.role import SingleProcess
from tenantkv.storage.ops import WriteOp


def cluster_settings(config: Config) -> ClusterSettings:
    assert config.cluster is not None
    return ClusterSettings(
        endpoints=tuple(config.cluster.split(",")),
        node_name=config.node_name or socket.gethostname(),
        prefix=config.cluster_prefix,
        lease_ttl_secs=config.cluster_lease_ttl_secs,
        min_nodes=config.cluster_min_nodes,
    )


def advertised(config: Config, node: Node) -> NodeInfo:
    """Where others reach this node: ``advertise``, its port 0 (or no ``advertise``)
    meaning the port listened on; the RESP door on the same host."""
    host, port = node.host, node.port
    if config.advertise is not None:
        given_host, _, given_port = config.advertise.rpartition(":")
        host, port = given_host, int(given_port) or node.port
    name = config.node_name or socket.gethostname()
    return NodeInfo(name, host, port, node.resp_port or None)


class ClusterNode(SingleProcess):
    """One node of a cluster coordinated by etcd (docs/cluster.md)."""

    def __init__(self, config: Config) -> None:
        self.settings = cluster_settings(config)
        self.member: Member | None = None
        #: the cluster's buckets, users and parameters (tenantkv.cluster.metadata)
        self.metadata: MetadataStore | None = None
        #: the etcd client, once loaded
        self.etcd: Etcd | None = None
        #: the cluster secret: the node credential for peer sessions (cluster.peer)
        self.secret: bytes = b""
        #: this node's shares of the buckets' limits (tenantkv.cluster.quota_node),
        #: who leads each bucket's quota and this node as a leader (quota_leader)
        self.quota: NodeQuota | None = None
        self.quota_offices: QuotaOffices | None = None
        self.quota_leader: QuotaLeader | None = None
        #: the rebalance's mover (working while this node coordinates) and the
        #: janitor dropping slots moved away (tenantkv.cluster.rebalance)
        self.mover: Mover | None = None
        self.janitor: SlotJanitor | None = None
        self.router: Router | None = None

    def identity(self) -> dict[str, Any]:
        return {"node": self.settings.node_name}

    def figures(self) -> dict[str, Any]:
        if self.member is None:
            return {"cluster": {"node": self.settings.node_name, "joined": False}}
        metadata = self.metadata.status() if self.metadata is not None else {}
        quota = self.quota.status() if self.quota is not None else {}
        if self.quota_leader is not None:
            quota["leading"] = self.quota_leader.status()
        moves = self.mover.status() if self.mover is not None and self.member.coordinator else {}
        if self.janitor is not None:
            moves["keys_dropped"] = self.janitor.dropped
        r = self.router
        routing = {"refused": r.refused, "held": r.held} if r is not None else {}
        return {
            "cluster": {
                "joined": True,
                **self.member.status(),
                "metadata": metadata,
                "quota": quota,
                "moves": moves,
                "routing": routing,
            }
        }

    def sharing(self, op: WriteOp) -> AbstractAsyncContextManager[None]:
        """Buckets, users and parameters change in etcd first (cluster.metadata)."""
        if self.metadata is None:
            return contextlib.nullcontext()
        return self.metadata.sharing(op)

    async def load(self, node: Node, nursery: trio.Nursery) -> None:
        etcd: Etcd = await nursery.start(self._run_etcd)
        self.etcd = etcd
        self.secret = await load_secret(etcd, self.settings)
        node.accounts.node_secret = self.secret
        # The cluster's metadata before the first admin user: a node joining a
        # cluster takes its users rather than bootstrap one of its own.
        self.metadata = MetadataStore(etcd, self.settings, node)
        await nursery.start(self.metadata.follow)
        await self._bootstrap(node)
        nursery.start_soon(node.expiry_pager.run)
        self.member = Member(etcd, self.settings, advertised(node.config, node))
        self.mover = Mover(self.member, self.secret)
        self.member.while_coordinating = self.mover.run
        await nursery.start(self.member.run)
        await self.member.wait_for_map()
        await self._hold_limits(node, etcd, nursery)
        self.janitor = SlotJanitor(node, self.member)
        await self.janitor.drop_foreign()
        self.member.on_map = self.janitor.map_changed
        nursery.start_soon(self.janitor.run)
        self._route(node)

    async def _run_etcd(
        self, *, task_status: trio.TaskStatus[Etcd] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with Etcd(self.settings.endpoints) as etcd:
            task_status.started(etcd)
            await trio.sleep_forever()

    async def _bootstrap(self, node: Node) -> None:
        """:func:`bootstrap`, where another node may create ``admin`` first."""
        assert self.metadata is not None
        try:
            await node.accounts.bootstrap_admin()
        except errors.UserExists:
            # Another node bootstrapped the cluster's admin meanwhile: take it.
            await self.metadata.read()
            await self.metadata.apply()
        await node.accounts.drop_dangling_roles(node.engine.buckets)

    async def _hold_limits(self, node: Node, etcd: Etcd, nursery: trio.Nursery) -> None:
        """Hold each limited bucket to this node's share of its limits, from the
        first request on, and take part in electing their quota leaders
        (docs/cluster.md, "Tenant limits across the cluster")."""
        member = self.member
        assert member is not None
        throttle = node.throttle

        def buckets() -> list[str]:
            return [name for name, p in throttle.props().buckets.items() if limited(p)]

        offices = self.quota_offices = QuotaOffices(etcd, member, buckets)
        leader = self.quota_leader = QuotaLeader(throttle, offices.led)
        self.quota = NodeQuota(
            throttle,
            me=self.settings.node_name,
            nodes_up=lambda: sum(1 for info in member.map.nodes.values() if info.up),
            leader_of=offices.leader_of,
            local=leader.report,
            transport=peer_transport(
                self.settings.node_name, lambda: member.map.nodes, lambda: self.secret
            ),
            wake=node.gate.wake,
        )
        await nursery.start(offices.run)
        await nursery.start(self.quota.run)

    def _route(self, node: Node) -> None:
        """From now on the node serves only the keys of its own slots."""
        assert self.member is not None
        node.cluster = self.router = Router(self.member)

    async def move_slots(self, session: Any, drain: list[str], params: dict[str, Any]) -> Any:
        return await move_slots(session, drain, params)

    async def drain(self, node: Node) -> None:
        if self.member is not None:
            await self.member.leave()
