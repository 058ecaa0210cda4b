"""The expiry pager: reclaims expired records from disk when they fall due.

Reads already hide an expired record (its expiry is checked on every read), so
the pager only gives the space back. It does not poll: it reads when the next
record expires from the head of the LMDB expiry index — itself the ordered
schedule, durable and never out of step with the data — sleeps until then,
and is woken early when a committed batch wrote an earlier expiry (the
group-commit writer reports each batch's earliest one). Sleeps are at least
:data:`MIN_ROUND_SECS` apart, so keys expiring a few ms apart are reclaimed in
one transaction, and at most ``expiry_pager_interval_secs``, so a wall clock
stepped forward is noticed.

(An in-memory sorted schedule — ``sortedcontainers`` — was the other way: it
would be a second copy of this index, to bound, rebuild at start and keep
consistent across bucket drops; the index's head answers the only question
the pager asks.)
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from tenantkv.storage.engine import Engine
from tenantkv.storage.ops import ExpireDueOp, WriteOp

#: Shortest time between two reclaim rounds: coalesces nearby expiries.
MIN_ROUND_SECS = 0.1


class ExpiryPager:
    def __init__(
        self,
        engine: Engine,
        write: Callable[[WriteOp], Awaitable[Any]],
        max_sleep_secs: Callable[[], float],
    ) -> None:
        self._engine = engine
        self._write = write
        self._max_sleep = max_sleep_secs
        self._wake = trio.Event()
        #: the wall-clock ms the pager sleeps until (inf: nothing scheduled)
        self._target_ms = math.inf
        #: reclaim rounds run so far (tests and status read it)
        self.rounds = 0

    def expiry_written(self, expiry_ms: int) -> None:
        """A committed batch wrote ``expiry_ms`` (on the Trio thread): wake the pager
        if that is earlier than what it sleeps until."""
        if expiry_ms < self._target_ms:
            self._wake.set()

    async def run(self) -> None:
        engine = self._engine
        while True:
            next_ms = engine.next_expiry_ms()
            now_ms = engine.now_ms()
            if next_ms is not None and next_ms <= now_ms:
                await self._reclaim()
                self._target_ms = math.inf
                await trio.sleep(MIN_ROUND_SECS)
                continue
            self._target_ms = math.inf if next_ms is None else next_ms
            delay = self._max_sleep()
            if next_ms is not None:
                delay = min(delay, (next_ms - now_ms) / 1000)
            with trio.move_on_after(max(delay, 0.0)):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _reclaim(self) -> None:
        self.rounds += 1
        while True:
            op = ExpireDueOp()
            result = await self._write(op)
            if result["scanned"] < op.limit:
                return
