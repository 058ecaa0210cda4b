"""A worker's writer: a run of writes goes as one item and comes back as its
writes' outcomes; at most two messages are in flight; and when its link to the
supervisor is gone every write it never sent is answered (ShuttingDown: it did
not run), and so is every later one, so no session waits for an answer nothing
will send."""

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
    """The supervisor's side: a lone write answered alone, a run by column with
    KeyExists for its second write."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def call(self, msg: Any, *, patient: bool = False) -> Any:
        self.sent.append(msg)
        outcomes: list[Any] = []
        for item in msg.ops:
            if item[0] != "run":
                outcomes.append([{"cas": 99}, None, 9, []])
                continue
            n = sum(segment[1] for segment in item[1])
            errs: list[Any] = [None] * n
            errs[1] = errors.KeyExists("key already exists").to_wire()
            results: list[Any] = [{"cas": i} for i in range(n)]
            results[1] = None
            outcomes.append([results, errs, [9, 0, 9][:n], None])
        return WriteReply(outcomes)


async def test_a_run_goes_as_one_item_and_is_answered_in_its_order() -> None:
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
    [message] = channel.sent  # one message: the run as one item, then the lone write
    assert [item[0] for item in message.ops] == ["run", "SetOp"]
    [(kind, n, same, varying)] = message.ops[0][1]  # one kind: one segment, by field
    assert (kind, n, same[0]) == ("SetOp", 3, "b")  # the bucket once
    assert list(varying[1]) == [b"k0", b"k1", b"k2"]  # the keys as a column
    first, alone = delivered
    assert first.error is None
    assert first.result[0] == {"cas": 0} and first.result[2] == {"cas": 2}
    assert isinstance(first.result[1], errors.KeyExists)  # in its write's place
    assert (alone.result, alone.error) == ({"cas": 99}, None)
    assert [op.nbytes for op in run.ops] == [9, 0, 9]  # metering filled in per write
    assert w.lag == 0 and w.ops_committed == 4 and w.batches == 1


class _HeldChannel:
    """The supervisor's side, answering a message only when the test says so."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.answer: list[trio.Event] = []

    async def call(self, msg: Any, *, patient: bool = False) -> Any:
        self.sent.append(msg)
        answer = trio.Event()
        self.answer.append(answer)
        await answer.wait()
        return WriteReply([[{"cas": 1}, None, 9, []] for _ in msg.ops])


async def test_two_messages_in_flight_and_what_gathers_meanwhile_goes_as_one() -> None:
    delivered: list[Pending] = []
    channel = _HeldChannel()
    w = RemoteWriter(engine=None, channel=lambda: channel, deliver=delivered.extend)  # type: ignore[arg-type]
    b = BucketHandle("b", None, {})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        for turn in range(5):  # a write per turn of the loop
            w.submit(SetOp(b, b"k%d" % turn, b"v"), lambda r, e: None)
            await trio.testing.wait_all_tasks_blocked()
        assert [len(m.ops) for m in channel.sent] == [1, 1]  # the other three wait
        assert w.lag == 5 and not delivered
        channel.answer[0].set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(delivered) == 1
        assert [len(m.ops) for m in channel.sent] == [1, 1, 3]  # gathered: one message
        for answer in channel.answer[1:]:
            answer.set()
        with trio.fail_after(1):
            await w.drain()
        nursery.cancel_scope.cancel()
    assert len(delivered) == 5 and w.lag == 0 and w.batches == 3
