"""A blocking client for a cluster: given any node, it routes each key to its node.

    with tenantkv.client.cluster.ClusterClient("127.0.0.1", 7301, user="app",
                                               password="...", bucket="orders") as c:
        c.set("user:1", b"x")              # sent to the node that serves the key's slot
        c.mget(["user:1", "user:2"])       # split by node, answered in key order

It reads the cluster map (``cluster_map``) from the node it is given, keeps a
:class:`~tenantkv.client.sync_client.Client` per node it talks to (each with
its own retry policy for overload), and sends each command that names keys to
the node of the keys' slot (``CRC16(key) mod 16384``, Redis's ``{hashtag}``
rule). A ``NotMyPartition`` answer means the map moved on and the request did
not run: the client reads the map again and resends, up to ``max_redirects``
times. Commands that name no key (admin, ``scan``, ``command(...)`` without a
key) go to the node it was given.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from tenantkv import errors
from tenantkv.client.core import Call, Commands
from tenantkv.client.servers import Address
from tenantkv.client.sync_client import Client
from tenantkv.cluster.slots import key_slot

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


class ClusterClient(Commands):
    """Every command of :class:`~tenantkv.client.core.Commands`, routed by the map.
    ``kwargs`` are :class:`~tenantkv.client.sync_client.Client`'s (user,
    password, bucket, timeouts, retry policy, TLS), used for every node."""

    def __init__(
        self, host: str, port: int, *, max_redirects: int = MAX_REDIRECTS, **kwargs: Any
    ) -> None:
        self._kwargs = kwargs
        self._seed: Address = (host, port)
        self._clients: dict[Address, Client] = {self._seed: Client(host, port, **kwargs)}
        self.max_redirects = max_redirects
        self.map_refreshes = 0
        try:
            self.map = self._read_map()
        except BaseException:
            self.close()
            raise

    # -- routing ----------------------------------------------------------------------

    def refresh_map(self) -> SlotMap:
        """Read the map again (from the node given, else any node known)."""
        self.map = self._read_map()
        self.map_refreshes += 1
        return self.map

    def _read_map(self) -> SlotMap:
        last: errors.TenantKVError | None = None
        for address in [self._seed, *(a for a in self._clients if a != self._seed)]:
            try:
                return SlotMap(self._client(address).command("cluster_map"))
            except errors.ConnectionClosed as exc:
                last = exc  # that node is gone: ask another
        assert last is not None
        raise last

    def _client(self, address: Address) -> Client:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = Client(address[0], address[1], **self._kwargs)
        return client

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        keys = _call_keys(call)
        if not keys:
            return self._clients[self._seed]._execute(call, op_timeout)
        for redirects in range(self.max_redirects + 1):
            try:
                if call.method == "mget" and len(keys) > 1:
                    return self._mget(call, keys, op_timeout)
                return self._send(self.map.node_of(keys[0]), call, op_timeout)
            except errors.NotMyPartition:
                if redirects == self.max_redirects:
                    raise
                self.refresh_map()  # the request did not run: resend by the new map
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, address: Address | None, call: Call[Any], op_timeout: float | None) -> Any:
        if address is None:
            raise errors.NodeUnavailable(f"{call.method}: the key's slot has no node in the map")
        return self._client(address)._execute(call, op_timeout)

    def _mget(self, call: Call[Any], keys: list[bytes], op_timeout: float | None) -> Any:
        """An mget split by node, answered in key order (``parse`` maps each record
        on its own, so the parts' results join)."""
        by_node: dict[Address | None, list[int]] = {}
        for i, key in enumerate(keys):
            by_node.setdefault(self.map.node_of(key), []).append(i)
        out: list[Any] = [None] * len(keys)
        for address, positions in by_node.items():
            part = Call(
                call.method,
                {**call.params, "keys": [keys[i] for i in positions]},
                call.parse,
                call.is_read,
                call.generic,
            )
            for i, value in zip(positions, self._send(address, part, op_timeout), strict=True):
                out[i] = value
        return out

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        for client in self._clients.values():
            client.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call_keys(call: Call[Any]) -> list[bytes]:
    """The keys a command names (``key`` or ``keys``), as bytes."""
    p = call.params
    found: Iterable[Any] = [p["key"]] if "key" in p else p.get("keys") or []
    return [k.encode() if isinstance(k, str) else k for k in found if isinstance(k, str | bytes)]
