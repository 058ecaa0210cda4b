"""Running a connection's commands: admission, execution, completion.

The session (``server/session.py``) frames requests and answers; this half
runs them. Every data command takes one path:

1. :meth:`Execution._prepare` — parameters checked, bucket and role resolved
   for the user as the registry has it now, a write built and its cost checked;
2. admission by the pipeline (:mod:`tenantkv.admission.pipeline`) —
   :meth:`Pipeline.try_acquire` inline, or :meth:`Pipeline.acquire` when a
   gate makes it wait;
3. :meth:`Execution._execute` — a read runs inline on the chunk's read
   transaction and is answered; a write joins a run of writes
   (:class:`~tenantkv.server.write_run.WriteRun`), is queued on the
   group-commit writer and answered once durable, its run keeping what it
   holds until then (less what bounds the writer's queue, given back when the
   writer takes it).

:meth:`Execution._run_inline` tries that without awaiting; it declines (and
:meth:`Execution._run` does the same with waits) when the connection has
writes in flight and the command is not a write — the one backlog rule, so a
connection reads its own writes (:meth:`Execution._backlogged`) — when a
failpoint is armed, or when a gate cannot admit at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from tenantkv import errors, protocol
from tenantkv.admission.pipeline import Holds
from tenantkv.server import auth
from tenantkv.server.commands import Command, check_params
from tenantkv.server.node import Node
from tenantkv.server.write_run import WriteRun
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.session")

#: A whole token of a request-rate loan (the token bucket's own float tolerance).
RATE_TOKEN = 1.0 - 1e-9
#: ``_rate_left`` once a chunk's first request took its token without a loan.
FIRST_TOKEN_TAKEN = -math.inf
#: A read run's allowance before its second read asks for it (costs are >= 0).
ASK_ALLOWANCE = -1.0
#: A connection whose request the rate limiter refused is read again when the
#: limiter could admit one of its requests, at most this much later: what its
#: client sends meanwhile waits in the socket and is answered in one receive and
#: one send, instead of a wake-up, a receive and a send per refusal.
REFUSAL_PAUSE_MAX_SECS = 0.010
#: ...if that is at least this far off. Sooner, the limiter admits over a thousand
#: requests a second, and a pause would only delay the ones it admits next.
REFUSAL_PAUSE_MIN_SECS = 0.001
#: A refused request of WAITING_COUNTED_BYTES or more pauses its connection until
#: its retryAfterMs, at most this long: the server received and decoded all of it
#: to refuse it, and would do so again for the next one its client pipelined (a
#: tenant at its limit sending 20 MiB writes had 118 of them decoded and refused
#: in 28 s, halving another tenant's rate). There is nothing to read sooner.
LARGE_REFUSAL_PAUSE_MAX_SECS = 1.0
#: A refusal whose wait is at least this long (a bucket deep in debt, which is
#: never forgiven) pauses its connection as a large request's does: at 10 ms a
#: tenant that kept pipelining was answered a chunk of refusals every 10 ms, each
#: request decoded and taken down the waiting path (an MGET of 1,000 keys 493
#: times a second took another tenant's GETs to 29 % of calm).
LONG_WAIT_SECS = 2.0
#: A connection logs an unexpected command failure at most once per this many
#: seconds (see Execution._log_internal_error).
ERROR_LOG_INTERVAL_SECS = 1.0
#: Command kinds that go through the admission pipeline.
DATA_KINDS = frozenset({"read", "write"})
#: A request that waits with at least this many bytes of arguments counts them
#: against the node-wide cap on what clients make the server hold while it waits
#: (``max_receive_buffer_bytes``): decoded, they are no longer received bytes, and
#: a tenant held at its limit would otherwise keep a 20 MiB value per connection
#: waiting uncounted. Smaller ones are not counted (two updates of the cap each).
WAITING_COUNTED_BYTES = 64 * 1024


def request_bytes(params: dict[str, Any] | list[bytes]) -> int:
    """The bytes of a decoded request's arguments (values, keys, pairs): what it
    holds while it waits. Containers one level down are counted (keys, pairs)."""
    n = 0
    for v in params.values() if isinstance(params, dict) else params:
        if isinstance(v, (bytes, bytearray, str)):
            n += len(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, (bytes, bytearray, str)):
                    n += len(x)
                elif isinstance(x, tuple):
                    n += sum(len(y) for y in x if isinstance(y, (bytes, bytearray, str)))
    return n


class NotNow(Exception):
    """A write that would join a run, which the tenant throttle cannot admit at
    once at its cost: it takes the waiting path instead (nothing was taken)."""


@dataclass(slots=True)
class Prepared:
    """A data command ready to admit: its bucket, its user, and (a write) its op.

    One per session, refilled by each :meth:`Execution._prepare`: a command is
    prepared, admitted and executed before the next is prepared (the write's
    completion keeps what it needs, not this), and one allocation per
    operation less is measurable on a pipelined read.
    """

    cmd: Command
    params: dict[str, Any]
    bucket: BucketHandle
    user: auth.User
    op: WriteOp | None
    #: a write's cost known before it runs (Node.write_admission_cost; 0: a read)
    cost: int = 0


class Execution:
    """The execution half of a session (the session class extends it)."""

    node: Node
    conn_id: int
    peer_ip: str
    user: auth.User | None
    bucket: str | None
    nonblocking_throttle: bool

    def __init__(self, node: Node) -> None:
        #: per-record byte counts a read handler read (for metering), and how many
        #: keys it looked up (a multi-key read sets it: the cost floor is per key)
        self.read_sizes: list[int] = []
        self.read_keys = 1
        self.pending_writes = 0
        #: bytes of those writes (their values and keys), for back-pressure
        self.pending_write_bytes = 0
        #: bytes of the decoded request waiting (at a gate, or for this connection's
        #: writes), when it has WAITING_COUNTED_BYTES or more: held all the same
        self.waiting_bytes = 0
        # A plain flag says whether the task is parked waiting for writes: checking
        # a bool per write callback is much cheaper than asking the ParkingLot.
        self._drain_lot = trio.lowlevel.ParkingLot()
        self._reader_parked = False
        #: the read transaction shared by the reads of the chunk being handled
        self.rtxn: Any = None
        #: when the chunk being handled was received (perf_counter), and its inline
        #: reads per (bucket, operation): counted and timed once per chunk
        self._chunk_t0 = 0.0
        #: the throttle clock's reading for the chunk being handled (one per chunk;
        #: 0.0: none since the chunk last waited, see _read_clock)
        self._chunk_now = 0.0
        #: the request rate limiter's tokens lent to the chunk being handled (None:
        #: no loan), the whole tokens in it, those not yet taken (0 without a
        #: loan: the session's loop takes one inline), the requests refused, and
        #: the refusal
        self._rate_left: float | None = None
        self._rate_lent = 0
        self.rate_room = 0
        self._rate_refused = 0
        self._chunk_refusal: errors.ServerError | None = None
        #: when the framing half may read this connection again after a refusal
        #: by the rate limiter (trio time; 0.0: at once)
        self.reads_paused_until = 0.0
        #: the run of inline reads being admitted (see _start_read_run): its command
        #: and bucket (None: no run; a read of the same command joins the run
        #: without asking again what the run's first asked), user privilege,
        #: throttle allowance, reads and their units
        self._run_cmd: Command | None = None
        self._run_handle: BucketHandle | None = None
        self._run_unthrottled = False
        self._run_watched = False
        #: the read unit size and per-operation floor of units, as at the run's start
        self._run_unit = 4096
        self._run_floor = 1
        self._run_allowance = 0.0
        self._run_reads = 0
        self._run_errors = 0
        self._run_ru = 0
        self._run_cost = 0
        self._chunk_reads: dict[tuple[str, str], int] = {}
        #: the run of writes being admitted (see _write_inline; None: no run)
        self._wrun: WriteRun | None = None
        #: the bucket of a read of this chunk admitted on the waiting path, after
        #: its turn in the throttle queue (None: none): until anything awaits, the
        #: chunk's next reads on it start runs without queueing behind the others
        #: again (see _start_read_run)
        self._turn: str | None = None
        #: node.accounts.epoch when ``user`` was last looked up (see current_user)
        self._auth_epoch = node.accounts.epoch
        self._prepared: Prepared | None = None
        #: the selected bucket as last authorized for reads / writes (see _data_bucket)
        self._read_handle: BucketHandle | None = None
        self._write_handle: BucketHandle | None = None
        #: when this connection last logged an unexpected failure (trio time), and
        #: how many it did not log since (_log_internal_error)
        self._error_logged_at = -math.inf
        self._errors_not_logged = 0

    # -- what the framing half provides ---------------------------------------

    def _reply(self, msgid: int, result: Any) -> None:
        raise NotImplementedError

    def _reply_all(self, msgids: list[int], results: Sequence[Any]) -> None:
        """:meth:`_reply` to each request of ``msgids`` with its result (a run of
        writes, answered together)."""
        for msgid, result in zip(msgids, results, strict=True):
            self._reply(msgid, result)

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        raise NotImplementedError

    def begin_shutdown(self) -> None:
        raise NotImplementedError

    def _held_changed(self) -> None:
        """The connection's writes not yet durable changed (``pending_write_bytes``,
        as a run's writes were answered): the framing half tells the node-wide
        cap on what clients make the server hold."""

    # -- the path ---------------------------------------------------------------

    def _refused_by_rate(self, msgid: int, method: str, *, admin: bool) -> bool:
        """The ingress request rate limiter, first on every request after hello
        (call it when ``pipeline.request_rate_enabled``): True when it refused the
        request, answered with 462.

        Decided per chunk, at the chunk's instant. Its first request takes a token
        if there is one (:meth:`Pipeline.take_request_token`): most chunks hold one
        request (unpipelined clients), and for them a loan would be a lend and a
        settle more. The next request — or the first, when no token was there —
        borrows every token the limiter holds then
        (:meth:`Pipeline.lend_request_tokens`); each request of the chunk then
        takes one from the loan while one is left and is refused otherwise — all
        with the same answer, as at the chunk's instant — and
        :meth:`_settle_rate` gives back the rest and counts them when the chunk
        ends or anything awaits. An admin's admin commands (``admin``) and exempt
        addresses pass, counted, as :meth:`Pipeline.check_request_rate` says.

        The loan's whole tokens are counted down in ``rate_room``; a session's
        loop may take one itself (``rate_room -= 1`` for a request that is not an
        admin's admin command) instead of calling this: the same answer, a call less per
        request.

        A refusal also sets ``reads_paused_until`` (when the wait for a token is
        :data:`REFUSAL_PAUSE_MIN_SECS` or more): the framing half reads the
        connection again then, so a client that keeps sending is answered in
        batches, one wake-up per pause."""
        if not admin:
            left = self._rate_left
            if left is None or left == FIRST_TOKEN_TAKEN:
                pipeline = self.node.pipeline
                now = self._chunk_now or self._read_clock()
                if left is None and pipeline.take_request_token(self.peer_ip, now):
                    self._rate_left = FIRST_TOKEN_TAKEN
                    return False
                left = self._rate_left = pipeline.lend_request_tokens(self.peer_ip, now)
                if left is not None:
                    # Request j of the chunk passes when left - (j - 1) >= RATE_TOKEN.
                    self._rate_lent = self.rate_room = max(0, int(left + (1.0 - RATE_TOKEN)))
            if left is not None:
                if self.rate_room:
                    self.rate_room -= 1
                    return False
                left -= self._rate_lent  # what the whole tokens leave of the loan
                # The chunk's one refusal, answered from its template and counted
                # as the bucket's errors when the chunk settles: cheap, since a
                # flood of them is what the limiter is there to absorb.
                refused = self._chunk_refusal
                if refused is None:
                    limiter = self.node.pipeline.request_limiter
                    wait = limiter.wait_when(left)
                    refused = self._chunk_refusal = limiter.rejection_in(wait)
                    refused.command = method
                    self._pause_reads(wait)  # (at the loan's reading: the chunk's)
                self._rate_refused += 1
                self._reply_error(msgid, refused)
                return True
        refused = self.node.pipeline.check_request_rate(self.peer_ip, admin=admin)
        if refused is None:
            return False
        self._fail(msgid, method, refused)
        return True

    def _settle_rate(self) -> None:
        """Give the chunk's unused request tokens back and count its requests (a
        loan's: :meth:`_settle_chunk` calls it for one)."""
        left = self._rate_left
        if left is not None:
            self._rate_left = None
            refused = self._rate_refused
            admitted = self._rate_lent - self.rate_room
            self.node.pipeline.request_limiter.settle(left - admitted, admitted, refused)
            self._rate_lent = self.rate_room = self._rate_refused = 0
            if refused and self._chunk_refusal is not None:
                self._count_error(self._chunk_refusal, refused)
        self._chunk_refusal = None

    def _backlogged(self, cmd: Command | None) -> bool:
        """Must this command wait for the connection's earlier writes? Reads and admin
        commands see them; a write needs no wait: the writer commits a connection's
        writes in order."""
        return self.pending_writes > 0 and (cmd is None or cmd.kind != "write")

    def _run_inline(self, cmd: Command | None, req: protocol.Request) -> bool:
        """Run a data command without awaiting; False when it needs :meth:`_run`.

        A read is checked, admitted, run and answered here. It is the hot path of
        a pipelined read, so it is one function: what :meth:`_prepare`,
        :meth:`_start_read_run` and :meth:`_execute` do for a read that holds
        nothing, with each step's slow case left to them. The read joins the run
        of inline reads (see :meth:`_start_read_run`): its units are added to the
        run's, which :meth:`_end_read_run` charges and counts once. A write is
        :meth:`_write_inline`'s.
        """
        if cmd is None:
            return False
        if cmd is not self._run_cmd:
            if self.node.failpoints.active:
                return False
            if cmd.kind != "read":
                return cmd.kind == "write" and self._write_inline(cmd, req)
            if self.pending_writes:
                return False  # reads see the connection's earlier writes (_backlogged)
        msgid, method, params = req
        try:
            if not cmd.inline_params.issuperset(params):
                check_params(cmd, params)
            if cmd is self._run_cmd and (
                self._run_cost < self._run_allowance
                or (self._run_allowance == ASK_ALLOWANCE and self._allowance_covers_run())
            ):
                # The run's next read: the same command, so the same bucket, user
                # and failpoints, and no write of this connection in flight
                # (anything that could change them ends the run first).
                self._run_reads += 1
                b: BucketHandle = self._run_handle  # type: ignore[assignment]  # (set with _run_cmd)
            else:
                known = self._read_handle
                if known is None or self._auth_epoch != self.node.accounts.epoch:
                    b = self._data_bucket(write=False)
                else:
                    b = known
                if not self._start_read_run(b, cmd):
                    return False
            sizes = self.read_sizes
            try:
                result = cmd.handler(self, b, params)
            except BaseException:
                self._run_errors += 1  # admitted, but not an operation served
                if self._run_watched:
                    self._read_handled(b.name, method, params, "error")
                raise
            if self._run_watched:
                self._read_handled(b.name, method, params, "ok")
            # The read's units (see Node.read_cost), inline for one record.
            if len(sizes) < 2 and self.read_keys == 1:
                ru = -(-sizes.pop() // self._run_unit) if sizes else 0
                cost = ru if ru > self._run_floor else self._run_floor
            else:
                ru, cost = self.node.read_cost(sizes, self.read_keys)
                self.read_keys = 1
                sizes.clear()
            self._run_ru += ru
            self._run_cost += cost
        except Exception as exc:
            self._read_failed(msgid, method, exc)
            return True
        self._reply(msgid, result)
        return True

    def _read_failed(self, msgid: int, method: str, exc: Exception) -> None:
        """:meth:`_inline_failed` for a read: drop what its handler metered, but not
        its keys: it still costs the floor for each (an mget refused for the size
        of its values has looked them all up)."""
        keys = self.read_keys
        self.read_sizes.clear()
        self.read_keys = 1
        self._inline_failed(msgid, method, exc, keys)

    def _inline_failed(self, msgid: int, method: str, exc: Exception, keys: int = 1) -> None:
        """Answer a request run inline that failed: refused at once (a cheap
        rejection), or its handler's error (``keys``: the floors it costs)."""
        if isinstance(exc, errors.TenantKVError):
            self._fail(msgid, method, exc, keys=keys)
        else:
            self._internal_error(msgid, method, exc)

    def _write_inline(self, cmd: Command, req: protocol.Request) -> bool:
        """Queue a write now if every gate admits it at once; False when it must wait.

        The writes of a chunk are admitted as runs, as its reads are: the first
        through every gate (:meth:`Pipeline.try_acquire`), each next write of the
        same command on the same bucket by joining the run while the room every
        gate had for it lasts (:meth:`Pipeline.join_room`: the answer each gate
        would give it on its own, since nothing that reaches a gate ran in
        between). The run's writes share one :class:`Holds`, given back once they
        are taken and answered. The chunk settling (anything that awaits, a read,
        an admin command) or a write of another command or bucket ends the run; a
        bucket re-created under the same name is another handle, so another run.
        """
        msgid, method, params = req
        run = self._wrun
        if run is not None and cmd is run.cmd and (run.room > 0 or run.may_join()):
            try:
                op = self._join_write(run, msgid, method, params)
            except NotNow:
                return False  # the throttle cannot admit it now: the waiting path
            if op is not None:
                run.add(msgid, op)
            return True
        try:
            prep = self._prepare(cmd, params)
            b, op, user = prep.bucket, prep.op, prep.user
            if self._run_cmd is not None:
                self._end_read_run()  # the throttle must see the reads before it
            if run is not None:
                run.close()  # its joins counted: the gates as the next write finds them
                self._wrun = None
            holds = self.node.pipeline.try_acquire(
                b.name,
                "write",
                unthrottled=user.unthrottled,
                nonblocking=self.nonblocking_throttle,
                cost=prep.cost,
            )
            if holds is None:
                return False
            run = self._start_write_run(b, cmd, holds, self._chunk_t0)
        except Exception as exc:
            self._inline_failed(msgid, method, exc)  # refused at once: a cheap rejection
            return True
        assert op is not None  # a write
        run.add(msgid, op)
        return True

    def _join_write(
        self, run: WriteRun, msgid: int, method: str, params: dict[str, Any]
    ) -> WriteOp | None:
        """The op of a write of the run's own command that the run has room for
        (its token taken), for the caller to add to the run: the same bucket and
        user as the run's first write (anything that could change them ends the
        run first), so only the write itself is checked and built — its
        parameters, its op — and, on a throttled bucket, admitted by the tenant
        throttle at its own cost and that cost reserved (the run's turn: nobody
        parked counts as ahead of it), as the run's first was. One that fails
        them gets its own error (None), and the run goes on; one the throttle
        cannot admit now raises :class:`NotNow` (nothing taken): it takes the
        waiting path."""
        cmd, b = run.cmd, run.bucket
        try:
            if not cmd.inline_params.issuperset(params):
                check_params(cmd, params)
            op = cmd.handler(self, b, params)
            if not run.unlimited:
                node = self.node
                cost = node.write_admission_cost(op)
                gate = node.gate
                if (
                    gate.try_acquire(
                        b.name, cost=cost, turn=True, nonblocking=self.nonblocking_throttle
                    )
                    is None
                ):
                    raise NotNow
                run.reserved += gate.reserve(b.name, cost)
        except NotNow:
            raise
        except Exception as exc:
            self._inline_failed(msgid, method, exc)
            return None
        return op

    def _start_write_run(
        self, bucket: BucketHandle, cmd: Command, holds: Holds, t0: float
    ) -> WriteRun:
        """A run of ``cmd`` writes on ``bucket`` whose first was admitted with ``holds``."""
        if self._wrun is not None:
            self._wrun.close()
        user = self.user
        unlimited = not self.node.throttle.enabled or (user is not None and user.unthrottled)
        run = self._wrun = WriteRun(self, bucket, cmd, holds, t0, unlimited=unlimited)
        return run

    def _start_read_run(self, b: BucketHandle, cmd: Command) -> bool:
        """Admit an inline read that starts a run; False when it must take the
        waiting path.

        The reads of a chunk are admitted as runs: the first through every gate
        (:meth:`Pipeline.try_pass_read`); each next read of the same command on
        the same bucket joins the run while the costs so far stay below the
        run's throttle allowance (:meth:`TenantThrottle.run_allowance`, asked by
        the second read: a run of one needs none) — the answer every gate would
        give that read on its own, since nothing else ran in between.
        :meth:`_end_read_run` then counts and charges the run once. Any other
        request, and anything that awaits, ends the run first.

        A read admitted on the waiting path (its turn in the bucket's throttle
        queue) keeps the turn for the reads after it in its chunk (``_turn``,
        until anything awaits): they start a run as if nobody were queued, while
        the bucket has allowance, instead of each queueing behind every other
        waiting connection again. The queue is served a chunk per turn instead
        of a request per turn: one wake-up for all the reads a turn admits, not
        one or two each; the allowance and the charges are the same.
        """
        if self._run_cmd is not None:
            self._end_read_run()
        node = self.node
        user = self.user
        assert user is not None  # _data_bucket checked it
        unthrottled = user.unthrottled
        bucket = b.name
        if not node.pipeline.try_pass_read(
            bucket,
            unthrottled=unthrottled,
            nonblocking=self.nonblocking_throttle,
            turn=self._turn == bucket,
        ):
            return False
        cfg = node.config
        self._run_cmd, self._run_handle, self._run_unthrottled = cmd, b, unthrottled
        self._run_allowance = ASK_ALLOWANCE  # a run of one read never needs it
        self._run_reads, self._run_errors, self._run_ru, self._run_cost = 1, 0, 0, 0
        self._run_unit, self._run_floor = cfg.read_unit_size, cfg.min_op_units
        # Nobody can subscribe while the run lasts: it never awaits. (The core's
        # list, not a property: a call less per run.)
        self._run_watched = node.pipeline.queues_enabled and bool(node.queues.queues.subscribers)
        return True

    def _allowance_covers_run(self) -> bool:
        """At the run's second read: its throttle allowance
        (:meth:`TenantThrottle.run_allowance`), asked now — the answer it had when
        the first read was admitted, since the run is charged only when it ends
        and nothing else ran — and whether the costs so far stay below it."""
        assert self._run_handle is not None
        self._run_allowance = self.node.throttle.run_allowance(
            self._run_handle.name, unthrottled=self._run_unthrottled
        )
        return self._run_cost < self._run_allowance

    def _end_read_run(self) -> None:
        """Count the run's reads through the gates, and its operations and
        latency with the chunk's; charge their units at once."""
        cmd, b = self._run_cmd, self._run_handle
        if cmd is None or b is None:
            return
        self._run_cmd = self._run_handle = None
        bucket = b.name
        node = self.node
        if self._run_reads > 1:  # the first was counted by try_pass_read
            node.pipeline.passed_reads(bucket, self._run_reads - 1)
        node.charge_reads(
            bucket,
            self._run_ru,
            self._run_cost,
            self._run_unthrottled,
            self._chunk_now or self._read_clock(),
        )
        served = self._run_reads - self._run_errors
        if served:
            key = (bucket, cmd.name)
            self._chunk_reads[key] = self._chunk_reads.get(key, 0) + served

    async def _run(self, cmd: Command | None, req: protocol.Request) -> bool:
        """Run any command after hello, waiting where it must; False when the
        connection must close (a fatal error)."""
        msgid, method, params = req
        t0 = time.perf_counter()
        held = request_bytes(params)
        if held < WAITING_COUNTED_BYTES:
            return await self._run_held(cmd, msgid, method, params, t0)
        self._hold_waiting(held)
        try:
            return await self._run_held(cmd, msgid, method, params, t0)
        finally:
            self._hold_waiting(0)

    def _hold_waiting(self, nbytes: int) -> None:
        """A large request waits (``nbytes``), or no longer does (0): the framing
        half tells the node-wide cap (see :data:`WAITING_COUNTED_BYTES`)."""
        self.waiting_bytes = nbytes
        self._held_changed()

    async def _run_held(
        self, cmd: Command | None, msgid: int, method: str, params: Any, t0: float
    ) -> bool:
        """:meth:`_run`, its request's bytes counted as held if need be."""
        if self._backlogged(cmd):
            await self._wait_writes()
        if self.node.failpoints.active and await self._failpoint(msgid, method):
            return True
        try:
            if cmd is None:
                if method == "hello":
                    raise errors.BadValue("hello was already received on this connection")
                raise errors.UnknownCommand(f"no command named {errors.shown(method)}")
            if cmd.kind in DATA_KINDS:
                prep = self._prepare(cmd, params)
                bucket = prep.bucket.name
                holds = await self._admit(prep)
                try:
                    # Again after the wait: the user, its roles or the bucket may
                    # have changed meanwhile.
                    prep = self._prepare(cmd, params)
                except BaseException:
                    self.node.pipeline.refund(bucket, holds)  # it never runs
                    holds.release(method, outcome="rejected")
                    raise
                if prep.op is None:
                    self._turn = prep.bucket.name  # (see _start_read_run)
                self._execute(msgid, prep, holds, t0)
            else:
                check_params(cmd, params)
                await self._run_other(cmd, msgid, params)
        except errors.TenantKVError as exc:
            self._fail(msgid, method, exc)
            return not exc.fatal
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        return True

    def _prepare(self, cmd: Command, params: dict[str, Any]) -> Prepared:
        """Check a data command and resolve what it acts on; raises what it breaks."""
        if not cmd.inline_params.issuperset(params):
            check_params(cmd, params)
        write = cmd.kind == "write"
        b = self._write_handle if write else self._read_handle
        if b is None or self._auth_epoch != self.node.accounts.epoch:
            b = self._data_bucket(write=write)
        user = self.user
        assert user is not None  # _data_bucket checked it
        op = None
        cost = 0
        if write:
            op = cmd.handler(self, b, params)
            cost = self.node.write_admission_cost(op)
        prep = self._prepared
        if prep is None:
            prep = self._prepared = Prepared(cmd, params, b, user, op, cost)
        else:
            prep.cmd, prep.params, prep.bucket, prep.user, prep.op = cmd, params, b, user, op
            prep.cost = cost
        return prep

    async def _admit(self, prep: Prepared) -> Holds:
        """Wait at each gate of the admission pipeline, bounded by the request's
        ``timeout_ms``. This connection reads nothing meanwhile (TCP back-pressure)."""
        deadline = None
        timeout_ms = prep.params.get("timeout_ms")  # checked by check_params
        if timeout_ms is not None:
            deadline = trio.current_time() + timeout_ms / 1000
        key = prep.params.get("key")
        return await self.node.pipeline.acquire(
            prep.bucket.name,
            prep.cmd.kind,
            unthrottled=prep.user.unthrottled,
            deadline=deadline,
            nonblocking=self.nonblocking_throttle,
            operation=prep.cmd.name,
            key_len=len(key) if isinstance(key, (bytes, str)) else 0,
            cost=prep.cost,
        )

    def _execute(self, msgid: int, prep: Prepared, holds: Holds | None, t0: float | None) -> None:
        """Run an admitted data command; owns ``holds`` from here on.

        ``holds`` is None for a read admitted by :meth:`Pipeline.try_pass_read`
        (it holds nothing). ``t0`` is when a request that waited was read; None
        for an inline one, which is counted and timed with its chunk (one clock
        read per chunk).
        """
        cmd, b = prep.cmd, prep.bucket
        method = cmd.name
        node = self.node
        h = holds
        keys = 1  # (the floors a read that fails costs: _read_failed)
        try:
            if prep.op is None:  # a read that waited (an inline one is _read_inline's)
                assert holds is not None and t0 is not None
                try:
                    result = cmd.handler(self, b, prep.params)
                    holds.release(method)
                    h = None
                    node.charge_read(b.name, self.read_sizes, prep.user.unthrottled, self.read_keys)
                finally:
                    keys = self.read_keys
                    self.read_sizes.clear()
                    self.read_keys = 1
                self._reply(msgid, result)
                node.bucket_stats[b.name].ops[method] += 1
                node.latency.observe(b.name, method, time.perf_counter() - t0)
            else:
                assert holds is not None and t0 is not None  # a write that waited
                h = None  # its run gives them back once the write is durable
                self._start_write_run(b, cmd, holds, t0).add(msgid, prep.op)
        except errors.TenantKVError as exc:
            self._fail(msgid, method, exc, keys=keys)
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        finally:
            if h is not None:
                h.release(method, outcome="error")

    def _read_handled(self, bucket: str, method: str, params: dict[str, Any], outcome: str) -> None:
        """Tell bucket-queue watchers how an inline read (it held no slot) ended."""
        key = params.get("key")
        self.node.queues.handled(
            bucket,
            "read",
            operation=method,
            key_len=len(key) if isinstance(key, (bytes, str)) else 0,
            outcome=outcome,
        )

    def _fail(
        self,
        msgid: int,
        method: str,
        exc: errors.TenantKVError,
        *,
        charge: bool = True,
        keys: int = 1,
    ) -> None:
        """Answer a request with its error. One refused for what it asked (no
        overload labels) costs its bucket a read's floor (per key it named),
        unless it was charged already (``charge``): see :meth:`_charge_floor`."""
        if charge and not exc.labels:
            self._charge_floor(keys)
        elif exc.retry_after_ms is not None:
            self._pause_reads(exc.retry_after_ms / 1000)
        exc.command = method
        self._count_error(exc)
        self._reply_error(msgid, exc)

    def _pause_reads(self, wait: float) -> None:
        """A refusal that tells the client to come back in ``wait`` seconds (its
        retryAfterMs) and costs no units: read the connection again then, at most
        :data:`REFUSAL_PAUSE_MAX_SECS` later, if that is
        :data:`REFUSAL_PAUSE_MIN_SECS` or more — so a client that keeps sending
        anyway is answered a receive at a time, not as fast as it sends. A large
        request (``waiting_bytes``) pauses it up to
        :data:`LARGE_REFUSAL_PAUSE_MAX_SECS`."""
        if wait >= REFUSAL_PAUSE_MIN_SECS:
            now = self._chunk_now or self._read_clock()
            longest = (
                LARGE_REFUSAL_PAUSE_MAX_SECS
                if self.waiting_bytes or wait >= LONG_WAIT_SECS
                else REFUSAL_PAUSE_MAX_SECS
            )
            until = now + min(wait, longest)
            if until > self.reads_paused_until:
                self.reads_paused_until = until
                self.node.refusal_pauses += 1

    def _floor_tenant(self) -> tuple[str, bool] | None:
        """The bucket a request that is no data operation is charged to, and
        whether its user is unthrottled; None for an admin or a connection with no
        bucket: no tenant to charge."""
        user, bucket = self.user, self.bucket
        if user is None or user.admin or bucket is None or bucket not in self.node.throttle:
            return None
        return bucket, user.unthrottled

    def _charge_floor(self, keys: int = 1) -> None:
        """A request after hello that is no data operation — a session command,
        or one refused for what it asked (unknown, malformed, not allowed) —
        costs the connection's bucket a read's floor (``min_op_units``), metered
        as a read of nothing: otherwise such requests would be free, past every
        limit. Charged after the fact, the floor is debt the bucket's next
        requests wait for; :meth:`_admit_floor` also holds one to the allowance."""
        tenant = self._floor_tenant()
        if tenant is not None:
            self.node.charge_read(tenant[0], [], tenant[1], keys)

    async def _admit_floor(self) -> None:
        """:meth:`_charge_floor`, admitted by the tenant throttle first as a read is
        (it waits, or raises Throttled on a non-blocking connection or past
        ``throttle_max_wait_ms``): for a command that does work on request (PING,
        ECHO, INFO, ...), so a flood of them is held to the bucket's limits."""
        tenant = self._floor_tenant()
        if tenant is not None:
            bucket, unthrottled = tenant
            await self.node.gate.acquire(
                bucket, unthrottled=unthrottled, nonblocking=self.nonblocking_throttle
            )
            self.node.charge_read(bucket, [], unthrottled)

    def read_txn(self) -> Any:
        """The read transaction of the chunk being handled (opened on first use)."""
        txn = self.rtxn
        if txn is None:
            txn = self.rtxn = self.node.engine.begin_read()
        return txn

    def _read_clock(self) -> float:
        """The throttle clock's reading for the rest of the chunk, once the one taken
        when it was received went stale (:meth:`_settle_chunk`)."""
        now = self._chunk_now = self.node.throttle.clock()
        return now

    def _settle_chunk(self) -> None:
        """Settle what the chunk decided at once, before anything awaits (time will
        pass, other tasks run): charge and count the run of inline reads, give the
        request-rate loan back, close the read transaction, record the reads'
        counts and latency; end the run of writes. The chunk's clock reading is
        stale after that: what the chunk does after the wait reads it again
        (:meth:`_read_clock`)."""
        if self._wrun is not None:
            self._wrun.close()
            self._wrun = None
        self._turn = None
        if self._run_cmd is not None:
            self._end_read_run()
        left = self._rate_left
        if left is not None:
            if left == FIRST_TOKEN_TAKEN:  # (no loan to settle: a call less a chunk)
                self._rate_left = None
            else:
                self._settle_rate()
        if self.rtxn is not None:
            self.node.engine.end_read(self.rtxn)
            self.rtxn = None
        if self._chunk_reads:
            node = self.node
            seconds = time.perf_counter() - self._chunk_t0
            for (bucket, method), n in self._chunk_reads.items():
                stats = node.bucket_stats.get(bucket)
                if stats is not None:  # not deleted meanwhile
                    stats.ops[method] += n
                    node.latency.observe_many(bucket, method, seconds, n)
            self._chunk_reads = {}
        self._chunk_now = 0.0

    async def _park_reader(self) -> None:
        """Wait until a write of this connection completes."""
        self._reader_parked = True
        try:
            await self._drain_lot.park()
        finally:
            self._reader_parked = False

    def _wake_reader(self) -> None:
        if self._reader_parked:
            self._reader_parked = False
            self._drain_lot.unpark_all()

    async def _wait_writes(self) -> None:
        while self.pending_writes:
            await self._park_reader()

    async def _failpoint(self, msgid: int, method: str) -> bool:
        """Apply a test failpoint; True when it answered the request (with an error)."""
        fp = self.node.failpoints.take(method)
        if fp is None:
            return False
        if fp.block_secs:
            await trio.sleep(fp.block_secs)
        exc = fp.error()
        if exc is None:
            return False
        exc.command = method
        self._reply_error(msgid, exc)
        return True

    def _internal_error(self, msgid: int, method: str, exc: Exception) -> None:
        if isinstance(exc, RecursionError):
            # A parameter nested ~1000 deep (MessagePack decodes up to ~1040) broke
            # a repr in a handler's error message: the client's fault, not ours.
            bad = errors.BadValue("a parameter is nested too deeply")
            bad.command = method
            self._count_error(bad)
            self._reply_error(msgid, bad)
            return
        self._log_internal_error(method, exc)
        self._charge_floor()  # (not free, even when it is our fault)
        self._reply_error(msgid, errors.InternalError(f"internal error: {exc!r:.200}"))

    def _log_internal_error(self, method: str, exc: Exception) -> None:
        """Log a command's unexpected failure (a bug, never a client's error: those
        are answered, not logged) at most once per connection per
        :data:`ERROR_LOG_INTERVAL_SECS`, with the count of those not logged since:
        a client that found one cannot fill the log by repeating it."""
        now = trio.current_time()
        if now < self._error_logged_at + ERROR_LOG_INTERVAL_SECS:
            self._errors_not_logged += 1
            return
        suppressed, self._errors_not_logged = self._errors_not_logged, 0
        self._error_logged_at = now
        log.error(
            "command %r failed on connection %d (%d more such failures not logged before it)",
            method,
            self.conn_id,
            suppressed,
            exc_info=exc,
        )

    async def _run_other(self, cmd: Command, msgid: int, params: dict[str, Any]) -> None:
        if cmd.kind == "admin":
            if not self.current_user().admin:
                raise errors.Unauthorized(f"{cmd.name} needs an admin user")
            self._reply(msgid, await cmd.handler(self, params))
            return
        # A session command: a request like any other, at a read's floor. Choosing
        # a bucket is part of setting the connection up: charged, never held.
        if cmd.name == "select_bucket":
            self._charge_floor()
        else:
            await self._admit_floor()
        try:
            result = await cmd.handler(self, params)
        except errors.TenantKVError as exc:
            self._fail(msgid, cmd.name, exc, charge=False)
            return
        self._reply(msgid, result)

    def _count_error(self, exc: errors.TenantKVError, n: int = 1) -> None:
        if self.bucket is not None and (stats := self.node.bucket_stats.get(self.bucket)):
            stats.errors[exc.code_name] += n

    def current_user(self) -> auth.User:
        """This connection's user as the registry has it now. Checked before every
        command runs, after any wait: the requests of a user deleted meanwhile —
        or deleted and created again, another user under the same name — fail
        (and the connection closes), changed roles and privileges apply at once."""
        user = self.user
        assert user is not None
        node = self.node
        if self._auth_epoch != node.accounts.epoch:
            fresh = node.accounts.users.get(user.name)
            if fresh is None or fresh.uid != user.uid:
                self.begin_shutdown()
                raise errors.Unauthorized(f"user {user.name!r} was deleted")
            self.user = user = fresh
            self._auth_epoch = node.accounts.epoch
        return user

    def _data_bucket(self, *, write: bool) -> BucketHandle:
        """The selected bucket, if the user may read it (or write it).

        The answer is kept until the registry changes: a user, a role or a bucket
        changing bumps ``node.accounts.epoch`` (a bucket drop included), so while
        the epoch holds, the last answer for this access holds too.
        """
        node = self.node
        if self._auth_epoch == node.accounts.epoch:
            known = self._write_handle if write else self._read_handle
            if known is not None:
                return known
        else:
            self._read_handle = self._write_handle = None
        name = self.bucket
        if name is None:
            raise errors.NoBucketSelected("select a bucket in hello or with select_bucket")
        b = node.engine.bucket(name)
        user = self.current_user()
        if not (user.can_write(name) if write else user.can_read(name)):
            need = "readwrite" if write else "read"
            raise errors.Unauthorized(f"user {user.name!r} lacks the {need} role on {name!r}")
        if write:
            self._write_handle = b
        else:
            self._read_handle = b
        return b
