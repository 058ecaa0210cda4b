"""The listener and the server's lifecycle: start, serve, shut down gracefully.

Shutdown (SIGINT/SIGTERM or ``Server.shutdown``): tell every session to stop
taking requests — what it already read completes, and each request still
arriving gets ``ShuttingDown`` (labelled ``RetryableError``: it did not run) —
answer new connections with ``ShuttingDown``, give in-flight requests
``shutdown_grace_secs`` to finish, then stop accepting, cancel what is left,
let the writer commit everything queued and close LMDB. Anything acknowledged
is on disk before the process exits.

TLS (``tls_cert_file``/``tls_key_file``; ``tls_ca_file`` requires client
certificates): each accepted stream is wrapped in a ``trio.SSLStream`` and
handshakes, bounded by ``hello_timeout_secs``, in its own task — a failed or
stalled handshake is logged and closes that connection only. A client that
speaks plain MessagePack to a TLS port gets a plain ``ProtocolError`` saying so.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import signal
import socket
import ssl
from collections.abc import Callable
from itertools import count
from typing import Any

import trio

from tenantkv import errors, protocol
from tenantkv.admission.throughput_probing import run_probing
from tenantkv.config import Config
from tenantkv.server import sd_notify
from tenantkv.server.connection import Codec, Connection
from tenantkv.server.direct_stream import DirectSocketStream
from tenantkv.server.doors.msgpack import MsgpackDoor
from tenantkv.server.doors.resp import RespDoor
from tenantkv.server.node import Announcement, Node, Role
from tenantkv.server.role import ListenError, SingleProcess
from tenantkv.server.status import gc_frozen
from tenantkv.storage.engine import Engine

__all__ = ["ListenError", "Server", "TLSConfigError", "open_engine", "server_ssl_context"]

log = logging.getLogger("tenantkv.server")

#: Young-generation threshold of the garbage collector once the server serves:
#: net new container objects before a collection. At the default 700, the
#: objects of writes waiting for their commit (~1,000 at 16 pipelined
#: connections) set off a collection every few hundred writes, each walking
#: all of them: ~3 % of the server's CPU per durable SET. Requests' other
#: objects die young and do not count; reference cycles, which only a
#: collection frees, still start one after this many.
GC_YOUNG_THRESHOLD = 10_000


def freeze_gc() -> None:
    """A serving process's garbage collector: what start-up built moved out of
    its reach (:func:`gc.freeze`), the young threshold raised
    (:data:`GC_YOUNG_THRESHOLD`). Once, when the process serves."""
    gc.freeze()
    gc_frozen()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


#: The deadline sweep runs every shortest-timeout / 8, within these bounds: a
#: session outlives its deadline by at most that much.
SWEEP_MIN_SECS = 0.02
SWEEP_MAX_SECS = 0.5
#: First byte of a TLS record carrying a handshake message (ClientHello).
TLS_HANDSHAKE_RECORD = 0x16


class TLSConfigError(Exception):
    """The TLS settings cannot be used; the message names the setting and the file."""


def server_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The listener's TLS context from the settings, or None when TLS is off."""
    cert, key, ca = config.tls_cert_file, config.tls_key_file, config.tls_ca_file
    if cert is None:
        if key is not None or ca is not None:
            raise TLSConfigError("TLS: tls_key_file or tls_ca_file is set but tls_cert_file is not")
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        what = f"tls_cert_file {cert}" + (f" / tls_key_file {key}" if key else "")
        raise TLSConfigError(f"TLS: cannot load {what}: {_reason(exc)}") from None
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"TLS: cannot load tls_ca_file {ca}: {_reason(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def open_engine(config: Config, *, shared: bool = False) -> Engine:
    return Engine(
        config.data_dir,
        map_size=config.map_size_mb * 1024 * 1024,
        max_map_size=config.max_map_size_mb * 1024 * 1024,
        sync=config.durability == "fsync",
        max_buckets=config.max_buckets,
        shared=shared,
        slot_index=config.cluster is not None,
    )


class Server:
    """A process that serves clients in its :class:`~tenantkv.server.role.Role`:
    by default the whole server in one process (:class:`SingleProcess`), or one
    worker of ``serve --workers N`` (:class:`tenantkv.server.worker.WorkerLink`)."""

    def __init__(self, config: Config, *, role: Role | None = None) -> None:
        self.config = config
        self.role: Role = role if role is not None else SingleProcess()
        self.ssl_context = server_ssl_context(config)  # before the data directory is locked
        self.engine = open_engine(config, shared=self.role.shared_storage)
        self.node = Node(config, self.engine, role=self.role)
        self.node.request_stop = self.shutdown
        self.node.evict_connection = self._evict
        #: connections accepted and not yet a session (connection limiter, TLS handshake)
        self.connections_pending = 0
        self._ids = count(1)
        #: cancel scope of each connection's task, to evict it (connection table)
        self._scopes: dict[int, trio.CancelScope] = {}
        self._stop = trio.Event()
        self._reload_config: Callable[[], Config] | None = None
        self.listeners: list[trio.SocketListener] = []
        self.resp_listeners: list[trio.SocketListener] = []
        self.metrics_port: int | None = None

    def shutdown(self) -> None:
        self._stop.set()

    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
        ready_file: str | None = None,
        handle_signals: bool = False,
        reload_config: Callable[[], Config] | None = None,
        freeze_gc: bool = False,
    ) -> None:
        """``reload_config``: SIGHUP calls it and applies the runtime settings of the
        configuration it returns (the command line re-reads the config file).
        ``freeze_gc``: the server owns its process (the daemon, a worker), so what
        start-up built is moved out of the garbage collector's reach once it serves
        (:func:`gc.freeze`): it lives as long as the process, and a full collection
        would otherwise walk all of it — ~34k objects, a ~10 ms pause of every
        tenant's requests, about once a second under durable writes. It also
        raises the young generation's threshold (:data:`GC_YOUNG_THRESHOLD`)."""
        node = self.node
        self._reload_config = reload_config
        self._freeze_gc = freeze_gc
        # The signal receiver stays open until storage is closed: a second SIGTERM
        # (an impatient supervisor) must not kill the server with the default
        # handler while it drains and commits; SIGKILL is the way to stop at once.
        with contextlib.ExitStack() as stack:
            signals = (
                stack.enter_context(
                    trio.open_signal_receiver(
                        signal.SIGINT,
                        signal.SIGTERM,
                        *([signal.SIGHUP] if reload_config is not None else []),
                    )
                )
                if handle_signals
                else None
            )
            await self._serve(node, signals, task_status, ready_file)

    async def _serve(
        self,
        node: Node,
        signals: Any,
        task_status: trio.TaskStatus[Server],
        ready_file: str | None,
    ) -> None:
        role = self.role
        try:
            node.start()
            listeners = await role.listen(self.config)
            self.listeners, self.resp_listeners = listeners.msgpack, listeners.resp
            self.metrics_port = role.start_metrics(node)
            node.metrics_port = self.metrics_port or 0
            where = self._where(node)
            async with trio.open_nursery() as outer:
                if signals is not None:
                    outer.start_soon(self._watch_signals, signals)
                await role.load(node, outer)
                outer.start_soon(self._sweep)
                outer.start_soon(run_probing, node.prober)
                await outer.start(node.permits.run)
                async with trio.open_nursery() as sessions:
                    accept_scopes = self._start_accepting(sessions)
                    await role.announce(node, where, ready_file)
                    if self._freeze_gc:
                        freeze_gc()
                    task_status.started(self)
                    await self._stop.wait()
                    await self._drain_sessions(accept_scopes)
                    sessions.cancel_scope.cancel()
                await role.drain(node)
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await node.stop_writer()
            self.engine.close()
            log.info("stopped; storage closed")

    def _where(self, node: Node) -> Announcement:
        """Where this process serves (the node learns its ports here)."""
        sockname = self.listeners[0].socket.getsockname()
        node.host, node.port = sockname[0], sockname[1]
        if self.resp_listeners:
            node.resp_port = self.resp_listeners[0].socket.getsockname()[1]
        return Announcement(
            node.host,
            node.port,
            node.resp_port if self.resp_listeners else None,
            self.metrics_port,
            self.ssl_context is not None,
            self.config.metrics_host,
        )

    def _start_accepting(self, sessions: trio.Nursery) -> list[trio.CancelScope]:
        """An accept loop per listener of each door; their scopes stop them."""
        # One scope per accept loop (a scope enters one block only).
        accept_scopes: list[trio.CancelScope] = []
        for listener in self.listeners:
            sessions.start_soon(
                self._accept_loop, listener, sessions, _new(accept_scopes), MsgpackDoor
            )
        for listener in self.resp_listeners:
            sessions.start_soon(
                self._accept_loop, listener, sessions, _new(accept_scopes), RespDoor
            )
        return accept_scopes

    async def _drain_sessions(self, accept_scopes: list[trio.CancelScope]) -> None:
        """Stop taking requests, give sessions the grace to finish, stop accepting."""
        node = self.node
        sd_notify.stopping()
        log.info("shutting down: no new connections, %d sessions finishing", len(node.sessions))
        # From here new connections get ShuttingDown (_run_session),
        # and sessions answer requests still arriving with it.
        node.shutting_down = True
        for s in list(node.sessions):
            s.begin_shutdown()
        with trio.move_on_after(node.config.shutdown_grace_secs):
            if node.sessions:
                await node.no_sessions.wait()
        for scope in accept_scopes:
            scope.cancel()
        for listener in (*self.listeners, *self.resp_listeners):
            await listener.aclose()

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP and self._reload_config is not None:
                try:
                    config = self._reload_config()
                except Exception as exc:  # a bad file: keep what is in force
                    log.error("SIGHUP: config not reloaded: %s", exc)
                    continue
                log.info("SIGHUP: config reloaded")
                self.node.reload_config(config)
                continue
            if self._stop.is_set():
                log.info("received %s again; already shutting down", name)
                continue
            log.info("received %s", name)
            self.shutdown()

    async def _accept_loop(
        self,
        listener: trio.SocketListener,
        nursery: trio.Nursery,
        scope: trio.CancelScope,
        door: Callable[[], Codec],
    ) -> None:
        with scope:
            while True:
                try:
                    stream = await listener.accept()
                except (OSError, trio.ClosedResourceError) as exc:
                    if isinstance(exc, trio.ClosedResourceError):
                        return
                    log.warning("accept failed: %s", exc)  # e.g. EMFILE: back off briefly
                    await trio.sleep(0.05)
                    continue
                nursery.start_soon(self._run_session, stream, door)

    async def _run_session(self, stream: trio.SocketStream, door: Callable[[], Codec]) -> None:
        node = self.node
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        conn: trio.abc.Stream
        if self.ssl_context is not None:
            conn = trio.SSLStream(stream, self.ssl_context, server_side=True, https_compatible=True)
        else:
            conn = DirectSocketStream(stream)  # a yield per request, not three
        if node.shutting_down:
            await self._refuse(conn, door, errors.ShuttingDown("the server is stopping"))
            return
        conn_id = next(self._ids)
        admitted = await node.admit_connection(conn_id, peer.rsplit(":", 1)[0])
        if not admitted.ok:
            await self._refuse(conn, door, errors.TooManyConnections(admitted.reason))
            return
        if admitted.evict is not None:
            self._evict(admitted.evict)
        with trio.CancelScope() as scope:
            self._scopes[conn_id] = scope
            try:
                await self._serve_connection(stream, conn, peer, conn_id, door)
            except Exception:  # one connection's bug must never take the listener down
                log.exception("connection from %s failed", peer)
            finally:
                del self._scopes[conn_id]
                node.connection_closed(conn_id)

    def _evict(self, conn_id: int) -> None:
        """Close a connection that has not said hello, to make room for a new one."""
        scope = self._scopes.get(conn_id)
        if scope is not None:
            log.info("connection %d closed without hello to make room for another", conn_id)
            self.node.connections_evicted += 1
            scope.cancel()

    async def _serve_connection(
        self,
        stream: trio.SocketStream,
        conn: trio.abc.Stream,
        peer: str,
        conn_id: int,
        door: Callable[[], Codec],
    ) -> None:
        node = self.node
        self.connections_pending += 1
        try:
            if node.config.ingress_connection_establishment_rate_limiter_enabled:
                # Before the first read: a connection storm queues here (bounded),
                # and what does not fit is refused, so established clients go on.
                try:
                    if not await self._establishment_admitted(stream, peer):
                        with trio.CancelScope(shield=True), trio.move_on_after(1):
                            await stream.aclose()
                        return
                except errors.TenantKVError as refused:
                    await self._refuse(conn, door, refused)
                    return
            if isinstance(conn, trio.SSLStream) and not await self._tls_handshake(
                stream, conn, peer
            ):
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()
                return
        finally:
            self.connections_pending -= 1
        if node.shutting_down:  # it began while this connection waited
            await self._refuse(conn, door, errors.ShuttingDown("the server is stopping"))
            return
        node.connections_total += 1
        try:
            await Connection(node, conn, peer, conn_id, door()).run()
        except Exception:  # one connection's bug must never take the listener down
            log.exception("connection from %s failed", peer)

    async def _establishment_admitted(self, stream: trio.SocketStream, peer: str) -> bool:
        """Wait in the connection-establishment limiter's queue; False when the client
        left meanwhile (MongoDB's ``interruptedDueToClientDisconnect``): a dead
        connection must not keep its place in the queue and then take a token."""
        node = self.node
        exempt = node.connection_bypass.matches(peer.rsplit(":", 1)[0])
        left = False
        refused: errors.TenantKVError | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal left
                await trio.lowlevel.wait_readable(stream.socket)
                with contextlib.suppress(OSError):
                    if await stream.socket.recv(1, socket.MSG_PEEK) != b"":
                        return  # it sent its hello early: keep waiting for a token
                left = True
                nursery.cancel_scope.cancel()  # gives the queued token back

            nursery.start_soon(watch)
            try:
                await node.connection_limiter.acquire(exempt=exempt)
            except errors.TenantKVError as exc:
                refused = exc  # raised outside the nursery, not as an exception group
            nursery.cancel_scope.cancel()
        if refused is not None:
            raise refused
        if left:
            node.connections_left_in_queue += 1
            log.info("connection from %s: left while queued for establishment", peer)
        return not left

    async def _refuse(
        self, conn: trio.abc.Stream, door: Callable[[], Codec], exc: errors.TenantKVError
    ) -> None:
        """Send a connection-level error in the door's protocol and close; at most a
        second."""
        self.node.connections_rejected += 1
        gone = (trio.BrokenResourceError, trio.ClosedResourceError)
        with trio.move_on_after(1), contextlib.suppress(*gone):
            await conn.send_all(door().refusal(exc))
        with trio.CancelScope(shield=True), trio.move_on_after(1), contextlib.suppress(*gone):
            await conn.aclose()

    async def _tls_handshake(
        self, raw: trio.SocketStream, tls: trio.SSLStream[trio.SocketStream], peer: str
    ) -> bool:
        """Complete the TLS handshake within ``hello_timeout_secs``; False (logged) if not.

        A client that sends plain MessagePack instead of a ClientHello gets a
        plain ProtocolError saying that TLS is required.
        """
        timeout = self.node.config.hello_timeout_secs
        with trio.move_on_after(timeout):
            try:
                first = await raw.socket.recv(1, socket.MSG_PEEK)
                if not first:
                    return False
                if first[0] != TLS_HANDSHAKE_RECORD:
                    log.info("connection from %s: plain request on a TLS port; closing", peer)
                    await raw.send_all(
                        protocol.encode_error(
                            None, errors.ProtocolError("this server requires TLS; connect with TLS")
                        )
                    )
                    return False
                await tls.do_handshake()
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                cause = exc.__cause__ or exc
                log.info("connection from %s: TLS handshake failed: %s", peer, _reason(cause))
                return False
        log.info("connection from %s: no TLS handshake within %gs; closing", peer, timeout)
        return False

    async def _sweep(self) -> None:
        """Enforce the hello, frame and idle deadlines of every session, a few times
        per shortest timeout: sessions never pay for a cancel scope per read."""
        node = self.node
        while True:
            cfg = node.config
            shortest = min(
                cfg.hello_timeout_secs, cfg.frame_timeout_secs, cfg.idle_timeout_secs or math.inf
            )
            await trio.sleep(min(max(shortest / 8, SWEEP_MIN_SECS), SWEEP_MAX_SECS))
            now = trio.current_time()
            for s in list(node.sessions):
                s.expire_if_due(now)


def _new(scopes: list[trio.CancelScope]) -> trio.CancelScope:
    scopes.append(trio.CancelScope())
    return scopes[-1]
