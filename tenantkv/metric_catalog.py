"""Every metric tenantkv exports, declared: name, kind, unit, help and where its
value lives in the status document.

``/metrics`` is a view of ``server_status`` (:mod:`tenantkv.metrics` reads the
document at scrape time); this table says how each figure is exported, instead
of guessing it from key names. Names follow Prometheus' conventions: a
``tenantkv_`` prefix, base units in the name (``_seconds``, ``_bytes``; ``scale``
converts the status document's ms and µs), counters exposed with ``_total``, no
``-1`` for "unlimited" (such a series is simply absent), real help text.

``path`` is a dotted path into the status document; each ``*`` is a map level
whose keys become the next label in ``labels`` (``buckets.*.ops.*`` with
``("bucket", "operation")``). An empty path is a family computed from several
values (``gate_*``, ``build_info``). ``docs/metrics.md`` is generated from this
table (``python -m tenantkv.metric_catalog``; a test keeps them equal).

``across`` declares how a figure of ``serve --workers N`` is the node's, from
the workers' documents and the supervisor's (:data:`ACROSS`): the
``node_document`` merge reads it here, never from a figure's name. Figures
of the status document that are no metric are declared in
:data:`STATUS_FIGURES`, beside them; a test checks that every figure of a
worker's document has a declaration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["counter", "gauge", "histogram"]

#: How a figure combines across the workers of ``serve --workers N``.
Across = Literal["total", "sum", "same", "max", "any", "node", "histogram", "p50", "p99", "first"]
ACROSS: dict[str, str] = {
    "total": "a count since start: the sum of the workers', plus the last counts of "
    "workers that died (it never goes back when a worker restarts)",
    "sum": "a level now: the sum of the live workers'",
    "same": "a setting or fact the same on every worker: any worker's",
    "max": "a figure of what the workers share, read at slightly different times: the largest",
    "any": "a yes/no: yes if any worker's is",
    "node": "the supervisor's own figure for the node (its allocator, connection table, "
    "login limiter, writer)",
    "histogram": "counts per bound: added up bound by bound (dead workers' included)",
    "p50": "the median of the merged histogram beside it (`histogram_us`)",
    "p99": "the 99th percentile of the merged histogram beside it (`histogram_us`)",
    "first": "a figure of one process (its garbage collector, its probing state): the "
    "first worker's; each worker's own is in its document",
}
ACROSS_INTRO = """With `serve --workers N` each worker counts what it serves and the
supervisor merges the workers' documents into the node's (one `status`, one
`/metrics`). The **workers** column of each table says how; the supervisor
reads every worker's document at least once a second and keeps the last one of
a worker that dies, so `total` figures never go back when a worker restarts
(what a worker counted after that last read and before a `kill -9` is lost
with it). In one process every figure is that process's own."""
#: What ``across`` is when a metric does not say: by its kind.
ACROSS_BY_KIND: dict[str, Across] = {"counter": "total", "gauge": "sum", "histogram": "histogram"}


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    kind: Kind
    path: str
    help: str
    labels: tuple[str, ...] = ()
    #: the base unit the name ends in ("seconds", "bytes"), if any
    unit: str = ""
    #: multiply the status value by this to get the base unit (ms: 1e-3, µs: 1e-6)
    scale: float = 1.0
    #: a histogram's form in the status document: "latency" (pairs in µs and a
    #: ``sum_micros``), "batch" (pairs and ``batch_ops_sum``), "wait" and
    #: "throttle" (pairs in µs, the sum in a sibling ``*_micros_total``)
    histogram: str = ""
    #: the name the figure has in the system the idea comes from
    origin: str = ""
    #: the docs/metrics.md section it is listed in
    section: str = ""
    #: how the node's figure comes from the workers' (:data:`ACROSS`); by kind if not set
    across: Across | None = None

    @property
    def combine(self) -> Across:
        return self.across or ACROSS_BY_KIND[self.kind]


#: docs/metrics.md up to its first section.
DOC_HEADER = """# Metrics

<!-- Generated from tenantkv/metric_catalog.py by `python -m tenantkv.metric_catalog`
(tests keep this page, the declarations and a live scrape equal). Edit the catalog, not this. -->

`tenantkv serve --metrics-port N` (or `metrics_port = N`) serves Prometheus
metrics at `http://127.0.0.1:N/metrics` and a health check at `/healthz` (200
`ok` while the server serves, 503 once it stops or begins shutting down). It
listens on loopback unless `metrics_host` says otherwise (put a Prometheus or
an agent on the same host, or a TLS proxy in front), and is off unless set.
Each scrape asks the server's event loop for one snapshot of the same
counters `tenantkv-admin status` shows (`server_status`) — a few microseconds
on the loop — so metrics and status always agree and nothing is counted twice.

Conventions:

- Every name starts with `tenantkv_`. Counters end in `_total`; time is in
  seconds and sizes in bytes, and the name says so (status keys in ms or µs
  are converted: `slice_ms` is `tenantkv_throttle_node_slice_seconds`,
  `total_time_queued_micros` is `…_time_queued_seconds_total`).
- Besides these, the standard `process_*` (CPU seconds, resident memory, open
  file descriptors, start time) and `python_info` families.
- Labels: `bucket` (the tenant), `operation` (`get`, `set`, `delete`, …),
  `code_name` (the result of a failed operation: an error code name from
  [protocol.md](protocol.md)), `gate` (an admission gate). Node-wide values
  have no label. A node of a cluster (`--cluster`) adds `node` (its
  `--node-name`) to every series, the `process_*` and `python_info` ones
  too, so that one query sums the cluster (`sum without (node) (…)`) or
  tells its nodes apart; a single node has no `node` label
  ([cluster.md](cluster.md)).
- Histograms have `_bucket`/`_sum`/`_count` series. Operation and commit
  latency use buckets from 10 µs to 5 s (10, 25, 50, 100, 250, 500 µs, 1, 2.5,
  5, 10, 25, 50, 100, 250, 500 ms, 1 s, 5 s): an inline read takes tens of
  µs, a durable write a fraction of a millisecond to a few ms.
- A limit that is `"unlimited"` has no series (never −1); a yes/no value reads 1/0.
- Cardinality: about 80 series per bucket, plus 20 per operation the bucket
  serves (the `tenantkv_op_latency_seconds` histogram). With hundreds of
  buckets, build dashboards on recording rules that sum over `operation`,
  and size Prometheus for it.
- Each metric is declared with the status path it reads (`execution.read.out`
  → `tenantkv_execution_read_out`; a `buckets` map becomes the `bucket`
  label). The **origin** column gives the name the value has in the system
  the idea comes from (MongoDB serverStatus, Couchbase KV throttling, Manta
  muskie, EvidentDB).

Useful queries:

```promql
# units/s per bucket (RU + write_weight x WU), against its limits
sum by (bucket) (rate(tenantkv_throttle_bucket_ru_total[5m])
  + rate(tenantkv_throttle_bucket_wu_total[5m])
    * on(instance, job) group_left tenantkv_throttle_node_write_weight)
tenantkv_throttle_bucket_reserved
tenantkv_throttle_bucket_hard_limit
# p99 latency per bucket
histogram_quantile(0.99, sum by (bucket, le) (rate(tenantkv_op_latency_seconds_bucket[5m])))
# rejections by gate
sum by (gate) (rate(tenantkv_gate_rejected_total[5m]))
# commit (fsync) p99 and batch size
histogram_quantile(0.99, sum by (le) (rate(tenantkv_writer_commit_latency_seconds_bucket[5m])))
rate(tenantkv_writer_batch_ops_sum[5m]) / rate(tenantkv_writer_batch_ops_count[5m])
```

A ready-made Grafana dashboard is in
[`deploy/grafana/tenantkv.json`](../deploy/grafana/tenantkv.json); how to
read it is in [operations.md](operations.md#reading-the-dashboard).

"""

#: docs/metrics.md's sections, in order, with their introductions.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("Node and connections", ""),
    (
        "Storage and group commit",
        "The LMDB environment and the group-commit writer (`status`: `storage`, `latency.commit`).",
    ),
    (
        "Buckets and operations",
        "Per bucket: what it holds, what it served, how fast (`status`: `buckets`, `latency.buckets`).",
    ),
    (
        "All gates at once",
        "One view across the admission gates ([admission.md](admission.md)), for dashboards: `sum by (gate) (rate(tenantkv_gate_rejected_total[5m]))`.",
    ),
    (
        "Tenant throttle",
        'Units, reservations, hard limits ([throttling.md](throttling.md); `status`: `throttle`). A limit that is `"unlimited"` has no series.',
    ),
    (
        "Ingress: rate limiters and admission tickets",
        "The front door (`status`: `ingress`): the request rate limiter, the connection-establishment limiter (same statistics) and the ingress admission controller's tickets.",
    ),
    (
        "Bucket queues",
        "Per bucket and class, the Manta throttle (`status`: `bucket_queues`). The class is in the name (`read` / `write`).",
    ),
    (
        "Write permits",
        "Per-bucket write semaphores that follow the write lag (`status`: `write_permits`).",
    ),
    (
        "Execution tickets and throughput probing",
        "The read and write pools around LMDB and the probing that sizes them (`status`: `execution`).",
    ),
    ("Authentication", "The login limiter: delays and the hash pool (`status`: `authentication`)."),
    (
        "Cluster",
        "A node of a cluster ([cluster.md](cluster.md); `status`: `cluster`); a single node has no series of these.",
    ),
)

_INGRESS = "Ingress: rate limiters and admission tickets"

#: The figures of a token-bucket rate limiter (``RateLimiterStatistics``), the
#: same for each one: (name after ``tenantkv_ingress_<gate>_``, kind, key in the
#: gate's status, help after the limiter's title, origin — ``{mongo}`` is the
#: limiter's MongoDB parameter prefix —, further fields).
# fmt: off
_RATE_LIMITER_FIGURES: tuple[tuple[str, Kind, str, str, str, dict[str, Any]], ...] = (
    ("enabled", "gauge", "enabled", "1 when the limiter is on.", "{mongo}Enabled", {"across": "same"}),
    ("tokens_per_second", "gauge", "rate_per_sec", "tokens (requests or connections) per second.", "{mongo}RatePerSec", {}),
    ("burst_capacity_seconds", "gauge", "burst_capacity_secs", "burst, in seconds of the rate.", "{mongo}BurstCapacitySecs", {"unit": "seconds", "across": "same"}),
    ("burst_size", "gauge", "burst_size", "burst in tokens (rate × burst seconds).", "", {}),
    ("max_queue_depth", "gauge", "max_queue_depth", "most callers that may wait for a token (0 for requests: they are rejected at once).", "{mongo}MaxQueueDepth", {}),
    ("queued", "gauge", "queued", "callers waiting for a token now.", "queued", {}),
    ("attempted", "counter", "attempted", "admissions attempted (successful + rejected + interrupted + queued now); exempt ones not included.", "attemptedAdmissions", {}),
    ("successful", "counter", "successful", "admissions granted.", "successfulAdmissions", {}),
    ("rejected", "counter", "rejected", "admissions refused (462 `IngressRequestRateLimitExceeded` for requests, `TooManyConnections` for connections).", "rejectedAdmissions", {}),
    ("exempted", "counter", "exempted", "exempt callers passed without a token (admin commands, CIDR exemptions / bypass).", "exemptedAdmissions", {}),
    ("interrupted_in_queue", "counter", "interrupted_in_queue", "waiters that left the queue (cancelled, deadline, client gone).", "interruptedInQueue", {}),
    ("added_to_queue", "counter", "added_to_queue", "callers that had to wait.", "addedToQueue", {}),
    ("removed_from_queue", "counter", "removed_from_queue", "callers that left the queue (admitted or interrupted).", "removedFromQueue", {}),
    ("average_time_queued_seconds", "gauge", "average_time_queued_micros", "moving average (α = 0.2) of the wait of callers admitted after waiting, in seconds.", "averageTimeQueuedMicros", {"unit": "seconds", "scale": 1e-06, "across": "max"}),
    ("total_available_tokens", "gauge", "total_available_tokens", "tokens available now (balance floored at 0).", "totalAvailableTokens", {}),
    ("token_balance", "gauge", "token_balance", "raw token balance (negative while waiters have borrowed ahead).", "", {}),
)
# fmt: on


def _rate_limiter_metrics(
    gate: str, title: str, mongo: str, after: dict[str, Metric]
) -> tuple[Metric, ...]:
    """The metrics of the rate limiter at ``ingress.<gate>`` in the status document
    (:data:`_RATE_LIMITER_FIGURES`), each figure followed by ``after``'s metric for it,
    if any: a limiter's figures of its own."""
    out: list[Metric] = []
    for suffix, kind, key, help_text, origin, fields in _RATE_LIMITER_FIGURES:
        out.append(
            Metric(
                f"tenantkv_ingress_{gate}_{suffix}",
                kind,
                f"ingress.{gate}.{key}",
                f"{title}: {help_text}",
                origin=f"MongoDB `{origin.format(mongo=mongo)}`" if origin else "",
                section=_INGRESS,
                **fields,
            )
        )
        if suffix in after:
            out.append(after[suffix])
    return tuple(out)


METRICS: tuple[Metric, ...] = (
    Metric(
        "tenantkv_connections",
        "gauge",
        "connections.current",
        "Open client connections.",
        origin="MongoDB `connections.current`; Couchbase `curr_connections`",
        section="Node and connections",
    ),
    Metric(
        "tenantkv_protocol_connections",
        "gauge",
        "connections.by_protocol.*",
        "Open client connections by front door: `msgpack` (MessagePack-RPC) or `resp` (the Redis protocol).",
        labels=("protocol",),
        section="Node and connections",
    ),
    Metric(
        "tenantkv_connections_created",
        "counter",
        "connections.total_created",
        "Connections accepted (admitted past the connection limiter).",
        origin="MongoDB `connections.totalCreated`",
        section="Node and connections",
    ),
    Metric(
        "tenantkv_connections_rejected",
        "counter",
        "connections.rejected",
        "Connections refused at the door: `max_connections` reached, the connection-establishment limiter, or shutdown.",
        origin="MongoDB `connections.rejected`",
        section="Node and connections",
    ),
    Metric(
        "tenantkv_connections_backpressure",
        "gauge",
        "connections.backpressure",
        "Open connections whose client declared `backpressure: true` in `hello` (it retries overload errors with back-off).",
        origin="MongoDB driver back-pressure handshake",
        section="Node and connections",
    ),
    Metric(
        "tenantkv_uptime_seconds",
        "gauge",
        "uptime_secs",
        "Seconds since the server started.",
        unit="seconds",
        origin="MongoDB `uptime`",
        section="Node and connections",
        across="node",
    ),
    Metric(
        "tenantkv_storage_map_size_bytes",
        "gauge",
        "storage.map_size_bytes",
        "LMDB map size (the largest the data file may grow before the map is grown again).",
        unit="bytes",
        origin="LMDB `me_mapsize`",
        section="Storage and group commit",
        across="max",
    ),
    Metric(
        "tenantkv_storage_used_bytes",
        "gauge",
        "storage.used_bytes",
        "LMDB pages in use, in bytes (last page number × page size): the data file's real size.",
        unit="bytes",
        origin="LMDB `me_last_pgno`",
        section="Storage and group commit",
        across="max",
    ),
    Metric(
        "tenantkv_writer_queue_length",
        "gauge",
        "storage.writer.queued",
        "Write lag: writes queued for the group-commit writer and not yet durable. Drives the write permits.",
        origin="EvidentDB admission `lag`",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_batches",
        "counter",
        "storage.writer.batches",
        "Group-commit transactions committed (each one fsync with `durability = fsync`).",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_ops_committed",
        "counter",
        "storage.writer.ops_committed",
        "Writes committed (batches × ops per batch).",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_commit_seconds",
        "counter",
        "storage.writer.commit_seconds_total",
        "Time spent applying and committing batches, fsync included.",
        unit="seconds",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_failed_batches",
        "counter",
        "storage.writer.failed_batches",
        "Batches that failed as a whole (disk full, map limit, I/O error); their writes got an error.",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_map_grows",
        "counter",
        "storage.writer.map_grows",
        "Times the LMDB map was grown.",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_commit_latency_seconds",
        "histogram",
        "latency.commit.histogram_us",
        "Histogram: time to apply and commit one batch, fsync included (10 µs – 5 s buckets).",
        unit="seconds",
        histogram="latency",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_writer_batch_ops",
        "histogram",
        "latency.commit.batch_ops_histogram",
        "Histogram: operations per group-commit batch (buckets 1, 2, 4 … 2048). Large batches under load are the point of group commit.",
        histogram="batch",
        section="Storage and group commit",
        across="node",
    ),
    Metric(
        "tenantkv_bucket_entries",
        "gauge",
        "buckets.*.entries",
        "Records stored in the bucket (expired ones not yet reclaimed included).",
        labels=("bucket",),
        origin="Couchbase `curr_items`",
        section="Buckets and operations",
        across="max",
    ),
    Metric(
        "tenantkv_ops",
        "counter",
        "buckets.*.ops.*",
        "Operations that completed successfully, by bucket and operation (`get`, `set`, …).",
        labels=("bucket", "operation"),
        origin="MongoDB `opcounters`; Couchbase `cmd_get`/`cmd_set`",
        section="Buckets and operations",
    ),
    Metric(
        "tenantkv_op_errors",
        "counter",
        "buckets.*.errors.*",
        "Operations that ended in an error, by bucket and error code name (`code_name`: the result, e.g. `Throttled`, `KeyNotFound`).",
        labels=("bucket", "code_name"),
        section="Buckets and operations",
    ),
    Metric(
        "tenantkv_bucket_connections",
        "gauge",
        "buckets.*.connections",
        "Connections with the bucket selected.",
        labels=("bucket",),
        section="Buckets and operations",
    ),
    Metric(
        "tenantkv_op_latency_seconds",
        "histogram",
        "latency.buckets.*.*.histogram_us",
        "Histogram: latency of completed operations, by bucket and operation, measured in the server from the request decoded to its reply queued (a write: until durable), waits at the gates included. Buckets 10 µs – 5 s. Its `_count` equals `tenantkv_ops_total`.",
        labels=("bucket", "operation"),
        unit="seconds",
        origin="MongoDB `opLatencies`; Couchbase `kv_cmd_duration_seconds`",
        histogram="latency",
        section="Buckets and operations",
    ),
    Metric(
        "tenantkv_gate_rejected",
        "counter",
        "",
        "Requests each admission gate rejected before any work, by `gate` (`connection_establishment` and `login` count connections; `request_rate_limiter`, `throttle`, `bucket_queue` requests) and `bucket` (empty for node-wide gates). The same counts as each gate's own metrics, in one family.",
        labels=("gate", "bucket"),
        section="All gates at once",
    ),
    Metric(
        "tenantkv_gate_delayed",
        "counter",
        "",
        "Requests (connections for `connection_establishment`) a gate made wait before admitting or rejecting them, by `gate` (`connection_establishment`, `request_rate_limiter`, `ingress_admission`, `throttle`, `bucket_queue`, `write_permit`, `execution`) and `bucket`.",
        labels=("gate", "bucket"),
        section="All gates at once",
    ),
    Metric(
        "tenantkv_throttle_node_enabled",
        "gauge",
        "throttle.node.enabled",
        "1 when the tenant throttle is on (always).",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_capacity",
        "gauge",
        "throttle.node.capacity",
        "Node capacity in cost units/s; no series while unlimited (node throttling off).",
        origin="Couchbase `capacity`",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_default_reserved_units",
        "gauge",
        "throttle.node.default_throttle_reserved_units",
        "Reservation given to buckets created from now on.",
        origin="Couchbase `default_throttle_reserved_units`",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_default_hard_limit",
        "gauge",
        "throttle.node.default_throttle_hard_limit",
        "Hard limit given to buckets created from now on; no series while unlimited.",
        origin="Couchbase `default_throttle_hard_limit`",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_write_weight",
        "gauge",
        "throttle.node.write_weight",
        "Cost of one WU in RU (`write_weight`).",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_slice_seconds",
        "gauge",
        "throttle.node.slice_ms",
        "Refill slice of the allowances (100 ms).",
        unit="seconds",
        scale=0.001,
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_max_wait_seconds",
        "gauge",
        "throttle.node.throttle_max_wait_ms",
        "Longest a throttled request waits (`throttle_max_wait_ms`).",
        unit="seconds",
        scale=0.001,
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_free_pool_units",
        "gauge",
        "throttle.node.free_pool_units",
        "Units/s left after finite reservations (capacity − Σ reserved); no series while unlimited.",
        origin="Couchbase free pool",
        section="Tenant throttle",
        across="node",
    ),
    Metric(
        "tenantkv_throttle_node_reservation_scale",
        "gauge",
        "throttle.node.reservation_scale",
        "Factor every reservation is scaled by because the reservations exceed the node capacity (1 = none).",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_node_free_pool_available_units",
        "gauge",
        "throttle.node.free_pool_available_units",
        "Of the free pool, units/s left to share now, after capacity set aside for unthrottled use; no series while unlimited.",
        section="Tenant throttle",
        across="node",
    ),
    Metric(
        "tenantkv_throttle_node_free_pool_used_window",
        "gauge",
        "throttle.node.free_pool_used_window",
        "Units used beyond reservations in the current second.",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_node_spare_units",
        "gauge",
        "throttle.node.spare_units",
        "Unused share handed on and not yet taken (first come, first served).",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_node_ru",
        "counter",
        "throttle.node.ru_total",
        "Read units charged, all buckets.",
        origin="Couchbase `ru_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_node_wu",
        "counter",
        "throttle.node.wu_total",
        "Write units charged, all buckets.",
        origin="Couchbase `wu_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_node_count",
        "counter",
        "throttle.node.throttle_count_total",
        "Requests throttled (made to wait), all buckets.",
        origin="Couchbase `throttle_count_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_node_rejected",
        "counter",
        "throttle.node.reject_count_total",
        "Requests rejected with `Throttled`, all buckets.",
        origin="Couchbase `reject_count_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_reserved",
        "gauge",
        "throttle.buckets.*.reserved",
        "The bucket's reservation (units/s).",
        labels=("bucket",),
        origin="Couchbase `reserved`",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_bucket_hard_limit",
        "gauge",
        "throttle.buckets.*.hard_limit",
        "The bucket's hard limit (units/s); no series while unlimited.",
        labels=("bucket",),
        origin="Couchbase `hard_limit`",
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_bucket_weight",
        "gauge",
        "throttle.buckets.*.weight",
        "The bucket's weight in the fair share of the free pool.",
        labels=("bucket",),
        section="Tenant throttle",
        across="same",
    ),
    Metric(
        "tenantkv_throttle_bucket_connections",
        "gauge",
        "throttle.buckets.*.connections",
        "Connections of the bucket as the throttle counts them (slow start: none keeps 10 % of the reservation).",
        labels=("bucket",),
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_effective_reserved",
        "gauge",
        "throttle.buckets.*.effective_reserved",
        "Reservation in force now, after slow start and over-reservation scaling; no series while unlimited.",
        labels=("bucket",),
        section="Tenant throttle",
        across="node",
    ),
    Metric(
        "tenantkv_throttle_bucket_allowance_rate",
        "gauge",
        "throttle.buckets.*.allowance_rate",
        "The bucket's allowance rate now: reservation + fair share of the free pool, capped at the hard limit; no series while unlimited.",
        labels=("bucket",),
        section="Tenant throttle",
        across="node",
    ),
    Metric(
        "tenantkv_throttle_bucket_allowance",
        "gauge",
        "throttle.buckets.*.allowance",
        "Allowance left in the bucket's counter now (negative: debt being repaid); no series while unlimited.",
        labels=("bucket",),
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_hungry",
        "gauge",
        "throttle.buckets.*.hungry",
        "1 while the bucket wants more than it gets (throttled recently or has waiters).",
        labels=("bucket",),
        section="Tenant throttle",
        across="any",
    ),
    Metric(
        "tenantkv_throttle_bucket_ru",
        "counter",
        "throttle.buckets.*.ru_total",
        "Read units charged to the bucket.",
        labels=("bucket",),
        origin="Couchbase `ru_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_wu",
        "counter",
        "throttle.buckets.*.wu_total",
        "Write units charged to the bucket.",
        labels=("bucket",),
        origin="Couchbase `wu_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_units_used_window",
        "gauge",
        "throttle.buckets.*.units_used_window",
        "Cost units charged in the current whole second.",
        labels=("bucket",),
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_units_used_previous_window",
        "gauge",
        "throttle.buckets.*.units_used_previous_window",
        "Cost units charged in the previous whole second (what `status` shows as used/s).",
        labels=("bucket",),
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_count",
        "counter",
        "throttle.buckets.*.throttle_count_total",
        "Requests of the bucket that were throttled (had to wait).",
        labels=("bucket",),
        origin="Couchbase `throttle_count_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_wait_seconds",
        "counter",
        "throttle.buckets.*.throttle_wait_micros_total",
        "Total time the bucket's requests spent throttled, in seconds.",
        labels=("bucket",),
        unit="seconds",
        scale=1e-06,
        origin="Couchbase `throttle_seconds_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_rejected",
        "counter",
        "throttle.buckets.*.reject_count_total",
        "Requests of the bucket rejected with `Throttled` (could not run within their wait bound, or non-blocking).",
        labels=("bucket",),
        origin="Couchbase `reject_count_total`",
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_bucket_waiting",
        "gauge",
        "throttle.buckets.*.waiting",
        "Requests of the bucket parked by the throttle now.",
        labels=("bucket",),
        section="Tenant throttle",
    ),
    Metric(
        "tenantkv_throttle_wait_seconds",
        "histogram",
        "throttle.buckets.*.wait_histogram_us",
        "Histogram per bucket: how long throttled requests waited (100 µs – 5 s).",
        labels=("bucket",),
        unit="seconds",
        histogram="throttle",
        section="Tenant throttle",
    ),
    *_rate_limiter_metrics(
        "request_rate_limiter",
        "Ingress request rate limiter",
        "ingressRequestAdmission",
        after={
            "exempted": Metric(
                "tenantkv_ingress_request_rate_limiter_refusal_pauses",
                "counter",
                "ingress.request_rate_limiter.refusal_pauses",
                "Refusals (by the ingress request rate limiter, or the tenant throttle's Throttled) after which the connection was not read again until the refused request could pass (at most 10 ms, when at least 1 ms away): what its client sent meanwhile is answered together.",
                section=_INGRESS,
            )
        },
    ),
    *_rate_limiter_metrics(
        "connection_establishment",
        "Connection-establishment rate limiter",
        "ingressConnectionEstablishment",
        after={
            "interrupted_in_queue": Metric(
                "tenantkv_ingress_connection_establishment_interrupted_due_to_client_disconnect",
                "counter",
                "ingress.connection_establishment.interrupted_due_to_client_disconnect",
                "Connection-establishment rate limiter: clients that closed their connection while queued; their place and token went back.",
                origin="MongoDB `interruptedDueToClientDisconnect`",
                section=_INGRESS,
            )
        },
    ),
    Metric(
        "tenantkv_ingress_admission_enabled",
        "gauge",
        "ingress.admission.enabled",
        "Ingress admission controller: 1 when operations take a ticket (`ingress_admission_controller_enabled`).",
        origin="MongoDB `ingressAdmissionControllerEnabled`",
        section="Ingress: rate limiters and admission tickets",
        across="same",
    ),
    Metric(
        "tenantkv_ingress_admission_out",
        "gauge",
        "ingress.admission.out",
        "Ingress admission tickets (one per operation in the server): tickets held now.",
        origin="MongoDB `ingressAdmissionControl`.out",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_available",
        "gauge",
        "ingress.admission.available",
        "Ingress admission tickets (one per operation in the server): tickets free now.",
        origin="MongoDB `ingressAdmissionControl`.available",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_total_tickets",
        "gauge",
        "ingress.admission.total_tickets",
        "Ingress admission tickets (one per operation in the server): pool size.",
        origin="MongoDB `ingressAdmissionControl`.totalTickets",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_added_to_queue",
        "counter",
        "ingress.admission.added_to_queue",
        "Ingress admission tickets (one per operation in the server): operations that had to wait for a ticket.",
        origin="MongoDB `ingressAdmissionControl`.addedToQueue",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_removed_from_queue",
        "counter",
        "ingress.admission.removed_from_queue",
        "Ingress admission tickets (one per operation in the server): operations that left the queue (admitted or cancelled).",
        origin="MongoDB `ingressAdmissionControl`.removedFromQueue",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_queue_length",
        "gauge",
        "ingress.admission.queue_length",
        "Ingress admission tickets (one per operation in the server): operations waiting for a ticket now.",
        origin="MongoDB `ingressAdmissionControl`.queueLength",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_started_processing",
        "counter",
        "ingress.admission.started_processing",
        "Ingress admission tickets (one per operation in the server): tickets handed out.",
        origin="MongoDB `ingressAdmissionControl`.startedProcessing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_processing",
        "gauge",
        "ingress.admission.processing",
        "Ingress admission tickets (one per operation in the server): operations holding a ticket now (= out).",
        origin="MongoDB `ingressAdmissionControl`.processing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_finished_processing",
        "counter",
        "ingress.admission.finished_processing",
        "Ingress admission tickets (one per operation in the server): tickets released.",
        origin="MongoDB `ingressAdmissionControl`.finishedProcessing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_time_processing_seconds",
        "counter",
        "ingress.admission.total_time_processing_micros",
        "Ingress admission tickets (one per operation in the server): total time tickets were held, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `ingressAdmissionControl`.totalTimeProcessingMicros",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_time_queued_seconds",
        "counter",
        "ingress.admission.total_time_queued_micros",
        "Ingress admission tickets (one per operation in the server): total time operations waited for a ticket, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `ingressAdmissionControl`.totalTimeQueuedMicros",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_canceled",
        "counter",
        "ingress.admission.canceled",
        "Ingress admission tickets (one per operation in the server): waiters that left without a ticket (cancelled or past their deadline).",
        origin="MongoDB `ingressAdmissionControl`.canceled",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_new_admissions",
        "counter",
        "ingress.admission.new_admissions",
        "Ingress admission tickets (one per operation in the server): admissions that were not readmissions (operations, not acquisitions).",
        origin="MongoDB `ingressAdmissionControl`.newAdmissions",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_exempt_started_processing",
        "counter",
        "ingress.admission.exempt.started_processing",
        "Ingress admission tickets (one per operation in the server): exempt (admin and internal) work started through the pool, uncounted against it.",
        origin="MongoDB `ingressAdmissionControl`.exempt.startedProcessing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_exempt_processing",
        "gauge",
        "ingress.admission.exempt.processing",
        "Ingress admission tickets (one per operation in the server): exempt work in progress now.",
        origin="MongoDB `ingressAdmissionControl`.exempt.processing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_exempt_finished_processing",
        "counter",
        "ingress.admission.exempt.finished_processing",
        "Ingress admission tickets (one per operation in the server): exempt work finished.",
        origin="MongoDB `ingressAdmissionControl`.exempt.finishedProcessing",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_ingress_admission_exempt_time_processing_seconds",
        "counter",
        "ingress.admission.exempt.total_time_processing_micros",
        "Ingress admission tickets (one per operation in the server): total time of exempt work, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `ingressAdmissionControl`.exempt.totalTimeProcessingMicros",
        section="Ingress: rate limiters and admission tickets",
    ),
    Metric(
        "tenantkv_bucket_queues_enabled",
        "gauge",
        "bucket_queues.enabled",
        "Bucket queues: 1 when requests pass them (`bucket_queue_enabled`).",
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_node_concurrency",
        "gauge",
        "bucket_queues.node.bucket_queue_concurrency",
        "Bucket queues: node default: slots per bucket and class.",
        origin="Manta `concurrency`",
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_node_tolerance",
        "gauge",
        "bucket_queues.node.bucket_queue_tolerance",
        "Bucket queues: node default: requests that may wait per bucket and class.",
        origin="Manta `queueTolerance`",
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_node_pending_timeout_seconds",
        "gauge",
        "bucket_queues.node.bucket_queue_pending_timeout_ms",
        "Bucket queues: longest wait for a slot before rejection (0 = none).",
        unit="seconds",
        scale=0.001,
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_node_subscribers",
        "gauge",
        "bucket_queues.node.subscribers",
        "Bucket queues: event subscribers now (`tenantkv-admin watch`).",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_node_events_delivered",
        "counter",
        "bucket_queues.node.events_delivered",
        "Bucket queues: `request_throttled` / `request_handled` events delivered to subscribers.",
        origin="Manta probes",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_node_events_dropped",
        "counter",
        "bucket_queues.node.events_dropped",
        "Bucket queues: events a slow subscriber lost.",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_concurrency",
        "gauge",
        "bucket_queues.buckets.*.read.concurrency",
        "Bucket queue, reads, per bucket: slots (running requests allowed) of the bucket's queue.",
        labels=("bucket",),
        origin="Manta `concurrency`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_queue_tolerance",
        "gauge",
        "bucket_queues.buckets.*.read.queue_tolerance",
        "Bucket queue, reads, per bucket: requests that may wait.",
        labels=("bucket",),
        origin="Manta `queueTolerance`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_concurrency_overridden",
        "gauge",
        "bucket_queues.buckets.*.read.concurrency_overridden",
        "Bucket queue, reads, per bucket: 1 when the bucket has its own concurrency (`bucket-queue-set`).",
        labels=("bucket",),
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_read_queue_tolerance_overridden",
        "gauge",
        "bucket_queues.buckets.*.read.queue_tolerance_overridden",
        "Bucket queue, reads, per bucket: 1 when the bucket has its own tolerance.",
        labels=("bucket",),
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_read_running",
        "gauge",
        "bucket_queues.buckets.*.read.running",
        "Bucket queue, reads, per bucket: requests holding a slot now.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_queued",
        "gauge",
        "bucket_queues.buckets.*.read.queued",
        "Bucket queue, reads, per bucket: requests waiting for a slot now.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_admitted",
        "counter",
        "bucket_queues.buckets.*.read.admitted",
        "Bucket queue, reads, per bucket: slots granted (at once or after waiting).",
        labels=("bucket",),
        origin="Manta `request_handled`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_waited",
        "counter",
        "bucket_queues.buckets.*.read.queued_total",
        "Bucket queue, reads, per bucket: requests that had to wait (status key `queued_total`).",
        labels=("bucket",),
        origin="Manta `request_throttled` (queued)",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_rejected_overflow",
        "counter",
        "bucket_queues.buckets.*.read.rejected_overflow",
        "Bucket queue, reads, per bucket: requests rejected because the queue was full (`AdmissionQueueOverflow`).",
        labels=("bucket",),
        origin="Manta `request_throttled` (rejected)",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_rejected_timeout",
        "counter",
        "bucket_queues.buckets.*.read.rejected_timeout",
        "Bucket queue, reads, per bucket: requests rejected after waiting `bucket_queue_pending_timeout_ms`.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_interrupted",
        "counter",
        "bucket_queues.buckets.*.read.interrupted",
        "Bucket queue, reads, per bucket: waiters that left (cancelled, deadline, bucket deleted).",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_read_release_rate",
        "gauge",
        "bucket_queues.buckets.*.read.release_rate",
        "Bucket queue, reads, per bucket: slot releases per second measured while requests queue (feeds `retryAfterMs`).",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_concurrency",
        "gauge",
        "bucket_queues.buckets.*.write.concurrency",
        "Bucket queue, writes, per bucket: slots (running requests allowed) of the bucket's queue.",
        labels=("bucket",),
        origin="Manta `concurrency`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_queue_tolerance",
        "gauge",
        "bucket_queues.buckets.*.write.queue_tolerance",
        "Bucket queue, writes, per bucket: requests that may wait.",
        labels=("bucket",),
        origin="Manta `queueTolerance`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_concurrency_overridden",
        "gauge",
        "bucket_queues.buckets.*.write.concurrency_overridden",
        "Bucket queue, writes, per bucket: 1 when the bucket has its own concurrency (`bucket-queue-set`).",
        labels=("bucket",),
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_write_queue_tolerance_overridden",
        "gauge",
        "bucket_queues.buckets.*.write.queue_tolerance_overridden",
        "Bucket queue, writes, per bucket: 1 when the bucket has its own tolerance.",
        labels=("bucket",),
        section="Bucket queues",
        across="same",
    ),
    Metric(
        "tenantkv_bucket_queues_write_running",
        "gauge",
        "bucket_queues.buckets.*.write.running",
        "Bucket queue, writes, per bucket: requests holding a slot now.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_queued",
        "gauge",
        "bucket_queues.buckets.*.write.queued",
        "Bucket queue, writes, per bucket: requests waiting for a slot now.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_admitted",
        "counter",
        "bucket_queues.buckets.*.write.admitted",
        "Bucket queue, writes, per bucket: slots granted (at once or after waiting).",
        labels=("bucket",),
        origin="Manta `request_handled`",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_waited",
        "counter",
        "bucket_queues.buckets.*.write.queued_total",
        "Bucket queue, writes, per bucket: requests that had to wait (status key `queued_total`).",
        labels=("bucket",),
        origin="Manta `request_throttled` (queued)",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_rejected_overflow",
        "counter",
        "bucket_queues.buckets.*.write.rejected_overflow",
        "Bucket queue, writes, per bucket: requests rejected because the queue was full (`AdmissionQueueOverflow`).",
        labels=("bucket",),
        origin="Manta `request_throttled` (rejected)",
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_rejected_timeout",
        "counter",
        "bucket_queues.buckets.*.write.rejected_timeout",
        "Bucket queue, writes, per bucket: requests rejected after waiting `bucket_queue_pending_timeout_ms`.",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_interrupted",
        "counter",
        "bucket_queues.buckets.*.write.interrupted",
        "Bucket queue, writes, per bucket: waiters that left (cancelled, deadline, bucket deleted).",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_bucket_queues_write_release_rate",
        "gauge",
        "bucket_queues.buckets.*.write.release_rate",
        "Bucket queue, writes, per bucket: slot releases per second measured while requests queue (feeds `retryAfterMs`).",
        labels=("bucket",),
        section="Bucket queues",
    ),
    Metric(
        "tenantkv_write_permits_enabled",
        "gauge",
        "write_permits.enabled",
        "Write permits: 1 when writes take one (`write_permit_enabled`).",
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_target_lag",
        "gauge",
        "write_permits.node.write_permit_target_lag",
        "Write permits: lag up to which buckets get max permits.",
        origin="EvidentDB `target_lag`",
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_critical_lag",
        "gauge",
        "write_permits.node.write_permit_critical_lag",
        "Write permits: lag from which buckets get min permits.",
        origin="EvidentDB `critical_lag`",
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_min_capacity",
        "gauge",
        "write_permits.node.write_permit_min_capacity",
        "Write permits: fewest permits per bucket.",
        origin="EvidentDB min capacity",
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_max_capacity",
        "gauge",
        "write_permits.node.write_permit_max_capacity",
        "Write permits: most permits per bucket.",
        origin="EvidentDB max capacity",
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_adjustment_interval_seconds",
        "gauge",
        "write_permits.node.write_permit_adjustment_interval_ms",
        "Write permits: how often capacity follows the lag.",
        unit="seconds",
        scale=0.001,
        section="Write permits",
        across="same",
    ),
    Metric(
        "tenantkv_write_permits_node_capacity",
        "gauge",
        "write_permits.node.capacity",
        "Write permits: permits per bucket now (follows the lag).",
        origin="EvidentDB semaphore capacity",
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_node_last_lag",
        "gauge",
        "write_permits.node.last_lag",
        "Write permits: the write lag last sampled.",
        origin="EvidentDB `lag`",
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_node_evaluations",
        "counter",
        "write_permits.node.evaluations",
        "Write permits: times the lag was sampled.",
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_node_adjustments",
        "counter",
        "write_permits.node.adjustments",
        "Write permits: times the capacity changed.",
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_capacity",
        "gauge",
        "write_permits.buckets.*.capacity",
        "Write permits, per bucket: permits the bucket may hold now.",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_in_use",
        "gauge",
        "write_permits.buckets.*.in_use",
        "Write permits, per bucket: permits held (writes in flight until durable).",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_waiting",
        "gauge",
        "write_permits.buckets.*.waiting",
        "Write permits, per bucket: writes waiting for a permit.",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_granted",
        "counter",
        "write_permits.buckets.*.granted",
        "Write permits, per bucket: permits granted.",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_waited",
        "counter",
        "write_permits.buckets.*.waited",
        "Write permits, per bucket: writes that had to wait for a permit.",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_interrupted",
        "counter",
        "write_permits.buckets.*.interrupted",
        "Write permits, per bucket: waiters that left (cancelled, deadline).",
        labels=("bucket",),
        section="Write permits",
    ),
    Metric(
        "tenantkv_write_permits_wait_seconds",
        "histogram",
        "write_permits.buckets.*.wait_histogram_us",
        "Histogram per bucket: how long writes waited for a permit (100 µs – 1 s).",
        labels=("bucket",),
        unit="seconds",
        histogram="wait",
        section="Write permits",
    ),
    Metric(
        "tenantkv_execution_read_out",
        "gauge",
        "execution.read.out",
        "Read execution tickets: tickets held now.",
        origin="MongoDB `queues.execution.read`.out",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_available",
        "gauge",
        "execution.read.available",
        "Read execution tickets: tickets free now.",
        origin="MongoDB `queues.execution.read`.available",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_total_tickets",
        "gauge",
        "execution.read.total_tickets",
        "Read execution tickets: pool size.",
        origin="MongoDB `queues.execution.read`.totalTickets",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_added_to_queue",
        "counter",
        "execution.read.added_to_queue",
        "Read execution tickets: operations that had to wait for a ticket.",
        origin="MongoDB `queues.execution.read`.addedToQueue",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_removed_from_queue",
        "counter",
        "execution.read.removed_from_queue",
        "Read execution tickets: operations that left the queue (admitted or cancelled).",
        origin="MongoDB `queues.execution.read`.removedFromQueue",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_queue_length",
        "gauge",
        "execution.read.queue_length",
        "Read execution tickets: operations waiting for a ticket now.",
        origin="MongoDB `queues.execution.read`.queueLength",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_started_processing",
        "counter",
        "execution.read.started_processing",
        "Read execution tickets: tickets handed out.",
        origin="MongoDB `queues.execution.read`.startedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_processing",
        "gauge",
        "execution.read.processing",
        "Read execution tickets: operations holding a ticket now (= out).",
        origin="MongoDB `queues.execution.read`.processing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_finished_processing",
        "counter",
        "execution.read.finished_processing",
        "Read execution tickets: tickets released.",
        origin="MongoDB `queues.execution.read`.finishedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_time_processing_seconds",
        "counter",
        "execution.read.total_time_processing_micros",
        "Read execution tickets: total time tickets were held, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.read`.totalTimeProcessingMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_time_queued_seconds",
        "counter",
        "execution.read.total_time_queued_micros",
        "Read execution tickets: total time operations waited for a ticket, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.read`.totalTimeQueuedMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_canceled",
        "counter",
        "execution.read.canceled",
        "Read execution tickets: waiters that left without a ticket (cancelled or past their deadline).",
        origin="MongoDB `queues.execution.read`.canceled",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_new_admissions",
        "counter",
        "execution.read.new_admissions",
        "Read execution tickets: admissions that were not readmissions (operations, not acquisitions).",
        origin="MongoDB `queues.execution.read`.newAdmissions",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_exempt_started_processing",
        "counter",
        "execution.read.exempt.started_processing",
        "Read execution tickets: exempt (admin and internal) work started through the pool, uncounted against it.",
        origin="MongoDB `queues.execution.read`.exempt.startedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_exempt_processing",
        "gauge",
        "execution.read.exempt.processing",
        "Read execution tickets: exempt work in progress now.",
        origin="MongoDB `queues.execution.read`.exempt.processing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_exempt_finished_processing",
        "counter",
        "execution.read.exempt.finished_processing",
        "Read execution tickets: exempt work finished.",
        origin="MongoDB `queues.execution.read`.exempt.finishedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_read_exempt_time_processing_seconds",
        "counter",
        "execution.read.exempt.total_time_processing_micros",
        "Read execution tickets: total time of exempt work, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.read`.exempt.totalTimeProcessingMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_out",
        "gauge",
        "execution.write.out",
        "Write execution tickets: tickets held now.",
        origin="MongoDB `queues.execution.write`.out",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_available",
        "gauge",
        "execution.write.available",
        "Write execution tickets: tickets free now.",
        origin="MongoDB `queues.execution.write`.available",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_total_tickets",
        "gauge",
        "execution.write.total_tickets",
        "Write execution tickets: pool size.",
        origin="MongoDB `queues.execution.write`.totalTickets",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_added_to_queue",
        "counter",
        "execution.write.added_to_queue",
        "Write execution tickets: operations that had to wait for a ticket.",
        origin="MongoDB `queues.execution.write`.addedToQueue",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_removed_from_queue",
        "counter",
        "execution.write.removed_from_queue",
        "Write execution tickets: operations that left the queue (admitted or cancelled).",
        origin="MongoDB `queues.execution.write`.removedFromQueue",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_queue_length",
        "gauge",
        "execution.write.queue_length",
        "Write execution tickets: operations waiting for a ticket now.",
        origin="MongoDB `queues.execution.write`.queueLength",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_started_processing",
        "counter",
        "execution.write.started_processing",
        "Write execution tickets: tickets handed out.",
        origin="MongoDB `queues.execution.write`.startedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_processing",
        "gauge",
        "execution.write.processing",
        "Write execution tickets: operations holding a ticket now (= out).",
        origin="MongoDB `queues.execution.write`.processing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_finished_processing",
        "counter",
        "execution.write.finished_processing",
        "Write execution tickets: tickets released.",
        origin="MongoDB `queues.execution.write`.finishedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_time_processing_seconds",
        "counter",
        "execution.write.total_time_processing_micros",
        "Write execution tickets: total time tickets were held, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.write`.totalTimeProcessingMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_time_queued_seconds",
        "counter",
        "execution.write.total_time_queued_micros",
        "Write execution tickets: total time operations waited for a ticket, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.write`.totalTimeQueuedMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_canceled",
        "counter",
        "execution.write.canceled",
        "Write execution tickets: waiters that left without a ticket (cancelled or past their deadline).",
        origin="MongoDB `queues.execution.write`.canceled",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_new_admissions",
        "counter",
        "execution.write.new_admissions",
        "Write execution tickets: admissions that were not readmissions (operations, not acquisitions).",
        origin="MongoDB `queues.execution.write`.newAdmissions",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_exempt_started_processing",
        "counter",
        "execution.write.exempt.started_processing",
        "Write execution tickets: exempt (admin and internal) work started through the pool, uncounted against it.",
        origin="MongoDB `queues.execution.write`.exempt.startedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_exempt_processing",
        "gauge",
        "execution.write.exempt.processing",
        "Write execution tickets: exempt work in progress now.",
        origin="MongoDB `queues.execution.write`.exempt.processing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_exempt_finished_processing",
        "counter",
        "execution.write.exempt.finished_processing",
        "Write execution tickets: exempt work finished.",
        origin="MongoDB `queues.execution.write`.exempt.finishedProcessing",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_write_exempt_time_processing_seconds",
        "counter",
        "execution.write.exempt.total_time_processing_micros",
        "Write execution tickets: total time of exempt work, in seconds.",
        unit="seconds",
        scale=1e-06,
        origin="MongoDB `queues.execution.write`.exempt.totalTimeProcessingMicros",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_read_concurrency",
        "gauge",
        "execution.probing.read_concurrency",
        "Throughput probing: read pool size set by probing.",
        origin="MongoDB `throughputProbing.readConcurrency`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_write_concurrency",
        "gauge",
        "execution.probing.write_concurrency",
        "Throughput probing: write pool size set by probing.",
        origin="MongoDB `throughputProbing.writeConcurrency`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_stable_concurrency",
        "gauge",
        "execution.probing.stable_concurrency",
        "Throughput probing: stable total concurrency (both pools) the probing settled on.",
        origin="MongoDB `throughputProbing.stableConcurrency`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_stable_throughput",
        "gauge",
        "execution.probing.stable_throughput",
        "Throughput probing: baseline throughput (operations/s) of the stable concurrency.",
        origin="MongoDB `throughputProbing.stableThroughput`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_times_probed_stable",
        "counter",
        "execution.probing.times_probed_stable",
        "Throughput probing: probes that stayed stable.",
        origin="MongoDB `timesProbedStable`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_times_probed_up",
        "counter",
        "execution.probing.times_probed_up",
        "Throughput probing: probes up (a pool ran out of tickets).",
        origin="MongoDB `timesProbedUp`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_times_probed_down",
        "counter",
        "execution.probing.times_probed_down",
        "Throughput probing: probes down (pools larger than used).",
        origin="MongoDB `timesProbedDown`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_times_increased",
        "counter",
        "execution.probing.times_increased",
        "Throughput probing: times the stable concurrency grew.",
        origin="MongoDB `timesIncreased`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_times_decreased",
        "counter",
        "execution.probing.times_decreased",
        "Throughput probing: times the stable concurrency shrank.",
        origin="MongoDB `timesDecreased`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_amount_increased",
        "counter",
        "execution.probing.total_amount_increased",
        "Throughput probing: sum of the stable concurrency's increases.",
        origin="MongoDB `totalAmountIncreased`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_amount_decreased",
        "counter",
        "execution.probing.total_amount_decreased",
        "Throughput probing: sum of the stable concurrency's decreases.",
        origin="MongoDB `totalAmountDecreased`",
        section="Execution tickets and throughput probing",
    ),
    Metric(
        "tenantkv_execution_probing_streak",
        "gauge",
        "execution.probing.streak",
        "Throughput probing boost: successful probes in a row in one direction (`streak_direction` in `status`); 0: no boost on the next probe.",
        section="Execution tickets and throughput probing",
        across="max",
    ),
    Metric(
        "tenantkv_execution_probing_last_step_multiple",
        "gauge",
        "execution.probing.last_step_multiple",
        "Throughput probing boost: relative step of the latest probe up or down, boost included (0 before the first).",
        section="Execution tickets and throughput probing",
        across="max",
    ),
    Metric(
        "tenantkv_authentication_login_failure_limit",
        "gauge",
        "authentication.login_failure_limit",
        "Login limiter: failures counted per (user, address) pair and per address, each doubling the delay (`login_failure_limit`; 0 = delays off).",
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_failure_window_seconds",
        "gauge",
        "authentication.login_failure_window_secs",
        "Login limiter: failures are forgotten this long after the last one, in seconds.",
        unit="seconds",
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_delay_seconds",
        "gauge",
        "authentication.login_delay_ms",
        "Login limiter: the hold of a first failed login's answer (`login_delay_ms`), in seconds.",
        unit="seconds",
        scale=0.001,
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_delay_max_seconds",
        "gauge",
        "authentication.login_delay_max_ms",
        "Login limiter: the longest hold of a failed login's answer (`login_delay_max_ms`), in seconds.",
        unit="seconds",
        scale=0.001,
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_hash_concurrency",
        "gauge",
        "authentication.login_hash_concurrency",
        "Login limiter: password verifications (scrypt) allowed at once, node-wide (`login_hash_concurrency`).",
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_hash_queue",
        "gauge",
        "authentication.login_hash_queue",
        "Login limiter: logins allowed to wait for a verification, per lane (`login_hash_queue`).",
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_login_hash_per_address",
        "gauge",
        "authentication.login_hash_per_address",
        "Login limiter: logins of one address not known-good, verifying or waiting (`login_hash_per_address`).",
        section="Authentication",
        across="same",
    ),
    Metric(
        "tenantkv_authentication_tracked_sources",
        "gauge",
        "authentication.tracked_sources",
        "Login limiter: client addresses with recent failed logins.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_tracked_pairs",
        "gauge",
        "authentication.tracked_pairs",
        "Login limiter: (user, address) pairs with recent failed logins.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_delayed_pairs",
        "gauge",
        "authentication.delayed_pairs",
        "Login limiter: (user, address) pairs in their delay now (refused up front unless known-good).",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_known_good_pairs",
        "gauge",
        "authentication.known_good_pairs",
        "Login limiter: (user, address) pairs with a successful login in the last 7 days (kept across restarts); never refused for failures, first to the hash pool.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_failures",
        "counter",
        "authentication.failures",
        "Login limiter: failed logins.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_refused",
        "counter",
        "authentication.refused",
        "Login limiter: logins refused up front because their pair is in its delay (`TooManyLoginFailures`).",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_refused_busy",
        "counter",
        "authentication.refused_busy",
        "Login limiter: logins refused because the hash pool's lane or the address's share was full (`TooManyLoginFailures`, retryable).",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_hashes",
        "counter",
        "authentication.hashes",
        "Login limiter: password verifications (scrypt) started.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_hashing",
        "gauge",
        "authentication.hashing",
        "Login limiter: password verifications running now.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_authentication_queued",
        "gauge",
        "authentication.queued",
        "Login limiter: logins waiting for a password verification now.",
        section="Authentication",
        across="node",
    ),
    Metric(
        "tenantkv_build_info",
        "gauge",
        "",
        "Always 1; the labels say which tenantkv, Python and libraries serve.",
        labels=("version", "python", "trio", "lmdb", "msgpack"),
        section="Node and connections",
    ),
    Metric(
        "tenantkv_cluster_lease_valid",
        "gauge",
        "cluster.lease.valid",
        "1 while the node surely holds its etcd lease (it acknowledges writes to its slots only then: fencing), else 0.",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_coordinator",
        "gauge",
        "cluster.coordinator",
        "1 on the node that is the cluster's coordinator (assigns slots, writes the map), else 0.",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_map_version",
        "gauge",
        "cluster.map.version",
        "Version of the cluster map this node serves by (every node's should be equal within a watch's delay).",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_slots_assigned",
        "gauge",
        "cluster.map.slots_assigned",
        "Slots of 16,384 that have a node in the map this node holds.",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_member_up",
        "gauge",
        "cluster.map.nodes.*.up",
        "Per member of the map this node holds (`member`: its name): 1 while up, 0 once its lease expired (its slots are unavailable until it returns).",
        labels=("member",),
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_member_slots",
        "gauge",
        "cluster.map.nodes.*.slots",
        "Per member of the map this node holds (`member`: its name): the slots it owns.",
        labels=("member",),
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_map_changes",
        "counter",
        "cluster.map_changes",
        "Newer cluster maps this node has taken.",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_requests_refused",
        "counter",
        "cluster.routing.refused",
        "Requests this node answered with a redirection or a refusal instead of running "
        "them: keys of another node's slot (`-MOVED`), a slot no node serves now "
        "(`-CLUSTERDOWN`), keys of several slots on RESP (`-CROSSSLOT`), a moving slot "
        "past its hold (`-TRYAGAIN`).",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_requests_held",
        "counter",
        "cluster.routing.held",
        "Requests of a slot moving away from this node that waited for the move to settle "
        "(at most 2 s) before being answered as the map then said: redirected to the new "
        "owner, served here (the move was given up), or refused (`-TRYAGAIN`).",
        section="Cluster",
        across="node",
    ),
    Metric(
        "tenantkv_cluster_etcd_errors",
        "counter",
        "cluster.etcd_errors",
        "Requests to etcd that failed (etcd unreachable or slow); the node retries and serves on the map it holds.",
        section="Cluster",
        across="node",
    ),
)
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

#: The status document's figures that are no metric (or parts of one: a
#: histogram's count, sum and percentiles), and how each combines across
#: workers. A path names a leaf, or a whole section whose leaves all combine so.
STATUS_FIGURES: dict[str, Across] = {
    "version": "same",
    "worker": "first",  # a worker's index: node_document drops it
    "pid": "node",
    "listening": "same",
    "resp_listening": "same",
    "metrics_listening": "node",  # the supervisor serves /metrics
    "shutting_down": "any",
    "users": "max",
    "leases": "total",
    "connections.max": "same",
    "connections.max_per_address": "same",
    "connections.admin_reserved": "same",
    "connections.table": "node",
    "connections.receive_buffers.capacity_bytes": "sum",
    "connections.receive_buffers.user_capacity_bytes": "sum",
    "connections.receive_buffers.buffered_bytes": "sum",
    "connections.receive_buffers.waiting": "sum",
    "connections.receive_buffers.waits_total": "total",
    "gc": "first",
    "storage.path": "same",
    "storage.durability": "same",
    "storage.writer": "node",
    "latency.bounds_us": "same",
    "latency.commit": "node",
    "latency.buckets.*.*.count": "total",
    "latency.buckets.*.*.sum_micros": "total",
    "latency.buckets.*.*.p50_micros": "p50",
    "latency.buckets.*.*.p99_micros": "p99",
    "write_permits.buckets.*.wait_micros_total": "total",
    "execution.probing.state": "first",
    "execution.probing.streak_direction": "first",
}


def across_rules() -> dict[tuple[str, ...], Across]:
    """Every declared path (``*``: any key of a map) and how it combines: the
    metrics' and :data:`STATUS_FIGURES`'."""
    rules: dict[tuple[str, ...], Across] = {
        tuple(m.path.split(".")): m.combine for m in METRICS if m.path
    }
    for path, across in STATUS_FIGURES.items():
        rules[tuple(path.split("."))] = across
    return rules


def bucket_maps() -> set[tuple[str, ...]]:
    """The paths of the status document's maps keyed by bucket (a metric's first
    label ``bucket``): what a dropped bucket takes out of the node's counts."""
    out = set()
    for m in METRICS:
        if m.labels[:1] == ("bucket",) and m.path:
            out.add(tuple(m.path.split(".")[: m.path.split(".").index("*")]))
    return out


def exposed_name(m: Metric) -> str:
    """The name a scrape shows: counters end in ``_total``."""
    return m.name + "_total" if m.kind == "counter" else m.name


def render_markdown() -> str:
    """``docs/metrics.md``: the page's text, then each section's table."""
    out = [DOC_HEADER.rstrip("\n"), ""]
    for title, intro in SECTIONS:
        out += [f"## {title}", ""]
        if intro:
            out += [intro, ""]
        out += [
            "| metric | type | labels | meaning | workers | origin |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for m in METRICS:
            if m.section == title:
                labels = ", ".join(sorted(m.labels)) or "—"
                out.append(
                    f"| `{exposed_name(m)}` | {m.kind} | {labels} | {m.help} | {m.combine}"
                    f" | {m.origin} |"
                )
        out.append("")
    return "\n".join([*out, *_across_section()])


def _across_section() -> list[str]:
    """How each figure is the node's with ``serve --workers N``."""
    out = ["## Across workers", "", ACROSS_INTRO, "", "| workers | the node's figure |"]
    out += ["| --- | --- |", *(f"| {k} | {v} |" for k, v in ACROSS.items()), ""]
    out += ["Figures of `status` that are no metric:", ""]
    out += ["| status figure | workers |", "| --- | --- |"]
    out += [*(f"| `{path}` | {across} |" for path, across in STATUS_FIGURES.items()), ""]
    return out


if __name__ == "__main__":
    print(render_markdown(), end="")
