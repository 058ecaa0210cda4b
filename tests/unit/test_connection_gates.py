"""The per-connection gates, without sockets: the connection table (node and
per-address caps, admin slots, eviction of connections without hello) and the
node-wide receive-buffer cap."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tenantkv.admission.connection_table import EVICTABLE_AFTER_SECS, ConnectionTable
from tenantkv.admission.receive_buffers import SMALL_READ_BYTES, ReceiveBuffers

CAPS = {"max_connections": 10, "per_address": 4}


def test_an_address_at_its_cap_is_refused_while_its_connections_are_young() -> None:
    t = ConnectionTable()
    for i in range(4):
        assert t.admit(i, "10.0.0.1", 0.0, **CAPS).ok
    refused = t.admit(99, "10.0.0.1", 0.5, **CAPS)
    assert not refused.ok and "max_connections_per_address=4" in refused.reason
    assert t.admit(100, "10.0.0.2", 0.5, **CAPS).ok  # another address is fine
    assert t.statistics().refused_address_full == 1


def test_the_oldest_connection_without_hello_of_that_address_gives_way() -> None:
    t = ConnectionTable()
    t.admit(1, "10.0.0.2", 0.0, **CAPS)  # another address, oldest of all
    for i in range(2, 6):
        t.admit(i, "10.0.0.1", 0.1 * i, **CAPS)
    assert t.authenticated(2, admin=False, max_connections=10, reserved_for_admins=0) is None
    got = t.admit(9, "10.0.0.1", EVICTABLE_AFTER_SECS + 1, **CAPS)
    assert got.ok and got.evict == 3  # 2 said hello; 1 is another address
    assert len(t) == 5 and t.statistics().evicted_unauthenticated == 1


def test_a_full_node_evicts_globally_and_refuses_when_everyone_said_hello() -> None:
    t = ConnectionTable()
    caps = {"max_connections": 3, "per_address": 3}
    for i in range(3):
        t.admit(i, f"10.0.0.{i}", 0.0, **caps)
    got = t.admit(7, "10.0.0.9", EVICTABLE_AFTER_SECS, **caps)
    assert got.ok and got.evict == 0
    for i in (1, 2, 7):
        t.authenticated(i, admin=True, max_connections=3, reserved_for_admins=0)
    refused = t.admit(8, "10.0.0.9", 100.0, **caps)
    assert not refused.ok and "max_connections=3" in refused.reason


def test_non_admins_leave_the_reserved_slots_to_admins() -> None:
    t = ConnectionTable()
    for i in range(5):
        t.admit(i, "10.0.0.1", 0.0, max_connections=5, per_address=5)
    kw = {"max_connections": 5, "reserved_for_admins": 2}
    assert [t.authenticated(i, admin=False, **kw) for i in range(3)] == [None] * 3
    assert "admin_reserved_connections=2" in (t.authenticated(3, admin=False, **kw) or "")
    assert t.authenticated(4, admin=True, **kw) is None
    st = t.statistics()
    # the refused one left the table at once; none is left without hello
    assert (st.admins, st.unauthenticated, st.refused_reserved_for_admins) == (1, 0, 1)
    assert len(t) == 4


def test_closed_connections_free_their_address() -> None:
    t = ConnectionTable()
    t.admit(1, "a", 0.0, **CAPS)
    t.closed(1)
    t.closed(1)  # twice is harmless (an evicted connection's task ends later)
    assert len(t) == 0 and t.statistics().addresses == 0


def test_receive_buffers_cap_what_is_held() -> None:
    b = ReceiveBuffers(1000)
    a, c = object(), object()
    assert b.try_reserve(a, 0, 4096) == 4096
    b.update(a, 1200)  # one connection holds a partial frame past the cap
    assert b.try_reserve(c, 0, 65536) == SMALL_READ_BYTES  # an empty one reads a little
    b.update(c, 10)  # and holds part of a frame too
    assert b.try_reserve(a, 1200, 4096) == 4096  # the first to ask finishes its frame
    assert b.try_reserve(c, 10, 4096) == 0  # the other waits
    b.update(a, 0)  # the finisher's frame is decoded
    assert b.try_reserve(c, 10, 4096) == 4096  # under the cap again
    b.update(c, 0)
    assert b.buffered == 0


def test_connections_that_all_hold_partial_frames_at_the_cap_finish_one_at_a_time() -> None:
    """Thirty connections each holding part of a frame past the cap: without a
    finisher each waits for the others until its frame deadline."""
    b = ReceiveBuffers(1000)
    conns = [object() for _ in range(30)]
    for c in conns:
        b.update(c, 100)
    done = 0
    for _ in range(100):
        readers = [c for c in conns if b.try_reserve(c, 100, 4096)]
        assert readers  # progress
        if b.buffered >= b.capacity:
            assert len(readers) == 1  # and at the cap, one at a time
        b.update(readers[0], 0)  # its frame completes
        conns.remove(readers[0])
        done += 1
        if not conns:
            break
    assert done == 30 and b.buffered == 0


def test_one_user_holds_at_most_its_share_of_the_cap() -> None:
    b = ReceiveBuffers(100_000)
    hog, other = object(), object()
    b.update(hog, 60_000, "mallory")  # past the user's share (half the cap)
    assert b.try_reserve(object(), 0, 65536, "mallory") == SMALL_READ_BYTES
    assert b.try_reserve(other, 0, 65536, "alice") == 65536  # another tenant has room
    b.update(other, 30_000, "alice")
    assert b.try_reserve(other, 30_000, 65536, "alice") == 65536
    b.update(hog, 0)
    assert b.try_reserve(object(), 0, 65536, "mallory") == 65536
    assert b.statistics().user_capacity_bytes == 50_000


async def test_a_waiting_connection_wakes_when_room_frees() -> None:
    b = ReceiveBuffers(100)
    first, second = object(), object()
    b.update(first, 150)
    b.update(second, 10)
    assert b.try_reserve(first, 150, 4096) == 4096  # (the finisher)
    got: list[int] = []

    async def reader() -> None:
        got.append(await b.reserve(second, 10, 4096))

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and b.statistics().waiting == 1
        b.update(first, 95)  # it decoded some: woken, still at the cap, and
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # the finisher has not finished
        b.update(first, 0)
    assert got == [4096] and b.statistics().waits_total == 2


@pytest.mark.parametrize("held", [0, 10])
def test_under_the_cap_everyone_reads_in_full(held: int) -> None:
    assert ReceiveBuffers(100).try_reserve(object(), held, 300) == 300
