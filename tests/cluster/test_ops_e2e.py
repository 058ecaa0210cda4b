"""Operating a cluster, end to end (a real etcd, 3 real nodes): each node's
``/metrics`` carries its ``node`` label, and ``tenantkv-admin cluster-status``
adds each node's operations, units and keys and their sum over the cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tenantkv.client.cluster import ClusterClient
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer, new_prefix
from .test_cluster_e2e import admin_cli, cluster_status, create_bucket, full_map, start_nodes

BUCKET = "ops"
KEYS = 120


@pytest.fixture(scope="module")
def nodes(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[list[Daemon]]:
    """The module's 3 nodes: the metrics test only reads them; the status test,
    after it, stops one at its end."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TENANTKV_METRICS_PORT", "0")  # each node: /metrics on a free port
        tmp_path = tmp_path_factory.mktemp("ops")
        started = start_nodes(tmp_path, etcd_server, new_prefix(), 3)
    try:
        wait_until(lambda: all(full_map(cluster_status(d), 3) for d in started), what="map of 3")
        create_bucket(started, BUCKET)
        with ClusterClient(
            started[0].host, started[0].port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET
        ) as cc:
            for i in range(KEYS):
                cc.set(f"ops:{i}", b"v")
            assert cc.mget([f"ops:{i}" for i in range(KEYS)]) == [b"v"] * KEYS
        yield started
    finally:
        for d in started:
            d.kill()


def scrape(d: Daemon) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()  # type: ignore[no-any-return]


def admin(d: Daemon, *args: str) -> str:
    return admin_cli(d, *args)


def test_every_series_of_a_node_carries_its_name_and_the_nodes_sum(nodes: list[Daemon]) -> None:
    entries = 0
    for i, d in enumerate(nodes):
        text = scrape(d)
        fams = list(text_string_to_metric_families(text))
        assert {f.name for f in fams} >= {
            "tenantkv_build_info",
            "process_cpu_seconds",
            "python_info",
        }
        assert all(s.labels.get("node") == f"n{i}" for f in fams for s in f.samples)
        entries += sum(
            s.value
            for f in fams
            for s in f.samples
            if s.name == "tenantkv_bucket_entries" and s.labels["bucket"] == BUCKET
        )
        if shutil.which("promtool"):
            lint = subprocess.run(
                ["promtool", "check", "metrics"], input=text, text=True, capture_output=True
            )
            assert lint.returncode == 0, lint.stdout + lint.stderr
        up = {
            s.labels["member"]: s.value
            for f in fams
            for s in f.samples
            if s.name == "tenantkv_cluster_member_up"
        }
        assert up == {"n0": 1.0, "n1": 1.0, "n2": 1.0}
        lease = [
            s.value for f in fams for s in f.samples if s.name == "tenantkv_cluster_lease_valid"
        ]
        assert lease == [1.0]
    assert entries == KEYS  # each key on one node: the nodes' series sum to the cluster


def test_cluster_status_adds_each_nodes_figures_and_sums_them(nodes: list[Daemon]) -> None:
    doc = json.loads(admin(nodes[1], "--json", "cluster-status"))
    totals = doc["totals"]
    assert sorted(totals["nodes"]) == ["n0", "n1", "n2"] and totals["nodes_counted"] == 3
    for name, figures in totals["nodes"].items():
        with nodes[int(name[1:])].client() as c:
            st = c.server_status()
        assert figures["keys"] == st["buckets"][BUCKET]["entries"] > 0  # from that node
        assert figures["write_units"] > 0 and figures["ops"] > 0
    summed = totals["cluster"]
    assert summed["keys"] == KEYS
    assert summed["ops"] >= KEYS + 3  # the sets, and the mget: a part on each node
    for key in ("ops", "read_units", "write_units", "keys"):
        assert summed[key] == sum(f[key] for f in totals["nodes"].values())
    text = admin(nodes[1], "cluster-status")
    assert "cluster (3 of 3 nodes)" in text and "WRITE UNITS" in text

    # A node down: its row says so, the sum covers the others.
    nodes[2].kill()
    wait_until(lambda: full_map(cluster_status(nodes[0]), 2), timeout=15, what="n2 down")
    doc = json.loads(admin(nodes[0], "--json", "cluster-status"))
    assert doc["totals"]["nodes"]["n2"] == {"error": "down"}
    assert doc["totals"]["nodes_counted"] == 2
    assert doc["totals"]["cluster"]["keys"] == KEYS - totals["nodes"]["n2"]["keys"]
    assert "cluster (2 of 3 nodes)" in admin(nodes[0], "cluster-status")
