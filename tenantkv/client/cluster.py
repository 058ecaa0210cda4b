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
plan (:func:`plan`) and the answer (:func:`joined`) are sans-IO, shared. A
``NotMyPartition`` answer means the map moved on and the request did not
run: the client reads the map again and resends, up to ``max_redirects``
times. Commands that name no key (admin, ``scan``, ``command(...)`` without
a key) go to the node it was given.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from tenantkv import errors
from tenantkv.client.async_client import AsyncClient
from tenantkv.client.core import Call, Commands
from tenantkv.client.servers import Address
from tenantkv.client.sync_client import Client
from tenantkv.cluster.slots import key_slot

if TYPE_CHECKING:
    from tenantkv.client.cluster_pipeline import AsyncClusterPipeline, ClusterPipeline

#: Map refreshes one operation may go through before NotMyPartition is raised.
MAX_REDIRECTS = 5


class SlotMap:
    """The cluster map as the client needs it: slot → node address."""

    def __init__(self, doc: dict[str, Any]) -> None:
        if not doc.get("enabled"):
            raise errors.ClientError("the server is not in a cluster (cluster_map: disabled)")
        self.version = int(doc["version"])
        self.nodes: dict[str, Address] = {
            name: (str(n["host"]), int(n["port"])) for name, n in doc["nodes"].items()
        }
        ranges = sorted((int(s), int(e), str(n)) for s, e, n in doc["ranges"])
        self._starts = [s for s, _, _ in ranges]
        self._ranges = ranges

    def node_of(self, key: bytes) -> Address | None:
        """The address of the node serving ``key``'s slot (None: unassigned)."""
        slot = key_slot(key)
        i = bisect.bisect_right(self._starts, slot) - 1
        if i < 0:
            return None
        start, end, name = self._ranges[i]
        return self.nodes.get(name) if start <= slot <= end else None


#: One request of a plan: the node (None: the slot has no node), the call, and
#: the positions in the caller's keys of the keys it names (None: the call whole).
Part = tuple[Address | None, Call[Any], list[int] | None]


def plan(call: Call[Any], slot_map: SlotMap, seed: Address) -> list[Part]:
    """Where ``call`` goes: whole to its key's node (to ``seed`` if it names no
    key), or, an mget of keys of several nodes, a part per node."""
    keys = _call_keys(call)
    if not keys:
        return [(seed, call, None)]
    if call.method != "mget" or len(keys) == 1:
        return [(slot_map.node_of(keys[0]), call, None)]
    by_node: dict[Address | None, list[int]] = {}
    for i, key in enumerate(keys):
        by_node.setdefault(slot_map.node_of(key), []).append(i)
    if len(by_node) == 1:
        return [(next(iter(by_node)), call, None)]
    return [
        (
            address,
            Call(
                call.method,
                {**call.params, "keys": [keys[i] for i in positions]},
                call.parse,
                call.is_read,
                call.generic,
            ),
            positions,
        )
        for address, positions in by_node.items()
    ]


def joined(parts: list[Part], results: list[Any]) -> Any:
    """The answer of a planned call from its parts' results: the one result, or
    the parts' lists put back in key order (an mget's ``parse`` maps each
    record on its own, so the parts' results join)."""
    if len(parts) == 1 and parts[0][2] is None:
        return results[0]
    out: list[Any] = [None] * sum(len(p[2] or ()) for p in parts)
    for (_, _, positions), result in zip(parts, results, strict=True):
        for i, value in zip(positions or (), result, strict=True):
            out[i] = value
    return out


def unrouted(address: Address | None, call: Call[Any]) -> Address:
    if address is None:
        raise errors.NodeUnavailable(f"{call.method}: the key's slot has no node in the map")
    return address


def unreachable(address: Address, exc: errors.ConnectFailed) -> errors.NodeUnavailable:
    """A node of the map that cannot be reached (killed, say): the request was not
    sent, and the key's slot has no node that can serve it now — the error a
    node answers for a down node's slots, retryable as that is."""
    return errors.NodeUnavailable(
        f"the node at {address[0]}:{address[1]} serving the key's slot cannot be reached "
        f"({exc.errmsg}); the request was not sent"
    )


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
        from tenantkv.client.cluster_pipeline import ClusterPipeline

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
        from tenantkv.client.cluster_pipeline import AsyncClusterPipeline

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


def _call_keys(call: Call[Any]) -> list[bytes]:
    """The keys a command names (``key`` or ``keys``), as bytes."""
    p = call.params
    found: Iterable[Any] = [p["key"]] if "key" in p else p.get("keys") or []
    return [k.encode() if isinstance(k, str) else k for k in found if isinstance(k, str | bytes)]
