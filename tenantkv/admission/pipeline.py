"""The admission pipeline: every per-request gate, in path order.

    ingress request rate limiter (every request, admin ones too)
      ─► ingress admission ticket ─► tenant throttle ─► bucket queue (read / write)
      ─► write permit (writes only) ─► execution ticket ─► storage

Per-connection gates sit before this, in ``server/server.py``, because they
decide whether a connection exists at all, not whether a request runs: the
connection table (per-address and node caps), the connection-establishment
rate limiter and the node-wide receive-buffer cap.

Every gate speaks the protocol of :mod:`tenantkv.admission.gate`.
:meth:`Pipeline.check_request_rate` runs first for every request the session
decodes. For a data command, :meth:`Pipeline.try_acquire` is the fast path:
each gate's synchronous ``try_acquire``, no await, and when any gate cannot
admit at once it gives back what it took and returns ``None``. The session
then calls :meth:`Pipeline.acquire`, which waits at each gate in the same
order, bounded by the request's deadline. Either way the caller gets
a :class:`Holds` and releases it exactly once when the operation is over — a
read right after it ran, a write when its group commit is durable.

A read that runs inline (to completion, on the event loop) takes
:meth:`Pipeline.try_pass_read` instead: every gate checks and counts it, nothing
is held. The session admits the requests of one received chunk together where
that cannot change an answer (``server/execution.py``): a run of inline reads
through one ``try_pass_read`` and the throttle's run allowance, charged once
(:meth:`passed_reads` counts the rest of the run), and the request rate limiter's
tokens lent to the chunk (:meth:`lend_request_tokens`).

A rejection anywhere happens before storage, so the operation had no effect.
Exempt work (admin commands, the expiry pager) does not come through here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenantkv import errors
from tenantkv.admission.bucket_queues import (
    READ,
    WRITE,
    BucketQueue,
    BucketQueueGate,
    BucketQueuesStatistics,
)
from tenantkv.admission.cidr import CidrMatcher
from tenantkv.admission.execution_tickets import Ticket, TicketHolder, TicketHolderStatistics
from tenantkv.admission.gate import ParameterTable
from tenantkv.admission.rate_limiter import RateLimiter, RateLimiterStatistics
from tenantkv.admission.throttle_gate import TenantThrottleGate
from tenantkv.admission.throttle_stats import ThrottleStatistics
from tenantkv.admission.write_permits import BucketPermits, WritePermitGate, WritePermitStatistics

EXEMPTIONS_PARAMETER = "ingress_request_rate_limiter_exemptions"

#: Default size of the ingress admission controller: effectively "no limit"
#: until an operator lowers it; it bounds operations in the server at once.
DEFAULT_INGRESS_TICKETS = 1_000_000


class Holds:
    """What admitted operations hold; :meth:`release` gives all of it back.

    Usually one operation's. A run of a chunk's writes on one bucket shares
    one (:meth:`Pipeline.join`): each gate object then stands for
    ``held`` operations, and the counts below say when the last of them is
    taken by the writer and answered, which is when the run gives back.
    """

    __slots__ = (
        "_pipeline",
        "held",
        "ingress",
        "permit",
        "queue",
        "reserved",
        "ticket",
        "unanswered",
        "untaken",
    )

    def __init__(
        self,
        pipeline: Pipeline,
        ingress: Ticket | None,
        queue: BucketQueue | None,
        permit: BucketPermits | None,
        ticket: Ticket | None,
    ) -> None:
        self._pipeline = pipeline
        self.ingress = ingress
        self.queue = queue
        self.permit = permit
        self.ticket = ticket
        #: units the tenant throttle reserved for the write admitted with this
        #: (its known cost, :meth:`TenantThrottle.reserve`): charged against it once
        #: the write ran, given back if it never does (:meth:`Pipeline.refund`)
        self.reserved = 0
        #: operations whose bucket slot, write permit and execution ticket are held
        self.held = 1
        #: operations not yet taken by the writer, and not yet answered
        self.untaken = 1
        self.unanswered = 1

    def _release_held(
        self, operation: str | None = None, key_len: int = 0, outcome: str = "ok"
    ) -> None:
        """Give back what the held operations hold, innermost gate first: the
        execution ticket, the write permits, the bucket slots. A lone operation
        with its ``operation`` named gives its slot back by name (the queue's
        trace says which); otherwise the slots go back at once."""
        p, n = self._pipeline, self.held
        self.held = 0
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        if self.permit is not None:
            p.permits.release(self.permit, n)
            self.permit = None
        if self.queue is not None:
            if n == 1 and operation is not None:
                p.queues.release(self.queue, operation=operation, key_len=key_len, outcome=outcome)
            else:
                p.queues.release_many(self.queue, n, outcome=outcome)
            self.queue = None

    def release_queue_bounds(self, n: int = 1) -> None:
        """``n`` writes were taken by the group-commit writer: once the run's last
        is, give back what bounds the writer's queue (execution tickets, bucket
        slots, write permits) before the commit is durable, so the next batch can
        gather meanwhile. The ingress tickets stay until the writes are answered
        (they bound work in the server)."""
        self.untaken -= n
        if self.untaken > 0:
            return
        self._release_held()

    def release(
        self, operation: str = "", key_len: int = 0, outcome: str = "ok", n: int = 1
    ) -> None:
        """``n`` operations are over: once the last one holding this is, give
        everything back, innermost gate first (idempotent)."""
        self.unanswered -= n
        if self.unanswered > 0:
            return
        self.untaken = 0
        self._release_held(operation, key_len, outcome)
        if self.ingress is not None:
            self.ingress.release()
            self.ingress = None


@dataclass(frozen=True, slots=True)
class PipelineStatistics:
    """Every gate's own statistics record, in path order."""

    request_rate: RateLimiterStatistics
    ingress: TicketHolderStatistics
    throttle: ThrottleStatistics
    bucket_queues: BucketQueuesStatistics
    write_permits: WritePermitStatistics
    read_tickets: TicketHolderStatistics
    write_tickets: TicketHolderStatistics


@dataclass(eq=False)
class Pipeline:
    """The gates of the request path, in order; see the module docstring."""

    request_limiter: RateLimiter
    #: client addresses the request rate limiter lets pass (counted as exempted)
    request_exemptions: CidrMatcher
    ingress: TicketHolder
    throttle: TenantThrottleGate
    queues: BucketQueueGate
    permits: WritePermitGate
    read_tickets: TicketHolder
    write_tickets: TicketHolder
    #: Switches, as their origins have (MongoDB's ingress rate limiter and admission
    #: controller; Manta's throttle; the lag-driven permits): a gate switched off
    #: costs nothing. Runtime parameters set them (:meth:`parameter_table`).
    request_rate_enabled: bool = True
    ingress_enabled: bool = True
    queues_enabled: bool = True
    permits_enabled: bool = True

    # -- per request (every command, admin ones too) --------------------------

    def check_request_rate(self, peer_ip: str, *, admin: bool) -> errors.ServerError | None:
        """The ingress request rate limiter, first on every request after hello:
        None when the request may go on, else the 462 error to answer it with.
        An admin's admin commands (``admin``: the caller checks the user, not only
        the command's name) and exempt client addresses pass, counted as exempted.
        The caller skips it when ``request_rate_enabled`` is off (a switched-off
        gate costs nothing)."""
        limiter = self.request_limiter
        exempt = admin or self.request_exemptions.matches(peer_ip)
        if limiter.try_acquire(exempt=exempt) is None:
            return limiter.rejection()
        return None

    def take_request_token(self, peer_ip: str, now: float) -> bool:
        """The request rate limiter's token for the first request of a received chunk
        (:meth:`TokenBucket.take_at` at ``now``, the chunk's reading of trio's clock),
        or True for an exempt client address, counted as exempted; False, with
        nothing taken, when no token is there: the chunk then takes a loan
        (:meth:`lend_request_tokens`), which answers and counts the refusal."""
        if self.request_exemptions.matches(peer_ip):
            self.request_limiter.try_acquire(exempt=True)
            return True
        return self.request_limiter.take_at(now)

    def lend_request_tokens(self, peer_ip: str, now: float) -> float | None:
        """The request rate limiter's tokens for the requests of one received chunk
        (:meth:`TokenBucket.lend`; ``now``: the chunk's reading of trio's clock),
        or None when they take no loan: an exempt client address (each request
        counted as exempted by :meth:`check_request_rate`), or callers waiting to
        borrow."""
        if self.request_exemptions.matches(peer_ip):
            return None
        return self.request_limiter.lend(now)

    def count_exempt_request(self) -> None:
        """A request the rate limiter does not limit (hello: an anonymous client
        cannot drain the tokens), counted as docs/admission.md says."""
        if self.request_rate_enabled:
            self.request_limiter.try_acquire(exempt=True)

    # -- per data operation ---------------------------------------------------

    def try_pass_read(
        self, bucket: str, *, unthrottled: bool, nonblocking: bool = False, turn: bool = False
    ) -> bool:
        """Admit a read that runs inline — to completion before anything else runs —
        through every gate, holding nothing: a ticket or slot taken around it could
        never be seen by another task, so each gate only checks that one is free and
        nobody waits ahead, and counts it as taken and given back (``try_pass``).
        False: nothing admitted, take :meth:`try_acquire` / :meth:`acquire`. Raises,
        like :meth:`try_acquire`, the throttle's rejection when waiting could not help.
        ``turn``: the caller's connection just had a read on ``bucket`` admitted on
        the waiting path, its turn in the throttle queue
        (:meth:`TenantThrottleGate.try_acquire`).
        """
        if self.ingress_enabled and not self.ingress.try_pass():
            return False
        if (
            self.throttle.try_acquire(
                bucket, unthrottled=unthrottled, nonblocking=nonblocking, turn=turn
            )
            is None
        ):
            return False
        if self.queues_enabled and not self.queues.try_pass(bucket, READ):
            return False
        return self.read_tickets.try_pass()

    def passed_reads(self, bucket: str, n: int) -> None:
        """Count ``n`` more inline reads through the gates that :meth:`try_pass_read`
        admitted just before them, in the same run: nothing else ran in between,
        so each gate would have answered as it did for the first (the run's
        throttle allowance, :meth:`TenantThrottle.run_allowance`, is the caller's)."""
        if n <= 0:
            return
        if self.ingress_enabled:
            self.ingress.try_pass(n)
        if self.queues_enabled:
            self.queues.try_pass(bucket, READ, n)
        self.read_tickets.try_pass(n)

    def try_acquire(
        self,
        bucket: str,
        kind: str,
        *,
        unthrottled: bool,
        nonblocking: bool = False,
        cost: int = 0,
    ) -> Holds | None:
        """Admit a ``kind`` (``"read"`` or ``"write"``) operation on ``bucket`` now
        through every gate, or take nothing and return None — or raise, having
        taken nothing, the throttle's rejection when waiting could not help (a
        ``nonblocking`` request over its allowance, a hard limit of 0).

        ``cost``: a write's cost, known before it runs: the throttle admits it at
        that cost and reserves it (``Holds.reserved``), the other gates all
        admitting, so writes in flight cannot overshoot a limit."""
        ingress = None
        if self.ingress_enabled and (ingress := self.ingress.try_acquire()) is None:
            return None
        try:
            admitted = self.throttle.try_acquire(
                bucket, unthrottled=unthrottled, nonblocking=nonblocking, cost=cost
            )
        except BaseException:
            if ingress is not None:
                ingress.release()
            raise
        if admitted is None:
            if ingress is not None:
                ingress.release()
            return None
        queue = None
        if self.queues_enabled:
            queue = self.queues.try_acquire(bucket, kind)
            if queue is None:
                if ingress is not None:
                    ingress.release()
                return None
        write = kind == WRITE
        permit = None
        if write and self.permits_enabled:
            permit = self.permits.try_acquire(bucket)
            if permit is None:
                if queue is not None:
                    self.queues.release(queue, outcome="requeued")
                if ingress is not None:
                    ingress.release()
                return None
        ticket = (self.write_tickets if write else self.read_tickets).try_acquire()
        if ticket is None:
            if permit is not None:
                self.permits.release(permit)
            if queue is not None:
                self.queues.release(queue, outcome="requeued")
            if ingress is not None:
                ingress.release()
            return None
        holds = Holds(self, ingress, queue, permit, ticket)
        if cost:
            # Every gate admitted it, nothing ran since the throttle did: reserve.
            holds.reserved = self.throttle.reserve(bucket, cost, unthrottled=unthrottled)
        return holds

    def refund(self, bucket: str, holds: Holds) -> None:
        """The write admitted with ``holds`` will not run (refused after its wait):
        give its reserved units back — "not executed" costs nothing."""
        if holds.reserved:
            self.throttle.throttle.refund(bucket, holds.reserved)
            holds.reserved = 0

    def join_room(self, holds: Holds) -> int:
        """How many more writes may join a run that :meth:`try_acquire` admitted
        (``holds``, none of them taken by the writer yet), nothing else having run
        since: the fewest free at any gate the run holds, 0 where anybody waits.
        That many ``try_acquire`` calls in a row would each be admitted, through
        the same gate objects, and the next refused: each join takes exactly one
        more at every gate. The joins are counted by :meth:`join`, once.

        The throttle is not among them: each joining write has a cost of its
        own, so the caller asks the throttle for each at that cost and reserves
        it (``server/execution.py``), as for the run's first."""
        if not holds.untaken:
            return 0
        room = sys.maxsize
        if holds.ingress is not None:
            room = min(room, self.ingress.room())
        if holds.queue is not None:
            room = min(room, self.queues.room(holds.queue))
        if holds.permit is not None:
            room = min(room, self.permits.room(holds.permit))
        if holds.ticket is not None:
            room = min(room, self.write_tickets.room())
        return room

    def join(self, holds: Holds, n: int) -> None:
        """Count ``n`` writes that joined the run of ``holds`` at every gate it
        holds — at most :meth:`join_room`'s answer, nothing else having touched
        the gates since it was asked (the run joins them before anything awaits)."""
        if n <= 0:
            return
        if holds.ingress is not None:
            self.ingress.add(holds.ingress, n)
        if holds.queue is not None:
            self.queues.add(holds.queue, n)
        if holds.permit is not None:
            self.permits.add(holds.permit, n)
        if holds.ticket is not None:
            self.write_tickets.add(holds.ticket, n)
        holds.held += n
        holds.untaken += n
        holds.unanswered += n

    async def acquire(
        self,
        bucket: str,
        kind: str,
        *,
        unthrottled: bool,
        deadline: float | None,
        nonblocking: bool,
        operation: str,
        key_len: int,
        cost: int = 0,
    ) -> Holds:
        """Wait at each gate in order; raises the first gate's rejection (nothing held).
        ``cost``: a write's known cost, reserved the moment the throttle admits it
        (before the gates after it wait; given back if one of them refuses)."""
        ingress = await self.ingress.acquire(deadline=deadline) if self.ingress_enabled else None
        queue: BucketQueue | None = None
        permit: BucketPermits | None = None
        write = kind == WRITE
        reserved = 0
        try:
            await self.throttle.acquire(
                bucket,
                unthrottled=unthrottled,
                deadline=deadline,
                nonblocking=nonblocking,
                cost=cost,
            )
            if cost:
                reserved = self.throttle.reserve(bucket, cost, unthrottled=unthrottled)
            if self.queues_enabled:
                queue = await self.queues.acquire(
                    bucket, kind, operation=operation, key_len=key_len, deadline=deadline
                )
            if write and self.permits_enabled:
                permit = await self.permits.acquire(bucket, deadline=deadline)
            holder = self.write_tickets if write else self.read_tickets
            ticket = await holder.acquire(deadline=deadline)
        except BaseException:
            if reserved:
                self.throttle.throttle.refund(bucket, reserved)
            if permit is not None:
                self.permits.release(permit)
            if queue is not None:
                self.queues.release(queue, operation=operation, key_len=key_len, outcome="rejected")
            if ingress is not None:
                ingress.release()
            raise
        holds = Holds(self, ingress, queue, permit, ticket)
        holds.reserved = reserved
        return holds

    def release(self, holds: Holds, /, operation: str = "", key_len: int = 0) -> None:
        """:meth:`Holds.release` (the gate protocol's spelling)."""
        holds.release(operation, key_len)

    def statistics(self) -> PipelineStatistics:
        return PipelineStatistics(
            request_rate=self.request_limiter.statistics(),
            ingress=self.ingress.statistics(),
            throttle=self.throttle.statistics(),
            bucket_queues=self.queues.statistics(),
            write_permits=self.permits.statistics(),
            read_tickets=self.read_tickets.statistics(),
            write_tickets=self.write_tickets.statistics(),
        )

    # -- runtime parameters -------------------------------------------------

    def parameter_table(self) -> ParameterTable:
        """The runtime parameters this object applies: its switches and exemptions."""

        def switch(attr: str) -> Callable[[Any], None]:
            return lambda on: setattr(self, attr, bool(on))

        def exemptions(value: Any) -> None:
            self.request_exemptions = CidrMatcher(value, name=EXEMPTIONS_PARAMETER)

        return {
            "ingress_request_rate_limiter_enabled": switch("request_rate_enabled"),
            "ingress_admission_controller_enabled": switch("ingress_enabled"),
            "bucket_queue_enabled": switch("queues_enabled"),
            "write_permit_enabled": switch("permits_enabled"),
            EXEMPTIONS_PARAMETER: exemptions,
        }
