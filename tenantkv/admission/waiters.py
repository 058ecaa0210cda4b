"""What the FIFO gates share: a waiter, how a Trio task parks on one, a wait histogram.

The bucket queues and the write permits are the same machine around different
counts: a sans-IO core keeps a FIFO of :class:`Waiter` per bucket and *grants*
a waiter (sets ``granted``) when a slot passes to it; the Trio adapter parks
the task on the waiter's event (:func:`park`) and wakes the ones the core
granted (:func:`wake`). Granting in the core, not in the woken task, is what
keeps the FIFO strict: a newcomer cannot take a slot between the grant and the
waiter's wake-up.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio


class Waiter:
    """A request waiting for a slot. ``event`` belongs to the adapter."""

    __slots__ = ("enqueued", "event", "granted")

    def __init__(self, enqueued: float) -> None:
        self.enqueued = enqueued
        self.granted = False
        self.event: Any = None


def unqueue(waiters: deque[Waiter], waiter: Waiter) -> None:
    """Take ``waiter`` out of its queue if it is still there."""
    if waiter in waiters:
        waiters.remove(waiter)


def wake(waiters: Iterable[Waiter]) -> None:
    """Wake the tasks parked on waiters the core just granted (or failed)."""
    for w in waiters:
        if w.event is not None:
            w.event.set()


async def park(
    waiter: Waiter,
    *,
    deadline: float | None,
    give_back: Callable[[], None],
    abandon: Callable[[], None],
) -> bool:
    """Wait until the core settles ``waiter`` or ``deadline`` (Trio time) passes;
    returns ``waiter.granted``.

    Cancelled while parked, the slot is handed on: ``give_back()`` when the
    grant came at that very instant, else ``abandon()`` (leave the queue).
    """
    event = waiter.event = trio.Event()
    try:
        with trio.move_on_at(math.inf if deadline is None else deadline):
            await event.wait()
    except BaseException:
        if waiter.granted:
            give_back()
        else:
            abandon()
        raise
    return waiter.granted


def observe_wait(histogram: list[int], bounds: Sequence[int], micros: int) -> None:
    """Count one wait of ``micros`` in ``histogram``: the bin of the first bound
    it does not exceed, the last bin past every bound (as every histogram here)."""
    histogram[bisect_left(bounds, micros)] += 1
