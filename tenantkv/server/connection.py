"""One client connection's I/O, for either door: receive, deadlines,
back-pressure, send, and what the connection holds.

A connection is composed of three parts: this (:class:`Connection`), its
door's codec (``server/doors/``: requests decoded from a chunk, replies
encoded) and its chunk executor (``server/executor.py``: the requests of a
chunk run — admitted, executed, answered — with no I/O of its own).

One task per connection. It reads a chunk, decodes every complete request in
it and the executor handles each: a read runs inline and its reply is appended
to the door's output buffer; a write is queued on the group-commit writer and answered from
the writer's callback once durable, so pipelined writes share one commit. When
the chunk ends on a frame boundary the task waits for the chunk's writes to be
durable and sends every reply in one ``send_all``, then reads again; when it
ends inside a frame (a large value, a pipeline cut by TCP) it reads on at once,
so those writes join the same commits. Work that must wait
(admission queues, admin commands) is awaited inline: the connection is not
read meanwhile, and TCP pushes back on its client.

Deadlines cost nothing per read: no cancel scope is entered per receive. The
task notes when its current wait expires (hello, frame or idle deadline) and
the server's sweep (:meth:`Connection.expire_if_due`, a few times a second)
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
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import trio

from tenantkv import errors, protocol
from tenantkv.server import auth
from tenantkv.server.direct_stream import DirectSocketStream
from tenantkv.server.executor import OUT_HIGH_WATER, Door, Executor, Request, closing_log
from tenantkv.server.node import Node

log = logging.getLogger("tenantkv.session")

RECEIVE_BYTES = 256 * 1024
#: A send at least this large counts against the node-wide cap while it is
#: under way (``node.receive_buffers``). Smaller ones are not counted: most
#: sends complete at once, and counting costs two updates of the cap.
UNSENT_COUNTED_BYTES = 64 * 1024
#: On shutdown, how long a connection must be quiet (its writes answered, nothing
#: received) before it is closed; requests arriving until then get ShuttingDown.
SHUTDOWN_QUIET_SECS = 0.25
#: Most bytes of replies and pushes a tracking connection may leave unread (its
#: client-output-buffer limit): a push past it closes the connection.
PUSH_HIGH_WATER = 2 * OUT_HIGH_WATER


class Decoder(Protocol):
    """What the connection needs of a door's request decoder (bounded, sans-IO)."""

    frame_limit: int
    frames: int

    @property
    def max_frame_bytes(self) -> int: ...

    @property
    def buffered(self) -> int: ...

    def feed(self, data: bytes | bytearray) -> None: ...

    def release_if_idle(self) -> None: ...


class Codec(Door, Protocol):
    """A door as the connection uses it: the executor's :class:`Door`, and its
    decoder."""

    def new_decoder(self, node: Node, chunk_bytes: int) -> Any: ...

    def requests(self, decoder: Any) -> Iterator[Request]: ...

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        """A connection-level refusal (before any request) in this door's protocol."""
        ...


class Connection:
    """One connection: its I/O here, its door's codec and its chunk executor."""

    def __init__(
        self, node: Node, stream: trio.abc.Stream, peer: str, conn_id: int, door: Codec
    ) -> None:
        self.node = node
        self.stream = stream
        self.peer = peer
        self.conn_id = conn_id
        self.door = door
        self.protocol_name = door.protocol_name
        self.ex = Executor(node, door, self, conn_id, peer)
        #: False once the connection takes no new requests (Flow.reading)
        self.reading = True
        #: the scope of the whole connection; cancelled only while ``_receiving``
        self._scope = trio.CancelScope()
        self._receiving = False
        #: when the current receive wait expires (trio time), and why
        self._deadline = math.inf
        self._deadline_what = ""
        self._expired = False
        #: the scope was cancelled (by begin_shutdown or expire_if_due: nothing
        #: else cancels it; a plain flag, read once per received chunk)
        self._cancelled = False
        self.decoder: Decoder | None = None
        #: bytes this connection holds for its client, as last told to
        #: node.receive_buffers: its decoder's undecoded bytes (``_buffered``, as of
        #: the last chunk settled), its writes not yet durable and a large request
        #: waiting (the executor's), and a large send under way (``_unsent``);
        #: once closed (``_released``) it holds none
        self._held = 0
        self._buffered = 0
        #: bytes of replies being sent (a send of UNSENT_COUNTED_BYTES or more)
        self._unsent = 0
        self._released = False
        #: client-side caching (start_pushing): pushes go out while the task waits
        #: to receive, by a second task that takes turns with it to send
        self._send_lock: trio.Lock | None = None
        self._push_wanted: trio.Event | None = None
        self._push_scope: trio.CancelScope | None = None
        #: a send has taken bytes from ``out`` that are not all written yet
        self._writing = False
        #: closed for pushes its client did not read (PUSH_HIGH_WATER)
        self.push_overflow = False

    # -- what the node and the registry see (node.Session, accounts.Connection) ------

    @property
    def user(self) -> auth.User | None:
        return self.ex.user

    @property
    def bucket(self) -> str | None:
        return self.ex.bucket

    @property
    def backpressure(self) -> bool:
        return self.ex.backpressure

    def select(self, bucket: str | None) -> None:
        self.ex.select(bucket)

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
            self.held_changed()
            with trio.CancelScope(shield=True):
                await self._finish_writes()
            self._released = True  # (writes that outlive the grace hold nothing now)
            if self._held:
                self.node.receive_buffers.update(self, 0)
                self._held = 0
            self.ex.close()
            self.node.tracking.stop(self.conn_id)
            if self._push_scope is not None:
                self._push_scope.cancel()
            self.node.session_closed(self)
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self.stream.aclose()

    async def _finish_writes(self) -> None:
        """Before closing: writes already queued commit; answer them if the peer is
        still there (bounded by ``shutdown_grace_secs``)."""
        with trio.move_on_after(self.node.config.shutdown_grace_secs):
            await self.ex.wait_writes()
            if self.door.out and not self.push_overflow:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.send()

    async def _after_cancel(self) -> None:
        """The sweep found this connection waiting past its deadline, or the server
        is shutting down, or its user was deleted: answer accordingly."""
        if self._expired:
            exc = errors.IdleTimeout(self._deadline_what)
            log.info("connection %d from %s: %s; closing", self.conn_id, self.peer, exc.errmsg)
            self.door.reply_error(None, exc)
        elif self.node.shutting_down and self.decoder is not None:
            await self._refuse_until_quiet(self.decoder)

    def begin_shutdown(self) -> None:
        """Stop taking new requests; what was received still completes. On server
        shutdown (``node.shutting_down``) later requests get ShuttingDown until the
        connection goes quiet; otherwise (a deleted user) the connection just closes."""
        self.reading = False
        if self._receiving:
            self._cancelled = True
            self._scope.cancel()

    def expire_if_due(self, now: float) -> None:
        """Called by the server's sweep: close a connection waiting past its
        deadline, and let an idle decoder go (RequestDecoder.release_if_idle)."""
        if self._receiving and now >= self._deadline and not self._expired:
            self._expired = True
            self._cancelled = True
            self._scope.cancel()
        if self.decoder is not None:
            self.decoder.release_if_idle()

    def logged_in(self) -> None:
        """Authenticated: frames up to the full bound. The unpacker made for hello
        (41 KiB) goes now unless more came with it: a connection that
        authenticates and idles holds none (its first request makes one again,
        ~1.3 µs). Kept, ten thousand such connections arriving in a burst raised
        RssAnon by 46 KiB each."""
        if self.decoder is not None:
            self.decoder.frame_limit = self.decoder.max_frame_bytes
            self.decoder.release_if_idle()

    # -- output --------------------------------------------------------------------

    async def send(self) -> None:
        """Send the replies ready (the door's ``out``); with pushes on, in turn
        with the pusher (one sender at a time: a push never lands inside a reply)."""
        if self._send_lock is None:
            await self._send()
            return
        async with self._send_lock:
            if self._send_now():
                return
            self._writing = True  # (bytes taken from ``out`` not yet written)
            try:
                await self._send()
            finally:
                self._writing = False

    async def _send(self) -> None:
        door = self.door
        if self.push_overflow:
            door.out = bytearray()  # (closing: nothing more for this client)
            return
        data, door.out = door.out, bytearray()
        if len(data) < UNSENT_COUNTED_BYTES:
            await self.stream.send_all(data)
            return
        # A client that does not read its replies holds this send (and stops being
        # read: the task is here, not at its next receive). What it holds counts
        # against the node-wide cap meanwhile, so many such clients cannot hold
        # many times a reply each between them.
        self._unsent = len(data)
        self.held_changed()
        try:
            await self.stream.send_all(data)
        finally:
            self._unsent = 0
            self.held_changed()

    # -- pushes (client-side caching) ------------------------------------------------

    def start_pushing(self) -> None:
        """Tracking is on: from now on a push goes out when it is made, even while
        the connection waits for its client's next command. The pusher task is
        made only for such a connection (most never need one)."""
        if self._push_scope is not None:
            return
        self._send_lock = trio.Lock()
        self._push_wanted = trio.Event()
        self._push_scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(self._pusher, name=f"pusher-{self.conn_id}")

    def push(self, data: bytes) -> None:
        """Queue a push after the replies ready (whole replies only: ``out`` never
        holds part of one). A client that lets more than PUSH_HIGH_WATER bytes
        pile up unread is closed, as Redis closes a client past its output
        buffer limit: a push it never reads must not grow without bound."""
        if self.push_overflow or self._push_wanted is None:
            return
        out = self.door.out
        if len(out) + len(data) > PUSH_HIGH_WATER:
            closing_log.info(
                "connection %d from %s: %d bytes of replies and invalidations unread; closing",
                self.conn_id,
                self.peer,
                len(out) + len(data),
            )
            self.push_overflow = True
            self.door.out = bytearray()
            self.reading = False
            self._cancelled = True
            self._scope.cancel()
            return
        out += data
        if not self._send_now():
            self._push_wanted.set()

    def _send_now(self) -> bool:
        """Write what is ready straight to the socket, if no send is part way and
        the socket takes it all at once; True if it did (what it took is gone
        from ``out``). A push made as a write commits is then on its way before
        the writer's answer is (the pusher task would run in any order with the
        writer's task). TLS streams, and a socket that takes only part, leave
        the rest to an awaited send."""
        stream = self.stream
        if (
            self._writing
            or self.push_overflow
            or self._released  # (its file descriptor may be closed, even reused)
            or not isinstance(stream, (DirectSocketStream, trio.SocketStream))
        ):
            return False
        out = self.door.out
        if not out:
            return True
        try:
            sent = os.write(stream.socket.fileno(), out)
        except OSError:  # (full, or gone: the pusher's send finds out which)
            return False
        del out[:sent]
        return not out

    async def _pusher(self) -> None:
        assert self._push_scope is not None and self._push_wanted is not None
        with self._push_scope:
            try:
                while not self.push_overflow:
                    await self._push_wanted.wait()
                    self._push_wanted = trio.Event()
                    if self.door.out:
                        await self.send()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # (the connection's task sees the same and closes)
            except Exception:  # a system task must not raise: it would end the server
                log.exception("connection %d: pushes failed", self.conn_id)

    # -- input ---------------------------------------------------------------------

    def _next_wait(self, in_frame: bool, hello_deadline: float, frame_deadline: float) -> int:
        """Set the deadline of the next receive (hello, frame or idle) and why;
        how many bytes it may take."""
        cfg = self.node.config
        if self.ex.user is None:
            self._deadline = hello_deadline
            self._deadline_what = "no hello within hello_timeout_secs"
            return protocol.MAX_HELLO_FRAME_BYTES
        if in_frame:
            self._deadline = frame_deadline
            self._deadline_what = "a request frame did not arrive in full within frame_timeout_secs"
        else:
            self._deadline = self.node.throttle.clock() + (cfg.idle_timeout_secs or math.inf)
            self._deadline_what = "no request within idle_timeout_secs"
        return RECEIVE_BYTES

    async def _receive(self, want: int) -> bytes | bytearray:
        """Wait out a refusal's pause, reserve room under the node-wide cap, and
        receive up to ``want`` bytes."""
        ex = self.ex
        if ex.reads_paused_until:
            # A refusal paused this connection: read again when the limiter or
            # the throttle could admit (Executor._pause_reads).
            await trio.sleep_until(ex.reads_paused_until)
            ex.reads_paused_until = 0.0
        buffers = self.node.receive_buffers
        user = ex.user.name if ex.user is not None else None
        if not (n := buffers.try_reserve(self, self._held, want, user)):
            n = await buffers.reserve(self, self._held, want, user)
        return await self.stream.receive_some(n)

    async def _serve(self) -> None:
        """Read, decode and handle requests until the peer leaves or a limit ends it.

        Deadlines: ``hello_timeout_secs`` from accept for hello (fixed: a
        byte-at-a-time sender cannot extend it), ``frame_timeout_secs`` for a frame
        from its first byte, ``idle_timeout_secs`` between frames; the server's
        sweep enforces them. Before authentication a frame may be
        :data:`protocol.MAX_HELLO_FRAME_BYTES` at most, and every read first asks
        the node-wide receive-buffer cap for room.
        """
        node = self.node
        cfg = node.config
        ex, door = self.ex, self.door
        decoder = self.decoder = door.new_decoder(node, RECEIVE_BYTES)
        decoder.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
        hello_deadline = trio.current_time() + cfg.hello_timeout_secs
        frame_deadline = math.inf
        in_frame = False  # decoder.in_frame, as of the last chunk handled
        clock = node.throttle.clock  # trio's clock (trio.current_time's reading, cheaper)
        try:
            while self.reading:
                want = self._next_wait(in_frame, hello_deadline, frame_deadline)
                self._receiving = True
                data = await self._receive(want)
                self._receiving = False
                if self._cancelled:
                    # The cancel came as the data did (the task was already woken):
                    # keep the bytes for _after_cancel, handle nothing here.
                    decoder.feed(data)
                    return
                if not data:
                    return
                frames = decoder.frames
                ex.chunk_t0 = time.perf_counter()
                ex.chunk_now = clock()
                decoder.feed(data)
                # What the decoder holds is told to the receive-buffer cap when the
                # chunk settles (chunk_settled): before anything awaits, and after.
                if not await ex.handle_chunk(door.requests(decoder)):
                    return
                # What the chunk left undecoded, as chunk_settled just read it:
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
                await ex.wait_writes()
                if door.out:
                    await self.send()
            if node.shutting_down:
                await self._refuse_until_quiet(decoder)
        except (errors.ProtocolError, errors.FrameTooLarge) as exc:
            closing_log.info("connection %d from %s: %s; closing", self.conn_id, self.peer, exc)
            # The frame is unreadable, so the error is not addressed to a request.
            door.reply_error(None, exc)

    def chunk_settled(self) -> None:
        """The executor settled its chunk (:meth:`Executor._settle_chunk`): tell the
        node-wide receive-buffer cap what this connection holds now. Due before
        anything awaits, and only then: while a chunk is handled without awaiting
        no other connection runs, so bytes received and decoded in the same turn
        are never counted at all."""
        decoder = self.decoder
        if decoder is not None:
            self._buffered = decoder.buffered
        self.held_changed()

    def held_changed(self) -> None:
        """Tell the node-wide cap what this connection holds: its undecoded bytes,
        its decoded writes not yet durable, a large request waiting at a gate, and
        a large send under way. A value stops being received
        bytes when its frame is decoded, but the server still holds it (and a
        copy in the commit) until its write is durable: counting only the
        undecoded bytes let 32 connections pipelining 20 MiB writes hold 1.6 GB
        against a 256 MiB cap. The writer's answers call it as they free bytes,
        waking connections that wait for room."""
        ex = self.ex
        held = (
            0
            if self._released
            else self._buffered + ex.pending_write_bytes + ex.waiting_bytes + self._unsent
        )
        if held != self._held:
            user = ex.user.name if ex.user is not None else None
            self.node.receive_buffers.update(self, held, user)
            self._held = held

    async def _refuse_until_quiet(self, decoder: Any) -> None:
        """Server shutdown: answer every request still arriving with ShuttingDown
        (labelled RetryableError: it did not run) instead of leaving it unread, until
        this connection's writes are answered and the client has sent nothing for
        ``SHUTDOWN_QUIET_SECS``; the server's grace period bounds it all."""
        ex, door = self.ex, self.door
        for req in door.requests(decoder):  # received already, not handled
            ex.refuse_shutting_down(req)
        while True:
            if door.out:  # answers of writes that became durable meanwhile, refusals
                await self.send()
            with trio.move_on_after(SHUTDOWN_QUIET_SECS) as scope:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            if scope.cancelled_caught:
                if ex.pending_writes or door.out:
                    continue
                return
            if not data:
                return
            decoder.feed(data)
            for req in door.requests(decoder):
                ex.refuse_shutting_down(req)
