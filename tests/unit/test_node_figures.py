"""``serve --workers N``: the node's figures as the metric catalog declares them."""

from __future__ import annotations

from typing import Any

from tenantkv.metric_catalog import METRICS, STATUS_FIGURES, across_rules
from tenantkv.metrics import quantile
from tenantkv.server.node_figures import WorkerFigures
from tenantkv.server.status import node_document, undeclared


def _doc(worker: int, sets: int, wu: int, hist: list[int], *, conns: int = 1) -> dict[str, Any]:
    pairs = [[100, hist[0]], [1000, hist[1]], ["+Inf", hist[2]]]
    return {
        "worker": worker,
        "pid": 100 + worker,
        "uptime_secs": 5.0 + worker,
        "connections": {"current": conns, "total_created": sets, "max": 10},
        "buckets": {"b": {"entries": 7 + worker, "ops": {"set": sets}, "connections": conns}},
        "latency": {
            "bounds_us": [100, 1000],
            "buckets": {
                "b": {
                    "set": {
                        "count": sum(hist),
                        "sum_micros": 10,
                        "p50_micros": 1,
                        "p99_micros": 999_999,
                        "histogram_us": pairs,
                    }
                }
            },
        },
        "throttle": {
            "node": {"capacity": 3000, "free_pool_units": 2700.0, "wu_total": wu},
            "buckets": {"b": {"reserved": 100, "allowance_rate": 600.0, "hungry": worker == 1}},
        },
        "gc": {"thresholds": [700 + worker, 10, 10]},
    }


def test_declarations_cover_a_workers_document_and_are_made_once() -> None:
    assert undeclared(_doc(0, 1, 1, [1, 0, 0])) == []
    metric_paths = {m.path for m in METRICS if m.path}
    assert not metric_paths & set(STATUS_FIGURES)  # a figure is declared in one place
    assert set(across_rules().values()) <= {
        "total",
        "sum",
        "same",
        "max",
        "any",
        "node",
        "histogram",
        "p50",
        "p99",
        "first",
    }


def test_counts_add_up_settings_do_not_and_the_supervisor_has_the_node_figures() -> None:
    node = {
        "pid": 1,
        "uptime_secs": 9.0,
        "throttle": {
            "node": {"free_pool_units": 1500.0},
            "buckets": {"b": {"allowance_rate": 1000.0}},
        },
    }
    doc = node_document([_doc(1, 5, 50, [1, 1, 0]), _doc(0, 3, 30, [2, 0, 0])], node)
    assert doc["pid"] == 1 and doc["uptime_secs"] == 9.0
    assert doc["buckets"]["b"]["ops"]["set"] == 8
    assert doc["buckets"]["b"]["entries"] == 8  # the shared environment: the largest
    assert doc["connections"] == {"current": 2, "total_created": 8, "max": 10}
    assert doc["throttle"]["node"] == {"capacity": 3000, "free_pool_units": 1500.0, "wu_total": 80}
    assert doc["throttle"]["buckets"]["b"] == {
        "reserved": 100,
        "allowance_rate": 1000.0,
        "hungry": True,
    }
    assert doc["gc"] == {"thresholds": [700, 10, 10]}  # the first worker's
    assert [w["worker"] for w in doc["workers"]] == [0, 1]


def test_percentiles_come_from_the_merged_histogram() -> None:
    doc = node_document([_doc(0, 1, 1, [99, 0, 0]), _doc(1, 1, 1, [0, 1, 0])], {})
    latency = doc["latency"]["buckets"]["b"]["set"]
    assert latency["histogram_us"] == [[100, 99], [1000, 1], ["+Inf", 0]]
    assert latency["count"] == 100
    assert latency["p99_micros"] == round(quantile(latency["histogram_us"], 0.99) or 0)
    assert latency["p99_micros"] <= 100  # not the max of the workers' p99s (999,999)
    assert latency["p50_micros"] == round(quantile(latency["histogram_us"], 0.5) or 0) == 51


def test_a_dead_workers_counts_stay_the_nodes() -> None:
    figures = WorkerFigures()
    a, b = _doc(0, 10, 100, [3, 0, 0]), _doc(1, 20, 200, [0, 4, 0])
    figures.seen(0, a)
    figures.seen(1, b)
    before = figures.document([a, b], {})
    figures.died(1)
    restarted = _doc(1, 2, 20, [0, 1, 0], conns=0)
    after = figures.document([a, restarted], {})
    assert before["buckets"]["b"]["ops"]["set"] == 30
    assert after["buckets"]["b"]["ops"]["set"] == 32  # 10 + 20 kept + 2 since
    assert after["throttle"]["node"]["wu_total"] == 320
    assert after["connections"]["current"] == 1  # a level: only the live workers'
    assert after["latency"]["buckets"]["b"]["set"]["histogram_us"][1] == [1000, 5]
    assert after["latency"]["buckets"]["b"]["set"]["count"] == 8
    figures.died(0)  # its last document counts once
    figures.died(0)
    assert figures.retirements == 2


def test_a_dropped_buckets_retired_counts_go_with_it() -> None:
    figures = WorkerFigures()
    figures.seen(0, _doc(0, 10, 1, [1, 0, 0]))
    figures.died(0)
    live = _doc(0, 0, 0, [0, 0, 0])
    live["buckets"] = {}
    live["latency"]["buckets"] = {}
    doc = figures.document([live], {})
    assert doc["buckets"] == {} and doc["latency"]["buckets"] == {}
    assert doc["throttle"]["node"]["wu_total"] == 1  # a node count stays
