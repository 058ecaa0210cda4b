"""End to end: a rebalance under continuous writes from both doors loses no
acknowledged write. Three real nodes and a real etcd; a fourth node joins and
``rebalance`` gives it its share, then ``node-remove`` empties one of the
first three; every key must then read its last acknowledged value."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tenantkv import errors
from tenantkv.client.cluster import ClusterClient
from tenantkv.cluster.slots import SLOTS, key_slot
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer
from .test_cluster_e2e import cluster_status, create_bucket, start_nodes

BUCKET = "rb"
#: Keys each writer cycles over (spread over every slot range).
KEYS = 300
#: Slots per batch: 4 batches a move here (fewer round trips than the default 256;
#: the data is small), still several batches and switches each way.
BATCH = 1024


class Writer:
    """Writes each of its keys with increasing values, remembering the last one
    acknowledged per key. An error that leaves the outcome unknown (a lost
    connection) makes it write the same value again until acknowledged, so that
    the last value it knows of is the one the key must hold."""

    def __init__(self, prefix: str, write: Callable[[bytes, bytes], None]) -> None:
        self.prefix = prefix
        self.write = write
        self.acked: dict[bytes, int] = {}
        self.errors: dict[str, int] = {}
        self.not_retryable: list[str] = []
        self.writes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            for i in range(KEYS):
                if self.stop.is_set():
                    return
                key = f"{self.prefix}:{i}".encode()
                while not self.stop.is_set():
                    try:
                        self.write(key, str(n).encode())
                    except BaseException as exc:
                        self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                        if not retryable(exc):
                            self.not_retryable.append(traceback.format_exc())
                            return
                        continue
                    self.acked[key] = n
                    self.writes += 1
                    break


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, errors.TenantKVError):
        return exc.has_label(errors.RETRYABLE) or isinstance(exc, errors.ConnectionClosed)
    if type(exc) is redis.exceptions.ClusterError and str(exc) == "TTL exhausted.":
        # redis-py's own retries (16, about 0.6 s of -TRYAGAIN) ran out before a
        # switch's pause ended on a loaded machine; none ran (docs/cluster.md).
        return True
    return isinstance(
        exc,
        (
            redis.exceptions.TryAgainError,
            redis.exceptions.ClusterDownError,
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.MovedError,
            redis.exceptions.AskError,
        ),
    )


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str) -> Iterator[list[Daemon]]:
    """Three nodes; a test appends the nodes it starts, and all are killed after."""
    nodes = start_nodes(tmp_path, etcd_server, etcd_prefix, 3)
    yield nodes
    for d in nodes:
        d.kill()


def fourth_node(tmp_path: Path) -> Daemon:
    d = Daemon(
        tmp_path / "n3" / "data",
        extra_args=[
            "--config",
            str(tmp_path / "cluster.toml"),
            "--node-name",
            "n3",
            "--advertise",
            "127.0.0.1:0",
        ],
    )
    d.data_dir.parent.mkdir(parents=True)
    return d.start()


def slot_counts(d: Daemon) -> dict[str, int]:
    return {n: v["slots"] for n, v in cluster_status(d)["map"]["nodes"].items()}


def rebalanced(d: Daemon) -> bool:
    m = cluster_status(d)["map"]
    return m["rebalance"] is None and m["slots_assigned"] == SLOTS


def test_rebalance_and_node_remove_under_writes_lose_no_acknowledged_write(
    cluster: list[Daemon], tmp_path: Path
) -> None:
    wait_until(lambda: cluster_status(cluster[0])["map"]["slots_assigned"] == SLOTS)
    create_bucket(cluster, BUCKET)
    cc = ClusterClient(
        cluster[0].host, cluster[0].port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET
    )
    rc = RedisCluster(
        startup_nodes=[ClusterNode(cluster[1].host, cluster[1].resp_port)],
        username=f"admin@{BUCKET}",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )
    writers = [Writer("m", lambda k, v: cc.set(k, v)), Writer("r", lambda k, v: rc.set(k, v))]
    try:
        for w in writers:
            w.thread.start()
        wait_until(
            lambda: all(w.writes > KEYS for w in writers),
            timeout=30,
            what=f"a round of writes {[(w.writes, w.errors) for w in writers]}",
        )

        # A fourth node joins: it gets slots only from a rebalance.
        cluster.append(fourth_node(tmp_path))
        nodes = list(cluster)
        wait_until(lambda: "n3" in slot_counts(nodes[0]), what="n3 in the map")
        assert slot_counts(nodes[0])["n3"] == 0
        with nodes[2].client() as admin:  # (any node: it goes to the coordinator)
            started = admin.command("cluster_rebalance", batch_slots=BATCH)
        assert started["total"] == SLOTS // 4
        wait_until(lambda: rebalanced(nodes[0]), timeout=120, what="the rebalance")
        assert sorted(slot_counts(nodes[0]).values()) == [4096] * 4

        # node-remove: all of n1's slots go to the other three, then it leaves the map.
        with nodes[0].client() as admin:
            admin.command("cluster_node_remove", name="n1", batch_slots=BATCH)
        wait_until(
            lambda: "n1" not in slot_counts(nodes[3]) and rebalanced(nodes[3]),
            timeout=120,
            what="n1 removed",
        )
        assert sorted(slot_counts(nodes[3]).values()) == [5461, 5461, 5462]
        rounds = [w.writes for w in writers]
        wait_until(
            lambda: all(w.writes > r + KEYS for w, r in zip(writers, rounds, strict=True)),
            timeout=30,
            what=f"writes after the moves {[(w.writes, w.errors, w.not_retryable) for w in writers]}",  # noqa: E501
        )
    finally:
        for w in writers:
            w.stop.set()
        for w in writers:
            w.thread.join(30)

    for w in writers:
        assert not w.not_retryable, w.not_retryable[:3]
    # Every key reads its last acknowledged value, through either door.
    for w in writers:
        assert len(w.acked) == KEYS
        for key, n in w.acked.items():
            assert cc.get(key) == str(n).encode(), (key, n, key_slot(key))
            assert rc.get(key) == str(n).encode(), (key, n)
    status = cluster_status(nodes[0])
    assert status["map"]["rebalance"] is None and status["map"]["removed"] == ["n1"]

    # Each node holds the keys of its own slots only: the moved ones were dropped
    # (the removed node holds none).
    def entries(d: Daemon) -> int:
        with d.client() as c:
            return sum(b["entries"] for b in c.list_buckets() if b["name"] == BUCKET)

    wait_until(lambda: entries(nodes[1]) == 0, what="n1 dropped its copies")
    assert sum(entries(d) for d in nodes) == 2 * KEYS
    cc.close()
    rc.close()
    print({w.prefix: (w.writes, w.errors) for w in writers})


def test_a_rebalance_goes_on_after_its_coordinator_is_killed(
    cluster: list[Daemon], tmp_path: Path
) -> None:
    """kill -9 of the coordinator in the middle of a rebalance (it is also a source
    of moves): another node takes the office and resumes from the map (a move in
    phase copy starts over, one in phase switch is finished), the killed node
    comes back and drops what it no longer owns, and no acknowledged write is lost."""
    wait_until(lambda: cluster_status(cluster[0])["map"]["slots_assigned"] == SLOTS)
    create_bucket(cluster, BUCKET)
    cc = ClusterClient(
        cluster[0].host, cluster[0].port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET
    )
    writer = Writer("k", lambda k, v: cc.set(k, v))
    cluster.append(fourth_node(tmp_path))
    nodes = list(cluster)
    try:
        writer.thread.start()
        wait_until(lambda: writer.writes > KEYS, timeout=30, what="a round of writes")
        wait_until(lambda: "n3" in slot_counts(nodes[0]), what="n3 in the map")
        statuses = [cluster_status(d) for d in nodes[:3]]
        coordinator = nodes[next(i for i, s in enumerate(statuses) if s["coordinator"])]
        others = [d for d in nodes if d is not coordinator]
        with others[0].client() as admin:
            admin.command("cluster_rebalance", batch_slots=256)

        def some_moved() -> bool:
            progress = cluster_status(others[0])["map"]["rebalance"]
            return progress is not None and progress["moved"] >= 512  # two batches of 16

        wait_until(some_moved, timeout=60, what="a few batches moved")
        coordinator.kill()
        coordinator.start()  # (same data directory and name)
        wait_until(lambda: rebalanced(others[0]), timeout=120, what="the rebalance")
        assert sorted(slot_counts(others[0]).values()) == [4096] * 4
        done = writer.writes
        wait_until(
            lambda: writer.writes > done + KEYS,
            timeout=30,
            what=f"writes after the rebalance {writer.errors} {writer.not_retryable}",
        )
    finally:
        writer.stop.set()
        writer.thread.join(30)
    assert not writer.not_retryable, writer.not_retryable[:3]
    for key, n in writer.acked.items():
        assert cc.get(key) == str(n).encode(), (key, n, key_slot(key))

    def entries(d: Daemon) -> int:
        with d.client() as c:
            return sum(b["entries"] for b in c.list_buckets() if b["name"] == BUCKET)

    wait_until(lambda: sum(entries(d) for d in nodes) == KEYS, what="old copies dropped")
    cc.close()
