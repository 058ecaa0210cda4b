"""A worker's writer: its writes go to the node's group-commit writer in the supervisor.

With ``serve --workers N`` every write of every worker is committed by one
:class:`~tenantkv.storage.group_commit.GroupCommitWriter`, the supervisor's,
so one transaction and one fsync carry the writes of all workers and the
number of writes per commit grows with the node's load, not one worker's (a
writer per worker would commit each worker's writes apart: twice the commits
for the same writes with two workers, measured in docs/scaling.md).

This class stands where the node's writer stands in a single process
(``submit``, ``lag``, ``statistics``, the ``taken`` and ``deliver`` hooks), so
the request path does not know which it has. Writes go as messages
(:mod:`tenantkv.storage.op_wire`: a run of writes as one item, by field); the
answer comes once they are durable, and is delivered as a committed batch is
in one process. At most two messages are in flight: the supervisor's writer
takes one into each commit, so a third would only wait in its queue, and what
the loop's turns submit meanwhile goes as one message once an answer frees a
place — one message, one wake-up of each process and one system call each way
per commit instead of per turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from tenantkv import errors
from tenantkv.server.control import Channel, ChannelClosed
from tenantkv.server.control_messages import Write
from tenantkv.storage.engine import Engine
from tenantkv.storage.group_commit import Callback, Pending
from tenantkv.storage.op_wire import apply_outcome, apply_run_outcome, item_to_wire
from tenantkv.storage.ops import CreateBucketOp, RunOp, WriteOp

log = logging.getLogger("tenantkv.server")

#: Most writes in one message (a larger backlog goes as several).
MAX_MESSAGE_OPS = 4096
#: Messages sent and not yet answered. Two keep the node's writer busy: one is
#: committed while the next waits in its queue, and what the sessions write
#: meanwhile gathers here into the message after (see :meth:`RemoteWriter.run`).
MAX_MESSAGES_IN_FLIGHT = 2


class RemoteWriter:
    def __init__(
        self,
        engine: Engine,
        channel: Callable[[], Channel],
        deliver: Callable[[list[Pending]], None],
        *,
        taken: Callable[[list[Pending]], None] | None = None,
    ) -> None:
        self.engine = engine
        self._channel = channel
        self._deliver = deliver
        self._taken = taken
        self._buffer: list[Pending] = []
        self._wake = trio.Event()
        self._in_flight = 0
        #: messages sent and not yet answered (at most MAX_MESSAGES_IN_FLIGHT)
        self._messages_out = 0
        self._idle = trio.Event()
        self._idle.set()
        #: run() has ended (the link to the supervisor is gone): nothing is sent again
        self._gone = False
        # statistics: what this worker sent and got answered
        self.batches = 0
        self.ops_committed = 0
        self.failed_batches = 0
        #: kept for the node's interface; commits are observed in the supervisor
        self.observers: list[Callable[[int, float], None]] = []
        self.expiry_observers: list[Callable[[int], None]] = []

    @property
    def lag(self) -> int:
        """Writes not yet durable: buffered here or waiting for the node's writer."""
        return self._in_flight

    def statistics(self) -> dict[str, Any]:
        return {
            "queued": self.lag,
            "batches": self.batches,
            "ops_committed": self.ops_committed,
            "failed_batches": self.failed_batches,
            "durable": self.engine.sync,
            "remote": True,
        }

    def submit(
        self, op: WriteOp, callback: Callback, taken: Callable[[], None] | None = None
    ) -> None:
        self._buffer.append(Pending(op, callback, taken))
        self._in_flight += op.op_count
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._wake.set()
        if self._gone and len(self._buffer) == 1:
            # Answered later, as any write is, never from inside submit.
            trio.lowlevel.current_trio_token().run_sync_soon(self._fail_unsent)

    def start(self) -> None:
        """Nothing to start: :meth:`run` is a task of the worker's link."""

    def stop(self) -> None:
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        """Nothing to join (see :meth:`drain`)."""

    async def drain(self) -> None:
        """Wait until every write submitted so far has its answer."""
        self._wake.set()
        await self._idle.wait()

    async def run(self) -> None:
        """Send what the loop's turns submitted, as one message, whenever there is
        some and fewer than MAX_MESSAGES_IN_FLIGHT are unanswered.

        The writes held back meanwhile are what the node's writer could not
        take yet anyway (it is committing the message before): held here, they
        keep their queue bounds, as they would in one process's writer queue
        until it takes them, and go as one message once an answer frees a
        place — while the message queued behind the commit is being taken.

        When it ends (the link is gone: the supervisor died, or the worker
        stops), writes never sent fail with ShuttingDown — they did not run —
        and so does any write submitted later: a session must not wait for an
        answer that nothing will send.
        """
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    while self._buffer and self._messages_out < MAX_MESSAGES_IN_FLIGHT:
                        batch = self._take_message()
                        if self._taken is not None:
                            self._taken(batch)
                        self._messages_out += 1
                        nursery.start_soon(self._send, batch)
        finally:
            self._gone = True
            self._fail_unsent()

    def _take_message(self) -> list[Pending]:
        """The next buffered writes for one message: up to MAX_MESSAGE_OPS writes
        (a run of writes, one item, is never split)."""
        n = count = 0
        for p in self._buffer:
            n += 1
            count += p.op.op_count
            if count >= MAX_MESSAGE_OPS:
                break
        batch = self._buffer[:n]
        del self._buffer[:n]
        return batch

    def _fail_unsent(self) -> None:
        batch, self._buffer = self._buffer, []
        if not batch:
            return
        if self._taken is not None:
            self._taken(batch)
        self.failed_batches += 1
        log.error("%d writes not sent: the node's writer is gone", len(batch))
        failure = errors.ShuttingDown("the server is stopping; the write was not sent")
        for p in batch:
            p.result, p.error = None, failure
        self._finish(batch)

    async def _send(self, batch: list[Pending]) -> None:
        try:
            # A run of writes goes as one item, and is answered as a list of
            # its writes' outcomes (an error in a write's place), as the local
            # writer answers it (RunOp.apply).
            msg = Write([item_to_wire(p.op) for p in batch])
            # Shielded: once sent, the writes may commit; the answer (or the
            # channel closing) must be waited for, whatever is being cancelled.
            with trio.CancelScope(shield=True):
                answer = await self._channel().call(msg, patient=True)
            outcomes = answer.outcomes
            if len(outcomes) != len(batch):
                raise ValueError(f"{len(outcomes)} outcomes for {len(batch)} items")
            answered = [_answer(p.op, outcome) for p, outcome in zip(batch, outcomes, strict=True)]
        except (ChannelClosed, KeyError, ValueError, TypeError) as exc:
            # Whether these committed is unknown: never "retryable".
            self.failed_batches += 1
            log.error("writes lost their answer from the node's writer: %s", exc)
            failure = errors.InternalError(f"the node's writer did not answer: {exc}")
            for p in batch:
                p.result, p.error = None, failure
        else:
            for p, (result, error) in zip(batch, answered, strict=True):
                p.result, p.error = result, error
                if error is None and isinstance(p.op, CreateBucketOp):
                    p.result = self.engine.open_bucket(p.op.name, p.op.props)
            self.batches += 1
            self.ops_committed += sum(p.op.op_count for p in batch)
        self._messages_out -= 1
        self._wake.set()  # a place is free: send what gathered meanwhile
        self._finish(batch)

    def _finish(self, batch: list[Pending]) -> None:
        """Answer a batch's writes (results or errors set) and count them done."""
        try:
            self._deliver(batch)
        finally:
            self._in_flight -= sum(p.op.op_count for p in batch)
            if self._in_flight == 0:
                self._idle.set()


def _answer(op: WriteOp, outcome: Any) -> tuple[Any, BaseException | None]:
    """An item's ``(result, error)`` from its outcome, as the local writer gives
    them: a run's result is its writes' results, each error in its place."""
    if isinstance(op, RunOp):
        return apply_run_outcome(op, outcome), None
    return apply_outcome(op, outcome)
