"""The admission pipeline: the gates a data command passes, in path order.

    ingress admission ticket ─► tenant throttle ─► bucket queue (read / write)
      ─► write permit (writes only) ─► execution ticket ─► storage

(The ingress request rate limiter sits in front of all of this, per request,
in the session; it applies to admin commands too.)

:meth:`Pipeline.try_admit` is the fast path the session runs for every
operation: each gate's synchronous ``try_acquire``, no await, and when any
gate cannot admit at once it gives back what it took and returns ``None``.
The session then calls :meth:`Pipeline.admit`, which waits at each gate in
the same order, bounded by the request's deadline. Either way the caller gets
a :class:`Holds` and releases it exactly once when the operation is over — a
read right after it ran, a write when its group commit is durable.

A rejection anywhere happens before storage, so the operation had no effect.
Exempt work (admin commands, the expiry pager) does not come through here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trio

from tenantkv import errors
from tenantkv.admission.bucket_queues import READ, WRITE, BucketQueue, BucketQueueGate
from tenantkv.admission.execution_tickets import Ticket, TicketHolder
from tenantkv.admission.tenant_throttle import TenantThrottle, TenantThrottleGate
from tenantkv.admission.write_permits import BucketPermits, WritePermitGate

#: Default size of the ingress admission controller: effectively "no limit"
#: until an operator lowers it; it bounds operations in the server at once.
DEFAULT_INGRESS_TICKETS = 1_000_000


class Holds:
    """What one admitted operation holds; :meth:`release` gives all of it back."""

    __slots__ = ("_pipeline", "ingress", "permit", "queue", "ticket")

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

    def release_queue_bounds(self) -> None:
        """A write was taken by the group-commit writer: give back what bounds the
        writer's queue (execution ticket, bucket slot, write permit) before its
        commit is durable, so the next batch can gather meanwhile. The ingress
        ticket stays until the write is answered (it bounds work in the server)."""
        p = self._pipeline
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        if self.permit is not None:
            p.permits.release(self.permit)
            self.permit = None
        if self.queue is not None:
            p.queues.release(self.queue, outcome="ok")
            self.queue = None

    def release(self, operation: str = "", key_len: int = 0, outcome: str = "ok") -> None:
        """Give everything back, innermost gate first (idempotent)."""
        p = self._pipeline
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        if self.permit is not None:
            p.permits.release(self.permit)
            self.permit = None
        if self.queue is not None:
            p.queues.release(self.queue, operation=operation, key_len=key_len, outcome=outcome)
            self.queue = None
        if self.ingress is not None:
            self.ingress.release()
            self.ingress = None


@dataclass(eq=False)
class Pipeline:
    ingress: TicketHolder
    throttle: TenantThrottle
    throttle_gate: TenantThrottleGate
    queues: BucketQueueGate
    permits: WritePermitGate
    read_tickets: TicketHolder
    write_tickets: TicketHolder
    #: Switches, as their origins have (MongoDB's ingress admission controller;
    #: Manta's throttle; the lag-driven permits): a gate switched off costs nothing.
    ingress_enabled: bool = True
    queues_enabled: bool = True
    permits_enabled: bool = True

    def try_admit(self, bucket: str, write: bool, unthrottled: bool) -> Holds | None:
        """Admit now through every gate, or take nothing and return None."""
        ingress = None
        if self.ingress_enabled and (ingress := self.ingress.try_acquire()) is None:
            return None
        throttle = self.throttle
        if unthrottled:
            throttle.try_admit(bucket, unthrottled=True)  # charged later, never delayed
        elif throttle.enabled and (
            self.throttle_gate.waiting(bucket) or throttle.try_admit(bucket) != 0.0
        ):
            if ingress is not None:
                ingress.release()
            return None
        queue = None
        if self.queues_enabled:
            queue = self.queues.try_acquire(bucket, WRITE if write else READ)
            if queue is None:
                if ingress is not None:
                    ingress.release()
                return None
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
        return Holds(self, ingress, queue, permit, ticket)

    async def admit(
        self,
        bucket: str,
        write: bool,
        *,
        unthrottled: bool,
        deadline: float | None,
        nonblocking: bool,
        operation: str,
        key_len: int,
    ) -> Holds:
        """Wait at each gate in order; raises the first gate's rejection (nothing held)."""
        ingress = await self.ingress.acquire(deadline=deadline) if self.ingress_enabled else None
        queue: BucketQueue | None = None
        permit: BucketPermits | None = None
        try:
            await self.throttle_gate.admit(
                bucket, unthrottled=unthrottled, deadline=deadline, nonblocking=nonblocking
            )
            if self.queues_enabled:
                queue = await _by(  # type: ignore[assignment]
                    deadline,
                    self.queues.acquire(
                        bucket, WRITE if write else READ, operation=operation, key_len=key_len
                    ),
                )
            if write and self.permits_enabled:
                permit = await _by(deadline, self.permits.acquire(bucket))  # type: ignore[assignment]
            holder = self.write_tickets if write else self.read_tickets
            ticket = await holder.acquire(deadline=deadline)
        except BaseException:
            if permit is not None:
                self.permits.release(permit)
            if queue is not None:
                self.queues.release(queue, operation=operation, key_len=key_len, outcome="rejected")
            if ingress is not None:
                ingress.release()
            raise
        return Holds(self, ingress, queue, permit, ticket)


async def _by(deadline: float | None, wait: object) -> object:
    """Await ``wait`` (a coroutine) but give up with DeadlineExceeded at ``deadline``."""
    with trio.move_on_at(math.inf if deadline is None else deadline) as scope:
        return await wait  # type: ignore[misc]
    assert scope.cancelled_caught
    raise errors.DeadlineExceeded("the request's deadline passed while it waited for admission")
