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
    assert b.try_reserve(0, 4096) == 4096
    b.update(0, 1200)  # one connection holds a partial frame past the cap
    assert b.try_reserve(1200, 4096) == 0  # it waits
    assert b.try_reserve(0, 65536) == SMALL_READ_BYTES  # an empty one reads a little
    b.update(1200, 0)
    assert b.try_reserve(1200, 4096) == 4096


async def test_a_waiting_connection_wakes_when_room_frees() -> None:
    b = ReceiveBuffers(100)
    b.update(0, 150)
    got: list[int] = []

    async def reader() -> None:
        got.append(await b.reserve(150, 4096))

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and b.statistics().waiting == 1
        b.update(150, 50)
    assert got == [4096] and b.statistics().waits_total == 1


@pytest.mark.parametrize("held", [0, 10])
def test_under_the_cap_everyone_reads_in_full(held: int) -> None:
    assert ReceiveBuffers(100).try_reserve(held, 300) == 300
