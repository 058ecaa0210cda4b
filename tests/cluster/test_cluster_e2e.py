"""End to end: a real etcd and real ``tenantkv serve --cluster`` processes on
loopback: they join, one coordinator assigns the slots, every node follows the
map; a node killed with SIGKILL loses its lease and the map marks it down."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantkv.cluster.slots import SLOTS
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer


def cluster_status(d: Daemon) -> dict[str, Any]:
    with d.client() as c:
        return c.server_status()["cluster"]  # type: ignore[no-any-return]


#: The nodes' etcd lease (s). A node that renews nothing for this long fences its
#: writes: a loaded 2-core machine once held a node's renewals back 2.1 s, and a
#: test's own writes then failed (NodeUnavailable, lease lapsed) with a 1 s lease.
LEASE_TTL = 3


def start_nodes(
    tmp_path: Path, etcd: EtcdServer, prefix: str, count: int, *, ttl: int = LEASE_TTL
) -> list[Daemon]:
    config = tmp_path / "cluster.toml"
    config.write_text(
        f'cluster = "{etcd.url}"\ncluster_prefix = "{prefix}"\n'
        f"cluster_lease_ttl_secs = {ttl}\ncluster_min_nodes = {count}\n"
    )
    nodes = [
        Daemon(
            tmp_path / f"n{i}" / "data",
            extra_args=[
                "--config",
                str(config),
                "--node-name",
                f"n{i}",
                "--advertise",
                "127.0.0.1:0",
            ],
        )
        for i in range(count)
    ]
    procs: list[Daemon] = []
    try:
        for d in nodes:
            d.data_dir.parent.mkdir(parents=True)
            procs.append(d.start())
    except BaseException:
        for d in procs:
            d.kill()
        raise
    return nodes


def create_bucket(nodes: list[Daemon], name: str, timeout: float = 2.0) -> None:
    """Create bucket ``name`` on the first node (it is the cluster's) and wait
    until every node serves it."""
    with nodes[0].client() as c:
        c.create_bucket(name)

    def everywhere() -> bool:
        for d in nodes:
            with d.client() as c:
                if name not in {b["name"] for b in c.list_buckets()}:
                    return False
        return True

    wait_until(everywhere, timeout=timeout, what=f"bucket {name!r} on every node")


@contextlib.contextmanager
def serving(
    tmp_path: Path,
    etcd: EtcdServer,
    prefix: str,
    count: int,
    *,
    bucket: str,
    ttl: int = LEASE_TTL,
) -> Iterator[list[Daemon]]:
    """``count`` nodes sharing the slots, with ``bucket`` made; killed on the way out."""
    nodes = start_nodes(tmp_path, etcd, prefix, count, ttl=ttl)
    try:
        wait_until(
            lambda: all(full_map(cluster_status(d), count) for d in nodes), what=f"map of {count}"
        )
        create_bucket(nodes, bucket)
        yield nodes
    finally:
        for d in nodes:
            d.kill()


def admin_cli(d: Daemon, *args: str, timeout: float = 60) -> str:
    """``tenantkv-admin`` against node ``d`` as the admin: its standard output."""
    argv = [sys.executable, "-m", "tenantkv_admin.cli", "--port", str(d.port)]
    return subprocess.run(
        [*argv, "--password", ADMIN_PASSWORD, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout


@pytest.fixture
def three_nodes(
    tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str
) -> Iterator[list[Daemon]]:
    nodes = start_nodes(tmp_path, etcd_server, etcd_prefix, 3)
    yield nodes
    for d in nodes:
        d.kill()


def full_map(status: dict[str, Any], up: int) -> bool:
    m = status["map"]
    return m["slots_assigned"] == SLOTS and sum(n["up"] for n in m["nodes"].values()) == up


def test_three_nodes_share_the_slots_and_a_killed_one_is_marked_down(
    three_nodes: list[Daemon], tmp_path: Path
) -> None:
    for i, d in enumerate(three_nodes):
        ready = json.loads((d.data_dir.parent / f"ready-{d.data_dir.name}.json").read_text())
        assert ready["node"] == f"n{i}"
    wait_until(
        lambda: all(full_map(cluster_status(d), 3) for d in three_nodes),
        what="every node sees the map of 3",
    )
    statuses = [cluster_status(d) for d in three_nodes]
    assert sum(s["coordinator"] for s in statuses) == 1
    maps = [s["map"] for s in statuses]
    assert maps[0] == maps[1] == maps[2]
    nodes = maps[0]["nodes"]
    assert sorted(nodes) == ["n0", "n1", "n2"]
    assert sorted(n["slots"] for n in nodes.values()) == [5461, 5461, 5462]
    for i, d in enumerate(three_nodes):
        assert nodes[f"n{i}"]["address"] == f"127.0.0.1:{d.port}"
        assert nodes[f"n{i}"]["resp_address"] == f"127.0.0.1:{d.resp_port}"
    version = maps[0]["version"]

    # SIGKILL: no goodbye. The lease (TTL 1 s) expires and the coordinator marks
    # the node down; its slots stay its own (its data is there alone).
    coordinator = next(i for i, s in enumerate(statuses) if s["coordinator"])
    victim = three_nodes[(coordinator + 1) % 3]
    victim.kill()
    survivors = [d for d in three_nodes if d is not victim]
    wait_until(
        lambda: all(full_map(cluster_status(d), 2) for d in survivors),
        timeout=15,
        what="the survivors see the victim down",
    )
    after = cluster_status(survivors[0])["map"]
    assert after["version"] > version
    victim_name = f"n{three_nodes.index(victim)}"
    assert after["nodes"][victim_name]["up"] is False
    assert after["nodes"][victim_name]["slots"] == nodes[victim_name]["slots"]

    # It comes back (same data directory, same name): up again, same slots.
    victim.start()
    wait_until(
        lambda: all(full_map(cluster_status(d), 3) for d in three_nodes),
        timeout=15,
        what="the victim back up",
    )
    assert (
        cluster_status(victim)["map"]["nodes"][victim_name]["slots"]
        == (nodes[victim_name]["slots"])
    )


def test_the_coordinator_killed_another_takes_over(
    three_nodes: list[Daemon],
) -> None:
    wait_until(
        lambda: all(full_map(cluster_status(d), 3) for d in three_nodes), what="the map of 3"
    )
    statuses = [cluster_status(d) for d in three_nodes]
    coordinator = next(i for i, s in enumerate(statuses) if s["coordinator"])
    three_nodes[coordinator].kill()
    survivors = [d for i, d in enumerate(three_nodes) if i != coordinator]
    wait_until(
        lambda: full_map(cluster_status(survivors[0]), 2),
        timeout=15,
        what="a new coordinator marks the old one down",
    )
    assert sum(cluster_status(d)["coordinator"] for d in survivors) == 1


def test_graceful_stop_leaves_at_once(
    tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    # A long lease: only the revoke on SIGTERM can mark the node down quickly.
    nodes = start_nodes(tmp_path, etcd_server, etcd_prefix, 2, ttl=60)
    try:
        wait_until(lambda: full_map(cluster_status(nodes[0]), 2), what="the map of 2")
        assert nodes[1].stop(signal.SIGTERM) == 0
        wait_until(
            lambda: full_map(cluster_status(nodes[0]), 1),
            timeout=5,
            what="the stopped node marked down",
        )
    finally:
        for d in nodes:
            d.kill()


def test_admin_cluster_status(three_nodes: list[Daemon]) -> None:
    d = three_nodes[0]
    wait_until(lambda: full_map(cluster_status(d), 3), what="the map of 3")
    doc = json.loads(admin_cli(d, "--json", "cluster-status", timeout=30))
    assert doc["node"] == "n0" and doc["map"]["slots_assigned"] == SLOTS
    text = admin_cli(d, "cluster-status", timeout=30)
    assert "map version" in text and "n2" in text and "0-5461" in text


def test_a_single_node_has_no_cluster(daemon: Daemon) -> None:
    ready = json.loads((daemon.data_dir.parent / f"ready-{daemon.data_dir.name}.json").read_text())
    assert ready["node"] is None
    with daemon.client() as c:
        assert "cluster" not in c.server_status()
