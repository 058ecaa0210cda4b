"""The listener and the server's lifecycle: start, serve, shut down gracefully.

Shutdown (SIGINT/SIGTERM or ``Server.shutdown``): stop accepting, tell every
session to stop reading, give in-flight requests ``shutdown_grace_secs`` to
finish, cancel what is left, let the writer commit everything queued, close
LMDB. Anything acknowledged is on disk before the process exits.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from itertools import count
from typing import Any

import trio

from tenantkv import errors, protocol
from tenantkv.admission.throughput_probing import run_probing
from tenantkv.config import Config
from tenantkv.server.node import Node
from tenantkv.server.session import Session
from tenantkv.storage.engine import Engine

log = logging.getLogger("tenantkv.server")


def open_engine(config: Config) -> Engine:
    return Engine(
        config.data_dir,
        map_size=config.map_size_mb * 1024 * 1024,
        max_map_size=config.max_map_size_mb * 1024 * 1024,
        sync=config.durability == "fsync",
        max_buckets=config.max_buckets,
    )


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.engine = open_engine(config)
        self.node = Node(config, self.engine)
        self._ids = count(1)
        self._stop = trio.Event()
        self.listeners: list[trio.SocketListener] = []
        self.metrics_port: int | None = None

    def shutdown(self) -> None:
        self._stop.set()

    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
        ready_file: str | None = None,
        handle_signals: bool = False,
    ) -> None:
        node = self.node
        try:
            node.start()
            await node.bootstrap_admin()
            self.listeners = await trio.open_tcp_listeners(self.config.port, host=self.config.host)
            sockname = self.listeners[0].socket.getsockname()
            node.host, node.port = sockname[0], sockname[1]
            if self.config.metrics_port is not None:
                from tenantkv.metrics import start_metrics_server

                self.metrics_port = start_metrics_server(node, self.config.metrics_port)
            async with trio.open_nursery() as outer:
                if handle_signals:
                    outer.start_soon(self._watch_signals)
                outer.start_soon(self._expiry_pager)
                outer.start_soon(run_probing, node.prober)
                await outer.start(node.permits.run)
                async with trio.open_nursery() as sessions:
                    accept_scope = trio.CancelScope()
                    for listener in self.listeners:
                        sessions.start_soon(self._accept_loop, listener, sessions, accept_scope)
                    log.info("listening on %s:%d", node.host, node.port)
                    if ready_file:
                        _write_ready_file(ready_file, node.host, node.port, self.metrics_port)
                    task_status.started(self)
                    await self._stop.wait()
                    log.info(
                        "shutting down: no new connections, %d sessions finishing",
                        len(node.sessions),
                    )
                    node.shutting_down = True
                    accept_scope.cancel()
                    for listener in self.listeners:
                        await listener.aclose()
                    for s in list(node.sessions):
                        s.begin_shutdown()
                    with trio.move_on_after(self.config.shutdown_grace_secs):
                        if node.sessions:
                            await node.no_sessions.wait()
                    sessions.cancel_scope.cancel()
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await node.stop_writer()
            self.engine.close()
            log.info("stopped; storage closed")

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self.shutdown()
                return

    async def _accept_loop(
        self, listener: trio.SocketListener, nursery: trio.Nursery, scope: trio.CancelScope
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
                nursery.start_soon(self._run_session, stream)

    async def _run_session(self, stream: trio.SocketStream) -> None:
        node = self.node
        try:
            peer = "{}:{}".format(*stream.socket.getpeername()[:2])
        except OSError:
            peer = "?"
        if len(node.sessions) >= self.config.max_connections or node.shutting_down:
            node.connections_rejected += 1
            exc: errors.TenantKVError = (
                errors.ShuttingDown("the server is stopping")
                if node.shutting_down
                else errors.TooManyConnections(
                    f"max_connections={self.config.max_connections} reached"
                )
            )
            with trio.move_on_after(1):
                try:
                    await stream.send_all(protocol.encode_error(None, exc))
                    await stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            return
        if node.config.ingress_connection_establishment_rate_limiter_enabled:
            # Before the first read: a connection storm queues here (bounded),
            # and what does not fit is refused, so established clients go on.
            try:
                await node.connection_limiter.acquire(
                    exempt=node.connection_bypass.matches(peer.rsplit(":", 1)[0])
                )
            except errors.TenantKVError as refused:
                node.connections_rejected += 1
                with trio.move_on_after(1):
                    try:
                        await stream.send_all(protocol.encode_error(None, refused))
                        await stream.aclose()
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                return
        node.connections_total += 1
        await Session(node, stream, peer, next(self._ids)).run()

    async def _expiry_pager(self) -> None:
        """Reclaim expired records from disk; reads already hide them."""
        from tenantkv.storage.ops import ExpireDueOp

        while True:
            await trio.sleep(self.config.expiry_pager_interval_secs)
            while True:
                op = ExpireDueOp()
                result = await self.node.write(op)
                if result["scanned"] < op.limit:
                    break


def _write_ready_file(path: str, host: str, port: int, metrics_port: int | None) -> None:
    data: dict[str, Any] = {
        "host": host,
        "port": port,
        "metrics_port": metrics_port,
        "pid": os.getpid(),
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
