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

What is exported, under which name, kind, unit and help, is declared in
:mod:`tenantkv.metric_catalog`; ``docs/metrics.md`` is generated from it.
"""

from __future__ import annotations

import inspect
import platform
import threading
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, make_server

import lmdb
import msgpack
import trio
from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from tenantkv import errors
from tenantkv._version import __version__
from tenantkv.metric_catalog import BY_NAME, METRICS, Metric

if TYPE_CHECKING:
    pass

#: Where the collector reads from: the node's status document (``Node.status``).
#: A callable, not the node, so metrics depend on a document, not on the server.
StatusSource = Callable[[], dict[str, Any]] | Callable[[], Awaitable[dict[str, Any]]]

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


class _Observed(Protocol):
    """A writer whose commits can be observed (``GroupCommitWriter``)."""

    observers: list[Callable[[int, float], None]]


class Latency:
    """What the node keeps for latency: :class:`OpLatency` (``op``) and
    :class:`CommitHistograms` (``commit``, registered with the writer here)."""

    __slots__ = ("commit", "observe", "observe_many", "op")

    def __init__(self, writer: _Observed | None = None) -> None:
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
    """The declared families from one status snapshot per scrape, and the
    ``others`` collectors' (process, platform), all with the ``node`` label of a
    cluster node (:func:`labelled`)."""

    def __init__(
        self,
        status: StatusSource,
        token: trio.lowlevel.TrioToken,
        others: Sequence[Collector] = (),
    ) -> None:
        self.status = status
        self.token = token
        self.others = others

    def _snapshot(self) -> dict[str, Any]:
        try:
            status: Any = self.status
            if inspect.iscoroutinefunction(status):
                # The supervisor of ``serve --workers N`` asks its workers.
                return trio.from_thread.run(status, trio_token=self.token)
            return trio.from_thread.run_sync(status, trio_token=self.token)
        except trio.RunFinishedError:
            return {}

    def collect(self) -> Iterator[Any]:
        st = self._snapshot()
        if st:
            yield from status_metrics(st)
        node = st.get("node")
        for other in self.others:
            yield from labelled(other.collect(), node)


def status_metrics(st: dict[str, Any]) -> Iterator[Any]:
    """Every declared metric family (:mod:`tenantkv.metric_catalog`), from one
    ``server_status`` document; a cluster node's with its ``node`` label."""
    families = [_family(m, st) for m in METRICS if m.path]
    yield from labelled([*families, *gate_metrics(st), build_info()], st.get("node"))


def labelled(families: Iterable[Any], node: Any) -> Iterator[Any]:
    """``families`` with ``node="<name>"`` on every sample when ``node`` is a
    cluster node's name (the status document's ``node``), so that one query sums
    or tells apart the nodes of a cluster; as they are otherwise (a single node's
    output does not change). One constant label: no series more per node."""
    if not isinstance(node, str):
        yield from families
        return
    for fam in families:
        fam.samples = [s._replace(labels={**s.labels, "node": node}) for s in fam.samples]
        yield fam


def _family(m: Metric, st: dict[str, Any]) -> Any:
    labels = list(m.labels)
    if m.kind == "histogram":
        fam: Any = HistogramMetricFamily(m.name, m.help, labels=labels)
        for values, pairs, holder in _resolve(st, m.path.split(".")):
            if isinstance(pairs, list):
                bounds, total = _histogram(m.histogram, pairs, holder)
                fam.add_metric(list(values), bounds, total)
        return fam
    cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
    fam = cls(m.name, m.help, labels=labels, unit="")
    for values, raw, _ in _resolve(st, m.path.split(".")):
        v = _number(raw)
        if v is not None:
            fam.add_metric(list(values), v * m.scale)
    return fam


def _resolve(
    doc: Any, parts: list[str], values: tuple[str, ...] = (), holder: Any = None
) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """(label values, value, the map holding it) for each match of a dotted path;
    a ``*`` part walks every key of a map, which becomes the next label value."""
    if not parts:
        yield values, doc, holder
        return
    if not isinstance(doc, dict):
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        for key, sub in doc.items():
            yield from _resolve(sub, rest, (*values, str(key)), doc)
    elif head in doc:
        yield from _resolve(doc[head], rest, values, doc)


def _histogram(form: str, pairs: list[Any], holder: dict[str, Any]) -> tuple[Any, float | None]:
    """A status histogram (``[[upper bound, count], ..., ["+Inf", n]]``) as
    Prometheus' cumulative buckets and sum, in base units."""
    if form == "batch":
        return _buckets(pairs, 1), holder.get("batch_ops_sum")
    sum_key = {
        "latency": "sum_micros",
        "wait": "wait_micros_total",
        "throttle": "throttle_wait_micros_total",
    }[form]
    total = holder.get(sum_key)
    return _buckets(pairs, 1e6), total / 1e6 if isinstance(total, int | float) else None


def _buckets(pairs: Sequence[Sequence[Any]], scale: float) -> list[tuple[str, float]]:
    """``[[upper bound, count], ...]`` as Prometheus' cumulative ``(le, count)`` list;
    bounds divided by ``scale`` (1e6: µs to seconds)."""
    cumulative, out = 0, []
    for le, n in pairs:
        cumulative += n
        out.append(("+Inf" if le == "+Inf" else repr(le / scale), cumulative))
    return out


def _number(value: Any) -> float | None:
    """A status value as a sample: booleans are 0/1; "unlimited" and anything not a
    number has no sample (no -1 standing for "no limit")."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


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
    spec_r, spec_d = BY_NAME["tenantkv_gate_rejected"], BY_NAME["tenantkv_gate_delayed"]
    rejected = CounterMetricFamily(spec_r.name, spec_r.help, labels=list(spec_r.labels))
    delayed = CounterMetricFamily(spec_d.name, spec_d.help, labels=list(spec_d.labels))
    ingress = st.get("ingress") or {}
    for gate in ("connection_establishment", "request_rate_limiter"):
        sec = ingress.get(gate) or {}
        rejected.add_metric([gate, ""], sec.get("rejected", 0))
        delayed.add_metric([gate, ""], sec.get("added_to_queue", 0))
    auth = st.get("authentication")
    if auth is not None:
        rejected.add_metric(["login", ""], auth.get("refused", 0) + auth.get("refused_busy", 0))
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


def build_info() -> Any:
    spec = BY_NAME["tenantkv_build_info"]
    fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    fam.add_metric(
        [
            __version__,
            platform.python_version(),
            trio.__version__,
            lmdb.__version__,
            ".".join(map(str, msgpack.version)),
        ],
        1,
    )
    return fam


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


def start_metrics_server(
    status: StatusSource,
    port: int,
    addr: str = "127.0.0.1",
    healthy: Callable[[], bool] | None = None,
) -> int:
    """Serve ``/metrics`` (the declared families, the process and platform
    collectors) and ``/healthz`` on ``addr:port`` (0 = any free port) on their
    own thread; returns the port.

    ``/healthz`` is 200 ``ok`` when the event loop answers and ``healthy()``
    (run on it) is true — 503 once the server stops or begins shutting down.
    """
    token = trio.lowlevel.current_trio_token()
    registry = CollectorRegistry(auto_describe=False)
    others = (ProcessCollector(registry=None), PlatformCollector(registry=None))
    registry.register(NodeCollector(status, token, others))
    metrics_app = make_wsgi_app(registry)
    check = healthy or (lambda: True)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == "/healthz":
            try:
                ok = trio.from_thread.run_sync(check, trio_token=token)
            except trio.RunFinishedError:
                ok = False
            start_response(
                "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
            )
            return [b"ok\n" if ok else b"shutting down\n"]
        return metrics_app(environ, start_response)

    httpd = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return int(httpd.server_port)
