"""Metrics of a cluster node carry its ``node`` label; a single node's do not
change (unit: from a status document, no server)."""

from __future__ import annotations

from prometheus_client import PlatformCollector
from prometheus_client.parser import text_string_to_metric_families

from tenantkv import metrics
from tests.unit.test_metrics import _scrape, _status


def samples(text: str) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def test_a_cluster_node_labels_every_series_with_its_name() -> None:
    single = _scrape(_status())
    clustered = _scrape({**_status(), "node": "n2"})
    plain, labelled = samples(single), samples(clustered)
    assert len(plain) == len(labelled) > 100
    assert all(labels.get("node") == "n2" for _, labels in labelled)
    assert not any("node" in labels for _, labels in plain)
    # The same series otherwise: the label is one constant more.
    assert [(n, {k: v for k, v in lb.items() if k != "node"}) for n, lb in labelled] == plain


def test_the_process_collectors_are_labelled_too() -> None:
    fams = list(metrics.labelled(PlatformCollector(registry=None).collect(), "n1"))
    assert fams and all(s.labels["node"] == "n1" for f in fams for s in f.samples)
    same = list(metrics.labelled(PlatformCollector(registry=None).collect(), None))
    assert all("node" not in s.labels for f in same for s in f.samples)
