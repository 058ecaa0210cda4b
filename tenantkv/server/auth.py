"""Users, password hashes, role checks and the login limiter.

Passwords are stored as salted scrypt hashes and compared in constant time.
scrypt is deliberately slow (~40 ms), so it runs on a worker thread, and a
successful verification is remembered per (user, password digest) until the
user changes — reconnect storms then cost a hash lookup, not a scrypt each.

:class:`LoginLimiter` (sans-IO, with an injected clock) decides each login:
a failure holds its answer for a growing delay and refuses its (user, address)
pair up front meanwhile, never anyone else; and it runs the node's small pool
of scrypt verifications with a bounded queue. See docs/security.md, "Logins".
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
from tenantkv.records import fields_dict

#: Matched with fullmatch: ``$`` alone would also accept a trailing newline. No
#: ``@``: RESP's ``AUTH user@bucket`` splits there (users made before the rule
#: keep their names and log in on the MessagePack door; see docs/security.md).
USER_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
ROLES = ("read", "readwrite")
#: The login name of a cluster node talking to another (tenantkv.cluster.peer):
#: its password is the cluster's secret, not a stored hash. The ``@`` keeps it out
#: of :data:`USER_NAME_RE`, so no admin can create a user of this name.
NODE_USER = "@node"
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
    #: a cluster node (:data:`NODE_USER`): it alone may run cluster-internal
    #: commands; it has no role on any bucket and is never a stored user
    node: bool = False

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


def node_user() -> User:
    """The user a cluster node logs in as with the cluster's secret: no admin, no
    role on any bucket, unthrottled (its internal commands are bounded by their
    own pages and are charged to no tenant)."""
    return User(NODE_USER, b"", b"", unthrottled=True, uid=NODE_USER, node=True)


def node_password(secret: bytes) -> str:
    """The password a node sends for :data:`NODE_USER`: the cluster secret in hex."""
    return secret.hex()


def node_secret_ok(secret: bytes | None, password: str) -> bool:
    """Does ``password`` carry the cluster secret? (Constant time; never with no
    secret: a node outside a cluster accepts no node login.)"""
    if not secret:
        return False
    return hmac.compare_digest(password.encode(), node_password(secret).encode())


def validate_user_name(name: Any) -> str:
    if name == NODE_USER:
        raise errors.BadValue(f"the user name {NODE_USER!r} is reserved for cluster nodes")
    if not isinstance(name, str) or not USER_NAME_RE.fullmatch(name):
        raise errors.BadValue(
            "user name must be 1-128 characters of letters, digits, '_', '.', '-' ('@' is "
            "not allowed: RESP's AUTH takes user@bucket)"
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


# -- login limiting -----------------------------------------------------------------

#: Most (user, address) pairs, addresses and known-good pairs the login limiter
#: remembers, each; beyond it the least recently used is forgotten (a scan from
#: many addresses, or guesses at many user names, cannot grow memory).
MAX_TRACKED_SOURCES = 65_536
#: How long a successful login makes its (user, address) pair known-good.
KNOWN_GOOD_SECS = 7 * 86400.0
#: A known-good pair's record is written again when it is older than this (so a
#: restart keeps pairs in use, without a write per login).
KNOWN_GOOD_REFRESH_SECS = 86400.0
#: retryAfterMs hint per login ahead of one refused because the hash pool is full
#: (about one scrypt on a busy core).
HASH_RETRY_SECS = 0.1
#: Hashes beyond login_hash_concurrency that only known-good pairs may run: the
#: admin (or any user) at its usual address never waits for strangers' hashes.
KNOWN_RESERVED_HASHES = 1


def login_source(peer_ip: str) -> str:
    """What logins are counted under: the IPv4 address, or the /64 of an IPv6 one
    (a single host usually holds a whole /64, so per-address counting would let it
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


@dataclass(frozen=True, slots=True)
class LoginSettings:
    """The runtime parameters the limiter decides with (docs/security.md, "Logins")."""

    #: failures counted per pair and per address (each doubles the delay); 0 = no
    #: delays and no refusals (the hash pool still applies)
    failure_limit: int = 10
    #: failures are forgotten after this long without another
    window_secs: float = 60.0
    #: the first failure's delay; each further one doubles it, up to ``delay_max_secs``
    delay_secs: float = 0.1
    delay_max_secs: float = 5.0
    #: scrypt verifications running at once, node-wide
    hash_concurrency: int = 1
    #: logins waiting for a verification, node-wide, per lane
    hash_queue: int = 32
    #: logins of one address not known-good, running or waiting
    hash_per_address: int = 2

    def delay(self, failures: int) -> float:
        """auth_delay, grown: the hold after the ``failures``-th recent failure."""
        if failures <= 0 or self.failure_limit <= 0:
            return 0.0
        return min(self.delay_secs * 2 ** (min(failures, 64) - 1), self.delay_max_secs)

    def to_wire(self) -> list[float]:
        return [
            self.failure_limit,
            self.window_secs,
            self.delay_secs,
            self.delay_max_secs,
            self.hash_concurrency,
            self.hash_queue,
            self.hash_per_address,
        ]

    @classmethod
    def from_wire(cls, w: list[Any]) -> LoginSettings:
        return cls(
            int(w[0]), float(w[1]), float(w[2]), float(w[3]), int(w[4]), int(w[5]), int(w[6])
        )


@dataclass(slots=True)
class _Failures:
    count: int
    last: float


@dataclass(slots=True)
class _Ticket:
    source: str
    pair: tuple[str, str] | None
    known: bool
    running: bool = False


@dataclass(frozen=True, slots=True)
class LoginStart:
    """:meth:`LoginLimiter.begin`'s answer. ``status``: ``"refused"`` (answer at
    once; ``retry_after`` seconds, ``reason`` ``"delay"``, ``"pair-busy"`` or ``"busy"``),
    ``"cached"`` (no verification needed), ``"run"`` (verify now, then
    :meth:`LoginLimiter.end` the ticket) or ``"queued"`` (wait until ``end`` or
    ``cancel`` grants the ticket, then verify)."""

    status: str
    ticket: int = 0
    retry_after: float = 0.0
    reason: str = ""
    #: in the known-good lane (its hash runs at normal CPU priority)
    known: bool = False


@dataclass(frozen=True, slots=True)
class LoginEnd:
    """:meth:`LoginLimiter.end`'s answer: ``hold`` seconds to wait before
    answering a failure (auth_delay); ``granted`` tickets may verify now;
    ``persist``: a success made or renewed a known-good pair worth writing down;
    ``limited``: this failure brought its address to ``failure_limit`` (log it once)."""

    hold: float = 0.0
    granted: tuple[int, ...] = ()
    persist: bool = False
    limited: bool = False


@dataclass(frozen=True, slots=True)
class LoginLimiterStatistics:
    tracked_sources: int
    tracked_pairs: int
    delayed_pairs: int
    known_good_pairs: int
    failures: int
    refused: int
    refused_busy: int
    hashes: int
    hashing: int
    queued: int

    def as_dict(self) -> dict[str, int]:
        return fields_dict(self)


class LoginLimiter:
    """Login delays per (user, address) and the node's scrypt pool; no I/O, time
    from ``clock``. The rule (docs/security.md, "Logins"):

    * A failed login is answered after a hold of ``delay(n)`` — ``delay_secs``
      doubled per recent failure of its pair or its address, up to
      ``delay_max_secs`` (PostgreSQL's ``auth_delay``, grown). Only failures are
      held: a neighbour at the same address with the right password is not.
    * A pair that is not known-good is refused up front (no scrypt) until its
      last failure's delay has passed, and while one of its logins is being
      verified. Nothing else is refused for failures: not other users at the
      address, not the user at other addresses.
    * A pair is *known-good* after a successful login (for
      :data:`KNOWN_GOOD_SECS`, and across restarts: the caller persists it) and
      until its next failure. Its logins are never refused for failures and go
      first to the hash pool.
    * The pool runs ``hash_concurrency`` verifications, and one more
      (:data:`KNOWN_RESERVED_HASHES`) for known-good pairs only; ``hash_queue``
      may wait in each lane (known-good first, then the others round-robin by
      address; one login per known pair in the first lane);
      an address that is not known-good has at most ``hash_per_address``
      running or waiting. Excess is refused at once (``"busy"``, retryable).
    """

    def __init__(
        self, clock: Callable[[], float], *, max_tracked: int = MAX_TRACKED_SOURCES
    ) -> None:
        self._clock = clock
        self._max = max_tracked
        self._pairs: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._sources: OrderedDict[str, _Failures] = OrderedDict()
        #: known-good pair -> (time of its last success, time it was last persisted)
        self._good: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()
        self._tickets: dict[int, _Ticket] = {}
        self._next_ticket = 1
        self._running = 0
        self._queue_known: deque[int] = deque()
        #: address -> its waiting tickets; served round-robin (first key first)
        self._queue_new: OrderedDict[str, deque[int]] = OrderedDict()
        self._queued_new = 0
        #: tickets (running or waiting) per address, not known-good only
        self._per_source: dict[str, int] = {}
        #: pairs not known-good with a ticket
        self._busy_pairs: dict[tuple[str, str], int] = {}
        #: known-good pairs with a ticket in the first lane
        self._known_busy: set[tuple[str, str]] = set()
        self._failures_total = self._refused = self._refused_busy = self._hashes = 0
        #: known-good pairs read at start, not yet on the clock (load_known_good)
        self._loaded: list[tuple[str, str, float]] = []

    # -- known-good pairs ------------------------------------------------------------

    def known_good(self, source: str, user: str | None) -> bool:
        if user is None:
            return False
        pair = (user, source)
        now = self._now()
        good = self._good.get(pair)
        if good is None or now - good[0] >= KNOWN_GOOD_SECS:
            return False
        failed = self._pairs.get(pair)
        return failed is None or failed.last < good[0]

    def load_known_good(self, pairs: list[tuple[str, str, float]]) -> None:
        """Known-good pairs from the system database: (user, source, age in seconds).
        Placed on the clock at its first reading (it may not run yet: Trio's)."""
        self._loaded.extend(pairs)

    def _now(self) -> float:
        now = self._clock()
        if self._loaded:
            loaded, self._loaded = self._loaded, []
            for user, source, age in sorted(loaded, key=lambda p: -p[2]):
                if 0 <= age < KNOWN_GOOD_SECS:
                    self._remember((user, source), now - age, now - age)
        return now

    def _remember(self, pair: tuple[str, str], at: float, persisted: float) -> None:
        self._good[pair] = (at, persisted)
        self._good.move_to_end(pair)
        while len(self._good) > self._max:
            self._good.popitem(last=False)

    # -- a login -----------------------------------------------------------------------

    def begin(
        self, source: str, user: str | None, s: LoginSettings, *, cached: bool = False
    ) -> LoginStart:
        """A login of ``user`` from ``source``; ``cached``: its credential is known
        to be right (no verification needed, if it is not refused)."""
        now = self._now()
        pair = None if user is None else (user, source)
        known = self.known_good(source, user)
        if known and pair in self._known_busy:
            # One login of a known pair goes first at a time (a client's concurrent
            # logins share one credential's verification anyway): the rest wait
            # with everyone else, so guesses at one's own known pair gain nothing.
            known = False
        if not known and pair is not None and s.failure_limit > 0:
            f = self._fresh(self._pairs, pair, now, s)
            if f is not None and now < f.last + s.delay(f.count):
                self._refused += 1
                return LoginStart(
                    "refused", retry_after=f.last + s.delay(f.count) - now, reason="delay"
                )
            if pair in self._busy_pairs:
                # Another of its logins is being verified: no parallel guessing of
                # one pair. Not a failure: retryable, and said as what it is.
                self._refused += 1
                return LoginStart("refused", retry_after=HASH_RETRY_SECS, reason="pair-busy")
        if cached:
            return LoginStart("cached")
        if known:
            waiting = len(self._queue_known)
        else:
            waiting = self._queued_new
            if self._per_source.get(source, 0) >= s.hash_per_address:
                return self._busy(waiting, s)
        if self._running >= s.hash_concurrency and waiting >= s.hash_queue:
            return self._busy(waiting, s)
        ticket = self._next_ticket
        self._next_ticket += 1
        t = self._tickets[ticket] = _Ticket(source, pair, known)
        if not known:
            self._per_source[source] = self._per_source.get(source, 0) + 1
            if pair is not None:
                self._busy_pairs[pair] = self._busy_pairs.get(pair, 0) + 1
        elif pair is not None:
            self._known_busy.add(pair)
        if (
            self._running < s.hash_concurrency + (KNOWN_RESERVED_HASHES if known else 0)
            and not self._queue_known
            and (known or not self._queued_new)
        ):
            t.running = True
            self._running += 1
            self._hashes += 1
            return LoginStart("run", ticket, known=known)
        if known:
            self._queue_known.append(ticket)
        else:
            self._queue_new.setdefault(source, deque()).append(ticket)
            self._queued_new += 1
        return LoginStart("queued", ticket, known=known)

    def _busy(self, waiting: int, s: LoginSettings) -> LoginStart:
        self._refused_busy += 1
        wait = HASH_RETRY_SECS * (1 + waiting // max(s.hash_concurrency, 1))
        return LoginStart("refused", retry_after=wait, reason="busy")

    def end(
        self, ticket: int | None, source: str, user: str | None, ok: bool, s: LoginSettings
    ) -> LoginEnd:
        """A login's outcome (``ticket`` 0 or None: it had none — cached, or failed
        before any verification). Frees its slot and grants the next ones."""
        granted = self._release(ticket, s) if ticket else ()
        if ok:
            assert user is not None
            return LoginEnd(granted=granted, persist=self._succeeded(source, user))
        hold, limited = self._failed(source, user, s)
        return LoginEnd(hold, granted, limited=limited)

    def cancel(self, ticket: int, s: LoginSettings) -> tuple[int, ...]:
        """A login left before its outcome (its connection closed): free its slot."""
        return self._release(ticket, s)

    def _release(self, ticket: int, s: LoginSettings) -> tuple[int, ...]:
        t = self._tickets.pop(ticket, None)
        if t is None:
            return ()
        if not t.known:
            _decrement(self._per_source, t.source)
            if t.pair is not None:
                _decrement(self._busy_pairs, t.pair)
        elif t.pair is not None:
            self._known_busy.discard(t.pair)
        if t.running:
            self._running -= 1
        elif t.known:
            self._queue_known.remove(ticket)
        else:
            q = self._queue_new[t.source]
            q.remove(ticket)
            self._queued_new -= 1
            if not q:
                del self._queue_new[t.source]
        granted = []
        while True:
            if self._queue_known and self._running < s.hash_concurrency + KNOWN_RESERVED_HASHES:
                nxt = self._queue_known.popleft()
            elif self._queue_new and self._running < s.hash_concurrency:
                src, q = next(iter(self._queue_new.items()))
                nxt = q.popleft()
                self._queued_new -= 1
                del self._queue_new[src]
                if q:  # round-robin: this address goes to the back
                    self._queue_new[src] = q
            else:
                break
            self._tickets[nxt].running = True
            self._running += 1
            self._hashes += 1
            granted.append(nxt)
        return tuple(granted)

    def _failed(self, source: str, user: str | None, s: LoginSettings) -> tuple[float, bool]:
        self._failures_total += 1
        if s.failure_limit <= 0:
            return 0.0, False
        now = self._now()
        before = self._fresh(self._sources, source, now, s)
        was = 0 if before is None else before.count
        n = self._count(self._sources, source, now, s)
        limited = n >= s.failure_limit > was
        if user is not None:
            n = max(n, self._count(self._pairs, (user, source), now, s))
        return s.delay(n), limited

    def _succeeded(self, source: str, user: str) -> bool:
        now = self._now()
        pair = (user, source)
        self._pairs.pop(pair, None)
        old = self._good.get(pair)
        persist = old is None or now - old[1] >= KNOWN_GOOD_REFRESH_SECS
        self._remember(pair, now, now if persist else old[1] if old else now)
        return persist

    def _count(
        self, table: OrderedDict[Any, _Failures], key: Any, now: float, s: LoginSettings
    ) -> int:
        f = self._fresh(table, key, now, s)
        if f is None:
            f = table[key] = _Failures(0, now)
        f.count = min(f.count + 1, s.failure_limit)
        f.last = now
        table.move_to_end(key)
        while len(table) > self._max:
            table.popitem(last=False)
        # Forget the stalest while they have aged out (amortised O(1)).
        while table:
            oldest = next(iter(table.values()))
            if now - oldest.last <= s.window_secs:
                break
            table.popitem(last=False)
        return f.count

    @staticmethod
    def _fresh(
        table: OrderedDict[Any, _Failures], key: Any, now: float, s: LoginSettings
    ) -> _Failures | None:
        f = table.get(key)
        if f is not None and now - f.last > s.window_secs:
            del table[key]
            return None
        return f

    def statistics(self, s: LoginSettings) -> LoginLimiterStatistics:
        now = self._now()
        delayed = sum(1 for f in self._pairs.values() if now < f.last + s.delay(f.count))
        return LoginLimiterStatistics(
            tracked_sources=len(self._sources),
            tracked_pairs=len(self._pairs),
            delayed_pairs=delayed,
            known_good_pairs=len(self._good),
            failures=self._failures_total,
            refused=self._refused,
            refused_busy=self._refused_busy,
            hashes=self._hashes,
            hashing=self._running,
            queued=len(self._queue_known) + self._queued_new,
        )


def _decrement(counts: dict[Any, int], key: Any) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
