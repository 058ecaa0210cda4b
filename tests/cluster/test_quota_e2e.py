"""End to end: a bucket's hard limit held cluster-wide by three real
``tenantkv serve --cluster`` nodes and a real etcd, with the load split
80/10/10 and even; and a node cut off from its leader falling back to 1/N.

Rates are the units the servers charged (``throttle.buckets[b].ru_total`` of
each node's status) over a window: the upper bound is the limit (a loaded
machine only drives less), the lower bound generous, but above what the 1/N
fallback alone allows for the uneven load.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.peer import peer_session
from tenantkv.cluster.slots import key_slot
from tests.conftest import Daemon, wait_until

from .conftest import EtcdServer, new_prefix
from .test_cluster_e2e import cluster_status, create_bucket, full_map, start_nodes
from .test_peer import read_secret

LIMIT = 1000
#: 3 read units a GET (a value of three 4 KiB units less the key and overhead)
VALUE = b"v" * (3 * 4096 - 100)
UNITS_PER_GET = 3
WINDOW = 4.0
#: how often ``measure`` reads each node's share during the window
SAMPLE_SECS = 0.5


@contextlib.contextmanager
def three_nodes(tmp_path: Path, etcd: EtcdServer, prefix: str) -> Iterator[list[Daemon]]:
    started = start_nodes(tmp_path, etcd, prefix, 3)
    try:
        wait_until(lambda: all(full_map(cluster_status(d), 3) for d in started), what="the map")
        yield started
    finally:
        for d in started:
            d.kill()


@pytest.fixture
def nodes(tmp_path: Path, etcd_server: EtcdServer, etcd_prefix: str) -> Iterator[list[Daemon]]:
    """Three nodes of this test's own (it stops one)."""
    with three_nodes(tmp_path, etcd_server, etcd_prefix) as started:
        yield started


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdServer
) -> Iterator[tuple[list[Daemon], str]]:
    """Three nodes, and their etcd prefix, for the tests that leave every node up:
    each drives a bucket of its own, and the hard limit and its leader are a
    bucket's."""
    prefix = new_prefix()
    with three_nodes(tmp_path_factory.mktemp("quota"), etcd_server, prefix) as started:
        yield started, prefix


def key_on(status: dict[str, Any], node: str) -> str:
    """A key whose slot ``node`` serves."""
    ranges = status["map"]["nodes"][node]["ranges"]
    for i in range(100_000):
        slot = key_slot(f"k{i}".encode())
        if any(lo <= slot <= hi for lo, hi in ranges):
            return f"k{i}"
    raise AssertionError(f"no key for {node}")


def charged(nodes: list[Daemon], bucket: str) -> int:
    total = 0
    for d in nodes:
        with d.client() as c:
            total += c.server_status()["throttle"]["buckets"][bucket]["ru_total"]
    return total


def quota_of(d: Daemon, bucket: str) -> dict[str, Any]:
    return cluster_status(d)["quota"]["buckets"].get(bucket, {})  # type: ignore[no-any-return]


async def drive(d: Daemon, bucket: str, key: str, tasks: int, rate: float | None, end: float):
    """GET ``key`` through node ``d`` until ``end`` (monotonic): ``tasks`` closed
    loops, or (``rate``: GETs/s) one paced loop."""
    async with d.async_client(bucket=bucket) as c:

        async def loop() -> None:
            while time.monotonic() < end:
                with contextlib.suppress(errors.Throttled):
                    await c.get(key)
                if rate is not None:
                    await trio.sleep(1 / rate)

        async with trio.open_nursery() as n:
            for _ in range(tasks):
                n.start_soon(loop)


def setup_bucket(nodes: list[Daemon], bucket: str) -> list[str]:
    create_bucket(nodes, bucket)
    with nodes[0].client() as c:
        c.set_bucket_throttle(bucket, {"reserved": 0, "hard_limit": LIMIT})
    status = cluster_status(nodes[0])
    keys = [key_on(status, f"n{i}") for i in range(3)]
    for d, key in zip(nodes, keys, strict=True):
        with d.client(bucket=bucket) as c:
            c.set(key, VALUE)
    # Every node knows one leader, and holds the leader's share.
    wait_until(
        lambda: len({quota_of(d, bucket).get("leader") for d in nodes} - {None}) == 1,
        what="one quota leader known everywhere",
    )
    return keys


def measure(
    nodes: list[Daemon], bucket: str, plan: list[tuple[int, float | None]]
) -> tuple[float, list[float]]:
    """Drive ``plan`` (per node: tasks, rate) and return the cluster-wide units/s
    charged over ``WINDOW`` after 1.5 s of warm-up, and each node's largest share
    of the hard limit (units/s) the leader gave it in the window, read every
    ``SAMPLE_SECS`` under load. Every node must have held a share of the
    leader's then: on a loaded machine a share may run out into 1/N for a slice
    or two (a late report: by design), not for the whole window."""
    keys = setup_bucket(nodes, bucket)
    end = time.monotonic() + 1.5 + WINDOW + 0.5
    result: list[float] = []
    shares = [0.0] * len(nodes)
    led = [False] * len(nodes)

    def sample() -> None:
        for i, d in enumerate(nodes):
            share = quota_of(d, bucket)
            if share.get("source") == "leader":
                led[i] = True
                shares[i] = max(shares[i], float(share["hard_rate"]))

    async def main() -> None:
        async with trio.open_nursery() as n:
            for d, key, (tasks, rate) in zip(nodes, keys, plan, strict=True):
                n.start_soon(drive, d, bucket, key, tasks, rate, end)
            await trio.sleep(1.5)
            before, t0 = await trio.to_thread.run_sync(charged, nodes, bucket), time.monotonic()
            while time.monotonic() < t0 + WINDOW:
                await trio.to_thread.run_sync(sample)
                await trio.sleep(SAMPLE_SECS)
            after, t1 = await trio.to_thread.run_sync(charged, nodes, bucket), time.monotonic()
            result.append((after - before) / (t1 - t0))

    trio.run(main)
    print(f"{bucket}: {result[0]:.1f} units/s cluster-wide, shares {shares}")
    assert all(led), (led, shares)
    return result[0], shares


def test_a_hard_limit_holds_cluster_wide_with_the_load_split_80_10_10(
    shared: tuple[list[Daemon], str],
) -> None:
    nodes, _ = shared
    # n0 closed loop on 8 tasks; n1 and n2 paced at 100 units/s each. At 1/N the
    # cluster would charge 333 + 100 + 100; the leader gives n0 what they leave.
    plan = [(8, None), (1, 100 / UNITS_PER_GET), (1, 100 / UNITS_PER_GET)]
    rate, shares = measure(nodes, "split", plan)
    # One slice's burst per node over the window on top of the limit, at most.
    assert rate <= LIMIT * 1.03 + 3 * LIMIT * 0.1 / WINDOW, rate
    # The leader gives n0 what the paced nodes leave: more than 1/N, more than
    # theirs. Read as shares, not as the rate n0 reached: a loaded 2-core machine
    # once drove the whole cluster at 389 units/s, below any rate bound that
    # tells the leader's split from 1/N.
    assert shares[0] > LIMIT / 3 and shares[0] > max(shares[1:]), shares


def test_a_hard_limit_holds_cluster_wide_with_the_load_split_evenly(
    shared: tuple[list[Daemon], str],
) -> None:
    nodes, _ = shared
    rate, shares = measure(nodes, "even", [(3, None), (3, None), (3, None)])
    assert rate <= LIMIT * 1.03 + 3 * LIMIT * 0.1 / WINDOW, rate
    # The whole limit is handed out (the rate reached depends on the machine's
    # load; the shares do not). Each node's share is its largest of the window,
    # so their sum may stand above the limit: the rate above is what holds it.
    assert sum(shares) >= LIMIT * 0.9, shares


def test_when_the_leader_dies_the_others_fall_back_then_elect_another(
    nodes: list[Daemon],
) -> None:
    setup_bucket(nodes, "orphan")
    leader = quota_of(nodes[0], "orphan")["leader"]
    victim = nodes[int(leader[1:])]
    survivors = [d for d in nodes if d is not victim]
    wait_until(
        lambda: all(quota_of(d, "orphan").get("source") == "leader" for d in survivors),
        what="the leader's shares everywhere",
    )
    victim.kill()
    # Its office goes with its lease (LEASE_TTL); until another node takes it the
    # survivors hold 1/N of the limit, N the nodes up in their map.
    wait_until(
        lambda: all(
            quota_of(d, "orphan").get("leader") not in (None, leader)
            and quota_of(d, "orphan").get("source") == "leader"
            for d in survivors
        ),
        timeout=20,
        what="a new leader's shares on the survivors",
    )
    status = cluster_status(survivors[0])
    assert (
        status["quota"]["report_failures"]
        + cluster_status(survivors[1])["quota"]["report_failures"]
        > 0
    )


def test_quota_report_answers_a_node_and_refuses_bad_reports_precisely(
    shared: tuple[list[Daemon], str], etcd_server: EtcdServer
) -> None:
    nodes, etcd_prefix = shared
    setup_bucket(nodes, "rep")
    leader = quota_of(nodes[0], "rep")["leader"]
    target = nodes[int(leader[1:])]
    secret = trio.run(read_secret, etcd_server, etcd_prefix)
    where = NodeInfo(leader, target.host, target.port, target.resp_port)
    report = {"v": 1, "buckets": {"rep": [1, True, 50.0, 0.0], "other": [1, True, 1.0, 0.0]}}

    async def main() -> None:
        async with peer_session(where, secret) as s:
            with pytest.raises(errors.BadValue, match="not in this node's cluster map"):
                await s.call("quota_report", {"node": "probe", "usage": report})
            # As another node of the map (its share for one slice: this report's).
            other = next(n for n in ("n0", "n1", "n2") if n != leader)
            answer = await s.call("quota_report", {"node": other, "usage": report})
            # A share of the limit (or pending while the leader warms up); a bucket
            # it does not lead is left out.
            assert set(answer["buckets"]) | set(answer["pending"]) == {"rep"}
            for share in answer["buckets"].values():
                assert 0 < share[2] <= LIMIT
            for bad, says in [
                ({"v": 2, "buckets": {}}, "unsupported version"),
                ({"v": 1, "buckets": {"rep": [1, "yes", 1.0, 0.0]}}, "hungry must be a bool"),
                ({"v": 1, "buckets": {"rep": [-1, True, 1.0, 0.0]}}, "connections must be"),
                ("nonsense", "expected a map"),
            ]:
                with pytest.raises(errors.BadValue, match=says):
                    await s.call("quota_report", {"node": other, "usage": bad})
        # Not a node's login: refused.
        async with target.async_client() as admin:
            with pytest.raises(errors.Unauthorized):
                await admin.command("quota_report", node="x", usage=report)

    trio.run(main)
