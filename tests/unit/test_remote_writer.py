"""A worker's writer when its link to the supervisor is gone: every write it never
sent is answered (ShuttingDown: it did not run), and so is every later one, so
no session waits for an answer nothing will send."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tenantkv import errors
from tenantkv.server.remote_writer import RemoteWriter
from tenantkv.storage.group_commit import Pending


def _writer(delivered: list[Pending]) -> RemoteWriter:
    def no_channel() -> Any:
        raise AssertionError("nothing may be sent once the link is gone")

    return RemoteWriter(engine=None, channel=no_channel, deliver=delivered.extend)  # type: ignore[arg-type]


def _op() -> Any:
    return object()


async def test_writes_buffered_when_the_link_goes_are_answered() -> None:
    delivered: list[Pending] = []
    w = _writer(delivered)
    w.submit(_op(), lambda r, e: None)
    w.submit(_op(), lambda r, e: None)
    async with trio.open_nursery() as nursery:
        nursery.cancel_scope.cancel()  # the link's nursery goes before run sends them
        nursery.start_soon(w.run)
    assert len(delivered) == 2
    assert all(isinstance(p.error, errors.ShuttingDown) for p in delivered)
    assert w.lag == 0 and w.failed_batches == 1
    with trio.fail_after(1):
        await w.drain()


async def test_a_write_submitted_after_the_link_went_is_answered_too() -> None:
    delivered: list[Pending] = []
    w = _writer(delivered)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert delivered == []
    w.submit(_op(), lambda r, e: None)
    assert delivered == []  # never from inside submit
    with trio.fail_after(1):
        await w.drain()
    assert len(delivered) == 1 and isinstance(delivered[0].error, errors.ShuttingDown)
