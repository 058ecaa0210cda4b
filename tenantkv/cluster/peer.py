"""Node to node: an authenticated MessagePack session from one cluster node to
another, and the cluster-internal commands it runs.

The credential: a **cluster secret**, 32 random bytes created once in etcd
(``<prefix>/secret``, a create-if-absent transaction, so nodes racing at the
first start agree on one), never logged, and the reserved login name
:data:`~tenantkv.server.auth.NODE_USER` (``@node``), which no admin can create
(``validate_user_name`` refuses it). A cluster node accepts that login with the
secret (:meth:`Accounts.authenticate`) and grants the **node** role: no admin,
no role on any bucket, unthrottled; it alone may run the commands of kind
``internal``, and they are charged to no tenant. A node outside a cluster
holds no secret and accepts no node login.

Calling another node::

    async with peer_session(node_info, secret) as s:
        reply = await s.call("node_ping", {})

Adding an internal command — a coroutine taking the connection's session and
the request's parameters, registered under its name and parameter names::

    @internal_command("quota_report", "bucket", "usage")
    async def quota_report(s: Session, p: dict[str, Any]) -> Any:
        role = s.node.role          # the ClusterNode: its member, its services
        ...
        return {...}                # any MessagePack value

Rules for an internal command: it must bound its own work (a page of at most
a fixed number of keys or bytes per call: no admission gate runs before it,
and its connection waits for it), check its parameters precisely (a
``BadValue`` naming the parameter), and be safe to receive twice (a peer may
resend after a lost answer). Its module must be imported by the node (import
it from :mod:`tenantkv.cluster.node_role`, or here) so that it is registered
before the node serves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from tenantkv import errors
from tenantkv.client.async_client import AsyncClient
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.etcd import Compare, Etcd, EtcdError, KeyValue, get_op, put_op
from tenantkv.cluster.membership import RETRY_SECS, ClusterSettings
from tenantkv.server import auth
from tenantkv.server.commands import Session, command

log = logging.getLogger("tenantkv.cluster")

#: Bytes of the cluster secret.
SECRET_BYTES = 32
#: A peer call's default timeout (seconds): internal commands are bounded pages.
PEER_TIMEOUT_SECS = 10.0

InternalHandler = Callable[[Session, dict[str, Any]], Any]


def internal_command(name: str, *params: str) -> Callable[[InternalHandler], InternalHandler]:
    """Register a cluster-internal command (see the module docstring)."""
    return command(name, "internal", *params)


async def ensure_secret(etcd: Etcd, settings: ClusterSettings) -> bytes:
    """The cluster's secret: created by the first node to ask (create-if-absent,
    one transaction), read by every other. Raises EtcdError when etcd fails."""
    key = settings.key("secret")
    fresh = os.urandom(SECRET_BYTES)
    result = await etcd.txn([Compare.absent(key)], [put_op(key, fresh)], [get_op(key)])
    if result.succeeded:
        log.info("created the cluster secret")
        return fresh
    kvs = result.responses[0].get("response_range", {}).get("kvs", [])
    if not kvs:  # (deleted in between: try once more)
        return await ensure_secret(etcd, settings)
    secret = KeyValue.from_json(kvs[0]).value
    if len(secret) != SECRET_BYTES:
        raise EtcdError(f"the cluster secret at {key.decode()} is not {SECRET_BYTES} bytes")
    return secret


async def load_secret(etcd: Etcd, settings: ClusterSettings) -> bytes:
    """:func:`ensure_secret`, retried while etcd is unreachable (a node cannot
    talk to its peers without it)."""
    while True:
        try:
            return await ensure_secret(etcd, settings)
        except EtcdError as exc:
            log.warning("etcd: %s (retrying to read the cluster secret)", exc)
            await trio.sleep(RETRY_SECS)


class PeerSession:
    """A session with one other node, logged in as the node user."""

    def __init__(self, client: AsyncClient, node: NodeInfo) -> None:
        self._client = client
        self.node = node

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Run ``method`` on the peer; its raw result, or the server's error raised
        (a :class:`~tenantkv.errors.TenantKVError`; connection failures as
        ``ConnectFailed`` / ``ConnectionClosed``). Bounded by the session's
        ``timeout_secs``; wrap it in ``trio.fail_after`` for less."""
        return await self._client.command(method, **(params or {}))


@asynccontextmanager
async def peer_session(
    node: NodeInfo, secret: bytes, *, timeout_secs: float = PEER_TIMEOUT_SECS
) -> AsyncIterator[PeerSession]:
    """Open a :class:`PeerSession` to ``node`` (its MessagePack address) with the
    cluster ``secret``; closed on leaving. Overload answers are retried as the
    bundled client retries them; a refused login raises AuthenticationFailed."""
    client = AsyncClient(
        node.host,
        node.port,
        user=auth.NODE_USER,
        password=auth.node_password(secret),
        timeout=timeout_secs,
        connect_timeout=min(timeout_secs, 5.0),
        client_name="tenantkv-peer",
    )
    async with client:
        yield PeerSession(client, node)


# -- internal commands of the channel itself ------------------------------------------


@internal_command("node_ping")
async def node_ping(s: Session, p: dict[str, Any]) -> Any:
    """{node, map_version}: the peer's name and the map version it follows."""
    router = s.node.cluster
    if router is None:
        raise errors.BadValue("this node is in no cluster")
    return {"node": router.member.me.name, "map_version": router.member.map.version}
