"""One client connection: hello, then pipelined requests answered in order.

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
for them; more than ``OUT_HIGH_WATER`` bytes of replies are sent at once.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from functools import partial
from typing import Any

import trio

from tenantkv import errors, protocol
from tenantkv._version import __version__
from tenantkv.admission.pipeline import Holds
from tenantkv.server import auth
from tenantkv.server.commands import COMMANDS, Command, check_params
from tenantkv.server.node import Node
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.session")

RECEIVE_BYTES = 256 * 1024
#: Requests handled back to back before the reader lets other tasks run.
FAIR_SHARE_REQUESTS = 256
#: Unsent response bytes above which the reader pauses.
OUT_HIGH_WATER = 4 * 1024 * 1024
#: Bytes of unanswered writes (queued values) above which the reader pauses: with
#: 20 MiB values the in-flight count alone would let one connection queue 20 GiB.
PENDING_WRITE_HIGH_WATER = 64 * 1024 * 1024
#: On shutdown, how long a connection must be quiet (its writes answered, nothing
#: received) before it is closed; requests arriving until then get ShuttingDown.
SHUTDOWN_QUIET_SECS = 0.25
HELLO_PARAMS = frozenset(
    {"user", "password", "bucket", "client", "backpressure", "nonblocking_throttle", "timeout_ms"}
)


class Session:
    def __init__(self, node: Node, stream: trio.abc.Stream, peer: str, conn_id: int) -> None:
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
        #: per-record byte counts a read handler read (for metering)
        self.read_sizes: list[int] = []
        self.pending_writes = 0
        #: bytes of those writes (their values and keys), for back-pressure
        self.pending_write_bytes = 0
        self._max_inflight = node.config.max_inflight_per_connection
        self._out = bytearray()
        # A plain flag says whether the task is parked waiting for writes: checking
        # a bool per write callback is much cheaper than asking the ParkingLot.
        self._drain_lot = trio.lowlevel.ParkingLot()
        self._reader_parked = False
        self._reading = True
        #: the scope of the whole session; cancelled only while ``_receiving``
        self._scope = trio.CancelScope()
        self._receiving = False
        #: when the current receive wait expires (trio time), and why
        self._deadline = math.inf
        self._deadline_what = ""
        self._expired = False
        self._decoder: protocol.RequestDecoder | None = None
        #: the read transaction shared by the reads of the chunk being handled
        self._rtxn: Any = None
        #: when the chunk being handled was received (perf_counter), and its fast-path
        #: reads per (bucket, operation): counted and timed once per chunk
        self._chunk_t0 = 0.0
        self._chunk_reads: dict[tuple[str, str], int] = {}
        #: bytes this connection's decoder holds, as last told to node.receive_buffers
        self._held = 0
        #: node.auth_epoch when ``user`` was last looked up (see current_user)
        self._auth_epoch = node.auth_epoch
        #: bucket-queue event subscription of a watch_events connection
        self._watch_rx: trio.MemoryReceiveChannel[Any] | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def run(self) -> None:
        self.node.session_opened(self)
        try:
            with self._scope:
                await self._serve()
            if self._scope.cancel_called:
                await self._after_cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer is gone (a reset, a broken TLS stream)
        finally:
            if self._held:
                self.node.receive_buffers.update(self._held, 0)
                self._held = 0
            with trio.CancelScope(shield=True):
                await self._finish_writes()
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
            self._scope.cancel()

    def expire_if_due(self, now: float) -> None:
        """Called by the server's sweep: close a session waiting past its deadline."""
        if self._receiving and now >= self._deadline and not self._expired:
            self._expired = True
            self._scope.cancel()

    def select(self, bucket: str | None) -> None:
        """Change the selected bucket; the throttle counts connections per bucket
        (a bucket with none keeps only part of its reservation: slow start)."""
        throttle = self.node.throttle
        if self.bucket is not None and self.bucket in throttle:
            throttle.connection_closed(self.bucket)
        self.bucket = bucket
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
        self._out += protocol.encode_result(msgid, result)

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        self._out += protocol.encode_error(msgid, exc)

    async def _send_out(self) -> None:
        data, self._out = self._out, bytearray()
        await self.stream.send_all(data)

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

    # -- input ---------------------------------------------------------------------

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
        decoder = self._decoder = protocol.RequestDecoder(
            min(protocol.MAX_FRAME_BYTES, cfg.max_value_bytes + 64 * 1024),
            chunk_bytes=RECEIVE_BYTES,
        )
        decoder.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
        hello_deadline = trio.current_time() + cfg.hello_timeout_secs
        idle = cfg.idle_timeout_secs or math.inf
        frame_deadline = math.inf
        buffers = node.receive_buffers
        try:
            while self._reading:
                if self.user is None:
                    self._deadline, want = hello_deadline, protocol.MAX_HELLO_FRAME_BYTES
                    self._deadline_what = "no hello within hello_timeout_secs"
                elif decoder.in_frame:
                    self._deadline, want = frame_deadline, RECEIVE_BYTES
                    self._deadline_what = (
                        "a request frame did not arrive in full within frame_timeout_secs"
                    )
                else:
                    self._deadline, want = trio.current_time() + idle, RECEIVE_BYTES
                    self._deadline_what = "no request within idle_timeout_secs"
                self._receiving = True
                if not (n := buffers.try_reserve(self._held, want)):
                    n = await buffers.reserve(self._held, want)
                data = await self.stream.receive_some(n)
                self._receiving = False
                if self._scope.cancel_called:
                    # The cancel came as the data did (the task was already woken):
                    # keep the bytes for _after_cancel, handle nothing here.
                    decoder.feed(data)
                    return
                if not data:
                    return
                frames = decoder.frames
                self._chunk_t0 = time.perf_counter()
                decoder.feed(data)
                self._track_held(decoder)
                if not await self._handle_chunk(decoder):
                    return
                self._track_held(decoder)
                if decoder.in_frame and (frames != decoder.frames or frame_deadline == math.inf):
                    frame_deadline = trio.current_time() + cfg.frame_timeout_secs
                elif not decoder.in_frame:
                    frame_deadline = math.inf
                if decoder.in_frame:
                    # More of a frame is on its way (a large value, or a pipeline cut
                    # by TCP): read on, so its writes join the same commits.
                    continue
                # The chunk's replies go out together, once its writes are durable.
                while self.pending_writes:
                    await self._park_reader()
                if self._out:
                    await self._send_out()
            if node.shutting_down:
                await self._refuse_until_quiet(decoder)
        except (errors.ProtocolError, errors.FrameTooLarge) as exc:
            log.info("connection %d from %s: %s; closing", self.conn_id, self.peer, exc)
            # The frame is unreadable, so the error is not addressed to a msgid.
            self._reply_error(None, exc)

    async def _handle_chunk(self, decoder: protocol.RequestDecoder) -> bool:
        """Handle every complete request received; False when the connection must close.

        The chunk's fast-path reads share one read transaction (closed before
        anything here awaits: it holds the engine's lock) and are counted and
        timed once, when the chunk is done or the task yields.
        """
        node = self.node
        max_inflight = self._max_inflight
        try:
            for handled, req in enumerate(decoder, 1):
                if not self._reading:
                    if not node.shutting_down:
                        return False  # its user was deleted: nothing more of theirs runs
                    self._refuse_shutting_down(req)
                elif self.user is not None and (
                    node.config.ingress_request_rate_limiter_enabled
                    and not self._rate_admitted(req)
                ):
                    pass  # answered with 462
                elif self.user is not None and self._run_fast(*req):
                    pass
                else:
                    self._end_chunk_reads()
                    if not await self._handle(req):
                        return False
                if (
                    self.pending_writes >= max_inflight
                    or len(self._out) > OUT_HIGH_WATER
                    or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
                ):
                    self._end_chunk_reads()
                    await self._wait_drained()
                if handled % FAIR_SHARE_REQUESTS == 0:
                    # A long pipelined chunk yields now and then, so one
                    # connection cannot hold the loop from the others.
                    self._end_chunk_reads()
                    await trio.lowlevel.checkpoint()
        finally:
            self._end_chunk_reads()
        return True

    def read_txn(self) -> Any:
        """The read transaction of the chunk being handled (opened on first use)."""
        txn = self._rtxn
        if txn is None:
            txn = self._rtxn = self.node.engine.begin_read()
        return txn

    def _end_chunk_reads(self) -> None:
        """Close the chunk's read transaction and record its reads' counts and latency."""
        if self._rtxn is not None:
            self.node.engine.end_read(self._rtxn)
            self._rtxn = None
        if self._chunk_reads:
            node = self.node
            seconds = time.perf_counter() - self._chunk_t0
            for (bucket, method), n in self._chunk_reads.items():
                stats = node.bucket_stats.get(bucket)
                if stats is not None:  # not deleted meanwhile
                    stats.ops[method] += n
                    node.latency.observe_many(bucket, method, seconds, n)
            self._chunk_reads = {}

    def _track_held(self, decoder: protocol.RequestDecoder) -> None:
        """Tell the node-wide receive-buffer cap what this connection holds now."""
        held = decoder.buffered
        if held != self._held:
            self.node.receive_buffers.update(self._held, held)
            self._held = held

    def _refuse_shutting_down(self, req: protocol.Request) -> None:
        exc = errors.ShuttingDown("the server is stopping; the request did not run")
        exc.command = req.method
        self._count_error(exc)
        self._reply_error(req.msgid, exc)

    async def _refuse_until_quiet(self, decoder: protocol.RequestDecoder) -> None:
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

    def _rate_admitted(self, req: protocol.Request) -> bool:
        """The ingress request rate limiter, before any other work on the request.
        Admin commands and exempt client addresses pass, counted as exempted."""
        node = self.node
        cmd = COMMANDS.get(req.method)
        exempt = (cmd is not None and cmd.kind == "admin") or node.request_exemptions.matches(
            self.peer_ip
        )
        wait = node.request_limiter.try_acquire(exempt=exempt)
        if wait == 0.0:
            return True
        exc = node.request_limiter.rejection(wait)
        exc.command = req.method
        self._count_error(exc)
        self._reply_error(req.msgid, exc)
        return False

    async def _wait_drained(self) -> None:
        """Too much unsent or unanswered: send what is ready, wait for the writes."""
        if len(self._out) > OUT_HIGH_WATER:
            await self._send_out()
        while (
            self.pending_writes >= self._max_inflight
            or self.pending_write_bytes > PENDING_WRITE_HIGH_WATER
        ):
            await self._park_reader()

    async def _wait_writes(self) -> None:
        while self.pending_writes:
            await self._park_reader()

    def _run_fast(
        self,
        msgid: int,
        method: str,
        params: dict[str, Any],
        holds: Holds | None = None,
        failpoints_checked: bool = False,
        t0: float | None = None,
    ) -> bool:
        """Handle a read or write without awaiting; False if it needs ``_handle``.

        The hot path of every data command: the admission pipeline's fast path
        (tenant throttle, bucket queue, write permit, execution ticket — see
        :mod:`tenantkv.admission.pipeline`), then a read runs inline and a
        write is queued on the group-commit writer, keeping what it holds
        until its batch is durable. It goes to ``_handle`` (which may wait)
        when this connection has writes in flight (so a connection reads its
        own writes) or a gate cannot admit it now. ``holds``, when given, were
        acquired by ``_handle``; this method then owns them.
        """
        cmd = COMMANDS.get(method)
        if cmd is None:
            return False
        kind = cmd.kind
        if kind == "read":
            if self.pending_writes:
                return False
        elif kind != "write":
            return False
        node = self.node
        if node.failpoints.active and not failpoints_checked:
            return False
        h = holds
        try:
            check_params(cmd, params)
            b = self._data_bucket(write=kind == "write")
            user = self.user
            assert user is not None
            if kind == "read":
                if (
                    h is None
                    and (h := node.pipeline.try_admit(b.name, False, user.unthrottled)) is None
                ):
                    return False
                self.read_sizes.clear()
                result = cmd.handler(self, b, params)
                h.release(method)
                h = None
                node.charge_read(b.name, self.read_sizes, user.unthrottled)
                self._reply(msgid, result)
                if t0 is None:  # the fast path: counted and timed with its chunk
                    key = (b.name, method)
                    self._chunk_reads[key] = self._chunk_reads.get(key, 0) + 1
                else:  # it waited in _handle: timed from when it was read
                    node.bucket_stats[b.name].ops[method] += 1
                    node.latency.observe(b.name, method, time.perf_counter() - t0)
            else:
                op = cmd.handler(self, b, params)
                node.check_write_cost(b.name, op)
                if (
                    h is None
                    and (h := node.pipeline.try_admit(b.name, True, user.unthrottled)) is None
                ):
                    return False
                self.pending_writes += 1
                self.pending_write_bytes += op.size_hint
                if t0 is None:
                    t0 = self._chunk_t0  # timed from when its chunk arrived
                node.submit(
                    op,
                    partial(self._write_done, msgid, method, b, op, h, t0),
                    h.release_queue_bounds,
                )
                h = None  # the write's callback releases them once durable
        except errors.TenantKVError as exc:
            exc.command = method
            self._count_error(exc)
            self._reply_error(msgid, exc)
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        finally:
            if h is not None:
                h.release(method, outcome="error")
        return True

    async def _handle(self, req: protocol.Request) -> bool:
        """Any request the fast path did not take; False when the connection must close."""
        msgid, method, params = req
        if self.user is None:
            return await self._hello(req)
        t0 = time.perf_counter()
        cmd = COMMANDS.get(method)
        if self.pending_writes and (cmd is None or cmd.kind != "write"):
            # Reads and admin commands see this connection's earlier writes; a
            # write needs no wait: the writer commits a connection's writes in order.
            await self._wait_writes()
        if self.node.failpoints.active and await self._failpoint(msgid, method):
            return True
        if self._run_fast(msgid, method, params, failpoints_checked=True, t0=t0):
            return True
        try:
            if cmd is None:
                if method == "hello":
                    raise errors.BadValue("hello was already received on this connection")
                raise errors.UnknownCommand(f"no command named {method!r:.80}")
            check_params(cmd, params)
            if cmd.kind in ("read", "write"):
                holds = await self._admit(cmd, params)
                self._run_fast(msgid, method, params, holds=holds, failpoints_checked=True, t0=t0)
            else:
                await self._run_other(cmd, msgid, params)
        except errors.TenantKVError as exc:
            exc.command = method
            self._count_error(exc)
            self._reply_error(msgid, exc)
            return not exc.fatal
        except Exception as exc:
            self._internal_error(msgid, method, exc)
        return True

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

    async def _admit(self, cmd: Command, params: dict[str, Any]) -> Holds:
        """Wait at each gate of the admission pipeline, bounded by the request's
        ``timeout_ms``. This connection reads nothing meanwhile (TCP back-pressure)."""
        b = self._data_bucket(write=cmd.kind == "write")
        deadline = None
        timeout_ms = params.get("timeout_ms")  # checked by check_params
        if timeout_ms is not None:
            deadline = trio.current_time() + timeout_ms / 1000
        assert self.user is not None
        key = params.get("key")
        return await self.node.pipeline.admit(
            b.name,
            cmd.kind == "write",
            unthrottled=self.user.unthrottled,
            deadline=deadline,
            nonblocking=self.nonblocking_throttle,
            operation=cmd.name,
            key_len=len(key) if isinstance(key, (bytes, str)) else 0,
        )

    def _internal_error(self, msgid: int, method: str, exc: Exception) -> None:
        if isinstance(exc, RecursionError):
            # A parameter nested ~1000 deep (MessagePack decodes up to ~1040) broke
            # a repr in a handler's error message: the client's fault, not ours.
            bad = errors.BadValue("a parameter is nested too deeply")
            bad.command = method
            self._count_error(bad)
            self._reply_error(msgid, bad)
            return
        log.error("command %r failed on connection %d", method, self.conn_id, exc_info=exc)
        self._reply_error(msgid, errors.InternalError(f"internal error: {exc!r:.200}"))

    async def _run_other(self, cmd: Command, msgid: int, params: dict[str, Any]) -> None:
        if cmd.kind == "admin" and not self.current_user().admin:
            raise errors.Unauthorized(f"{cmd.name} needs an admin user")
        self._reply(msgid, await cmd.handler(self, params))

    def _write_done(
        self,
        msgid: int,
        method: str,
        b: BucketHandle,
        op: WriteOp,
        holds: Holds,
        t0: float,
        result: Any,
        error: BaseException | None,
    ) -> None:
        holds.release(method, len(getattr(op, "key", b"")), "ok" if error is None else "error")
        self.pending_writes -= 1
        self.pending_write_bytes -= op.size_hint
        stats = self.node.bucket_stats.get(b.name)
        if error is None:
            if stats is not None:
                stats.ops[method] += 1
                self.node.latency.observe(b.name, method, time.perf_counter() - t0)
            user = self.user
            self.node.charge_write(b.name, op.nbytes, user is not None and user.unthrottled)
            self._reply(msgid, result)
        else:
            exc = (
                error
                if isinstance(error, errors.TenantKVError)
                else errors.InternalError(repr(error))
            )
            exc.command = method
            self._count_error(exc)
            self._reply_error(msgid, exc)
            if isinstance(error, errors.ServerError) and not exc.labels:
                # It ran (a CAS mismatch, add on an existing key, a miss): it costs.
                user = self.user
                self.node.charge_write(b.name, 0, user is not None and user.unthrottled)
        if self._reader_parked:
            self._wake_reader()

    def _count_error(self, exc: errors.TenantKVError) -> None:
        if self.bucket is not None and (stats := self.node.bucket_stats.get(self.bucket)):
            stats.errors[exc.code_name] += 1

    def current_user(self) -> auth.User:
        """This connection's user as the registry has it now. Checked before every
        command runs, after any wait: the requests of a user deleted meanwhile fail
        (and the connection closes), changed roles and privileges apply at once."""
        user = self.user
        assert user is not None
        node = self.node
        if self._auth_epoch != node.auth_epoch:
            fresh = node.users.get(user.name)
            if fresh is None:
                self.begin_shutdown()
                raise errors.Unauthorized(f"user {user.name!r} was deleted")
            self.user = user = fresh
            self._auth_epoch = node.auth_epoch
        return user

    def _data_bucket(self, *, write: bool) -> BucketHandle:
        name = self.bucket
        if name is None:
            raise errors.NoBucketSelected("select a bucket in hello or with select_bucket")
        b = self.node.bucket(name)
        user = self.current_user()
        if not (user.can_write(name) if write else user.can_read(name)):
            need = "readwrite" if write else "read"
            raise errors.Unauthorized(f"user {user.name!r} lacks the {need} role on {name!r}")
        return b

    # -- hello ------------------------------------------------------------------------

    async def _hello(self, req: protocol.Request) -> bool:
        if self.node.config.ingress_request_rate_limiter_enabled:
            # Exempt (anonymous clients cannot drain the tokens), and counted as
            # such, as docs/admission.md says of hello and unauthenticated traffic.
            self.node.request_limiter.try_acquire(exempt=True)
        try:
            if req.method != "hello":
                raise errors.HelloRequired(
                    f"the first request must be hello, not {req.method!r:.80}"
                )
            p = req.params
            for k in p:
                if k not in HELLO_PARAMS:
                    raise errors.BadValue(f"unknown parameter {k!r} for hello")
            user = await self.node.authenticate(p.get("user"), p.get("password"), peer=self.peer_ip)
            cfg = self.node.config
            refused = self.node.connection_table.authenticated(
                self.conn_id,
                admin=user.admin,
                max_connections=cfg.max_connections,
                reserved_for_admins=min(cfg.admin_reserved_connections, cfg.max_connections - 1),
            )
            if refused is not None:
                raise errors.TooManyConnections(refused)
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
            log.info("connection %d from %s: hello failed: %s", self.conn_id, self.peer, exc)
            self._reply_error(req.msgid, exc)
            return False  # a failed hello always closes the connection
        self.user = user
        self._auth_epoch = self.node.auth_epoch
        if self._decoder is not None:  # authenticated: frames up to the full bound
            self._decoder.frame_limit = self._decoder.max_frame_bytes
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
            req.msgid,
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
