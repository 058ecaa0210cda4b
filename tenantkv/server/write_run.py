"""A run of writes: the writes of one connection's chunk admitted together.

A session admits a chunk's consecutive writes of one command on one bucket
as a run (``server/execution.py``): the first through every gate, each next
one through the gate objects the run holds (:meth:`Pipeline.try_join`). The
writes go to the group-commit writer one by one, each its own op with its own
outcome, but they share one :class:`~tenantkv.admission.pipeline.Holds`, and
their callbacks are one method given each write's place in the run. The
run's counts, charges and holds are settled once, when its last write is
answered — per run, not per write, as the reads of a chunk are.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.server import auth
from tenantkv.server.node import Node
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteOp


class WriteSession(Protocol):
    """What a run needs of its session (``server/execution.py``)."""

    node: Node
    user: auth.User | None
    pending_writes: int
    pending_write_bytes: int
    _reader_parked: bool

    def _reply(self, msgid: int, result: Any) -> None: ...

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None: ...

    def _count_error(self, exc: errors.TenantKVError, n: int = 1) -> None: ...

    def _wake_reader(self) -> None: ...


class WriteRun:
    """Writes of one session on one bucket, one command, admitted together."""

    __slots__ = (
        "_answered",
        "_closed",
        "_cost",
        "_key_len",
        "_msgids",
        "_ok",
        "_ops",
        "_session",
        "_wu",
        "bucket",
        "done",
        "holds",
        "method",
        "t0",
        "taken",
    )

    def __init__(
        self, session: WriteSession, bucket: BucketHandle, method: str, holds: Holds, t0: float
    ) -> None:
        self._session = session
        self.bucket = bucket
        self.method = method
        self.holds = holds
        #: when the run's first write was received (perf_counter): its latency's start
        self.t0 = t0
        self._msgids: list[int] = []
        #: the writes not yet answered (an answered one is dropped at once: its
        #: value must not outlive its answer while the rest of the run waits)
        self._ops: list[WriteOp | None] = []
        #: the key length of the run's first write (what a one-write run reports)
        self._key_len = 0
        self._answered = self._ok = self._wu = self._cost = 0
        self._closed = False
        # Bound once for every write of the run, not once per write.
        self.done = self._done
        self.taken = holds.release_queue_bounds

    def add(self, msgid: int, op: WriteOp) -> None:
        """Queue a write admitted with the run (its gates taken: ``holds`` counts it)."""
        s = self._session
        if not self._ops:
            self._key_len = len(getattr(op, "key", b""))
        self._msgids.append(msgid)
        self._ops.append(op)
        s.pending_writes += 1
        s.pending_write_bytes += op.size_hint
        s.node.submit(op, partial(self.done, len(self._ops) - 1), self.taken)

    def close(self) -> None:
        """No write joins the run any more (the chunk settled, or another request
        came); it settles once its last write is answered."""
        self._closed = True
        if self._answered == len(self._ops):
            self._settle()

    def _done(self, i: int, result: Any, error: BaseException | None) -> None:
        """The writer's answer to the run's ``i``-th write."""
        answered = self._answered = self._answered + 1
        msgid, op = self._msgids[i], self._ops[i]
        assert op is not None  # answered once
        self._ops[i] = None
        s = self._session
        s.pending_writes -= 1
        s.pending_write_bytes -= op.size_hint
        if error is None:
            self._ok += 1
            wu, cost = s.node.write_cost(op, wrote=True)
            self._wu += wu
            self._cost += cost
            s._reply(msgid, result)
        else:
            self._failed(msgid, op, error)
        if self._closed and answered == len(self._ops):
            self._settle()
        if s._reader_parked:
            s._wake_reader()

    def _failed(self, msgid: int, op: WriteOp, error: BaseException) -> None:
        s = self._session
        if isinstance(error, errors.TenantKVError):
            exc = error
        else:
            exc = errors.InternalError(repr(error))
        exc.command = self.method
        s._count_error(exc)
        s._reply_error(msgid, exc)
        if isinstance(error, errors.ServerError) and not exc.labels:
            # It ran (a CAS mismatch, add on an existing key, a miss): it costs.
            wu, cost = s.node.write_cost(op, wrote=False)
            self._wu += wu
            self._cost += cost

    def _settle(self) -> None:
        """Every write answered: give the gates back, count and charge the run."""
        s = self._session
        n = len(self._ops)
        key_len = self._key_len if n == 1 else 0
        self.holds.release(self.method, key_len, "ok" if self._ok == n else "error", n=n)
        node = s.node
        name = self.bucket.name
        if self._ok:
            node.count_write(name, self.method, self.t0, self._ok)
        if self._cost:
            user = s.user
            node.charge_writes(name, self._wu, self._cost, user is not None and user.unthrottled)
