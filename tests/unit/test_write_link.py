"""A worker's write link (tenantkv.server.write_link): the supervisor's thread
reads write messages and queues them; an answer sent from any thread reaches
the worker's call; a malformed message ends the link, and the worker's calls
then fail (their outcome unknown) instead of waiting forever."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import trio

from tenantkv.server import control_messages as m
from tenantkv.server.control import Channel, ChannelClosed
from tenantkv.server.write_link import WriteLinkServer

Answer = Callable[[dict[str, Any]], None]


def _link(submit: Callable[[list[Any], Answer], None]) -> tuple[WriteLinkServer, Channel]:
    theirs, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = WriteLinkServer(theirs, "worker 9", submit)
    server.start()
    mine.setblocking(False)
    channel = Channel(trio.SocketStream(trio.socket.from_stdlib_socket(mine)), "worker 9 writes")
    return server, channel


async def test_writes_are_queued_in_order_and_answered_from_another_thread() -> None:
    """Each message is handed over as it arrives; its answer, sent later by
    another thread (the writer's), reaches the call that sent it."""
    queued: list[tuple[list[Any], Answer]] = []
    arrived = threading.Semaphore(0)

    def submit(ops: list[Any], answer: Answer) -> None:
        queued.append((ops, answer))
        arrived.release()

    server, channel = _link(submit)
    replies: dict[int, m.WriteReply] = {}

    async def call(i: int) -> None:
        replies[i] = await channel.call(m.Write([["SetOp", [i]]]), patient=True)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, {})
            async with trio.open_nursery() as calls:
                for i in range(3):
                    calls.start_soon(call, i)
                    await trio.to_thread.run_sync(arrived.acquire)
                # Answered out of order, from a thread of their own.
                for ops, answer in reversed(queued):
                    n = ops[0][1][0]
                    t = threading.Thread(target=answer, args=({"outcomes": [n * 10]},))
                    t.start()
                    t.join()
            nursery.cancel_scope.cancel()
    assert [ops for ops, _ in queued] == [[["SetOp", [i]]] for i in range(3)]
    assert {i: r.outcomes for i, r in replies.items()} == {0: [0], 1: [10], 2: [20]}
    assert server.received == 3 and server.answered == 3
    server.close()
    server.join(10)
    await channel.aclose()


async def test_a_malformed_message_ends_the_link_and_calls_in_flight_fail() -> None:
    arrived = threading.Semaphore(0)

    def submit(ops: list[Any], answer: Answer) -> None:
        arrived.release()  # (never answered: the call waits until the link ends)

    server, channel = _link(submit)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, {})

            async def call() -> None:
                with pytest.raises(ChannelClosed):
                    await channel.call(m.Write([]), patient=True)

            nursery.start_soon(call)
            await trio.to_thread.run_sync(arrived.acquire)
            await channel._stream.send_all(msgpack.packb({"type": "status", "id": 7}))
            await trio.to_thread.run_sync(server.join)
    assert channel.closed
    server.answer(1, {"outcomes": []})  # (the link is gone: nothing is sent, nothing raised)
    await channel.aclose()


async def test_a_message_that_cannot_be_queued_is_answered_with_its_error() -> None:
    def submit(ops: list[Any], answer: Answer) -> None:
        raise ValueError("a write message needs a list of ops")

    server, channel = _link(submit)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, {})
            with pytest.raises(ChannelClosed, match="needs a list of ops"):
                await channel.call(m.Write([]), patient=True)
            assert not channel.closed  # (the link goes on)
            nursery.cancel_scope.cancel()
    server.close()
    server.join(10)
    await channel.aclose()
