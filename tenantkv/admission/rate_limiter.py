"""Token-bucket rate limiter: the building block of MongoDB's ingress rate limiters.

One limiter guards one front door: the ingress request rate (every request a
session reads, rejected with ``IngressRequestRateLimitExceeded`` / 462) or the
session-establishment rate (new connections, which may wait in a short queue).

The bucket
    Holds up to ``burst = rate_per_sec x burst_capacity_secs`` tokens and starts
    full, so a node that was idle admits one burst at once. It is refilled
    *lazily*: every call first credits ``elapsed x rate_per_sec`` (capped at the
    burst), so there is no background task and an idle limiter costs nothing.
    A burst smaller than one token is raised to one token: otherwise a tiny
    ``burst_capacity_secs`` would mean nothing is ever admitted.

Two ways to ask (the ``try_acquire()`` / ``acquire()`` pair of the gate
protocol, :mod:`tenantkv.admission.gate`)
    :meth:`RateLimiter.try_acquire` (the core's :meth:`TokenBucket.take`)
    never borrows. It takes a token if a whole one is there; otherwise it
    counts a rejection and notes the seconds until a token will be there,
    which become the ``retryAfterMs`` of the 462 error (:func:`retry_after_ms`). This is what the
    ingress request limiter uses on the per-request fast path: a rejection is
    cheap and early, and the client's back-off does the waiting.

    :meth:`RateLimiter.acquire` *borrows*: it takes the token even when the
    balance is below one (it may go negative) and sleeps until the instant at
    which that token would have been valid. That is fair (FIFO: each borrower
    is owed the next token after the ones already borrowed) and needs no
    polling: each waiter sleeps on its own Trio deadline. Why borrow at all?
    Because a waiter that re-checked a non-borrowing bucket would race every
    newcomer for each refilled token.

Queue bound
    At most ``max_queue_depth`` callers may be waiting (``0``: none, so
    :meth:`~RateLimiter.acquire` admits or rejects at once, like
    ``try_acquire``). The next caller is rejected with the limiter's error
    (``IngressRequestRateLimitExceeded`` unless another class is given;
    labels ``SystemOverloadedError`` + ``RetryableError``, ``retryAfterMs`` set)
    and takes no token. A caller whose wait would outlast its ``deadline`` is
    rejected the same way at once, instead of sleeping just to fail.

Giving back
    A waiter that is cancelled (client gone, deadline, shutdown) returns its
    token and is counted in ``interrupted_in_queue``. Unlike MongoDB, which
    leaves the other sleepers' wake-up times alone, the waiters behind it are
    moved up by one token's worth of time at once: the debt they queued behind
    shrank by one token. A runtime :meth:`~RateLimiter.configure` re-times the
    waiters the same way, so a raised rate helps the ones already waiting.

Exempt work (``exempt=True``: admin, internal, CIDR exemptions) is never limited
and only counted (``exempted``); it is not part of ``attempted``.

Counters (:meth:`TokenBucket.statistics`, MongoDB's names in snake_case)::

    attempted = successful + rejected + interrupted_in_queue + queued (now)
    added_to_queue = removed_from_queue + queued (now)

``average_time_queued_micros`` is a moving average (``alpha = 0.2``) of the wait
of every caller :meth:`~RateLimiter.acquire` admitted (0 for those admitted at
once, as MongoDB does); ``take`` does not feed it.
``total_available_tokens`` is the balance floored at 0; ``token_balance`` is
the raw balance, negative while waiters have borrowed ahead.

Server integration
    Ingress requests: ``limiter.try_acquire(exempt=...)`` right after a frame
    is decoded, before any other gate (:meth:`Pipeline.check_request_rate
    <tenantkv.admission.pipeline.Pipeline.check_request_rate>`); a refusal is
    answered with ``limiter.rejection()`` (462). New connections:
    ``await limiter.acquire(exempt=...)`` before ``hello`` is processed.
    :class:`~tenantkv.admission.cidr.CidrMatcher` decides the peer exemption.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

from tenantkv.admission.gate import ADMITTED, Admitted, ParameterTable, trio_clock
from tenantkv.errors import BadValue, IngressRequestRateLimitExceeded, ServerError
from tenantkv.records import fields_dict

DEFAULT_BURST_CAPACITY_SECS: Final = 1.0
DEFAULT_MAX_QUEUE_DEPTH: Final = 0
#: Weight of the newest sample in ``average_time_queued_micros`` (MongoDB's).
AVERAGE_ALPHA: Final = 0.2
#: Upper bounds of the parameters (JSON and humans both dislike larger numbers).
MAX_RATE_PER_SEC: Final = 1e9
MAX_BURST_CAPACITY_SECS: Final = 1e6
MAX_QUEUE_DEPTH: Final = 1_000_000
#: Bound of ``retryAfterMs``: a hint beyond it only makes clients give up.
MAX_RETRY_AFTER_MS: Final = 10_000
#: A balance this close below one token counts as one (refills are floats).
_ONE: Final = 1.0 - 1e-9


def spread_hint_ms(wait: float, step: float) -> int:
    """The ``retryAfterMs`` a rejected caller is told: the real wait plus a random
    share of up to one more wait (at least ``step``, one token's interval), so the
    rejected callers of one instant do not all retry at the same one."""
    return retry_after_ms(wait + random.random() * max(wait, step))


def retry_after_ms(wait: float) -> int:
    """``retryAfterMs`` for ``wait`` seconds: at least 1, at most :data:`MAX_RETRY_AFTER_MS`."""
    if not wait * 1000.0 < MAX_RETRY_AFTER_MS:  # also inf and nan
        return MAX_RETRY_AFTER_MS
    return max(1, math.ceil(wait * 1000.0))


def _check_positive(name: str, value: object, upper: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0.0 < value <= upper  # also nan
    ):
        raise BadValue(f"{name} must be a number in (0, {upper:g}], got {value!r}")
    return float(value)


def _check_depth(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUEUE_DEPTH:
        raise BadValue(f"{name} must be an integer in [0, {MAX_QUEUE_DEPTH}], got {value!r}")
    return value


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True)
class RateLimiterStatistics:
    """A limiter's counters and settings (an immutable snapshot)."""

    name: str
    rate_per_sec: float
    burst_capacity_secs: float
    #: Tokens the bucket holds when full (``rate x burst secs``, at least 1).
    burst_size: float
    max_queue_depth: int
    #: Callers waiting right now.
    queued: int
    attempted: int
    successful: int
    rejected: int
    exempted: int
    interrupted_in_queue: int
    added_to_queue: int
    removed_from_queue: int
    average_time_queued_micros: float
    total_available_tokens: float
    token_balance: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the limiter's section of ``server_status``)."""
        return {
            **fields_dict(self, left_out=("name",)),
            "average_time_queued_micros": round(self.average_time_queued_micros, 1),
            "total_available_tokens": round(self.total_available_tokens, 3),
            "token_balance": round(self.token_balance, 3),
        }


# --------------------------------------------------------------------------- the core


class Waiter:
    """One borrower waiting for its token.

    ``deadline`` is the clock time at which its token is valid; the core moves
    it when a token comes back or the rate changes. ``scope`` belongs to the
    adapter (what it sleeps in), the core never touches it.
    """

    __slots__ = ("deadline", "enqueued", "scope")

    def __init__(self, deadline: float, enqueued: float) -> None:
        self.deadline = deadline
        self.enqueued = enqueued
        self.scope: Any = None


class TokenBucket:
    """A lazily refilled token bucket with a bounded borrowing queue (see the module doc).

    Pure logic: ``clock`` returns seconds (any origin); :class:`RateLimiter`
    needs it to be ``trio.current_time``. ``param_prefix`` prefixes the
    parameter names in :class:`~tenantkv.errors.BadValue` messages (the server
    passes e.g. ``"ingress_request_"``); ``error`` is the exception type of a
    rejection (any overload error taking ``retry_after_ms=``).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        rate_per_sec: float,
        burst_capacity_secs: float = DEFAULT_BURST_CAPACITY_SECS,
        max_queue_depth: int = DEFAULT_MAX_QUEUE_DEPTH,
        name: str = "rate limiter",
        param_prefix: str = "",
        error: type[ServerError] = IngressRequestRateLimitExceeded,
    ) -> None:
        self.name = name
        self._prefix = param_prefix
        self._error = error
        self._clock = clock
        self._rate = _check_positive(f"{param_prefix}rate_per_sec", rate_per_sec, MAX_RATE_PER_SEC)
        self._burst_secs = _check_positive(
            f"{param_prefix}burst_capacity_secs", burst_capacity_secs, MAX_BURST_CAPACITY_SECS
        )
        self._depth = _check_depth(f"{param_prefix}max_queue_depth", max_queue_depth)
        self._burst = max(1.0, self._rate * self._burst_secs)
        self._tokens = self._burst  # starts full
        self._last = clock()
        self._waiters: deque[Waiter] = deque()
        self._attempted = 0
        self._successful = 0
        self._rejected = 0
        self._exempted = 0
        self._interrupted = 0
        self._added = 0
        self._removed = 0
        self._avg_us = 0.0
        self._avg_primed = False
        #: the rate-exceeded message, for the (rate, burst) it was formatted for
        self._message_key: tuple[float, float] | None = None
        self._message = ""

    # ------------------------------------------------------------------ hot path

    def take(self, *, exempt: bool = False) -> float:
        """Take a token without borrowing: ``0.0`` if taken, else seconds until one is there.

        Never waits and never queues; a non-zero answer is a counted rejection
        (build the error with :meth:`rejection`). ``exempt`` callers always get
        ``0.0`` and are only counted.
        """
        if exempt:
            self._exempted += 1
            return 0.0
        now = self._clock()
        t = self._tokens
        if now > self._last:
            t += (now - self._last) * self._rate
            if t > self._burst:
                t = self._burst
            self._last = now
        self._attempted += 1
        if t >= _ONE:
            self._tokens = t - 1.0
            self._successful += 1
            return 0.0
        self._tokens = t
        self._rejected += 1
        return (1.0 - t) / self._rate

    def record_exemption(self) -> None:
        """Count one exempt caller (never limited)."""
        self._exempted += 1

    def lend(self, now: float | None = None) -> float | None:
        """Every token the bucket holds now, lent to a batch of callers that run one
        after another with nothing else taking in between (one received chunk's
        requests). Each takes one while at least one is left (``>= 1 - 1e-9``, as
        :meth:`take`) and is refused otherwise, waiting ``(1 - left) / rate``: the
        answers :meth:`take` would give them at this instant, for one clock read
        (``now``: the caller's reading of this bucket's clock, when it has one —
        the chunk's). None while callers wait to borrow (they come first: take
        one by one). Give back what is left, with the counts, by :meth:`settle`."""
        if self._waiters:
            return None
        t = self._refill(self._clock() if now is None else now)
        self._tokens = 0.0
        return t

    def take_at(self, now: float) -> bool:
        """Take a token at ``now`` (the caller's reading of this bucket's clock) if
        one is there, counted as admitted; False, with nothing taken or counted,
        when none is or callers wait to borrow: the caller then asks another way
        (:meth:`lend`, whose refusals :meth:`settle` counts). One call for the
        first request of a received chunk, which is most often its only one."""
        if self._waiters:
            return False
        t = self._refill(now)
        if t < _ONE:
            return False
        self._tokens = t - 1.0
        self._attempted += 1
        self._successful += 1
        return True

    def settle(self, left: float, admitted: int, refused: int) -> None:
        """End a loan of :meth:`lend`: ``left`` tokens come back; count the batch."""
        self._tokens += left
        self._attempted += admitted + refused
        self._successful += admitted
        self._rejected += refused

    # ------------------------------------------------------------------ borrowing

    def borrow(self, deadline: float | None = None) -> Waiter | None:
        """Take a token, borrowing if need be: ``None`` = admitted now, else wait.

        The returned :class:`Waiter` must be settled with :meth:`finish` (at or
        after its ``deadline``) or :meth:`cancel`. Raises the limiter's error
        (nothing taken, counted as rejected) when ``max_queue_depth`` callers
        already wait, or when the token would come after ``deadline`` (clock time).
        """
        now = self._clock()
        t = self._refill(now)
        self._attempted += 1
        if t >= _ONE:
            self._tokens = t - 1.0
            self._successful += 1
            self._sample(0.0)
            return None
        wait = (1.0 - t) / self._rate
        if len(self._waiters) >= self._depth:
            self._rejected += 1
            raise self.rejection(
                wait, f"{self.name}: queue full ({self._prefix}max_queue_depth {self._depth})"
            )
        if deadline is not None and now + wait > deadline:
            self._rejected += 1
            raise self.rejection(
                wait, f"{self.name}: rate exceeded; the wait would outlast the request's deadline"
            )
        self._tokens = t - 1.0
        waiter = Waiter(now + wait, now)
        self._waiters.append(waiter)
        self._added += 1
        return waiter

    def finish(self, waiter: Waiter) -> None:
        """``waiter`` slept until its token was valid: it is admitted."""
        self._remove(waiter)
        self._successful += 1
        self._sample((self._clock() - waiter.enqueued) * 1e6)

    def cancel(self, waiter: Waiter) -> None:
        """``waiter`` gave up: its token goes back and the ones behind move up."""
        now = self._clock()
        t = self._refill(now)
        self._remove(waiter)
        self._interrupted += 1
        t += 1.0
        self._tokens = t if t < self._burst else self._burst
        self._reschedule(now)

    @property
    def waiters(self) -> tuple[Waiter, ...]:
        """The callers waiting now, in order (for the adapter)."""
        return tuple(self._waiters)

    def rejection(self, wait: float, message: str | None = None) -> ServerError:
        """The error for a caller turned away ``wait`` seconds before a token is there."""
        if message is None:
            # Formatted once per configuration: a flood of rejections should cost
            # as little as possible (issue 17's "rejections are cheap").
            key = (self._rate, self._burst)
            if self._message_key != key:
                self._message_key = key
                self._message = (
                    f"{self.name}: rate exceeded ({self._prefix}rate_per_sec {self._rate:g}, "
                    f"burst {self._burst:g})"
                )
            message = self._message
        return self._error(message, retry_after_ms=spread_hint_ms(wait, 1.0 / self._rate))

    # ------------------------------------------------------------------ configuration

    @property
    def rate_per_sec(self) -> float:
        return self._rate

    @property
    def burst_capacity_secs(self) -> float:
        return self._burst_secs

    @property
    def max_queue_depth(self) -> int:
        return self._depth

    def configure(
        self,
        *,
        rate_per_sec: float | None = None,
        burst_capacity_secs: float | None = None,
        max_queue_depth: int | None = None,
    ) -> None:
        """Change parameters at runtime (``None`` = unchanged); all or nothing.

        Tokens earned so far are kept (capped at the new burst); waiters are
        re-timed for the new rate. A lowered ``max_queue_depth`` lets the
        callers already waiting stay; only newcomers are turned away.
        """
        p = self._prefix
        rate = (
            self._rate
            if rate_per_sec is None
            else _check_positive(f"{p}rate_per_sec", rate_per_sec, MAX_RATE_PER_SEC)
        )
        secs = (
            self._burst_secs
            if burst_capacity_secs is None
            else _check_positive(
                f"{p}burst_capacity_secs", burst_capacity_secs, MAX_BURST_CAPACITY_SECS
            )
        )
        depth = (
            self._depth
            if max_queue_depth is None
            else _check_depth(f"{p}max_queue_depth", max_queue_depth)
        )
        now = self._clock()
        t = self._refill(now)  # earned at the old rate up to now
        self._rate, self._burst_secs, self._depth = rate, secs, depth
        self._burst = max(1.0, rate * secs)
        self._tokens = t if t < self._burst else self._burst
        self._reschedule(now)

    # ------------------------------------------------------------------ stats

    def statistics(self) -> RateLimiterStatistics:
        """An immutable snapshot of the counters (trio's ``statistics()`` convention)."""
        t = self._refill(self._clock())
        return RateLimiterStatistics(
            name=self.name,
            rate_per_sec=self._rate,
            burst_capacity_secs=self._burst_secs,
            burst_size=self._burst,
            max_queue_depth=self._depth,
            queued=len(self._waiters),
            attempted=self._attempted,
            successful=self._successful,
            rejected=self._rejected,
            exempted=self._exempted,
            interrupted_in_queue=self._interrupted,
            added_to_queue=self._added,
            removed_from_queue=self._removed,
            average_time_queued_micros=self._avg_us,
            total_available_tokens=max(0.0, t),
            token_balance=t,
        )

    # ------------------------------------------------------------------ internals

    def _refill(self, now: float) -> float:
        t = self._tokens
        if now > self._last:
            t += (now - self._last) * self._rate
            if t > self._burst:
                t = self._burst
            self._tokens = t
            self._last = now
        return t

    def _remove(self, waiter: Waiter) -> None:
        q = self._waiters
        if q and q[0] is waiter:
            q.popleft()
        else:
            q.remove(waiter)
        self._removed += 1

    def _reschedule(self, now: float) -> None:
        """Re-derive every waiter's deadline from the balance.

        Waiter ``i`` of ``n`` is owed the token that brings the balance up to
        ``-(n - 1 - i)``: the ones behind it still owe theirs.
        """
        n = len(self._waiters)
        debt = -self._tokens
        rate = self._rate
        for i, w in enumerate(self._waiters):
            owed = debt - (n - 1 - i)
            w.deadline = now + owed / rate if owed > 0.0 else now

    def _sample(self, micros: float) -> None:
        if self._avg_primed:
            self._avg_us += AVERAGE_ALPHA * (micros - self._avg_us)
        else:
            self._avg_us = micros
            self._avg_primed = True


# --------------------------------------------------------------------------- Trio adapter


class RateLimiter:
    """Trio adapter for :class:`TokenBucket`: borrowers sleep until their token is valid.

    The bucket's clock must be ``trio.current_time``. Each waiter sleeps in a
    cancel scope whose deadline is its token's time; when the core re-times the
    waiters (a token returned, a parameter changed) the adapter moves those
    deadlines, so nobody polls.
    """

    def __init__(self, bucket: TokenBucket) -> None:
        self.bucket = bucket
        #: :meth:`TokenBucket.lend` and :meth:`TokenBucket.settle`: one received
        #: chunk's loan, and :meth:`TokenBucket.take_at`: its first request's token
        #: (the core's own methods: nothing to wake, a call less each)
        self.lend = bucket.lend
        self.settle = bucket.settle
        self.take_at = bucket.take_at
        #: the wait of the last refusal of try_acquire, for rejection()
        self._refused_wait = 0.0

    @classmethod
    def create(cls, **settings: Any) -> RateLimiter:
        """A limiter on Trio's clock (call inside ``trio.run``); ``settings`` are
        :class:`TokenBucket`'s (``rate_per_sec``, ``burst_capacity_secs``...)."""
        return cls(TokenBucket(trio_clock(), **settings))

    def try_acquire(self, *, exempt: bool = False) -> Admitted | None:
        """:data:`ADMITTED` with a token taken, or None (a counted rejection: answer
        it with :meth:`rejection`, whose ``retryAfterMs`` is this refusal's wait)."""
        wait = self.bucket.take(exempt=exempt)
        if wait == 0.0:
            return ADMITTED
        self._refused_wait = wait
        return None

    def rejection(self) -> ServerError:
        """The error for the last :meth:`try_acquire` that answered None."""
        return self.bucket.rejection(self._refused_wait)

    def wait_when(self, left: float) -> float:
        """Seconds until a caller of a loan refused with ``left`` tokens remaining
        could have a token."""
        return (1.0 - left) / self.bucket.rate_per_sec

    def rejection_in(self, wait: float) -> ServerError:
        """The error for a caller refused ``wait`` seconds before a token is there
        (a loan's refusal: :meth:`wait_when`)."""
        return self.bucket.rejection(wait)

    def release(self, hold: Admitted, /) -> None:
        """Nothing to give back: a token is spent once taken."""

    async def acquire(self, *, exempt: bool = False, deadline: float | None = None) -> Admitted:
        """Return once admitted; borrow a token and sleep until it is valid if need be.

        No checkpoint when admitted at once (or exempt). Raises the limiter's
        error at once when the queue is full or the wait would outlast
        ``deadline`` (trio time). Cancelled while waiting, the token goes back.
        """
        bucket = self.bucket
        if exempt:
            bucket.record_exemption()
            return ADMITTED
        waiter = bucket.borrow(deadline)
        if waiter is None:
            return ADMITTED
        try:
            while True:
                with trio.CancelScope(deadline=waiter.deadline) as scope:
                    waiter.scope = scope
                    await trio.sleep_forever()
                # Woken by our own deadline; it may have moved later meanwhile.
                if trio.current_time() >= waiter.deadline:
                    break
        except BaseException:
            bucket.cancel(waiter)
            self._retime()
            raise
        bucket.finish(waiter)
        return ADMITTED

    def configure(self, **changes: Any) -> None:
        """:meth:`TokenBucket.configure`, then wake the waiters at their new times."""
        self.bucket.configure(**changes)
        self._retime()

    def statistics(self) -> RateLimiterStatistics:
        return self.bucket.statistics()

    def parameter_table(self) -> ParameterTable:
        return {
            "rate_per_sec": lambda v: self.configure(rate_per_sec=v),
            "burst_capacity_secs": lambda v: self.configure(burst_capacity_secs=v),
            "max_queue_depth": lambda v: self.configure(max_queue_depth=v),
        }

    def _retime(self) -> None:
        for w in self.bucket.waiters:
            if w.scope is not None:
                w.scope.deadline = w.deadline
