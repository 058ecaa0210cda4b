"""Failure without replicas, end to end (a real etcd, three real nodes, both doors):

- ``kill -9`` of one node of three: the other nodes' slots keep serving reads
  and writes; the dead node's slots answer a retryable ``NodeUnavailable`` /
  ``-CLUSTERDOWN``; when it returns, every key it acknowledged is there.
- ``kill -9`` of etcd: data keeps serving on the last map (writes while the
  nodes' leases hold, then only reads: fencing), admin changes are refused
  with an error that says etcd is unreachable, and everything converges
  when etcd is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import trio
from redis.cluster import ClusterNode, RedisCluster

from tenantkv import errors
from tenantkv.client.cluster import AsyncClusterClient, ClusterClient
from tests.conftest import ADMIN_PASSWORD, Daemon, wait_until

from .conftest import EtcdServer
from .test_cluster_e2e import cluster_status, create_bucket, full_map, serving, start_nodes
from .test_routing_e2e import BUCKET, key_on, owner_of, resp


def cluster_client(d: Daemon) -> ClusterClient:
    return ClusterClient(
        d.host, d.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
    )


def redis_cluster(d: Daemon) -> RedisCluster:
    return RedisCluster(
        startup_nodes=[ClusterNode(d.host, d.resp_port)],
        username=f"admin@{BUCKET}",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str) -> Iterator[list[Daemon]]:
    with serving(tmp_path, etcd_server, etcd_prefix, 3, bucket=BUCKET) as nodes:
        yield nodes


def test_kill_9_of_one_node_the_others_serve_and_its_data_comes_back(
    three: list[Daemon],
) -> None:
    coordinator = next(i for i, d in enumerate(three) if cluster_status(d)["coordinator"])
    victim = three[(coordinator + 1) % 3]
    survivors = [d for d in three if d is not victim]
    acked: dict[bytes, bytes] = {}  # every acknowledged write: its last value
    cc = cluster_client(survivors[0])
    rc = redis_cluster(survivors[1])
    try:
        for i in range(150):
            cc.set(b"mp:%d" % i, b"before-%d" % i)
            acked[b"mp:%d" % i] = b"before-%d" % i
        for i in range(90):
            assert rc.set(b"rp:%d" % i, b"before-%d" % i)
            acked[b"rp:%d" % i] = b"before-%d" % i
        theirs = [k for k in acked if owner_of(three, k) is victim]
        ours = [k for k in acked if owner_of(three, k) is not victim]
        assert theirs and ours

        victim.kill()  # SIGKILL: no goodbye, no flush beyond what was committed

        # At once, before the map says so: the cluster client cannot reach the
        # node (nothing sent: retryable), and the other nodes serve on.
        with pytest.raises(errors.NodeUnavailable, match="cannot be reached") as gone:
            cc.get(theirs[0])
        assert gone.value.has_label(errors.RETRYABLE)
        for k in ours[:20]:
            cc.set(k, b"during-" + k)
            acked[k] = b"during-" + k
        wait_until(
            lambda: all(full_map(cluster_status(d), 2) for d in survivors),
            timeout=15,
            what="the survivors see the victim down",
        )

        # Both doors of a survivor: the victim's slots are unavailable (retryable),
        # its own slots serve reads and writes.
        mine = [k for k in ours if owner_of(three, k) is survivors[0]]
        with survivors[0].client(bucket=BUCKET) as c:
            with pytest.raises(errors.NodeUnavailable, match="is down") as down:
                c.get(theirs[0])
            assert down.value.has_label(errors.RETRYABLE)
            with pytest.raises(errors.NodeUnavailable):
                c.set(theirs[0], b"lost?")  # refused: did not run anywhere
            for k in mine[:10]:
                assert c.get(k) == acked[k]
        r = resp(survivors[0])
        try:
            with pytest.raises(redis.exceptions.ClusterDownError):
                r.get(theirs[0])
            for k in mine[:10]:
                assert r.set(k, b"resp-" + k)
                acked[k] = b"resp-" + k
                assert r.get(k) == acked[k]
        finally:
            r.close()
        for k in ours:
            if owner_of(three, k) is survivors[1] and k.startswith(b"rp:"):
                assert rc.set(k, b"rc-" + k)  # redis-py's cluster client, on the survivors
                acked[k] = b"rc-" + k

        # A pipeline over all the keys: the survivors' part runs, the victim's
        # calls get NodeUnavailable in their places.
        p = cc.pipeline(raise_on_error=False)
        for k in acked:
            p.get(k)
        for k, got in zip(acked, p.execute(), strict=True):
            if k in theirs:
                assert isinstance(got, errors.NodeUnavailable)
            else:
                assert got == acked[k]

        # The same through the Trio client, whose node batches go out at once.
        async def async_pipeline() -> list[Any]:
            d = survivors[1]
            async with AsyncClusterClient(
                d.host, d.port, user="admin", password=ADMIN_PASSWORD, bucket=BUCKET, timeout=20
            ) as acc:
                ap = acc.pipeline(raise_on_error=False)
                for k in acked:
                    ap.get(k)
                return await ap.execute()

        for k, got in zip(acked, trio.run(async_pipeline), strict=True):
            if k in theirs:
                assert isinstance(got, errors.NodeUnavailable)
            else:
                assert got == acked[k]

        victim.start()  # same data directory, same name
        wait_until(
            lambda: all(full_map(cluster_status(d), 3) for d in three),
            timeout=20,
            what="the victim back up",
        )
        # Every key, each with its last acknowledged value, through both doors.
        assert cc.mget(list(acked)) == list(acked.values())
        for k, v in acked.items():
            assert cc.get(k) == v
        for k in theirs:
            assert rc.get(k) == acked[k]
    finally:
        cc.close()
        rc.close()


def test_kill_9_of_etcd_data_serves_admin_refused_then_all_converges(tmp_path: Path) -> None:
    (tmp_path / "etcd").mkdir()
    etcd = EtcdServer(tmp_path / "etcd" / "data").start()
    nodes: list[Daemon] = []
    try:
        # A 4 s lease: writes go on for at least 2/3 of it after etcd's death.
        nodes = start_nodes(tmp_path, etcd, "/etcd-kill", 3, ttl=4)
        wait_until(lambda: all(full_map(cluster_status(d), 3) for d in nodes), what="map of 3")
        create_bucket(nodes, BUCKET)
        keys = {d.port: key_on(nodes, d, "ek") for d in nodes}
        acked: dict[bytes, bytes] = {}
        with cluster_client(nodes[0]) as cc:
            for k in keys.values():
                cc.set(k, b"before")
                acked[k] = b"before"

            assert etcd.proc is not None
            etcd.proc.kill()  # SIGKILL
            etcd.proc.wait(10)

            # While the leases hold, every node acknowledges writes to its slots.
            assert all(cluster_status(d)["lease"]["valid"] for d in nodes)
            for k in keys.values():
                cc.set(k, b"etcd-dead")
                acked[k] = b"etcd-dead"
            for d in nodes:  # admin changes: refused, and say why
                with d.client() as c, pytest.raises(errors.NodeUnavailable, match="etcd"):
                    c.create_bucket("during")
            wait_until(
                lambda: not any(cluster_status(d)["lease"]["valid"] for d in nodes),
                timeout=15,
                what="the leases to lapse",
            )
            # No proof of ownership: reads serve on the last map, writes are fenced.
            assert cc.mget(list(keys.values())) == [acked[k] for k in keys.values()]
            for k in keys.values():
                with pytest.raises(errors.NodeUnavailable, match="lease lapsed"):
                    cc.set(k, b"fenced")
            r = resp(nodes[1])
            try:
                mine = keys[nodes[1].port]
                assert r.get(mine) == acked[mine]
                with pytest.raises(redis.exceptions.ClusterDownError):
                    r.set(mine, b"fenced")
            finally:
                r.close()

            etcd.restart()
            wait_until(
                lambda: all(
                    cluster_status(d)["lease"]["valid"] and full_map(cluster_status(d), 3)
                    for d in nodes
                ),
                timeout=30,
                what="every node back with a lease and the full map",
            )
            for k in keys.values():
                cc.set(k, b"after")
                acked[k] = b"after"
            assert cc.mget(list(keys.values())) == [b"after"] * 3
        create_bucket(nodes, "after-etcd", timeout=10)  # admin again, seen everywhere
        for d in nodes:
            with d.client() as c:
                assert "during" not in {b["name"] for b in c.list_buckets()}
        for k, v in acked.items():
            with owner_of(nodes, k).client(bucket=BUCKET) as c:
                assert c.get(k) == v
    finally:
        for d in nodes:
            d.kill()
        etcd.stop()
