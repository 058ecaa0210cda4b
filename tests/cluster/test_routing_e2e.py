"""Routing on both doors against 3 real nodes and a real etcd: redis-py's
RedisCluster and ``-MOVED``/``-CROSSSLOT``/``-CLUSTERDOWN`` on RESP,
``NotMyPartition``/``NodeUnavailable`` on MessagePack, ``CLUSTER`` replies."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from redis.cluster import ClusterNode, RedisCluster

from tenantkv import errors
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.peer import peer_session
from tenantkv.cluster.routing import HOLD_SECS, node_id
from tenantkv.cluster.slots import SLOTS, key_slot
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer
from .test_cluster_e2e import cluster_status, create_bucket, full_map, serving, start_nodes
from .test_peer import read_secret

BUCKET = "app"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[list[Daemon]]:
    """Three nodes (a lease of 2 s) and the bucket (the cluster's: made on one node)."""
    tmp: Path = tmp_path_factory.mktemp("routing")
    with serving(tmp, etcd_server, f"/routing-{tmp.name}", 3, bucket=BUCKET) as nodes:
        yield nodes


def owner_of(nodes: list[Daemon], key: bytes) -> Daemon:
    ranges = cluster_status(nodes[0])["map"]["nodes"]
    slot = key_slot(key)
    for i, d in enumerate(nodes):
        if any(s <= slot <= e for s, e in ranges[f"n{i}"]["ranges"]):
            return d
    raise AssertionError(f"no owner for slot {slot}")


def key_on(nodes: list[Daemon], d: Daemon, tag: str = "") -> bytes:
    """A key whose slot ``d`` owns."""
    for i in range(10_000):
        key = f"{tag}k{i}".encode()
        if owner_of(nodes, key) is d:
            return key
    raise AssertionError("no key found")


def resp(d: Daemon) -> redis.Redis:
    return redis.Redis(
        host=d.host,
        port=d.resp_port,
        username=f"admin@{BUCKET}",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )


def test_redis_py_cluster_client_routes_by_the_map(cluster: list[Daemon]) -> None:
    rc = RedisCluster(
        startup_nodes=[ClusterNode(cluster[0].host, cluster[0].resp_port)],
        username=f"admin@{BUCKET}",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )
    try:
        assert len(rc.get_nodes()) == 3
        values = {f"user:{i}".encode(): f"v{i}".encode() for i in range(300)}
        for k, v in values.items():
            assert rc.set(k, v)
        for k, v in values.items():
            assert rc.get(k) == v
        # Each key is stored on its slot's node and nowhere else.
        for k, v in list(values.items())[:60]:
            home = owner_of(cluster, k)
            for d in cluster:
                with d.client(bucket=BUCKET) as c:
                    if d is home:
                        assert c.get(k) == v
                    else:
                        with pytest.raises(errors.NotMyPartition):
                            c.get(k)
        # A hashtag keeps keys together: MSET/MGET across them work.
        assert rc.mset_nonatomic({b"{u1}a": b"1", b"{u1}b": b"2"}) is not None
        assert rc.mget_nonatomic([b"{u1}a", b"{u1}b"]) == [b"1", b"2"]
    finally:
        rc.close()


def test_moved_crossslot_and_cluster_replies(cluster: list[Daemon]) -> None:
    n0, n1 = cluster[0], cluster[1]
    theirs = key_on(cluster, n1)
    r = resp(n0)
    try:
        with pytest.raises(redis.exceptions.MovedError) as moved:  # "-MOVED slot host:port"
            r.get(theirs)
        assert (moved.value.slot_id, moved.value.host, moved.value.port) == (
            key_slot(theirs),
            "127.0.0.1",
            n1.resp_port,
        )
        mine = key_on(cluster, n0)
        assert r.set(mine, b"here") and r.get(mine) == b"here"
        # Keys of two slots: refused before ownership is even asked.
        with pytest.raises(redis.exceptions.ClusterCrossSlotError):  # "-CROSSSLOT ..."
            r.mget(mine, theirs)
        assert r.execute_command("CLUSTER", "KEYSLOT", "{user1000}.following") == key_slot(
            b"user1000"
        )
        assert r.execute_command("CLUSTER", "MYID") == node_id("n0").encode()
        slots = r.execute_command("CLUSTER", "SLOTS")
        assert sum(e - s + 1 for s, e, *_ in slots) == SLOTS
        text = r.execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else str(text)
        assert text.count("master") == 3 and "myself,master" in text
        info = r.execute_command("CLUSTER", "INFO")
        assert b"cluster_state:ok" in (info if isinstance(info, bytes) else str(info).encode())
        with pytest.raises(redis.exceptions.ResponseError, match="unknown subcommand"):
            r.execute_command("CLUSTER", "BOGUS")
    finally:
        r.close()


def test_msgpack_door_refuses_other_nodes_keys_with_the_map_version(
    cluster: list[Daemon],
) -> None:
    n0, n2 = cluster[0], cluster[2]
    theirs = key_on(cluster, n2)
    version = cluster_status(n0)["map"]["version"]
    with n0.client(bucket=BUCKET) as c:
        with pytest.raises(errors.NotMyPartition) as refused:
            c.set(theirs, b"v")
        assert refused.value.has_label(errors.RETRYABLE)
        assert f"127.0.0.1:{n2.port}" in refused.value.errmsg
        assert f"map version {version}" in refused.value.errmsg
        mine = key_on(cluster, n0)
        c.set(mine, b"ok")
        assert c.get(mine) == b"ok"
    with n2.client(bucket=BUCKET) as c:
        c.set(theirs, b"v")  # the owner serves it
        assert c.get(theirs) == b"v"


def test_a_single_node_has_no_cluster_command(daemon: Daemon) -> None:
    r = redis.Redis(
        host=daemon.host,
        port=daemon.resp_port,
        username="admin",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="cluster support disabled"):
            r.execute_command("CLUSTER", "SLOTS")
        assert r.execute_command("CLUSTER", "KEYSLOT", "foo") == 12182
    finally:
        r.close()


def test_a_down_node_slots_are_unavailable_the_others_serve(
    tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    nodes = start_nodes(tmp_path, etcd_server, etcd_prefix, 2)
    try:
        wait_until(lambda: full_map(cluster_status(nodes[0]), 2), what="map of 2")
        create_bucket(nodes, BUCKET)
        theirs, mine = key_on(nodes, nodes[1]), key_on(nodes, nodes[0])
        nodes[1].kill()
        wait_until(lambda: full_map(cluster_status(nodes[0]), 1), timeout=15, what="n1 down")
        with nodes[0].client(bucket=BUCKET) as c:
            with pytest.raises(errors.NodeUnavailable, match="n1 is down"):
                c.get(theirs)
            c.set(mine, b"still served")
        r = resp(nodes[0])
        try:
            with pytest.raises(redis.exceptions.ClusterDownError, match="n1 is down"):
                r.get(theirs)
            assert r.get(mine) == b"still served"
        finally:
            r.close()
    finally:
        for d in nodes:
            d.kill()


def test_cluster_client_routes_splits_and_follows_a_moved_map(cluster: list[Daemon]) -> None:
    from tenantkv.client.cluster import ClusterClient, SlotMap

    n0 = cluster[0]
    with ClusterClient(
        n0.host, n0.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
    ) as cc:
        values = {f"cc:{i}".encode(): f"w{i}".encode() for i in range(200)}
        for k, v in values.items():
            cc.set(k, v)
        keys = list(values)
        assert cc.mget(keys) == [values[k] for k in keys]  # split by node, in key order
        assert cc.mget([*keys[:3], b"cc:missing"]) == [*(values[k] for k in keys[:3]), None]
        for k in keys[:30]:
            with owner_of(cluster, k).client(bucket=BUCKET) as c:
                assert c.get(k) == values[k]  # stored on its slot's node
        assert len({cc.map.node_of(k) for k in keys}) == 3

        # A stale map (every range shifted to the next node): each request is
        # refused with NotMyPartition, did not run; the client reads the map again.
        with n0.client(bucket=BUCKET) as c:
            doc = c.command("cluster_map")
        names = sorted(doc["nodes"])
        doc["ranges"] = [[s, e, names[(names.index(n) + 1) % 3]] for s, e, n in doc["ranges"]]
        cc.map = SlotMap(doc)
        assert cc.get(keys[0]) == values[keys[0]]
        assert cc.map_refreshes == 1
        cc.map = SlotMap(doc)
        assert cc.mget(keys) == [values[k] for k in keys]
        assert cc.map_refreshes == 2


def test_cluster_client_needs_a_cluster(daemon: Daemon) -> None:
    from tenantkv.client.cluster import ClusterClient

    with daemon.client() as c:
        assert c.command("cluster_map") == {"enabled": False}
    with pytest.raises(errors.ClientError, match="not in a cluster"):
        ClusterClient(daemon.host, daemon.port, user="admin", password=ADMIN_PASSWORD)


def test_etcd_down_reads_serve_writes_fenced_then_all_converges(tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd" / "data")
    etcd.data_dir.parent.mkdir()
    etcd.start()
    nodes: list[Daemon] = []
    try:
        nodes = start_nodes(tmp_path, etcd, "/fenced", 2)
        wait_until(lambda: full_map(cluster_status(nodes[0]), 2), what="map of 2")
        with nodes[0].client() as c:
            c.create_bucket(BUCKET)
        mine = key_on(nodes, nodes[0])
        with nodes[0].client(bucket=BUCKET) as c:
            c.set(mine, b"before")
            etcd.stop()  # etcd down: the lease cannot be renewed
            wait_until(
                lambda: not cluster_status(nodes[0])["lease"]["valid"],
                timeout=10,
                what="the lease to lapse",
            )
            assert c.get(mine) == b"before"  # reads serve on the last map
            with pytest.raises(errors.NodeUnavailable, match="lease lapsed"):
                c.set(mine, b"during")  # writes are fenced
            etcd.restart()
            wait_until(
                lambda: cluster_status(nodes[0])["lease"]["valid"],
                timeout=15,
                what="the node to rejoin",
            )
            c.set(mine, b"after")
            assert c.get(mine) == b"after"
        wait_until(
            lambda: full_map(cluster_status(nodes[1]), 2),
            timeout=15,
            what="both up in the map again",
        )
    finally:
        for d in nodes:
            d.kill()
        etcd.stop()


def test_countkeysinslot_and_getkeysinslot_see_the_tenants_own_keys(
    cluster: list[Daemon],
) -> None:
    slot = key_slot(b"{cs}")
    home = owner_of(cluster, b"{cs}")
    with home.client() as c:
        c.create_bucket("neighbour")
        c.select_bucket("neighbour")
        c.set(b"{cs}:theirs", b"x")  # another tenant's key in the same slot
    r = resp(home)
    try:
        for i in range(3):
            r.set(b"{cs}:%d" % i, b"v")
        assert r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 3
        assert sorted(r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)) == [
            b"{cs}:0",
            b"{cs}:1",
            b"{cs}:2",
        ]
        assert len(r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 2)) == 2
        r.delete(b"{cs}:0")
        assert r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 2
        with pytest.raises(redis.exceptions.ResponseError, match="out of range slot"):
            r.execute_command("CLUSTER", "COUNTKEYSINSLOT", 16384)
    finally:
        r.close()


def test_a_pipeline_mixing_own_and_other_keys_answers_in_order(cluster: list[Daemon]) -> None:
    n0, n1 = cluster[0], cluster[1]
    mine = [key_on(cluster, n0, tag=f"p{i}") for i in range(3)]
    theirs = key_on(cluster, n1, tag="q")
    r = resp(n0)
    try:
        for k in mine:
            r.set(k, k)
        pipe = r.pipeline(transaction=False)
        for k in (mine[0], theirs, mine[1], theirs, mine[2]):
            pipe.get(k)
        pipe.set(theirs, b"nope")
        pipe.set(mine[0], b"yes")
        out = pipe.execute(raise_on_error=False)
        assert out[0] == mine[0] and out[2] == mine[1] and out[4] == mine[2]
        assert all(isinstance(out[i], redis.exceptions.MovedError) for i in (1, 3, 5))
        assert out[6] is True and r.get(mine[0]) == b"yes"
    finally:
        r.close()
    with n1.client(bucket=BUCKET) as c:
        assert c.get(theirs) != b"nope"  # the refused write did not run anywhere


async def test_async_cluster_client_routes_and_splits(cluster: list[Daemon]) -> None:
    from tenantkv.client.cluster import AsyncClusterClient

    n1 = cluster[1]
    async with AsyncClusterClient(
        n1.host, n1.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
    ) as cc:
        values = {f"ac:{i}".encode(): f"a{i}".encode() for i in range(60)}
        for k, v in values.items():
            await cc.set(k, v)
        keys = list(values)
        assert await cc.mget(keys) == [values[k] for k in keys]
        assert {cc.map.node_of(k) for k in keys} == {(d.host, d.port) for d in cluster}  # type: ignore[union-attr]
        assert await cc.get(b"ac:missing") is None
    for k in keys[:10]:
        with owner_of(cluster, k).client(bucket=BUCKET) as c:
            assert c.get(k) == values[k]


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
def test_redis_cli_follows_moved(cluster: list[Daemon]) -> None:
    n0, n2 = cluster[0], cluster[2]
    theirs = key_on(cluster, n2, tag="cli").decode()
    base = [
        "redis-cli",
        "-h",
        n0.host,
        "-p",
        str(n0.resp_port),
        "--user",
        f"admin@{BUCKET}",
        "--pass",
        ADMIN_PASSWORD,
        "--no-auth-warning",
    ]

    def cli(*args: str) -> str:
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=30)
        return done.stdout.strip()

    assert cli("-c", "SET", theirs, "via-cli") == "OK"  # followed -MOVED to n2
    assert cli("-c", "GET", theirs) == "via-cli"
    assert cli("GET", theirs) == f"MOVED {key_slot(theirs.encode())} 127.0.0.1:{n2.resp_port}"
    with n2.client(bucket=BUCKET) as c:
        assert c.get(theirs) == b"via-cli"


def test_info_says_cluster_enabled_on_a_cluster_node(cluster: list[Daemon]) -> None:
    r = resp(cluster[1])
    try:
        assert r.info("cluster") == {"cluster_enabled": 1}
        assert r.info("server")["redis_mode"] == "cluster"
    finally:
        r.close()


def test_connect_gives_a_routing_client_on_a_cluster_and_a_client_on_one_node(
    cluster: list[Daemon], daemon: Daemon
) -> None:
    from tenantkv.client.cluster import ClusterClient, connect
    from tenantkv.client.sync_client import Client

    n1 = cluster[1]
    with connect(n1.host, n1.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET) as c:
        assert isinstance(c, ClusterClient)
        keys = [key_on(cluster, d, "connect") for d in cluster]
        for k in keys:
            c.set(k, b"routed")  # every node's keys, through the one node given
        assert c.mget(keys) == [b"routed"] * 3
    with connect(daemon.host, daemon.port, user="admin", password=ADMIN_PASSWORD) as single:
        assert type(single) is Client
        assert single.list_buckets() is not None


def test_a_transaction_naming_another_nodes_key_runs_nowhere(cluster: list[Daemon]) -> None:
    """RESP: a command of MULTI refused with -MOVED aborts the transaction (EXEC
    answers EXECABORT, the node's own key is not written). MessagePack: the one-
    request transaction is refused whole when one of its keys is another node's."""
    n0, n1 = cluster[0], cluster[1]
    mine, theirs = key_on(cluster, n0, "tx-a"), key_on(cluster, n1, "tx-b")
    r = resp(n0)
    try:
        pipe = r.pipeline()
        pipe.set(mine, b"1")
        pipe.set(theirs, b"2")
        with pytest.raises(redis.exceptions.ResponseError):
            pipe.execute()
        assert r.get(mine) is None
    finally:
        r.close()
    with n0.client(bucket=BUCKET) as c:
        with pytest.raises(errors.NotMyPartition):
            c.transaction(
                [("set", {"key": mine, "value": b"1"}), ("set", {"key": theirs, "value": b"2"})]
            )
        assert c.get(mine) is None


def test_a_write_to_a_fenced_slot_waits_for_its_move_instead_of_tryagain(
    cluster: list[Daemon], etcd_server: EtcdServer
) -> None:
    """A slot's fence (its move's last catch-up, then the switch) holds the slot's
    writes instead of answering ``-TRYAGAIN`` at once, which a redis-py
    application would see once its retries (about 0.6 s) ran out: here the move
    is given up (``move_end``) and the held SET runs on the node it was sent to.
    (A move that commits answers the held request ``-MOVED``, one that outlasts
    the hold ``-TRYAGAIN``: sans-IO, tests/cluster/test_rebalance_plan.py.)"""
    d = cluster[0]
    key = key_on(cluster, d, "held")
    slot = key_slot(key)
    status = cluster_status(d)
    held_before = status["routing"]["held"]
    me = NodeInfo(status["node"], d.host, d.port, d.resp_port)
    r = resp(d)
    answers: list[Any] = []

    async def main() -> None:
        secret = await read_secret(etcd_server, status["prefix"])
        async with peer_session(me, secret) as peer:
            await peer.call("move_track", {"slots": [slot]})
            await peer.call("move_fence", {"slots": [slot]})
            try:
                async with trio.open_nursery() as nursery:

                    async def write() -> None:
                        t0 = time.monotonic()
                        try:
                            answers.append(await trio.to_thread.run_sync(r.set, key, b"held"))
                        except redis.exceptions.TryAgainError:
                            # the hold ran out first (a loaded machine kept the
                            # status polls below from seeing it in time)
                            assert time.monotonic() - t0 >= HOLD_SECS * 0.9
                            answers.append("TRYAGAIN")

                    nursery.start_soon(write)
                    await trio.to_thread.run_sync(
                        lambda: wait_until(
                            lambda: cluster_status(d)["routing"]["held"] > held_before,
                            what="the SET held",
                        )
                    )
                    assert answers == []  # held, not refused
            finally:
                await peer.call("move_end", {"slots": [slot]})

    trio.run(main)
    if answers != ["TRYAGAIN"]:
        assert answers == [True]  # the fence lifted inside the hold: it ran here
        assert r.get(key) == b"held"
