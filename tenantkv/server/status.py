"""The node's status document: every figure an operator or ``/metrics`` reads.

One function, reading each part's statistics record; the document's shape is a
public interface (``tenantkv-admin status --json``, ``docs/operations.md``).
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tenantkv._version import __version__
from tenantkv.metric_catalog import Across, across_rules, bucket_maps
from tenantkv.metrics import quantile
from tenantkv.server.node import BucketStats, Node


class _Frozen:
    """What the process froze (:func:`gc.freeze`), counted once when it froze:
    ``gc.get_freeze_count()`` walks the whole frozen generation, tens of
    milliseconds on a busy machine, too dear for a document that a worker's
    supervisor reads every second."""

    count = 0


_frozen = _Frozen()


def gc_frozen() -> None:
    """The process has just called :func:`gc.freeze` (once, at start)."""
    _frozen.count = gc.get_freeze_count()


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
        # The other doors, as "host:port" (None: off): strings, so that merging
        # worker documents keeps them as they are.
        "resp_listening": f"{node.host}:{node.resp_port}" if node.resp_port else None,
        "metrics_listening": (
            f"{node.config.metrics_host}:{node.metrics_port}" if node.metrics_port else None
        ),
        "shutting_down": node.shutting_down,
        "connections": _connections(node),
        "gc": {
            "thresholds": list(gc.get_threshold()),
            "collections": [g["collections"] for g in gc.get_stats()],
            "frozen_objects": _frozen.count,
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
#
# How each figure combines across workers is declared in the metric catalog
# (``Metric.across``, ``STATUS_FIGURES``): the merge below walks the documents
# and the declarations together.


@dataclass(slots=True)
class _Rule:
    """A node of the declarations' tree: a path's rule and its children."""

    across: Across | None = None
    children: dict[str, _Rule] = field(default_factory=dict)

    def child(self, key: str) -> _Rule | None:
        return self.children.get(key) or self.children.get("*")


def _rules() -> _Rule:
    root = _Rule()
    for path, across in across_rules().items():
        at = root
        for key in path:
            at = at.children.setdefault(key, _Rule())
        at.across = across
    return root


_RULES = _rules()
_BUCKET_MAPS = bucket_maps()
#: Rules whose figures keep counting after a worker dies (its last counts stay).
_CUMULATIVE = frozenset({"total", "histogram"})
_QUANTILES = {"p50": 0.5, "p99": 0.99}


def node_document(
    workers: list[dict[str, Any]],
    node: dict[str, Any],
    retired: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``server_status`` of ``serve --workers N``: every worker's document
    merged as the metric catalog declares, plus ``workers``, a line per worker.
    ``node`` is the supervisor's part of the document (the figures declared
    ``node``: its connection table, login limiter, writer, allocator);
    ``retired`` the counts of workers that died (:func:`retire`)."""
    docs = sorted(workers, key=lambda d: d.get("worker", 0))
    live = set().union(*(d.get("buckets", {}) for d in docs))
    merged = _merge(docs, _RULES, node, _prune(retired or {}, live))
    merged.pop("worker", None)
    merged["pid"] = node.get("pid", os.getppid())  # the supervisor: the process to signal
    merged["workers"] = [_worker_line(d) for d in docs]
    return merged


def _worker_line(d: dict[str, Any]) -> dict[str, Any]:
    return {
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


def retire(retired: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``retired`` plus the counts of a worker that died (its last document): what
    the node's counters keep so that they never go back."""
    return _retire(retired, doc, _RULES, None) or {}


def undeclared(doc: dict[str, Any]) -> list[str]:
    """The figures of ``doc`` with no declaration of how they combine (a test
    keeps this empty)."""
    out: list[str] = []

    def walk(value: Any, rule: _Rule | None, path: tuple[str, ...]) -> None:
        if rule is not None and rule.across is not None:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, rule.child(k) if rule else None, (*path, str(k)))
        else:
            out.append(".".join(path))

    walk(doc, _RULES, ())
    return out


def _merge(values: list[Any], rule: _Rule | None, node: Any, retired: Any) -> Any:
    across = rule.across if rule is not None else None
    if across == "node" and node is not None:
        return node
    first = values[0] if values else retired
    if across in ("same", "first", "node") or (across is None and not isinstance(first, dict)):
        return first  # "node" here: the supervisor has no figure of its own for it
    if isinstance(first, dict):
        dicts = [v for v in values if isinstance(v, dict)]
        keys = dict.fromkeys(k for d in dicts for k in d)
        if isinstance(retired, dict) and (across is None or across in _CUMULATIVE):
            keys.update(dict.fromkeys(retired))
        out = {}
        for k in keys:
            sub = rule.child(k) if rule is not None and across is None else rule
            out[k] = _merge(
                [d[k] for d in dicts if k in d],
                sub,
                node.get(k) if isinstance(node, dict) else None,
                retired.get(k) if isinstance(retired, dict) else None,
            )
        _quantiles(out, rule if across is None else None)
        return out
    return _leaf(values, across, retired)


def _leaf(values: list[Any], across: Across | None, retired: Any) -> Any:
    if across == "histogram":
        return _add_histograms([*values, *([retired] if retired is not None else [])])
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if across == "any":
        return any(values)
    if not numbers or len(numbers) < len(values):
        return values[0] if values else retired  # "unlimited", None: not a number to add
    if across == "max":
        return max(numbers)
    total = sum(numbers)
    if across == "total" and isinstance(retired, int | float):
        total += retired
    return total


def _quantiles(merged: dict[str, Any], rule: _Rule | None) -> None:
    """Percentiles from the merged histogram beside them, never from the workers'."""
    pairs = merged.get("histogram_us")
    if rule is None or not isinstance(pairs, list):
        return
    for k, sub in rule.children.items():
        q = _QUANTILES.get(sub.across or "")
        if q is not None:
            p = quantile(pairs, q)
            merged[k] = None if p is None else round(p)


def _add_histograms(histograms: list[Any]) -> Any:
    """``[[bound, count], ...]`` added bound by bound (the bounds are the same)."""
    pairs = [h for h in histograms if isinstance(h, list)]
    if not pairs:
        return histograms[0] if histograms else None
    return [[pair[0], sum(h[i][1] for h in pairs)] for i, pair in enumerate(pairs[0])]


def _retire(retired: Any, doc: Any, rule: _Rule | None, across: Across | None) -> Any:
    """``retired`` plus ``doc``'s cumulative figures (their shape kept)."""
    if rule is not None and rule.across is not None:
        across = rule.across
    if isinstance(doc, dict):
        out = dict(retired) if isinstance(retired, dict) else {}
        for k, v in doc.items():
            sub = rule.child(k) if rule is not None else None
            kept = _retire(out.get(k), v, sub, across)
            if kept is not None:
                out[k] = kept
        return out or None
    if across == "histogram":
        return _add_histograms([h for h in (retired, doc) if h is not None])
    if across == "total" and isinstance(doc, int | float) and not isinstance(doc, bool):
        return (retired if isinstance(retired, int | float) else 0) + doc
    return None


def _prune(retired: dict[str, Any], live: set[str]) -> dict[str, Any]:
    """Drop the retired counts of buckets that are gone (dropped)."""
    out = dict(retired)
    for path in _BUCKET_MAPS:
        at: Any = out
        for key in path[:-1]:
            at = at.get(key) if isinstance(at, dict) else None
        if isinstance(at, dict) and isinstance(at.get(path[-1]), dict):
            at[path[-1]] = {b: v for b, v in at[path[-1]].items() if b in live}
    return out
