"""The servers a client may talk to: its address list, its home server, and which are down.

A client is given one address (``host``, ``port``) or several (``addresses``).
It connects to the first that accepts it — its **home** server — at once; every
operation's first attempt goes there, as do all admin and session commands.
The others are used only for the retry of an overloaded data command, which
goes to a server that has not rejected this operation yet (see
:meth:`ServerSet.pick_retry`); their connections are opened on first use. A
server whose connection could not be opened is left out for
:data:`SERVER_DOWN_SECS`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tenantkv.protocol import DEFAULT_PORT

Address = tuple[str, int]

DEFAULT_HOST = "127.0.0.1"
#: How long a server whose connection failed to open is not chosen for retries.
SERVER_DOWN_SECS = 5.0


def parse_address(text: str) -> Address:
    """``"host:port"``, ``"[v6addr]:port"`` or ``"host"`` (port 7207) as ``(host, port)``."""
    text = text.strip()
    if not text:
        raise ValueError("empty server address")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad server address {text!r}: missing ']'")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad server address {text!r}")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"bad server address {text!r}: no host")
    if not port_text:
        return host, DEFAULT_PORT
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad port in server address {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in server address {text!r}")
    return host, port


def resolve_addresses(
    host: str | None,
    port: int | None,
    addresses: str | Sequence[str | Address] | None,
) -> list[Address]:
    """The client's address list from its constructor arguments (in order, no duplicates)."""
    if addresses is None:
        return [(DEFAULT_HOST if host is None else host, DEFAULT_PORT if port is None else port)]
    if host is not None or port is not None:
        raise ValueError("give either host/port or addresses, not both")
    items: Sequence[str | Address] = (
        addresses.split(",") if isinstance(addresses, str) else addresses
    )
    out: list[Address] = []
    for item in items:
        if isinstance(item, str):
            addr = parse_address(item)
        else:
            h, p = item
            if not isinstance(h, str) or not isinstance(p, int):
                raise ValueError(f"bad server address {item!r}: expected (host, port)")
            addr = (h, p)
        if addr not in out:
            out.append(addr)
    if not out:
        raise ValueError("addresses is empty")
    return out


class ServerSet:
    """The addresses, the home server's index and the servers currently considered down."""

    __slots__ = ("_down_until", "_lock", "addresses", "home")

    def __init__(self, addresses: Sequence[Address], home: int = 0) -> None:
        self.addresses: tuple[Address, ...] = tuple(addresses)
        self.home = home
        self._down_until = [0.0] * len(self.addresses)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.addresses)

    def mark_down(self, index: int, now: float) -> None:
        """The connection to ``index`` could not be opened: skip it for a while."""
        with self._lock:
            self._down_until[index] = now + SERVER_DOWN_SECS

    def is_up(self, index: int, now: float) -> bool:
        return index == self.home or self._down_until[index] <= now

    def pick_retry(self, current: int, avoid: set[int] | frozenset[int], now: float) -> int:
        """The server for a retry after ``current`` rejected it as overloaded.

        The next server after ``current`` (in address order, wrapping) that is
        up and not in ``avoid`` (those that already rejected this operation);
        if every other server did, the next one that is up, so retries spread
        round the list; with one server, always that one.
        """
        n = len(self.addresses)
        if n == 1:
            return current
        order = [(current + k) % n for k in range(1, n + 1)]  # ends with current
        for i in order:
            if i not in avoid and self.is_up(i, now):
                return i
        for i in order:
            if self.is_up(i, now):
                return i
        return self.home  # pragma: no cover - home is always up
