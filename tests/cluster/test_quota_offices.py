"""Quota leaders' offices against a real etcd: one leader per limited bucket,
seen alike by every member, claimed in a staggered order that differs per
bucket (so the offices tend to spread), and taken over when a leader's lease
goes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tenantkv.cluster.cluster_map import NodeInfo
from tenantkv.cluster.etcd import Etcd
from tenantkv.cluster.membership import ClusterSettings, Member
from tenantkv.cluster.quota_leader import QuotaOffices

from .conftest import EtcdServer, settle
from .test_membership import wait_for

BUCKETS = ["orders", "users", "carts", "logs", "metrics", "images"]


@asynccontextmanager
async def offices(
    etcd_server: EtcdServer, prefix: str, names: list[str], buckets: list[str]
) -> AsyncIterator[list[QuotaOffices]]:
    async with Etcd([etcd_server.url]) as etcd, trio.open_nursery() as nursery:
        out = []
        for i, name in enumerate(names):
            settings = ClusterSettings((etcd_server.url,), name, prefix, 2, min_nodes=len(names))
            member = Member(etcd, settings, NodeInfo(name, "127.0.0.1", 7000 + i))
            await nursery.start(member.run)
            office = QuotaOffices(etcd, member, lambda: list(buckets))
            await nursery.start(office.run)
            out.append(office)
        yield out
        nursery.cancel_scope.cancel()
    await settle()


def agreed(os: list[QuotaOffices], buckets: list[str]) -> bool:
    """Every bucket has one leader, the same in every member's view, and it is
    among the members still running."""
    names = {o.member.me.name for o in os}
    first = os[0].leaders
    return (
        set(first) == set(buckets)
        and all(o.leaders == first for o in os)
        and {name for name, _ in first.values()} <= names
    )


def up(o: QuotaOffices) -> set[str]:
    """The members up in ``o``'s map (those its stagger ranks)."""
    return {name for name, info in o.member.map.nodes.items() if info.up}


async def test_each_limited_bucket_gets_one_leader_and_every_member_agrees(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with offices(etcd_server, etcd_prefix, ["a", "b", "c"], BUCKETS) as os:
        await wait_for(lambda: agreed(os, BUCKETS), "one leader per bucket")
        led = [o.led() for o in os]
        assert set().union(*led) == set(BUCKETS)
        assert sum(len(x) for x in led) == len(BUCKETS)  # each led by one
        for o in os:
            for bucket in BUCKETS:
                assert o.leader_of(bucket) in {"a", "b", "c"}
        # Claims are staggered by a hash of bucket and node, which makes the offices
        # spread but does not guarantee it: a member alone in its map so far, or the
        # others' claim loops paused by a loaded machine, may rightly take them all
        # (and keeps them: offices move only with a lease). What is guaranteed is the
        # stagger's order once every member is in every map: for each bucket the
        # members' own ranks are 0, 1, 2 (their views agree), and no one member is
        # first for every bucket.
        names = {"a", "b", "c"}
        await wait_for(lambda: all(up(o) == names for o in os), "every member up")
        firsts = set()
        for bucket in BUCKETS:
            ranks = {o.member.me.name: o._rank(bucket) for o in os}
            assert sorted(ranks.values()) == [0, 1, 2], (bucket, ranks)
            firsts |= {name for name, rank in ranks.items() if rank == 0}
        assert len(firsts) >= 2


async def test_a_leader_that_leaves_loses_its_offices_to_the_others(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    async with offices(etcd_server, etcd_prefix, ["a", "b", "c"], BUCKETS) as os:
        await wait_for(lambda: agreed(os, BUCKETS), "one leader per bucket")
        gone = max(os, key=lambda o: len(o.led()))
        had = gone.led()
        assert had
        await gone.member.leave()  # revokes the lease: its offices go with it
        rest = [o for o in os if o is not gone]
        await wait_for(lambda: agreed(rest, BUCKETS), "new leaders")
        for bucket in had:
            assert rest[0].leader_of(bucket) in {o.member.me.name for o in rest}


async def test_an_office_of_a_bucket_no_longer_limited_is_given_up(
    etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    buckets = ["orders", "users"]
    async with offices(etcd_server, etcd_prefix, ["a", "b"], buckets) as os:
        await wait_for(lambda: agreed(os, buckets), "one leader per bucket")
        buckets.remove("users")  # its limits were removed (or it was dropped)
        await wait_for(lambda: agreed(os, ["orders"]), "the office given up")
