"""A run of writes: the writes of one connection's chunk admitted together.

A session admits a chunk's consecutive writes of one command on one bucket
as a run (``server/executor.py``): the first through every gate, each next
one through the gate objects the run holds, as far as the room every gate
had when the run began goes (:meth:`Pipeline.join_room`); the joins are
counted at each gate once (:meth:`Pipeline.join`). The run's writes share one
:class:`~tenantkv.admission.pipeline.Holds`. When no write can join any more,
the run goes to the group-commit writer as one item
(:class:`~tenantkv.storage.ops.RunOp`): taken, applied and answered together,
each write with its own outcome. Its counts, charges and holds are settled
once — per run, not per write, as the reads of a chunk are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.server import auth
from tenantkv.server.commands import Command
from tenantkv.server.node import Node
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import RunOp, WriteOp


class Replies(Protocol):
    """How a run answers its writes: its door's replies (``server/doors/``)."""

    def reply(self, cmd: Command, msgid: int, result: Any) -> None: ...

    def reply_all(self, cmd: Command, msgids: list[int], results: Sequence[Any]) -> None: ...

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None: ...


class WriteSession(Protocol):
    """What a run needs of its connection's executor (``server/executor.py``)."""

    node: Node
    user: auth.User | None
    pending_writes: int
    pending_write_bytes: int
    reader_parked: bool

    @property
    def door(self) -> Replies: ...

    def count_error(self, exc: errors.TenantKVError, n: int = 1) -> None: ...

    def wake_reader(self) -> None: ...

    def held_changed(self) -> None: ...


class WriteRun:
    """Writes of one session on one bucket, one command, admitted together."""

    __slots__ = (
        "_bytes",
        "_closed",
        "_msgids",
        "_ops",
        "_session",
        "bucket",
        "cmd",
        "holds",
        "reserved",
        "room",
        "t0",
        "unlimited",
    )

    def __init__(
        self,
        session: WriteSession,
        bucket: BucketHandle,
        cmd: Command,
        holds: Holds,
        t0: float,
        *,
        unlimited: bool = False,
    ) -> None:
        self._session = session
        self.bucket = bucket
        #: the command of the run's writes (a write of another joins no run)
        self.cmd = cmd
        self.holds = holds
        #: when the run's first write was received (perf_counter): its latency's start
        self.t0 = t0
        #: the tenant throttle does not hold these writes back (throttling off, an
        #: unthrottled user): while the run lasts — nothing else runs, no limit
        #: changes — the writes that join it need not ask it
        self.unlimited = unlimited
        #: units the throttle reserved for the run's writes when it admitted each
        #: (their known cost): the charge once they ran settles the difference
        self.reserved = holds.reserved
        self._msgids: list[int] = []
        #: the run's writes, until they are answered (their values must not
        #: outlive their answers)
        self._ops: list[WriteOp] = []
        self._bytes = 0  # their size_hint, summed
        self._closed = False
        #: how many more writes may join (-1: not asked yet, since a lone write
        #: need not ask); the gates count the joins when the run closes (nothing
        #: else touches them before it does)
        self.room = -1

    @property
    def joined(self) -> int:
        """Writes that joined the run after its first."""
        return len(self._msgids) - 1

    def add(self, msgid: int, op: WriteOp) -> None:
        """A write admitted with the run: its first, or one that joins it
        (:meth:`may_join` said it may; its gates taken: ``holds`` counts it)."""
        self.add_many([msgid], [op], op.size_hint)

    def add_many(self, msgids: list[int], ops: list[WriteOp], nbytes: int) -> None:
        """:meth:`add` each of ``ops`` (``nbytes``: their size_hint, summed), as the
        session's write join loop does once it stops, for all the writes it
        joined: its room is what the run had (:attr:`room`) when it began."""
        if self.room > 0:  # (-1 for the first: not asked)
            self.room -= len(ops)
        s = self._session
        self._msgids += msgids
        self._ops += ops
        self._bytes += nbytes
        s.pending_writes += len(ops)
        s.pending_write_bytes += nbytes

    def may_join(self) -> bool:
        """May one more write join? The gates are asked once, by the second write."""
        if self.room < 0:
            self.room = self._session.node.pipeline.join_room(self.holds)
        return self.room > 0

    def close(self) -> None:
        """No write joins the run any more (the chunk settles before anything
        awaits, or another request came): it goes to the writer, as one item, in
        the same turn of the event loop as its writes were received."""
        if self._closed:
            return
        self._closed = True
        node = self._session.node
        node.pipeline.join(self.holds, self.joined)
        ops = self._ops
        if ops:
            # A lone write goes as itself (its answer is its own result or error).
            op = ops[0] if len(ops) == 1 else RunOp(ops, self._bytes)
            node.submit(op, self._done, self._taken)

    def _taken(self) -> None:
        self.holds.release_queue_bounds(len(self._msgids))

    def _done(self, results: Any, error: BaseException | None) -> None:
        """The writer's answer: each write's result or error (``results``), or one
        ``error`` for them all (the commit failed)."""
        ops, msgids = self._ops, self._msgids
        self._ops = []
        if error is None and len(ops) == 1:
            results = (results,)
        s = self._session
        node = s.node
        s.pending_writes -= len(ops)
        s.pending_write_bytes -= self._bytes
        s.held_changed()
        wu_sum = cost_sum = 0
        if error is not None:
            results = [error] * len(ops)
        if not any([isinstance(r, BaseException) for r in results]):
            s.door.reply_all(self.cmd, msgids, results)  # the usual answer: all succeeded
            succeeded = ops
        else:
            succeeded = []
            for msgid, op, result in zip(msgids, ops, results, strict=True):
                if isinstance(result, BaseException):
                    wu, cost = self._failed(msgid, op, result)
                    wu_sum += wu
                    cost_sum += cost
                else:
                    succeeded.append(op)
                    s.door.reply(self.cmd, msgid, result)
        if succeeded:
            wu, cost = node.write_costs(succeeded)
            wu_sum += wu
            cost_sum += cost
        self._settle(len(ops), len(succeeded), wu_sum, cost_sum, ops[0])
        if s.reader_parked:
            s.wake_reader()

    def _failed(self, msgid: int, op: WriteOp, error: BaseException) -> tuple[int, int]:
        """Answer a write that failed; what it costs (``(wu, cost)``)."""
        s = self._session
        if isinstance(error, errors.TenantKVError):
            exc = error
        else:
            exc = errors.InternalError(repr(error))
        exc.command = self.cmd.name
        s.count_error(exc)
        s.door.reply_error(msgid, exc)
        if isinstance(error, errors.ServerError) and not exc.labels:
            # It ran (a CAS mismatch, add on an existing key, a miss): it costs.
            return s.node.write_cost(op, wrote=False)
        return 0, 0

    def _settle(self, n: int, ok: int, wu: int, cost: int, first: WriteOp) -> None:
        """Every write answered: give the gates back, count and charge the run."""
        s = self._session
        key_len = len(getattr(first, "key", b"")) if n == 1 else 0
        self.holds.release(self.cmd.name, key_len, "ok" if ok == n else "error", n=n)
        node = s.node
        name = self.bucket.name
        if ok:
            node.count_write(name, self.cmd.name, self.t0, ok)
        if cost or self.reserved:
            user = s.user
            node.charge_writes(name, wu, cost, user is not None and user.unthrottled, self.reserved)
            self.reserved = 0
