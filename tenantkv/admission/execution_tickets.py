"""Execution tickets: the read and write pools around storage access.

MongoDB's execution control. The server keeps two :class:`TicketHolder`\\ s, one
for reads and one for writes; an operation holds one ticket while it touches
LMDB, so at most ``total_tickets`` operations of a kind run in the storage layer
at once. :mod:`tenantkv.admission.throughput_probing` resizes both pools at run
time to the concurrency that gives the best throughput.

Admission
    :meth:`TicketHolder.try_acquire` is synchronous and never waits: it returns a
    :class:`Ticket` when one is free *and nobody is queued* (FIFO: a newcomer
    never overtakes a waiter), else ``None``. That path is integer arithmetic,
    one clock read and one small object (measured below).
    ``await holder.acquire()`` takes the same path without a checkpoint; only a
    request that must wait parks, FIFO, on a ``trio.Event`` of its own. It is
    rejected at once with :class:`~tenantkv.errors.AdmissionQueueOverflow`
    (labels ``SystemOverloadedError`` + ``RetryableError``) when
    :attr:`~TicketHolder.max_queue_depth` waiters are already queued, and with
    :class:`~tenantkv.errors.DeadlineExceeded` when its ``deadline`` (absolute
    Trio time) passes before a ticket is free. Cancellation and deadlines take
    the waiter out of the queue and count it as ``canceled``.

Release
    :meth:`Ticket.release` is synchronous and idempotent, and may run in any task
    or in a callback on the Trio thread (the group-commit writer releases a
    write's ticket from ``trio.from_thread.run_sync``), never on a worker thread.
    A released ticket passes straight to the head waiter (a hand-off: the waiter
    is admitted at that instant, so no newcomer can slip in before it wakes).

Resizing (:meth:`TicketHolder.resize`)
    Growing admits waiters at once. Shrinking takes nothing away: current holders
    finish, and released tickets are retired (not handed on) until fewer than
    ``total_tickets`` are out; newcomers wait meanwhile. ``out`` may thus exceed
    ``total_tickets`` for a while; ``available`` is then 0.

Priorities
    :attr:`Priority.EXEMPT` (admin and internal work) bypasses the count and the
    queue but is recorded in the ``exempt`` statistics section. ``NORMAL`` is
    everything else.

One ticket per task
    A task that already holds a ticket (read *or* write) must never take a second
    one: with every ticket out, it would wait for itself. The server says so with
    ``held=True`` (``acquire(held=True)`` / ``try_acquire(held=True)``), which
    returns :data:`NOOP_TICKET` at once, touching no counter; its ``release()``
    does nothing. A long operation that gives its ticket back between batches
    (a yield) and takes one again passes ``readmission=True``, so that
    ``new_admissions`` counts operations rather than acquisitions.

Statistics (:meth:`TicketHolder.statistics`, the ``execution_tickets`` section)
    ``out``, ``available``, ``total_tickets``; the queue: ``added_to_queue``,
    ``removed_from_queue`` (admitted or canceled), ``queue_length``,
    ``canceled`` (left without a ticket: cancelled or past its deadline),
    ``total_time_queued_micros`` (enqueue to admission or departure); the work:
    ``started_processing``, ``processing``, ``finished_processing``,
    ``total_time_processing_micros`` (acquire to release, on the injected
    ``clock``), ``new_admissions`` (admissions that were not readmissions); and
    ``exempt``: ``started_processing``, ``processing``, ``finished_processing``,
    ``total_time_processing_micros``. Always ``processing == out`` and
    ``queue_length == added_to_queue - removed_from_queue``. Overflow rejections
    are not counted here (the server counts the errors it sends).
    :meth:`TicketHolder.peak_used_and_reset` is the prober's read-and-reset peak
    of ``out``.

Cost
    ``try_acquire()`` + ``release()`` on a free pool: 0.40-0.44 µs together,
    with ``time.perf_counter`` as the clock; ``await acquire()`` + ``release()``
    0.53 µs (CPython 3.11, x86-64; the first is printed by
    ``tests/unit/test_execution_tickets.py::test_fast_path_cost``). An
    uncontended ``async with trio.CapacityLimiter`` took 4.0 µs on the same box.

Server integration (what :mod:`tenantkv.server` calls)
    At start: ``reads = TicketHolder(n, name="read")``,
    ``writes = TicketHolder(n, name="write")`` (sizes then set by the prober),
    ``max_queue_depth`` from configuration.
    Read path: ``t = await reads.acquire(deadline=d)`` just before the read
    transaction (after every cheaper gate), ``t.release()`` when it ends.
    Write path: ``t = await writes.acquire(deadline=d)`` before queueing the
    write to the group-commit writer, ``t.release()`` in the callback that
    acknowledges the durable batch. Exempt work (admin commands, expiry,
    internal jobs): ``acquire(Priority.EXEMPT)``, released the same way. Nested
    storage access by a task that holds a ticket: ``held=True``.
    ``statistics().as_dict()`` of each pool for ``server_status``.

All methods must be called on the Trio thread; nothing here is thread-safe.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import trio

from tenantkv.admission.gate import ParameterTable
from tenantkv.errors import AdmissionQueueOverflow, DeadlineExceeded
from tenantkv.records import fields_dict


class Priority(Enum):
    """Admission priority of one operation."""

    #: Counted against the pool; waits FIFO when it is exhausted.
    NORMAL = "normal"
    #: Bypasses the count and the queue (admin, internal work); still recorded.
    EXEMPT = "exempt"


_NORMAL = Priority.NORMAL
_EXEMPT = Priority.EXEMPT


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


# --------------------------------------------------------------------------- tickets


class Ticket:
    """The right to run one operation in the storage layer; give it back with :meth:`release`.

    Also a context manager that releases on exit. A ticket that is never
    released is lost to the pool for good: release it in a ``finally``.

    One ticket may stand for several operations admitted together (a run of a
    chunk's writes, :meth:`TicketHolder.add`): ``count`` of them, all
    given back by one :meth:`release`.
    """

    __slots__ = ("_holder", "_start", "count")

    def __init__(self, holder: TicketHolder | None, start: float) -> None:
        self._holder = holder
        self._start = start
        self.count = 1

    @property
    def released(self) -> bool:
        """True once released (always true of :data:`NOOP_TICKET`)."""
        return self._holder is None

    @property
    def exempt(self) -> bool:
        return False

    def release(self) -> None:
        """Give the ticket back (idempotent); the head waiter, if any, gets it at once."""
        holder = self._holder
        if holder is not None:
            self._holder = None
            holder._release(self._start, self.count)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class _ExemptTicket(Ticket):
    """A ticket of exempt work: not counted against the pool, only recorded."""

    __slots__ = ()

    @property
    def exempt(self) -> bool:
        return True

    def release(self) -> None:
        holder = self._holder
        if holder is not None:
            self._holder = None
            holder._release_exempt(self._start)


#: What ``acquire(held=True)`` returns: a ticket that is no ticket. Releasing it
#: does nothing; a task that already holds a real ticket gets this one.
NOOP_TICKET: Ticket = Ticket(None, 0.0)


class _Waiter:
    """One parked request. ``event`` needs only ``set()`` (a ``trio.Event``)."""

    __slots__ = ("enqueued", "event", "readmission", "ticket")

    def __init__(self, event: Any, enqueued: float, readmission: bool) -> None:
        self.event = event
        self.enqueued = enqueued
        self.readmission = readmission
        self.ticket: Ticket | None = None


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True)
class ExemptStatistics:
    """Exempt work through one pool (an immutable snapshot)."""

    started_processing: int
    processing: int
    finished_processing: int
    total_time_processing_micros: int

    def as_dict(self) -> dict[str, Any]:
        return fields_dict(self)


@dataclass(frozen=True, slots=True)
class TicketHolderStatistics:
    """What :meth:`TicketHolder.statistics` returns (see the module doc for each field)."""

    out: int
    available: int
    total_tickets: int
    added_to_queue: int
    removed_from_queue: int
    queue_length: int
    started_processing: int
    processing: int
    finished_processing: int
    total_time_processing_micros: int
    total_time_queued_micros: int
    canceled: int
    new_admissions: int
    exempt: ExemptStatistics

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (one pool in the ``execution_tickets`` status section)."""
        return {**fields_dict(self, left_out=("exempt",)), "exempt": self.exempt.as_dict()}


# --------------------------------------------------------------------------- the holder


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


class TicketHolder:
    """A counted pool of tickets with a FIFO queue; see the module doc.

    ``clock`` (seconds, any origin) times processing and queueing for the
    statistics only; deadlines are always Trio time. ``name`` labels errors.
    The synchronous methods are the pure core; :meth:`acquire` (at the bottom)
    is the Trio adapter that parks a waiter.
    """

    __slots__ = (
        "_added",
        "_canceled",
        "_clock",
        "_ex_finished",
        "_ex_started",
        "_ex_time",
        "_finished",
        "_max_queue_depth",
        "_out",
        "_peak",
        "_readmissions",
        "_removed",
        "_started",
        "_time_processing",
        "_time_queued",
        "_total",
        "_waiters",
        "name",
    )

    def __init__(
        self,
        total_tickets: int,
        *,
        name: str = "tickets",
        clock: Callable[[], float] = time.perf_counter,
        max_queue_depth: int | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self._total = _check_size("total_tickets", total_tickets)
        self._max_queue_depth: int | None = None
        self.max_queue_depth = max_queue_depth
        self._out = 0
        self._peak = 0
        self._waiters: deque[_Waiter] = deque()
        self._added = 0
        self._removed = 0
        self._canceled = 0
        self._started = 0
        self._finished = 0
        self._readmissions = 0
        self._time_processing = 0.0
        self._time_queued = 0.0
        self._ex_started = 0
        self._ex_finished = 0
        self._ex_time = 0.0

    # ------------------------------------------------------------------ properties

    @property
    def total_tickets(self) -> int:
        """The pool's size (the prober's ``outof``)."""
        return self._total

    @property
    def out(self) -> int:
        """Normal tickets held now (may exceed ``total_tickets`` just after a shrink)."""
        return self._out

    @property
    def available(self) -> int:
        return max(0, self._total - self._out)

    @property
    def queue_length(self) -> int:
        return len(self._waiters)

    @property
    def finished_processing(self) -> int:
        """Normal tickets released so far (the prober's throughput counter)."""
        return self._finished

    @property
    def max_queue_depth(self) -> int | None:
        """Most waiters queued at once; ``None`` = unbounded, ``0`` = never queue."""
        return self._max_queue_depth

    @max_queue_depth.setter
    def max_queue_depth(self, value: int | None) -> None:
        if value is not None:
            _check_size("max_queue_depth", value)
        self._max_queue_depth = value

    # ------------------------------------------------------------------ pure core

    def try_acquire(
        self,
        priority: Priority = _NORMAL,
        *,
        held: bool = False,
        readmission: bool = False,
    ) -> Ticket | None:
        """A ticket if one is free and nobody is queued, else ``None``; never waits.

        ``EXEMPT`` always succeeds; ``held=True`` returns :data:`NOOP_TICKET`.
        """
        if priority is not _NORMAL or held:
            return self._special(priority, held)
        if self._take():
            if readmission:
                self._readmissions += 1
            return Ticket(self, self._clock())
        return None

    def room(self) -> int:
        """How many more operations a run holding a ticket may add now: the free
        tickets, 0 while anybody is queued — what that many :meth:`try_acquire`
        calls in a row would admit."""
        return max(self._total - self._out, 0) if not self._waiters else 0

    def add(self, ticket: Ticket, n: int) -> None:
        """Count ``n`` more operations on ``ticket`` (one this holder gave, not yet
        released) as taken now, within :meth:`room` (nothing having run since it
        was asked). The operations of a run share one ticket object and one clock
        reading (their processing time is counted from the first)."""
        self._count_out(n)
        ticket.count += n

    def _take(self) -> bool:
        """Count one operation as taken if a ticket is free and nobody is queued."""
        if self._out < self._total and not self._waiters:
            self._count_out(1)
            return True
        return False

    def _count_out(self, n: int) -> None:
        """Count ``n`` operations as taken now (a ticket each, or a run's share)."""
        out = self._out + n
        self._out = out
        if out > self._peak:
            self._peak = out
        self._started += n

    def try_pass(self, n: int = 1) -> bool:
        """Admit ``n`` operations that run one after another, each finished before
        anything else runs (inline reads: they never leave the event loop, so a
        ticket taken and given back around one could never be seen by another
        task). True when a ticket is free and nobody is queued: counted as ``n``
        taken and released at once (the prober's throughput counter sees them),
        with no ticket object and no clock read; False: take the waiting path.
        """
        out = self._out + 1
        if out <= self._total and not self._waiters:
            if out > self._peak:
                self._peak = out
            self._started += n
            self._finished += n
            return True
        return False

    def parameter_table(self) -> ParameterTable:
        def depth(value: int) -> None:
            self.max_queue_depth = value

        return {"tickets": self.resize, "max_queue_depth": depth}

    def release(self, ticket: Ticket, /) -> None:
        """Give ``ticket`` back (the gate protocol's spelling of ``ticket.release()``)."""
        ticket.release()

    def _special(self, priority: Priority, held: bool) -> Ticket:
        if held:
            return NOOP_TICKET
        if priority is not _EXEMPT:
            raise ValueError(f"unknown priority {priority!r}")
        self._ex_started += 1
        return _ExemptTicket(self, self._clock())

    def _release(self, start: float, n: int = 1) -> None:
        now = self._clock()
        self._finished += n
        self._time_processing += (now - start) * n
        waiters = self._waiters
        if not waiters:
            self._out -= n
            return
        for _ in range(n):
            if waiters and self._out <= self._total:
                self._grant(waiters.popleft(), now)  # hand-off: ``out`` stays
            else:
                self._out -= 1

    def _release_exempt(self, start: float) -> None:
        self._ex_finished += 1
        self._ex_time += self._clock() - start

    def _grant(self, waiter: _Waiter, now: float) -> None:
        """Admit ``waiter`` (already popped, its ticket already counted in ``out``)."""
        self._removed += 1
        self._time_queued += now - waiter.enqueued
        self._started += 1
        if waiter.readmission:
            self._readmissions += 1
        waiter.ticket = Ticket(self, now)
        waiter.event.set()

    def _enqueue(self, event: Any, readmission: bool) -> _Waiter:
        """Queue a waiter behind the others, or raise AdmissionQueueOverflow."""
        depth = self._max_queue_depth
        if depth is not None and len(self._waiters) >= depth:
            raise AdmissionQueueOverflow(
                f"{self.name} execution ticket queue is full "
                f"({len(self._waiters)} waiting, max_queue_depth {depth})"
            )
        waiter = _Waiter(event, self._clock(), readmission)
        self._waiters.append(waiter)
        self._added += 1
        return waiter

    def _abandon(self, waiter: _Waiter) -> None:
        """``waiter`` leaves the queue without a ticket (cancelled or past its deadline)."""
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return
        self._removed += 1
        self._canceled += 1
        self._time_queued += self._clock() - waiter.enqueued

    def resize(self, total_tickets: int) -> None:
        """Set the size now: growing admits waiters at once, shrinking lets holders finish."""
        self._total = total = _check_size("total_tickets", total_tickets)
        waiters = self._waiters
        if waiters and self._out < total:
            now = self._clock()
            while waiters and self._out < total:
                self._out += 1
                self._grant(waiters.popleft(), now)
            if self._out > self._peak:
                self._peak = self._out

    def peak_used_and_reset(self) -> int:
        """The most normal tickets out at once since the last call; restarts from ``out``."""
        peak = self._peak
        self._peak = self._out
        return peak

    def statistics(self) -> TicketHolderStatistics:
        out = self._out
        return TicketHolderStatistics(
            out=out,
            available=max(0, self._total - out),
            total_tickets=self._total,
            added_to_queue=self._added,
            removed_from_queue=self._removed,
            queue_length=len(self._waiters),
            started_processing=self._started,
            processing=self._started - self._finished,
            finished_processing=self._finished,
            total_time_processing_micros=_micros(self._time_processing),
            total_time_queued_micros=_micros(self._time_queued),
            canceled=self._canceled,
            new_admissions=self._started - self._readmissions,
            exempt=ExemptStatistics(
                started_processing=self._ex_started,
                processing=self._ex_started - self._ex_finished,
                finished_processing=self._ex_finished,
                total_time_processing_micros=_micros(self._ex_time),
            ),
        )

    # ------------------------------------------------------------------ Trio adapter

    async def acquire(
        self,
        priority: Priority = _NORMAL,
        *,
        deadline: float | None = None,
        held: bool = False,
        readmission: bool = False,
    ) -> Ticket:
        """A ticket, waiting FIFO for one if none is free.

        Returns without a checkpoint when it admits at once. Raises
        :class:`AdmissionQueueOverflow` at once when the queue is full, and
        :class:`DeadlineExceeded` when ``deadline`` (absolute Trio time) passes
        first (at once if it has passed already). Cancellation takes the waiter
        out of the queue (counted as ``canceled``).
        """
        ticket = self.try_acquire(priority, held=held, readmission=readmission)
        if ticket is not None:
            return ticket
        if deadline is not None and deadline <= trio.current_time():
            raise DeadlineExceeded(
                f"the request's deadline passed before a {self.name} execution ticket was free"
            )
        event = trio.Event()
        waiter = self._enqueue(event, readmission)
        try:
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await event.wait()
        except BaseException:
            if waiter.ticket is None:
                self._abandon(waiter)
            else:  # admitted as the cancellation arrived: pass the ticket on
                waiter.ticket.release()
            raise
        ticket = waiter.ticket
        if ticket is None:
            self._abandon(waiter)
            raise DeadlineExceeded(
                f"the request's deadline passed while it waited for a {self.name} execution ticket"
            )
        return ticket
