"""Clients for a cluster: given any node, they route each key to its node.

    with tenantkv.client.cluster.ClusterClient("127.0.0.1", 7301, user="app",
                                               password="...", bucket="orders") as c:
        c.set("user:1", b"x")              # sent to the node that serves the key's slot
        c.mget(["user:1", "user:2"])       # split by node, answered in key order
        with c.pipeline() as p:            # each node its part in one batch
            p.set("user:1", b"y"); p.get("user:2")

    c = tenantkv.client.cluster.connect("127.0.0.1", 7301, ...)   # ClusterClient
                                              # on a cluster node, else a Client

    async with AsyncClusterClient("127.0.0.1", 7301, ...) as c:   # the same, on Trio
        await c.get("user:1")

Each reads the cluster map (``cluster_map``) from the node it is given, keeps
a client per node it talks to (:class:`~tenantkv.client.sync_client.Client` or
:class:`~tenantkv.client.async_client.AsyncClient`, each with its own retry
policy for overload), and sends each command that names keys to the node of
the keys' slot (``CRC16(key) mod 16384``, Redis's ``{hashtag}`` rule): the
plan and the answer are sans-IO, shared (:mod:`tenantkv.client.cluster_plan`). A
``NotMyPartition`` answer means the map moved on and the request did not
run: the client reads the map again and resends, up to ``max_redirects``
times. Commands that name no key (admin, ``scan``, ``command(...)`` without
a key) go to the node it was given.
"""

from __future__ import annotations

from typing import Any

import trio

from tenantkv import errors
from tenantkv.client.async_client import AsyncClient
from tenantkv.client.cluster_pipeline import AsyncClusterPipeline, ClusterPipeline
from tenantkv.client.cluster_plan import (
    SlotMap,
    joined,
    plan,
    unreachable,
    unrouted,
)
from tenantkv.client.core import Call, Commands
from tenantkv.client.servers import Address
from tenantkv.client.sync_client import Client

#: Map refreshes one operation may go through before NotMyPartition is raised.
MAX_REDIRECTS = 5


class ClusterClient(Commands):
    """Every command of :class:`~tenantkv.client.core.Commands`, routed by the map.
    ``kwargs`` are :class:`~tenantkv.client.sync_client.Client`'s (user,
    password, bucket, timeouts, retry policy, TLS), used for every node."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_redirects: int = MAX_REDIRECTS,
        seed_client: Client | None = None,
        **kwargs: Any,
    ) -> None:
        """``seed_client``: a Client already open to (host, port), with these
        ``kwargs``, to use as that node's (no second login)."""
        self._kwargs = kwargs
        self.seed: Address = (host, port)
        seed = seed_client if seed_client is not None else Client(host, port, **kwargs)
        self._clients: dict[Address, Client] = {self.seed: seed}
        self.max_redirects = max_redirects
        self.map_refreshes = 0
        try:
            self.map = self._read_map()
        except BaseException:
            self.close()
            raise

    def refresh_map(self) -> SlotMap:
        """Read the map again (from the node given, else any node known)."""
        self.map = self._read_map()
        self.map_refreshes += 1
        return self.map

    def _read_map(self) -> SlotMap:
        last: errors.TenantKVError | None = None
        for address in [self.seed, *(a for a in self._clients if a != self.seed)]:
            try:
                return SlotMap(self.node_client(address).command("cluster_map"))
            except errors.ConnectionClosed as exc:
                last = exc  # that node is gone: ask another
        assert last is not None
        raise last

    def node_client(self, address: Address) -> Client:
        """The client of the node at ``address`` (opened on first use)."""
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = Client(address[0], address[1], **self._kwargs)
        return client

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        for redirects in range(self.max_redirects + 1):
            parts = plan(call, self.map, self.seed)
            try:
                results = [self._run(address, part, op_timeout) for address, part, _ in parts]
            except errors.NotMyPartition:
                if redirects == self.max_redirects:
                    raise
                self.refresh_map()  # the request did not run: resend by the new map
                continue
            return joined(parts, results)
        raise AssertionError("unreachable")  # pragma: no cover

    def _run(self, address: Address | None, call: Call[Any], op_timeout: float | None) -> Any:
        address = unrouted(address, call)
        try:
            return self.node_client(address)._execute(call, op_timeout)
        except errors.ConnectFailed as exc:
            raise unreachable(address, exc) from None

    def pipeline(self, *, raise_on_error: bool = True) -> ClusterPipeline:
        """Queue commands; each node gets its part in one batch
        (:mod:`tenantkv.client.cluster_pipeline`)."""
        return ClusterPipeline(self, raise_on_error=raise_on_error)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(host: str, port: int, **kwargs: Any) -> Client | ClusterClient:
    """A client for whatever serves at (host, port): a :class:`ClusterClient` if
    the server is a node of a cluster (its ``cluster_map`` says so), else the
    :class:`~tenantkv.client.sync_client.Client` itself. ``kwargs`` are
    Client's. One login either way: the first connection is kept.

    Why not :class:`Client` itself switching: a Client is one node's session —
    what ClusterClient and ``tenantkv-admin`` build on, and what per-node
    commands (node throttle properties, status) need — and its pipelines and
    transactions are one batch on one socket, which a cluster would have to
    split by node. Given a cluster node, a Client answers ``NotMyPartition``
    (with the owner's address) for another node's keys rather than guess."""
    client = Client(host, port, **kwargs)
    try:
        doc = client.command("cluster_map")
        if not doc.get("enabled"):
            return client
        return ClusterClient(host, port, seed_client=client, **kwargs)
    except BaseException:
        client.close()
        raise


class AsyncClusterClient(Commands):
    """:class:`ClusterClient` on Trio: ``async with``, and ``await`` each command.
    ``kwargs`` are :class:`~tenantkv.client.async_client.AsyncClient`'s. Each node's
    client lives in a task of this client's nursery (an AsyncClient keeps a
    nursery of its own, which must close in the task and order it opened in)."""

    def __init__(
        self, host: str, port: int, *, max_redirects: int = MAX_REDIRECTS, **kwargs: Any
    ) -> None:
        self._kwargs = kwargs
        self.seed: Address = (host, port)
        self._clients: dict[Address, AsyncClient] = {}
        self.max_redirects = max_redirects
        self.map_refreshes = 0
        self.map: SlotMap | None = None
        self._closing = trio.Event()
        self._nursery_manager = trio.open_nursery()
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> AsyncClusterClient:
        self._nursery = await self._nursery_manager.__aenter__()
        try:
            await self._read_map()
        except BaseException:
            self._closing.set()
            self._nursery.cancel_scope.cancel()
            await self._nursery_manager.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing.set()  # each node's client closes in its own task
        await self._nursery_manager.__aexit__(*exc)

    async def _run(self, address: Address | None, call: Call[Any], op_timeout: float | None) -> Any:
        address = unrouted(address, call)
        try:
            return await (await self.node_client(address))._execute(call, op_timeout)
        except errors.ConnectFailed as exc:
            raise unreachable(address, exc) from None

    def pipeline(self, *, raise_on_error: bool = True) -> AsyncClusterPipeline:
        """Queue commands (no ``await``), then ``await p.execute()``; the nodes'
        batches go out at once (:mod:`tenantkv.client.cluster_pipeline`)."""
        return AsyncClusterPipeline(self, raise_on_error=raise_on_error)

    async def refresh_map(self) -> SlotMap:
        self.map_refreshes += 1
        return await self._read_map()

    async def _read_map(self) -> SlotMap:
        last: errors.TenantKVError | None = None
        for address in [self.seed, *(a for a in self._clients if a != self.seed)]:
            try:
                client = await self.node_client(address)
                self.map = SlotMap(await client.command("cluster_map"))
                return self.map
            except errors.ConnectionClosed as exc:
                last = exc
        assert last is not None
        raise last

    async def node_client(self, address: Address) -> AsyncClient:
        """The client of the node at ``address`` (opened on first use)."""
        client = self._clients.get(address)
        if client is None:
            assert self._nursery is not None, "use AsyncClusterClient in async with"
            client = await self._nursery.start(self._hold, address)
            self._clients[address] = client
        return client

    async def _hold(self, address: Address, *, task_status: trio.TaskStatus[AsyncClient]) -> None:
        async with AsyncClient(address[0], address[1], **self._kwargs) as client:
            task_status.started(client)
            await self._closing.wait()

    async def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        for redirects in range(self.max_redirects + 1):
            assert self.map is not None, "use AsyncClusterClient in async with"
            parts = plan(call, self.map, self.seed)
            try:
                results = [await self._run(address, part, op_timeout) for address, part, _ in parts]
            except errors.NotMyPartition:
                if redirects == self.max_redirects:
                    raise
                await self.refresh_map()
                continue
            return joined(parts, results)
        raise AssertionError("unreachable")  # pragma: no cover
