"""Redis Cluster clients, unmodified, against 3 real nodes and a real etcd:
redis-py's ``RedisCluster`` through a table of string commands (multi-key ones
with hashtags and across slots, its pipeline, ``scan_iter`` over every node),
``redis-cli -c`` and ``redis-benchmark --cluster`` (skipped when not installed)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.cluster import ClusterNode, RedisCluster

from tests.conftest import ADMIN_PASSWORD, Daemon

from .test_routing_e2e import BUCKET, owner_of
from .test_routing_e2e import cluster as routing_cluster

#: the 3 nodes of the routing tests (a module's own: the fixture is module-scoped)
cluster = routing_cluster


@pytest.fixture
def rc(cluster: list[Daemon]) -> Iterator[RedisCluster]:
    client = RedisCluster(
        startup_nodes=[ClusterNode(cluster[1].host, cluster[1].resp_port)],
        username=f"admin@{BUCKET}",
        password=ADMIN_PASSWORD,
        socket_timeout=10,
    )
    yield client
    client.close()


#: (name, what to run, what it answers); each in a key space of its own
#: (``{c<n>}`` hashtags keep a row's keys in one slot, as Redis Cluster needs).
CASES: list[tuple[str, Callable[[RedisCluster], Any], Any]] = [
    ("set/get", lambda r: (r.set("c1", "v"), r.get("c1")), (True, b"v")),
    (
        "set nx/xx",
        lambda r: (
            r.set("c2", "a", nx=True),
            r.set("c2", "b", nx=True),
            r.set("c2x", "b", xx=True),
        ),
        (True, None, None),
    ),
    (
        "set get",
        lambda r: (r.set("c3", "old"), r.set("c3", "new", get=True), r.get("c3")),
        (True, b"old", b"new"),
    ),
    ("getset", lambda r: (r.set("c4", "1"), r.getset("c4", "2"), r.get("c4")), (True, b"1", b"2")),
    ("setnx", lambda r: (r.setnx("c5", "a"), r.setnx("c5", "b"), r.get("c5")), (True, False, b"a")),
    ("set ex/ttl", lambda r: (r.set("c6", "v", ex=100), 0 < r.ttl("c6") <= 100), (True, True)),
    (
        "psetex/pttl",
        lambda r: (r.psetex("c7", 100_000, "v"), 0 < r.pttl("c7") <= 100_000),
        (True, True),
    ),
    (
        "expire/persist",
        lambda r: (r.set("c8", "v"), r.expire("c8", 50), r.persist("c8"), r.ttl("c8")),
        (True, True, True, -1),
    ),
    (
        "getex",
        lambda r: (r.set("c9", "v"), r.getex("c9", ex=60), 0 < r.ttl("c9") <= 60),
        (True, b"v", True),
    ),
    ("getdel", lambda r: (r.set("c10", "v"), r.getdel("c10"), r.exists("c10")), (True, b"v", 0)),
    (
        "append/strlen",
        lambda r: (r.append("c11", "ab"), r.append("c11", "cd"), r.strlen("c11"), r.get("c11")),
        (2, 4, 4, b"abcd"),
    ),
    (
        "incr/decr",
        lambda r: (r.incr("c12"), r.incrby("c12", 10), r.decr("c12"), r.decrby("c12", 5)),
        (1, 11, 10, 5),
    ),
    ("incrbyfloat", lambda r: (r.set("c13", "1.5"), r.incrbyfloat("c13", 2.25)), (True, 3.75)),
    (
        "getrange/setrange",
        lambda r: (
            r.set("c14", "Hello World"),
            r.setrange("c14", 6, "Redis"),
            r.getrange("c14", 0, 4),
            r.get("c14"),
        ),
        (True, 11, b"Hello", b"Hello Redis"),
    ),
    (
        "bits",
        lambda r: (r.setbit("c15", 7, 1), r.getbit("c15", 7), r.bitcount("c15"), r.get("c15")),
        (0, 1, 1, b"\x01"),
    ),
    (
        "delete/exists",
        lambda r: (r.set("c16", "v"), r.exists("c16"), r.delete("c16"), r.exists("c16")),
        (True, 1, 1, 0),
    ),
    ("type", lambda r: (r.set("c17", "v"), r.type("c17")), (True, b"string")),
    (
        "mset/mget, one slot",
        lambda r: (r.mset({"{c18}a": "1", "{c18}b": "2"}), r.mget("{c18}a", "{c18}b", "{c18}z")),
        (True, [b"1", b"2", None]),
    ),
    (
        "msetnx, one slot",
        lambda r: (
            r.msetnx({"{c19}a": "1", "{c19}b": "2"}),
            r.msetnx({"{c19}a": "x", "{c19}c": "3"}),
        ),
        (True, False),
    ),
    (
        "mset/mget across slots",
        lambda r: (
            r.mset_nonatomic({f"c20:{i}": str(i) for i in range(30)}),
            r.mget_nonatomic([f"c20:{i}" for i in range(30)]),
        ),
        ([True] * 30, [str(i).encode() for i in range(30)]),
    ),
    (
        "delete across slots",
        lambda r: (
            r.mset_nonatomic({"c21a": "1", "c21b": "2", "c21c": "3"}),
            r.delete("c21a", "c21b", "c21c", "c21d"),
            r.exists("c21a", "c21b"),
        ),
        ([True] * 3, 3, 0),
    ),
    (
        "exists across slots",
        lambda r: (r.mset_nonatomic({"c22a": "1", "c22b": "2"}), r.exists("c22a", "c22b", "c22c")),
        ([True] * 2, 2),
    ),
    (
        "rename, one slot",
        lambda r: (r.set("{c23}a", "v"), r.rename("{c23}a", "{c23}b"), r.get("{c23}b")),
        (True, True, b"v"),
    ),
    (
        "copy, one slot",
        lambda r: (r.set("{c24}a", "v"), r.copy("{c24}a", "{c24}b"), r.get("{c24}b")),
        (True, True, b"v"),
    ),
    (
        "lcs, one slot",
        lambda r: (
            r.mset({"{c25}a": "ohmytext", "{c25}b": "mynewtext"}),
            r.lcs("{c25}a", "{c25}b"),
        ),
        (True, b"mytext"),
    ),
    (
        "bitop, one slot",
        lambda r: (
            r.mset({"{c26}a": b"\x0f", "{c26}b": b"\xf0"}),
            r.bitop("OR", "{c26}d", "{c26}a", "{c26}b"),
            r.get("{c26}d"),
        ),
        (True, 1, b"\xff"),
    ),
]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_string_commands_through_redis_cluster(rc: RedisCluster, name: str) -> None:
    _, run, expected = next(c for c in CASES if c[0] == name)
    assert run(rc) == expected


def test_keys_land_on_their_slots_node(rc: RedisCluster, cluster: list[Daemon]) -> None:
    keys = [f"land:{i}".encode() for i in range(60)]
    rc.mset_nonatomic({k: k for k in keys})
    for k in keys[:15]:
        with owner_of(cluster, k).client(bucket=BUCKET) as c:
            assert c.get(k) == k


def test_redis_cluster_pipeline_routes_each_command(
    rc: RedisCluster, cluster: list[Daemon]
) -> None:
    keys = [f"rcp:{i}" for i in range(40)]
    pipe = rc.pipeline()
    for k in keys:
        pipe.set(k, k)
        pipe.incr(k + ":n")
    for k in keys:
        pipe.get(k)
    out = pipe.execute()
    assert out[: 2 * len(keys)] == [True, 1] * len(keys)
    assert out[2 * len(keys) :] == [k.encode() for k in keys]
    assert len({owner_of(cluster, k.encode()).port for k in keys}) == 3


def test_scan_iter_visits_every_node(rc: RedisCluster) -> None:
    keys = {f"scan:{i}".encode() for i in range(90)}
    rc.mset_nonatomic({k: b"v" for k in keys})
    assert set(rc.scan_iter(match="scan:*", count=20)) == keys
    assert rc.dbsize(target_nodes=RedisCluster.ALL_NODES) >= len(keys)  # summed over nodes


def test_cluster_introspection_commands(rc: RedisCluster) -> None:
    assert rc.cluster_keyslot("{user1000}.following") == rc.cluster_keyslot("user1000")
    assert rc.cluster_info()["cluster_state"] == "ok"
    nodes = rc.cluster_nodes()
    assert len(nodes) == 3 and all(n["connected"] for n in nodes.values())
    assert rc.ping(target_nodes=RedisCluster.ALL_NODES) is True


def base_args(d: Daemon) -> list[str]:
    return ["-h", d.host, "-p", str(d.resp_port), "--user", f"admin@{BUCKET}"]


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli is not installed")
def test_redis_cli_cluster_mode_string_commands(cluster: list[Daemon]) -> None:
    def cli(*args: str) -> str:
        done = subprocess.run(
            [
                "redis-cli",
                *base_args(cluster[0]),
                "--pass",
                ADMIN_PASSWORD,
                "--no-auth-warning",
                "-c",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.stdout.strip()

    for i in range(12):  # keys over all three nodes, each command following -MOVED
        assert cli("SET", f"cli:{i}", f"v{i}") == "OK"
        assert cli("INCRBY", f"cli:n{i}", "5") == "5"
        assert cli("APPEND", f"cli:{i}", "!") == str(len(f"v{i}!"))
        assert cli("GET", f"cli:{i}") == f"v{i}!"
    assert cli("MSET", "{cli}a", "1", "{cli}b", "2") == "OK"
    assert cli("MGET", "{cli}a", "{cli}b").split() == ["1", "2"]
    assert "CROSSSLOT" in cli("MGET", "cli:1", "cli:2")
    assert cli("CLUSTER", "KEYSLOT", "cli:1").isdigit()


@pytest.mark.skipif(
    shutil.which("redis-benchmark") is None, reason="redis-benchmark is not installed"
)
def test_redis_benchmark_cluster_set_get(cluster: list[Daemon]) -> None:
    done = subprocess.run(
        [
            "redis-benchmark",
            "--cluster",
            *base_args(cluster[0]),
            "-a",
            ADMIN_PASSWORD,
            "-t",
            "set,get",
            "-n",
            "2000",
            "-c",
            "4",
            "-r",
            "1000",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Cluster has 3 master nodes" in out, out
    rates = [line for line in out.replace("\r", "\n").splitlines() if "requests per second" in line]
    assert [r.split(":")[0] for r in rates] == ["SET", "GET"], out
    assert "error" not in out.lower(), out
