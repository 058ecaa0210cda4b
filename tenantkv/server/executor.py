"""The chunk executor: running one connection's requests, for either door.

A door (``server/doors/``) decodes a received chunk into requests
``(msgid, method, params)`` and encodes replies; the connection
(``server/connection.py``) receives, sends and waits; this runs the requests
of each chunk (:meth:`Executor.handle_chunk`) without I/O of its own. Every
data command takes one path:

1. :meth:`Executor._prepare` — parameters checked, bucket and role resolved
   for the user as the registry has it now, a write built and its cost checked;
2. admission by the pipeline (:mod:`tenantkv.admission.pipeline`) —
   inline, or :meth:`Pipeline.acquire` when a gate makes it wait;
3. execution — a read runs inline on the chunk's read transaction and is
   answered; a write joins a run of writes
   (:class:`~tenantkv.server.write_run.WriteRun`), is queued on the
   group-commit writer and answered once durable.

The path is applied per chunk: the request-rate tokens are lent to the chunk
(:class:`~tenantkv.server.rate_loan.RateLoan`), consecutive reads of one
command are admitted and charged as a :class:`~tenantkv.server.read_run.ReadRun`
and consecutive writes as a :class:`WriteRun`, each joined in one loop
(:meth:`_read_run_loop`, :meth:`_join_write_run`), with the outcome for each
request a per-request path would give.

A request runs inline unless the connection has writes in flight and it is
not a write — the one backlog rule, so a connection reads its own writes
(:meth:`Executor._backlogged`) — a failpoint is armed, or a gate cannot
admit at once: then it takes the waiting path (:meth:`Executor._run`).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.server import auth, transaction
from tenantkv.server.commands import Command, check_params
from tenantkv.server.held import Held
from tenantkv.server.log_setup import SparseLog
from tenantkv.server.node import Node
from tenantkv.server.rate_loan import RateLoan
from tenantkv.server.read_run import ASK_ALLOWANCE, ReadRun
from tenantkv.server.write_run import WriteRun
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.session")
#: What a client can make us log at will (protocol errors, failed logins),
#: sparse node-wide.
closing_log = SparseLog(log)

#: a decoded request: (msgid, method, params); a door's own requests carry what
#: the door needs in place of params
Request = tuple[int, str, Any]
Numbered = Iterator[tuple[int, Request]]

#: Requests handled back to back before the connection lets other tasks run.
FAIR_SHARE_REQUESTS = 256
#: Unsent reply bytes above which the connection sends before going on.
OUT_HIGH_WATER = 4 * 1024 * 1024
#: Bytes of unanswered writes (queued values) above which the connection waits
#: for them: with 20 MiB values the in-flight count alone would let one
#: connection queue 20 GiB.
PENDING_WRITE_HIGH_WATER = 64 * 1024 * 1024
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
#: seconds (see Executor._log_internal_error).
ERROR_LOG_INTERVAL_SECS = 1.0
#: Command kinds that go through the admission pipeline.
DATA_KINDS = frozenset({"read", "write"})
#: A request that waits with at least this many bytes of arguments counts them
#: against the node-wide cap on what clients make the server hold while it waits
#: (``max_receive_buffer_bytes``): decoded, they are no longer received bytes, and
#: a tenant held at its limit would otherwise keep a 20 MiB value per connection
#: waiting uncounted. Smaller ones are not counted (two updates of the cap each).
WAITING_COUNTED_BYTES = 64 * 1024


def request_bytes(params: Any) -> int:
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


class Door(Protocol):
    """What the executor needs of a door: its command table, and replies in its
    protocol appended to ``out`` (``server/doors/``)."""

    protocol_name: str

    @property
    def commands(self) -> Mapping[str, Command]:
        """Method -> command; a command of kind "door" is the door's own
        (:meth:`run_local`)."""
        ...

    #: the methods an admin's request passes the rate limiter with
    admin_methods: frozenset[str]
    out: bytearray
    #: the error message of a data command on a connection with no bucket
    no_bucket_message: str

    def reply(self, cmd: Command, msgid: int, result: Any) -> None: ...

    def reply_all(self, cmd: Command, msgids: list[int], results: Sequence[Any]) -> None:
        """Answer each of ``msgids`` with its result (a run of reads or of writes)."""
        ...

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None: ...

    def refusal_writer(self, exc: errors.TenantKVError) -> Callable[[int], None]:
        """Answer request after request with the same refusal (a flood past the
        request rate)."""
        ...

    async def before_auth(self, ex: Executor, req: Request) -> bool:
        """A request before the connection authenticated; False: close it."""
        ...

    async def run_local(self, ex: Executor, cmd: Command, req: Request) -> bool:
        """One of the door's own commands (kind "door"); False: close the connection."""
        ...


class Flow(Protocol):
    """What the executor needs of its connection's I/O (``server/connection.py``)."""

    #: False once the connection takes no new requests
    reading: bool

    def begin_shutdown(self) -> None: ...

    def held_changed(self) -> None: ...

    def chunk_settled(self) -> None: ...

    def logged_in(self) -> None:
        """Authenticated: requests up to the full frame bound from now on."""
        ...

    async def send(self) -> None: ...


class _Closed:
    """The flow of a closed connection: a write answered after it closed tells
    no one. The executor and its connection refer to each other; this breaks
    the cycle when the connection closes, so what they hold (a decoder's
    buffers, a large request) is freed at once, not by the garbage collector."""

    reading = False

    def begin_shutdown(self) -> None:
        pass

    def held_changed(self) -> None:
        pass

    def chunk_settled(self) -> None:
        pass

    def logged_in(self) -> None:
        pass

    async def send(self) -> None:
        pass


CLOSED: Flow = _Closed()


@dataclass(slots=True)
class Prepared:
    """A data command ready to admit: its bucket, its user, and (a write) its op.

    One per connection, refilled by each :meth:`Executor._prepare`: a command is
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


class Executor:
    """Runs one connection's requests; what command handlers see of it
    (:class:`tenantkv.server.commands.Session`)."""

    def __init__(self, node: Node, door: Door, flow: Flow, conn_id: int, peer: str) -> None:
        self.node = node
        self.door = door
        self.flow = flow
        self.conn_id = conn_id
        self.peer = peer
        self.peer_ip = peer.rsplit(":", 1)[0]
        # -- who is connected (set by authenticate) ---------------------------
        self.user: auth.User | None = None
        self.bucket: str | None = None
        self.backpressure = False
        self.nonblocking_throttle = False
        self.client_info: dict[str, Any] = {}
        #: node.accounts.epoch when ``user`` was last looked up (see current_user)
        self._auth_epoch = node.accounts.epoch
        #: the selected bucket as last authorized for reads / writes (see _data_bucket)
        self._read_handle: BucketHandle | None = None
        self._write_handle: BucketHandle | None = None
        #: bucket-queue event subscription of a watch_events connection
        self._watch_rx: trio.MemoryReceiveChannel[Any] | None = None
        # -- what a read handler reports ---------------------------------------
        #: per-record byte counts a read handler read (for metering), and how many
        #: keys it looked up (a multi-key read sets it: the cost floor is per key)
        self.read_sizes: list[int] = []
        self.read_keys = 1
        #: the read transaction shared by the reads of the chunk being handled
        self.rtxn: Any = None
        # -- writes in flight ----------------------------------------------------
        self.max_inflight = node.config.max_inflight_per_connection
        self.pending_writes = 0
        #: bytes of those writes (their values and keys), for back-pressure
        self.pending_write_bytes = 0
        #: bytes of the decoded request waiting (at a gate, or for this connection's
        #: writes), when it has WAITING_COUNTED_BYTES or more: held all the same
        self.waiting_bytes = 0
        # A plain flag says whether the task is parked waiting for writes: checking
        # a bool per write callback is much cheaper than asking the ParkingLot.
        self._drain_lot = trio.lowlevel.ParkingLot()
        self.reader_parked = False
        # -- the chunk being handled ---------------------------------------------
        #: when it was received (perf_counter), and its inline reads per (bucket,
        #: operation): counted and timed once per chunk
        self.chunk_t0 = 0.0
        self._chunk_reads: dict[tuple[str, str], int] = {}
        #: the throttle clock's reading for it (one per chunk; 0.0: none since the
        #: chunk last waited, see _read_clock)
        self.chunk_now = 0.0
        self.loan = RateLoan(node.pipeline, self.peer_ip)
        #: the runs of reads and of writes being admitted (None: none)
        self.read_run: ReadRun | None = None
        self.write_run: WriteRun | None = None
        #: the bucket of a read of this chunk admitted on the waiting path, after
        #: its turn in the throttle queue (None: none): until anything awaits, the
        #: chunk's next reads on it start runs without queueing behind the others
        #: again (see _start_read_run)
        self._turn: str | None = None
        #: when the connection may be read again after a refusal (trio time; 0.0:
        #: at once), see _pause_reads
        self.reads_paused_until = 0.0
        self._prepared: Prepared | None = None
        #: MULTI ... EXEC and WATCH (server/transaction.py; None: never used), and
        #: whether MULTI is on: then each request goes to transaction.queue_command
        self.txn: transaction.Transaction | None = None
        self.in_multi = False
        #: when this connection last logged an unexpected failure (trio time), and
        #: how many it did not log since (_log_internal_error)
        self._error_logged_at = -math.inf
        self._errors_not_logged = 0

    # -- the chunk --------------------------------------------------------------

    async def handle_chunk(self, requests: Iterator[Request]) -> bool:
        """Handle every complete request received; False when the connection must close.

        The chunk's inline reads share one read transaction (closed before
        anything here awaits: it holds the engine's lock) and are counted and
        timed once, when the chunk is done or the task yields.
        """
        node = self.node
        pipeline = node.pipeline
        commands = self.door.commands
        loan = self.loan
        if node.cluster is not None:  # cluster mode: refuse the keys of other nodes' slots
            requests = node.cluster.route(self, requests)
        numbered = enumerate(requests, 1)
        try:
            for handled, req in numbered:
                while True:  # (again for a request a loop of its own handed back)
                    if not self.flow.reading:
                        if not node.shutting_down:
                            return False  # its user was deleted: nothing more of theirs runs
                        self.refuse_shutting_down(req)
                    elif self.user is None:
                        self._settle_chunk()
                        if not await self.door.before_auth(self, req):
                            return False
                    else:
                        if type(req) is Held:  # (cluster: its slot is moving away)
                            self._settle_chunk()
                            req = await req.settle(self)
                            if req is None:
                                break  # answered meanwhile
                            continue  # the checks above again: a user deleted, a shutdown
                        cmd = commands.get(req[1])
                        # Only an admin's admin commands are exempt: a command's name
                        # exempts no one (the role check comes after the limiter).
                        exempt = cmd is not None and (
                            (cmd.kind == "admin" and self.user.admin)
                            or (cmd.kind == "internal" and self.user.node)
                        )
                        if loan.room and not exempt:
                            loan.room -= 1  # a token of the chunk's loan (_refused_by_rate)
                        elif pipeline.request_rate_enabled and self._refused_by_rate(
                            req[0], req[1], admin=exempt
                        ):
                            if self.in_multi:
                                self.transaction_refused(req[1])  # (it was not queued)
                            if loan.refusal is not None:
                                # The limiter refused the chunk: the rest of it likewise.
                                handled, nxt = self._refuse_rest(numbered, handled)
                                if nxt is not None:  # an admin command, or one ending MULTI
                                    req = nxt
                                    continue
                            break
                        if self.in_multi and transaction.queue_command(
                            self, cmd, req, request_bytes(req[2])
                        ):
                            break
                        inline = self._run_inline(cmd, req, numbered, handled)
                        if inline is None:
                            self._settle_chunk()
                            if not await self._run(cmd, req):
                                return False
                        else:
                            handled, nxt = inline  # (where a run of it stopped)
                            if nxt is not None:
                                req = nxt
                                continue
                    break
                if self._should_pause(handled):
                    await self._pause()
        finally:
            self._settle_chunk()
        return True

    def _run_inline(
        self, cmd: Command | None, req: Request, numbered: Numbered, handled: int
    ) -> tuple[int, Request | None] | None:
        """Run a data command without awaiting: None when it needs :meth:`_run`,
        else the count of requests handled — the run it began or joined may
        have taken more of the chunk — and the next request, if one did not
        join (None: none)."""
        if cmd is None:
            return None
        run = self.read_run
        if run is None or cmd is not run.cmd:
            if self.node.failpoints.active:
                return None
            if cmd.kind != "read":
                if cmd.kind != "write" or not self._write_inline(cmd, req):
                    return None
                wrun = self.write_run
                if wrun is not None and wrun.joined and cmd is wrun.cmd:
                    # A write joined a run: the next ones join it here.
                    return self._join_write_run(numbered, handled)
                return handled, None
            if self.pending_writes:
                return None  # reads see the connection's earlier writes (_backlogged)
        try:
            if not self._read_joins(cmd, req[2]):
                return None
        except Exception as exc:
            self._read_failed(req[0], req[1], exc)  # refused at once: a cheap rejection
            return handled, None
        return self._read_run_loop(numbered, handled, req)

    def _should_pause(self, handled: int) -> bool:
        """After the ``handled``-th request of a chunk: is too much unsent or
        unanswered, or is it time to let other connections run?"""
        return (
            self.pending_writes >= self.max_inflight
            or len(self.door.out) > OUT_HIGH_WATER
            or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
            or handled % FAIR_SHARE_REQUESTS == 0
        )

    async def _pause(self) -> None:
        """Send what is ready, wait for this connection's writes while too many are
        unanswered, and yield: a long pipelined chunk cannot hold the loop."""
        self._settle_chunk()
        await self.wait_drained()
        await trio.lowlevel.checkpoint()

    async def wait_drained(self) -> None:
        """Too much unsent or unanswered: send what is ready, wait for the writes."""
        if len(self.door.out) > OUT_HIGH_WATER:
            await self.flow.send()
        while (
            self.pending_writes >= self.max_inflight
            or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
        ):
            await self._park_reader()

    def _settle_chunk(self) -> None:
        """Settle what the chunk decided at once, before anything awaits (time will
        pass, other tasks run): end the runs of reads and writes, give the
        request-rate loan back, close the read transaction, record the reads'
        counts and latency, and tell the connection (what it holds). The chunk's
        clock reading is stale after that: what the chunk does after the wait
        reads it again (:meth:`_read_clock`)."""
        if self.write_run is not None:
            self.write_run.close()
            self.write_run = None
        self._turn = None
        if self.read_run is not None:
            self._end_read_run()
        loan = self.loan
        if loan.left is not None:
            refused = loan.settle()
            if refused and loan.refusal is not None:
                self.count_error(loan.refusal, refused)
        loan.refusal = None
        if self.rtxn is not None:
            self.node.engine.end_read(self.rtxn)
            self.rtxn = None
        if self._chunk_reads:
            node = self.node
            seconds = time.perf_counter() - self.chunk_t0
            for (bucket, method), n in self._chunk_reads.items():
                stats = node.bucket_stats.get(bucket)
                if stats is not None:  # not deleted meanwhile
                    stats.ops[method] += n
                    node.latency.observe_many(bucket, method, seconds, n)
            self._chunk_reads = {}
        self.chunk_now = 0.0
        self.flow.chunk_settled()

    # -- the request rate limiter ----------------------------------------------

    def _refused_by_rate(self, msgid: int, method: str, *, admin: bool) -> bool:
        """The ingress request rate limiter, first on every request after
        authentication (call it when ``pipeline.request_rate_enabled``): True when
        it refused the request, answered with 462.

        Decided per chunk, at the chunk's instant, by its :class:`RateLoan`. An
        admin's admin commands (``admin``) and exempt addresses pass, counted, as
        :meth:`Pipeline.check_request_rate` says. A refusal also pauses reading
        the connection (:meth:`_pause_reads`), so a client that keeps sending is
        answered in batches, one wake-up per pause."""
        if not admin:
            loan = self.loan
            took = loan.try_take(self._now)
            if took:
                return False
            if took is False:
                # The chunk's one refusal, answered from its template and counted
                # as the bucket's errors when the chunk settles: cheap, since a
                # flood of them is what the limiter is there to absorb.
                refused = loan.refusal
                if refused is None:
                    wait = loan.refusal_wait()
                    refused = self.node.pipeline.request_limiter.rejection_in(wait)
                    loan.refusal = refused
                    refused.command = method
                    self._pause_reads(wait)  # (at the loan's reading: the chunk's)
                loan.refused += 1
                self.door.reply_error(msgid, refused)
                return True
        refused = self.node.pipeline.check_request_rate(self.peer_ip, admin=admin)
        if refused is None:
            return False
        self.fail(msgid, method, refused)
        return True

    def _refuse_rest(self, numbered: Numbered, handled: int) -> tuple[int, Request | None]:
        """After the loan refused the ``handled``-th request of the chunk for want
        of a token: refuse the next ones as it would — at the chunk's instant none
        is left — without asking it, each with the chunk's 462 from its template,
        until one is an admin's admin command (returned: those pass) or it is time
        to pause (:meth:`_should_pause`). Returns the count handled so far and that
        command, or None.

        A flood past the rate is what the limiter absorbs, so its cost per request
        is kept to decoding it and copying the answer: no dispatch."""
        if self._should_pause(handled):
            return handled, None
        out = self.door.out
        refusal = self.loan.refusal
        assert refusal is not None and self.user is not None
        refuse = self.door.refusal_writer(refusal)
        first = handled
        stop: Request | None = None
        exempt = self.door.admin_methods if self.user.admin else frozenset()
        if self.in_multi:
            exempt |= transaction.ENDS  # (refused one by one: it ends the transaction)
        for handled, req in numbered:
            if req[1] in exempt:
                stop = req
                break
            refuse(req[0])
            if not handled % FAIR_SHARE_REQUESTS or len(out) > OUT_HIGH_WATER:
                break
        self.loan.refused += handled - first - (stop is not None)
        return handled, stop

    def _now(self) -> float:
        """The chunk's reading of the throttle clock."""
        return self.chunk_now or self._read_clock()

    def _read_clock(self) -> float:
        """The throttle clock's reading for the rest of the chunk, once the one taken
        when it was received went stale (:meth:`_settle_chunk`)."""
        now = self.chunk_now = self.node.throttle.clock()
        return now

    def _pause_reads(self, wait: float) -> None:
        """A refusal that tells the client to come back in ``wait`` seconds (its
        retryAfterMs) and costs no units: read the connection again then, at most
        :data:`REFUSAL_PAUSE_MAX_SECS` later, if that is
        :data:`REFUSAL_PAUSE_MIN_SECS` or more — so a client that keeps sending
        anyway is answered a receive at a time, not as fast as it sends. A large
        request (``waiting_bytes``), or a wait of :data:`LONG_WAIT_SECS` or more,
        pauses it up to :data:`LARGE_REFUSAL_PAUSE_MAX_SECS`."""
        if wait >= REFUSAL_PAUSE_MIN_SECS:
            longest = (
                LARGE_REFUSAL_PAUSE_MAX_SECS
                if self.waiting_bytes or wait >= LONG_WAIT_SECS
                else REFUSAL_PAUSE_MAX_SECS
            )
            until = self._now() + min(wait, longest)
            if until > self.reads_paused_until:
                self.reads_paused_until = until
                self.node.refusal_pauses += 1

    # -- reads ---------------------------------------------------------------------

    def _read_joins(self, cmd: Command, params: dict[str, Any]) -> bool:
        """May this read run inline, in the run of reads (joining it, or beginning
        another)? False when it must take the waiting path; raises what it breaks
        (parameters, the bucket or the role)."""
        if not cmd.inline_params.issuperset(params):
            check_params(cmd, params)
        run = self.read_run
        if run is not None and cmd is run.cmd and run.covers(self.node):
            # The run's next read: the same command, so the same bucket, user
            # and failpoints, and no write of this connection in flight
            # (anything that could change them ends the run first).
            return True
        known = self._read_handle
        if known is None or self._auth_epoch != self.node.accounts.epoch:
            known = self._data_bucket(write=False)
        return self._start_read_run(known, cmd)

    def _read_run_loop(
        self, numbered: Numbered, handled: int, req: Request
    ) -> tuple[int, Request | None]:
        """Run the ``handled``-th request of the chunk, a read admitted into the run
        of reads (:meth:`_read_joins`), and the next ones while they join it (the
        same command, so the same bucket, user and failpoints; its parameters
        known, a token of the rate loan, the allowance not reached) in one loop,
        the run's figures in locals: where a pipelined read spends its time, on
        either door. Returns the count handled and the request that did not join
        (for the general path), or None when it is time to pause."""
        run = self.read_run
        assert run is not None
        node, loan = self.node, self.loan
        cmd, b = run.cmd, run.handle
        name, joins, handler = cmd.name, cmd.inline_params.issuperset, cmd.handler
        rate_room, rate_enabled = loan.room, node.pipeline.request_rate_enabled
        unit, floor, allowance = run.unit, run.floor, run.allowance
        cost, watched, sizes, out = run.cost, run.watched, self.read_sizes, self.door.out
        # The reads served, answered together (no call per read); until then the
        # bytes they read stand for their replies against OUT_HIGH_WATER.
        msgids: list[int] = []
        results: list[Any] = []
        served, answer = msgids.append, results.append
        first, admitted = handled, ((handled, req),)
        reads = ru_sum = unsent = 0
        try:
            for handled, req in itertools.chain(admitted, numbered):
                msgid, method, params = req
                if handled != first:  # (the first was admitted by the caller)
                    if method != name or not joins(params):
                        return handled, req
                    if cost >= allowance:
                        if allowance == ASK_ALLOWANCE:  # the run's second read asks
                            run.cost = cost
                            run.covers(node)
                            allowance = run.allowance
                        if cost >= allowance:
                            return handled, req  # (it ends the run and begins another)
                    if rate_room:  # (last: a request handed back has taken no token)
                        rate_room -= 1
                    elif rate_enabled:
                        return handled, req  # (the loan is settled or refused there)
                reads += 1
                try:
                    result = handler(self, b, params)
                except Exception as exc:
                    run.errors += 1  # admitted, but not an operation served
                    self._answer_reads(cmd, msgids, results)  # (in order: RESP's, ours)
                    unsent = 0
                    if watched:
                        self._read_handled(b.name, method, params, "error")
                    self._read_failed(msgid, method, exc)
                else:
                    if watched:
                        self._read_handled(b.name, method, params, "ok")
                    # The read's units (see Node.read_cost), without a call for one record.
                    if len(sizes) < 2 and self.read_keys == 1:
                        n = sizes.pop() if sizes else 0
                        ru = -(-n // unit)
                        c = ru if ru > floor else floor
                    else:
                        n = sum(sizes)
                        ru, c = node.read_cost(sizes, self.read_keys)
                        self.read_keys = 1
                        sizes.clear()
                    ru_sum += ru
                    cost += c
                    unsent += n
                    served(msgid)
                    answer(result)
                if not handled % FAIR_SHARE_REQUESTS or len(out) + unsent > OUT_HIGH_WATER:
                    break
        finally:
            run.reads += reads
            run.ru += ru_sum
            run.cost = cost
            loan.room = rate_room
            self._answer_reads(cmd, msgids, results)
        return handled, None

    def _answer_reads(self, cmd: Command, msgids: list[int], results: list[Any]) -> None:
        """Answer the reads a run loop served so far (and forget them)."""
        if msgids:
            self.door.reply_all(cmd, msgids, results)
            msgids.clear()
            results.clear()

    def _start_read_run(self, b: BucketHandle, cmd: Command) -> bool:
        """Admit an inline read that starts a run (:class:`ReadRun`); False when it
        must take the waiting path. Any other request, and anything that awaits,
        ends the run first.

        A read admitted on the waiting path (its turn in the bucket's throttle
        queue) keeps the turn for the reads after it in its chunk (``_turn``,
        until anything awaits): they start a run as if nobody were queued, while
        the bucket has allowance, instead of each queueing behind every other
        waiting connection again. The queue is served a chunk per turn instead
        of a request per turn: one wake-up for all the reads a turn admits, not
        one or two each; the allowance and the charges are the same.
        """
        if self.read_run is not None:
            self._end_read_run()
        node = self.node
        user = self.user
        assert user is not None  # _data_bucket checked it
        unthrottled = user.unthrottled
        if not node.pipeline.try_pass_read(
            b.name,
            unthrottled=unthrottled,
            nonblocking=self.nonblocking_throttle,
            turn=self._turn == b.name,
        ):
            return False
        self.read_run = ReadRun(cmd, b, node, unthrottled)
        return True

    def _end_read_run(self) -> None:
        """Count and charge the run of reads (:meth:`ReadRun.end`)."""
        run = self.read_run
        if run is not None:
            self.read_run = None
            run.end(self.node, self._now(), self._chunk_reads)

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
            self.fail(msgid, method, exc, keys=keys)
        else:
            self._internal_error(msgid, method, exc)

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

    def read_txn(self) -> Any:
        """The read transaction of the chunk being handled (opened on first use)."""
        txn = self.rtxn
        if txn is None:
            txn = self.rtxn = self.node.engine.begin_read()
        return txn

    # -- writes --------------------------------------------------------------------

    def _write_inline(self, cmd: Command, req: Request) -> bool:
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
        run = self.write_run
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
            if self.read_run is not None:
                self._end_read_run()  # the throttle must see the reads before it
            if run is not None:
                run.close()  # its joins counted: the gates as the next write finds them
                self.write_run = None
            holds = self.node.pipeline.try_acquire(
                b.name,
                "write",
                unthrottled=user.unthrottled,
                nonblocking=self.nonblocking_throttle,
                cost=prep.cost,
            )
            if holds is None:
                return False
            run = self._start_write_run(b, cmd, holds, self.chunk_t0)
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

    def _join_write_run(self, numbered: Numbered, handled: int) -> tuple[int, Request | None]:
        """After the ``handled``-th request of the chunk joined a run of writes:
        add the next ones while they are writes of the run's command with room
        at the gates and a token of the chunk's rate loan, each checked and built
        by :meth:`_join_write` — in one loop, with no dispatch per write.

        Stops before a request that does not join (returned, for the general
        path: another command, no room, no token) or when it is time to pause
        (:meth:`_should_pause`: its writes count). Returns the count handled and
        that request, or None."""
        if self._should_pause(handled):
            return handled, None
        run = self.write_run
        assert run is not None
        name, join = run.cmd.name, self._join_write
        loan = self.loan
        rate_room, rate_enabled = loan.room, self.node.pipeline.request_rate_enabled
        out = self.door.out
        # The joined writes, added to the run together when the loop stops
        # (WriteRun.add_many); until then the pause checks count them here.
        msgids: list[int] = []
        ops: list[WriteOp] = []
        size = 0
        room = run.room  # (-1: the gates not asked yet)
        writes = self.max_inflight - self.pending_writes
        write_bytes = PENDING_WRITE_HIGH_WATER - self.pending_write_bytes
        try:
            for handled, req in numbered:
                msgid, method, params = req
                if method != name:
                    return handled, req
                if len(ops) >= room:
                    if room >= 0 or not run.may_join():
                        return handled, req  # (it closes the run and begins another)
                    room = run.room
                if rate_room:  # (last: a request handed back has taken no token)
                    rate_room -= 1
                elif rate_enabled:
                    return handled, req  # (the loan is settled or refused there)
                try:
                    op = join(run, msgid, method, params)
                except NotNow:
                    return handled, req  # (the throttle's waiting path)
                if op is not None:
                    msgids.append(msgid)
                    ops.append(op)
                    size += op.size_hint
                if (
                    len(ops) >= writes
                    or size > write_bytes
                    or len(out) > OUT_HIGH_WATER
                    or not handled % FAIR_SHARE_REQUESTS
                ):
                    break
        finally:
            loan.room = rate_room
            if ops:
                run.add_many(msgids, ops, size)
        return handled, None

    def _start_write_run(
        self, bucket: BucketHandle, cmd: Command, holds: Holds, t0: float
    ) -> WriteRun:
        """A run of ``cmd`` writes on ``bucket`` whose first was admitted with ``holds``."""
        if self.write_run is not None:
            self.write_run.close()
        user = self.user
        unlimited = not self.node.throttle.enabled or (user is not None and user.unthrottled)
        run = self.write_run = WriteRun(self, bucket, cmd, holds, t0, unlimited=unlimited)
        return run

    def held_changed(self) -> None:
        """The connection's writes not yet durable changed (``pending_write_bytes``,
        as a run's writes were answered), or a large request waits or no longer
        does: the connection tells the node-wide cap."""
        self.flow.held_changed()

    async def _park_reader(self) -> None:
        """Wait until a write of this connection completes."""
        self.reader_parked = True
        try:
            await self._drain_lot.park()
        finally:
            self.reader_parked = False

    def wake_reader(self) -> None:
        if self.reader_parked:
            self.reader_parked = False
            self._drain_lot.unpark_all()

    async def wait_writes(self) -> None:
        """Wait until every write of this connection is answered."""
        while self.pending_writes:
            await self._park_reader()

    # -- the waiting path ------------------------------------------------------------

    def _backlogged(self, cmd: Command | None) -> bool:
        """Must this command wait for the connection's earlier writes? Reads and admin
        commands see them; a write needs no wait: the writer commits a connection's
        writes in order."""
        return self.pending_writes > 0 and (cmd is None or cmd.kind != "write")

    async def _run(self, cmd: Command | None, req: Request) -> bool:
        """Run any command after authentication, waiting where it must; False when
        the connection must close (a fatal error)."""
        msgid, method, params = req
        t0 = time.perf_counter()
        held = request_bytes(params)
        if held < WAITING_COUNTED_BYTES:
            return await self._run_held(cmd, msgid, method, params, t0)
        self.hold_waiting(held)
        try:
            return await self._run_held(cmd, msgid, method, params, t0)
        finally:
            self.hold_waiting(0)

    def hold_waiting(self, nbytes: int) -> None:
        """A large request waits (``nbytes``), or no longer does (0): the connection
        tells the node-wide cap (see :data:`WAITING_COUNTED_BYTES`)."""
        self.waiting_bytes = nbytes
        self.flow.held_changed()

    async def _run_held(
        self, cmd: Command | None, msgid: int, method: str, params: Any, t0: float
    ) -> bool:
        """:meth:`_run`, its request's bytes counted as held if need be."""
        if self._backlogged(cmd):
            await self.wait_writes()
        if self.node.failpoints.active and await self._failpoint(msgid, method):
            return True
        if cmd is not None and cmd.kind == "door":
            if method == "reset" and self.txn is not None:
                self.txn.reset()  # (RESET forgets the watched keys, as in Redis)
            return await self.door.run_local(self, cmd, (msgid, method, params))
        try:
            if cmd is None:
                if method == "hello":
                    raise errors.BadValue("hello was already received on this connection")
                raise errors.UnknownCommand(f"no command named {errors.shown(method)}")
            if cmd.kind in DATA_KINDS:
                await self._run_data(cmd, msgid, params, t0)
            else:
                check_params(cmd, params)
                await self._run_other(cmd, msgid, params)
        except errors.TenantKVError as exc:
            self.fail(msgid, method, exc)
            return not exc.fatal
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        return True

    async def _run_data(self, cmd: Command, msgid: int, params: Any, t0: float) -> None:
        """A data command that waits at a gate: prepared, admitted, prepared again
        (the user, its roles or the bucket may have changed meanwhile), executed."""
        prep = self._prepare(cmd, params)
        bucket = prep.bucket.name
        holds = await self._admit(prep)
        try:
            prep = self._prepare(cmd, params)
        except BaseException:
            self.node.pipeline.refund(bucket, holds)  # it never runs
            holds.release(cmd.name, outcome="rejected")
            raise
        if prep.op is None:
            self._turn = prep.bucket.name  # (see _start_read_run)
        self._execute(msgid, prep, holds, t0)

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

    def _execute(self, msgid: int, prep: Prepared, holds: Holds, t0: float) -> None:
        """Run a data command admitted on the waiting path; owns ``holds`` from
        here on. ``t0`` is when it was read."""
        cmd, b = prep.cmd, prep.bucket
        method = cmd.name
        node = self.node
        h: Holds | None = holds
        keys = 1  # (the floors a read that fails costs: _read_failed)
        try:
            if prep.op is None:
                try:
                    result = cmd.handler(self, b, prep.params)
                    holds.release(method)
                    h = None
                    node.charge_read(b.name, self.read_sizes, prep.user.unthrottled, self.read_keys)
                finally:
                    keys = self.read_keys
                    self.read_sizes.clear()
                    self.read_keys = 1
                self.door.reply(cmd, msgid, result)
                node.bucket_stats[b.name].ops[method] += 1
                node.latency.observe(b.name, method, time.perf_counter() - t0)
            else:
                h = None  # its run gives them back once the write is durable
                self._start_write_run(b, cmd, holds, t0).add(msgid, prep.op)
        except errors.TenantKVError as exc:
            self.fail(msgid, method, exc, keys=keys)
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        finally:
            if h is not None:
                h.release(method, outcome="error")

    async def _run_other(self, cmd: Command, msgid: int, params: dict[str, Any]) -> None:
        if cmd.kind == "internal":  # a cluster node's (tenantkv.cluster.peer): no tenant's
            if not self.current_user().node:
                raise errors.Unauthorized(f"{cmd.name} is a cluster-internal command")
            self.door.reply(cmd, msgid, await cmd.handler(self, params))
            return
        if cmd.kind == "admin":
            if not self.current_user().admin:
                raise errors.Unauthorized(f"{cmd.name} needs an admin user")
            self.door.reply(cmd, msgid, await cmd.handler(self, params))
            return
        # A session command: a request like any other, at a read's floor. Choosing
        # a bucket is part of setting the connection up: charged, never held.
        if cmd.name == "select_bucket":
            self.charge_floor()
        else:
            await self.admit_floor()
        try:
            result = await cmd.handler(self, params)
        except errors.TenantKVError as exc:
            self.fail(msgid, cmd.name, exc, charge=False)
            return
        self.door.reply(cmd, msgid, result)

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
        self.door.reply_error(msgid, exc)
        return True

    # -- errors and floors -----------------------------------------------------------

    def fail(
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
        unless it was charged already (``charge``): see :meth:`charge_floor`."""
        if charge and not exc.labels:
            self.charge_floor(keys)
        elif exc.retry_after_ms is not None:
            self._pause_reads(exc.retry_after_ms / 1000)
        exc.command = method
        self.count_error(exc)
        self.door.reply_error(msgid, exc)

    def refuse_shutting_down(self, req: Request) -> None:
        exc = errors.ShuttingDown("the server is stopping; the request did not run")
        exc.command = req[1]
        self.count_error(exc)
        self.door.reply_error(req[0], exc)

    def _internal_error(self, msgid: int, method: str, exc: Exception) -> None:
        if isinstance(exc, RecursionError):
            # A parameter nested ~1000 deep (MessagePack decodes up to ~1040) broke
            # a repr in a handler's error message: the client's fault, not ours.
            bad = errors.BadValue("a parameter is nested too deeply")
            bad.command = method
            self.count_error(bad)
            self.door.reply_error(msgid, bad)
            return
        self._log_internal_error(method, exc)
        self.charge_floor()  # (not free, even when it is our fault)
        self.door.reply_error(msgid, errors.InternalError(f"internal error: {exc!r:.200}"))

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

    def count_error(self, exc: errors.TenantKVError, n: int = 1) -> None:
        if self.bucket is not None and (stats := self.node.bucket_stats.get(self.bucket)):
            stats.errors[exc.code_name] += n

    def floor_tenant(self) -> tuple[str, bool] | None:
        """The bucket a request that is no data operation is charged to, and
        whether its user is unthrottled; None for an admin or a connection with no
        bucket: no tenant to charge."""
        user, bucket = self.user, self.bucket
        if user is None or user.admin or bucket is None or bucket not in self.node.throttle:
            return None
        return bucket, user.unthrottled

    def charge_floor(self, keys: int = 1) -> None:
        """A request after authentication that is no data operation — a connection
        command, or one refused for what it asked (unknown, malformed, not
        allowed) — costs the connection's bucket a read's floor (``min_op_units``),
        metered as a read of nothing: otherwise such requests would be free, past
        every limit. Charged after the fact, the floor is debt the bucket's next
        requests wait for; :meth:`admit_floor` also holds one to the allowance."""
        tenant = self.floor_tenant()
        if tenant is not None:
            self.node.charge_read(tenant[0], [], tenant[1], keys)

    async def admit_floor(self) -> None:
        """:meth:`charge_floor`, admitted by the tenant throttle first as a read is
        (it waits, or raises Throttled on a non-blocking connection or past
        ``throttle_max_wait_ms``): for a command that does work on request (PING,
        ECHO, INFO, ...), so a flood of them is held to the bucket's limits."""
        tenant = self.floor_tenant()
        if tenant is not None:
            bucket, unthrottled = tenant
            await self.node.gate.acquire(
                bucket, unthrottled=unthrottled, nonblocking=self.nonblocking_throttle
            )
            self.node.charge_read(bucket, [], unthrottled)

    # -- who is connected ------------------------------------------------------------

    def current_user(self) -> auth.User:
        """This connection's user as the registry has it now. Checked before every
        command runs, after any wait: the requests of a user deleted meanwhile —
        or deleted and created again, another user under the same name — fail
        (and the connection closes), changed roles and privileges apply at once."""
        user = self.user
        assert user is not None
        node = self.node
        if self._auth_epoch != node.accounts.epoch and not user.node:
            fresh = node.accounts.users.get(user.name)
            if fresh is None or fresh.uid != user.uid:
                self.flow.begin_shutdown()
                raise errors.Unauthorized(f"user {user.name!r} was deleted")
            self.user = user = fresh
            self._auth_epoch = node.accounts.epoch
        return user

    def logged_in(self, user: auth.User, epoch: int, bucket: str | None) -> None:
        """Authenticated as ``user`` (the registry as of ``epoch``, before the
        login's awaits: a change meanwhile is seen at the first request), in
        ``bucket``."""
        self.user = user
        self._auth_epoch = epoch
        self.flow.logged_in()
        self.select(bucket)

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
            raise errors.NoBucketSelected(self.door.no_bucket_message)
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

    def select(self, bucket: str | None) -> None:
        """Change the selected bucket; the throttle counts connections per bucket
        (a bucket with none keeps only part of its reservation: slow start)."""
        throttle = self.node.throttle
        if self.bucket is not None and self.bucket in throttle:
            throttle.connection_closed(self.bucket)
        self.bucket = bucket
        self._read_handle = self._write_handle = None
        if bucket is not None and bucket in throttle:
            throttle.connection_opened(bucket)

    def watch(self, bucket: str | None) -> trio.MemoryReceiveChannel[Any]:
        """This connection's subscription to bucket-queue events (made on first use)."""
        if self._watch_rx is None:
            self._watch_rx = self.node.queues.subscribe(bucket)
        return self._watch_rx

    def transaction_refused(self, method: str) -> None:
        """A request inside MULTI was refused before it could be queued (the rate
        limiter, a cluster node that does not serve its keys): EXEC will fail."""
        transaction.refused(self, method)

    def who(self) -> str:
        """For audit lines: user and peer address."""
        return f"user {self.user.name if self.user else None!r} from {self.peer}"

    def close(self) -> None:
        """The connection closed: leave its bucket and its subscription, and let
        go of the connection (:data:`CLOSED`)."""
        if self._watch_rx is not None:
            self.node.queues.unsubscribe(self._watch_rx)
        self.select(None)
        if self.txn is not None:
            self.txn.reset()  # (its queued bytes no longer count against the node's cap)
        self.txn = None
        self.flow = CLOSED
        self._prepared = None


async def authenticate(
    ex: Executor,
    name: Any,
    password: Any,
    bucket: str | None,
    *,
    one_role_bucket: bool = False,
    bucket_required: bool = False,
) -> auth.User:
    """Both doors' login (MessagePack ``hello``, RESP ``AUTH`` / ``HELLO AUTH``):
    the password checked by the login limiter and the registry, the bucket
    resolved — the one named, which the user must have a role on, or (with
    ``one_role_bucket``) the only bucket the user has a role on; with
    ``bucket_required`` one must be named unless the user is an admin — the
    connection table's slots kept for admins respected, and the connection
    logged in. Raises what it refuses; the caller answers it."""
    node = ex.node
    # The registry as of before the awaits: a change to the user while they
    # last is then seen at the first request (current_user).
    epoch = node.accounts.epoch
    user = await node.accounts.authenticate(name, password, peer=ex.peer_ip)
    if bucket is not None:
        if not isinstance(bucket, str):
            raise errors.BadValue("'bucket' must be a string")
        node.bucket(bucket)
        if not user.can_read(bucket):
            raise errors.Unauthorized(f"user {user.name!r} has no role on bucket {bucket!r}")
    elif one_role_bucket and len(user.roles) == 1:
        bucket = next(iter(user.roles))
    elif bucket_required and not (user.admin or user.node):
        raise errors.BadValue("'bucket' is required for users who are not admins")
    if ex.user is None:
        # A non-admin may not take the slots kept for admins (TooManyConnections).
        refused = await node.connection_authenticated(ex.conn_id, admin=user.admin or user.node)
        if refused is not None:
            raise errors.TooManyConnections(refused)
    ex.logged_in(user, epoch, bucket)
    return user
