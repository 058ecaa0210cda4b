"""The node's status document: every figure an operator or ``/metrics`` reads.

One function, reading each part's statistics record; the document's shape is a
public interface (``tenantkv-admin status --json``, ``docs/operations.md``).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from tenantkv._version import __version__
from tenantkv.server.node import BucketStats, Node


def status_document(node: Node) -> dict[str, Any]:
    """The ``server_status`` document (``tenantkv-admin status``, ``/metrics``)."""
    used, size = node.engine.map_usage()
    pipeline = node.pipeline
    gates = pipeline.statistics()
    return {
        "version": __version__,
        **node.role.identity(),
        **node.role.figures(),
        "pid": os.getpid(),
        "uptime_secs": round(time.monotonic() - node.started_monotonic, 3),
        "listening": f"{node.host}:{node.port}",
        "shutting_down": node.shutting_down,
        "connections": _connections(node),
        "gc": {
            "thresholds": list(gc.get_threshold()),
            "collections": [g["collections"] for g in gc.get_stats()],
            "frozen_objects": gc.get_freeze_count(),
        },
        "storage": {
            "path": node.engine.path,
            "map_size_bytes": size,
            "used_bytes": used,
            "durability": node.config.durability,
            "writer": node.writer.statistics(),
        },
        "buckets": _buckets(node),
        "users": len(node.accounts.users),
        "latency": node.latency.status(),
        "authentication": node.accounts.login_statistics(),
        "throttle": gates.throttle.as_dict(),
        "ingress": {
            "request_rate_limiter": {
                "enabled": pipeline.request_rate_enabled,
                **gates.request_rate.as_dict(),
                "refusal_pauses": node.refusal_pauses,
            },
            "connection_establishment": {
                "enabled": node.config.ingress_connection_establishment_rate_limiter_enabled,
                **node.connection_limiter.statistics().as_dict(),
                "interrupted_due_to_client_disconnect": node.connections_left_in_queue,
            },
            "admission": {
                "enabled": pipeline.ingress_enabled,
                **gates.ingress.as_dict(),
            },
        },
        "bucket_queues": {
            "enabled": pipeline.queues_enabled,
            **gates.bucket_queues.as_dict(),
        },
        "write_permits": {
            "enabled": pipeline.permits_enabled,
            **gates.write_permits.as_dict(),
        },
        "execution": {
            "read": gates.read_tickets.as_dict(),
            "write": gates.write_tickets.as_dict(),
            "probing": node.prober.statistics().as_dict(),
        },
    }


def _connections(node: Node) -> dict[str, Any]:
    return {
        "current": len(node.sessions),
        "total_created": node.connections_total,
        "rejected": node.connections_rejected,
        "backpressure": sum(1 for s in node.sessions if s.backpressure),
        "by_protocol": {
            proto: sum(1 for s in node.sessions if s.protocol_name == proto)
            for proto in ("msgpack", "resp")
        },
        "max": node.config.max_connections,
        "max_per_address": node.config.max_connections_per_address,
        "admin_reserved": node.config.admin_reserved_connections,
        "table": node.connection_table.statistics().as_dict(),
        "receive_buffers": node.receive_buffers.statistics().as_dict(),
    }


def _buckets(node: Node) -> dict[str, Any]:
    buckets: dict[str, Any] = {}
    for name in sorted(node.engine.buckets):
        st = node.bucket_stats.get(name) or BucketStats()
        buckets[name] = {
            "entries": node.engine.bucket_entries(name),
            "connections": sum(1 for s in node.sessions if s.bucket == name),
            "ops": dict(st.ops),
            "errors": dict(st.errors),
        }
    return buckets


# -- serve --workers N: one document for the node --------------------------------------

#: Leaves that are the same on every worker (settings, the shared LMDB
#: environment): the node's value is any worker's (the largest, for the ones
#: that move). Every other number is a count or a level of one worker's part of
#: the node, and the node's figure is their sum.
_SHARED_LEAVES = frozenset(
    {
        "uptime_secs",
        "map_size_bytes",
        "used_bytes",
        "entries",
        "users",
        "max",
        "max_per_address",
        "admin_reserved",
        "default_throttle_reserved_units",
        "default_throttle_hard_limit",
        "write_weight",
        "slice_ms",
        "throttle_max_wait_ms",
        "reservation_scale",
        "reserved",
        "hard_limit",
        "weight",
        "burst_capacity_secs",
        "p50_micros",
        "p99_micros",
        "average_time_queued_micros",
        "last_commit_micros",
        "last_batch_ops",
        "max_batch_ops",
    }
)
#: Leaves named so are settings of a gate: the same on every worker.
_SHARED_PREFIXES = ("bucket_queue_", "write_permit_", "login_")
#: Whole sections that are settings, not counters.
_SHARED_PATHS = frozenset({("throttle", "node", "capacity"), ("latency", "bounds_us")})


def node_document(workers: list[dict[str, Any]], node: dict[str, Any]) -> dict[str, Any]:
    """The ``server_status`` of ``serve --workers N``: every worker's document
    merged into node totals, plus ``workers``, a line per worker. ``node`` is
    what the supervisor holds for the node: the connection table, the writer
    and its commit latency."""
    docs = sorted(workers, key=lambda d: d.get("worker", 0))
    merged = _merge(docs, ())
    merged["connections"]["table"] = node.get("connection_table", {})
    # the login limiter is the supervisor's (the workers' settings, its figures)
    merged["authentication"] = {**merged.get("authentication", {}), **node.get("login", {})}
    merged["storage"]["writer"] = node.get("writer", {})
    if "commit_latency" in node:
        merged["latency"]["commit"] = node["commit_latency"]
    merged.pop("worker", None)
    merged["pid"] = os.getppid()  # the supervisor: the process to signal
    merged["workers"] = [
        {
            "worker": d.get("worker"),
            "pid": d.get("pid"),
            "uptime_secs": d.get("uptime_secs"),
            "connections": d.get("connections", {}).get("current", 0),
            "ops": sum(sum(b.get("ops", {}).values()) for b in d.get("buckets", {}).values()),
            # the worker's writes sent to the node's writer, and those answered
            "write_messages": d.get("storage", {}).get("writer", {}).get("batches", 0),
            "writes_done": d.get("storage", {}).get("writer", {}).get("ops_committed", 0),
            "leases": d.get("leases", {}),
        }
        for d in docs
    ]
    return merged


def _merge(values: list[Any], path: tuple[str, ...]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        keys: dict[str, None] = {}
        for v in values:
            if isinstance(v, dict):
                keys.update(dict.fromkeys(v))
        return {
            k: _merge([v[k] for v in values if isinstance(v, dict) and k in v], (*path, k))
            for k in keys
        }
    if path in _SHARED_PATHS or (
        path and (path[-1] in _SHARED_LEAVES or path[-1].startswith(_SHARED_PREFIXES))
    ):
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        return max(numbers) if len(numbers) == len(values) else first
    if isinstance(first, bool):
        return any(values) if path[-1:] == ("shutting_down",) else first
    if isinstance(first, int | float):
        return sum(v for v in values if isinstance(v, int | float))
    if isinstance(first, list) and all(_is_histogram(v) for v in values):
        # [[bound, count], ...]: the same bounds everywhere; counts add up.
        return [[pair[0], sum(v[i][1] for v in values)] for i, pair in enumerate(first)]
    return first


def _is_histogram(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[1], int) for p in v
    )
