"""``cluster-status``'s totals: operations, units and keys per node and summed.

Each node counts what it serves; the cluster's figure is the sum. The node
asked gives its own status; every other node of the map that is up is asked
over its main port (the address in the map) with the same login, so the
totals need nothing but the cluster's admin user. A node that is down or
cannot be reached has a row saying so and is left out of the sum (the sum says
how many nodes it covers).
"""

from __future__ import annotations

from typing import Any

import tenantkv
from tenantkv import errors

from . import format as fmt

#: The figures summed, with their column heads.
FIGURES: tuple[tuple[str, str], ...] = (
    ("ops", "ops"),
    ("read_units", "read units"),
    ("write_units", "write units"),
    ("keys", "keys"),
)


def node_figures(status: dict[str, Any]) -> dict[str, int]:
    """One node's figures from its ``server_status``: operations served and keys
    held (all buckets), read and write units charged."""
    buckets = status.get("buckets") or {}
    throttle = (status.get("throttle") or {}).get("node") or {}
    return {
        "ops": sum(sum((b.get("ops") or {}).values()) for b in buckets.values()),
        "read_units": int(throttle.get("ru_total", 0)),
        "write_units": int(throttle.get("wu_total", 0)),
        "keys": sum(int(b.get("entries", 0)) for b in buckets.values()),
    }


def node_status(c: tenantkv.Client, address: str) -> dict[str, Any]:
    """The status of the node at ``address`` (``host:port``), logged in as ``c`` is."""
    host, _, port = address.rpartition(":")
    with tenantkv.Client(
        host,
        int(port),
        user=c._user,
        password=c._password,
        timeout=c.timeout,
        connect_timeout=c.connect_timeout,
        client_name=c._client_name,
        tls=c.ssl_context or False,
    ) as other:
        status: dict[str, Any] = other.server_status()
        return status


def cluster_totals(
    c: tenantkv.Client, own: dict[str, Any], cluster: dict[str, Any]
) -> dict[str, Any]:
    """``{"nodes": {name: figures | {"error": why}}, "cluster": sums, "nodes_counted": n}``;
    ``own`` is the status of the node ``c`` is connected to, ``cluster`` its section."""
    nodes: dict[str, Any] = {}
    for name, n in (cluster.get("map") or {}).get("nodes", {}).items():
        if name == cluster.get("node"):
            nodes[name] = node_figures(own)
        elif not n.get("up"):
            nodes[name] = {"error": "down"}
        else:
            try:
                nodes[name] = node_figures(node_status(c, n["address"]))
            except errors.TenantKVError as exc:
                nodes[name] = {"error": f"{exc.code_name}: {exc.errmsg}"}
    counted = [f for f in nodes.values() if "error" not in f]
    sums = {key: sum(f[key] for f in counted) for key, _ in FIGURES}
    return {"nodes": nodes, "cluster": sums, "nodes_counted": len(counted)}


def totals_text(totals: dict[str, Any]) -> str:
    """A row per node (a node not counted says why) and the cluster's sum."""
    rows = [_row(name, f) for name, f in totals["nodes"].items()]
    counted = f"cluster ({totals['nodes_counted']} of {len(totals['nodes'])} nodes)"
    rows.append(_row(counted, totals["cluster"]))
    return fmt.table(["node", *(head for _, head in FIGURES)], rows)


def _row(name: str, figures: dict[str, Any]) -> list[Any]:
    if "error" in figures:
        return [name, figures["error"], *([""] * (len(FIGURES) - 1))]
    return [name, *(figures[key] for key, _ in FIGURES)]
