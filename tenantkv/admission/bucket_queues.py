"""Bucket queues: bounded admission queues per bucket and operation class.

Manta's muskie throttle (RFD 110), one queue per bucket and per class (reads,
writes), so a burst of writes to one bucket can neither starve that bucket's
reads nor anybody else's requests.

The rule (per bucket and class)
    ``concurrency`` requests may run at once (they hold a *slot*);
    ``queue_tolerance`` more may wait for one. A request

    * takes a slot at once if one is free **and nobody is waiting** (FIFO: a
      newcomer never overtakes a waiter);
    * otherwise waits, if fewer than ``queue_tolerance`` are waiting;
    * otherwise is rejected at once with
      :class:`~tenantkv.errors.AdmissionQueueOverflow` (26; labels
      ``SystemOverloadedError`` + ``RetryableError``: it did not run).

    A request still waiting after ``pending_timeout_ms`` is rejected the same
    way (it had no effect either). Why reject rather than queue forever? A
    queue longer than what the node can serve within a client's patience only
    adds latency to everyone and memory to the server; muskie answers "service
    unavailable" and lets the client back off. ``retryAfterMs`` says how long
    the queue ahead would take to drain at the release rate observed on this
    queue, ``ceil((queued + 1) / releases per second)`` (equivalently: the
    observed service time per slot x queue length / concurrency), measured
    only while requests queue, so the fast path pays nothing for it.

Slots
    A slot is released with the synchronous :meth:`BucketQueueGate.release`,
    from any task: a read's slot when the read is answered, a write's when its
    group commit is durable. If somebody waits, the slot passes straight to the
    head waiter (no barging, no thundering herd).

Defaults (server parameters ``bucket_queue_concurrency``,
``bucket_queue_tolerance``, ``bucket_queue_pending_timeout_ms``)
    * ``concurrency = 512`` (was 64; raised with the group-commit sizing: 64
      capped the writes in flight, and so the commit batch, per bucket). Reads
      run inline on the event loop, so their slots are held for microseconds and
      never bind; writes hold theirs until their batch is durable (~0.1-3 ms),
      so 512 per bucket admits a whole group-commit batch from a bucket while
      keeping any one tenant from filling the writer's queue alone. It is a
      per-tenant fairness bound, not the node's capacity (execution tickets and
      write permits size that).
    * ``queue_tolerance = 1024``. A waiting request is a parked connection (a
      session waits for its request's admission), i.e. cheap; 1024 is 16
      slot-turns of 64, about 16 batches or ~50 ms of write latency at the
      slow end, beyond which clients are better served by backing off.
    * ``pending_timeout_ms = 1000``: far beyond a healthy wait (above), so it
      only fires when service stalls (an fsync stall, a saturated disk), and
      short enough that clients with retry budgets still see a quick answer.
      ``0`` disables it.

    Per-bucket overrides (:meth:`BucketQueues.set_bucket`) pin a value for one
    bucket and class; ``None`` returns it to the node default. Raising a
    concurrency wakes as many waiters as it frees slots; lowering it lets the
    running requests finish (no new slot until ``running < concurrency``);
    lowering a tolerance only turns newcomers away.

Events (muskie's ``request_throttled`` / ``request_handled`` probes)
    ``request_throttled`` when a request must queue (``outcome="queued"``) or
    is rejected (``"rejected_overflow"``, ``"rejected_timeout"``);
    ``request_handled`` when a slot is released (the caller's outcome, e.g.
    ``"ok"`` or an error code name). Each carries the slots in use, the queued
    count, bucket, class, operation and key length. Subscribers
    (:meth:`BucketQueues.subscribe`, what ``tenantkv-admin watch`` streams)
    each get a Trio memory channel with a bounded buffer; a slow subscriber
    loses events (counted in ``events_dropped``) rather than slowing requests.
    With no subscriber, emitting costs a single ``if self.subscribers:``.

Counters (:meth:`BucketQueues.statistics`) per bucket and class::

    admitted      slots granted (at once or after waiting)
    queued_total  requests that had to wait
    queued_total = (admitted after waiting) + rejected_timeout + interrupted + queued (now)

Server integration
    ``gate.add_bucket`` / ``gate.remove_bucket`` from the bucket hooks (removal
    fails waiters with ``BucketNotFound``). On the sync fast path,
    ``q = gate.try_acquire(bucket, cls)``; ``None`` means "take the async
    path": ``q = await gate.acquire(bucket, cls, operation=, key_len=)``. Keep
    ``q`` with the request and call ``gate.release(q, ...)`` exactly once when
    it is answered (for a write: in the group-commit callback).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Final, Literal

import trio

from tenantkv.admission.gate import ParameterTable, trio_clock
from tenantkv.admission.waiters import Waiter, park, unqueue, wake
from tenantkv.errors import (
    AdmissionQueueOverflow,
    BadValue,
    BucketExists,
    BucketNotFound,
    DeadlineExceeded,
)
from tenantkv.records import fields_dict

READ: Final = "read"
WRITE: Final = "write"
#: The operation classes; each has its own queue per bucket.
CLASSES: Final = (READ, WRITE)

# A write holds its slot until its group commit is durable, so the slots bound
# a hot bucket's commit batch: 64 cut durable SET throughput several-fold
# under pipelined load (measured: 16 conns x 64 deep, 115k -> 23k ops/s).
DEFAULT_CONCURRENCY: Final = 512
DEFAULT_QUEUE_TOLERANCE: Final = 1024
DEFAULT_PENDING_TIMEOUT_MS: Final = 1000
MAX_CONCURRENCY: Final = 65_536
MAX_QUEUE_TOLERANCE: Final = 1_000_000
MAX_PENDING_TIMEOUT_MS: Final = 600_000
#: Events a subscriber's channel buffers before it starts losing them.
DEFAULT_EVENT_BUFFER: Final = 1024
#: Bound of ``retryAfterMs``.
MAX_RETRY_AFTER_MS: Final = 10_000
#: The release rate is sampled over windows at least this long...
RATE_WINDOW_SECS: Final = 0.25
#: ...averaged with this weight for the newest window...
RATE_ALPHA: Final = 0.5
#: ...and the window restarts when a queue forms after this long without one.
RATE_STALE_SECS: Final = 1.0

REQUEST_THROTTLED: Final = "request_throttled"
REQUEST_HANDLED: Final = "request_handled"


class _Unset(Enum):
    UNSET = "UNSET"


#: Sentinel for "leave unchanged" (``None`` means "back to the node default").
UNSET: Final = _Unset.UNSET
_Opt = Literal[_Unset.UNSET]


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadValue(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _override(old: int | None, new: object, name: str, lo: int, hi: int) -> int | None:
    """A bucket's override as ``new`` changes it: kept (UNSET), cleared (None) or
    set (checked)."""
    if new is UNSET:
        return old
    return None if new is None else _check_int(name, new, lo, hi)


def _check_class(cls: object) -> str:
    if cls not in CLASSES:
        raise BadValue(f"operation class must be one of {', '.join(CLASSES)}, got {cls!r}")
    return str(cls)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One ``request_throttled`` / ``request_handled`` event."""

    kind: str
    #: Clock time (trio time on a server) of the event.
    time: float
    bucket: str
    cls: str
    operation: str
    key_len: int
    #: Slots in use and requests waiting, just after the event.
    running: int
    queued: int
    outcome: str

    def as_dict(self) -> dict[str, Any]:
        return fields_dict(self, renamed={"kind": "event", "cls": "class"})


@dataclass(frozen=True, slots=True)
class BucketQueueStatistics:
    """One bucket and class (an immutable snapshot)."""

    bucket: str
    cls: str
    concurrency: int
    queue_tolerance: int
    #: Whether the value is a per-bucket override (else the node default).
    concurrency_overridden: bool
    queue_tolerance_overridden: bool
    running: int
    queued: int
    admitted: int
    queued_total: int
    rejected_overflow: int
    rejected_timeout: int
    #: Waiters that went away (client gone, deadline, shutdown) before a slot.
    interrupted: int
    #: Releases per second, sampled while requests queue (0: not measured yet);
    #: the basis of ``retryAfterMs``.
    release_rate: float

    def as_dict(self) -> dict[str, Any]:
        """Every figure but the bucket and class (the keys it is filed under)."""
        out = fields_dict(self, left_out=("bucket", "cls"))
        out["release_rate"] = round(self.release_rate, 1)
        return out


@dataclass(frozen=True, slots=True)
class BucketQueuesStatistics:
    """What :meth:`BucketQueues.statistics` returns."""

    concurrency: int
    queue_tolerance: int
    pending_timeout_ms: int
    subscribers: int
    events_delivered: int
    events_dropped: int
    #: bucket -> class -> counters
    buckets: Mapping[str, Mapping[str, BucketQueueStatistics]]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``bucket_queues`` section of ``server_status``)."""
        return {
            "node": {
                "bucket_queue_concurrency": self.concurrency,
                "bucket_queue_tolerance": self.queue_tolerance,
                "bucket_queue_pending_timeout_ms": self.pending_timeout_ms,
                "subscribers": self.subscribers,
                "events_delivered": self.events_delivered,
                "events_dropped": self.events_dropped,
            },
            "buckets": {
                name: {cls: s.as_dict() for cls, s in per.items()}
                for name, per in self.buckets.items()
            },
        }


# --------------------------------------------------------------------------- the core


class BucketQueue:
    """The queue of one bucket and class; also the handle a slot holder releases."""

    __slots__ = (
        "admitted",
        "bucket",
        "cls",
        "concurrency",
        "concurrency_override",
        "interrupted",
        "queue_tolerance",
        "queued_total",
        "rate",
        "rate_n0",
        "rate_t0",
        "rejected_overflow",
        "rejected_timeout",
        "removed",
        "running",
        "tolerance_override",
        "waiters",
    )

    def __init__(self, bucket: str, cls: str, concurrency: int, tolerance: int, now: float) -> None:
        self.bucket = bucket
        self.cls = cls
        self.concurrency = concurrency
        self.queue_tolerance = tolerance
        self.concurrency_override: int | None = None
        self.tolerance_override: int | None = None
        self.running = 0
        self.waiters: deque[Waiter] = deque()
        self.admitted = 0
        self.queued_total = 0
        self.rejected_overflow = 0
        self.rejected_timeout = 0
        self.interrupted = 0
        self.removed = False
        self.rate = 0.0
        self.rate_t0 = now
        self.rate_n0 = 0

    def __repr__(self) -> str:
        return (
            f"<BucketQueue {self.bucket!r}/{self.cls} running {self.running}/{self.concurrency}"
            f" queued {len(self.waiters)}/{self.queue_tolerance}>"
        )


class _Subscriber:
    __slots__ = ("bucket", "delivered", "dropped", "receive", "send")

    def __init__(
        self,
        send: trio.MemorySendChannel[QueueEvent],
        receive: trio.MemoryReceiveChannel[QueueEvent],
        bucket: str | None,
    ) -> None:
        self.send = send
        self.receive = receive
        self.bucket = bucket
        self.delivered = 0
        self.dropped = 0


class BucketQueues:
    """Slots and bounded queues per bucket and class; pure logic (see the module doc).

    ``clock`` returns seconds; :class:`BucketQueueGate` needs ``trio.current_time``.
    Methods that can free slots return the waiters to wake (the adapter wakes them).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        queue_tolerance: int = DEFAULT_QUEUE_TOLERANCE,
        pending_timeout_ms: int = DEFAULT_PENDING_TIMEOUT_MS,
    ) -> None:
        self._clock = clock
        self._concurrency = _check_int("bucket_queue_concurrency", concurrency, 1, MAX_CONCURRENCY)
        self._tolerance = _check_int(
            "bucket_queue_tolerance", queue_tolerance, 0, MAX_QUEUE_TOLERANCE
        )
        self._timeout_ms = _check_int(
            "bucket_queue_pending_timeout_ms", pending_timeout_ms, 0, MAX_PENDING_TIMEOUT_MS
        )
        self._queues: dict[str, dict[str, BucketQueue]] = {cls: {} for cls in CLASSES}
        #: the event subscriptions (``watch_events``); :attr:`watched` says if any
        self.subscribers: list[_Subscriber] = []
        self._delivered = 0
        self._dropped = 0

    # ------------------------------------------------------------------ buckets

    def __contains__(self, bucket: object) -> bool:
        return bucket in self._queues[READ]

    def add_bucket(self, name: str) -> None:
        """Create the bucket's read and write queues with the node defaults."""
        if name in self._queues[READ]:
            raise BucketExists(f"bucket {name!r} already exists")
        now = self._clock()
        for cls in CLASSES:
            self._queues[cls][name] = BucketQueue(
                name, cls, self._concurrency, self._tolerance, now
            )

    def remove_bucket(self, name: str) -> list[Waiter]:
        """Forget a bucket; returns its waiters (to wake: they fail with BucketNotFound).

        Slots still held are released into the void (their queue is gone).
        """
        woken: list[Waiter] = []
        for cls in CLASSES:
            q = self._queues[cls].pop(name, None)
            if q is not None:
                q.removed = True
                woken.extend(q.waiters)
                q.waiters.clear()
        return woken

    def queue(self, bucket: str, cls: str) -> BucketQueue:
        """The queue of ``bucket`` and ``cls`` (BucketNotFound / BadValue if none)."""
        per = self._queues.get(cls)
        if per is None:
            _check_class(cls)
        assert per is not None
        q = per.get(bucket)
        if q is None:
            raise BucketNotFound(f"bucket {bucket!r} not found")
        return q

    # ------------------------------------------------------------------ configuration

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @property
    def queue_tolerance(self) -> int:
        return self._tolerance

    @property
    def pending_timeout_ms(self) -> int:
        return self._timeout_ms

    @property
    def pending_timeout_secs(self) -> float:
        """The wait bound in seconds (``inf`` when disabled)."""
        return self._timeout_ms / 1000 if self._timeout_ms else math.inf

    def configure(
        self,
        *,
        concurrency: int | None = None,
        queue_tolerance: int | None = None,
        pending_timeout_ms: int | None = None,
    ) -> list[Waiter]:
        """Change node defaults (``None`` = unchanged); all or nothing.

        Applies at once to every queue without an override. A new pending
        timeout applies to requests that start waiting afterwards. Returns the
        waiters granted a slot by a raised concurrency.
        """
        conc = (
            self._concurrency
            if concurrency is None
            else _check_int("bucket_queue_concurrency", concurrency, 1, MAX_CONCURRENCY)
        )
        tol = (
            self._tolerance
            if queue_tolerance is None
            else _check_int("bucket_queue_tolerance", queue_tolerance, 0, MAX_QUEUE_TOLERANCE)
        )
        tmo = (
            self._timeout_ms
            if pending_timeout_ms is None
            else _check_int(
                "bucket_queue_pending_timeout_ms", pending_timeout_ms, 0, MAX_PENDING_TIMEOUT_MS
            )
        )
        self._concurrency, self._tolerance, self._timeout_ms = conc, tol, tmo
        woken: list[Waiter] = []
        for per in self._queues.values():
            for q in per.values():
                if q.concurrency_override is None:
                    q.concurrency = conc
                if q.tolerance_override is None:
                    q.queue_tolerance = tol
                woken.extend(self._grant(q))
        return woken

    def set_bucket(
        self,
        name: str,
        cls: str,
        *,
        concurrency: int | _Opt | None = UNSET,
        queue_tolerance: int | _Opt | None = UNSET,
    ) -> list[Waiter]:
        """Override one bucket and class (``None``: back to the node default).

        Returns the waiters granted a slot by a raised concurrency.
        """
        q = self.queue(name, _check_class(cls))
        where = f"bucket {name!r} {cls}"
        conc = _override(
            q.concurrency_override, concurrency, f"{where} concurrency", 1, MAX_CONCURRENCY
        )
        tol = _override(
            q.tolerance_override,
            queue_tolerance,
            f"{where} queue_tolerance",
            0,
            MAX_QUEUE_TOLERANCE,
        )
        q.concurrency_override, q.tolerance_override = conc, tol
        q.concurrency = self._concurrency if conc is None else conc
        q.queue_tolerance = self._tolerance if tol is None else tol
        return self._grant(q)

    # ------------------------------------------------------------------ hot path

    def try_acquire(self, bucket: str, cls: str) -> BucketQueue | None:
        """Take a slot if one is free and nobody waits; ``None``: take the slow path.

        Raises BucketNotFound (BadValue for a bad class) if there is no such queue.
        """
        per = self._queues.get(cls)
        q = per.get(bucket) if per is not None else None
        if q is None:
            return self.queue(bucket, cls)  # raises
        if q.running < q.concurrency and not q.waiters:
            q.running += 1
            q.admitted += 1
            return q
        return None

    def room(self, q: BucketQueue) -> int:
        """How many more requests may join the slots of ``q`` now (a run of a
        chunk's writes holding some): the free slots, 0 while anybody waits — what
        that many :meth:`try_acquire` calls in a row would admit."""
        return max(q.concurrency - q.running, 0) if not q.waiters else 0

    def add(self, q: BucketQueue, n: int) -> None:
        """Count ``n`` more requests in slots of ``q``, within :meth:`room` (nothing
        having run since it was asked)."""
        q.running += n
        q.admitted += n

    def try_pass(self, bucket: str, cls: str, n: int = 1) -> bool:
        """Admit ``n`` requests that run one after another, each completed before
        anything else runs (inline reads): a slot taken and given back at once,
        nothing held. True when a slot is free and nobody waits (counted ``n``
        times); False: take the waiting path. Raises like :meth:`try_acquire`.
        Tell watchers how each ended with :meth:`handled` (when :attr:`watched`).
        """
        per = self._queues.get(cls)
        q = per.get(bucket) if per is not None else None
        if q is None:
            q = self.queue(bucket, cls)  # raises
        if q.running < q.concurrency and not q.waiters:
            q.admitted += n
            return True
        return False

    @property
    def watched(self) -> bool:
        """Is anybody subscribed to events (``watch_events``)?"""
        return bool(self.subscribers)

    def handled(
        self, bucket: str, cls: str, operation: str = "", key_len: int = 0, outcome: str = "ok"
    ) -> None:
        """The ``request_handled`` event of a request admitted by :meth:`try_pass`."""
        per = self._queues.get(cls)
        q = per.get(bucket) if per is not None else None
        if q is not None and self.subscribers:
            self._emit(REQUEST_HANDLED, q, operation, key_len, outcome)

    def release_many(self, q: BucketQueue, n: int, outcome: str = "ok") -> list[Waiter]:
        """Give ``n`` slots back at once (a run's, :meth:`add`), as ``n``
        :meth:`release` calls would; returns the waiters they pass to."""
        if not q.waiters and not self.subscribers:
            q.running -= n
            return []
        woken = []
        for _ in range(n):
            waiter = self.release(q, outcome=outcome)
            if waiter is not None:
                woken.append(waiter)
        return woken

    def release(
        self, q: BucketQueue, operation: str = "", key_len: int = 0, outcome: str = "ok"
    ) -> Waiter | None:
        """Give a slot back; returns the waiter it passes to (the adapter wakes it)."""
        waiter: Waiter | None = None
        if q.waiters and q.running <= q.concurrency:
            waiter = q.waiters.popleft()  # the slot passes on: running is unchanged
            waiter.granted = True
            q.admitted += 1
        else:
            q.running -= 1
        if self.subscribers:
            self._emit(REQUEST_HANDLED, q, operation, key_len, outcome)
        return waiter

    # ------------------------------------------------------------------ slow path

    def enqueue(
        self, bucket: str, cls: str, operation: str = "", key_len: int = 0
    ) -> tuple[BucketQueue, Waiter | None]:
        """The slow path's decision: ``(q, None)`` admitted now, ``(q, waiter)`` must wait.

        Raises :class:`AdmissionQueueOverflow` (counted, ``retryAfterMs`` set)
        when ``queue_tolerance`` requests already wait. A waiter is settled by
        :meth:`release` granting it, :meth:`timed_out` or :meth:`abandon`.
        """
        q = self.queue(bucket, cls)
        if q.running < q.concurrency and not q.waiters:
            q.running += 1
            q.admitted += 1
            return q, None
        now = self._clock()
        if len(q.waiters) >= q.queue_tolerance:
            q.rejected_overflow += 1
            if self.subscribers:
                self._emit(REQUEST_THROTTLED, q, operation, key_len, "rejected_overflow")
            raise AdmissionQueueOverflow(
                f"bucket {bucket!r} {cls} queue is full ({q.running} running, "
                f"{len(q.waiters)} waiting, queue_tolerance {q.queue_tolerance})",
                retry_after_ms=self._spread(self.retry_after_ms(q, now)),
            )
        if not q.waiters and now - q.rate_t0 > RATE_STALE_SECS:
            # A queue forms after a quiet spell: measure the release rate afresh.
            q.rate_t0, q.rate_n0 = now, q.admitted - q.running
        else:
            self._release_rate(q, now)
        waiter = Waiter(now)
        q.waiters.append(waiter)
        q.queued_total += 1
        if self.subscribers:
            self._emit(REQUEST_THROTTLED, q, operation, key_len, "queued")
        return q, waiter

    def timed_out(
        self, q: BucketQueue, waiter: Waiter, operation: str = "", key_len: int = 0
    ) -> AdmissionQueueOverflow:
        """``waiter`` waited ``pending_timeout_ms`` without a slot: the error to raise."""
        unqueue(q.waiters, waiter)
        q.rejected_timeout += 1
        if self.subscribers:
            self._emit(REQUEST_THROTTLED, q, operation, key_len, "rejected_timeout")
        now = self._clock()
        waited_ms = round((now - waiter.enqueued) * 1000)
        return AdmissionQueueOverflow(
            f"bucket {q.bucket!r} {q.cls} request waited {waited_ms} ms for a slot "
            f"(bucket_queue_pending_timeout_ms {self._timeout_ms})",
            retry_after_ms=self._spread(self.retry_after_ms(q, now)),
        )

    @staticmethod
    def _spread(ms: int) -> int:
        """The rejection hint, spread over up to one more drain time: never sooner
        than the queue should drain, and not the same instant for every client."""
        return min(MAX_RETRY_AFTER_MS, ms + int(random.random() * ms))

    def abandon(self, q: BucketQueue, waiter: Waiter) -> None:
        """``waiter`` went away before it got a slot (cancelled)."""
        unqueue(q.waiters, waiter)
        q.interrupted += 1

    def retry_after_ms(self, q: BucketQueue, now: float | None = None) -> int:
        """How long the queue ahead should take to drain, in ms (the rejection hint)."""
        if now is None:
            now = self._clock()
        rate = self._release_rate(q, now)
        # Nothing released yet: no better guess than the wait bound.
        ms = 1000.0 * (len(q.waiters) + 1) / rate if rate > 0.0 else float(self._timeout_ms or 1000)
        if not ms < MAX_RETRY_AFTER_MS:
            return MAX_RETRY_AFTER_MS
        return max(1, math.ceil(ms))

    # ------------------------------------------------------------------ events

    def subscribe(
        self, bucket: str | None = None, *, max_buffer: int = DEFAULT_EVENT_BUFFER
    ) -> trio.MemoryReceiveChannel[QueueEvent]:
        """A channel receiving the events of ``bucket`` (every bucket if ``None``).

        Events that find its buffer full are dropped and counted. Close the
        channel or call :meth:`unsubscribe` to stop.
        """
        _check_int("max_buffer", max_buffer, 1, 1_000_000)
        send, receive = trio.open_memory_channel[QueueEvent](max_buffer)
        self.subscribers.append(_Subscriber(send, receive, bucket))
        return receive

    def unsubscribe(self, receive: trio.MemoryReceiveChannel[QueueEvent]) -> None:
        """Stop a subscription; its channel sees end-of-stream after what it buffered."""
        for sub in self.subscribers:
            if sub.receive is receive:
                self.subscribers.remove(sub)
                sub.send.close()
                return

    def _emit(self, kind: str, q: BucketQueue, operation: str, key_len: int, outcome: str) -> None:
        ev = QueueEvent(
            kind,
            self._clock(),
            q.bucket,
            q.cls,
            operation,
            key_len,
            q.running,
            len(q.waiters),
            outcome,
        )
        gone: list[_Subscriber] = []
        for sub in self.subscribers:
            if sub.bucket is not None and sub.bucket != q.bucket:
                continue
            try:
                sub.send.send_nowait(ev)
            except trio.WouldBlock:
                sub.dropped += 1
                self._dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone.append(sub)  # the subscriber closed its end
            else:
                sub.delivered += 1
                self._delivered += 1
        for sub in gone:
            self.subscribers.remove(sub)
            sub.send.close()

    # ------------------------------------------------------------------ stats

    def statistics(self) -> BucketQueuesStatistics:
        """An immutable snapshot of every counter."""
        buckets: dict[str, dict[str, BucketQueueStatistics]] = {}
        for cls, per in self._queues.items():
            for name, q in per.items():
                buckets.setdefault(name, {})[cls] = BucketQueueStatistics(
                    bucket=name,
                    cls=cls,
                    concurrency=q.concurrency,
                    queue_tolerance=q.queue_tolerance,
                    concurrency_overridden=q.concurrency_override is not None,
                    queue_tolerance_overridden=q.tolerance_override is not None,
                    running=q.running,
                    queued=len(q.waiters),
                    admitted=q.admitted,
                    queued_total=q.queued_total,
                    rejected_overflow=q.rejected_overflow,
                    rejected_timeout=q.rejected_timeout,
                    interrupted=q.interrupted,
                    release_rate=q.rate,
                )
        return BucketQueuesStatistics(
            concurrency=self._concurrency,
            queue_tolerance=self._tolerance,
            pending_timeout_ms=self._timeout_ms,
            subscribers=len(self.subscribers),
            events_delivered=self._delivered,
            events_dropped=self._dropped,
            buckets=MappingProxyType(
                {name: MappingProxyType(per) for name, per in buckets.items()}
            ),
        )

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _grant(q: BucketQueue) -> list[Waiter]:
        """Hand free slots to the head waiters (after the concurrency grew)."""
        woken: list[Waiter] = []
        while q.waiters and q.running < q.concurrency:
            waiter = q.waiters.popleft()
            waiter.granted = True
            q.running += 1
            q.admitted += 1
            woken.append(waiter)
        return woken

    @staticmethod
    def _release_rate(q: BucketQueue, now: float) -> float:
        """Slots released per second, sampled over windows of RATE_WINDOW_SECS."""
        done = q.admitted - q.running
        dt = now - q.rate_t0
        if dt >= RATE_WINDOW_SECS:
            sample = (done - q.rate_n0) / dt
            q.rate = sample if q.rate == 0.0 else q.rate + RATE_ALPHA * (sample - q.rate)
            q.rate_t0, q.rate_n0 = now, done
        elif q.rate == 0.0 and dt > 0.0 and done > q.rate_n0:
            return (done - q.rate_n0) / dt  # a first, short sample beats none
        return q.rate


# --------------------------------------------------------------------------- Trio adapter


class BucketQueueGate:
    """Trio adapter for :class:`BucketQueues`: waiters park on an event each.

    The core's clock must be ``trio.current_time``. Every method that may free
    a slot wakes the waiter(s) the core granted it to.
    """

    def __init__(self, queues: BucketQueues) -> None:
        self.queues = queues
        # The core's own methods (nothing to wake): a call less each.
        #: :meth:`BucketQueues.room` and :meth:`BucketQueues.add`: a run's writes
        self.room = queues.room
        self.add = queues.add
        #: :meth:`BucketQueues.try_pass`: requests that complete at once, admitted
        self.try_pass = queues.try_pass

    @classmethod
    def create(cls, **settings: Any) -> BucketQueueGate:
        """A gate on Trio's clock; ``settings`` are :class:`BucketQueues`'
        (``concurrency``, ``queue_tolerance``, ``pending_timeout_ms``)."""
        return cls(BucketQueues(trio_clock(), **settings))

    # the sync fast path and release

    def try_acquire(self, bucket: str, cls: str) -> BucketQueue | None:
        """:meth:`BucketQueues.try_acquire`: a slot now, or ``None``."""
        return self.queues.try_acquire(bucket, cls)

    @property
    def watched(self) -> bool:
        """:attr:`BucketQueues.watched`."""
        return self.queues.watched

    def handled(
        self, bucket: str, cls: str, *, operation: str = "", key_len: int = 0, outcome: str = "ok"
    ) -> None:
        """:meth:`BucketQueues.handled`."""
        self.queues.handled(bucket, cls, operation, key_len, outcome)

    def release(
        self, q: BucketQueue, *, operation: str = "", key_len: int = 0, outcome: str = "ok"
    ) -> None:
        """Give back the slot held in ``q`` (sync; call from any task, exactly once)."""
        waiter = self.queues.release(q, operation, key_len, outcome)
        if waiter is not None:
            waiter.event.set()

    def release_many(self, q: BucketQueue, n: int, *, outcome: str = "ok") -> None:
        """Give back ``n`` slots held in ``q`` (:meth:`BucketQueues.release_many`)."""
        for waiter in self.queues.release_many(q, n, outcome):
            waiter.event.set()

    # waiting

    async def acquire(
        self,
        bucket: str,
        cls: str,
        *,
        operation: str = "",
        key_len: int = 0,
        deadline: float | None = None,
    ) -> BucketQueue:
        """Return the queue holding a slot for this request, waiting FIFO if need be.

        No checkpoint when a slot is free at once; raises
        :class:`AdmissionQueueOverflow` at once when the queue is full, or after
        ``pending_timeout_ms`` of waiting; :class:`DeadlineExceeded` when the
        request's ``deadline`` (Trio time) comes first; :class:`BucketNotFound`
        if the bucket is (or gets) removed. Cancelled while waiting, it leaves
        the queue (and passes on a slot granted at that very moment).
        """
        core = self.queues
        q, waiter = core.enqueue(bucket, cls, operation, key_len)
        if waiter is None:
            return q
        timeout_at = waiter.enqueued + core.pending_timeout_secs
        by_deadline = deadline is not None and deadline < timeout_at
        if await park(
            waiter,
            deadline=deadline if by_deadline else timeout_at,
            give_back=lambda: self.release(
                q, operation=operation, key_len=key_len, outcome="cancelled"
            ),
            abandon=lambda: core.abandon(q, waiter),
        ):
            return q  # even if the timeout struck at the same instant
        if q.removed:
            raise BucketNotFound(f"bucket {bucket!r} was removed")
        if by_deadline:
            core.abandon(q, waiter)
            raise DeadlineExceeded(
                "the request's deadline passed while it waited for a bucket-queue slot"
            )
        raise core.timed_out(q, waiter, operation, key_len)

    # configuration (wakes waiters when slots grow)

    def add_bucket(self, name: str) -> None:
        self.queues.add_bucket(name)

    def remove_bucket(self, name: str) -> None:
        """Forget ``name``; its waiters fail with BucketNotFound."""
        self._wake(self.queues.remove_bucket(name))

    def set_bucket(self, name: str, cls: str, **overrides: Any) -> None:
        """:meth:`BucketQueues.set_bucket`, waking the waiters it grants a slot."""
        self._wake(self.queues.set_bucket(name, cls, **overrides))

    def configure(self, **changes: Any) -> None:
        """:meth:`BucketQueues.configure`, waking the waiters it grants a slot."""
        self._wake(self.queues.configure(**changes))

    # events and stats

    def subscribe(
        self, bucket: str | None = None, *, max_buffer: int = DEFAULT_EVENT_BUFFER
    ) -> trio.MemoryReceiveChannel[QueueEvent]:
        return self.queues.subscribe(bucket, max_buffer=max_buffer)

    def unsubscribe(self, receive: trio.MemoryReceiveChannel[QueueEvent]) -> None:
        self.queues.unsubscribe(receive)

    def statistics(self) -> BucketQueuesStatistics:
        return self.queues.statistics()

    def parameter_table(self) -> ParameterTable:
        return {
            "concurrency": lambda v: self.configure(concurrency=v),
            "tolerance": lambda v: self.configure(queue_tolerance=v),
            "pending_timeout_ms": lambda v: self.configure(pending_timeout_ms=v),
        }

    _wake = staticmethod(wake)
