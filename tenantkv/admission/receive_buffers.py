"""Node-wide cap on bytes received and not yet decoded, over all connections.

Each connection's decoder holds what it received until a frame completes (up
to one maximal frame, ~20 MiB). Bounding each connection alone lets N
connections hold N frames; this gate bounds their sum (``max_receive_buffer_bytes``).
A connection asks for room before it reads: while the node is at its cap it
waits (and so does TCP for its client) until another connection decodes or
closes; the cap is back-pressure, never an error. Connections that have
started a frame are bounded in time by the frame deadline, so waiting here
cannot last forever.

Sans-IO: :meth:`try_reserve` / :meth:`release` are arithmetic; only
:meth:`reserve` parks, on a ``ParkingLot``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import trio

#: What a connection holding nothing may read while the node is at its cap.
SMALL_READ_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ReceiveBufferStatistics:
    #: the cap, bytes
    capacity_bytes: int
    #: bytes held by all connections' decoders now
    buffered_bytes: int
    #: connections waiting for room right now
    waiting: int
    #: times a connection had to wait for room
    waits_total: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReceiveBuffers:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.buffered = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._waits = 0

    def try_reserve(self, held: int, want: int) -> int:
        """Bytes a connection holding ``held`` may read now (0: wait). Under the cap,
        ``want``; at the cap, a connection that holds nothing may still read
        :data:`SMALL_READ_BYTES` (its hello, a small request: the cap throttles what
        is held, and the overshoot is at most that much per connection)."""
        if self.buffered < self.capacity:
            return want
        return min(want, SMALL_READ_BYTES) if held == 0 else 0

    async def reserve(self, held: int, want: int) -> int:
        """Wait until :meth:`try_reserve` allows a read; the bytes allowed."""
        while not (n := self.try_reserve(held, want)):
            self._waits += 1
            await self._lot.park()
        return n

    def update(self, before: int, after: int) -> None:
        """A connection's held bytes changed from ``before`` to ``after``."""
        self.buffered += after - before
        if after < before and self._lot:
            self._lot.unpark_all()

    def statistics(self) -> ReceiveBufferStatistics:
        return ReceiveBufferStatistics(self.capacity, self.buffered, len(self._lot), self._waits)
