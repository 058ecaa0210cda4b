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


def throttle_metrics(t: dict[str, Any]) -> Iterator[Any]:
    """Metrics of the tenant throttle's ``statistics()`` section."""
    node = t.get("node", {})
    cap = node.get("capacity")
    g = GaugeMetricFamily(
        "tenantkv_throttle_node_capacity_units",
        "Node capacity in units per second (-1 = unlimited).",
    )
    g.add_metric([], -1 if cap in (None, "unlimited") else cap)
    yield g
    for key, value in node.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "capacity":
            kind = CounterMetricFamily if key.endswith("_total") else GaugeMetricFamily
            name = key[: -len("_total")] if key.endswith("_total") else key
            m = kind(f"tenantkv_throttle_node_{name}", f"Tenant throttle node {key}.")
            m.add_metric([], value)
            yield m
    families: dict[str, Any] = {}
    for bucket, b in t.get("buckets", {}).items():
        for key, value in b.items():
            if key in ("reserved", "hard_limit"):
                value = -1 if value in (None, "unlimited") else value
            if key == "wait_histogram" and isinstance(value, dict):
                h = families.get(key)
                if h is None:
                    h = families[key] = HistogramMetricFamily(
                        "tenantkv_throttle_wait_seconds",
                        "Time throttled requests waited.",
                        labels=["bucket"],
                    )
                h.add_metric([bucket], value["buckets"], value["sum_seconds"])
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            m = families.get(key)
            if m is None:
                kind = CounterMetricFamily if key.endswith("_total") else GaugeMetricFamily
                name = key[: -len("_total")] if key.endswith("_total") else key
                m = families[key] = kind(
                    f"tenantkv_throttle_bucket_{name}",
                    f"Tenant throttle per-bucket {key} (-1 = unlimited).",
                    labels=["bucket"],
                )
            m.add_metric([bucket], value)
    yield from families.values()


def start_metrics_server(node: Node, port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` on ``addr:port`` (0 = any free port); returns the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, trio.lowlevel.current_trio_token()))
    httpd, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(httpd.server_port)
