"""The etcd client against a real etcd: keys, transactions, leases, watch, election."""

from __future__ import annotations

import pytest
import trio

from tenantkv.cluster.etcd import (
    Compare,
    Etcd,
    EtcdUnavailable,
    campaign,
    delete_op,
    keep_lease_alive,
    prefix_end,
    put_op,
)

from .conftest import EtcdServer, settle


def test_prefix_end() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\x00"


async def test_put_get_range_delete(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    p = etcd_prefix.encode()
    etcd = Etcd([etcd_server.url])
    try:
        rev = await etcd.put(p + b"/a", b"\x00one")
        await etcd.put(p + b"/b", b"two")
        await etcd.put(p + b"c", b"outside the prefix")
        kv = await etcd.get(p + b"/a")
        assert kv is not None and kv.value == b"\x00one" and kv.mod_revision == rev
        assert kv.version == 1
        kvs, revision = await etcd.range(p + b"/", prefix=True)
        assert [k.key for k in kvs] == [p + b"/a", p + b"/b"]
        assert revision >= rev
        assert await etcd.delete(p + b"/", prefix=True) == 2
        assert await etcd.get(p + b"/a") is None
        assert await etcd.get(p + b"c") is not None
    finally:
        await etcd.aclose()
        await settle()


async def test_txn_compares_mod_revision(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    key = etcd_prefix.encode() + b"/map"
    etcd = Etcd([etcd_server.url])
    try:
        first = await etcd.txn([Compare.absent(key)], [put_op(key, b"v1")])
        assert first.succeeded
        again = await etcd.txn([Compare.absent(key)], [put_op(key, b"other")])
        assert not again.succeeded
        stale = await etcd.txn([Compare.mod_revision(key, first.revision - 1)], [delete_op(key)])
        assert not stale.succeeded
        ok = await etcd.txn([Compare.mod_revision(key, first.revision)], [put_op(key, b"v2")])
        assert ok.succeeded
        kv = await etcd.get(key)
        assert kv is not None and kv.value == b"v2" and kv.version == 2
    finally:
        await etcd.aclose()
        await settle()


async def test_lease_keys_go_with_the_lease(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    key = etcd_prefix.encode() + b"/node"
    etcd = Etcd([etcd_server.url])
    try:
        lease = await etcd.lease_grant(5)
        await etcd.put(key, b"here", lease=lease)
        kv = await etcd.get(key)
        assert kv is not None and kv.lease == lease
        assert 0 < await etcd.lease_keepalive(lease) <= 5
        await etcd.lease_revoke(lease)
        assert await etcd.get(key) is None
        assert await etcd.lease_keepalive(lease) == 0
        await etcd.lease_revoke(lease)  # a second revoke is not an error
    finally:
        await etcd.aclose()
        await settle()


async def test_keep_lease_alive_until_it_is_lost(etcd_server: EtcdServer) -> None:
    etcd = Etcd([etcd_server.url])
    try:
        lease = await etcd.lease_grant(1)
        deadlines: list[float] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def keep() -> None:
                    await keep_lease_alive(etcd, lease, 1, deadlines.append)
                    nursery.cancel_scope.cancel()  # returned: the lease is gone

                nursery.start_soon(keep)
                await trio.sleep(1.5)  # past the TTL: kept alive
                assert await etcd.lease_keepalive(lease) > 0
                assert deadlines and deadlines[-1] > trio.current_time()
                await etcd.lease_revoke(lease)
                await trio.sleep_forever()
    finally:
        await etcd.aclose()
        await settle()


async def test_watch_sees_puts_and_deletes(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    p = etcd_prefix.encode()
    etcd = Etcd([etcd_server.url])
    try:
        start = await etcd.put(p + b"/x", b"1")
        await etcd.put(p + b"/y", b"2")
        await etcd.delete(p + b"/x")
        seen: list[tuple[str, bytes, bytes]] = []
        with trio.fail_after(10):
            async with etcd.watch(p + b"/", prefix=True, start_revision=start) as w:
                async for events in w:
                    seen += [(e.type, e.kv.key, e.kv.value) for e in events]
                    if len(seen) >= 3:
                        break
        assert seen == [
            ("PUT", p + b"/x", b"1"),
            ("PUT", p + b"/y", b"2"),
            ("DELETE", p + b"/x", b""),
        ]
    finally:
        await etcd.aclose()
        await settle()


async def test_election_one_leader_then_the_next(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    key = etcd_prefix.encode() + b"/coordinator"
    etcd = Etcd([etcd_server.url])
    try:
        first, second = await etcd.lease_grant(10), await etcd.lease_grant(10)
        assert await campaign(etcd, key, b"first", first) > 0
        won = trio.Event()

        async def run_second() -> None:
            await campaign(etcd, key, b"second", second)
            won.set()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_second)
                await trio.sleep(0.3)
                assert not won.is_set()  # the first still holds it
                await etcd.lease_revoke(first)  # the leader goes: its key with it
                await won.wait()
        kv = await etcd.get(key)
        assert kv is not None and kv.value == b"second"
        await etcd.lease_revoke(second)
    finally:
        await etcd.aclose()
        await settle()


async def test_unreachable_endpoint_falls_over(etcd_server: EtcdServer, etcd_prefix: str) -> None:
    etcd = Etcd(["http://127.0.0.1:1", etcd_server.url], timeout=1)
    try:
        await etcd.put(etcd_prefix.encode(), b"v")  # the second endpoint answers
    finally:
        await etcd.aclose()
        await settle()
    dead = Etcd(["http://127.0.0.1:1"], timeout=1)
    try:
        with pytest.raises(EtcdUnavailable, match="unreachable"):
            await dead.get(b"k")
    finally:
        await dead.aclose()
