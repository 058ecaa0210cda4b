"""A worker's writer: a run of writes goes as its writes and comes back as their
outcomes, and when its link to the supervisor is gone every write it never sent
is answered (ShuttingDown: it did not run), and so is every later one, so no
session waits for an answer nothing will send."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from tenantkv import errors
from tenantkv.server.control_messages import WriteReply
from tenantkv.server.remote_writer import RemoteWriter
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.group_commit import Pending
from tenantkv.storage.ops import RunOp, SetOp, WriteOp


def _writer(delivered: list[Pending]) -> RemoteWriter:
    def no_channel() -> Any:
        raise AssertionError("nothing may be sent once the link is gone")

    return RemoteWriter(engine=None, channel=no_channel, deliver=delivered.extend)  # type: ignore[arg-type]


def _op() -> Any:
    return WriteOp()


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


class _AnsweringChannel:
    """The supervisor's side: each write of a message answered, the second with KeyExists."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def call(self, msg: Any, *, patient: bool = False) -> Any:
        self.sent.append(msg)
        outcomes: list[Any] = [[{"cas": i}, None, 9, []] for i in range(len(msg.ops))]
        outcomes[1] = [None, errors.KeyExists("key already exists").to_wire(), 0, []]
        return WriteReply(outcomes)


async def test_a_run_goes_as_its_writes_and_is_answered_in_its_order() -> None:
    delivered: list[Pending] = []
    channel = _AnsweringChannel()
    w = RemoteWriter(engine=None, channel=lambda: channel, deliver=delivered.extend)  # type: ignore[arg-type]
    b = BucketHandle("b", None, {})
    run = RunOp([SetOp(b, b"k%d" % i, b"v") for i in range(3)], 3 * 20)
    w.submit(run, lambda r, e: None)
    w.submit(SetOp(b, b"alone", b"v"), lambda r, e: None)
    assert w.lag == 4  # writes, not items
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        with trio.fail_after(1):
            await w.drain()
        nursery.cancel_scope.cancel()
    assert [len(m.ops) for m in channel.sent] == [4]  # one message, the run's writes in it
    first, alone = delivered
    assert first.error is None
    assert first.result[0] == {"cas": 0} and first.result[2] == {"cas": 2}
    assert isinstance(first.result[1], errors.KeyExists)  # in its write's place
    assert (alone.result, alone.error) == ({"cas": 3}, None)
    assert [op.nbytes for op in run.ops] == [9, 0, 9]  # metering filled in per write
    assert w.lag == 0 and w.ops_committed == 4
