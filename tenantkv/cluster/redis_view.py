"""The cluster map in Redis Cluster's shapes (``CLUSTER SLOTS|SHARDS|NODES|INFO``).

Addresses are the nodes' RESP ports (a Redis client talks RESP). Every node is
a master with no replicas yet; a node the map marks down is shown as Redis
shows a failed master (``fail`` in NODES, health ``fail`` in SHARDS), its
slots still its own.
"""

from __future__ import annotations

from typing import Any

from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo
from tenantkv.cluster.membership import Member
from tenantkv.cluster.routing import node_id
from tenantkv.cluster.slots import SLOTS, key_slot


def keyslot(key: bytes) -> int:
    return key_slot(key)


def answer(sub: str, member: Member) -> Any:
    m, me = member.map, member.me.name
    if sub == "myid":
        return node_id(me)
    if sub == "slots":
        return slots(m)
    if sub == "shards":
        return shards(m)
    if sub == "nodes":
        return nodes(m, me)
    return info(m, member)


def _port(info: NodeInfo) -> int:
    return info.resp_port or info.port


def slots(m: ClusterMap) -> list[list[Any]]:
    """``CLUSTER SLOTS``: ``[start, end, [host, port, id]]`` per range."""
    out: list[list[Any]] = []
    for r in m.ranges:
        info = m.nodes.get(r.node)
        if info is not None:
            out.append([r.start, r.end, [info.host, _port(info), node_id(r.node)]])
    return out


def shards(m: ClusterMap) -> list[dict[str, Any]]:
    """``CLUSTER SHARDS``: a shard per node: its slot ranges and its one node."""
    out: list[dict[str, Any]] = []
    for name, info in sorted(m.nodes.items()):
        ranges = [x for r in m.ranges if r.node == name for x in (r.start, r.end)]
        node = {
            "id": node_id(name),
            "port": _port(info),
            "ip": info.host,
            "endpoint": info.host,
            "role": "master",
            "replication-offset": 0,
            "health": "online" if info.up else "fail",
        }
        out.append({"slots": ranges, "nodes": [node]})
    return out


def nodes(m: ClusterMap, me: str) -> str:
    """``CLUSTER NODES``: Redis's line per node (the bus port shown is the RESP port
    plus 10000, as Redis's default; nothing listens there)."""
    lines = []
    for name, info in sorted(m.nodes.items()):
        flags = ("myself," if name == me else "") + "master" + ("" if info.up else ",fail")
        ranges = " ".join(
            f"{r.start}-{r.end}" if r.start != r.end else str(r.start)
            for r in m.ranges
            if r.node == name
        )
        port = _port(info)
        state = "connected" if info.up else "disconnected"
        line = (
            f"{node_id(name)} {info.host}:{port}@{port + 10000},{name} {flags} - 0 0 "
            f"{m.version} {state}"
        )
        lines.append(f"{line} {ranges}" if ranges else line)
    return "".join(line + "\n" for line in lines)


def info(m: ClusterMap, member: Member) -> str:
    """``CLUSTER INFO``: the state (``ok`` when every slot has a node that is up)."""
    served = sum(len(r) for r in m.ranges if m.nodes.get(r.node, None) and m.nodes[r.node].up)
    fields = {
        "cluster_state": "ok" if served == SLOTS and member.lease_valid() else "fail",
        "cluster_slots_assigned": m.assigned(),
        "cluster_slots_ok": served,
        "cluster_slots_pfail": 0,
        "cluster_slots_fail": m.assigned() - served,
        "cluster_known_nodes": len(m.nodes),
        "cluster_size": sum(1 for n in m.nodes if m.slots_of(n)),
        "cluster_current_epoch": m.version,
        "cluster_my_epoch": m.version,
    }
    return "".join(f"{k}:{v}\r\n" for k, v in fields.items())
