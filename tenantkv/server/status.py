"""The node's status document: every figure an operator or ``/metrics`` reads.

One function, reading each part's statistics record; the document's shape is a
public interface (``tenantkv-admin status --json``, ``docs/operations.md``).
"""

from __future__ import annotations

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
    buckets: dict[str, Any] = {}
    for name in sorted(node.engine.buckets):
        st = node.bucket_stats.get(name) or BucketStats()
        buckets[name] = {
            "entries": node.engine.bucket_entries(name),
            "connections": sum(1 for s in node.sessions if s.bucket == name),
            "ops": dict(st.ops),
            "errors": dict(st.errors),
        }
    return {
        "version": __version__,
        "pid": os.getpid(),
        "uptime_secs": round(time.monotonic() - node.started_monotonic, 3),
        "listening": f"{node.host}:{node.port}",
        "shutting_down": node.shutting_down,
        "connections": {
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
        },
        "storage": {
            "path": node.engine.path,
            "map_size_bytes": size,
            "used_bytes": used,
            "durability": node.config.durability,
            "writer": node.writer.statistics(),
        },
        "buckets": buckets,
        "users": len(node.accounts.users),
        "latency": node.latency.status(),
        "authentication": node.accounts.login_statistics(),
        "throttle": gates.throttle.as_dict(),
        "ingress": {
            "request_rate_limiter": {
                "enabled": pipeline.request_rate_enabled,
                **gates.request_rate.as_dict(),
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
