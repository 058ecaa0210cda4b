"""The supervisor of ``serve --workers N``: one server made of N worker processes.

Python runs one event loop per process, so a node uses more than one core only
as several processes. The supervisor makes them one server from outside:

- **One port.** It opens the listening sockets (the MessagePack port and the
  RESP door) and every worker inherits them and accepts on them; the kernel
  hands each connection to one worker.
- **One data directory.** It takes the data directory's lock and the workers
  inherit it, so a second server is refused while any of them lives; they
  all open the one LMDB environment (LMDB serialises write transactions across
  processes; each worker's group commit fills its transaction while another
  worker's commit holds the lock — docs/scaling.md).
- **One set of limits.** It keeps the node's tenant quota: each worker reports
  per slice what its clients asked of each bucket and gets allowance rates back
  (:mod:`tenantkv.admission.quota_lease`).
- **One state.** A worker that changes users, buckets, throttle properties or
  parameters says so; the supervisor tells the others to reload them
  (:mod:`tenantkv.server.shared_state`).
- **One view.** ``server_status`` and ``/metrics`` merge every worker's
  document (:func:`tenantkv.server.status.node_document`).
- **Lifecycle.** Worker 0 starts first (it creates the first admin user);
  the ready file is written and ``listening on`` logged once every worker
  serves. SIGTERM/SIGINT drain every worker; SIGHUP re-reads the config file
  and hands it to every worker; a worker that dies is logged and restarted
  (with a growing pause if it keeps dying) while the others serve on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, ClassVar

import msgpack
import trio

from tenantkv import errors
from tenantkv.admission import rate_share
from tenantkv.admission.connection_table import ConnectionTable
from tenantkv.admission.quota_lease import QuotaAllocator, lease_to_wire, usage_from_wire
from tenantkv.config import Config
from tenantkv.metrics import Latency
from tenantkv.server import auth, sd_notify
from tenantkv.server import control_messages as m
from tenantkv.server.accounts import LocalLoginGate, known_good_key, stored_known_good
from tenantkv.server.control import Channel, ChannelClosed, Dispatch
from tenantkv.server.node import Announcement
from tenantkv.server.node_figures import POLL_SECS, WorkerFigures, throttle_figures
from tenantkv.server.role import (
    announce_listening,
    resp_listen_error,
    write_ready_file,
)
from tenantkv.server.server import freeze_gc, open_engine, server_ssl_context
from tenantkv.server.shared_state import stored_throttle_props
from tenantkv.server.tracking import changes_of
from tenantkv.server.worker import INIT_HEADER, MAX_WORKERS, RATE_LIMITERS
from tenantkv.server.write_link import WriteLinkServer
from tenantkv.storage.engine import lock_data_dir
from tenantkv.storage.group_commit import GroupCommitWriter, Pending
from tenantkv.storage.op_wire import RemoteBatchOp, failed_outcome, item_from_wire
from tenantkv.storage.ops import CreateBucketOp, DropBucketOp, ExpireDueOp, PutSystemOp, WriteOp

log = logging.getLogger("tenantkv.supervisor")

#: A worker that dies is restarted after this pause, doubled while it keeps
#: dying within RESTART_RESET_SECS of its start, up to RESTART_MAX_SECS.
RESTART_MIN_SECS = 0.2
RESTART_MAX_SECS = 10.0
RESTART_RESET_SECS = 30.0


def usable_cores() -> int:
    """What ``--workers auto`` means: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class WorkerStartError(Exception):
    """A worker died before it served (its own log line says why)."""


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    process: trio.Process | None = None
    channel: Channel | None = None
    #: its writes' link to the node's writer (tenantkv.server.write_link)
    write_link: WriteLinkServer | None = None
    ready: trio.Event = dataclasses.field(default_factory=trio.Event)
    started: float = 0.0
    restarts: int = 0


class Supervisor:
    def __init__(
        self,
        config: Config,
        workers: int,
        *,
        reload_config: Callable[[], Config] | None = None,
    ) -> None:
        self.config = config
        self.count = workers
        self._reload_config = reload_config
        server_ssl_context(config)  # a bad certificate stops the node here, not N workers
        # The data directory's lock, for the life of the node: the workers inherit it.
        self._lock_fd = lock_data_dir(config.data_dir)
        os.set_inheritable(self._lock_fd, True)
        # The supervisor reads the shared properties (never user data) for the
        # quota allocator; the engine also creates a new directory's files once.
        self.engine = open_engine(config, shared=True)
        self.workers = [_Worker(i) for i in range(workers)]
        self.allocator: QuotaAllocator
        #: per worker, its listening sockets (one per address) of each door
        self.listen_socks: list[list[socket.socket]] = []
        self.resp_socks: list[list[socket.socket]] = []
        self.stopping = False
        self.metrics_port: int | None = None
        #: the node's connection table (every worker's connections)
        self.table = ConnectionTable()
        #: the node's login limiter: every worker's logins ask it (RemoteLoginGate)
        limiter = auth.LoginLimiter(trio.current_time)
        limiter.load_known_good(stored_known_good(self.engine))
        self.login_gate = LocalLoginGate(limiter)
        #: logins holding a ticket or waiting for one: (worker, its call id) ->
        #: ticket (0 while waiting), and the scope a cancel stops a wait with
        self._logins: dict[tuple[int, int], int] = {}
        self._login_waits: dict[tuple[int, int], trio.CancelScope] = {}
        self._login_settings = auth.LoginSettings()
        #: node connection ids in the table, per worker (dropped if it dies)
        self._conns: dict[int, set[int]] = {w.index: set() for w in self.workers}
        #: workers where a connection tracks keys (client-side caching): only they
        #: are sent each commit's changed keys
        self._tracking: set[int] = set()
        #: each worker's latest demand on each node-wide rate limiter
        self._limiter_demand: dict[str, dict[str, float]] = {}
        #: the node's one group-commit writer: every worker's writes share its
        #: commits (tenantkv.server.remote_writer)
        self.writer = GroupCommitWriter(
            self.engine, self._deliver_threadsafe, gather_when_busy=True
        )
        self.writer.expiry_observers.append(self._expiry_written_threadsafe)
        self.latency = Latency(self.writer)
        self._token: trio.lowlevel.TrioToken | None = None
        #: why the node could not start (a worker died before it served)
        self.start_error: str | None = None
        #: the workers' latest documents and the counts of those that died
        self.figures = WorkerFigures()
        self._started = time.monotonic()

    async def run(self, ready_file: str | None = None) -> None:
        with contextlib.ExitStack() as stack:
            signals = stack.enter_context(
                trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            )
            self.allocator = QuotaAllocator(stored_throttle_props(self.engine))
            await self._listen()
            self._token = trio.lowlevel.current_trio_token()
            self.writer.start()
            try:
                async with trio.open_nursery() as outer:
                    outer.start_soon(self._watch_signals, signals)
                    outer.start_soon(self._poll_figures)
                    async with trio.open_nursery() as nursery:
                        await self._start(nursery, ready_file)
                    outer.cancel_scope.cancel()
            finally:
                # Every worker is gone: commit what they queued, then stop.
                with trio.CancelScope(shield=True):
                    self.writer.stop()
                    await trio.to_thread.run_sync(self.writer.join)
        self.engine.close()
        os.close(self._lock_fd)
        if self.start_error is not None:
            raise WorkerStartError(self.start_error)
        log.info("stopped: every worker exited")

    async def _start(self, nursery: trio.Nursery, ready_file: str | None) -> None:
        cfg = self.config
        if cfg.metrics_port is not None:
            from tenantkv.metrics import start_metrics_server

            self.metrics_port = start_metrics_server(
                self.node_status,
                cfg.metrics_port,
                addr=cfg.metrics_host,
                healthy=lambda: not self.stopping,
            )
        # Worker 0 first: it creates the first admin user (once).
        for w in self.workers:
            await nursery.start(self._keep_worker, w)
            if self.start_error is not None:
                return
        host, port = self.listen_socks[0][0].getsockname()[:2]
        resp_port = self.resp_socks[0][0].getsockname()[1] if self.resp_socks else None
        tls = self.config.tls_cert_file is not None
        where = Announcement(host, port, resp_port, self.metrics_port, tls, cfg.metrics_host)
        announce_listening(where, workers=self.count)
        if ready_file:
            write_ready_file(ready_file, where)
        # The node's writer runs here: the decoded writes waiting for a commit
        # (a thousand and more under load) would set off a collection every few
        # hundred writes, as in one process (which does the same).
        freeze_gc()
        sd_notify.ready(f"listening on {host}:{port} ({self.count} workers)")

    async def _listen(self) -> None:
        cfg = self.config
        self.listen_socks = await _reuseport_listeners(cfg.host, cfg.port, self.count)
        if cfg.resp_enabled:
            try:
                self.resp_socks = await _reuseport_listeners(cfg.host, cfg.resp_port, self.count)
            except OSError as exc:
                raise resp_listen_error(cfg, exc) from exc

    # -- workers ------------------------------------------------------------------

    async def _keep_worker(self, w: _Worker, task_status: trio.TaskStatus[None]) -> None:
        """Run worker ``w`` and restart it whenever it dies, until the node stops."""
        pause = RESTART_MIN_SECS
        first = True
        while not self.stopping:
            code = await self._run_worker(w, task_status if first else None)
            first = False
            if self.stopping:
                return
            alive = trio.current_time() - w.started
            pause = (
                RESTART_MIN_SECS if alive > RESTART_RESET_SECS else min(pause * 2, RESTART_MAX_SECS)
            )
            w.restarts += 1
            log.error(
                "worker %d exited with %s; restarting it in %.1fs (restart %d)",
                w.index,
                _exit_reason(code),
                pause,
                w.restarts,
            )
            self._forget(w)
            await trio.sleep(pause)

    async def _spawn(self, w: _Worker) -> tuple[trio.Process, socket.socket]:
        """Start worker ``w``'s process and its write link, and send it its init
        message: the process, and the supervisor's end of its control channel."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.set_inheritable(True)
        # The worker's writes have their own link, served off the event loop.
        writes, their_writes = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        their_writes.set_inheritable(True)
        mine_listen = self.listen_socks[w.index]
        mine_resp = self.resp_socks[w.index] if self.resp_socks else []
        fds = [s.fileno() for s in (*mine_listen, *mine_resp)]
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        w.ready = trio.Event()
        w.started = trio.current_time()
        argv = [str(theirs.fileno()), str(their_writes.fileno())]
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "tenantkv.server.worker_main", *argv],
                pass_fds=[theirs.fileno(), their_writes.fileno(), self._lock_fd, *fds],
                env=env,
            )
        except BaseException:
            mine.close()
            writes.close()
            raise
        finally:
            theirs.close()
            their_writes.close()
        w.process = process
        w.write_link = WriteLinkServer(writes, f"worker {w.index}", partial(self._write_direct, w))
        w.write_link.start()
        init = msgpack.packb(
            m.Init(
                index=w.index,
                workers=self.count,
                config=dataclasses.asdict(self.config),
                listen_fds=[s.fileno() for s in mine_listen],
                resp_fds=[s.fileno() for s in mine_resp],
                expiry_pager=w.index == 0,
            ).to_wire()
        )
        mine.sendall(INIT_HEADER.pack(len(init)) + init)
        return process, mine

    async def _run_worker(self, w: _Worker, task_status: trio.TaskStatus[None] | None) -> int:
        process, mine = await self._spawn(w)
        mine.setblocking(False)
        channel = Channel(
            trio.SocketStream(trio.socket.from_stdlib_socket(mine)), f"worker {w.index}"
        )
        w.channel = channel
        code: int | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(channel.run, self._dispatch(w))
            if task_status is not None:
                # Startup waits for this worker to serve (or to die trying).
                async with trio.open_nursery() as wait:

                    async def ready() -> None:
                        await w.ready.wait()
                        wait.cancel_scope.cancel()

                    async def died() -> None:
                        await process.wait()
                        wait.cancel_scope.cancel()

                    wait.start_soon(ready)
                    wait.start_soon(died)
                if not w.ready.is_set():
                    # Stop the node: the others are stopped, then run() raises.
                    self.start_error = (
                        f"worker {w.index} exited at start ({_exit_reason(process.returncode)})"
                    )
                    self.stopping = True
                    self._signal_workers(signal.SIGTERM)
                    nursery.cancel_scope.cancel()
                task_status.started()
            code = await process.wait()
            nursery.cancel_scope.cancel()
        with contextlib.suppress(OSError):
            await channel.aclose()
        w.channel = None
        if w.write_link is not None:
            w.write_link.close()  # (its writes in the writer's queue still commit)
            w.write_link = None
        if code is None:  # it died at start: the wait above was cancelled
            code = await process.wait()
        return code

    def _forget(self, w: _Worker) -> None:
        """Worker ``w`` died: its leases and connections are gone with it; its
        counts stay the node's."""
        self.figures.died(w.index)
        self.allocator.forget(str(w.index))
        for demand in self._limiter_demand.values():
            demand.pop(str(w.index), None)
        for conn in self._conns[w.index]:
            self.table.closed(conn)
        self._conns[w.index] = set()
        for key in [k for k in self._logins if k[0] == w.index]:
            self._login_cancel(key)
        self._tracking.discard(w.index)

    # -- what workers send ------------------------------------------------------

    def _dispatch(self, w: _Worker) -> Dispatch:
        """The handlers of :attr:`HANDLERS`, bound to the supervisor and worker ``w``."""
        return {cls: partial(fn, self, w) for cls, fn in self.HANDLERS.items()}

    async def _on_usage(self, w: _Worker, msg: m.Usage) -> m.UsageReply:
        usage = usage_from_wire(msg.usage)
        lease = self.allocator.report(str(w.index), usage, trio.current_time())
        # This report may have moved the others' shares (its hunger took from
        # them): they get their new leases now, not at their next reports.
        for name, moved in self.allocator.pending().items():
            other = self.workers[int(name)]
            if other is not w and other.channel is not None:
                with contextlib.suppress(ChannelClosed):
                    await other.channel.send(m.Lease(lease_to_wire(moved)))
        return m.UsageReply(lease_to_wire(lease), self._rate_shares(w, msg.limiters))

    async def _on_conn_auth(self, w: _Worker, msg: m.ConnAuth) -> m.ConnAuthReply:
        refused = self.table.authenticated(
            msg.conn,
            admin=msg.admin,
            max_connections=msg.max_connections,
            reserved_for_admins=msg.reserved_for_admins,
            per_address=msg.per_address,
        )
        if refused is not None:
            self._conns[w.index].discard(msg.conn)
        return m.ConnAuthReply(refused)

    async def _on_conn_closed(self, w: _Worker, msg: m.ConnClosed) -> None:
        self.table.closed(msg.conn)
        self._conns[w.index].discard(msg.conn)

    async def _on_login_cancel(self, w: _Worker, msg: m.LoginCancel) -> None:
        self._login_cancel((w.index, msg.login))

    async def _on_ready(self, w: _Worker, msg: m.Ready) -> None:
        w.ready.set()

    async def _on_changed(self, w: _Worker, msg: m.Changed) -> m.Done:
        self.allocator.set_props(stored_throttle_props(self.engine, self.allocator.props))
        # Answered once every other worker has reloaded: the admin command that
        # made the change returns when the whole node sees it.
        async with trio.open_nursery() as nursery:
            for peer in self._serving(but=w):
                nursery.start_soon(_call_quietly, peer, m.Refresh())
        return m.Done()

    async def _on_node_status(self, w: _Worker, msg: m.NodeStatus) -> m.NodeStatusReply:
        return m.NodeStatusReply(await self.node_status())

    # -- the node's writer ------------------------------------------------------------

    async def _on_write(self, w: _Worker, msg: m.Write) -> m.WriteReply:
        """Commit a worker's writes with everyone else's; answer once durable (a
        write message on the control channel: a worker sends its writes on its
        write link, :meth:`_write_direct`)."""
        decoded, batch = self._decode_write(msg.ops)
        done = trio.Event()
        box: list[Any] = [None, None]

        def callback(result: Any, error: BaseException | None) -> None:
            box[0], box[1] = result, error
            done.set()

        self.writer.submit(batch, callback)
        await done.wait()
        return await self._write_answer(w, decoded, batch, box[0], box[1])

    def _decode_write(self, wires: Any) -> tuple[list[WriteOp], RemoteBatchOp]:
        """A write message's items, as one item of the node's writer."""
        if not isinstance(wires, list):
            raise ValueError("a write message needs a list of ops")
        decoded = [item_from_wire(data, self.engine.bucket) for data in wires]
        for op in decoded:
            if isinstance(op, DropBucketOp):
                op.handle.dropped = True  # writes queued after it find the bucket gone
        return decoded, RemoteBatchOp(decoded)

    def _write_direct(
        self, w: _Worker, wires: Any, answer: Callable[[dict[str, Any]], None]
    ) -> None:
        """A message of worker ``w``'s write link (on the link's thread): queued
        on the node's writer, and answered by the writer's thread once durable
        — the event loop is not on its way. One that creates or drops a bucket,
        or whose commit must first be pushed to tracking clients, is answered
        from the loop (:meth:`_answer_on_loop`)."""
        decoded, batch = self._decode_write(wires)
        on_loop = any(isinstance(op, (CreateBucketOp, DropBucketOp)) for op in decoded)

        def callback(result: Any, error: BaseException | None) -> None:
            if on_loop or (error is None and self._tracking):
                if self._token is not None:
                    with contextlib.suppress(trio.RunFinishedError):
                        self._token.run_sync_soon(
                            trio.lowlevel.spawn_system_task,
                            self._answer_on_loop,
                            w,
                            partial(self._write_answer, w, decoded, batch, result, error),
                            answer,
                        )
                return
            answer(self._write_reply(decoded, batch, result, error).to_wire())

        self.writer.submit_many([Pending(batch, callback, direct=True)])

    async def _answer_on_loop(
        self,
        w: _Worker,
        reply: Callable[[], Awaitable[m.WriteReply]],
        answer: Callable[[dict[str, Any]], None],
    ) -> None:
        """Send the write link's answer that :meth:`_write_answer` makes."""
        try:
            wire = (await reply()).to_wire()
            await trio.to_thread.run_sync(answer, wire)
        except Exception:  # (a system task: a failure here must not end the node)
            log.exception("answering worker %d's writes failed", w.index)

    async def _write_answer(
        self,
        w: _Worker,
        decoded: list[WriteOp],
        batch: RemoteBatchOp,
        result: Any,
        error: BaseException | None,
    ) -> m.WriteReply:
        if error is None and self._tracking:
            await self._invalidate(w, decoded)
        return self._write_reply(decoded, batch, result, error)

    def _write_reply(
        self,
        decoded: list[WriteOp],
        batch: RemoteBatchOp,
        result: Any,
        error: BaseException | None,
    ) -> m.WriteReply:
        """The answer to a committed write message: each write's outcome (each
        failed alike when the whole transaction failed); the buckets it created
        or dropped are the supervisor's to know."""
        if error is not None:
            err = (
                error
                if isinstance(error, errors.TenantKVError)
                else errors.InternalError(f"storage failure: {error}")
            )
            return m.WriteReply([failed_outcome(item, err) for item in decoded])
        for handle in batch.created:
            self.engine.buckets[handle.name] = handle
        for item, outcome in zip(decoded, result, strict=True):
            if isinstance(item, DropBucketOp):
                if outcome[1] is None:
                    self.engine.buckets.pop(item.handle.name, None)
                else:
                    item.handle.dropped = False  # the drop did not commit
        return m.WriteReply(result)

    async def _invalidate(self, origin: _Worker, decoded: list[WriteOp]) -> None:
        """Client-side caching: every worker where a connection tracks is told
        what this commit changed — the writing worker only of expiries (it saw
        its writes' keys itself) — and the write is answered once they have
        pushed the invalidations, so no client reads a stale cached value after
        the write is acknowledged."""
        everything = [[b, k] for b, k in changes_of(decoded)]
        expired = [[b, k] for b, k in changes_of(o for o in decoded if isinstance(o, ExpireDueOp))]
        async with trio.open_nursery() as nursery:
            for o in self.workers:
                if o.index not in self._tracking or o.channel is None or not o.ready.is_set():
                    continue
                changes = expired if o is origin else everything
                if changes:
                    nursery.start_soon(_call_quietly, o.channel, m.Invalidate(changes))

    async def _on_tracking(self, w: _Worker, msg: m.Tracking) -> None:
        if msg.active:
            self._tracking.add(w.index)
        else:
            self._tracking.discard(w.index)

    def _deliver_threadsafe(self, batch: list[Pending]) -> None:
        """(The writer's thread) a committed batch: write links' messages are
        answered here, the rest on the event loop."""
        on_loop = []
        for p in batch:
            if not p.direct:
                on_loop.append(p)
                continue
            try:
                p.callback(p.result, p.error)
            except Exception:  # the writer must outlive a failed answer
                log.exception("answering a write message failed")
        if on_loop:
            assert self._token is not None
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._deliver, on_loop)

    @staticmethod
    def _deliver(batch: list[Pending]) -> None:
        for p in batch:
            p.callback(p.result, p.error)

    def _expiry_written_threadsafe(self, expiry_ms: int) -> None:
        """A commit wrote an expiry: the pager (worker 0's) may want to wake earlier."""
        if self._token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._expiry_written, expiry_ms)

    def _expiry_written(self, expiry_ms: int) -> None:
        pager = self.workers[0].channel
        if pager is not None and self.workers[0].ready.is_set():
            trio.lowlevel.spawn_system_task(_send_quietly, pager, m.Expiry(expiry_ms))

    def _serving(self, but: _Worker | None = None) -> list[Channel]:
        return [
            o.channel
            for o in self.workers
            if o is not but and o.channel is not None and o.ready.is_set()
        ]

    async def _on_conn_admit(self, w: _Worker, msg: m.ConnAdmit) -> m.ConnAdmitReply:
        conn = msg.conn
        admitted = self.table.admit(
            conn,
            msg.addr,
            trio.current_time(),
            max_connections=msg.max_connections,
            per_address=msg.per_address,
            reserved_per_address=msg.reserved_per_address,
        )
        if not admitted.ok:
            return m.ConnAdmitReply(False, reason=admitted.reason)
        self._conns[w.index].add(conn)
        evict = admitted.evict
        if evict is not None:
            owner = self.workers[evict % MAX_WORKERS]
            self._conns[owner.index].discard(evict)
            if owner is not w:
                # Another worker holds it: tell that worker to close it.
                if owner.channel is not None:
                    with contextlib.suppress(ChannelClosed):
                        await owner.channel.send(m.Evict(evict))
                evict = None
        return m.ConnAdmitReply(True, evict)

    # -- the node's login limiter ----------------------------------------------------

    async def _on_login_begin(self, w: _Worker, msg: m.LoginBegin) -> m.LoginBeginReply:
        key = (w.index, msg.login)
        s = self._login_settings = auth.LoginSettings.from_wire(msg.settings)
        user = msg.user
        self._logins[key] = 0
        with trio.CancelScope() as scope:
            self._login_waits[key] = scope
            try:
                start = await self.login_gate.begin(
                    msg.source,
                    user if isinstance(user, str) else None,
                    s,
                    cached=msg.cached,
                )
            finally:
                self._login_waits.pop(key, None)
        if scope.cancelled_caught or start.status != "run":
            self._logins.pop(key, None)
        else:
            self._logins[key] = start.ticket
        if scope.cancelled_caught:
            return m.LoginBeginReply("refused", auth.HASH_RETRY_SECS, "busy")
        return m.LoginBeginReply(start.status, start.retry_after, start.reason, start.known)

    async def _on_login_end(self, w: _Worker, msg: m.LoginEnd) -> m.LoginEndReply:
        ticket = self._logins.pop((w.index, msg.login), 0)
        s = self._login_settings = auth.LoginSettings.from_wire(msg.settings)
        name = msg.user if isinstance(msg.user, str) else None
        source = msg.source
        end = self.login_gate.limiter.end(ticket, source, name, msg.ok, s)
        self.login_gate.wake(end.granted)
        if end.persist and name is not None:
            op = PutSystemOp(known_good_key(name, source), {"at": time.time()}, what="login")
            self.writer.submit(op, lambda result, error: None)
        return m.LoginEndReply(end.hold, end.limited)

    def _login_cancel(self, key: tuple[int, int]) -> None:
        scope = self._login_waits.get(key)
        if scope is not None:
            scope.cancel()  # still waiting for a slot: the wait frees its place
            return
        ticket = self._logins.pop(key, 0)
        if ticket:
            self.login_gate.cancel(ticket)

    def _rate_shares(self, w: _Worker, limiters: dict[str, float]) -> dict[str, float]:
        """This worker's fraction of each node-wide rate limiter (rate_share)."""
        shares = {}
        for name, demand in limiters.items():
            if name not in RATE_LIMITERS:
                continue
            demands = self._limiter_demand.setdefault(name, {})
            demands[str(w.index)] = float(demand)
            for other in self.workers:
                demands.setdefault(str(other.index), 0.0)
            # Demands come as fractions of the node's rate: split a rate of 1.
            shares[name] = rate_share.split(1.0, demands)[str(w.index)]
        return shares

    async def _documents(self) -> list[m.StatusReply]:
        """Every serving worker's status document, asked for in parallel; each is
        kept as that worker's latest (its counts outlive it: node_figures)."""
        docs: dict[int, tuple[Channel, m.StatusReply]] = {}

        async def one(w: _Worker) -> None:
            channel = w.channel
            if channel is None or not w.ready.is_set():
                return
            with contextlib.suppress(ChannelClosed):
                answer = await channel.call(m.Status())
                if w.channel is channel:  # not a worker that died meanwhile
                    docs[w.index] = (channel, answer)
                    self.figures.seen(w.index, answer.status)

        async with trio.open_nursery() as nursery:
            for w in self.workers:
                nursery.start_soon(one, w)
        # A worker that died since it answered has its counts retired already.
        return [doc for i, (ch, doc) in sorted(docs.items()) if self.workers[i].channel is ch]

    async def node_status(self) -> dict[str, Any]:
        """The node's status document (``/metrics`` and ``server_status`` read it).

        Its ``uptime_secs`` is the mean instant at which the workers read their
        counts, not the moment the last answer arrived: a rate taken between two
        documents divides summed counts by the difference of their stamps, and
        a worker or a supervisor held up on a loaded machine would otherwise
        stretch or shrink that window by the hold-up (a rate off by a tenth over
        two seconds)."""
        answers = await self._documents()
        if not answers:
            return {}
        read_at = sum(a.at for a in answers) / len(answers)
        return self.figures.document([a.status for a in answers], self._node_parts(read_at))

    async def _poll_figures(self) -> None:
        """Read every worker's document now and then: what a worker that dies
        takes with it is at most this much of its counts."""
        while True:
            await trio.sleep(POLL_SECS)
            await self._documents()

    def _node_parts(self, read_at: float) -> dict[str, Any]:
        """The figures only the supervisor knows, in the document's shape (the
        figures the metric catalog declares ``node``), stamped ``read_at``."""
        return {
            "pid": os.getpid(),
            "uptime_secs": round(read_at - self._started, 3),
            "connections": {"table": self.table.statistics().as_dict()},
            "authentication": self.login_gate.statistics(self._login_settings).as_dict(),
            "storage": {"writer": self.writer.statistics()},
            "latency": {"commit": self.latency.commit.status()},
            "throttle": throttle_figures(self.allocator),
            "metrics_listening": (
                f"{self.config.metrics_host}:{self.metrics_port}" if self.metrics_port else None
            ),
        }

    #: Every message a worker sends and its handler.
    HANDLERS: ClassVar[dict[type[m.ControlMessage], Callable[..., Awaitable[m.Reply | None]]]] = {
        m.Ready: _on_ready,
        m.Usage: _on_usage,
        m.Write: _on_write,
        m.ConnAdmit: _on_conn_admit,
        m.ConnAuth: _on_conn_auth,
        m.ConnClosed: _on_conn_closed,
        m.LoginBegin: _on_login_begin,
        m.LoginEnd: _on_login_end,
        m.LoginCancel: _on_login_cancel,
        m.Changed: _on_changed,
        m.NodeStatus: _on_node_status,
        m.Tracking: _on_tracking,
    }

    # -- signals --------------------------------------------------------------------

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                self._reload()
                continue
            if self.stopping:
                log.info("received %s again; already stopping", name)
                continue
            log.info("received %s; stopping %d workers", name, self.count)
            self.stopping = True
            sd_notify.stopping()
            self._signal_workers(signal.SIGTERM)

    def _signal_workers(self, signum: int) -> None:
        for w in self.workers:
            if w.process is not None and w.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.process.send_signal(signum)

    def _reload(self) -> None:
        if self._reload_config is None:
            return
        try:
            config = self._reload_config()
        except Exception as exc:  # a bad file: keep running with what is in force
            log.error("SIGHUP: config not reloaded: %s", exc)
            return
        self.config = config
        log.info("SIGHUP: config reloaded; handing it to %d workers", self.count)
        for w in self.workers:
            if w.channel is not None and w.ready.is_set():
                msg = m.ReloadConfig(dataclasses.asdict(config))
                trio.lowlevel.spawn_system_task(_send_quietly, w.channel, msg)


async def _call_quietly(channel: Channel, msg: m.Call[Any]) -> None:
    """A call whose failure (a worker dying, or stuck past the call timeout)
    holds nobody up: that worker reloads everything when it starts again."""
    with contextlib.suppress(ChannelClosed):
        await channel.call(msg)


async def _send_quietly(channel: Channel, msg: m.ControlMessage) -> None:
    with contextlib.suppress(ChannelClosed):
        await channel.send(msg)


#: Pending connections a worker's listening socket holds (as trio's default).
LISTEN_BACKLOG = 4096


async def _reuseport_listeners(host: str, port: int, workers: int) -> list[list[socket.socket]]:
    """``workers`` listening sockets on each address of ``host``, all on one port
    with ``SO_REUSEPORT``: the kernel spreads new connections over them by a hash
    of the client's address and port, so each worker gets its share of the
    connections — even when a client opens them all at once, which one shared
    socket would hand mostly to whichever worker woke first. A worker that is
    being restarted keeps its socket (the supervisor holds it): connections
    hashed to it wait in its backlog instead of being refused. Port 0: the first
    socket picks the port, the others join it."""
    infos = await trio.socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    # One address per family and address (getaddrinfo may repeat them).
    addrs = list(dict.fromkeys((family, sockaddr[:2]) for family, *_, sockaddr in infos))
    per_worker: list[list[socket.socket]] = [[] for _ in range(workers)]
    try:
        for family, (addr, _) in addrs:
            if port:
                # SO_REUSEPORT would also let this node join the port of another
                # server that uses it: a plain bind first fails if anyone holds it.
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    probe.bind((addr, port))
            for sockets in per_worker:
                sock = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((addr, port))
                port = sock.getsockname()[1]
                sock.listen(LISTEN_BACKLOG)
                sock.set_inheritable(True)
    except OSError:
        for sockets in per_worker:
            for sock in sockets:
                sock.close()
        raise
    return per_worker


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
