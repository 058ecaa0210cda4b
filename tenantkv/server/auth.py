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
    #: this user's identity, made when it is created and kept through updates: a
    #: user deleted and created again under its name is another user, whose roles
    #: the old one's connections must not take (users made before it have "")
    uid: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "salt": self.salt,
            "hash": self.hash,
            "n": SCRYPT_N,
            "admin": self.admin,
            "unthrottled": self.unthrottled,
            "roles": self.roles,
            "uid": self.uid,
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
            str(rec.get("uid") or ""),
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
    return User(
        name,
        salt,
        hash_password(password, salt),
        admin,
        unthrottled,
        dict(roles or {}),
        os.urandom(8).hex(),
    )


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

#: Most sources, users and (user, source) pairs the login limiter remembers, each;
#: beyond it the one whose last failure is oldest is forgotten (a scan from many
#: addresses, or guesses at many user names, cannot grow memory).
MAX_TRACKED_SOURCES = 65_536
#: retryAfterMs hint when a key is at its limit only because of logins still
#: being verified (they may yet succeed).
VERIFYING_RETRY_SECS = 0.5
#: How long a successful login makes its (user, source) pair known-good: logins of
#: that user from that source pass the source's and the user's limits (not the
#: pair's own), so an attacker failing for a user cannot lock it out from an
#: address it uses.
KNOWN_GOOD_SECS = 7 * 86400.0


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
class _Window:
    #: times of recent failures, oldest first (at most the limit kept)
    failures: deque[float] = field(default_factory=deque)
    #: logins of this key being verified right now
    verifying: int = 0
    #: a block was logged (cleared when the key drops under its limit)
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class LoginLimiterStatistics:
    tracked_sources: int
    blocked_sources: int
    tracked_users: int
    blocked_users: int
    known_good_pairs: int
    failures: int
    refused: int

    def as_dict(self) -> dict[str, int]:
        return {
            "tracked_sources": self.tracked_sources,
            "blocked_sources": self.blocked_sources,
            "tracked_users": self.tracked_users,
            "blocked_users": self.blocked_users,
            "known_good_pairs": self.known_good_pairs,
            "failures": self.failures,
            "refused": self.refused,
        }


class _Windows:
    """Sliding windows of failures per key, LRU-bounded."""

    def __init__(self, max_tracked: int) -> None:
        self.max = max_tracked
        self.items: OrderedDict[Any, _Window] = OrderedDict()

    def wait(self, key: Any, limit: int, window: float, now: float) -> float:
        """Seconds until ``key`` is under ``limit`` again; 0.0 when it is now."""
        w = self.items.get(key)
        if w is None or limit <= 0:
            return 0.0
        _expire(w, now, window)
        if len(w.failures) + w.verifying < limit:
            w.blocked = False
            return 0.0
        if len(w.failures) >= limit:
            return max(w.failures[-limit] + window - now, 0.001)
        return VERIFYING_RETRY_SECS

    def get(self, key: Any) -> _Window:
        w = self.items.get(key)
        if w is None:
            w = self.items[key] = _Window()
            while len(self.items) > self.max:
                self.items.popitem(last=False)
        return w

    def failed(self, key: Any, limit: int, window: float, now: float) -> bool:
        """Count a failure; True when it put ``key`` at its limit (log that once)."""
        w = self.get(key)
        self.items.move_to_end(key)
        w.failures.append(now)
        while len(w.failures) > max(limit, 1):
            w.failures.popleft()
        _expire(w, now, window)
        self.sweep(now, window)
        if limit > 0 and len(w.failures) >= limit and not w.blocked:
            w.blocked = True
            return True
        return False

    def end(self, key: Any) -> None:
        w = self.items.get(key)
        if w is None:
            return
        w.verifying = max(w.verifying - 1, 0)
        if not w.verifying and not w.failures:
            del self.items[key]

    def sweep(self, now: float, window: float) -> None:
        """Forget keys whose failures all left the window (oldest first; amortised O(1))."""
        while self.items:
            key, w = next(iter(self.items.items()))
            if w.verifying or (w.failures and w.failures[-1] > now - window):
                return
            del self.items[key]

    def blocked(self, limit: int, window: float, now: float) -> int:
        if limit <= 0:
            return 0
        n = 0
        for w in self.items.values():
            _expire(w, now, window)
            n += len(w.failures) >= limit
        return n


class LoginLimiter:
    """Failed logins per source, per user and per (user, source), in sliding
    windows; no I/O, time from ``clock``.

    The rule (docs/security.md): a login for ``user`` from ``source`` is refused,
    before any scrypt is spent, when the pair has ``limit`` failures in the window;
    else it passes if the pair is *known-good* (a successful login within
    :data:`KNOWN_GOOD_SECS`); else it is refused when the source has ``limit``
    failures (one address guessing at anything) or the user has ``user_limit``
    failures from all sources together (many addresses guessing at one user).
    So guessing from rotating addresses is bounded per user, and an attacker
    failing for a user does not lock that user out of the addresses it uses.

    Use: :meth:`retry_after` before a login (0 = go ahead; else refuse it and call
    :meth:`refused`); :meth:`begin` / :meth:`end` around the slow verification (a
    credential being verified counts, so a burst of concurrent guesses cannot all
    reach scrypt); :meth:`failed` for every failed login, :meth:`succeeded` for a
    successful one. Limits are passed per call: they are runtime parameters.
    ``user`` None (not a string) is counted per source only.
    """

    def __init__(
        self, clock: Callable[[], float], *, max_tracked: int = MAX_TRACKED_SOURCES
    ) -> None:
        self._clock = clock
        self._max_tracked = max_tracked
        self._sources = _Windows(max_tracked)
        self._users = _Windows(max_tracked)
        self._pairs = _Windows(max_tracked)
        #: (user, source) -> time of its last successful login
        self._good: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._failures_total = 0
        self._refused_total = 0

    def retry_after(
        self,
        source: str,
        limit: int,
        window: float,
        user: str | None = None,
        user_limit: int = 0,
    ) -> float:
        """Seconds until ``user`` may try to log in from ``source``; 0.0 when it may now."""
        now = self._clock()
        if user is not None:
            pair = (user, source)
            wait = self._pairs.wait(pair, limit, window, now)
            if wait:
                return wait
            since = self._good.get(pair)
            if since is not None and now - since < KNOWN_GOOD_SECS:
                return 0.0
        wait = self._sources.wait(source, limit, window, now)
        if wait or user is None:
            return wait
        return self._users.wait(user, user_limit, window, now)

    def refused(self) -> None:
        self._refused_total += 1

    def begin(self, source: str, user: str | None = None) -> None:
        """A credential of ``source`` (for ``user``) goes to the slow verification."""
        self._sources.get(source).verifying += 1
        if user is not None:
            self._users.get(user).verifying += 1
            self._pairs.get((user, source)).verifying += 1

    def end(self, source: str, user: str | None = None) -> None:
        """That verification finished (call :meth:`failed` too if it failed)."""
        self._sources.end(source)
        if user is not None:
            self._users.end(user)
            self._pairs.end((user, source))

    def failed(
        self,
        source: str,
        limit: int,
        window: float,
        user: str | None = None,
        user_limit: int = 0,
        *,
        count: bool = True,
    ) -> str | None:
        """Count a failed login. Returns what this failure put at its limit —
        ``"source"`` or ``"user"`` — once, for the caller to log; else None.
        ``count=False``: a failure seen by another worker process (it counts it)."""
        if count:
            self._failures_total += 1
        now = self._clock()
        hit = "source" if self._sources.failed(source, limit, window, now) else None
        if user is not None:
            self._pairs.failed((user, source), limit, window, now)
            if self._users.failed(user, user_limit, window, now) and hit is None:
                hit = "user"
        return hit

    def succeeded(self, source: str, user: str) -> None:
        """A successful login: the pair becomes known-good."""
        pair = (user, source)
        self._good[pair] = self._clock()
        self._good.move_to_end(pair)
        while len(self._good) > self._max_tracked:
            self._good.popitem(last=False)

    def statistics(self, limit: int, window: float, user_limit: int = 0) -> LoginLimiterStatistics:
        now = self._clock()
        return LoginLimiterStatistics(
            tracked_sources=len(self._sources.items),
            blocked_sources=self._sources.blocked(limit, window, now),
            tracked_users=len(self._users.items),
            blocked_users=self._users.blocked(user_limit, window, now),
            known_good_pairs=len(self._good),
            failures=self._failures_total,
            refused=self._refused_total,
        )


def _expire(w: _Window, now: float, window: float) -> None:
    cutoff = now - window
    while w.failures and w.failures[0] <= cutoff:
        w.failures.popleft()
