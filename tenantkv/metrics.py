"""Prometheus metrics, computed on scrape from the same numbers as ``server_status``.

One ``CollectorRegistry`` per server. The HTTP endpoint runs on its own thread
(prometheus-client's WSGI server); at each scrape it asks the Trio loop for a
snapshot with ``trio.from_thread.run_sync`` — a few microseconds on the loop,
and the loop never waits on the scrape. Nothing is counted twice: the metrics
are a view of the counters the gates and the writer already keep.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tenantkv.server.node import Node


class NodeCollector(Collector):
    def __init__(self, node: Node, token: trio.lowlevel.TrioToken) -> None:
        self.node = node
        self.token = token

    def _snapshot(self) -> dict[str, Any]:
        try:
            return trio.from_thread.run_sync(self.node.status, trio_token=self.token)
        except trio.RunFinishedError:
            return {}

    def collect(self) -> Iterator[Any]:
        st = self._snapshot()
        if not st:
            return
        yield from node_metrics(st)
        if "throttle" in st:
            yield from throttle_metrics(st["throttle"])
        for gate in GATE_SECTIONS:
            if gate in st:
                yield from section_metrics(f"tenantkv_{gate}", st[gate])


def node_metrics(st: dict[str, Any]) -> Iterator[Any]:
    conns = st["connections"]
    g = GaugeMetricFamily("tenantkv_connections", "Open client connections.")
    g.add_metric([], conns["current"])
    yield g
    c = CounterMetricFamily("tenantkv_connections_created", "Connections accepted.")
    c.add_metric([], conns["total_created"])
    yield c
    c = CounterMetricFamily("tenantkv_connections_rejected", "Connections refused at the door.")
    c.add_metric([], conns["rejected"])
    yield c
    g = GaugeMetricFamily(
        "tenantkv_connections_backpressure",
        "Connections whose client declared backpressure support.",
    )
    g.add_metric([], conns["backpressure"])
    yield g
    g = GaugeMetricFamily("tenantkv_uptime_seconds", "Seconds since the server started.")
    g.add_metric([], st["uptime_secs"])
    yield g

    storage = st["storage"]
    g = GaugeMetricFamily("tenantkv_storage_map_size_bytes", "LMDB map size.")
    g.add_metric([], storage["map_size_bytes"])
    yield g
    g = GaugeMetricFamily("tenantkv_storage_used_bytes", "LMDB pages in use, in bytes.")
    g.add_metric([], storage["used_bytes"])
    yield g
    w = storage["writer"]
    g = GaugeMetricFamily(
        "tenantkv_writer_queue_length", "Writes queued and not yet committed (write lag)."
    )
    g.add_metric([], w["queued"])
    yield g
    for name, key, doc in (
        ("tenantkv_writer_batches", "batches", "Group-commit transactions committed."),
        ("tenantkv_writer_ops_committed", "ops_committed", "Writes committed."),
        (
            "tenantkv_writer_commit_seconds",
            "commit_seconds_total",
            "Time spent applying and committing batches (incl. fsync).",
        ),
        ("tenantkv_writer_failed_batches", "failed_batches", "Batches that failed as a whole."),
        ("tenantkv_writer_map_grows", "map_grows", "Times the LMDB map was grown."),
    ):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], w[key])
        yield c

    entries = GaugeMetricFamily(
        "tenantkv_bucket_entries",
        "Records stored (incl. expired ones not yet reclaimed).",
        labels=["bucket"],
    )
    ops = CounterMetricFamily(
        "tenantkv_ops", "Operations completed successfully.", labels=["bucket", "operation"]
    )
    errs = CounterMetricFamily(
        "tenantkv_op_errors", "Operations that ended in an error.", labels=["bucket", "code_name"]
    )
    bconns = GaugeMetricFamily(
        "tenantkv_bucket_connections", "Connections using the bucket.", labels=["bucket"]
    )
    for bucket, b in st["buckets"].items():
        entries.add_metric([bucket], b["entries"])
        bconns.add_metric([bucket], b["connections"])
        for op, n in b["ops"].items():
            ops.add_metric([bucket, op], n)
        for code, n in b["errors"].items():
            errs.add_metric([bucket, code], n)
    yield from (entries, ops, errs, bconns)


def _number(value: Any) -> float | None:
    """A status value as a metric value: "unlimited" is -1, booleans 0/1."""
    if value == "unlimited":
        return -1.0
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


def throttle_metrics(t: dict[str, Any]) -> Iterator[Any]:
    """The tenant throttle section: node values, then per-bucket values by label.

    Names follow the status keys (``tenantkv_throttle_node_<key>``,
    ``tenantkv_throttle_bucket_<key>``); ``*_total`` keys are counters; limits
    that are "unlimited" read -1.
    """
    for key, value in t.get("node", {}).items():
        v = _number(value)
        if v is None:
            continue
        if key.endswith("_total"):
            m: Any = CounterMetricFamily(f"tenantkv_throttle_node_{key[:-6]}", f"Node {key}.")
        else:
            m = GaugeMetricFamily(f"tenantkv_throttle_node_{key}", f"Node {key} (-1 = unlimited).")
        m.add_metric([], v)
        yield m
    families: dict[str, Any] = {}
    hist = HistogramMetricFamily(
        "tenantkv_throttle_wait_seconds", "Time throttled requests waited.", labels=["bucket"]
    )
    for bucket, b in t.get("buckets", {}).items():
        for key, value in b.items():
            if key == "wait_histogram_us":
                cumulative, buckets = 0, []
                for le, n in value:
                    cumulative += n
                    buckets.append(("+Inf" if le == "+Inf" else str(le / 1e6), cumulative))
                hist.add_metric([bucket], buckets, b.get("throttle_wait_micros_total", 0) / 1e6)
                continue
            v = _number(value)
            if v is None:
                continue
            m = families.get(key)
            if m is None:
                if key.endswith("_total"):
                    m = CounterMetricFamily(
                        f"tenantkv_throttle_bucket_{key[:-6]}", f"Bucket {key}.", labels=["bucket"]
                    )
                else:
                    m = GaugeMetricFamily(
                        f"tenantkv_throttle_bucket_{key}",
                        f"Bucket {key} (-1 = unlimited).",
                        labels=["bucket"],
                    )
                families[key] = m
            m.add_metric([bucket], v)
    yield from families.values()
    yield hist


#: status sections exported by :func:`section_metrics` (one per admission gate)
GATE_SECTIONS = ("ingress", "bucket_queues", "write_permits", "execution")

#: statistics that only grow, exported as counters (the rest are gauges)
COUNTER_KEYS = frozenset(
    {
        "added_to_queue",
        "removed_from_queue",
        "started_processing",
        "finished_processing",
        "total_time_processing_micros",
        "total_time_queued_micros",
        "canceled",
        "new_admissions",
        "times_probed_stable",
        "times_probed_up",
        "times_probed_down",
        "times_increased",
        "times_decreased",
        "total_amount_increased",
        "total_amount_decreased",
        "attempted",
        "successful",
        "rejected",
        "exempted",
        "interrupted_in_queue",
        "admitted",
        "queued_total",
        "rejected_overflow",
        "rejected_timeout",
        "interrupted",
        "granted",
        "waited",
        "evaluations",
        "adjustments",
        "events_delivered",
        "events_dropped",
    }
)


def section_metrics(prefix: str, section: dict[str, Any]) -> Iterator[Any]:
    """Every number in a gate's status section, named by its path:
    ``{"read": {"out": 3}}`` under ``tenantkv_execution`` is ``tenantkv_execution_read_out``.
    Entries under a ``buckets`` map become a ``bucket`` label, and a
    ``wait_histogram_us`` list of ``[upper bound µs, count]`` a histogram in seconds."""
    families: dict[str, Any] = {}
    for path, labels, value in _leaves(section, (), {}):
        key = path[-1]
        name = "_".join((prefix, *path))
        names = sorted(labels)
        if key == "wait_histogram_us" and isinstance(value, list):
            name = name.removesuffix("_us") + "_seconds"
            fam = families.get(name) or families.setdefault(
                name, HistogramMetricFamily(name, f"{prefix}: wait time", labels=names)
            )
            cumulative, buckets = 0, []
            for le, n in value:
                cumulative += n
                buckets.append(("+Inf" if le == "+Inf" else str(le / 1e6), cumulative))
            fam.add_metric([labels[k] for k in names], buckets, None)
            continue
        v = _number(value)
        if v is None:
            continue
        if key in COUNTER_KEYS or key.endswith("_total"):
            name = name.removesuffix("_total")
            fam = families.get(name) or families.setdefault(
                name, CounterMetricFamily(name, f"{prefix}: {'.'.join(path)}", labels=names)
            )
        else:
            fam = families.get(name) or families.setdefault(
                name, GaugeMetricFamily(name, f"{prefix}: {'.'.join(path)}", labels=names)
            )
        fam.add_metric([labels[k] for k in names], v)
    yield from families.values()


def _leaves(
    d: dict[str, Any], path: tuple[str, ...], labels: dict[str, str]
) -> Iterator[tuple[tuple[str, ...], dict[str, str], Any]]:
    for k, v in d.items():
        if k == "buckets" and isinstance(v, dict):
            for bucket, sub in v.items():
                if isinstance(sub, dict):
                    yield from _leaves(sub, path, {**labels, "bucket": str(bucket)})
        elif isinstance(v, dict):
            yield from _leaves(v, (*path, str(k)), labels)
        else:
            yield (*path, str(k)), labels, v


def start_metrics_server(node: Node, port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` on ``addr:port`` (0 = any free port); returns the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, trio.lowlevel.current_trio_token()))
    httpd, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(httpd.server_port)
