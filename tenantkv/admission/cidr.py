"""CIDR exemption lists: which peers bypass a rate limiter.

MongoDB exempts address ranges from its ingress limiters
(``ingressRequestRateLimiterExemptions``); tenantkv does the same for its
monitoring hosts, its own admin tools and the application tier an operator
trusts. :class:`CidrMatcher` parses the list once (IPv4 and IPv6, ``ipaddress``
from the standard library) and answers :meth:`CidrMatcher.matches` per peer.

Parsing
    Each entry is a network (``10.0.0.0/8``, ``2001:db8::/32``) or a single
    address (``192.0.2.7`` means ``/32``, ``::1`` means ``/128``). An entry with
    host bits set (``10.0.0.1/8``) is refused rather than silently widened: a
    typo in an exemption list should fail loudly, never exempt more than meant.
    A bad entry raises :class:`~tenantkv.errors.BadValue` naming the parameter,
    the entry's position and what is wrong with it.

Matching
    The peer address is parsed once and the answer cached per address string
    (a node sees few distinct peers, and a peer asks once per request). The
    cache is bounded (:data:`CACHE_SIZE`; it is simply cleared when full, so a
    scan from many addresses cannot grow memory). A miss costs one lookup per
    distinct prefix length in the list, whatever its length. IPv4-mapped IPv6
    peers (``::ffff:10.1.2.3``, what a dual-stack socket reports) match IPv4
    ranges; an IPv6 zone (``fe80::1%eth0``) is ignored. A string that is not an
    address (a Unix socket path, ``""``) matches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

from tenantkv.errors import BadValue

#: Most peer addresses remembered; the cache is cleared when it is full.
CACHE_SIZE: Final = 65_536

_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_cidrs(value: str | Iterable[str], *, name: str = "exemptions") -> list[_IPNetwork]:
    """Parse CIDR entries (a list, or one string of comma/space-separated entries).

    Raises :class:`BadValue` naming ``name`` and the bad entry.
    """
    if isinstance(value, str):
        entries: list[object] = list(value.replace(",", " ").split())
    elif isinstance(value, Iterable) and not isinstance(value, bytes | bytearray | dict):
        entries = list(value)
    else:
        raise BadValue(f"{name} must be a list of CIDR strings, got {type(value).__name__}")
    nets: list[_IPNetwork] = []
    for i, entry in enumerate(entries):
        where = f"{name}[{i}]"
        if not isinstance(entry, str):
            raise BadValue(f"{where} must be a string like '10.0.0.0/8', got {entry!r}")
        text = entry.strip()
        if not text:
            raise BadValue(f"{where} is empty")
        nets.append(_parse_one(where, entry, text))
    return nets


def _parse_one(where: str, entry: str, text: str) -> _IPNetwork:
    """One entry, with a message that says exactly what is wrong."""
    addr_text, slash, prefix_text = text.partition("/")
    try:
        addr = ipaddress.ip_address(addr_text)
    except ValueError:
        raise BadValue(f"{where} {entry!r}: {addr_text!r} is not an IPv4 or IPv6 address") from None
    bits = addr.max_prefixlen
    if slash and (not (prefix_text.isascii() and prefix_text.isdigit()) or int(prefix_text) > bits):
        raise BadValue(
            f"{where} {entry!r}: prefix length {prefix_text!r} must be an integer "
            f"in [0, {bits}] for IPv{addr.version}"
        )
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        try:
            loose = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise BadValue(f"{where} {entry!r} is not a CIDR range ({exc})") from None
        raise BadValue(f"{where} {entry!r} has host bits set; did you mean '{loose}'?") from None


class CidrMatcher:
    """Answers "is this peer address in one of the ranges?" (see the module doc)."""

    __slots__ = ("_cache", "_v4", "_v6", "networks")

    def __init__(self, ranges: str | Iterable[str] = (), *, name: str = "exemptions") -> None:
        self.networks: tuple[_IPNetwork, ...] = tuple(parse_cidrs(ranges, name=name))
        # prefix length -> the set of network numbers shifted right past the host bits
        v4: dict[int, set[int]] = {}
        v6: dict[int, set[int]] = {}
        for net in self.networks:
            table, bits = (v4, 32) if net.version == 4 else (v6, 128)
            shift = bits - net.prefixlen
            table.setdefault(shift, set()).add(int(net.network_address) >> shift)
        self._v4 = tuple(v4.items())
        self._v6 = tuple(v6.items())
        self._cache: dict[str, bool] = {}

    def __len__(self) -> int:
        return len(self.networks)

    @property
    def ranges(self) -> list[str]:
        """The ranges in canonical spelling (for ``get_parameter`` and the status page)."""
        return [str(n) for n in self.networks]

    def matches(self, peer_ip: str) -> bool:
        """True if ``peer_ip`` lies in one of the ranges."""
        hit = self._cache.get(peer_ip)
        if hit is not None:
            return hit
        if not self.networks:
            return False
        hit = self._lookup(peer_ip)
        cache = self._cache
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[peer_ip] = hit
        return hit

    def _lookup(self, peer_ip: str) -> bool:
        text = peer_ip
        if "%" in text:  # IPv6 zone index: routing detail, not identity
            text = text.split("%", 1)[0]
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            return False
        if addr.version == 6:
            mapped = addr.ipv4_mapped
            if mapped is not None:
                addr = mapped
        table = self._v4 if addr.version == 4 else self._v6
        n = int(addr)
        return any((n >> shift) in nets for shift, nets in table)
