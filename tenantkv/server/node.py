"""The node: everything one server process shares — storage, users, buckets, stats.

Sessions and commands reach storage and the user registry only through here.
It lives on the Trio thread; the writer thread hands finished batches back
through ``TrioToken.run_sync_soon`` so every callback runs on the loop.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from tenantkv import errors, metrics
from tenantkv.admission.bucket_queues import BucketQueueGate
from tenantkv.admission.cidr import CidrMatcher
from tenantkv.admission.connection_table import Admission, ConnectionTable
from tenantkv.admission.execution_tickets import Priority, TicketHolder
from tenantkv.admission.gate import ParameterTable, trio_clock
from tenantkv.admission.pipeline import EXEMPTIONS_PARAMETER, Pipeline
from tenantkv.admission.rate_limiter import RateLimiter
from tenantkv.admission.receive_buffers import ReceiveBuffers
from tenantkv.admission.tenant_throttle import TenantThrottle, read_units, write_units
from tenantkv.admission.throttle_gate import TenantThrottleGate
from tenantkv.admission.throttle_props import (
    bucket_props_from_record,
    limit_to_wire,
    node_props_from_record,
)
from tenantkv.admission.throughput_probing import PROBING_PARAMETERS, ThroughputProber
from tenantkv.admission.write_permits import PermitSettings, WritePermitGate
from tenantkv.config import Config
from tenantkv.server import auth
from tenantkv.server.accounts import Accounts, stored_known_good, stored_users
from tenantkv.server.expiry_pager import ExpiryPager
from tenantkv.server.failpoints import Failpoints
from tenantkv.server.parameters import RuntimeParameters, prefixed
from tenantkv.server.remote_writer import RemoteWriter
from tenantkv.server.tracking import TrackingTable, changes_of
from tenantkv.storage.engine import BucketHandle, Engine
from tenantkv.storage.group_commit import GroupCommitWriter, Pending
from tenantkv.storage.ops import DropBucketOp, WriteOp

log = logging.getLogger("tenantkv.server")


@dataclass(frozen=True, slots=True)
class Listeners:
    """What a process accepts connections on: each door's listeners."""

    msgpack: list[trio.SocketListener]
    resp: list[trio.SocketListener]


@dataclass(frozen=True, slots=True)
class Announcement:
    """Where the process serves, once it does."""

    host: str
    port: int
    resp_port: int | None
    metrics_port: int | None
    tls: bool
    metrics_host: str = "127.0.0.1"


class Role(Protocol):
    """One process's part in the node: :mod:`tenantkv.server.role` says which exist."""

    #: opens LMDB shared with other processes (no data directory lock of its own)
    shared_storage: bool

    def identity(self) -> dict[str, Any]:
        """Who this process is, in ``whoami`` and its status document."""
        ...

    def figures(self) -> dict[str, Any]:
        """The role's own figures, in its status document."""
        ...

    async def listen(self, config: Config) -> Listeners:
        """What accepts this process's connections (before any state is served)."""
        ...

    async def load(self, node: Node, nursery: trio.Nursery) -> None:
        """Start what the role runs beside the sessions and load what the node
        needs before it serves (the first admin user, the expiry pager)."""
        ...

    def start_metrics(self, node: Node) -> int | None:
        """Serve ``/metrics`` if this process is where the node's figures are read."""
        ...

    async def announce(self, node: Node, where: Announcement, ready_file: str | None) -> None:
        """The process serves: say so (log, ready file, service manager, supervisor)."""
        ...

    async def status(self, node: Node) -> dict[str, Any]:
        """``server_status``: the node's document."""
        ...

    async def move_slots(self, session: Any, drain: list[str], params: dict[str, Any]) -> Any:
        """Rebalance the cluster's slots (``drain``: nodes to empty): cluster roles."""
        ...

    async def drain(self, node: Node) -> None:
        """After the sessions: what must be answered before storage closes."""
        ...

    # -- the node's seams -------------------------------------------------------------

    def writer(self, node: Node) -> GroupCommitWriter | RemoteWriter:
        """What commits this process's writes."""
        ...

    def bind_parameters(self, table: ParameterTable) -> None:
        """Adjust how runtime parameters apply in this process."""
        ...

    async def changed(self) -> None:
        """Shared state changed here (committed): returns once the node sees it."""
        ...

    def sharing(self, op: WriteOp) -> AbstractAsyncContextManager[None]:
        """Around the commit of a shared-state ``op``: where that state is held
        beyond this node (a cluster's etcd), it changes there first; raises to
        refuse the change before anything is written here."""
        ...

    async def admit_connection(self, node: Node, conn_id: int, addr: str) -> Admission:
        """The connection table's decision for a new connection."""
        ...

    async def connection_authenticated(
        self, node: Node, conn_id: int, *, admin: bool
    ) -> str | None:
        """At hello: None if the connection may stay, else why not (admin slots)."""
        ...

    def connection_closed(self, node: Node, conn_id: int) -> None: ...


class Session(Protocol):
    """What the node needs of a client session (``server/connection.py`` implements it;
    the node does not import it, so data flows one way: sessions use the node)."""

    @property
    def bucket(self) -> str | None: ...

    @property
    def user(self) -> auth.User | None: ...

    @property
    def backpressure(self) -> bool: ...

    protocol_name: str

    def begin_shutdown(self) -> None: ...

    def select(self, bucket: str | None) -> None: ...

    def expire_if_due(self, now: float) -> None: ...


#: System record holding the node's throttle properties.
THROTTLE_NODE_KEY = b"throttle:node"
BYPASS_PARAMETER = "ingress_connection_establishment_rate_limiter_bypass"
#: Called with each node's pipeline once it is built: the seam where a benchmark
#: swaps a gate for an instrumented one (bench/probing.py's ticket-free A/B).
PIPELINE_HOOKS: list[Callable[[Pipeline], None]] = []


@dataclass(slots=True)
class BucketStats:
    ops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class WriteTally:
    """The writes of one delivered commit: their charges per (bucket, unthrottled)
    as ``[wu, cost]`` and their counts per (bucket, operation, start time), settled
    once for the commit instead of once per write."""

    __slots__ = ("charges", "timed")

    def __init__(self) -> None:
        self.charges: dict[tuple[str, bool], list[int]] = {}
        self.timed: dict[tuple[str, str, float], int] = {}


class Node:
    def __init__(self, config: Config, engine: Engine, *, role: Role) -> None:
        self.engine = engine
        #: this process's part in the node (tenantkv.server.role.SingleProcess, or a worker)
        self.role = role
        #: stops the server this node belongs to (set by the Server)
        self.request_stop: Callable[[], None] = lambda: None
        #: closes a connection without hello to make room (set by the Server)
        self.evict_connection: Callable[[int], None] = lambda conn_id: None
        #: the configuration in force: as started, plus runtime parameters
        self.config: Config = config
        self.parameters = RuntimeParameters(config, engine, self.write, self._config_changed)
        self.config = self.parameters.config
        # Uptime from the monotonic clock: a wall-clock step must not make it negative.
        self.started_monotonic = time.monotonic()
        self.connection_table = ConnectionTable()
        self.receive_buffers = ReceiveBuffers(config.max_receive_buffer_bytes)
        self.sessions: set[Session] = set()
        self.accounts = Accounts(
            stored_users(engine),
            config=lambda: self.config,
            write=self.write,
            sessions=self.sessions,
            data_dir=engine.path,
            known_good=stored_known_good(engine),
            submit=lambda op: self.writer.submit(op, _ignore_outcome),
        )
        self.no_sessions = trio.Event()
        self.connections_total = 0
        self.connections_rejected = 0
        #: connections without hello closed to make room (connection table)
        self.connections_evicted = 0
        #: clients that closed while queued in the connection-establishment limiter
        self.connections_left_in_queue = 0
        #: refused chunks after which a connection was not read again at once
        #: (the request rate limiter's refusal pause, Executor._refused_by_rate)
        self.refusal_pauses = 0
        self.bucket_stats: dict[str, BucketStats] = {}
        self.shutting_down = False
        self.host = config.host
        self.port = 0
        #: the RESP front door's port (0: not listening)
        self.resp_port = 0
        #: the /metrics port of this process (0: none; a worker's node is the supervisor's)
        self.metrics_port = 0
        self._token: trio.lowlevel.TrioToken | None = None
        # Created in start(): the throttle reads trio's clock from the outset.
        self.throttle: TenantThrottle
        self.gate: TenantThrottleGate
        self.pipeline: Pipeline
        self.request_limiter: RateLimiter
        self.connection_limiter: RateLimiter
        self.connection_bypass: CidrMatcher
        self.queues: BucketQueueGate
        self.permits: WritePermitGate
        #: writes submitted during this turn of the event loop (see submit)
        self._unsent: list[Pending] = []
        #: what the writes of the commit being delivered add up to (see _deliver)
        self._tally: WriteTally | None = None
        self.writer: GroupCommitWriter | RemoteWriter = self.role.writer(self)
        #: op latency per (bucket, operation) and commit histograms (a writer observer)
        self.latency = metrics.Latency(self.writer)
        self.failpoints = Failpoints()
        #: cluster mode: the ownership check (tenantkv.cluster.routing.Router) that
        #: filters each chunk's requests; None on a single node (no cost there)
        self.cluster: Any = None
        self.expiry_pager = ExpiryPager(
            engine, self.write, lambda: self.config.expiry_pager_interval_secs
        )
        self.writer.expiry_observers.append(self._expiry_written_threadsafe)
        #: client-side caching: who read which key (the RESP door's CLIENT TRACKING)
        self.tracking = TrackingTable(config.tracking_table_max_keys)
        self._execution_control(config)
        for bucket_name in engine.buckets:
            self.bucket_stats[bucket_name] = BucketStats()

    def _execution_control(self, config: Config) -> None:
        # The ingress admission controller: a ticket per operation in the server.
        self.ingress_tickets = TicketHolder(config.ingress_admission_tickets, name="ingress")
        cfg = self.config
        # Execution control: every storage access by a user operation holds a
        # ticket of its class; throughput probing sizes the two pools.
        self.read_tickets = TicketHolder(
            0, name="read", max_queue_depth=cfg.execution_read_max_queue_depth
        )
        self.write_tickets = TicketHolder(
            0, name="write", max_queue_depth=cfg.execution_write_max_queue_depth
        )
        self.prober = ThroughputProber(
            self.read_tickets,
            self.write_tickets,
            **{name: getattr(cfg, name) for name in PROBING_PARAMETERS},
        )

    # -- writer plumbing -----------------------------------------------------

    def start(self) -> None:
        """Build the gates that run on Trio's clock and start the writer (on the Trio thread)."""
        self._token = trio.lowlevel.current_trio_token()
        cfg = self.config
        self.request_limiter = RateLimiter.create(
            rate_per_sec=cfg.ingress_request_admission_rate_per_sec,
            burst_capacity_secs=cfg.ingress_request_admission_burst_capacity_secs,
            max_queue_depth=0,
            name="ingress request rate limiter",
            param_prefix="ingress_request_admission_",
        )
        self.connection_limiter = RateLimiter.create(
            rate_per_sec=cfg.ingress_connection_establishment_rate_per_sec,
            burst_capacity_secs=cfg.ingress_connection_establishment_burst_capacity_secs,
            max_queue_depth=cfg.ingress_connection_establishment_max_queue_depth,
            name="connection establishment rate limiter",
            param_prefix="ingress_connection_establishment_",
            error=errors.TooManyConnections,
        )
        self.connection_bypass = CidrMatcher(
            cfg.ingress_connection_establishment_rate_limiter_bypass, name=BYPASS_PARAMETER
        )
        self.queues = BucketQueueGate.create(
            concurrency=cfg.bucket_queue_concurrency,
            queue_tolerance=cfg.bucket_queue_tolerance,
            pending_timeout_ms=cfg.bucket_queue_pending_timeout_ms,
        )
        self.permits = WritePermitGate.create(
            lambda: self.writer.lag + sum(p.op.op_count for p in self._unsent),
            PermitSettings.from_config(cfg),
        )
        self._start_throttle()
        self.pipeline = Pipeline(
            request_limiter=self.request_limiter,
            request_exemptions=CidrMatcher(
                cfg.ingress_request_rate_limiter_exemptions, name=EXEMPTIONS_PARAMETER
            ),
            ingress=self.ingress_tickets,
            throttle=self.gate,
            queues=self.queues,
            permits=self.permits,
            read_tickets=self.read_tickets,
            write_tickets=self.write_tickets,
            request_rate_enabled=cfg.ingress_request_rate_limiter_enabled,
            ingress_enabled=cfg.ingress_admission_controller_enabled,
            queues_enabled=cfg.bucket_queue_enabled,
            permits_enabled=cfg.write_permit_enabled,
        )
        for hook in PIPELINE_HOOKS:
            hook(self.pipeline)
        self.parameters.bind(
            self.pipeline.parameter_table(),
            prefixed("ingress_request_admission_", self.request_limiter.parameter_table()),
            prefixed(
                "ingress_connection_establishment_", self.connection_limiter.parameter_table()
            ),
            prefixed("ingress_admission_", self.ingress_tickets.parameter_table()),
            prefixed("throttle_", self.gate.parameter_table()),
            prefixed("bucket_queue_", self.queues.parameter_table()),
            prefixed("write_permit_", self.permits.parameter_table()),
            prefixed("execution_read_", self.read_tickets.parameter_table()),
            prefixed("execution_write_", self.write_tickets.parameter_table()),
            self.prober.parameter_table(),
            {
                BYPASS_PARAMETER: self._set_connection_bypass,
                "log_level": lambda level: logging.getLogger().setLevel(level.upper()),
            },
        )
        self.role.bind_parameters(self.parameters.table)
        self.writer.start()

    def _config_changed(self, config: Config) -> None:
        self.config = config

    def _set_connection_bypass(self, cidrs: Any) -> None:
        self.connection_bypass = CidrMatcher(cidrs, name=BYPASS_PARAMETER)

    def _start_throttle(self) -> None:
        saved = node_props_from_record(self.engine.system_get(THROTTLE_NODE_KEY))
        self.throttle = TenantThrottle(
            trio_clock(),
            capacity=saved.capacity,
            default_reserved=saved.default_reserved,
            default_hard_limit=saved.default_hard_limit,
            write_weight=self.config.write_weight,
            max_wait_secs=self.config.throttle_max_wait_ms / 1000,
            max_debt_secs=self.config.throttle_max_request_secs,
        )
        self.gate = TenantThrottleGate(self.throttle)
        for handle in self.engine.buckets.values():
            self._gates_add(handle)

    def _gates_add(self, handle: BucketHandle) -> None:
        """Register a bucket with every per-bucket gate, with its saved properties."""
        self.queues.add_bucket(handle.name)
        for cls, props in (handle.props.get("queues") or {}).items():
            self.queues.set_bucket(handle.name, cls, **props)
        self.permits.add_bucket(handle.name)
        saved = bucket_props_from_record(handle.props)
        self.throttle.add_bucket(handle.name, reserved=saved.reserved, hard_limit=saved.hard_limit)

    def bucket_throttle_defaults(self) -> dict[str, int | str]:
        """What a new bucket gets unless told otherwise: the node defaults, now."""
        _, reserved, hard = self.throttle.node_limits()
        return {"reserved": limit_to_wire(reserved), "hard_limit": limit_to_wire(hard)}

    def read_cost(self, sizes: list[int], keys: int = 1) -> tuple[int, int]:
        """``(ru, cost)`` of a read that ran: RU per record returned are metered (a
        miss reads none); the throttle cost is at least ``min_op_units`` per key
        looked up, so a multi-key read costs what its keys read one by one would
        (an MGET of 1,000 missing keys is not one unit)."""
        cfg = self.config
        unit, floor = cfg.read_unit_size, cfg.min_op_units
        if not sizes:
            ru = 0
        elif len(sizes) == 1:
            ru = -(-sizes[0] // unit)
        else:
            ru = sum(read_units(n, unit) for n in sizes)
        if keys > 1:
            hits = [read_units(n, unit) for n in sizes]
            floor = sum(max(r, floor) for r in hits) + max(0, keys - len(hits)) * floor
        return ru, ru if ru > floor else floor

    def charge_reads(
        self, bucket: str, ru: int, cost: int, unthrottled: bool, now: float | None = None
    ) -> None:
        """Charge reads that ran: ``ru`` metered, ``cost`` units to the throttle (the
        sums of :meth:`read_cost` over a run of reads, or one read's). ``now``: the
        throttle-clock instant of the chunk the reads ran in, if they ran inline."""
        self.throttle.charge(bucket, ru, 0, unthrottled=unthrottled, min_cost=cost, now=now)

    def charge_read(self, bucket: str, sizes: list[int], unthrottled: bool, keys: int = 1) -> None:
        """Charge one read that ran (:meth:`read_cost`, :meth:`charge_reads`)."""
        ru, cost = self.read_cost(sizes, keys)
        self.charge_reads(bucket, ru, cost, unthrottled)

    def write_admission_cost(self, op: WriteOp) -> int:
        """A write's cost known before it runs, from what it will write: the units
        the tenant throttle admits it at and reserves (:meth:`TenantThrottle.write_wait`),
        so that writes in flight cannot overshoot a limit. It is what
        :meth:`write_cost` charges for a put (key, value and header: its size hint);
        the charge after the write settles any difference."""
        cfg = self.config
        weight = cfg.write_weight
        wu = -(-op.size_hint // cfg.write_unit_size) * weight
        floor = cfg.min_op_units * weight * op.keys_touched
        return wu if wu > floor else floor

    def write_cost(self, op: WriteOp, *, wrote: bool) -> tuple[int, int]:
        """``(wu, cost)`` of a write that ran, succeeded or not (a CAS mismatch,
        ``add`` on an existing key, a miss still cost a commit): WU metered per
        record it wrote, throttle cost at least ``min_op_units x write_weight``
        per key it touched (an MSET or DEL of many keys costs what those writes
        would one by one)."""
        return self.write_costs((op,), wrote=wrote)

    def write_costs(self, ops: Sequence[WriteOp], *, wrote: bool = True) -> tuple[int, int]:
        """:meth:`write_cost` of each of ``ops``, summed (a run's writes: the
        configuration read once, no call per write)."""
        cfg = self.config
        unit, weight = cfg.write_unit_size, cfg.write_weight
        floor1 = cfg.min_op_units * weight
        wu_sum = cost_sum = 0
        for op in ops:
            if not wrote:
                wu = 0
            elif op.record_bytes:
                wu = sum(write_units(n, unit) for n in op.record_bytes)
            else:
                wu = -(-op.nbytes // unit)  # write_units of one record (0: none), inline
            floor = floor1 * op.keys_touched
            wu_sum += wu
            wu *= weight
            cost_sum += floor if floor > wu else wu
            if op.reply_hint:  # the value its answer carries: read units, as a GET's
                cost_sum += -(-op.reply_hint // cfg.read_unit_size)
        return wu_sum, cost_sum

    def charge_writes(
        self, bucket: str, wu: int, cost: int, unthrottled: bool, reserved: int = 0
    ) -> None:
        """Charge writes that ran: ``wu`` metered, ``cost`` units to the throttle
        (sums of :meth:`write_cost`), less the ``reserved`` units it took for them
        when they were admitted (:meth:`write_admission_cost`). Within a delivered
        commit the charges add up per bucket and go to the throttle once, at the
        delivery's instant (:meth:`_deliver`)."""
        tally = self._tally
        if tally is None:
            if bucket in self.throttle:
                self.throttle.charge(
                    bucket, 0, wu, unthrottled=unthrottled, min_cost=cost, reserved=reserved
                )
            return
        key = (bucket, unthrottled)
        sums = tally.charges.get(key)
        if sums is None:
            tally.charges[key] = [wu, cost, reserved]
        else:
            sums[0] += wu
            sums[1] += cost
            sums[2] += reserved

    def count_write(self, bucket: str, method: str, t0: float, n: int = 1) -> None:
        """Count ``n`` writes that succeeded and time them from ``t0`` (perf_counter)
        to their acknowledgement: once per commit for the writes that share a start
        (one received chunk's), as a chunk's reads are."""
        tally = self._tally
        if tally is None:
            stats = self.bucket_stats.get(bucket)
            if stats is not None:
                stats.ops[method] += n
                self.latency.observe_many(bucket, method, time.perf_counter() - t0, n)
            return
        key = (bucket, method, t0)
        tally.timed[key] = tally.timed.get(key, 0) + n

    def _expiry_written_threadsafe(self, expiry_ms: int) -> None:
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self.expiry_pager.expiry_written, expiry_ms)

    def _taken_threadsafe(self, batch: list[Pending]) -> None:
        if any(p.taken is not None for p in batch):
            assert self._token is not None
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._taken, batch)

    @staticmethod
    def _taken(batch: list[Pending]) -> None:
        for p in batch:
            if p.taken is not None:
                p.taken()

    def _deliver_threadsafe(self, batch: list[Pending]) -> None:
        assert self._token is not None
        with contextlib.suppress(trio.RunFinishedError):  # loop already gone
            self._token.run_sync_soon(self._deliver, batch)

    def _deliver(self, batch: list[Pending]) -> None:
        """Answer a committed batch's writes, then charge and count them together:
        nothing else runs in between (a woken task runs after this returns), so the
        throttle and the metrics end as if each write had been taken one by one."""
        self._tally = tally = WriteTally()
        try:
            for p in batch:
                p.callback(p.result, p.error)
        finally:
            self._tally = None
            self._settle(tally)
        if self.tracking.trackers:
            # After the answers: a writer's own reply goes out before its push.
            self.tracking.changed(changes_of(p.op for p in batch))

    def _settle(self, tally: WriteTally) -> None:
        now = self.throttle.clock()
        for (bucket, unthrottled), (wu, cost, reserved) in tally.charges.items():
            if bucket in self.throttle:  # not deleted meanwhile
                self.throttle.charge(
                    bucket,
                    0,
                    wu,
                    unthrottled=unthrottled,
                    min_cost=cost,
                    now=now,
                    reserved=reserved,
                )
        if tally.timed:
            done = time.perf_counter()
            for (bucket, method, t0), n in tally.timed.items():
                stats = self.bucket_stats.get(bucket)
                if stats is not None:  # not deleted meanwhile
                    stats.ops[method] += n
                    self.latency.observe_many(bucket, method, done - t0, n)

    def submit(self, op: WriteOp, callback: Any, taken: Callable[[], None] | None = None) -> None:
        """Queue a write for the group-commit writer (from the event loop).

        The writes of one turn of the loop go to the writer together, at the
        end of the turn (:meth:`_send_writes`): a writer woken by the first of
        them would commit it with the few that followed before it woke, and the
        rest would wait for the next commit, so commits would carry fewer writes
        than the offered load puts in flight.
        """
        writer = self.writer
        if isinstance(writer, RemoteWriter):  # it gathers a turn's writes itself
            writer.submit(op, callback, taken)
            return
        self._unsent.append(Pending(op, callback, taken))
        if len(self._unsent) == 1:
            if self._token is None:
                self._send_writes()
            else:
                self._token.run_sync_soon(self._send_writes)

    def _send_writes(self) -> None:
        unsent, self._unsent = self._unsent, []
        if unsent:
            assert isinstance(self.writer, GroupCommitWriter)
            self.writer.submit_many(unsent)

    async def write(self, op: WriteOp) -> Any:
        """Queue one op and wait for its commit (admin and internal work)."""
        done = trio.Event()
        box: list[Any] = [None, None]

        def callback(result: Any, error: BaseException | None) -> None:
            box[0], box[1] = result, error
            done.set()

        async with self.role.sharing(op) if op.shared_state else _NOTHING_SHARED:
            ticket = self.write_tickets.try_acquire(Priority.EXEMPT)  # counted, never waits
            assert ticket is not None
            self.submit(op, callback)
            # Shielded: once queued the op will commit; wait for its outcome so the
            # in-memory registries never disagree with the disk.
            with trio.CancelScope(shield=True):
                await done.wait()
            ticket.release()
        if box[1] is not None:
            raise box[1]
        if op.shared_state:
            await self.role.changed()
        return box[0]

    # -- the connection table: the node's, also with serve --workers N ---------------

    async def admit_connection(self, conn_id: int, addr: str) -> Admission:
        """The connection table's decision for a new connection (see
        :mod:`tenantkv.admission.connection_table`), wherever the role keeps it."""
        return await self.role.admit_connection(self, conn_id, addr)

    async def connection_authenticated(self, conn_id: int, *, admin: bool) -> str | None:
        """At hello: None if the connection may stay, else why not (admin slots)."""
        return await self.role.connection_authenticated(self, conn_id, admin=admin)

    def connection_closed(self, conn_id: int) -> None:
        self.role.connection_closed(self, conn_id)

    def reload_config(self, config: Config) -> None:
        """SIGHUP: the config file was read again. Runtime settings that changed
        apply now (unless set_parameter overrides them); others need a restart."""
        for name in self.parameters.rebase(config):
            log.warning("setting %s changed in the config; it applies after a restart", name)

    async def drain_writes(self) -> None:
        """Wait until every write submitted has its answer (a worker's writes, sent
        to the node's writer; a local writer is drained by :meth:`stop_writer`)."""
        if isinstance(self.writer, RemoteWriter):
            await self.writer.drain()

    async def stop_writer(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        self._send_writes()
        self.writer.stop()
        await trio.to_thread.run_sync(self.writer.join)

    def session_closed(self, session: Session) -> None:
        self.sessions.discard(session)
        if not self.sessions:
            self.no_sessions.set()

    def session_opened(self, session: Session) -> None:
        self.sessions.add(session)
        if self.no_sessions.is_set():
            self.no_sessions = trio.Event()

    # -- buckets ---------------------------------------------------------------

    def bucket(self, name: str) -> BucketHandle:
        return self.engine.bucket(name)

    def bucket_added(self, handle: BucketHandle) -> None:
        self.engine.buckets[handle.name] = handle
        self.bucket_stats[handle.name] = BucketStats()
        self._gates_add(handle)

    def bucket_removed(self, handle: BucketHandle) -> None:
        handle.dropped = True
        self.accounts.epoch += 1
        self.engine.buckets.pop(handle.name, None)
        self.bucket_stats.pop(handle.name, None)
        self.latency.forget(handle.name)
        # Waiting requests of the bucket fail with BucketNotFound.
        self.gate.bucket_removed(handle.name)
        self.queues.remove_bucket(handle.name)
        self.permits.remove_bucket(handle.name)

    async def drop_bucket(self, handle: BucketHandle) -> None:
        """Delete a bucket, its data and every grant on it, in one transaction.

        New requests see BucketNotFound at once; requests already admitted or
        waiting fail when they run (the handle is dropped); sessions that had it
        selected lose it. Revoking the roles with the drop means a bucket created
        later under the same name is a new tenant: no old user can reach it.
        """
        name = handle.name
        self.bucket_removed(handle)
        revoked = self.accounts.without_bucket(name)
        puts = {b"user:" + u.name.encode(): u.to_record() for u in revoked.values()}
        try:
            await self.write(DropBucketOp(handle, puts))
        except BaseException:
            handle.dropped = False  # the drop did not commit: the bucket is still there
            self.bucket_added(handle)
            raise
        self.accounts.revoked(revoked)
        self.deselect(name)

    def deselect(self, bucket: str) -> None:
        """Sessions that had ``bucket`` selected lose it (it was dropped)."""
        for s in list(self.sessions):
            if s.bucket == bucket:
                s.select(None)


#: the commit of an op that changes no shared state needs no context
_NOTHING_SHARED = contextlib.nullcontext()


def _ignore_outcome(result: Any, error: BaseException | None) -> None:
    """A write nobody waits for (a known-good login pair: lost, it is only forgotten)."""
