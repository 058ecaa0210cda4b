"""Cluster-wide metadata end to end: a real etcd and real ``serve --cluster``
nodes. A bucket or user made on one node is every node's (both doors), a drop
is everywhere, etcd holds hashes and not passwords, and with etcd down admin
changes are refused while data keeps serving."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from tenantkv import errors
from tenantkv.client.cluster import ClusterClient
from tenantkv.cluster.etcd import prefix_end
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer
from .test_cluster_e2e import cluster_status, full_map, start_nodes
from .test_routing_e2e import key_on


@pytest.fixture(scope="module")
def two_nodes(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[tuple[list[Daemon], str]]:
    tmp: Path = tmp_path_factory.mktemp("metadata")
    prefix = f"/metadata-{tmp.name}"
    nodes = start_nodes(tmp, etcd_server, prefix, 2)
    try:
        wait_until(lambda: all(full_map(cluster_status(d), 2) for d in nodes), what="map of 2")
        yield nodes, prefix
    finally:
        for d in nodes:
            d.kill()


def buckets_of(d: Daemon) -> set[str]:
    with d.client() as c:
        return {b["name"] if isinstance(b, dict) else b for b in c.list_buckets()}


def users_of(d: Daemon) -> set[str]:
    with d.client() as c:
        return {u["name"] if isinstance(u, dict) else u for u in c.list_users()}


def seen_within(predicate: object, timeout: float) -> float:
    """Seconds until ``predicate()`` holds (polled), or an AssertionError."""
    start = time.monotonic()
    wait_until(predicate, timeout=timeout, what="the change on the other node")
    return time.monotonic() - start


def test_a_bucket_created_on_one_node_serves_through_every_node_on_both_doors(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    (a, b), _ = two_nodes
    with a.client() as c:
        c.create_bucket("shop")
    # The answer came after etcd took it: b follows by its watch (~10 ms; 2 s
    # is the bound a loaded test machine cannot miss).
    seen_within(lambda: "shop" in buckets_of(b), 2.0)
    with b.client() as c, pytest.raises(errors.BucketExists):
        c.create_bucket("shop")  # the name is the cluster's now
    keys = [key_on([a, b], a, "mp"), key_on([a, b], b, "mp")]
    with ClusterClient(
        b.host, b.port, user="admin", password=ADMIN_PASSWORD, bucket="shop", timeout=20.0
    ) as cc:
        for k in keys:
            cc.set(k, b"v-" + k)
        assert [cc.get(k) for k in keys] == [b"v-" + k for k in keys]
    rc = RedisCluster(
        startup_nodes=[ClusterNode(b.host, b.resp_port)],
        username="admin@shop",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )
    try:
        for k in keys:
            rc.set(b"r" + k, b"resp")
            assert rc.get(b"r" + k) == b"resp"
    finally:
        rc.close()


def test_a_user_created_on_one_node_logs_in_on_another_and_its_deletion_is_everywhere(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    (a, b), _ = two_nodes
    with a.client() as c:
        c.create_bucket("crm")
        c.create_user("alice", "alice-secret-1", roles={"crm": "readwrite"})
    seen_within(lambda: "alice" in users_of(b), 2.0)
    with b.client(user="alice", password="alice-secret-1", bucket="crm") as c:
        c.set(key_on([a, b], b, "alice"), b"hers")
    with b.client() as c:
        c.delete_user("alice")  # on the other node this time
    seen_within(lambda: "alice" not in users_of(a), 2.0)
    with (
        pytest.raises(errors.AuthenticationFailed),
        a.client(user="alice", password="alice-secret-1", bucket="crm") as c,
    ):
        c.exists(b"x")


def test_a_bucket_dropped_on_one_node_is_gone_from_every_node(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    (a, b), _ = two_nodes
    with a.client() as c:
        c.create_bucket("tmp")
    seen_within(lambda: "tmp" in buckets_of(b), 2.0)
    key = key_on([a, b], b, "drop")
    with b.client(bucket="tmp") as c:
        c.set(key, b"old")
    with a.client() as c:
        c.delete_bucket("tmp")
    seen_within(lambda: "tmp" not in buckets_of(b), 2.0)
    with pytest.raises(errors.BucketNotFound), b.client(bucket="tmp") as c:
        c.get(key)
    # Created anew, it is a new tenant on every node: the old data went with the drop.
    with a.client() as c:
        c.create_bucket("tmp")
    seen_within(lambda: "tmp" in buckets_of(b), 2.0)
    with b.client(bucket="tmp") as c:
        assert c.get(key) is None


def test_etcd_holds_password_hashes_never_passwords(
    two_nodes: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    (a, _), prefix = two_nodes
    with a.client() as c:
        c.create_user("bob", "bob-plain-password-9")
    root = f"{prefix}/meta/".encode()
    reply = httpx.post(
        f"{etcd_server.url}/v3/kv/range",
        json={
            "key": base64.b64encode(root).decode(),
            "range_end": base64.b64encode(prefix_end(root)).decode(),
        },
        timeout=5,
    ).json()
    values = {
        base64.b64decode(kv["key"])[len(root) :]: base64.b64decode(kv["value"])
        for kv in reply["kvs"]
    }
    assert b"user:bob" in values and b"user:admin" in values
    for raw in values.values():
        assert b"bob-plain-password-9" not in raw and ADMIN_PASSWORD.encode() not in raw


def test_with_etcd_down_admin_changes_are_refused_and_data_keeps_serving(
    tmp_path: Path,
) -> None:
    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd" / "data").start()
    nodes: list[Daemon] = []
    try:
        nodes = start_nodes(tmp_path, etcd, "/down", 1)
        (a,) = nodes
        wait_until(lambda: full_map(cluster_status(a), 1), what="map of 1")
        with a.client() as c:
            c.create_bucket("kept")
        with a.client(bucket="kept") as c:
            c.set(b"k", b"v")
        etcd.stop()
        with a.client() as c:
            with pytest.raises(errors.NodeUnavailable, match="etcd"):
                c.create_bucket("refused")
            with pytest.raises(errors.NodeUnavailable, match="etcd"):
                c.create_user("carol", "carol-secret-1")
            assert "refused" not in {b["name"] for b in c.list_buckets()}
        with a.client(bucket="kept") as c:
            assert c.get(b"k") == b"v"  # reads keep serving on the copy held
        etcd.restart()

        def created() -> bool:
            try:
                with a.client() as c:
                    c.create_bucket("after")
                return True
            except errors.NodeUnavailable:
                return False

        wait_until(created, timeout=20.0, what="admin changes once etcd is back")
    finally:
        for d in nodes:
            d.kill()
        etcd.stop()


def test_redis_door_sees_a_bucket_made_on_another_node(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    (a, b), _ = two_nodes
    with a.client() as c:
        c.create_bucket("resp")
    seen_within(lambda: "resp" in buckets_of(b), 2.0)
    key = key_on([a, b], b, "resp")
    r = redis.Redis(host=b.host, port=b.resp_port, username="admin@resp", password=ADMIN_PASSWORD)
    try:
        assert r.set(key, b"1") is True
        assert r.get(key) == b"1"
    finally:
        r.close()


def test_bucket_throttle_properties_and_runtime_parameters_are_the_clusters(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    (a, b), _ = two_nodes
    with a.client() as c:
        c.create_bucket("limited")
        c.set_bucket_throttle("limited", {"reserved": 10, "hard_limit": 500})
        c.command("set_parameter", name="bucket_queue_tolerance", value=7)

    def b_has_them() -> bool:
        with b.client() as c:
            limits = c.get_bucket_throttle("limited") if "limited" in buckets_of(b) else None
            param = c.command("get_parameter", name="bucket_queue_tolerance")
        return limits == {"reserved": 10, "hard_limit": 500} and param["value"] == 7

    wait_until(b_has_them, timeout=2.0, what="throttle properties and parameter on b")


def test_two_nodes_racing_to_create_one_bucket_one_wins(
    two_nodes: tuple[list[Daemon], str],
) -> None:
    nodes, _ = two_nodes
    clients = [d.client() for d in nodes]
    outcomes: list[str] = []

    def create(i: int) -> None:
        try:
            clients[i].create_bucket("race")
            outcomes.append("created")
        except errors.BucketExists:
            outcomes.append("exists")

    try:
        threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert sorted(outcomes) == ["created", "exists"]
    seen_within(lambda: all("race" in buckets_of(d) for d in nodes), 2.0)


def test_a_node_away_during_changes_takes_them_when_it_returns(
    tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    nodes = start_nodes(tmp_path, etcd_server, etcd_prefix, 2)
    try:
        a, b = nodes
        wait_until(lambda: all(full_map(cluster_status(d), 2) for d in nodes), what="map of 2")
        with a.client() as c:
            c.create_bucket("gone")
            c.create_bucket("kept")
        seen_within(lambda: {"gone", "kept"} <= buckets_of(b), 2.0)
        b.kill()
        with a.client() as c:
            c.delete_bucket("gone")
            c.create_user("dave", "dave-secret-1", roles={"kept": "read"})
        b.start()  # same data directory and name: it compares its copy with etcd's
        assert "gone" not in buckets_of(b) and "kept" in buckets_of(b)
        assert "dave" in users_of(b)
    finally:
        for d in nodes:
            d.kill()


def test_a_record_that_is_not_one_is_ignored_and_the_nodes_keep_following(
    two_nodes: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    (a, b), prefix = two_nodes
    key = f"{prefix}/meta/bucket:junk".encode()
    httpx.post(
        f"{etcd_server.url}/v3/kv/put",
        json={"key": base64.b64encode(key).decode(), "value": base64.b64encode(b"\xc1").decode()},
        timeout=5,
    ).raise_for_status()
    with a.client() as c:
        c.create_bucket("after-junk")
    seen_within(lambda: "after-junk" in buckets_of(b), 2.0)
    assert "junk" not in buckets_of(b)
