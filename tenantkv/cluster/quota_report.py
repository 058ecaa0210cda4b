"""Quota reports from node to leader over the node-to-node channel
(:mod:`tenantkv.cluster.peer`): the ``quota_report`` internal command the
leader answers, and the transport a node reports through.

One peer session per leader a node reports to, held by that leader's reporter
task (:class:`~tenantkv.cluster.quota_node.NodeQuota`) for as long as the
leader leads a bucket of the node; a failed session is opened again a slice
later, and meanwhile the node's shares run out into its 1/N fallback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final

from tenantkv import errors
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.peer import internal_command, peer_session
from tenantkv.cluster.quota_node import QuotaUnreachable, Send, Transport
from tenantkv.server.commands import Session, str_param

#: Most a report's round trip (or the session's opening) may take. A share runs
#: out after LEASE_SLICES slices without an answer anyway; this only bounds how
#: long a session that stopped answering is kept.
PEER_TIMEOUT_SECS: Final = 2.0


@internal_command("quota_report", "node", "usage")
async def quota_report(s: Session, p: dict[str, Any]) -> Any:
    """{v, buckets: {name: [rate, reserved_rate, hard_rate]}, pending: [name]}:
    the reporting node's shares of the buckets this node leads (usage: its report,
    ``usage_to_wire``). A bucket not led here is left out of the answer."""
    leader = getattr(s.node.role, "quota_leader", None)
    if leader is None:
        raise errors.BadValue("this node is in no cluster")
    node = str_param(p, "node")
    router = s.node.cluster
    if router is None or node not in router.member.map.nodes:
        # The leader's table holds the nodes of the cluster, not any name a
        # holder of the cluster secret makes up (each would take a share).
        raise errors.BadValue(f"node {node!r} is not in this node's cluster map")
    try:
        return leader.answer(node, p.get("usage"))
    except ValueError as exc:
        raise errors.BadValue(f"usage: {exc}") from None


def peer_transport(
    me: str, nodes: Callable[[], dict[str, NodeInfo]], secret: Callable[[], bytes]
) -> Transport:
    """The transport of :class:`NodeQuota`: a peer session to the named leader,
    at its address in the map this node holds (``nodes``)."""

    @asynccontextmanager
    async def channel(leader: str) -> AsyncIterator[Send]:
        info = nodes().get(leader)
        if info is None or not info.up:
            raise QuotaUnreachable(f"node {leader!r} is not up in the map")
        try:
            async with peer_session(info, secret(), timeout_secs=PEER_TIMEOUT_SECS) as peer:

                async def send(report: dict[str, Any]) -> Any:
                    try:
                        return await peer.call("quota_report", {"node": me, "usage": report})
                    except (errors.TenantKVError, OSError) as exc:
                        raise QuotaUnreachable(f"node {leader!r}: {exc}") from exc

                yield send
        except (errors.TenantKVError, OSError) as exc:
            raise QuotaUnreachable(f"node {leader!r}: {exc}") from exc

    return channel
