"""The protocol every admission gate speaks, as Trio pairs ``op`` with ``op_nowait``.

    hold = gate.try_acquire(...)                # never waits: a hold, or None (nothing taken)
    hold = await gate.acquire(..., deadline=t)  # waits in the gate's order, or raises
                                                # the gate's labelled rejection by ``t``
    gate.release(hold, ...)                     # exactly once, when the work is over
    gate.statistics()                           # a frozen record of the gate's counters

Runtime parameters: a gate's ``parameter_table()`` is the table of the knobs it
applies live (:data:`ParameterTable`); the node merges the tables instead of
knowing each gate's knobs.

``deadline`` is absolute Trio time (``None``: the gate's own bound only).
Arguments that choose a behaviour are keywords (``unthrottled=True``), never
bare positional booleans, so a call site reads as what it asks.

A gate whose admission takes nothing that must be given back — a rate
limiter's token is spent, the tenant throttle charges after the operation ran
— returns :data:`ADMITTED`, and its ``release`` does nothing; the pair still
exists so that every gate composes the same way in
:class:`~tenantkv.admission.pipeline.Pipeline`.

The gates: :class:`~tenantkv.admission.rate_limiter.RateLimiter`,
:class:`~tenantkv.admission.execution_tickets.TicketHolder`,
:class:`~tenantkv.admission.throttle_gate.TenantThrottleGate`,
:class:`~tenantkv.admission.bucket_queues.BucketQueueGate` and
:class:`~tenantkv.admission.write_permits.WritePermitGate`
(``tests/unit/test_gate_protocol.py`` checks each against this protocol).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar, final

H = TypeVar("H")

#: What a gate's ``parameter_table()`` returns: the runtime parameters it applies,
#: named as its own knobs (the node adds the setting's prefix, e.g. a bucket
#: queue's ``concurrency`` is the setting ``bucket_queue_concurrency``), each
#: with the function that applies a new (already validated) value to it live.
ParameterTable = dict[str, Callable[[Any], None]]


class Gate(Protocol[H]):
    """What the pipeline needs of a gate (see the module docstring)."""

    def try_acquire(self, *args: Any, **kwargs: Any) -> H | None: ...

    async def acquire(self, *args: Any, **kwargs: Any) -> H: ...

    def release(self, hold: H, /, *args: Any, **kwargs: Any) -> None: ...

    def statistics(self) -> Any: ...


def trio_clock() -> Callable[[], float]:
    """Trio's clock, read without ``trio.current_time``'s lookups (call inside
    ``trio.run``): the same readings — a MockClock's in tests — at half the cost,
    which the throttle pays on every charge."""
    import trio

    return trio.lowlevel.current_clock().current_time


@final
class Admitted:
    """The hold of a gate that takes nothing to give back (one shared instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ADMITTED"


ADMITTED: Final = Admitted()
