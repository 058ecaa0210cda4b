"""DirectSocketStream (server/direct_stream.py) on a real connected socket pair:
the stream contract a session relies on, and when it yields."""

from __future__ import annotations

import socket as stdlib_socket
from collections.abc import Awaitable

import pytest
import trio
import trio.testing

from tenantkv.server.direct_stream import DirectSocketStream


class _Steps(trio.abc.Instrument):
    """Counts how often ``task`` is resumed: once per yield."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.resumed = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.resumed += 1


def _pair() -> tuple[DirectSocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return DirectSocketStream(trio.SocketStream(a)), trio.SocketStream(b)


async def test_bytes_go_both_ways_and_eof_reads_empty() -> None:
    server, client = _pair()
    await client.send_all(b"hello")
    assert await server.receive_some(100) == b"hello"
    await server.send_all(bytearray(b"world"))
    assert await client.receive_some(100) == b"world"
    await client.aclose()
    assert await server.receive_some(100) == b""
    await server.aclose()


async def test_a_receive_waits_for_bytes_and_a_ready_one_still_yields() -> None:
    server, client = _pair()
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            got.append(await server.receive_some(100))

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing sent yet: it waits
        await client.send_all(b"x")
    assert got == [b"x"]
    await client.send_all(b"y")  # in the socket's buffer before the call below
    # Bytes ready: read at once, then one yield, as SocketStream would (shielded:
    # the bytes are returned whatever is cancelled meanwhile).
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)
    try:
        assert await server.receive_some(100) == b"y"
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert steps.resumed == 1
    await server.aclose()
    await client.aclose()


async def test_a_large_send_waits_for_the_reader() -> None:
    server, client = _pair()
    big = bytes(range(256)) * 40_000  # ~10 MB: far more than the socket buffers hold
    received = bytearray()
    async with trio.open_nursery() as nursery:

        async def read_all() -> None:
            while len(received) < len(big):
                received.extend(await client.receive_some(1 << 20))

        nursery.start_soon(read_all)
        await server.send_all(big)
    assert bytes(received) == big
    await server.aclose()
    await client.aclose()


async def test_sends_yield_while_the_next_request_is_there_after_them() -> None:
    """A send yields while, when the connection reads again, its next request is
    already there; after a read that had to wait anyway sends stop yielding
    (the wait is the yield), but every PROBE_SENDS-th tries again."""
    server, client = _pair()
    steps = _Steps(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(steps)

    async def resumes(op: Awaitable[object]) -> int:
        before = steps.resumed
        await op
        return steps.resumed - before

    try:
        assert await resumes(server.send_all(b"answer 1")) == 1
        await client.send_all(b"request 2")  # there before the server reads
        assert await resumes(server.receive_some(100)) == 0  # the send yielded already
        assert await resumes(server.send_all(b"answer 2")) == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.receive_some, 100)
            await trio.testing.wait_all_tasks_blocked()  # it waits: nothing sent
            await client.send_all(b"request 3")
        # That yield did not find the request there: sends 3 to 7 do not yield,
        # the 8th tries again.
        assert [await resumes(server.send_all(b"a")) for _ in range(3, 9)] == [0] * 5 + [1]
        await client.send_all(b"request 9")
        assert await resumes(server.receive_some(100)) == 0
        assert await resumes(server.send_all(b"answer 9")) == 1  # it paid off: yielding again
    finally:
        trio.lowlevel.remove_instrument(steps)
    await server.aclose()
    await client.aclose()


async def test_a_cancelled_wait_loses_nothing(autojump_clock: trio.testing.MockClock) -> None:
    server, client = _pair()
    with trio.move_on_after(0.05) as scope:
        await server.receive_some(100)
    assert scope.cancelled_caught
    await client.send_all(b"later")
    assert await server.receive_some(100) == b"later"
    await server.aclose()
    await client.aclose()


async def test_closed_and_broken_connections_raise_stream_errors() -> None:
    server, client = _pair()
    # The peer resets the connection: a send fails as BrokenResourceError.
    client.socket.setsockopt(
        stdlib_socket.SOL_SOCKET, stdlib_socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
    )
    await client.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first writes may land in the buffer before the reset is seen
            await server.send_all(b"x" * 65536)
    await server.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some(10)
    with pytest.raises(trio.ClosedResourceError):
        await server.send_all(b"x")
