"""Node-wide cap on the bytes clients make the server hold, over all connections.

Each connection's decoder holds what it received until a frame completes (up
to one maximal frame, ~20 MiB), and a decoded write's value stays in memory
until the write is durable (its connection may pipeline 64 MiB of them). Bounding
each connection alone lets N connections hold N times that; this gate bounds
the sum of both over every connection (``max_receive_buffer_bytes``), and with
them the arguments of commands queued in transactions (MULTI ... EXEC): a
connection tells it what it holds when its chunk settles and as the writer
answers its writes. A connection asks for room before it reads: while the node
is at its cap it waits (and so does TCP for its client) until another connection
decodes, has its writes answered or closes; the cap is back-pressure, never an
error (only a transaction's queue, which nothing but EXEC or DISCARD empties, is
refused past it: :meth:`has_room`).

Two rules keep the cap from becoming a stall:

* **One user may hold at most half of it** (:data:`USER_SHARE`): a tenant
  that starts many large frames and never finishes them waits at its share,
  and other tenants' frames still find room.
* **At the cap, one connection holding part of a frame may still read** (the
  *finisher*, first come, until it holds nothing): connections that all hold
  partial frames would otherwise wait for one another until their frame
  deadlines (thirty concurrent 20 MiB writes against a 256 MiB cap all timed
  out). A finisher that stops sending keeps the place until its frame
  deadline, as before.

Sans-IO: :meth:`try_reserve` / :meth:`update` are arithmetic; only
:meth:`reserve` parks, on a ``ParkingLot``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import trio

#: What a connection holding nothing may read while the node is at its cap.
SMALL_READ_BYTES = 4096
#: The part of the cap one user's connections may hold.
USER_SHARE = 0.5


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
    #: the most one user's connections may hold
    user_capacity_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReceiveBuffers:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.user_capacity = max(SMALL_READ_BYTES, int(capacity_bytes * USER_SHARE))
        self.buffered = 0
        #: bytes held by each user's connections (None, before hello: not shared out)
        self._by_user: dict[str, int] = {}
        #: what each connection holding bytes holds, and for which user
        self._holders: dict[object, tuple[str | None, int]] = {}
        self._finisher: object | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._waits = 0

    def try_reserve(self, holder: object, held: int, want: int, user: str | None = None) -> int:
        """Bytes ``holder`` (a connection holding ``held``, authenticated as ``user``)
        may read now (0: wait). Under the cap and the user's share, ``want``;
        past either, a connection that holds nothing may still read
        :data:`SMALL_READ_BYTES` (its hello, a small request: the overshoot is at
        most that much per connection), and one holding part of a frame may if it
        is the finisher or becomes it."""
        if self.has_room(user):
            return want
        if not held:
            return min(want, SMALL_READ_BYTES)
        if self._finisher is None or self._finisher is holder:
            self._finisher = holder
            return want
        return 0

    def has_room(self, user: str | None = None) -> bool:
        """Is the node under its cap, and ``user`` (if any) under its share? What
        a connection asks before it reads, and a transaction before it queues
        more bytes (those are held until EXEC: refused past the cap, not waited
        for — ``server/transaction.py``)."""
        return self.buffered < self.capacity and (
            user is None or self._by_user.get(user, 0) < self.user_capacity
        )

    async def reserve(self, holder: object, held: int, want: int, user: str | None = None) -> int:
        """Wait until :meth:`try_reserve` allows a read; the bytes allowed."""
        while not (n := self.try_reserve(holder, held, want, user)):
            self._waits += 1
            await self._lot.park()
        return n

    def update(self, holder: object, held: int, user: str | None = None) -> None:
        """``holder`` now holds ``held`` bytes (0: none, or it closed), for ``user``."""
        old_user, old = self._holders.pop(holder, (None, 0))
        if held:
            self._holders[holder] = (user, held)
        self.buffered += held - old
        if old_user is not None:
            left = self._by_user[old_user] - old
            if left:
                self._by_user[old_user] = left
            else:
                del self._by_user[old_user]
        if user is not None and held:
            self._by_user[user] = self._by_user.get(user, 0) + held
        freed = held < old
        if not held and self._finisher is holder:
            self._finisher = None
            freed = True
        if freed and self._lot:
            self._lot.unpark_all()

    def statistics(self) -> ReceiveBufferStatistics:
        return ReceiveBufferStatistics(
            self.capacity, self.buffered, len(self._lot), self._waits, self.user_capacity
        )
