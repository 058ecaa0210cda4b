"""Where a cluster client sends a call, sans-IO: the map as a client needs it
(slot → node address), the plan of a call (whole to its key's node, or an
``mget`` of several nodes' keys as a part per node) and the answer joined
from the parts. :mod:`tenantkv.client.cluster` (a call at a time) and
:mod:`tenantkv.client.cluster_pipeline` (batches per node) share it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from tenantkv import errors
from tenantkv.client.core import Call
from tenantkv.client.servers import Address
from tenantkv.cluster.slots import key_slot


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


def _call_keys(call: Call[Any]) -> list[bytes]:
    """The keys a command names (``key`` or ``keys``), as bytes."""
    p = call.params
    found: Iterable[Any] = [p["key"]] if "key" in p else p.get("keys") or []
    return [k.encode() if isinstance(k, str) else k for k in found if isinstance(k, str | bytes)]
