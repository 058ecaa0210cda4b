"""A worker process of ``serve --workers N``: a whole server minus what is node-wide.

The supervisor (:mod:`tenantkv.server.supervisor`) starts each worker as
``python -m tenantkv.server.worker_main FD``, where ``FD`` is the worker's end of
its control channel (:mod:`tenantkv.server.control`). The first message on it
(length-prefixed, read before Trio starts) says which worker this is, the
configuration in force and which inherited descriptors are the listening
sockets. The worker then runs the ordinary :class:`~tenantkv.server.server.Server`
with a :class:`WorkerLink`, which is where a worker differs from a single
process:

- it accepts on the shared listening sockets (the kernel spreads connections);
- it opens the shared LMDB environment without the data directory's lock (the
  supervisor holds it, and this process inherited it);
- after every change to shared state (users, buckets, throttle properties,
  parameters) it tells the supervisor, which tells the other workers to reload
  that state from LMDB (:mod:`tenantkv.server.shared_state`);
- its tenant throttle runs on leases: every slice it reports what its clients
  asked of each bucket and applies the allowance rates the supervisor grants
  it (:mod:`tenantkv.admission.quota_lease`);
- ``server_status`` answers for the node (every worker's document, merged);
- only worker 0 runs the expiry pager and creates the first admin user.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import msgpack
import trio

from tenantkv import errors
from tenantkv.admission.connection_table import Admission
from tenantkv.admission.gate import ParameterTable
from tenantkv.admission.quota_lease import BucketLease, lease_from_wire, usage_to_wire
from tenantkv.admission.rate_limiter import RateLimiter
from tenantkv.config import Config
from tenantkv.server import control_messages as m
from tenantkv.server.auth import (
    HASH_RETRY_SECS,
    LoginEnd,
    LoginLimiterStatistics,
    LoginSettings,
    LoginStart,
)
from tenantkv.server.control import Channel, ChannelClosed, Dispatch
from tenantkv.server.node import Announcement, Listeners
from tenantkv.server.remote_writer import RemoteWriter
from tenantkv.server.role import (
    admission_limits,
    bootstrap,
    hello_limits,
)

if TYPE_CHECKING:
    from tenantkv.server.node import Node
    from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.server")

#: The init message is length-prefixed (4 bytes, big-endian): it is read with a
#: blocking socket before Trio starts, and nothing after it may be consumed.
INIT_HEADER = struct.Struct(">I")
#: Connection ids are the node's: a worker's own id times this, plus its index.
MAX_WORKERS = 256
#: One-way messages waiting to be sent; beyond this they are dropped (counted).
OUTBOX_SIZE = 10_000
#: A token bucket's rate must be positive: an idle worker's share is at least this.
MIN_RATE = 1e-3
#: The node-wide rate limiters a worker runs a share of: name -> the setting
#: that holds the node's rate.
RATE_LIMITERS = {
    "request": "ingress_request_admission_rate_per_sec",
    "establishment": "ingress_connection_establishment_rate_per_sec",
}


class WorkerLink:
    """A worker's :class:`~tenantkv.server.role.Role`: its side of the control
    channel, and what it was told at start."""

    shared_storage = True

    def __init__(self, init: m.Init, sock: socket.socket, write_sock: socket.socket) -> None:
        self.index = init.index
        self.listen_fds = list(init.listen_fds)
        self.resp_fds = list(init.resp_fds)
        self.expiry_pager = init.expiry_pager
        self.workers = init.workers
        self._sock = sock
        self._channel: Channel | None = None
        self._write_sock = write_sock
        self._writes: Channel | None = None
        self._report_soon = trio.Event()
        #: leases applied and calls that failed (the status document reads them)
        self.leases_applied = 0
        self.lease_failures = 0
        #: one-way messages from synchronous code (a login outcome, a closed
        #: connection), sent in order by one task; bounded, as everything is
        self._outbox_in, self._outbox = trio.open_memory_channel[m.ControlMessage](OUTBOX_SIZE)
        self.outbox_dropped = 0
        #: this worker's fraction of each node-wide rate limiter (rate_share)
        self.rate_shares: dict[str, float] = dict.fromkeys(RATE_LIMITERS, 1.0 / self.workers)
        self._attempted: dict[str, int] = dict.fromkeys(RATE_LIMITERS, 0)
        self._demand_at = 0.0

    @property
    def channel(self) -> Channel:
        """Made on first use, in Trio (the bootstrap may write before ``run``)."""
        if self._channel is None:
            self._sock.setblocking(False)
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(self._sock))
            self._channel = Channel(stream, f"worker {self.index}")
        return self._channel

    @property
    def writes(self) -> Channel:
        """The write link (:mod:`tenantkv.server.write_link`): this worker's
        write messages and their answers, served off the supervisor's event
        loop. Made on first use, in Trio."""
        if self._writes is None:
            self._write_sock.setblocking(False)
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(self._write_sock))
            self._writes = Channel(stream, f"worker {self.index} writes")
        return self._writes

    @property
    def bootstraps(self) -> bool:
        """Worker 0 creates the first admin user and drops dangling roles: once."""
        return self.index == 0

    # -- the role -------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        return {"worker": self.index}

    def figures(self) -> dict[str, Any]:
        return {"leases": {"applied": self.leases_applied, "failed": self.lease_failures}}

    async def listen(self, config: Config) -> Listeners:
        """The sockets the supervisor opened for this worker, inherited."""
        return Listeners(_listeners(self.listen_fds), _listeners(self.resp_fds))

    async def load(self, node: Node, nursery: trio.Nursery) -> None:
        # The link carries this worker's writes: it runs before any.
        await nursery.start(self.run, node)
        if self.bootstraps:
            await bootstrap(node)
        if self.expiry_pager:
            nursery.start_soon(node.expiry_pager.run)

    def start_metrics(self, node: Node) -> int | None:
        """The supervisor serves the node's ``/metrics``."""
        return None

    async def announce(self, node: Node, where: Announcement, ready_file: str | None) -> None:
        """The supervisor says "listening on" once every worker serves."""
        tls = " (TLS)" if where.tls else ""
        log.info("worker %d serving on %s:%d%s", self.index, where.host, where.port, tls)
        await self.ready(where.host, where.port, where.resp_port)

    async def status(self, node: Node) -> dict[str, Any]:
        return await self.node_status()

    async def move_slots(self, session: Any, drain: list[str], params: dict[str, Any]) -> Any:
        """A rebalance: cluster nodes only (a cluster node has no workers)."""
        raise errors.BadValue("this node is in no cluster")

    async def drain(self, node: Node) -> None:
        """Writes still waiting for the node's writer get their answers before the
        link goes (a bound: the supervisor may be gone)."""
        with trio.move_on_after(node.config.shutdown_grace_secs):
            await node.drain_writes()

    def writer(self, node: Node) -> RemoteWriter:
        """The node's one writer, in the supervisor, commits."""
        return RemoteWriter(node.engine, lambda: self.writes, node._deliver, taken=node._taken)

    def bind_parameters(self, table: ParameterTable) -> None:
        self.share_rate_parameters(table)

    async def run(self, node: Node, task_status: trio.TaskStatus[None]) -> None:
        """Serve the channel and keep the throttle's lease fresh, until the
        supervisor goes away — then stop the server: a worker never outlives it."""
        node.accounts.gate = RemoteLoginGate(self)
        # Client-side caching: the supervisor sends other workers' changes only
        # while some connection here tracks (in order, through the outbox).
        node.tracking.on_active = lambda active: self._post(m.Tracking(active))
        node.accounts.persist_known_good = False  # the supervisor writes them
        self.apply_rate_shares(node)
        # Provisional shares (1/N) until the first lease: never a whole node's worth.
        node.throttle.apply_lease({}, workers=self.workers)
        async with trio.open_nursery() as nursery:
            if isinstance(node.writer, RemoteWriter):
                nursery.start_soon(node.writer.run)
            nursery.start_soon(self._lease_loop, node)
            nursery.start_soon(self._send_outbox)
            nursery.start_soon(self._serve_writes, nursery)
            task_status.started()
            await self.channel.run(self.dispatch(node))
            log.warning("worker %d: the supervisor went away; stopping", self.index)
            nursery.cancel_scope.cancel()
        node.request_stop()

    async def _serve_writes(self, nursery: trio.Nursery) -> None:
        """Read the write link's answers; when it closes (the supervisor is gone,
        or gave up on this worker) the worker stops, as when its channel closes:
        its writes could no longer be committed."""
        await self.writes.run({})
        log.warning("worker %d: the write link closed; stopping", self.index)
        nursery.cancel_scope.cancel()

    async def ready(self, host: str, port: int, resp_port: int | None) -> None:
        await self.channel.send(m.Ready(host, port, resp_port))

    async def changed(self) -> None:
        """Shared state changed here (and is committed): returns once every other
        worker has reloaded it (or could not: see the supervisor), so the change
        is the node's when the command that made it answers."""
        with contextlib.suppress(ChannelClosed):
            await self.channel.call(m.Changed(self.index))

    def sharing(self, op: WriteOp) -> contextlib.AbstractAsyncContextManager[None]:
        """The node's storage is the only copy: nothing to change first."""
        return contextlib.nullcontext()

    async def node_status(self) -> dict[str, Any]:
        """The node's status document: the supervisor merges every worker's (this
        one's included) with what only it knows (status.node_document)."""
        return (await self.channel.call(m.NodeStatus())).document

    # -- the node's connection table, in the supervisor ------------------------------

    def node_conn_id(self, conn_id: int) -> int:
        return conn_id * MAX_WORKERS + self.index

    async def admit_connection(self, node: Node, conn_id: int, addr: str) -> Admission:
        limits = admission_limits(node.config)
        try:
            answer = await self.channel.call(
                m.ConnAdmit(self.node_conn_id(conn_id), addr, **limits)
            )
        except ChannelClosed:
            return Admission(True)  # the supervisor is gone: this worker stops anyway
        evict = answer.evict
        return Admission(answer.ok, None if evict is None else evict // MAX_WORKERS, answer.reason)

    async def connection_authenticated(
        self, node: Node, conn_id: int, *, admin: bool
    ) -> str | None:
        limits = hello_limits(node.config)
        try:
            answer = await self.channel.call(
                m.ConnAuth(self.node_conn_id(conn_id), admin=admin, **limits)
            )
        except ChannelClosed:
            return None
        return answer.refused

    def connection_closed(self, node: Node, conn_id: int) -> None:
        self._post(m.ConnClosed(self.node_conn_id(conn_id)))

    def post(self, msg: m.ControlMessage) -> None:
        """Send ``msg`` one-way, in order, from synchronous code."""
        self._post(msg)

    def _post(self, msg: m.ControlMessage) -> None:
        try:
            self._outbox_in.send_nowait(msg)
        except trio.WouldBlock:
            self.outbox_dropped += 1

    async def _send_outbox(self) -> None:
        async for msg in self._outbox:
            try:
                await self.channel.send(msg)
            except ChannelClosed:
                return

    # -- node-wide rate limiters ----------------------------------------------------

    def _limiter_demand(self, node: Node) -> dict[str, float]:
        """What each limiter saw attempted since the last report, per second, as a
        fraction of the node's rate (the rate is a runtime parameter: the workers
        know its value, the supervisor's copy of the config may not)."""
        now = trio.current_time()
        elapsed = max(now - self._demand_at, 1e-3)
        self._demand_at = now
        demand = {}
        for name, limiter in self._limiters(node).items():
            attempted = limiter.statistics().attempted
            per_sec = (attempted - self._attempted[name]) / elapsed
            self._attempted[name] = attempted
            demand[name] = per_sec / max(getattr(node.config, RATE_LIMITERS[name]), MIN_RATE)
        return demand

    def apply_rate_shares(self, node: Node) -> None:
        """Run each node-wide limiter at this worker's share of the node's rate."""
        for name, limiter in self._limiters(node).items():
            rate = getattr(node.config, RATE_LIMITERS[name]) * self.rate_shares[name]
            limiter.configure(rate_per_sec=max(rate, MIN_RATE))

    def share_rate_parameters(self, table: ParameterTable) -> None:
        """set_parameter of a node-wide rate applies this worker's share of it."""
        for name, setting in RATE_LIMITERS.items():
            apply = table.get(setting)
            if apply is not None:

                def shared(value: Any, apply: Any = apply, name: str = name) -> None:
                    apply(max(value * self.rate_shares[name], MIN_RATE))

                table[setting] = shared

    @staticmethod
    def _limiters(node: Node) -> dict[str, RateLimiter]:
        return {"request": node.request_limiter, "establishment": node.connection_limiter}

    def report_soon(self) -> None:
        """The throttle saw a demand event (a first connection, a newly hungry
        bucket): report now instead of at the end of the slice."""
        self._report_soon.set()

    async def _lease_loop(self, node: Node) -> None:
        throttle = node.throttle
        throttle.on_demand_event = self.report_soon
        while True:
            with trio.move_on_after(throttle.slice_secs):
                await self._report_soon.wait()
            self._report_soon = trio.Event()
            try:
                answer = await self.channel.call(
                    m.Usage(usage_to_wire(throttle.usage()), self._limiter_demand(node))
                )
                lease = lease_from_wire(answer.lease)
                shares = answer.rate_shares
                if shares.keys() == RATE_LIMITERS.keys() and shares != self.rate_shares:
                    self.rate_shares = {k: float(v) for k, v in shares.items()}
                    self.apply_rate_shares(node)
            except (ChannelClosed, KeyError, ValueError) as exc:
                # Keep the last lease: it still sums to no more than the node's limits.
                self.lease_failures += 1
                log.warning("worker %d: no lease this slice: %s", self.index, exc)
                continue
            self._apply_lease(node, lease)

    def _apply_lease(self, node: Node, lease: dict[str, BucketLease]) -> None:
        node.throttle.apply_lease(lease, workers=self.workers)
        self.leases_applied += 1
        node.gate.wake()

    # -- what the supervisor sends -----------------------------------------------

    def dispatch(self, node: Node) -> Dispatch:
        """This worker's handlers of :attr:`HANDLERS`, bound to it and its node."""
        return {cls: partial(fn, self, node) for cls, fn in self.HANDLERS.items()}

    async def _on_refresh(self, node: Node, msg: m.Refresh) -> m.Done:
        from tenantkv.server import shared_state

        shared_state.reload(node)
        return m.Done()

    async def _on_status(self, node: Node, msg: m.Status) -> m.StatusReply:
        from tenantkv.server.status import status_document

        return m.StatusReply(status_document(node), time.monotonic())

    async def _on_lease(self, node: Node, msg: m.Lease) -> None:
        self._apply_lease(node, lease_from_wire(msg.lease))

    async def _on_expiry(self, node: Node, msg: m.Expiry) -> None:
        node.expiry_pager.expiry_written(msg.ms)

    async def _on_evict(self, node: Node, msg: m.Evict) -> None:
        node.evict_connection(msg.conn // MAX_WORKERS)

    async def _on_reload_config(self, node: Node, msg: m.ReloadConfig) -> None:
        node.reload_config(Config().with_values(msg.config, source="the config file"))

    async def _on_invalidate(self, node: Node, msg: m.Invalidate) -> m.Done:
        node.tracking.changed((bucket, keys) for bucket, keys in msg.changes)
        return m.Done()

    #: Every message the supervisor sends (but init) and its handler.
    HANDLERS: ClassVar[dict[type[m.ControlMessage], Callable[..., Awaitable[m.Reply | None]]]] = {
        m.Refresh: _on_refresh,
        m.Status: _on_status,
        m.Lease: _on_lease,
        m.Expiry: _on_expiry,
        m.Evict: _on_evict,
        m.ReloadConfig: _on_reload_config,
        m.Invalidate: _on_invalidate,
    }


class RemoteLoginGate:
    """The node's login limiter, in the supervisor (:class:`accounts.LoginGate`):
    every login of every worker asks it, so the node has one delay per pair and
    one hash pool, exactly. A login's ticket here is this worker's call id."""

    def __init__(self, link: WorkerLink) -> None:
        self._link = link
        self._ids = itertools.count(1)
        #: the supervisor's figures, as of the last login (status asks the supervisor)
        self._stats = LoginLimiterStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    async def begin(
        self, source: str, user: str | None, s: LoginSettings, *, cached: bool
    ) -> LoginStart:
        login = next(self._ids)
        msg = m.LoginBegin(login, source, user, cached, s.to_wire())
        try:
            answer = await self._link.channel.call(msg)
        except ChannelClosed:  # the supervisor is gone (this worker stops) or slow
            self.cancel(login)
            return LoginStart("refused", retry_after=HASH_RETRY_SECS, reason="busy")
        except BaseException:
            self.cancel(login)
            raise
        status = answer.status
        return LoginStart(
            status,
            login if status == "run" else 0,
            answer.retry_after,
            answer.reason,
            answer.known,
        )

    async def end(
        self, ticket: int, source: str, user: str | None, ok: bool, s: LoginSettings
    ) -> LoginEnd:
        msg = m.LoginEnd(ticket, source, user, ok, s.to_wire())
        try:
            answer = await self._link.channel.call(msg)
        except ChannelClosed:
            self.cancel(ticket)
            return LoginEnd(s.delay(1) if not ok else 0.0)
        except BaseException:
            self.cancel(ticket)  # its slot must not outlive the login
            raise
        return LoginEnd(answer.hold, limited=answer.limited)

    def cancel(self, ticket: int) -> None:
        if ticket:
            self._link.post(m.LoginCancel(ticket))

    def statistics(self, s: LoginSettings) -> LoginLimiterStatistics:
        return self._stats


def read_init(sock: socket.socket) -> m.Init:
    """The supervisor's first message (blocking, before Trio runs)."""

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise SystemExit("tenantkv worker: the supervisor closed the channel at start")
            buf += chunk
        return buf

    (size,) = INIT_HEADER.unpack(exactly(INIT_HEADER.size))
    wire = msgpack.unpackb(exactly(size), strict_map_key=False)
    if not isinstance(wire, dict) or wire.get("type") != m.Init.TYPE:
        raise SystemExit("tenantkv worker: the first control message must be init")
    return m.Init.from_wire(wire)


def _listeners(fds: Sequence[int]) -> list[trio.SocketListener]:
    return [
        trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd))) for fd in fds
    ]
