"""The latency recorders, the Prometheus exporter's naming rules, and ``top``'s arithmetic."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from admin import format as fmt
from admin import top
from tenantkv import metrics
from tenantkv.metrics import LATENCY_BOUNDS_US, Latency, OpLatency, quantile


class _Writer:
    def __init__(self) -> None:
        self.observers: list[Any] = []


def test_op_latency_counts_per_bucket_and_operation() -> None:
    lat = OpLatency()
    for secs in (5e-6, 20e-6, 20e-6, 0.0009, 7.0):
        lat.observe("a", "get", secs)
    lat.observe("b", "set", 0.002)
    st = lat.status()
    get = st["a"]["get"]
    assert get["count"] == 5
    assert get["sum_micros"] == round((5e-6 + 40e-6 + 0.0009 + 7.0) * 1e6)
    hist = dict((str(le), n) for le, n in get["histogram_us"])
    assert (hist["10"], hist["25"], hist["1000"], hist["+Inf"]) == (1, 2, 1, 1)
    assert [le for le, _ in get["histogram_us"]] == [*LATENCY_BOUNDS_US, "+Inf"]
    assert st["b"]["set"]["p99_micros"] <= 2500
    lat.forget("a")
    assert set(lat.status()) == {"b"}


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    lat = OpLatency()
    lat.observe("a", "get", 100e-6)  # le="0.0001" includes 100 µs
    hist = dict((str(le), n) for le, n in lat.status()["a"]["get"]["histogram_us"])
    assert hist["100"] == 1 and hist["50"] == 0


def test_quantile_interpolates_inside_its_bucket() -> None:
    pairs = [[10, 0], [20, 100], [40, 100], ["+Inf", 0]]
    assert quantile(pairs, 0.5) == 20
    assert quantile(pairs, 0.75) == 30
    assert quantile([[10, 0], ["+Inf", 3]], 0.99) == 10  # beyond the last bound
    assert quantile([[10, 0], ["+Inf", 0]], 0.5) is None


def test_latency_registers_a_commit_observer() -> None:
    w = _Writer()
    lat = Latency(w)  # type: ignore[arg-type]
    assert len(w.observers) == 1
    w.observers[0](3, 0.0004)
    w.observers[0](200, 0.002)
    c = lat.status()["commit"]
    assert c["count"] == 2 and c["batch_ops_sum"] == 203
    ops = dict((str(le), n) for le, n in c["batch_ops_histogram"])
    assert ops["4"] == 1 and ops["256"] == 1
    lat.observe("a", "set", 0.001)
    assert lat.status()["buckets"]["a"]["set"]["count"] == 1


def _status() -> dict[str, Any]:
    lat = Latency(_Writer())  # type: ignore[arg-type]
    lat.observe("a", "get", 30e-6)
    lat.commit.observe(2, 0.0005)
    queue = {
        "concurrency": 64,
        "queue_tolerance": 1024,
        "concurrency_overridden": False,
        "queue_tolerance_overridden": True,
        "running": 1,
        "queued": 2,
        "admitted": 10,
        "queued_total": 4,
        "rejected_overflow": 1,
        "rejected_timeout": 2,
        "interrupted": 0,
        "release_rate": 12.5,
    }
    pool = {"out": 1, "total_tickets": 4, "added_to_queue": 3, "total_time_queued_micros": 1500}
    return {
        "uptime_secs": 10.0,
        "listening": "127.0.0.1:7207",
        "connections": {"current": 2, "total_created": 3, "rejected": 0, "backpressure": 1},
        "storage": {
            "map_size_bytes": 1 << 30,
            "used_bytes": 1 << 16,
            "writer": {
                "queued": 0,
                "batches": 5,
                "ops_committed": 9,
                "commit_seconds_total": 0.01,
                "failed_batches": 0,
                "map_grows": 0,
            },
        },
        "buckets": {
            "a": {"entries": 3, "connections": 1, "ops": {"get": 7}, "errors": {"Throttled": 2}}
        },
        "latency": lat.status(),
        "throttle": {
            "node": {"capacity": "unlimited", "write_weight": 2, "ru_total": 5},
            "buckets": {
                "a": {
                    "reserved": 10,
                    "hard_limit": "unlimited",
                    "ru_total": 5,
                    "wu_total": 1,
                    "throttle_count_total": 3,
                    "throttle_wait_micros_total": 2_000_000,
                    "reject_count_total": 2,
                    "waiting": 0,
                    "wait_histogram_us": [[100, 1], ["+Inf", 2]],
                }
            },
        },
        "ingress": {
            "request_rate_limiter": {"enabled": False, "rejected": 4, "added_to_queue": 0},
            "connection_establishment": {"enabled": True, "rejected": 1, "added_to_queue": 2},
            "admission": {"out": 0, "added_to_queue": 0},
        },
        "bucket_queues": {"node": {"subscribers": 0}, "buckets": {"a": {"read": queue}}},
        "write_permits": {
            "node": {"capacity": 64},
            "buckets": {
                "a": {
                    "capacity": 64,
                    "waited": 1,
                    "wait_micros_total": 500,
                    "wait_histogram_us": [[100, 0], [1000, 1], ["+Inf", 0]],
                }
            },
        },
        "execution": {"read": pool, "write": pool, "probing": {"state": "stable"}},
        "authentication": {"failures": 3, "refused": 1},
    }


class _Static(Collector):
    def __init__(self, st: dict[str, Any]) -> None:
        self.st = st

    def collect(self) -> Any:
        return metrics.status_metrics(self.st)


def _scrape(st: dict[str, Any]) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Static(st))
    return generate_latest(reg).decode()


def test_exported_names_are_prefixed_unique_and_in_seconds() -> None:
    text = _scrape(_status())
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert all(s.startswith("tenantkv_") for s in samples)
    dupes = [s for s, n in Counter(samples).items() if n > 1]
    assert not dupes, dupes  # a duplicate series makes Prometheus reject the whole scrape
    assert not [s for s in samples if "micros" in s]  # seconds, the base unit
    assert 'tenantkv_bucket_queues_read_waited_total{bucket="a"} 4.0' in text
    assert 'tenantkv_bucket_queues_read_queued{bucket="a"} 2.0' in text
    assert "tenantkv_execution_read_time_queued_seconds_total 0.0015" in text
    assert 'tenantkv_throttle_bucket_wait_seconds_total{bucket="a"} 2.0' in text
    assert 'tenantkv_write_permits_wait_seconds_sum{bucket="a"} 0.0005' in text
    assert 'tenantkv_op_latency_seconds_count{bucket="a",operation="get"} 1.0' in text
    assert 'tenantkv_op_latency_seconds_bucket{bucket="a",le="5e-05",operation="get"} 1.0' in text
    assert "tenantkv_writer_batch_ops_sum 2.0" in text
    assert 'tenantkv_gate_rejected_total{bucket="a",gate="bucket_queue"} 3.0' in text
    assert 'tenantkv_gate_rejected_total{bucket="a",gate="throttle"} 2.0' in text
    assert 'tenantkv_gate_rejected_total{bucket="",gate="login"} 1.0' in text
    assert 'tenantkv_gate_delayed_total{bucket="",gate="execution"} 6.0' in text


def test_latency_families_exist_before_any_observation() -> None:
    st = _status()
    del st["latency"]
    text = _scrape(st)
    for name in ("op_latency_seconds", "writer_commit_latency_seconds", "writer_batch_ops"):
        assert f"# TYPE tenantkv_{name} histogram" in text


def test_top_frame_rates_between_two_samples() -> None:
    a = _status()
    b = _status()
    b["uptime_secs"] = 12.0
    b["buckets"]["a"]["ops"] = {"get": 207}
    b["buckets"]["a"]["errors"] = {"Throttled": 6, "KeyNotFound": 50}
    tb = b["throttle"]["buckets"]["a"]
    tb.update(ru_total=405, wu_total=101, throttle_count_total=13, hard_limit=1000)
    lat = Latency(_Writer())  # type: ignore[arg-type]
    for _ in range(99):
        lat.observe("a", "get", 30e-6)
    lat.observe("a", "get", 0.004)
    b["latency"] = lat.status()
    f = top.frame(top.sample(a), top.sample(b))
    (row,) = f["buckets"]
    assert f["interval_secs"] == 2.0
    assert row["ops_per_sec"] == 100.0
    assert row["units_per_sec"] == (400 + 2 * 100) / 2
    assert row["hard_limit_used_pct"] == 30.0
    assert row["throttled_per_sec"] == 5.0
    assert row["rejected_per_sec"] == 2.0  # Throttled only: KeyNotFound is not a rejection
    assert 0.025 < row["p99_ms"] <= 5.0
    text = top.render(f)
    assert "UNITS/S" in text.splitlines()[3] and text.splitlines()[4].startswith("a ")


def test_status_text_lays_out_every_section() -> None:
    text = fmt.status_text(_status())
    for title in ("latency", "throttle", "ingress", "bucket_queues", "write_permits", "execution"):
        assert f"\n{title}\n" in text
    assert "BUCKET  CLASS" in text  # bucket queues: a row per bucket and class
    assert "1024*" in text  # an overridden limit is marked
    assert "READ TICKETS  WRITE TICKETS" in text  # pools side by side
    assert "BUCKET  OPERATION  COUNT" in text


def test_status_text_survives_unknown_shapes() -> None:
    text = fmt.status_text({"bucket_queues": {"buckets": {"a": 5}}, "new_gate": {"buckets": {}}})
    assert "bucket_queues" in text and "new_gate" in text


def test_every_declared_metric_follows_the_conventions() -> None:
    """Prometheus naming: prefixed, base units named, counters without a _total of
    their own (exposition adds it), no doubled words, real help, labels declared."""
    from tenantkv.metric_catalog import METRICS, SECTIONS

    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    sections = {t for t, _ in SECTIONS}
    for m in METRICS:
        words = m.name.split("_")
        assert m.name.startswith("tenantkv_"), m.name
        assert not m.name.endswith("_total"), m.name
        assert not {"ms", "secs", "us", "micros", "msec"} & set(words), m.name
        doubled = [w for i, w in enumerate(words) if w in words[:i] and w not in ("rate",)]
        assert not doubled, (m.name, doubled)
        assert (m.unit == "seconds") == ("seconds" in words), m.name
        assert (m.unit == "bytes") == (m.name.endswith("_bytes")), m.name
        assert m.scale == 1.0 or m.unit == "seconds", m.name
        assert len(m.help) > 15 and not m.help[0].islower(), m.name
        assert m.section in sections, m.name
        assert m.path.count("*") == len(m.labels) or not m.path, m.name
        assert (m.kind == "histogram") == bool(m.histogram), m.name


def test_unlimited_is_absent_not_minus_one() -> None:
    st = _status()
    st["throttle"]["buckets"]["a"]["hard_limit"] = "unlimited"
    text = _scrape(st)
    assert "tenantkv_throttle_bucket_hard_limit{" not in text
    assert not [x for x in text.splitlines() if x.endswith(" -1.0")]


def test_metrics_doc_is_generated_from_the_declarations() -> None:
    from tenantkv.metric_catalog import render_markdown

    doc = Path(__file__).parents[2] / "docs" / "metrics.md"
    assert doc.read_text() == render_markdown(), (
        "run: python -m tenantkv.metric_catalog > docs/metrics.md"
    )
