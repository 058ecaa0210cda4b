"""Client back-pressure: which errors are retried, after how long, and where.

One sans-IO policy serves :class:`tenantkv.Client` and :class:`tenantkv.AsyncClient`
(the rules of the MongoDB drivers' client back-pressure specification). The
policy never sleeps and never sends: for each operation it hands out a
:class:`RetryState`, a small state machine that answers every failed attempt
with the next :class:`Attempt` — "sleep ``delay`` seconds, then send attempt
``number`` to server ``server``" — or with ``None``: raise the error. A
driver's loop is only this::

    op = policy.begin(call, now=clock(), timeout=timeout, servers=servers, monitor=monitor)
    attempt = op.first_attempt()
    while True:
        sleep(attempt.delay)                        # time.sleep / trio.sleep
        try:
            result = send(attempt.server, op.sending(attempt, clock()), op.deadline)
        except BaseException as exc:
            attempt = op.after_failure(exc, clock())  # or raises exc
            continue
        op.succeeded(clock())
        return result

(``after_unavailable`` likewise when no connection to ``attempt.server`` opens.)

Rules
    * An error is retried only if it carries both ``SystemOverloadedError`` and
      ``RetryableError`` (the server guarantees the request had no effect) and
      the command is eligible: reads when ``retry_reads``, writes when
      ``retry_writes``, a generic ``command()`` only when both are on.
    * At most ``max_overload_retries`` retries per operation. Every retry is an
      overload retry, so once an overload error has been seen this limit caps
      all retries of the operation.
    * Before retry *n* (n >= 1) the client sleeps
      ``jitter x min(max_backoff, base_backoff x 2**(n-1))``, jitter uniform in
      [0, 1), and never less than the server's ``retryAfterMs`` when it sent one.
      Errors without ``SystemOverloadedError`` are never retried, so never backed off.
    * With ``adaptive_retries`` a token bucket (one per policy, so per client
      unless shared) limits retries: each costs a token, and without one the
      error is raised. Success deposits 0.1 (first attempt) or 1.1 (a retry); a
      retry that fails with a non-overload error returns its token (1).
    * The operation's deadline (its timeout) goes to the server with every
      attempt as ``timeout_ms`` (the time left, in whole ms), and no retry is
      made whose backoff would end at or after the deadline.
    * A retry of a data command goes to another server when the client has
      several (:meth:`tenantkv.client.servers.ServerSet.pick_retry`); every
      other command is retried on the server it started on.
"""

from __future__ import annotations

import logging
import random as _random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from tenantkv import errors
from tenantkv.client.core import Call
from tenantkv.client.monitoring import EventPublisher
from tenantkv.client.servers import ServerSet

log = logging.getLogger("tenantkv.client")

DEFAULT_MAX_OVERLOAD_RETRIES: Final = 5
DEFAULT_BASE_BACKOFF: Final = 0.1
DEFAULT_MAX_BACKOFF: Final = 10.0
#: Capacity of the adaptive retry token bucket (it starts full).
RETRY_TOKEN_CAPACITY: Final = 1000
#: Tokens a successful operation deposits; a successful retry adds 1 more.
RETRY_TOKEN_RETURN_RATE: Final = 0.1

#: Commands that act on keys of the selected bucket: the only ones whose retry may
#: go to another server. Admin and session commands stay where they started.
DATA_COMMANDS: Final = frozenset(
    {"get", "exists", "mget", "scan", "set", "delete", "touch", "incr", "decr"}
)

_NO_SERVER = frozenset[int]()


class RetryTokenBucket:
    """The adaptive-retry token bucket: ``capacity`` tokens, starting full.

    Kept in tenths of a token as an integer, so deposits of 0.1 add up exactly.
    Thread-safe (a lock held only for the arithmetic, never across a wait), so one
    bucket may serve a blocking client used from several threads, all the tasks of
    an :class:`~tenantkv.AsyncClient`, or several clients sharing one policy.
    """

    __slots__ = ("_capacity", "_lock", "_tenths")

    def __init__(self, capacity: float = RETRY_TOKEN_CAPACITY, tokens: float | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self._capacity = round(capacity * 10)
        self._tenths = self._capacity if tokens is None else min(self._capacity, round(tokens * 10))
        self._lock = threading.Lock()

    @property
    def capacity(self) -> float:
        return self._capacity / 10

    @property
    def tokens(self) -> float:
        return self._tenths / 10

    def try_consume(self, amount: float = 1.0) -> bool:
        """Take ``amount`` tokens if there are that many; False (nothing taken) otherwise."""
        need = round(amount * 10)
        with self._lock:
            if self._tenths < need:
                return False
            self._tenths -= need
            return True

    def deposit(self, amount: float) -> None:
        """Add ``amount`` tokens, never beyond the capacity."""
        add = round(amount * 10)
        with self._lock:
            self._tenths = min(self._capacity, self._tenths + add)

    def __repr__(self) -> str:
        return f"RetryTokenBucket(tokens={self.tokens}, capacity={self.capacity})"


@dataclass(frozen=True, slots=True)
class Attempt:
    """A decision: sleep ``delay`` seconds, then send attempt ``number`` to ``server``."""

    #: 1 for the first attempt
    number: int
    #: index into the client's address list
    server: int
    #: seconds to sleep first (0 for the first attempt)
    delay: float = 0.0


class RetryPolicy:
    """How a client reacts to overload errors; see the module docstring for the rules.

    Immutable settings plus, with ``adaptive_retries``, the token bucket. Share
    one policy between clients to share their bucket. ``random`` is the jitter
    source (a function returning a float in [0, 1)); tests pass a fixed one.
    """

    __slots__ = (
        "adaptive_retries",
        "base_backoff",
        "max_backoff",
        "max_overload_retries",
        "random",
        "retry_reads",
        "retry_writes",
        "token_bucket",
    )

    def __init__(
        self,
        *,
        retry_reads: bool = True,
        retry_writes: bool = True,
        max_overload_retries: int = DEFAULT_MAX_OVERLOAD_RETRIES,
        base_backoff: float = DEFAULT_BASE_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        adaptive_retries: bool = False,
        token_bucket: RetryTokenBucket | None = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if type(max_overload_retries) is not int or max_overload_retries < 0:
            raise ValueError("max_overload_retries must be an integer >= 0")
        if not base_backoff >= 0 or not max_backoff >= 0:
            raise ValueError("base_backoff and max_backoff must be >= 0 seconds")
        if token_bucket is not None and not adaptive_retries:
            raise ValueError("token_bucket needs adaptive_retries=True")
        self.retry_reads = retry_reads
        self.retry_writes = retry_writes
        self.max_overload_retries = max_overload_retries
        self.base_backoff = float(base_backoff)
        self.max_backoff = float(max_backoff)
        self.adaptive_retries = adaptive_retries
        #: the adaptive token bucket (None when adaptive retries are off)
        self.token_bucket = (token_bucket or RetryTokenBucket()) if adaptive_retries else None
        self.random = random

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(retry_reads={self.retry_reads}, retry_writes={self.retry_writes}, "
            f"max_overload_retries={self.max_overload_retries}, "
            f"base_backoff={self.base_backoff}, max_backoff={self.max_backoff}, "
            f"adaptive_retries={self.adaptive_retries})"
        )

    def eligible(self, call: Call[Any]) -> bool:
        """May this command be retried at all (by its class and the settings)?"""
        if call.generic:
            return self.retry_reads and self.retry_writes
        return self.retry_reads if call.is_read else self.retry_writes

    def backoff(self, retry: int, retry_after_ms: int | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (1 = the first retry)."""
        cap = self.base_backoff * 2 ** (retry - 1)
        if cap > self.max_backoff:
            cap = self.max_backoff
        delay = self.random() * cap
        if retry_after_ms is not None and retry_after_ms / 1000 > delay:
            delay = retry_after_ms / 1000
        return delay

    def begin(
        self,
        call: Call[Any],
        *,
        now: float,
        timeout: float | None,
        servers: ServerSet,
        monitor: EventPublisher | None = None,
        operation_id: int = 0,
        retry: bool = True,
    ) -> RetryState:
        """The state machine of one operation starting at ``now`` (the driver's clock).

        ``timeout`` (seconds, None = none) sets the deadline; an int
        ``timeout_ms`` the caller put in the parameters (``command(...,
        timeout_ms=...)``) shortens it. ``retry=False`` makes a single attempt
        that still publishes its events (pipelines).
        """
        return RetryState(self, call, now, timeout, servers, monitor, operation_id, retry)


_NO_MONITOR = EventPublisher()


class RetryState:
    """One operation: its deadline, attempts so far, and the next decision."""

    __slots__ = (
        "_address",
        "_avoid",
        "_monitor",
        "_policy",
        "_retry",
        "_servers",
        "_started_at",
        "attempt",
        "call",
        "deadline",
        "operation_id",
        "retries",
        "server",
    )

    def __init__(
        self,
        policy: RetryPolicy,
        call: Call[Any],
        now: float,
        timeout: float | None,
        servers: ServerSet,
        monitor: EventPublisher | None,
        operation_id: int,
        retry: bool,
    ) -> None:
        self._policy = policy
        self.call = call
        self._servers = servers
        self._monitor = monitor or _NO_MONITOR
        self.operation_id = operation_id
        self._retry = retry
        given_ms = call.params.get("timeout_ms")
        if type(given_ms) is int and given_ms >= 0:
            timeout = given_ms / 1000 if timeout is None else min(timeout, given_ms / 1000)
        #: absolute time (driver's clock) the operation must end by; None = no limit
        self.deadline: float | None = None if timeout is None else now + timeout
        #: number of the attempt under way (0 before the first)
        self.attempt = 0
        #: retries granted so far
        self.retries = 0
        #: index of the server of the current attempt
        self.server = servers.home
        self._avoid: frozenset[int] | set[int] = _NO_SERVER
        self._started_at = now
        self._address = servers.addresses[servers.home]

    def first_attempt(self) -> Attempt:
        return Attempt(1, self._servers.home, 0.0)

    def params(self, now: float) -> dict[str, Any]:
        """The request's parameters for an attempt sent at ``now``: ``timeout_ms`` added."""
        if self.deadline is None:
            return self.call.params
        left_ms = round((self.deadline - now) * 1000)
        return {**self.call.params, "timeout_ms": left_ms if left_ms > 0 else 0}

    def sending(self, attempt: Attempt, now: float) -> dict[str, Any]:
        """The driver sends ``attempt`` now: :meth:`started`, and its parameters."""
        self.started(attempt, now)
        return self.params(now)

    def after_failure(self, exc: BaseException, now: float) -> Attempt:
        """:meth:`failed`, for a driver's ``except`` block: the next attempt, or ``exc``
        raised again when there is none."""
        attempt = self.failed(exc, now)
        if attempt is None:
            raise exc
        return attempt

    def after_unavailable(self, attempt: Attempt, exc: BaseException, now: float) -> Attempt:
        """:meth:`server_unavailable`, for a driver's ``except`` block: the next
        attempt, or ``exc`` raised again when there is none."""
        nxt = self.server_unavailable(attempt, exc, now)
        if nxt is None:
            raise exc
        return nxt

    def started(self, attempt: Attempt, now: float) -> None:
        """The driver is sending ``attempt`` now."""
        self.attempt = attempt.number
        self.server = attempt.server
        self._started_at = now
        self._address = self._servers.addresses[attempt.server]
        if self._monitor.enabled:
            self._monitor.started(
                self.call.method, self.operation_id, attempt.number, self._address
            )

    def succeeded(self, now: float) -> None:
        bucket = self._policy.token_bucket
        if bucket is not None and self._retry:
            bucket.deposit(RETRY_TOKEN_RETURN_RATE + (1 if self.attempt > 1 else 0))
        if self._monitor.enabled:
            self._monitor.succeeded(
                self.call.method,
                self.operation_id,
                self.attempt,
                self._address,
                now - self._started_at,
            )

    def failed(self, exc: BaseException, now: float) -> Attempt | None:
        """The current attempt failed with ``exc``: the next attempt, or None to raise ``exc``."""
        decision = self._decide(exc, now) if self._retry else None
        if self._monitor.enabled:
            self._monitor.failed(
                self.call.method,
                self.operation_id,
                self.attempt,
                self._address,
                now - self._started_at,
                exc,
                decision is not None,
            )
        return decision

    def server_unavailable(
        self, attempt: Attempt, exc: BaseException, now: float
    ) -> Attempt | None:
        """No connection to ``attempt.server`` could be opened (nothing was sent).

        The home server's connection is the client's own, so that error is
        raised; another server is marked down and the same attempt goes to the
        next candidate without a further delay.
        """
        servers = self._servers
        if attempt.server == servers.home:
            # The client's own server, restarting maybe: try it again with backoff,
            # within the deadline (nothing was sent, so any command may retry).
            if not isinstance(exc, errors.TenantKVError):
                return None
            return self._retry_after_loss(exc, now)
        servers.mark_down(attempt.server, now)
        server = servers.pick_retry(attempt.server, self._avoid, now)
        log.debug(
            "server %s:%d unavailable (%s); %s attempt %d goes to %s:%d",
            *servers.addresses[attempt.server],
            exc,
            self.call.method,
            attempt.number,
            *servers.addresses[server],
        )
        return Attempt(attempt.number, server, 0.0)

    # -- the rules --------------------------------------------------------------

    def _decide(self, exc: BaseException, now: float) -> Attempt | None:
        policy = self._policy
        bucket = policy.token_bucket
        if not isinstance(exc, errors.TenantKVError):
            return None  # cancellation, interrupts, bugs: never retried
        if _did_not_run(exc) or (isinstance(exc, errors.PeerClosed) and self.call.is_read):
            # A server restart: the request provably did not run (refused while
            # stopping, or the connection broke before it was sent), or it was a
            # read, which may run twice. The next attempt reconnects.
            return self._retry_after_loss(exc, now)
        labels = exc.labels
        if errors.SYSTEM_OVERLOADED not in labels:
            if bucket is not None and self.attempt > 1:
                bucket.deposit(1)  # the retry did not meet overload: its token comes back
            return None
        if errors.RETRYABLE not in labels:
            self._give_up(exc, "the error is not retryable")
            return None
        if not policy.eligible(self.call):
            self._give_up(exc, "retries are off for this kind of command")
            return None
        delay = self._budgeted_delay(exc, now)
        if delay is None:
            return None
        if bucket is not None and not bucket.try_consume(1):
            self._give_up(exc, "the adaptive retry token bucket is empty")
            return None
        self.retries += 1
        servers = self._servers
        server = self.server
        if len(servers) > 1 and self.call.method in DATA_COMMANDS:
            if self._avoid is _NO_SERVER:
                self._avoid = set()
            assert isinstance(self._avoid, set)
            self._avoid.add(server)
            server = servers.pick_retry(server, self._avoid, now)
        log.debug(
            "retrying %s (operation %d) after %s from %s:%d: attempt %d on %s:%d in %.3f s",
            self.call.method,
            self.operation_id,
            exc.code_name,
            *self._address,
            self.attempt + 1,
            *servers.addresses[server],
            delay,
        )
        return Attempt(self.attempt + 1, server, delay)

    def _retry_after_loss(self, exc: errors.TenantKVError, now: float) -> Attempt | None:
        """Retry on the same server after a lost connection or a stopping server,
        with backoff, within the deadline and the retry budget (as redis-py and
        PyMongo users expect a client to ride out a restart)."""
        delay = self._budgeted_delay(exc, now)
        if delay is None:
            return None
        self.retries += 1
        log.debug(
            "retrying %s (operation %d) after %s: attempt %d in %.3f s",
            self.call.method,
            self.operation_id,
            exc.code_name,
            self.attempt + 1,
            delay,
        )
        return Attempt(self.attempt + 1, self.server, delay)

    def _budgeted_delay(self, exc: errors.TenantKVError, now: float) -> float | None:
        """The backoff before the next retry, or None (logged) when the retry budget
        or the operation's deadline leaves no room for one."""
        policy = self._policy
        if self.retries >= policy.max_overload_retries:
            self._give_up(exc, f"{self.retries} retries made, the most allowed")
            return None
        delay = policy.backoff(self.retries + 1, exc.retry_after_ms)
        if self.deadline is not None and now + delay >= self.deadline:
            self._give_up(exc, f"a {delay:.3f} s backoff would pass the deadline")
            return None
        return delay

    def _give_up(self, exc: errors.TenantKVError, why: str) -> None:
        log.debug(
            "not retrying %s (operation %d) after %s on attempt %d: %s",
            self.call.method,
            self.operation_id,
            exc.code_name,
            self.attempt,
            why,
        )
        return None


def _did_not_run(exc: errors.TenantKVError) -> bool:
    """The error guarantees the request had no effect, whatever its kind. A slot
    switching nodes (a rebalance) refuses writes for well under a second: the same
    node then runs it or, once the map moved, says where the key went."""
    return isinstance(exc, errors.RequestNotSent | errors.ShuttingDown | errors.SlotMoving)


def policy_from_settings(retry_policy: RetryPolicy | None, **settings: Any) -> RetryPolicy:
    """A client's policy: ``retry_policy`` as given, or one built from the separate
    settings (:class:`RetryPolicy`'s arguments, each as the client was given it)."""
    if retry_policy is None:
        return RetryPolicy(**settings)
    defaults = RetryPolicy()
    for name, value in settings.items():
        if value != getattr(defaults, name):
            raise ValueError(f"give either retry_policy or {name}, not both")
    return retry_policy
