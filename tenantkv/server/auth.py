"""Users, password hashes, role checks and the failed-login limiter.

Passwords are stored as salted scrypt hashes and compared in constant time.
scrypt is deliberately slow (~40 ms), so it runs on a worker thread, and a
successful verification is remembered per (user, password digest) until the
user changes — reconnect storms then cost a hash lookup, not a scrypt each.

:class:`LoginLimiter` counts failed logins per source address in a sliding
window (sans-IO, with an injected clock): past ``limit`` failures in
``window`` seconds an address is refused before any scrypt is spent, until
its oldest counted failure leaves the window. See docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tenantkv import errors

#: Matched with fullmatch: ``$`` alone would also accept a trailing newline.
USER_NAME_RE = re.compile(r"[A-Za-z0-9_.@\-]{1,128}")
ROLES = ("read", "readwrite")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
MAX_PASSWORD_BYTES = 1024


@dataclass(slots=True)
class User:
    name: str
    salt: bytes
    hash: bytes
    admin: bool = False
    unthrottled: bool = False
    #: bucket name -> "read" | "readwrite"
    roles: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "salt": self.salt,
            "hash": self.hash,
            "n": SCRYPT_N,
            "admin": self.admin,
            "unthrottled": self.unthrottled,
            "roles": self.roles,
        }

    @classmethod
    def from_record(cls, name: str, rec: dict[str, Any]) -> User:
        return cls(
            name,
            rec["salt"],
            rec["hash"],
            bool(rec.get("admin")),
            bool(rec.get("unthrottled")),
            dict(rec.get("roles") or {}),
        )

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "unthrottled": self.unthrottled,
            "roles": dict(self.roles),
        }

    def can_read(self, bucket: str) -> bool:
        return self.admin or bucket in self.roles

    def can_write(self, bucket: str) -> bool:
        return self.admin or self.roles.get(bucket) == "readwrite"


def hash_password(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32
    )


def new_user(
    name: str,
    password: str,
    *,
    admin: bool = False,
    unthrottled: bool = False,
    roles: dict[str, str] | None = None,
) -> User:
    salt = os.urandom(16)
    return User(name, salt, hash_password(password, salt), admin, unthrottled, dict(roles or {}))


def verify(user: User, password: str) -> bool:
    return hmac.compare_digest(hash_password(password, user.salt), user.hash)


def digest(name: str, password: str) -> bytes:
    """Cache key for a verified credential (never stored on disk)."""
    return hashlib.sha256(name.encode() + b"\0" + password.encode()).digest()


def generate_password() -> str:
    return secrets.token_urlsafe(18)


def validate_user_name(name: Any) -> str:
    if not isinstance(name, str) or not USER_NAME_RE.fullmatch(name):
        raise errors.BadValue(
            "user name must be 1-128 characters of letters, digits, '_', '.', '@', '-'"
        )
    return name


def validate_password(password: Any) -> str:
    if not isinstance(password, str) or not password:
        raise errors.BadValue("password must be a non-empty string")
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise errors.BadValue(f"password longer than {MAX_PASSWORD_BYTES} bytes")
    return password


def validate_roles(roles: Any) -> dict[str, str]:
    if roles is None:
        return {}
    if not isinstance(roles, dict):
        raise errors.BadValue("roles must be a map of bucket name to 'read' or 'readwrite'")
    for bucket, role in roles.items():
        if role not in ROLES:
            raise errors.BadValue(
                f"role for bucket {bucket!r} must be 'read' or 'readwrite', got {role!r}"
            )
    return dict(roles)


# -- failed-login limiting ----------------------------------------------------------

#: Most source addresses the login limiter remembers; beyond it the one whose
#: last failure is oldest is forgotten (a scan from many addresses cannot grow memory).
MAX_TRACKED_SOURCES = 65_536
#: retryAfterMs hint when an address is at its limit only because of logins
#: still being verified (they may yet succeed).
VERIFYING_RETRY_SECS = 0.5


def login_source(peer_ip: str) -> str:
    """What failed logins are counted under: the IPv4 address, or the /64 of an IPv6
    one (a single host usually holds a whole /64, so per-address counting would let it
    rotate addresses). IPv4-mapped IPv6 counts as the IPv4 address."""
    try:
        addr = ipaddress.ip_address(peer_ip.split("%", 1)[0])
    except ValueError:
        return peer_ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(slots=True)
class _Source:
    #: times of recent failures, oldest first (at most ``limit`` kept)
    failures: deque[float] = field(default_factory=deque)
    #: distinct credentials of this source being verified right now
    verifying: int = 0
    #: a block was logged (cleared when the source drops under its limit)
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class LoginLimiterStatistics:
    tracked_sources: int
    blocked_sources: int
    failures: int
    refused: int

    def as_dict(self) -> dict[str, int]:
        return {
            "tracked_sources": self.tracked_sources,
            "blocked_sources": self.blocked_sources,
            "failures": self.failures,
            "refused": self.refused,
        }


class LoginLimiter:
    """Failed logins per source in a sliding window; no I/O, time from ``clock``.

    Use: :meth:`retry_after` before a login (0 = go ahead; else refuse it
    and call :meth:`refused`); :meth:`begin` / :meth:`end` around the slow
    verification (a credential being verified counts against the limit, so
    a burst of concurrent guesses cannot all reach scrypt); :meth:`failed`
    for every failed login. ``limit`` and ``window`` are passed per call
    because they are runtime parameters. Successful logins never count.
    """

    def __init__(
        self, clock: Callable[[], float], *, max_tracked: int = MAX_TRACKED_SOURCES
    ) -> None:
        self._clock = clock
        self._max_tracked = max_tracked
        self._sources: OrderedDict[str, _Source] = OrderedDict()
        self._failures_total = 0
        self._refused_total = 0

    def retry_after(self, source: str, limit: int, window: float) -> float:
        """Seconds until ``source`` may try to log in; 0.0 when it may now."""
        if limit <= 0:
            return 0.0
        s = self._sources.get(source)
        if s is None:
            return 0.0
        now = self._clock()
        _expire(s, now, window)
        if len(s.failures) + s.verifying < limit:
            s.blocked = False
            return 0.0
        if len(s.failures) >= limit:
            return max(s.failures[-limit] + window - now, 0.001)
        return VERIFYING_RETRY_SECS

    def refused(self) -> None:
        self._refused_total += 1

    def begin(self, source: str) -> None:
        """A credential of ``source`` goes to the slow verification."""
        s = self._sources.get(source)
        if s is None:
            s = self._sources[source] = _Source()
            self._bound()
        s.verifying += 1

    def end(self, source: str) -> None:
        """That verification finished (call :meth:`failed` too if it failed)."""
        s = self._sources.get(source)
        if s is None:
            return
        s.verifying = max(s.verifying - 1, 0)
        if not s.verifying and not s.failures:
            del self._sources[source]

    def failed(self, source: str, limit: int, window: float) -> bool:
        """Count a failed login; True when this failure put ``source`` at its limit
        (the caller logs that once)."""
        self._failures_total += 1
        now = self._clock()
        s = self._sources.get(source)
        if s is None:
            s = self._sources[source] = _Source()
        else:
            self._sources.move_to_end(source)
        s.failures.append(now)
        while len(s.failures) > max(limit, 1):
            s.failures.popleft()
        _expire(s, now, window)
        self._sweep(now, window)
        self._bound()
        if limit > 0 and len(s.failures) >= limit and not s.blocked:
            s.blocked = True
            return True
        return False

    def statistics(self, limit: int, window: float) -> LoginLimiterStatistics:
        now = self._clock()
        blocked = 0
        if limit > 0:
            for s in self._sources.values():
                _expire(s, now, window)
                blocked += len(s.failures) >= limit
        return LoginLimiterStatistics(
            len(self._sources), blocked, self._failures_total, self._refused_total
        )

    def _sweep(self, now: float, window: float) -> None:
        """Forget sources whose failures all left the window (oldest first; amortised O(1))."""
        while self._sources:
            source, s = next(iter(self._sources.items()))
            if s.verifying or (s.failures and s.failures[-1] > now - window):
                return
            del self._sources[source]

    def _bound(self) -> None:
        while len(self._sources) > self._max_tracked:
            self._sources.popitem(last=False)


def _expire(s: _Source, now: float, window: float) -> None:
    cutoff = now - window
    while s.failures and s.failures[0] <= cutoff:
        s.failures.popleft()
