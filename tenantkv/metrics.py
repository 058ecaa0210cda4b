"""Prometheus metrics, computed on scrape from the same numbers as ``server_status``.

One ``CollectorRegistry`` per server. The HTTP endpoint runs on its own thread
(prometheus-client's WSGI server); at each scrape it asks the Trio loop for a
snapshot with ``trio.from_thread.run_sync`` — a few microseconds on the loop,
and the loop never waits on the scrape. Nothing is counted twice: the metrics
are a view of the counters the gates and the writer already keep.

Two recorders live here because nothing else keeps their numbers:

- :class:`OpLatency`, a latency histogram per (bucket, operation), observed by
  the session once per completed operation. ``observe`` is one dict lookup, one
  ``bisect`` into fixed bounds and two list increments (~0.15 µs, measured in
  ``tests/unit/test_metrics.py``): no lock, no prometheus object on the hot path.
- :class:`CommitHistograms`, the group-commit writer's batch size and commit
  (fsync) latency, fed by a ``GroupCommitWriter.observers`` callback on the
  writer thread. Only that thread writes the lists; a reader copies them (a
  torn read is off by one batch at most, never corrupt).

:class:`Latency` holds both; the node owns one and puts
:meth:`Latency.status` in the status document as its ``latency`` section,
which ``tenantkv-admin top`` reads and the collector exports.

Every metric is listed with its meaning in ``docs/metrics.md`` (a test checks
the list against a live scrape).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from tenantkv import errors

if TYPE_CHECKING:
    from tenantkv.storage.group_commit import GroupCommitWriter

#: Where the collector reads from: the node's status document (``Node.status``).
#: A callable, not the node, so metrics depend on a document, not on the server.
StatusSource = Callable[[], dict[str, Any]]

#: Upper bounds (µs) of the operation and commit latency histograms: 10 µs (an
#: inline read) to 5 s (a write stuck behind a slow disk), 1-2.5-5 steps.
LATENCY_BOUNDS_US: tuple[int, ...] = (
    10, 25, 50, 100, 250, 500,
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 5_000_000,
)  # fmt: skip
_LATENCY_BOUNDS_S: list[float] = [b / 1e6 for b in LATENCY_BOUNDS_US]
#: Upper bounds of the commit batch size histogram (operations per transaction;
#: the writer commits at most 2048).
BATCH_BOUNDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


# -- recorders (hot path) ---------------------------------------------------------


def _pairs(counts: Sequence[int], bounds: Sequence[int]) -> list[list[Any]]:
    """Per-bucket counts as the status document's ``[[upper bound, count], ...,
    ["+Inf", count]]`` (not cumulative, like every ``*_histogram_us`` there)."""
    return [[b, counts[i]] for i, b in enumerate(bounds)] + [["+Inf", counts[len(bounds)]]]


def quantile(pairs: Sequence[Sequence[Any]], q: float) -> float | None:
    """The ``q`` quantile of a ``[[upper bound, count], ..., ["+Inf", n]]`` histogram,
    interpolated linearly inside its bucket (as PromQL's ``histogram_quantile``);
    the last finite bound when it falls in ``+Inf``; None when empty."""
    total = sum(n for _, n in pairs)
    if total <= 0:
        return None
    rank = q * total
    seen, lower = 0, 0.0
    for le, n in pairs:
        if le == "+Inf":
            return lower
        if n and seen + n >= rank:
            return lower + (le - lower) * (rank - seen) / n
        seen += n
        lower = float(le)
    return lower


class OpLatency:
    """Latency of completed operations per (bucket, operation), on the Trio thread.

    ``observe`` is the only hot-path call. Counts live in plain lists, one per
    key: ``len(LATENCY_BOUNDS_US) + 1`` counts (the last is ``+Inf``), then the
    sum of seconds.
    """

    __slots__ = ("_hist",)

    def __init__(self) -> None:
        self._hist: dict[tuple[str, str], list[Any]] = {}

    def observe(self, bucket: str, op: str, seconds: float) -> None:
        h = self._hist.get((bucket, op))
        if h is None:
            h = self._hist[(bucket, op)] = [0] * (len(LATENCY_BOUNDS_US) + 1) + [0.0]
        h[bisect_left(_LATENCY_BOUNDS_S, seconds)] += 1
        h[-1] += seconds

    def observe_many(self, bucket: str, op: str, seconds: float, n: int) -> None:
        """``n`` operations that took ``seconds`` each (a received chunk's reads,
        timed together: one clock read and one update per chunk)."""
        h = self._hist.get((bucket, op))
        if h is None:
            h = self._hist[(bucket, op)] = [0] * (len(LATENCY_BOUNDS_US) + 1) + [0.0]
        h[bisect_left(_LATENCY_BOUNDS_S, seconds)] += n
        h[-1] += seconds * n

    def forget(self, bucket: str) -> None:
        """Drop a deleted bucket's histograms."""
        for key in [k for k in self._hist if k[0] == bucket]:
            del self._hist[key]

    def status(self) -> dict[str, dict[str, Any]]:
        """``{bucket: {op: {count, sum_micros, p50_micros, p99_micros, histogram_us}}}``."""
        out: dict[str, dict[str, Any]] = {}
        for (bucket, op), h in sorted(self._hist.items()):
            pairs = _pairs(h, LATENCY_BOUNDS_US)
            out.setdefault(bucket, {})[op] = _summary(pairs, h[-1])
        return out


def _summary(pairs: list[list[Any]], sum_secs: float) -> dict[str, Any]:
    p50, p99 = quantile(pairs, 0.5), quantile(pairs, 0.99)
    return {
        "count": sum(n for _, n in pairs),
        "sum_micros": round(sum_secs * 1e6),
        "p50_micros": None if p50 is None else round(p50),
        "p99_micros": None if p99 is None else round(p99),
        "histogram_us": pairs,
    }


class CommitHistograms:
    """Group-commit batches: operations per batch and commit time (apply + commit +
    fsync). :meth:`observe` is a ``GroupCommitWriter.observers`` callback and runs on
    the writer thread, the only writer of these lists."""

    __slots__ = ("batch_ops", "batch_ops_sum", "seconds", "seconds_sum")

    def __init__(self) -> None:
        self.seconds = [0] * (len(LATENCY_BOUNDS_US) + 1)
        self.seconds_sum = 0.0
        self.batch_ops = [0] * (len(BATCH_BOUNDS) + 1)
        self.batch_ops_sum = 0

    def observe(self, ops: int, seconds: float) -> None:
        self.seconds[bisect_left(_LATENCY_BOUNDS_S, seconds)] += 1
        self.seconds_sum += seconds
        self.batch_ops[bisect_left(BATCH_BOUNDS, ops)] += 1
        self.batch_ops_sum += ops

    def status(self) -> dict[str, Any]:
        seconds, ops = list(self.seconds), list(self.batch_ops)  # copies: the writer goes on
        return {
            **_summary(_pairs(seconds, LATENCY_BOUNDS_US), self.seconds_sum),
            "batch_ops_sum": self.batch_ops_sum,
            "batch_ops_histogram": _pairs(ops, BATCH_BOUNDS),
        }


class Latency:
    """What the node keeps for latency: :class:`OpLatency` (``op``) and
    :class:`CommitHistograms` (``commit``, registered with the writer here)."""

    __slots__ = ("commit", "observe", "observe_many", "op")

    def __init__(self, writer: GroupCommitWriter | None = None) -> None:
        self.op = OpLatency()
        self.commit = CommitHistograms()
        #: ``observe(bucket, op, seconds)``: :meth:`OpLatency.observe`, bound once
        #: so the session's call costs no extra frame.
        self.observe = self.op.observe
        self.observe_many = self.op.observe_many
        if writer is not None:
            writer.observers.append(self.commit.observe)

    def forget(self, bucket: str) -> None:
        self.op.forget(bucket)

    def status(self) -> dict[str, Any]:
        """The ``latency`` section of ``server_status``: bounds, then per bucket and
        operation (completed operations, server side: decode to reply), then commits."""
        return {
            "bounds_us": list(LATENCY_BOUNDS_US),
            "buckets": self.op.status(),
            "commit": self.commit.status(),
        }


class NodeCollector(Collector):
    def __init__(self, status: StatusSource, token: trio.lowlevel.TrioToken) -> None:
        self.status = status
        self.token = token

    def _snapshot(self) -> dict[str, Any]:
        try:
            return trio.from_thread.run_sync(self.status, trio_token=self.token)
        except trio.RunFinishedError:
            return {}

    def collect(self) -> Iterator[Any]:
        st = self._snapshot()
        if not st:
            return
        yield from status_metrics(st)


def status_metrics(st: dict[str, Any]) -> Iterator[Any]:
    """Every metric family, from one ``server_status`` document."""
    yield from node_metrics(st)
    yield from latency_metrics(st.get("latency") or {})
    if "throttle" in st:
        yield from throttle_metrics(st["throttle"])
    for gate in GATE_SECTIONS:
        if gate in st:
            yield from section_metrics(f"tenantkv_{gate}", st[gate])
    yield from gate_metrics(st)


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


def _buckets(pairs: Sequence[Sequence[Any]], scale: float) -> list[tuple[str, float]]:
    """``[[upper bound, count], ...]`` as Prometheus' cumulative ``(le, count)`` list;
    bounds divided by ``scale`` (1e6: µs to seconds)."""
    cumulative, out = 0, []
    for le, n in pairs:
        cumulative += n
        out.append(("+Inf" if le == "+Inf" else repr(le / scale), cumulative))
    return out


def latency_metrics(lat: dict[str, Any]) -> Iterator[Any]:
    """The ``latency`` section: per (bucket, operation) and the writer's commits.
    The families exist (empty) even before anything was observed."""
    ops = HistogramMetricFamily(
        "tenantkv_op_latency_seconds",
        "Latency of completed operations in the server (request decoded to reply "
        "queued; a write until durable), per bucket and operation.",
        labels=["bucket", "operation"],
    )
    for bucket, per in (lat.get("buckets") or {}).items():
        for op, h in per.items():
            ops.add_metric([bucket, op], _buckets(h["histogram_us"], 1e6), h["sum_micros"] / 1e6)
    yield ops
    commit = lat.get("commit")
    seconds = HistogramMetricFamily(
        "tenantkv_writer_commit_latency_seconds",
        "Time to apply and commit one group-commit batch, fsync included.",
    )
    batch = HistogramMetricFamily(
        "tenantkv_writer_batch_ops", "Operations committed per group-commit batch."
    )
    if commit:
        seconds.add_metric([], _buckets(commit["histogram_us"], 1e6), commit["sum_micros"] / 1e6)
        batch.add_metric([], _buckets(commit["batch_ops_histogram"], 1), commit["batch_ops_sum"])
    yield from (seconds, batch)


#: Error code names of a request a gate rejected before it ran (labelled
#: SystemOverloadedError; connection-level refusals are not per request).
OVERLOAD_CODE_NAMES: tuple[str, ...] = tuple(
    c.code_name
    for c in errors.error_classes().values()
    if errors.SYSTEM_OVERLOADED in c.default_labels and not c.fatal
)


def gate_metrics(st: dict[str, Any]) -> Iterator[Any]:
    """One view across the admission gates, labelled by ``gate`` (and ``bucket``
    where the gate is per bucket; empty for node-wide gates): how many requests
    each gate rejected and how many it made wait. The same numbers are in each
    gate's own families; these make "by gate" one query."""
    rejected = CounterMetricFamily(
        "tenantkv_gate_rejected",
        "Requests (or connections) a gate rejected, by gate and bucket.",
        labels=["gate", "bucket"],
    )
    delayed = CounterMetricFamily(
        "tenantkv_gate_delayed",
        "Requests (or connections) a gate made wait before admitting or rejecting them.",
        labels=["gate", "bucket"],
    )
    ingress = st.get("ingress") or {}
    for gate in ("connection_establishment", "request_rate_limiter"):
        sec = ingress.get(gate) or {}
        rejected.add_metric([gate, ""], sec.get("rejected", 0))
        delayed.add_metric([gate, ""], sec.get("added_to_queue", 0))
    auth = st.get("authentication")
    if auth is not None:
        rejected.add_metric(["login", ""], auth.get("refused", 0))
    adm = ingress.get("admission") or {}
    delayed.add_metric(["ingress_admission", ""], adm.get("added_to_queue", 0))
    for bucket, b in ((st.get("throttle") or {}).get("buckets") or {}).items():
        rejected.add_metric(["throttle", bucket], b.get("reject_count_total", 0))
        delayed.add_metric(["throttle", bucket], b.get("throttle_count_total", 0))
    for bucket, per in ((st.get("bucket_queues") or {}).get("buckets") or {}).items():
        classes = [c for c in per.values() if isinstance(c, dict)]
        rejected.add_metric(
            ["bucket_queue", bucket],
            sum(c.get("rejected_overflow", 0) + c.get("rejected_timeout", 0) for c in classes),
        )
        delayed.add_metric(["bucket_queue", bucket], sum(c.get("queued_total", 0) for c in classes))
    for bucket, b in ((st.get("write_permits") or {}).get("buckets") or {}).items():
        delayed.add_metric(["write_permit", bucket], b.get("waited", 0))
    execution = st.get("execution") or {}
    delayed.add_metric(
        ["execution", ""],
        sum((execution.get(p) or {}).get("added_to_queue", 0) for p in ("read", "write")),
    )
    yield from (rejected, delayed)


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
                hist.add_metric(
                    [bucket], _buckets(value, 1e6), b.get("throttle_wait_micros_total", 0) / 1e6
                )
                continue
            v = _number(value)
            if v is None:
                continue
            if "micros" in key:
                v /= 1e6
            m = families.get(key)
            if m is None:
                if key.endswith("_total"):
                    name = _seconds_key(key).removesuffix("_total")
                    m = CounterMetricFamily(
                        f"tenantkv_throttle_bucket_{name}", f"Bucket {key}.", labels=["bucket"]
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
GATE_SECTIONS = ("ingress", "bucket_queues", "write_permits", "execution", "authentication")

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
        "interrupted_due_to_client_disconnect",
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
        "failures",
        "refused",
    }
)


#: status keys exported under another name: ``queued_total`` (requests that had to
#: wait) would otherwise collide with the gauge ``queued`` once ``_total`` is dropped.
METRIC_KEY_RENAMES = {"queued_total": "waited_total"}


def section_metrics(prefix: str, section: dict[str, Any]) -> Iterator[Any]:
    """Every number in a gate's status section, named by its path:
    ``{"read": {"out": 3}}`` under ``tenantkv_execution`` is ``tenantkv_execution_read_out``.
    Entries under a ``buckets`` map become a ``bucket`` label, and a
    ``wait_histogram_us`` list of ``[upper bound µs, count]`` a histogram in seconds.
    Values in µs are exported in seconds (``*_micros`` → ``*_seconds``)."""
    families: dict[str, Any] = {}
    for path, labels, value, siblings in _leaves(section, (), {}):
        key = path[-1]
        name = "_".join((prefix, *path[:-1], METRIC_KEY_RENAMES.get(key, key)))
        names = sorted(labels)
        if key == "wait_histogram_us" and isinstance(value, list):
            name = name.removesuffix("_us") + "_seconds"
            fam = families.get(name) or families.setdefault(
                name, HistogramMetricFamily(name, _help(prefix, path, "wait time"), labels=names)
            )
            total = siblings.get("wait_micros_total")
            fam.add_metric(
                [labels[k] for k in names],
                _buckets(value, 1e6),
                total / 1e6 if isinstance(total, int | float) else None,
            )
            continue
        v = _number(value)
        if v is None:
            continue
        counter = key in COUNTER_KEYS or key.endswith("_total")
        if "micros" in key:
            name = "_".join((prefix, *path[:-1], _seconds_key(key)))
            v /= 1e6
        if counter:
            name = name.removesuffix("_total")
            fam = families.get(name) or families.setdefault(
                name, CounterMetricFamily(name, _help(prefix, path), labels=names)
            )
        else:
            fam = families.get(name) or families.setdefault(
                name, GaugeMetricFamily(name, _help(prefix, path), labels=names)
            )
        fam.add_metric([labels[k] for k in names], v)
    yield from families.values()


def _help(prefix: str, path: tuple[str, ...], what: str = "") -> str:
    where = ".".join((prefix.removeprefix("tenantkv_"), *path))
    return f"{what + ': ' if what else ''}server_status {where} (see docs/metrics.md)."


def _seconds_key(key: str) -> str:
    """A status key in µs as a metric name part in seconds (Prometheus' base unit):
    ``total_time_queued_micros`` → ``time_queued_seconds``, ``wait_micros_total`` →
    ``wait_seconds_total``."""
    return key.removeprefix("total_").replace("micros", "seconds")


def _leaves(
    d: dict[str, Any], path: tuple[str, ...], labels: dict[str, str]
) -> Iterator[tuple[tuple[str, ...], dict[str, str], Any, dict[str, Any]]]:
    """(path, labels, value, the map holding it) for every leaf."""
    for k, v in d.items():
        if k == "buckets" and isinstance(v, dict):
            for bucket, sub in v.items():
                if isinstance(sub, dict):
                    yield from _leaves(sub, path, {**labels, "bucket": str(bucket)})
        elif isinstance(v, dict):
            yield from _leaves(v, (*path, str(k)), labels)
        else:
            yield (*path, str(k)), labels, v, d


def start_metrics_server(status: StatusSource, port: int, addr: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` on ``addr:port`` (0 = any free port) from ``status``, the
    node's status document, read on the Trio thread; returns the port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(status, trio.lowlevel.current_trio_token()))
    httpd, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(httpd.server_port)
