"""The node: everything one server process shares — storage, users, buckets, stats.

Sessions and commands reach storage and the user registry only through here.
It lives on the Trio thread; the writer thread hands finished batches back
through ``TrioToken.run_sync_soon`` so every callback runs on the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from tenantkv import config as config_mod
from tenantkv import errors, metrics
from tenantkv._version import __version__
from tenantkv.admission.bucket_queues import BucketQueueGate
from tenantkv.admission.cidr import CidrMatcher
from tenantkv.admission.connection_table import ConnectionTable
from tenantkv.admission.execution_tickets import Priority, TicketHolder
from tenantkv.admission.pipeline import Pipeline
from tenantkv.admission.rate_limiter import RateLimiter
from tenantkv.admission.receive_buffers import ReceiveBuffers
from tenantkv.admission.tenant_throttle import (
    TenantThrottle,
    TenantThrottleGate,
    read_units,
    write_units,
)
from tenantkv.admission.throttle_props import limit_to_wire, parse_limit
from tenantkv.admission.throughput_probing import PROBING_PARAMETERS, ThroughputProber
from tenantkv.admission.write_permits import WritePermitGate
from tenantkv.config import Config
from tenantkv.server import auth
from tenantkv.server.failpoints import Failpoints
from tenantkv.storage.engine import BucketHandle, Engine
from tenantkv.storage.group_commit import GroupCommitWriter, Pending
from tenantkv.storage.ops import DropBucketOp, PutSystemOp, WriteOp

log = logging.getLogger("tenantkv.server")


class Session(Protocol):
    """What the node needs of a client session (``server/session.py`` implements it;
    the node does not import it, so data flows one way: sessions use the node)."""

    bucket: str | None
    user: auth.User | None
    backpressure: bool

    def begin_shutdown(self) -> None: ...

    def select(self, bucket: str | None) -> None: ...

    def expire_if_due(self, now: float) -> None: ...


ADMIN_USER = "admin"
ADMIN_PASSWORD_ENV = "TENANTKV_ADMIN_PASSWORD"
ADMIN_PASSWORD_FILE = "admin-password"
#: System record holding the node's throttle properties.
THROTTLE_NODE_KEY = b"throttle:node"
#: Settings that switch a gate of the pipeline on or off -> the Pipeline attribute.
PIPELINE_SWITCHES = {
    "ingress_admission_controller_enabled": "ingress_enabled",
    "bucket_queue_enabled": "queues_enabled",
    "write_permit_enabled": "permits_enabled",
}
#: System records holding parameters changed with set_parameter.
PARAM_PREFIX = b"param:"


@dataclass(slots=True)
class BucketStats:
    ops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)


class Node:
    def __init__(self, config: Config, engine: Engine) -> None:
        #: the configuration as started (defaults < file < command line)
        self.base_config = config
        self.engine = engine
        self.config = self._with_saved_params(config)
        # Uptime from the monotonic clock: a wall-clock step must not make it negative.
        self.started_monotonic = time.monotonic()
        self.users: dict[str, auth.User] = {}
        #: bumped whenever a user or a bucket changes: sessions re-check their user
        #: (deleted? roles?) before the next command runs, at the cost of an int compare
        self.auth_epoch = 0
        self.connection_table = ConnectionTable()
        self.receive_buffers = ReceiveBuffers(config.max_receive_buffer_bytes)
        #: credential digests verified since the user last changed
        self._verified: dict[bytes, str] = {}
        #: credential digests being verified now -> (done, [succeeded: None until known])
        self._verifying: dict[bytes, tuple[trio.Event, list[bool | None]]] = {}
        #: failed logins per source address (docs/security.md)
        self.login_limiter = auth.LoginLimiter(time.monotonic)
        self.sessions: set[Session] = set()
        self.no_sessions = trio.Event()
        self.connections_total = 0
        self.connections_rejected = 0
        #: connections without hello closed to make room (connection table)
        self.connections_evicted = 0
        #: clients that closed while queued in the connection-establishment limiter
        self.connections_left_in_queue = 0
        self.bucket_stats: dict[str, BucketStats] = {}
        self.shutting_down = False
        self.host = config.host
        self.port = 0
        self._token: trio.lowlevel.TrioToken | None = None
        # Created in start(): the throttle reads trio's clock from the outset.
        self.throttle: TenantThrottle
        self.gate: TenantThrottleGate
        self.pipeline: Pipeline
        self.request_limiter: RateLimiter
        self.connection_limiter: RateLimiter
        self.request_exemptions: CidrMatcher
        self.connection_bypass: CidrMatcher
        self.queues: BucketQueueGate
        self.permits: WritePermitGate
        self.writer = GroupCommitWriter(
            engine, self._deliver_threadsafe, taken=self._taken_threadsafe
        )
        #: op latency per (bucket, operation) and commit histograms (a writer observer)
        self.latency = metrics.Latency(self.writer)
        self.failpoints = Failpoints()
        # The ingress admission controller: a ticket per operation in the server.
        self.ingress_tickets = TicketHolder(config.ingress_admission_tickets, name="ingress")
        # Execution control: every storage access by a user operation holds a
        # ticket of its class; throughput probing sizes the two pools.
        cfg = self.config
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
        for raw_name, rec in engine.system_items(b"user:"):
            self.users[raw_name.decode()] = auth.User.from_record(raw_name.decode(), rec)
        for bucket_name in engine.buckets:
            self.bucket_stats[bucket_name] = BucketStats()

    # -- runtime parameters ----------------------------------------------------

    def _with_saved_params(self, config: Config) -> Config:
        """Apply parameters saved by set_parameter (they outlive a restart)."""
        for key, value in self.engine.system_items(PARAM_PREFIX):
            name = key.decode()
            try:
                if not config_mod.setting(name).runtime:
                    continue
                config = config.with_values({name: value}, source="a saved parameter")
            except config_mod.ConfigError as exc:
                log.warning("ignoring saved parameter %s=%r: %s", name, value, exc)
                continue
            log.info("parameter %s=%r (set at runtime; overrides the config)", name, value)
        return config

    def parameter(self, name: str) -> dict[str, Any]:
        s = self._setting(name)
        return {
            "name": name,
            "value": getattr(self.config, name),
            "default": s.default,
            "runtime": s.runtime,
            "help": s.help,
        }

    def parameters(self) -> list[dict[str, Any]]:
        return [self.parameter(s.name) for s in config_mod.SETTINGS]

    async def set_parameter(self, name: str, value: Any) -> tuple[Any, Any]:
        """Change a runtime parameter (None: back to the configured value); persists it.
        Returns (old, new)."""
        s = self._setting(name)
        if not s.runtime:
            raise errors.BadValue(
                f"{name!r} cannot change at runtime; set it in the config file or on the "
                "command line and restart"
            )
        if value is None:
            new = getattr(self.base_config, name)
            await self.write(PutSystemOp(PARAM_PREFIX + name.encode(), None))
        else:
            try:
                new = config_mod.check(name, value)
            except config_mod.ConfigError as exc:
                raise errors.BadValue(str(exc)) from None
        old = getattr(self.config, name)
        # Apply first: a cross-check (probing min <= max) may still refuse it.
        self._apply_param(name, new)
        self.config = self.config.with_values({name: new})
        if value is not None:
            await self.write(PutSystemOp(PARAM_PREFIX + name.encode(), new))
        return old, new

    def _apply_param(self, name: str, value: Any) -> None:
        """Parameters that act on live objects; the rest are read per use."""
        if name in PIPELINE_SWITCHES:
            setattr(self.pipeline, PIPELINE_SWITCHES[name], value)
        elif name in PROBING_PARAMETERS:
            self.prober.configure(**{name: value})
        elif name == "ingress_admission_tickets":
            self.ingress_tickets.resize(value)
        elif name.startswith("ingress_request_admission_"):
            self.request_limiter.configure(
                **{name.removeprefix("ingress_request_admission_"): value}
            )
        elif name == "ingress_request_rate_limiter_exemptions":
            self.request_exemptions = CidrMatcher(value, name=name)
        elif name == "ingress_connection_establishment_rate_limiter_bypass":
            self.connection_bypass = CidrMatcher(value, name=name)
        elif name.startswith("ingress_connection_establishment_") and not name.endswith("_enabled"):
            key = name.removeprefix("ingress_connection_establishment_")
            self.connection_limiter.configure(**{key: value})
        elif name.startswith("bucket_queue_"):
            key = name.removeprefix("bucket_queue_")
            self.queues.configure(**{"queue_tolerance" if key == "tolerance" else key: value})
        elif name.startswith("write_permit_"):
            self.permits.configure(**{name.removeprefix("write_permit_"): value})
        elif name == "execution_read_max_queue_depth":
            self.read_tickets.max_queue_depth = value
        elif name == "execution_write_max_queue_depth":
            self.write_tickets.max_queue_depth = value
        elif name == "throttle_max_wait_ms":
            self.throttle.max_wait_secs = value / 1000
        elif name == "throttle_max_request_secs":
            self.throttle.max_debt_secs = value
        elif name == "log_level":
            logging.getLogger().setLevel(value.upper())

    @staticmethod
    def _setting(name: Any) -> config_mod.Setting:
        if not isinstance(name, str):
            raise errors.BadValue("'name' must be a string")
        try:
            return config_mod.setting(name)
        except config_mod.ConfigError as exc:
            raise errors.BadValue(str(exc)) from None

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
        self.request_exemptions = CidrMatcher(
            cfg.ingress_request_rate_limiter_exemptions,
            name="ingress_request_rate_limiter_exemptions",
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
            cfg.ingress_connection_establishment_rate_limiter_bypass,
            name="ingress_connection_establishment_rate_limiter_bypass",
        )
        self.queues = BucketQueueGate.create(
            concurrency=cfg.bucket_queue_concurrency,
            queue_tolerance=cfg.bucket_queue_tolerance,
            pending_timeout_ms=cfg.bucket_queue_pending_timeout_ms,
        )
        self.permits = WritePermitGate.create(
            lambda: self.writer.lag,
            target_lag=cfg.write_permit_target_lag,
            critical_lag=cfg.write_permit_critical_lag,
            min_capacity=cfg.write_permit_min_capacity,
            max_capacity=cfg.write_permit_max_capacity,
            adjustment_interval_ms=cfg.write_permit_adjustment_interval_ms,
        )
        self._start_throttle()
        self.pipeline = Pipeline(
            ingress=self.ingress_tickets,
            throttle=self.throttle,
            throttle_gate=self.gate,
            queues=self.queues,
            permits=self.permits,
            read_tickets=self.read_tickets,
            write_tickets=self.write_tickets,
            ingress_enabled=cfg.ingress_admission_controller_enabled,
            queues_enabled=cfg.bucket_queue_enabled,
            permits_enabled=cfg.write_permit_enabled,
        )
        self.writer.start()

    def _start_throttle(self) -> None:
        saved = self.engine.system_get(THROTTLE_NODE_KEY) or {}
        self.throttle = TenantThrottle(
            trio.current_time,
            capacity=parse_limit("capacity", saved.get("capacity", "unlimited")),
            default_reserved=parse_limit(
                "default_throttle_reserved_units", saved.get("default_throttle_reserved_units", 0)
            ),
            default_hard_limit=parse_limit(
                "default_throttle_hard_limit", saved.get("default_throttle_hard_limit", "unlimited")
            ),
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
        props = handle.props.get("throttle") or {}
        self.throttle.add_bucket(
            handle.name,
            reserved=parse_limit("reserved", props.get("reserved", 0)),
            hard_limit=parse_limit("hard_limit", props.get("hard_limit", "unlimited")),
        )

    def bucket_throttle_defaults(self) -> dict[str, int | str]:
        """What a new bucket gets unless told otherwise: the node defaults, now."""
        _, reserved, hard = self.throttle.node_limits()
        return {"reserved": limit_to_wire(reserved), "hard_limit": limit_to_wire(hard)}

    def charge_read(self, bucket: str, sizes: list[int], unthrottled: bool) -> None:
        """Charge a read after it ran: RU per record returned are metered (a miss
        reads none); the throttle cost is at least ``min_op_units``."""
        unit = self.config.read_unit_size
        if not sizes:
            ru = 0
        elif len(sizes) == 1:
            ru = -(-sizes[0] // unit)
        else:
            ru = sum(read_units(n, unit) for n in sizes)
        self.throttle.charge(
            bucket, ru, 0, unthrottled=unthrottled, min_cost=self.config.min_op_units
        )

    def check_write_cost(self, bucket: str, op: WriteOp) -> None:
        """Refuse, before it runs, a write costing more than its bucket may spend in
        ``throttle_max_request_secs`` of its hard limit (an 8 MiB write on a bucket
        limited to 10 units/s would otherwise block it for 13 minutes)."""
        most = self.throttle.max_request_units(bucket)
        if most == math.inf:
            return
        cost = write_units(op.size_hint, self.config.write_unit_size) * self.config.write_weight
        if cost > most:
            raise errors.RequestTooCostly(
                f"this write costs {cost} units; bucket {bucket!r} may spend at most "
                f"{most:.0f} in one request (throttle_max_request_secs="
                f"{self.config.throttle_max_request_secs:g} s of its hard_limit "
                f"{self.throttle.bucket_limits(bucket)[1]} units/s)"
            )

    def charge_write(self, bucket: str, nbytes: int, unthrottled: bool) -> None:
        """Charge a write that ran, succeeded or not (a CAS mismatch, ``add`` on an
        existing key, a miss still cost a commit): WU metered for what it wrote,
        throttle cost at least ``min_op_units x write_weight``."""
        if bucket in self.throttle:
            cfg = self.config
            wu = write_units(nbytes, cfg.write_unit_size) if nbytes else 0
            floor = cfg.min_op_units * cfg.write_weight
            self.throttle.charge(bucket, 0, wu, unthrottled=unthrottled, min_cost=floor)

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

    @staticmethod
    def _deliver(batch: list[Pending]) -> None:
        for p in batch:
            p.callback(p.result, p.error)

    def submit(self, op: WriteOp, callback: Any, taken: Callable[[], None] | None = None) -> None:
        self.writer.submit(op, callback, taken)

    async def write(self, op: WriteOp) -> Any:
        """Queue one op and wait for its commit (admin and internal work)."""
        done = trio.Event()
        box: list[Any] = [None, None]

        def callback(result: Any, error: BaseException | None) -> None:
            box[0], box[1] = result, error
            done.set()

        ticket = self.write_tickets.try_acquire(Priority.EXEMPT)  # counted, never waits
        assert ticket is not None
        self.writer.submit(op, callback)
        # Shielded: once queued the op will commit; wait for its outcome so the
        # in-memory registries never disagree with the disk.
        with trio.CancelScope(shield=True):
            await done.wait()
        ticket.release()
        if box[1] is not None:
            raise box[1]
        return box[0]

    async def stop_writer(self) -> None:
        """Commit what is queued, then stop the writer thread."""
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
        self.auth_epoch += 1
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
        revoked = {
            u.name: dataclasses.replace(u, roles={b: r for b, r in u.roles.items() if b != name})
            for u in self.users.values()
            if name in u.roles
        }
        puts = {b"user:" + u.name.encode(): u.to_record() for u in revoked.values()}
        try:
            await self.write(DropBucketOp(handle, puts))
        except BaseException:
            handle.dropped = False  # the drop did not commit: the bucket is still there
            self.bucket_added(handle)
            raise
        self.users.update(revoked)
        self.auth_epoch += 1
        for s in list(self.sessions):
            if s.bucket == name:
                s.select(None)

    async def drop_dangling_roles(self) -> None:
        """At start: remove roles on buckets that no longer exist (left by a version
        that kept them on bucket deletion), so a re-created bucket cannot revive them."""
        for user in list(self.users.values()):
            dangling = [b for b in user.roles if b not in self.engine.buckets]
            if not dangling:
                continue
            fixed = dataclasses.replace(
                user, roles={b: r for b, r in user.roles.items() if b not in dangling}
            )
            log.warning(
                "user %r had roles on deleted buckets %s; removing them", user.name, dangling
            )
            await self.save_user(fixed, expect="present")

    # -- users -----------------------------------------------------------------

    async def authenticate(self, name: Any, password: Any, peer: str | None = None) -> auth.User:
        """The user these credentials name, or AuthenticationFailed.

        With ``peer`` (the client's address), failed logins are limited per
        source, per user and per (user, source) (:class:`auth.LoginLimiter`; the
        rule is in docs/security.md): a login over a limit gets
        TooManyLoginFailures at once, before any scrypt is spent, and so does one
        whose credentials being verified would reach it. Concurrent logins with
        the same credentials share one verification.
        """
        source = auth.login_source(peer) if peer is not None else None
        who = name if isinstance(name, str) else None
        while True:
            if source is not None:
                self._check_login_rate(source, who)
            if not isinstance(name, str) or not isinstance(password, str):
                self._login_failed(source, who)
                raise errors.AuthenticationFailed("user and password must be strings")
            user = self.users.get(name)
            key = auth.digest(name, password)
            if user is not None and self._verified.get(key) == name:
                if source is not None:
                    self.login_limiter.succeeded(source, name)
                return user
            pending = self._verifying.get(key)
            if pending is None:
                break
            # The same credentials are being verified: wait for that outcome.
            done, box = pending
            await done.wait()
            if box[0] is False:
                self._login_failed(source, who)
                raise errors.AuthenticationFailed("unknown user or wrong password")
            # True: the next round finds it verified; None: that check was cancelled.
        done, box = trio.Event(), [None]
        self._verifying[key] = (done, box)
        if source is not None:
            self.login_limiter.begin(source, name)
        try:
            ok = await self._verify(user, name, password)
            box[0] = ok
        finally:
            del self._verifying[key]
            done.set()
            if source is not None:
                self.login_limiter.end(source, name)
        if not ok:
            self._login_failed(source, who)
            raise errors.AuthenticationFailed("unknown user or wrong password")
        assert user is not None
        if source is not None:
            self.login_limiter.succeeded(source, name)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[key] = name
        return user

    async def _verify(self, user: auth.User | None, name: str, password: str) -> bool:
        """The slow check (scrypt on a worker thread); the same cost for unknown users."""
        if user is None or len(password.encode()) > auth.MAX_PASSWORD_BYTES:
            # Same cost as a real check, so a probe cannot tell unknown users apart.
            await trio.to_thread.run_sync(auth.hash_password, password[:1024], b"0" * 16)
            return False
        ok = await trio.to_thread.run_sync(auth.verify, user, password)
        return ok and self.users.get(name) is user

    def _check_login_rate(self, source: str, name: str | None) -> None:
        cfg = self.config
        wait = self.login_limiter.retry_after(
            source,
            cfg.login_failure_limit,
            cfg.login_failure_window_secs,
            name,
            cfg.login_failure_user_limit,
        )
        if wait > 0:
            self.login_limiter.refused()
            raise errors.TooManyLoginFailures(
                "too many failed logins from this address or for this user; try again in "
                f"{math.ceil(wait)} s",
                retry_after_ms=math.ceil(wait * 1000),
            )

    def _login_failed(self, source: str | None, name: str | None) -> None:
        if source is None:
            return
        cfg = self.config
        hit = self.login_limiter.failed(
            source,
            cfg.login_failure_limit,
            cfg.login_failure_window_secs,
            name,
            cfg.login_failure_user_limit,
        )
        if hit == "source":
            log.warning(
                "%d failed logins from %s within %gs (login_failure_limit): refusing its "
                "logins until they age out",
                cfg.login_failure_limit,
                source,
                cfg.login_failure_window_secs,
            )
        elif hit == "user":
            # An existing user's name only: an unknown "user name" is often a password
            # typed in the wrong field, and passwords are never logged.
            who = repr(name) if name in self.users else "an unknown user name"
            log.warning(
                "%d failed logins for %s within %gs from all addresses "
                "(login_failure_user_limit): refusing its logins from addresses where it "
                "has not logged in until they age out",
                cfg.login_failure_user_limit,
                who,
                cfg.login_failure_window_secs,
            )

    def login_statistics(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "login_failure_limit": cfg.login_failure_limit,
            "login_failure_user_limit": cfg.login_failure_user_limit,
            "login_failure_window_secs": cfg.login_failure_window_secs,
            **self.login_limiter.statistics(
                cfg.login_failure_limit,
                cfg.login_failure_window_secs,
                cfg.login_failure_user_limit,
            ).as_dict(),
        }

    async def save_user(self, user: auth.User, *, expect: str | None) -> None:
        await self.write(
            PutSystemOp(
                b"user:" + user.name.encode(),
                user.to_record(),
                expect=expect,  # type: ignore[arg-type]
                on_present=errors.UserExists,
                on_absent=errors.UserNotFound,
                what=f"user {user.name!r}",
            )
        )
        self.users[user.name] = user
        self._forget(user.name)
        self.auth_epoch += 1

    async def drop_user(self, name: str) -> None:
        await self.write(
            PutSystemOp(
                b"user:" + name.encode(),
                None,
                expect="present",
                on_absent=errors.UserNotFound,
                what=f"user {name!r}",
            )
        )
        self.users.pop(name, None)
        self._forget(name)
        self.auth_epoch += 1
        for s in list(self.sessions):
            if s.user is not None and s.user.name == name:
                s.begin_shutdown()  # a deleted user's connections close

    def _forget(self, name: str) -> None:
        self._verified = {k: v for k, v in self._verified.items() if v != name}

    async def bootstrap_admin(self) -> None:
        """First start: create ``admin`` (password from the environment or generated)."""
        if self.users:
            if os.environ.get(ADMIN_PASSWORD_ENV):
                log.warning(
                    "%s is set but ignored: the data directory already has users (it only "
                    "sets the admin password on the first start; change a password with "
                    "tenantkv-admin user-update)",
                    ADMIN_PASSWORD_ENV,
                )
            return
        password = os.environ.get(ADMIN_PASSWORD_ENV)
        if password:
            log.info(
                "bootstrapping user %r with the password from %s", ADMIN_USER, ADMIN_PASSWORD_ENV
            )
        else:
            password = auth.generate_password()
            path = os.path.join(self.engine.path, ADMIN_PASSWORD_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            os.chmod(path, 0o600)
            log.info("bootstrapping user %r; its generated password is in %s", ADMIN_USER, path)
        user = await trio.to_thread.run_sync(
            lambda: auth.new_user(ADMIN_USER, password, admin=True)
        )
        await self.save_user(user, expect="absent")

    # -- status ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        used, size = self.engine.map_usage()
        buckets: dict[str, Any] = {}
        for name in sorted(self.engine.buckets):
            st = self.bucket_stats.get(name) or BucketStats()
            buckets[name] = {
                "entries": self.engine.bucket_entries(name),
                "connections": sum(1 for s in self.sessions if s.bucket == name),
                "ops": dict(st.ops),
                "errors": dict(st.errors),
            }
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_secs": round(time.monotonic() - self.started_monotonic, 3),
            "listening": f"{self.host}:{self.port}",
            "shutting_down": self.shutting_down,
            "connections": {
                "current": len(self.sessions),
                "total_created": self.connections_total,
                "rejected": self.connections_rejected,
                "backpressure": sum(1 for s in self.sessions if s.backpressure),
                "max": self.config.max_connections,
                "max_per_address": self.config.max_connections_per_address,
                "admin_reserved": self.config.admin_reserved_connections,
                "table": self.connection_table.statistics().as_dict(),
                "receive_buffers": self.receive_buffers.statistics().as_dict(),
            },
            "storage": {
                "path": self.engine.path,
                "map_size_bytes": size,
                "used_bytes": used,
                "durability": self.config.durability,
                "writer": self.writer.statistics(),
            },
            "buckets": buckets,
            "users": len(self.users),
            "latency": self.latency.status(),
            "authentication": self.login_statistics(),
            "throttle": self._throttle_status(),
            "ingress": {
                "request_rate_limiter": {
                    "enabled": self.config.ingress_request_rate_limiter_enabled,
                    **self.request_limiter.statistics().as_dict(),
                },
                "connection_establishment": {
                    "enabled": self.config.ingress_connection_establishment_rate_limiter_enabled,
                    **self.connection_limiter.statistics().as_dict(),
                    "interrupted_due_to_client_disconnect": self.connections_left_in_queue,
                },
                "admission": {
                    "enabled": self.pipeline.ingress_enabled,
                    **self.ingress_tickets.statistics().as_dict(),
                },
            },
            "bucket_queues": {
                "enabled": self.pipeline.queues_enabled,
                **self.queues.statistics().as_dict(),
            },
            "write_permits": {
                "enabled": self.pipeline.permits_enabled,
                **self.permits.statistics().as_dict(),
            },
            "execution": {
                "read": self.read_tickets.statistics().as_dict(),
                "write": self.write_tickets.statistics().as_dict(),
                "probing": self.prober.statistics().as_dict(),
            },
        }

    def _throttle_status(self) -> dict[str, Any]:
        doc = self.throttle.statistics().as_dict()
        for name, b in doc["buckets"].items():
            b["waiting"] = self.gate.waiting(name)  # requests parked right now
        return doc
