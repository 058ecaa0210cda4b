"""The tenant throttle's gate: the Trio adapter that parks throttled requests FIFO
per bucket until :class:`~tenantkv.admission.tenant_throttle.TenantThrottle`
predicts they may run, or refuses them at once when waiting cannot help (the
rules: docs/throttling.md, "Waiting and rejecting")."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import replace
from typing import Final

import trio

from tenantkv.admission.gate import ADMITTED, Admitted, ParameterTable
from tenantkv.admission.tenant_throttle import (
    NONBLOCKING_MAX_RETRY_MS,
    WAKE_GUARD_SECS,
    TenantThrottle,
)
from tenantkv.admission.throttle_stats import ThrottleStatistics
from tenantkv.errors import (
    BucketNotFound,
    DeadlineExceeded,
    HardLimitZero,
    ServerError,
    Throttled,
)

_INF: Final = math.inf


class _Waiter:
    """One parked request: its wake-up event and whether its bucket vanished."""

    __slots__ = ("event", "removed")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.removed = False


def _spread(wait: float, slice_secs: float) -> float:
    """A retry hint spread over the next refill: every rejected client is told a
    different moment, so their retries do not all land on the same refill (and
    crowd out first attempts there). Never sooner than the predicted wait, and
    at most one slice later."""
    return wait + random.random() * slice_secs


def _retry_after_ms(wait: float) -> int:
    """``retryAfterMs`` for a predicted wait: never shorter than the wait itself
    (a hint that is too short only brings a retry that fails again), at least 1.
    Callers never pass an unknown wait (``inf``): they resolve it first."""
    if wait == _INF:
        return NONBLOCKING_MAX_RETRY_MS
    return max(1, math.ceil((wait - WAKE_GUARD_SECS) * 1000.0))


def _ms(secs: float) -> int:
    return max(0, math.ceil(secs * 1000.0 - 1e-6))


class TenantThrottleGate:
    """Trio adapter for :class:`TenantThrottle`: waits FIFO per bucket.

    The throttle's clock must be ``trio.current_time``. No background task: the
    head of each bucket's queue sleeps until the throttle's predicted refill and
    re-checks; the others park on an event until they reach the head.

    A wait the throttle cannot predict (``inf``: a rate of 0 for now, which the
    next slice's recompute may change) is waited out a slice at a time, within
    the request's bound; it never becomes a long hint.
    """

    def __init__(self, throttle: TenantThrottle) -> None:
        self.throttle = throttle
        self._queues: dict[str, deque[_Waiter]] = {}

    def waiting(self, bucket: str) -> int:
        """How many requests are parked for ``bucket``."""
        queue = self._queues.get(bucket)
        return len(queue) if queue else 0

    def try_acquire(
        self,
        bucket: str,
        *,
        unthrottled: bool = False,
        nonblocking: bool = False,
        turn: bool = False,
        cost: int = 0,
    ) -> Admitted | None:
        """:data:`ADMITTED` if an operation on ``bucket`` may run now (allowance left
        and nobody parked ahead of it, or ``unthrottled``), else None. The fast path:
        no clock read while the bucket has allowance.

        ``cost``: a write's cost, known before it runs (:meth:`TenantThrottle.write_wait`);
        the caller then reserves it (:meth:`reserve`) before anything else runs.

        ``turn``: the caller comes right after one of its own requests was
        admitted on the waiting path, with nothing run in between (the rest of a
        received chunk): the others parked do not count as ahead of it, only the
        allowance does. The queue then takes turns a connection's chunk at a
        time, not a request at a time.

        When waiting could not help — a ``nonblocking`` request, a hard limit of
        0, or the bucket's own unthrottled use taking all its allowance — it
        raises the rejection :meth:`acquire` would raise, at once: a refused
        request then costs no coroutine, no second pass through the gates.
        """
        throttle = self.throttle
        if unthrottled:
            throttle.admission_wait(bucket, unthrottled=True)  # charged later, never delayed
            return ADMITTED
        if not throttle._enabled:  # the attribute, not the property: a call less per op
            return ADMITTED
        if not turn and self._queues.get(bucket):  # others parked ahead of it (FIFO)
            if not nonblocking:
                return None
            wait = throttle.estimate_wait(bucket)
        else:
            wait = throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
            if wait == 0.0:
                return ADMITTED
        self._refuse_at_once(bucket, wait, nonblocking)
        return None

    def reserve(self, bucket: str, cost: int, *, unthrottled: bool = False) -> int:
        """:meth:`TenantThrottle.reserve`: right after a write costing ``cost`` was
        admitted, before anything else runs."""
        return self.throttle.reserve(bucket, cost, unthrottled=unthrottled)

    def _refuse_at_once(
        self, bucket: str, wait: float, nonblocking: bool, *, count: bool = True
    ) -> None:
        """Raise the rejection of a request that must not wait: none on a bucket whose
        hard limit is 0 (HardLimitZero), none while the bucket's own unthrottled use
        takes all its allowance (Throttled), or a non-blocking one (Throttled);
        counted (unless ``count`` is off: a parked request is counted as it leaves).
        Returns when waiting may help."""
        refused = self._refused_at_once(bucket, wait, nonblocking, count=count)
        if refused is not None:
            raise refused

    def _refused_at_once(
        self, bucket: str, wait: float, nonblocking: bool, *, count: bool
    ) -> ServerError | None:
        """The rejection :meth:`_refuse_at_once` raises, if any."""
        throttle = self.throttle
        if wait == _INF:
            if throttle.bucket_limits(bucket)[1] == 0:
                # Not "retry later": nothing will ever pass until an operator acts.
                if count:
                    throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
                return HardLimitZero(
                    f"bucket {bucket!r} has hard_limit 0: nothing runs on it until an admin "
                    "raises it (set-bucket-throttle)"
                )
            used, rate = throttle.unthrottled_hold(bucket)
            if used > 0.0:
                if count:
                    throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
                return self._held(bucket, used, rate)
            wait = throttle.until_next_slice()  # unknown: the next recompute may tell
        if nonblocking:
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            return Throttled(
                f"bucket {bucket!r} is over its unit allowance",
                retry_after_ms=_retry_after_ms(_spread(wait, throttle.slice_secs)),
            )
        return None

    def release(self, hold: Admitted, /) -> None:
        """Nothing to give back: the operation is charged after it ran
        (:meth:`TenantThrottle.charge`)."""

    def parameter_table(self) -> ParameterTable:
        def max_wait_ms(ms: int) -> None:
            self.throttle.max_wait_secs = ms / 1000

        def max_request_secs(secs: float) -> None:
            self.throttle.max_debt_secs = secs

        return {"max_wait_ms": max_wait_ms, "max_request_secs": max_request_secs}

    def statistics(self) -> ThrottleStatistics:
        """The throttle's statistics with each bucket's parked requests."""
        st = self.throttle.statistics()
        buckets = {
            name: replace(b, waiting=self.waiting(name)) if name in self._queues else b
            for name, b in st.buckets.items()
        }
        return ThrottleStatistics(st.node, buckets)

    async def acquire(
        self,
        bucket: str,
        *,
        unthrottled: bool = False,
        deadline: float | None = None,
        nonblocking: bool = False,
        cost: int = 0,
    ) -> Admitted:
        """Return when an operation on ``bucket`` may run.

        Does not checkpoint when it admits at once (allowance left, nobody queued
        ahead). Raises :class:`Throttled` when the wait would outlast ``deadline``
        (absolute trio time) or ``max_wait_secs``, or at once if ``nonblocking``;
        :class:`DeadlineExceeded` if it must wait and ``deadline`` already passed;
        :class:`BucketNotFound` if the bucket is (or gets) removed. ``cost``: a
        write's known cost (:meth:`try_acquire`); the caller reserves it.
        """
        throttle = self.throttle
        if unthrottled:
            throttle.admission_wait(bucket, unthrottled=True)  # never delayed, never queued
            return ADMITTED
        queue = self._queues.get(bucket)
        if queue:
            wait = throttle.estimate_wait(bucket)  # FIFO: queue behind the others
        else:
            wait = throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
            if wait == 0.0:
                return ADMITTED
        self._refuse_at_once(bucket, wait, nonblocking)
        unknown = wait == _INF
        if unknown:
            wait = throttle.until_next_slice()
        start = trio.current_time()
        if deadline is not None and deadline <= start:
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            raise DeadlineExceeded("the request's deadline passed before it could be admitted")
        limit = start + throttle.max_wait_secs
        if deadline is not None and deadline < limit:
            limit = deadline
        if start + wait > limit:
            # Sleeping just to fail would hold the client for nothing.
            throttle.record_throttled(bucket, 0.0, rejected=True, parked=False)
            raise self._throttled(
                bucket, wait, deadline is not None and deadline < limit + 1e-9, unknown=unknown
            )
        if queue is None:
            queue = self._queues[bucket] = deque()
        waiter = _Waiter()
        queue.append(waiter)
        rejected = False
        try:
            by_deadline = deadline is not None and deadline <= limit
            await self._wait_turn(bucket, queue, waiter, limit, start, by_deadline, cost)
        except Throttled:
            rejected = True
            raise
        finally:
            self._leave(bucket, queue, waiter)
            throttle.record_throttled(bucket, trio.current_time() - start, rejected=rejected)
        return ADMITTED

    async def _wait_turn(
        self,
        bucket: str,
        queue: deque[_Waiter],
        waiter: _Waiter,
        limit: float,
        start: float,
        by_deadline: bool,
        cost: int,
    ) -> None:
        throttle = self.throttle
        while True:
            if waiter.removed:
                raise BucketNotFound(f"bucket {bucket!r} was removed")
            waiter.event = trio.Event()
            head = queue[0] is waiter
            if head:
                wait = (
                    throttle.write_wait(bucket, cost) if cost else throttle.admission_wait(bucket)
                )
                now = trio.current_time()
                if wait == 0.0:
                    # Admitted; queued requests go at the bucket's rate, though.
                    wait = throttle.paced_wait(bucket)
                    if wait == 0.0 or now + wait > limit:
                        return
                else:
                    unknown = wait == _INF
                    if unknown:
                        self._refuse_at_once(bucket, wait, False, count=False)
                        wait = throttle.until_next_slice()
                    if now + wait > limit:
                        raise self._throttled(
                            bucket, wait, by_deadline, unknown=unknown, waited=now - start
                        )
                wake_at = now + wait
            else:
                wake_at = limit
            with trio.move_on_at(wake_at) as scope:
                await waiter.event.wait()
            timed_out = scope.cancelled_caught and not head and not waiter.removed
            if timed_out and queue[0] is not waiter:
                # Out of time while others were still ahead.
                now = trio.current_time()
                wait = throttle.estimate_wait(bucket)
                unknown = wait == _INF
                if unknown:
                    wait = throttle.until_next_slice()
                raise self._throttled(
                    bucket,
                    wait,
                    by_deadline,
                    unknown=unknown,
                    waited=now - start,
                    behind=queue.index(waiter) if waiter in queue else 0,
                )

    def _held(self, bucket: str, used: float, rate: float) -> ServerError:
        """The rejection of a request on a bucket whose own unthrottled use spends
        all of its allowance: it fails at once — no wait can be predicted to end
        within a bound — with the hint of how soon the bucket's debt is repaid
        once that use stops (one refill window at most)."""
        throttle = self.throttle
        gross = throttle.gross_wait(bucket)
        if gross == _INF:
            gross = throttle.until_next_slice()
        return Throttled(
            f"bucket {bucket!r} is over its unit allowance: its unthrottled use "
            f"({used:.0f} units/s) takes all of its rate ({rate:.0f} units/s), so nothing "
            f"else runs on it while that goes on; once it stops, its debt is repaid in "
            f"{_ms(gross)} ms",
            retry_after_ms=_retry_after_ms(_spread(gross, throttle.slice_secs)),
        )

    def _throttled(
        self,
        bucket: str,
        wait: float,
        by_deadline: bool,
        *,
        unknown: bool = False,
        waited: float = 0.0,
        behind: int = 0,
    ) -> ServerError:
        """A :class:`Throttled` error whose ``retryAfterMs`` is the real wait, spread
        by at most a slice (never a blanket cap), and whose message states the real
        numbers: the wait, the bound it passed, and how long the request waited."""
        throttle = self.throttle
        bound = (
            "the request's deadline"
            if by_deadline
            else f"throttle_max_wait_ms ({_ms(throttle.max_wait_secs)} ms)"
        )
        hint = _retry_after_ms(_spread(wait, throttle.slice_secs))
        if unknown:
            why = (
                f"its allowance rate is 0 for now (the rates are recomputed every "
                f"{_ms(throttle.slice_secs)} ms)"
            )
        else:
            why = f"the wait ({_ms(wait)} ms)"
        if behind:
            what = (
                f"after {_ms(waited)} ms parked behind {behind} earlier requests, "
                f"its turn does not come within {bound}"
            )
        elif waited > 0.0:
            what = f"after {_ms(waited)} ms parked, {why} outlasts {bound}"
        elif unknown:
            what = f"{why}, and none comes within {bound}"
        else:
            what = f"{why} exceeds {bound}"
        return Throttled(
            f"bucket {bucket!r} is over its unit allowance: {what}", retry_after_ms=hint
        )

    def _leave(self, bucket: str, queue: deque[_Waiter], waiter: _Waiter) -> None:
        was_head = bool(queue) and queue[0] is waiter
        if waiter in queue:
            queue.remove(waiter)
        if not queue:
            if self._queues.get(bucket) is queue:
                del self._queues[bucket]
        elif was_head:
            queue[0].event.set()  # the next in line takes over

    def wake(self, bucket: str | None = None) -> None:
        """Make the head waiter(s) re-check now, e.g. after a property change."""
        names = list(self._queues) if bucket is None else [bucket]
        for name in names:
            queue = self._queues.get(name)
            if queue:
                queue[0].event.set()

    def bucket_removed(self, name: str) -> None:
        """The bucket is gone: forget it and fail its waiters with BucketNotFound."""
        if name in self.throttle:
            self.throttle.remove_bucket(name)
        queue = self._queues.pop(name, None)
        for waiter in queue or ():
            waiter.removed = True
            waiter.event.set()
