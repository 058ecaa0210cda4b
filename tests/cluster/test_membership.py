"""Members in one Trio loop against a real etcd: joining, the coordinator, how
fast the map reaches every member, and fencing when the lease goes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo, SlotRange
from tenantkv.cluster.etcd import Etcd
from tenantkv.cluster.membership import ClusterSettings, Member
from tenantkv.cluster.slots import SLOTS

from .conftest import EtcdServer, settle


@asynccontextmanager
async def members(
    etcd_server: EtcdServer, prefix: str, names: list[str], *, ttl: int = 2
) -> AsyncIterator[list[Member]]:
    async with Etcd([etcd_server.url]) as etcd, trio.open_nursery() as nursery:
        settings = [
            ClusterSettings((etcd_server.url,), n, prefix, ttl, min_nodes=len(names)) for n in names
        ]
        joined = [
            Member(etcd, s, NodeInfo(s.node_name, "127.0.0.1", 7000 + i))
            for i, s in enumerate(settings)
        ]
        for m in joined:
            await nursery.start(m.run)
        yield joined
        nursery.cancel_scope.cancel()
    await settle()


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    """Poll what the members hold (they change it from their own tasks)."""
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110  # no event to wait on: poll
            await trio.sleep(0.005)


async def test_one_coordinator_and_every_member_sees_the_map(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with members(etcd_server, etcd_prefix, ["a", "b", "c"]) as ms:
        # Converged: one coordinator, one map, all slots assigned. (Waited for as a
        # whole: on a loaded machine a member may briefly hold the map before last,
        # or a late lease renewal may make the election run again.)
        await wait_for(
            lambda: (
                sum(m.coordinator for m in ms) == 1
                and ms[0].map == ms[1].map == ms[2].map
                and ms[0].map.assigned() == SLOTS
            ),
            "one coordinator and one whole map",
        )
        owners = [sum(m.owns(s) for m in ms) for s in range(0, SLOTS, 97)]
        assert set(owners) == {1}  # each slot served by exactly one member


async def test_a_map_change_reaches_every_member_within_200_ms(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with members(etcd_server, etcd_prefix, ["a", "b"]) as ms:
        await wait_for(lambda: all(m.map.assigned() == SLOTS for m in ms), "the map")
        # A newer map, written as the coordinator writes one; time until all have it.
        newer = ClusterMap(
            ms[0].map.version + 1, (SlotRange(0, SLOTS - 1, "a"),), dict(ms[0].map.nodes)
        )
        worst = 0.0
        async with Etcd([etcd_server.url]) as etcd:
            for _ in range(5):
                newer = ClusterMap(newer.version + 1, newer.ranges, newer.nodes)
                start = trio.current_time()
                await etcd.put(f"{etcd_prefix}/map".encode(), newer.encode())
                version = newer.version
                await wait_for(
                    lambda: all(m.map.version == version for m in ms),  # noqa: B023
                    "the newer map",
                )
                worst = max(worst, trio.current_time() - start)
        # The target is 200 ms (docs/cluster.md gives the measured figures: ~10 ms);
        # the test's bound is one a loaded 2-core machine cannot miss while still
        # catching a member that polls instead of watching.
        assert worst < 2.0, f"a member saw the map {worst * 1000:.0f} ms after the write"


async def test_a_member_whose_lease_goes_stops_owning_then_rejoins(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with members(etcd_server, etcd_prefix, ["a", "b"]) as ms:
        await wait_for(lambda: all(m.map.assigned() == SLOTS for m in ms), "the map")
        a = ms[0]
        slot = next(s for s in range(SLOTS) if a.map.owner(s) == "a")
        assert a.owns(slot)
        old_lease = a.lease
        async with Etcd([etcd_server.url]) as etcd:
            await etcd.lease_revoke(old_lease)  # as if etcd expired it
        # Fenced at once when the keep-alive hears it; at the latest at the TTL.
        await wait_for(lambda: not a.owns(slot) or a.lease != old_lease, "fencing")
        # It rejoins with a new lease and owns its slots again.
        await wait_for(lambda: a.lease != old_lease and a.owns(slot), "rejoined")
        await wait_for(lambda: a.map.nodes["a"].up, "the map says it is up again")
        assert a.map.owner(slot) == "a"
