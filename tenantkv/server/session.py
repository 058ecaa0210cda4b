"""One client connection: hello, then pipelined requests answered in order.

This is the framing half: reading, decoding, deadlines, hello and replies.
Running a command — prepare, admit, execute, complete — is the other half,
:mod:`tenantkv.server.execution`, which :class:`Session` extends.

One task per connection. It reads a chunk, decodes every complete request in
it and handles each: a read runs inline and its response is appended to the
output buffer; a write is queued on the group-commit writer and answered from
the writer's callback once durable, so pipelined writes share one commit. When
the chunk ends on a frame boundary the task waits for the chunk's writes to be
durable and sends every reply in one ``send_all``, then reads again; when it
ends inside a frame (a large value, a pipeline cut by TCP) it reads on at once,
so those writes join the same commits. Work that must wait
(admission queues, admin commands) is awaited inline: the connection is not
read meanwhile, and TCP pushes back on its client.

Deadlines cost nothing per read: no cancel scope is entered per receive. The
task notes when its current wait expires (hello, frame or idle deadline) and
the server's sweep (:meth:`Session.expire_if_due`, a few times a second)
cancels a session found waiting past it; only a session waiting to receive —
with nothing half done — is ever cancelled this way.

Order: a connection's writes commit in the order sent (one writer, FIFO), and
a read or admin command waits for the connection's earlier writes, so every
connection reads its own writes and sees responses in request order.

Back-pressure: when a connection has ``max_inflight_per_connection`` writes
unanswered or more than ``PENDING_WRITE_HIGH_WATER`` bytes of them, it waits
for them; more than ``OUT_HIGH_WATER`` bytes of replies are sent at once. A
client that does not read its replies is not read either: its task waits in
that send, holding at most ``OUT_HIGH_WATER`` plus one reply (plus the answers
of writes already in flight), counted against the node-wide cap
(``node.receive_buffers``) while it waits.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import trio

from tenantkv import errors, protocol
from tenantkv._version import __version__
from tenantkv.server import auth
from tenantkv.server.commands import ADMIN_METHODS, COMMANDS
from tenantkv.server.execution import ASK_ALLOWANCE, Execution, NotNow
from tenantkv.server.log_setup import SparseLog
from tenantkv.server.node import Node
from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.session")
#: What a client can make us log at will (protocol errors, failed logins),
#: sparse node-wide.
closing_log = SparseLog(log)
_pack = protocol.pack
RESPONSE = protocol.RESPONSE

RECEIVE_BYTES = 256 * 1024
#: Requests handled back to back before the reader lets other tasks run.
FAIR_SHARE_REQUESTS = 256
#: Unsent response bytes above which the reader pauses.
OUT_HIGH_WATER = 4 * 1024 * 1024
#: A send at least this large counts against the node-wide cap while it is
#: under way (``node.receive_buffers``). Smaller ones are not counted: most
#: sends complete at once, and counting costs two updates of the cap.
UNSENT_COUNTED_BYTES = 64 * 1024
#: Bytes of unanswered writes (queued values) above which the reader pauses: with
#: 20 MiB values the in-flight count alone would let one connection queue 20 GiB.
PENDING_WRITE_HIGH_WATER = 64 * 1024 * 1024
#: On shutdown, how long a connection must be quiet (its writes answered, nothing
#: received) before it is closed; requests arriving until then get ShuttingDown.
SHUTDOWN_QUIET_SECS = 0.25
HELLO_PARAMS = frozenset(
    {"user", "password", "bucket", "client", "backpressure", "nonblocking_throttle", "timeout_ms"}
)


class Decoder(Protocol):
    """What the session needs of a front door's request decoder (bounded, sans-IO)."""

    frame_limit: int
    frames: int

    @property
    def max_frame_bytes(self) -> int: ...

    @property
    def in_frame(self) -> bool: ...

    @property
    def buffered(self) -> int: ...

    def feed(self, data: bytes | bytearray) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...

    def release_if_idle(self) -> None: ...


class Session(Execution):
    """One connection: framing, deadlines, hello and replies; running the commands
    is the :class:`~tenantkv.server.execution.Execution` half."""

    #: the front door's protocol, in status and metrics
    protocol_name = "msgpack"

    def __init__(self, node: Node, stream: trio.abc.Stream, peer: str, conn_id: int) -> None:
        super().__init__(node)
        self.node = node
        self.stream = stream
        self.peer = peer
        self.peer_ip = peer.rsplit(":", 1)[0]
        self.conn_id = conn_id
        self.user: auth.User | None = None
        self.bucket: str | None = None
        self.backpressure = False
        self.nonblocking_throttle = False
        self.client_info: dict[str, Any] = {}
        self._max_inflight = node.config.max_inflight_per_connection
        self._out = bytearray()
        self._reading = True
        #: the scope of the whole session; cancelled only while ``_receiving``
        self._scope = trio.CancelScope()
        self._receiving = False
        #: when the current receive wait expires (trio time), and why
        self._deadline = math.inf
        self._deadline_what = ""
        self._expired = False
        #: the session's scope was cancelled (by begin_shutdown or expire_if_due:
        #: nothing else cancels it; a plain flag, read once per received chunk)
        self._cancelled = False
        self._decoder: Decoder | None = None
        #: bytes this connection holds for its client, as last told to
        #: node.receive_buffers: its decoder's undecoded bytes (``_buffered``, as of
        #: the last chunk settled), its writes not yet durable
        #: (``pending_write_bytes``), a large request waiting (``waiting_bytes``) and
        #: a large send under way (``_unsent``);
        #: once closed (``_released``) it holds none
        self._held = 0
        self._buffered = 0
        #: bytes of replies being sent (a send of UNSENT_COUNTED_BYTES or more)
        self._unsent = 0
        self._released = False
        #: bucket-queue event subscription of a watch_events connection
        self._watch_rx: trio.MemoryReceiveChannel[Any] | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def run(self) -> None:
        self.node.session_opened(self)
        try:
            with self._scope:
                await self._serve()
            if self._cancelled:
                await self._after_cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer is gone (a reset, a broken TLS stream)
        finally:
            self._buffered = 0  # nothing more is decoded; its writes still count
            self._report_held()
            with trio.CancelScope(shield=True):
                await self._finish_writes()
            self._released = True  # (writes that outlive the grace hold nothing now)
            if self._held:
                self.node.receive_buffers.update(self, 0)
                self._held = 0
            if self._watch_rx is not None:
                self.node.queues.unsubscribe(self._watch_rx)
            self.select(None)
            self.node.session_closed(self)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()

    async def _finish_writes(self) -> None:
        """Before closing: writes already queued commit; answer them if the peer is
        still there (bounded by ``shutdown_grace_secs``)."""
        with trio.move_on_after(self.node.config.shutdown_grace_secs):
            while self.pending_writes:
                await self._park_reader()
            if self._out:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._send_out()

    async def _after_cancel(self) -> None:
        """The sweep found this session waiting past its deadline, or the server is
        shutting down, or its user was deleted: answer accordingly."""
        if self._expired:
            exc = errors.IdleTimeout(self._deadline_what)
            log.info("connection %d from %s: %s; closing", self.conn_id, self.peer, exc.errmsg)
            self._reply_error(None, exc)
        elif self.node.shutting_down and self._decoder is not None:
            await self._refuse_until_quiet(self._decoder)

    def begin_shutdown(self) -> None:
        """Stop taking new requests; what was received still completes. On server
        shutdown (``node.shutting_down``) later requests get ShuttingDown until the
        connection goes quiet; otherwise (a deleted user) the connection just closes."""
        self._reading = False
        if self._receiving:
            self._cancelled = True
            self._scope.cancel()

    def expire_if_due(self, now: float) -> None:
        """Called by the server's sweep: close a session waiting past its deadline,
        and let an idle decoder go (RequestDecoder.release_if_idle)."""
        if self._receiving and now >= self._deadline and not self._expired:
            self._expired = True
            self._cancelled = True
            self._scope.cancel()
        if self._decoder is not None:
            self._decoder.release_if_idle()

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

    def who(self) -> str:
        """For audit lines: user and peer address."""
        return f"user {self.user.name if self.user else None!r} from {self.peer}"

    # -- output --------------------------------------------------------------------

    def _reply(self, msgid: int, result: Any) -> None:
        self._out += _pack([RESPONSE, msgid, None, result])  # encode_result, inline

    def _reply_all(self, msgids: list[int], results: Sequence[Any]) -> None:
        out = self._out
        for msgid, result in zip(msgids, results, strict=True):
            out += _pack([RESPONSE, msgid, None, result])  # _reply, inline

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        self._out += protocol.encode_error(msgid, exc)

    async def _send_out(self) -> None:
        data, self._out = self._out, bytearray()
        if len(data) < UNSENT_COUNTED_BYTES:
            await self.stream.send_all(data)
            return
        # A client that does not read its replies holds this send (and stops being
        # read: the task is here, not at its next receive). What it holds counts
        # against the node-wide cap meanwhile, so many such clients cannot hold
        # many times a reply each between them.
        self._unsent = len(data)
        self._report_held()
        try:
            await self.stream.send_all(data)
        finally:
            self._unsent = 0
            self._report_held()

    # -- input ---------------------------------------------------------------------

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        """A connection-level refusal (before any request) in this door's protocol."""
        return protocol.encode_error(None, exc)

    def _new_decoder(self) -> Decoder:
        """The request decoder of this front door (MessagePack-RPC here)."""
        return protocol.RequestDecoder(
            min(protocol.MAX_FRAME_BYTES, self.node.config.max_value_bytes + 64 * 1024),
            chunk_bytes=RECEIVE_BYTES,
        )

    async def _serve(self) -> None:
        """Read, decode and handle requests until the peer leaves or a limit ends it.

        Deadlines: ``hello_timeout_secs`` from accept for hello (fixed: a
        byte-at-a-time sender cannot extend it), ``frame_timeout_secs`` for a frame
        from its first byte, ``idle_timeout_secs`` between frames; the server's
        sweep enforces them. Before hello a frame may be
        :data:`protocol.MAX_HELLO_FRAME_BYTES` at most, and every read first asks
        the node-wide receive-buffer cap for room.
        """
        node = self.node
        cfg = node.config
        decoder = self._decoder = self._new_decoder()
        decoder.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
        hello_deadline = trio.current_time() + cfg.hello_timeout_secs
        idle = cfg.idle_timeout_secs or math.inf
        frame_deadline = math.inf
        in_frame = False  # decoder.in_frame, as of the last chunk handled
        buffers = node.receive_buffers
        clock = node.throttle.clock  # trio's clock (trio.current_time's reading, cheaper)
        try:
            while self._reading:
                if self.user is None:
                    self._deadline, want = hello_deadline, protocol.MAX_HELLO_FRAME_BYTES
                    self._deadline_what = "no hello within hello_timeout_secs"
                elif in_frame:
                    self._deadline, want = frame_deadline, RECEIVE_BYTES
                    self._deadline_what = (
                        "a request frame did not arrive in full within frame_timeout_secs"
                    )
                else:
                    self._deadline, want = clock() + idle, RECEIVE_BYTES
                    self._deadline_what = "no request within idle_timeout_secs"
                self._receiving = True
                if self.reads_paused_until:
                    # The rate limiter refused this connection's last chunk: read
                    # again when it could admit (Execution._refused_by_rate).
                    await trio.sleep_until(self.reads_paused_until)
                    self.reads_paused_until = 0.0
                user = self.user.name if self.user is not None else None
                if not (n := buffers.try_reserve(self, self._held, want, user)):
                    n = await buffers.reserve(self, self._held, want, user)
                data = await self.stream.receive_some(n)
                self._receiving = False
                if self._cancelled:
                    # The cancel came as the data did (the task was already woken):
                    # keep the bytes for _after_cancel, handle nothing here.
                    decoder.feed(data)
                    return
                if not data:
                    return
                frames = decoder.frames
                self._chunk_t0 = time.perf_counter()
                self._chunk_now = clock()
                decoder.feed(data)
                # What the decoder holds is told to the receive-buffer cap when the
                # chunk settles (_settle_chunk): before anything awaits, and after.
                if not await self._handle_chunk(decoder):
                    return
                # What the chunk left undecoded, as _settle_chunk just read it:
                # decoder.in_frame without asking again.
                in_frame = self._buffered > 0
                if in_frame:
                    if frames != decoder.frames or frame_deadline == math.inf:
                        frame_deadline = clock() + cfg.frame_timeout_secs
                    # More of a frame is on its way (a large value, or a pipeline cut
                    # by TCP): read on, so its writes join the same commits.
                    continue
                frame_deadline = math.inf
                # The chunk's replies go out together, once its writes are durable.
                while self.pending_writes:
                    await self._park_reader()
                if self._out:
                    await self._send_out()
            if node.shutting_down:
                await self._refuse_until_quiet(decoder)
        except (errors.ProtocolError, errors.FrameTooLarge) as exc:
            closing_log.info("connection %d from %s: %s; closing", self.conn_id, self.peer, exc)
            # The frame is unreadable, so the error is not addressed to a msgid.
            self._reply_error(None, exc)

    async def _handle_chunk(self, decoder: Decoder) -> bool:
        """Handle every complete request received; False when the connection must close.

        The chunk's inline reads share one read transaction (closed before
        anything here awaits: it holds the engine's lock) and are counted and
        timed once, when the chunk is done or the task yields.
        """
        node = self.node
        pipeline = node.pipeline
        numbered = enumerate(decoder, 1)
        try:
            for handled, req in numbered:
                while True:  # (again for a request a loop of its own handed back)
                    if not self._reading:
                        if not node.shutting_down:
                            return False  # its user was deleted: nothing more of theirs runs
                        self._refuse_shutting_down(req)
                    elif self.user is None:
                        self._settle_chunk()
                        if not await self._hello(req):
                            return False
                    else:
                        cmd = COMMANDS.get(req[1])
                        # Only an admin's admin commands are exempt: a command's name
                        # exempts no one (the role check comes after the limiter).
                        exempt = cmd is not None and cmd.kind == "admin" and self.user.admin
                        if self.rate_room and not exempt:
                            self.rate_room -= 1  # a token of the chunk's loan (_refused_by_rate)
                        elif pipeline.request_rate_enabled and self._refused_by_rate(
                            req[0], req[1], admin=exempt
                        ):
                            if self._chunk_refusal is not None:
                                # The limiter refused the chunk: the rest of it likewise.
                                handled, req = self._refuse_rest(numbered, handled)
                                if req is not None:  # an admin command: it passes
                                    continue
                            break
                        if not self._run_inline(cmd, req):
                            self._settle_chunk()
                            if not await self._run(cmd, req):
                                return False
                        elif cmd is self._run_cmd and self._run_reads > 1 and not self._run_watched:
                            # A read joined a run: the next ones join it here (a
                            # chunk of one read, the unpipelined case, never asks).
                            handled, req = self._join_read_run(numbered, handled)
                            if req is not None:
                                continue
                        elif (wrun := self._wrun) is not None and wrun.joined and cmd is wrun.cmd:
                            # A write joined a run: the next ones join it here.
                            handled, req = self._join_write_run(numbered, handled)
                            if req is not None:
                                continue
                    break
                # _should_pause, inline (hot: once per request).
                if (
                    self.pending_writes >= self._max_inflight
                    or len(self._out) > OUT_HIGH_WATER
                    or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
                    or handled % FAIR_SHARE_REQUESTS == 0
                ):
                    await self._pause()
        finally:
            self._settle_chunk()
        return True

    def _join_read_run(
        self, numbered: Iterator[tuple[int, protocol.Request]], handled: int
    ) -> tuple[int, protocol.Request | None]:
        """After the ``handled``-th request of the chunk joined a run of
        inline reads: run the next ones while they join it, as
        :meth:`~Execution._run_inline` runs a read that joins its run — the same
        command, so the same bucket, user and failpoints; its parameters known,
        a token of the chunk's rate loan, the run's allowance not reached — in one
        loop with the run's figures in locals: no dispatch, no call but the
        handler's, per read. This is where a pipelined read spends its time.

        Stops before a request that does not join (returned, for the general
        path: another command, parameters to check, no token left, the allowance
        reached) or when it is time to pause (:meth:`_should_pause`). Returns the
        count handled and that request, or None."""
        if self._should_pause(handled):
            return handled, None
        cmd, b = self._run_cmd, self._run_handle
        assert cmd is not None
        name, joins, handler = cmd.name, cmd.inline_params.issuperset, cmd.handler
        rate_room, rate_enabled = self.rate_room, self.node.pipeline.request_rate_enabled
        unit, floor, cost, allowance = (
            self._run_unit,
            self._run_floor,
            self._run_cost,
            self._run_allowance,
        )
        sizes, out = self.read_sizes, self._out
        fair, high_water = FAIR_SHARE_REQUESTS, OUT_HIGH_WATER
        reads = ru_sum = 0
        try:
            for handled, req in numbered:
                msgid, method, params = req
                if method != name or not joins(params):
                    return handled, req
                if cost >= allowance:
                    if allowance == ASK_ALLOWANCE:  # the run's second read asks
                        self._run_cost = cost
                        self._allowance_covers_run()
                        allowance = self._run_allowance
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
                    self._run_errors += 1  # admitted, but not an operation served
                    self._read_failed(msgid, method, exc)
                else:
                    # The read's units (see Node.read_cost), inline for one record.
                    if len(sizes) < 2 and self.read_keys == 1:
                        ru = -(-sizes.pop() // unit) if sizes else 0
                        c = ru if ru > floor else floor
                    else:
                        ru, c = self.node.read_cost(sizes, self.read_keys)
                        self.read_keys = 1
                        sizes.clear()
                    ru_sum += ru
                    cost += c
                    out += _pack([RESPONSE, msgid, None, result])  # _reply, inline
                if not handled % fair or len(out) > high_water:
                    break
        finally:
            self._run_reads += reads
            self._run_ru += ru_sum
            self._run_cost = cost
            self.rate_room = rate_room
        return handled, None

    def _join_write_run(
        self, numbered: Iterator[tuple[int, protocol.Request]], handled: int
    ) -> tuple[int, protocol.Request | None]:
        """After the ``handled``-th request of the chunk joined a run of writes:
        add the next ones while they are writes of the run's command with room
        at the gates and a token of the chunk's rate loan, each checked and built
        by :meth:`~Execution._join_write` as :meth:`~Execution._write_inline`
        does — in one loop, with no dispatch per write.

        Stops before a request that does not join (returned, for the general
        path: another command, no room, no token) or when it is time to pause
        (:meth:`_should_pause`: its writes count). Returns the count handled and
        that request, or None."""
        if self._should_pause(handled):
            return handled, None
        run = self._wrun
        assert run is not None
        name, join = run.cmd.name, self._join_write
        rate_room, rate_enabled = self.rate_room, self.node.pipeline.request_rate_enabled
        max_inflight, out = self._max_inflight, self._out
        # The joined writes, added to the run together when the loop stops
        # (WriteRun.add_many); until then the pause checks count them here.
        msgids: list[int] = []
        ops: list[WriteOp] = []
        size = 0
        room = run.room  # (-1: the gates not asked yet)
        writes = max_inflight - self.pending_writes
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
            self.rate_room = rate_room
            if ops:
                run.add_many(msgids, ops, size)
        return handled, None

    def _refuse_rest(
        self, numbered: Iterator[tuple[int, protocol.Request]], handled: int
    ) -> tuple[int, protocol.Request | None]:
        """After :meth:`_refused_by_rate` refused the ``handled``-th request of the
        chunk for want of a token: refuse the next ones as it would — at the chunk's
        instant none is left — without asking it, each with the chunk's 462 from
        its template, until one is an admin's admin command (returned: those
        pass) or it is time to pause (:meth:`_should_pause`). Returns the count
        handled so far and that command, or None.

        A flood past the rate is what the limiter absorbs, so its cost per request
        is kept to decoding it and copying the answer: no dispatch, no call."""
        if self._should_pause(handled):
            return handled, None
        out = self._out
        refusal = self._chunk_refusal
        assert refusal is not None and self.user is not None
        tail = protocol.error_tail(refusal)
        head = protocol.RESPONSE_HEAD
        first = handled
        stop: protocol.Request | None = None
        exempt = ADMIN_METHODS if self.user.admin else frozenset()
        for handled, req in numbered:
            if req[1] in exempt:
                stop = req
                break
            out += head  # (three appends: no intermediate bytes per refusal)
            out += _pack(req[0])
            out += tail
            if not handled % FAIR_SHARE_REQUESTS or len(out) > OUT_HIGH_WATER:
                break
        self._rate_refused += handled - first - (stop is not None)
        return handled, stop

    def _should_pause(self, handled: int) -> bool:
        """After the ``handled``-th request of a chunk: is too much unsent or
        unanswered, or is it time to let other connections run?"""
        return (
            self.pending_writes >= self._max_inflight
            or len(self._out) > OUT_HIGH_WATER
            or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
            or handled % FAIR_SHARE_REQUESTS == 0
        )

    async def _pause(self) -> None:
        """Send what is ready, wait for this connection's writes while too many are
        unanswered, and yield: a long pipelined chunk cannot hold the loop."""
        self._settle_chunk()
        await self._wait_drained()
        await trio.lowlevel.checkpoint()

    def _settle_chunk(self) -> None:
        """:meth:`Execution._settle_chunk`, and tell the node-wide receive-buffer cap
        what this connection holds now (:meth:`_report_held`). Both are due before
        anything awaits, and only then: while a chunk is handled without awaiting
        no other connection runs, so bytes received and decoded in the same turn
        are never counted at all."""
        super()._settle_chunk()
        decoder = self._decoder
        if decoder is not None:
            self._buffered = decoder.buffered
        self._report_held()

    def _report_held(self) -> None:
        """Tell the node-wide cap what this connection holds: its undecoded bytes,
        its decoded writes not yet durable, a large request waiting at a gate, and
        a large send under way. A value stops being received
        bytes when its frame is decoded, but the server still holds it (and a
        copy in the commit) until its write is durable: counting only the
        undecoded bytes let 32 connections pipelining 20 MiB writes hold 1.6 GB
        against a 256 MiB cap. The writer's answers call it as they free bytes
        (:meth:`Execution._held_changed`), waking connections that wait for room."""
        held = (
            0
            if self._released
            else self._buffered + self.pending_write_bytes + self.waiting_bytes + self._unsent
        )
        if held != self._held:
            user = self.user.name if self.user is not None else None
            self.node.receive_buffers.update(self, held, user)
            self._held = held

    _held_changed = _report_held

    def _refuse_shutting_down(self, req: protocol.Request) -> None:
        msgid, method, _ = req
        exc = errors.ShuttingDown("the server is stopping; the request did not run")
        exc.command = method
        self._count_error(exc)
        self._reply_error(msgid, exc)

    async def _refuse_until_quiet(self, decoder: Decoder) -> None:
        """Server shutdown: answer every request still arriving with ShuttingDown
        (labelled RetryableError: it did not run) instead of leaving it unread, until
        this connection's writes are answered and the client has sent nothing for
        ``SHUTDOWN_QUIET_SECS``; the server's grace period bounds it all."""
        for req in decoder:  # received already, not handled
            self._refuse_shutting_down(req)
        while True:
            if self._out:  # answers of writes that became durable meanwhile, refusals
                await self._send_out()
            with trio.move_on_after(SHUTDOWN_QUIET_SECS) as scope:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            if scope.cancelled_caught:
                if self.pending_writes or self._out:
                    continue
                return
            if not data:
                return
            decoder.feed(data)
            for req in decoder:
                self._refuse_shutting_down(req)

    async def _wait_drained(self) -> None:
        """Too much unsent or unanswered: send what is ready, wait for the writes."""
        if len(self._out) > OUT_HIGH_WATER:
            await self._send_out()
        while (
            self.pending_writes >= self._max_inflight
            or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
        ):
            await self._park_reader()

    # -- hello ------------------------------------------------------------------------

    async def _take_authenticated_slot(self, user: auth.User) -> None:
        """The connection table's check at authentication: a non-admin may not take
        the slots kept for admins (TooManyConnections)."""
        refused = await self.node.connection_authenticated(self.conn_id, admin=user.admin)
        if refused is not None:
            raise errors.TooManyConnections(refused)

    async def _hello(self, req: protocol.Request) -> bool:
        self.node.pipeline.count_exempt_request()
        msgid, method, p = req
        try:
            if method != "hello":
                raise errors.HelloRequired(
                    f"the first request must be hello, not {errors.shown(method)}"
                )
            for k in p:
                if k not in HELLO_PARAMS:
                    raise errors.BadValue(f"unknown parameter {errors.shown(k)} for hello")
            # The registry as of before the awaits: a change to the user while they
            # last is then seen at the first request (current_user).
            epoch = self.node.accounts.epoch
            user = await self.node.accounts.authenticate(
                p.get("user"), p.get("password"), peer=self.peer_ip
            )
            await self._take_authenticated_slot(user)
            bucket = p.get("bucket")
            if bucket is not None:
                if not isinstance(bucket, str):
                    raise errors.BadValue("'bucket' must be a string")
                self.node.bucket(bucket)
                if not user.can_read(bucket):
                    raise errors.Unauthorized(f"user {user.name!r} has no role on {bucket!r}")
            elif not user.admin:
                raise errors.BadValue("'bucket' is required for users who are not admins")
            client = p.get("client") or {}
            if not isinstance(client, dict):
                raise errors.BadValue("'client' must be a map {name, version}")
            self.client_info = {
                k: str(v)[:128] for k, v in client.items() if k in ("name", "version")
            }
            self.backpressure = bool(p.get("backpressure", False))
            self.nonblocking_throttle = bool(p.get("nonblocking_throttle", False))
        except errors.TenantKVError as exc:
            exc.command = "hello"
            closing_log.info(
                "connection %d from %s: hello failed: %s", self.conn_id, self.peer, exc
            )
            self._reply_error(msgid, exc)
            return False  # a failed hello always closes the connection
        self.user = user
        self._auth_epoch = epoch
        if self._decoder is not None:  # authenticated: frames up to the full bound
            self._decoder.frame_limit = self._decoder.max_frame_bytes
            # The unpacker made for hello (41 KiB) goes now unless more came with
            # it: a connection that authenticates and idles holds none (its first
            # request makes one again, ~1.3 µs). Kept, ten thousand such
            # connections arriving in a burst raised RssAnon by 46 KiB each.
            self._decoder.release_if_idle()
        self.select(bucket)
        log.debug(
            "connection %d from %s: user %r bucket %r client %r",
            self.conn_id,
            self.peer,
            user.name,
            bucket,
            self.client_info,
        )
        self._reply(
            msgid,
            {
                "server": "tenantkv",
                "version": __version__,
                "connection_id": self.conn_id,
                "user": user.name,
                "admin": user.admin,
                "bucket": bucket,
                "limits": {
                    "max_key_bytes": protocol.MAX_KEY_BYTES,
                    "max_value_bytes": self.node.config.max_value_bytes,
                    "max_frame_bytes": protocol.MAX_FRAME_BYTES,
                    "max_inflight": self._max_inflight,
                },
            },
        )
        return True
