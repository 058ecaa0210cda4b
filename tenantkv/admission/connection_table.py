"""Who may hold a connection: node and per-address caps, slots kept for admins.

The first gate on the path, per connection rather than per request (so it sits
in ``server/server.py``'s accept path, not in the request pipeline):

* at most ``max_connections`` connections, pre-``hello`` ones included;
* at most ``max_connections_per_address`` from one client address, so one
  host cannot fill the node; ``admin_reserved_connections_per_address`` more
  are admitted from it, for admins only: a non-admin ``hello`` is refused once
  that address's authenticated non-admin sessions hold ``max_connections_per_address``
  (so a host's users idling on all its slots cannot lock out its admin);
* ``admin_reserved_connections`` of the node's slots are kept for admins (as
  PostgreSQL keeps ``superuser_reserved_connections``): a non-admin ``hello``
  is refused once non-admin sessions hold ``max_connections`` minus those;
* a connection that has not said ``hello`` holds its slot cheaply: when a new
  connection finds its address or the node full, the oldest connection still
  without ``hello`` (older than ``EVICTABLE_AFTER_SECS``, so an honest client's
  handshake in progress is left alone) gives way to it. Idle, unauthenticated
  connections therefore cannot lock the operator out.

Sans-IO: decisions from counts and an injected ``now``; the server closes what
:meth:`ConnectionTable.admit` names for eviction.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

#: How long a connection without hello is protected from eviction.
EVICTABLE_AFTER_SECS = 1.0


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision for a new connection: ``ok``; else ``reason`` says why not.
    ``evict``: a connection id to close to make room (``ok`` is then True)."""

    ok: bool
    evict: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ConnectionTableStatistics:
    current: int
    unauthenticated: int
    admins: int
    addresses: int
    refused_node_full: int
    refused_address_full: int
    refused_reserved_for_admins: int
    refused_reserved_for_admins_per_address: int
    evicted_unauthenticated: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ConnectionTable:
    def __init__(self) -> None:
        #: connection id -> address, for every connection the table admitted
        self._addr: dict[int, str] = {}
        self._per_addr: Counter[str] = Counter()
        #: connections without hello, oldest first: id -> time admitted
        self._unauthenticated: OrderedDict[int, float] = OrderedDict()
        self._admins: set[int] = set()
        #: authenticated non-admin connections per address
        self._users_per_addr: Counter[str] = Counter()
        self._users: set[int] = set()
        self._refused_node = self._refused_addr = self._refused_reserved = self._evicted = 0
        self._refused_reserved_addr = 0

    def __len__(self) -> int:
        return len(self._addr)

    def admit(
        self,
        conn_id: int,
        addr: str,
        now: float,
        *,
        max_connections: int,
        per_address: int,
        reserved_per_address: int = 0,
    ) -> Admission:
        """A new connection from ``addr``: admit it, maybe evicting an older one.
        ``reserved_per_address`` more than ``per_address`` are admitted: who it is
        is known at hello (:meth:`authenticated` keeps those for admins)."""
        evict = None
        per_address += reserved_per_address
        if self._per_addr[addr] >= per_address:
            evict = self._evictable(now, addr)
            if evict is None:
                self._refused_addr += 1
                return Admission(
                    False,
                    reason=f"max_connections_per_address={per_address} reached for {addr}",
                )
        elif len(self._addr) >= max_connections:
            evict = self._evictable(now, None)
            if evict is None:
                self._refused_node += 1
                return Admission(False, reason=f"max_connections={max_connections} reached")
        if evict is not None:
            self._evicted += 1
            self.closed(evict)
        self._addr[conn_id] = addr
        self._per_addr[addr] += 1
        self._unauthenticated[conn_id] = now
        return Admission(True, evict)

    def _evictable(self, now: float, addr: str | None) -> int | None:
        """The oldest connection without hello (of ``addr`` if given) old enough to go."""
        for conn_id, since in self._unauthenticated.items():
            if now - since < EVICTABLE_AFTER_SECS:
                return None  # the rest are younger still
            if addr is None or self._addr.get(conn_id) == addr:
                return conn_id
        return None

    def authenticated(
        self,
        conn_id: int,
        *,
        admin: bool,
        max_connections: int,
        reserved_for_admins: int,
        per_address: int | None = None,
    ) -> str | None:
        """``conn_id`` said hello; None if it may stay, else why it may not.
        ``per_address``: the most authenticated non-admin sessions of one address
        (those admitted beyond it are the admins' reserved slots)."""
        addr = self._addr.get(conn_id)
        if addr is None:
            return "the connection was closed to make room for another"
        if not admin and conn_id not in self._users:
            if per_address is not None and self._users_per_addr[addr] >= per_address:
                self._refused_reserved_addr += 1
                self.closed(conn_id)
                return (
                    f"max_connections_per_address={per_address} reached for {addr} by users "
                    "who are not admins (admin_reserved_connections_per_address are kept)"
                )
            others = len(self._addr) - len(self._unauthenticated) - len(self._admins)
            if others >= max_connections - reserved_for_admins:
                self._refused_reserved += 1
                self.closed(conn_id)  # its slot is free before the refusal is sent
                return (
                    f"max_connections={max_connections} reached for users who are not admins "
                    f"(admin_reserved_connections={reserved_for_admins})"
                )
        self._unauthenticated.pop(conn_id, None)
        if admin:
            self._admins.add(conn_id)
        elif conn_id not in self._users:
            self._users.add(conn_id)
            self._users_per_addr[addr] += 1
        return None

    def closed(self, conn_id: int) -> None:
        addr = self._addr.pop(conn_id, None)
        if addr is None:
            return
        self._per_addr[addr] -= 1
        if not self._per_addr[addr]:
            del self._per_addr[addr]
        self._unauthenticated.pop(conn_id, None)
        self._admins.discard(conn_id)
        if conn_id in self._users:
            self._users.discard(conn_id)
            self._users_per_addr[addr] -= 1
            if not self._users_per_addr[addr]:
                del self._users_per_addr[addr]

    def statistics(self) -> ConnectionTableStatistics:
        return ConnectionTableStatistics(
            current=len(self._addr),
            unauthenticated=len(self._unauthenticated),
            admins=len(self._admins),
            addresses=len(self._per_addr),
            refused_node_full=self._refused_node,
            refused_address_full=self._refused_addr,
            refused_reserved_for_admins=self._refused_reserved,
            refused_reserved_for_admins_per_address=self._refused_reserved_addr,
            evicted_unauthenticated=self._evicted,
        )
