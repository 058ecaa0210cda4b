"""Who may connect: the user registry, login (with its limiter) and grants.

The registry lives in memory and in LMDB system records (``user:<name>``);
every change is written (and durable) before memory changes, so the two never
disagree. ``epoch`` is bumped whenever a user or a bucket changes: sessions
re-check their user (deleted? roles?) before the next command runs, at the
cost of an int compare.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, Protocol, TypeVar

import trio

from tenantkv import errors
from tenantkv.config import Config
from tenantkv.server import auth
from tenantkv.storage.engine import Engine
from tenantkv.storage.ops import PutSystemOp, WriteOp

log = logging.getLogger("tenantkv.server")
T = TypeVar("T")

ADMIN_USER = "admin"
ADMIN_PASSWORD_ENV = "TENANTKV_ADMIN_PASSWORD"
ADMIN_PASSWORD_FILE = "admin-password"


#: System records of known-good login pairs: ``login:<user>\0<address>`` -> {"at": wall time}
KNOWN_GOOD_PREFIX = b"login:"


def known_good_key(user: str, source: str) -> bytes:
    return KNOWN_GOOD_PREFIX + user.encode() + b"\0" + source.encode()


def stored_known_good(engine: Engine) -> list[tuple[str, str, float]]:
    """Known-good (user, address) pairs as committed, with their ages in seconds."""
    now = time.time()
    out = []
    for raw, rec in engine.system_items(KNOWN_GOOD_PREFIX):
        user, _, source = raw.decode(errors="replace").partition("\0")
        at = rec.get("at") if isinstance(rec, dict) else None
        if source and isinstance(at, (int, float)):
            out.append((user, source, max(now - float(at), 0.0)))
    return out


#: Niceness of the threads that hash logins of pairs not known-good: scrypt is
#: the one CPU-bound job a client can start before it is known, so a stranger's
#: yields the CPU to the event loop and to known users' logins.
HASH_NICENESS = 10
#: [known-good pairs' hashing threads, the others'], made on first use
_hash_threads: list[concurrent.futures.ThreadPoolExecutor] = []


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_NICENESS)


async def run_hash(fn: Callable[..., T], *args: Any, known: bool) -> T:
    """``fn(*args)`` on a password-hashing thread: few and long-lived (the login
    limiter bounds how many hash at once), at lower CPU priority unless
    ``known``. Not cancellable midway, as ``trio.to_thread.run_sync``: a slot is
    freed only when its hash is."""
    if not _hash_threads:
        _hash_threads.append(concurrent.futures.ThreadPoolExecutor(64, "tenantkv-hash"))
        _hash_threads.append(
            concurrent.futures.ThreadPoolExecutor(64, "tenantkv-hash-low", _lower_priority)
        )
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = _hash_threads[0 if known else 1].submit(fn, *args)
    future.add_done_callback(lambda _: _set_soon(token, done))
    with trio.CancelScope(shield=True):
        await done.wait()
    return future.result()


def _set_soon(token: trio.lowlevel.TrioToken, done: trio.Event) -> None:
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(done.set)


class LoginGate(Protocol):
    """The login limiter as a login sees it: in this process, or the node's in
    the supervisor of ``serve --workers N`` (the supervisor decides; workers ask)."""

    async def begin(
        self, source: str, user: str | None, s: auth.LoginSettings, *, cached: bool
    ) -> auth.LoginStart: ...

    async def end(
        self, ticket: int, source: str, user: str | None, ok: bool, s: auth.LoginSettings
    ) -> auth.LoginEnd: ...

    def cancel(self, ticket: int) -> None: ...

    def statistics(self, s: auth.LoginSettings) -> auth.LoginLimiterStatistics: ...


class LocalLoginGate:
    """Drives an :class:`auth.LoginLimiter` from Trio: a queued login waits for
    its grant; the limiter's decisions are synchronous."""

    def __init__(self, limiter: auth.LoginLimiter) -> None:
        self.limiter = limiter
        self._grants: dict[int, trio.Event] = {}
        #: the settings of the last call (a cancel needs them to grant the next)
        self._settings = auth.LoginSettings()

    async def begin(
        self, source: str, user: str | None, s: auth.LoginSettings, *, cached: bool
    ) -> auth.LoginStart:
        self._settings = s
        start = self.limiter.begin(source, user, s, cached=cached)
        if start.status != "queued":
            return start
        granted = self._grants[start.ticket] = trio.Event()
        try:
            await granted.wait()
        except BaseException:
            self.cancel(start.ticket)
            raise
        finally:
            self._grants.pop(start.ticket, None)
        return auth.LoginStart("run", start.ticket, known=start.known)

    async def end(
        self, ticket: int, source: str, user: str | None, ok: bool, s: auth.LoginSettings
    ) -> auth.LoginEnd:
        self._settings = s
        end = self.limiter.end(ticket, source, user, ok, s)
        self.wake(end.granted)
        return end

    def cancel(self, ticket: int) -> None:
        self.wake(self.limiter.cancel(ticket, self._settings))

    def wake(self, granted: tuple[int, ...]) -> None:
        for t in granted:
            ev = self._grants.get(t)
            if ev is not None:
                ev.set()
            else:  # its waiter is gone: pass the slot on
                self.cancel(t)

    def statistics(self, s: auth.LoginSettings) -> auth.LoginLimiterStatistics:
        return self.limiter.statistics(s)


def stored_users(engine: Engine) -> dict[str, auth.User]:
    """Every user as committed (``user:<name>`` system records)."""
    return {
        raw.decode(): auth.User.from_record(raw.decode(), rec)
        for raw, rec in engine.system_items(b"user:")
    }


class Connection(Protocol):
    """What the registry needs of a session: who it is, and a way to end it."""

    @property
    def user(self) -> auth.User | None: ...

    def begin_shutdown(self) -> None: ...


class Accounts:
    """Users, their credentials and the login limiter of one node."""

    def __init__(
        self,
        users: dict[str, auth.User],
        *,
        config: Callable[[], Config],
        write: Callable[[WriteOp], Awaitable[Any]],
        sessions: Collection[Connection],
        data_dir: str,
        known_good: Iterable[tuple[str, str, float]] = (),
        submit: Callable[[WriteOp], None] | None = None,
    ) -> None:
        self.users = users
        #: bumped whenever a user or a bucket changes (see the module docstring)
        self.epoch = 0
        self._config = config
        self._write = write
        #: hands a write to the writer without waiting (known-good pairs)
        self._submit = submit
        self._sessions = sessions
        self._data_dir = data_dir
        #: credential digests verified since the user last changed
        self._verified: dict[bytes, str] = {}
        #: credential digests being verified now -> (done, [succeeded: None until known])
        self._verifying: dict[bytes, tuple[trio.Event, list[bool | None]]] = {}
        #: the login limiter (docs/security.md, "Logins"): this node's own, or with
        #: ``serve --workers N`` the supervisor's, asked over the control channel
        limiter = auth.LoginLimiter(trio.current_time)
        limiter.load_known_good(list(known_good))
        self.gate: LoginGate = LocalLoginGate(limiter)
        #: whether this process writes known-good pairs (the supervisor does it
        #: for workers)
        self.persist_known_good = True
        #: the cluster's secret (tenantkv.cluster.peer) once this node is in a
        #: cluster: the password of the node login (auth.NODE_USER); None, no node
        #: login is accepted
        self.node_secret: bytes | None = None

    async def authenticate(self, name: Any, password: Any, peer: str | None = None) -> auth.User:
        """The user these credentials name, or AuthenticationFailed.

        With ``peer`` (the client's address) the login goes through the login
        limiter (:class:`auth.LoginLimiter`; the rule is in docs/security.md,
        "Logins"): it may be refused at once with TooManyLoginFailures (its
        (user, address) pair is in its delay, or the hash pool is full), it waits
        its turn for scrypt, and a failure is answered only after its delay.
        Concurrent logins with the same credentials share one verification.
        """
        source = auth.login_source(peer) if peer is not None else None
        # Counted under at most 129 characters (a real name has at most 128): a
        # client cannot make the limiter hold 4 KiB names by the 65,536.
        who = name[:129] if isinstance(name, str) else None
        if not isinstance(name, str) or not isinstance(password, str):
            await self._finish(source, who, 0, ok=False)
            raise errors.AuthenticationFailed("user and password must be strings")
        key = auth.digest(name, password)
        while True:
            user = self.users.get(name)
            cached = user is not None and self._verified.get(key) == name
            pending = None if cached else self._verifying.get(key)
            if pending is None:
                break
            # The same credentials are being verified: wait for that outcome.
            done, box = pending
            await done.wait()
            if box[0] is False:
                await self._finish(source, who, 0, ok=False)
                raise errors.AuthenticationFailed("unknown user or wrong password")
            # True: the next round finds it verified; None: that check was cancelled.
        assert who is not None
        if name == auth.NODE_USER:
            return await self._authenticate_node(source, password)
        done, box = trio.Event(), [None]
        if not cached:
            # Claimed before anything awaits: a concurrent login with the same
            # credentials (a client's pool opening) waits for this verification
            # instead of asking the limiter too, which refuses a second login of
            # a pair while one is verified. (Claimed after the limiter's answer,
            # two logins could both pass the check above, and the second's claim
            # was then deleted under the first: KeyError.)
            self._verifying[key] = (done, box)
        try:
            ticket, known = await self._begin(source, who, cached=cached)
        except BaseException:
            if not cached:
                del self._verifying[key]
                done.set()  # (box None: the waiters ask for themselves)
            raise
        if cached:
            assert user is not None
            await self._finish(source, who, 0, ok=True)
            return user
        ok = False
        try:
            ok = await self._verify(user, name, password, known=known or source is None)
            box[0] = ok
        finally:
            del self._verifying[key]
            done.set()
            if box[0] is None and source is not None and ticket:
                self.gate.cancel(ticket)  # cancelled: free its slot, count nothing
        if not ok:
            await self._finish(source, who, ticket, ok=False)
            raise errors.AuthenticationFailed("unknown user or wrong password")
        assert user is not None
        await self._finish(source, who, ticket, ok=True)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[key] = name
        return user

    async def _authenticate_node(self, source: str | None, password: str) -> auth.User:
        """A cluster node's login: the cluster secret, compared in constant time (no
        scrypt: it is 32 random bytes). Failures count in the limiter as any
        login's do."""
        ticket, _ = await self._begin(source, auth.NODE_USER, cached=True)
        ok = auth.node_secret_ok(self.node_secret, password)
        await self._finish(source, auth.NODE_USER, ticket, ok=ok)
        if not ok:
            raise errors.AuthenticationFailed("unknown user or wrong password")
        return auth.node_user()

    def login_settings(self) -> auth.LoginSettings:
        cfg = self._config()
        return auth.LoginSettings(
            failure_limit=cfg.login_failure_limit,
            window_secs=cfg.login_failure_window_secs,
            delay_secs=cfg.login_delay_ms / 1000,
            delay_max_secs=cfg.login_delay_max_ms / 1000,
            hash_concurrency=cfg.login_hash_concurrency,
            hash_queue=cfg.login_hash_queue,
            hash_per_address=cfg.login_hash_per_address,
        )

    async def _begin(self, source: str | None, name: str, *, cached: bool) -> tuple[int, bool]:
        """The limiter's go-ahead (waiting for a hash slot if queued): its ticket
        (0 for none) and whether it is a known-good pair's; or TooManyLoginFailures,
        at once."""
        if source is None:
            return 0, False
        start = await self.gate.begin(source, name, self.login_settings(), cached=cached)
        if start.status != "refused":
            return start.ticket, start.known
        ms = max(math.ceil(start.retry_after * 1000), 1)
        if start.reason == "busy":
            raise errors.TooManyLoginFailures(
                f"too many logins being verified on this node; try again in {ms} ms",
                labels=(errors.SYSTEM_OVERLOADED, errors.RETRYABLE),
                retry_after_ms=ms,
            )
        if start.reason == "pair-busy":
            raise errors.TooManyLoginFailures(
                f"another login for this user from this address is being verified; try "
                f"again in {ms} ms",
                labels=(errors.SYSTEM_OVERLOADED, errors.RETRYABLE),
                retry_after_ms=ms,
            )
        # Not labelled retryable: the client's overload policy must not replay a
        # password that just failed; the hint says when this pair may try again.
        raise errors.TooManyLoginFailures(
            f"a login for this user from this address failed recently; try again in {ms} ms",
            retry_after_ms=ms,
        )

    async def _finish(self, source: str | None, name: str | None, ticket: int, *, ok: bool) -> None:
        """Tell the limiter the outcome; a failure's answer waits its delay."""
        if source is None:
            return
        end = await self.gate.end(ticket, source, name, ok, self.login_settings())
        if end.persist and name is not None and self.persist_known_good:
            self._persist_known_good(name, source)
        if end.limited:
            log.warning(
                "%d failed logins from %s within %gs (login_failure_limit): the answers to "
                "its failed logins are held %g ms (login_delay_max_ms or less)",
                self._config().login_failure_limit,
                source,
                self._config().login_failure_window_secs,
                end.hold * 1000,
            )
        if end.hold > 0:
            await trio.sleep(end.hold)

    def _persist_known_good(self, name: str, source: str) -> None:
        """A known-good pair survives a restart: a system record, written when the
        pair is new or its record a day old (auth.KNOWN_GOOD_REFRESH_SECS). Handed
        to the writer without waiting: the login does not wait for a commit, and
        nothing waits on it at shutdown (a pair not written is only forgotten)."""
        if self._submit is not None:
            self._submit(
                PutSystemOp(known_good_key(name, source), {"at": time.time()}, what="login")
            )

    async def _verify(
        self, user: auth.User | None, name: str, password: str, *, known: bool
    ) -> bool:
        """The slow check (scrypt on a hashing thread); the same cost for unknown
        users. ``known``: a known-good pair's, hashed at normal CPU priority."""
        if user is None or len(password.encode()) > auth.MAX_PASSWORD_BYTES:
            # Same cost as a real check, so a probe cannot tell unknown users apart.
            await run_hash(auth.hash_password, password[:1024], b"0" * 16, known=known)
            return False
        ok = await run_hash(auth.verify, user, password, known=known)
        return ok and self.users.get(name) is user

    def login_statistics(self) -> dict[str, Any]:
        s = self.login_settings()
        cfg = self._config()
        return {
            "login_failure_limit": cfg.login_failure_limit,
            "login_failure_window_secs": cfg.login_failure_window_secs,
            "login_delay_ms": cfg.login_delay_ms,
            "login_delay_max_ms": cfg.login_delay_max_ms,
            "login_hash_concurrency": cfg.login_hash_concurrency,
            "login_hash_queue": cfg.login_hash_queue,
            "login_hash_per_address": cfg.login_hash_per_address,
            **self.gate.statistics(s).as_dict(),
        }

    async def save_user(self, user: auth.User, *, expect: str | None) -> None:
        await self._write(
            PutSystemOp(
                b"user:" + user.name.encode(),
                user.to_record(),
                expect=expect,  # type: ignore[arg-type]
                on_present=errors.UserExists,
                on_absent=errors.UserNotFound,
                what=f"user {user.name!r}",
            )
        )
        self.users[user.name] = user
        self._forget(user.name)
        self.epoch += 1

    async def drop_user(self, name: str) -> None:
        await self._write(
            PutSystemOp(
                b"user:" + name.encode(),
                None,
                expect="present",
                on_absent=errors.UserNotFound,
                what=f"user {name!r}",
            )
        )
        self.users.pop(name, None)
        self._forget(name)
        self.epoch += 1
        for s in list(self._sessions):
            if s.user is not None and s.user.name == name:
                s.begin_shutdown()  # a deleted user's connections close

    def reload(self, users: dict[str, auth.User]) -> None:
        """Another worker changed users (``serve --workers N``): take the committed
        registry. Sessions re-check their user at the next command (the epoch),
        and a deleted user's connections close, as with a local change — also
        when it was created again meanwhile (another user: a new ``uid``)."""
        gone = {n for n, u in self.users.items() if n not in users or users[n].uid != u.uid}
        changed = {n for n, u in users.items() if self.users.get(n) != u}
        # An unchanged user keeps its object: a login being verified checks
        # that its user is still the one it verified against (identity), and a
        # reload for another change (a bucket, a parameter) must not fail it.
        self.users = {n: u if n in changed else self.users[n] for n, u in users.items()}
        for name in gone | changed:
            self._forget(name)
        if gone or changed:
            self.epoch += 1
        for s in list(self._sessions):
            if s.user is not None and s.user.name in gone:
                s.begin_shutdown()

    def _forget(self, name: str) -> None:
        self._verified = {k: v for k, v in self._verified.items() if v != name}

    async def bootstrap_admin(self) -> None:
        """First start: create ``admin`` (password from the environment or generated)."""
        if self.users:
            if os.environ.get(ADMIN_PASSWORD_ENV):
                log.warning(
                    "%s is set but ignored: the data directory already has users (it only "
                    "sets the admin password on the first start; change a password with "
                    "tenantkv-admin user-update)",
                    ADMIN_PASSWORD_ENV,
                )
            return
        password = os.environ.get(ADMIN_PASSWORD_ENV)
        if password:
            log.info(
                "bootstrapping user %r with the password from %s", ADMIN_USER, ADMIN_PASSWORD_ENV
            )
        else:
            password = auth.generate_password()
            path = os.path.join(self._data_dir, ADMIN_PASSWORD_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            os.chmod(path, 0o600)
            log.info("bootstrapping user %r; its generated password is in %s", ADMIN_USER, path)
        user = await trio.to_thread.run_sync(
            lambda: auth.new_user(ADMIN_USER, password, admin=True)
        )
        await self.save_user(user, expect="absent")

    def without_bucket(self, bucket: str) -> dict[str, auth.User]:
        """The users holding a role on ``bucket``, as they are with it revoked."""
        return {
            u.name: dataclasses.replace(u, roles={b: r for b, r in u.roles.items() if b != bucket})
            for u in self.users.values()
            if bucket in u.roles
        }

    def revoked(self, users: dict[str, auth.User]) -> None:
        """The revocations of :meth:`without_bucket` are durable: apply them."""
        self.users.update(users)
        self.epoch += 1

    async def drop_dangling_roles(self, buckets: Collection[str]) -> None:
        """At start: remove roles on buckets that no longer exist (left by a version
        that kept them on bucket deletion), so a re-created bucket cannot revive them."""
        for user in list(self.users.values()):
            dangling = [b for b in user.roles if b not in buckets]
            if not dangling:
                continue
            fixed = dataclasses.replace(
                user, roles={b: r for b, r in user.roles.items() if b not in dangling}
            )
            log.warning(
                "user %r had roles on deleted buckets %s; removing them", user.name, dangling
            )
            await self.save_user(fixed, expect="present")
