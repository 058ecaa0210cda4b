"""Who may connect: the user registry, login (with its failure limiter) and grants.

The registry lives in memory and in LMDB system records (``user:<name>``);
every change is written (and durable) before memory changes, so the two never
disagree. ``epoch`` is bumped whenever a user or a bucket changes: sessions
re-check their user (deleted? roles?) before the next command runs, at the
cost of an int compare.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

import trio

from tenantkv import errors
from tenantkv.config import Config
from tenantkv.server import auth
from tenantkv.storage.engine import Engine
from tenantkv.storage.ops import PutSystemOp, WriteOp

log = logging.getLogger("tenantkv.server")

ADMIN_USER = "admin"
ADMIN_PASSWORD_ENV = "TENANTKV_ADMIN_PASSWORD"
ADMIN_PASSWORD_FILE = "admin-password"


def stored_users(engine: Engine) -> dict[str, auth.User]:
    """Every user as committed (``user:<name>`` system records)."""
    return {
        raw.decode(): auth.User.from_record(raw.decode(), rec)
        for raw, rec in engine.system_items(b"user:")
    }


class Connection(Protocol):
    """What the registry needs of a session: who it is, and a way to end it."""

    user: auth.User | None

    def begin_shutdown(self) -> None: ...


class Accounts:
    """Users, their credentials and the login-failure limiter of one node."""

    def __init__(
        self,
        users: dict[str, auth.User],
        *,
        config: Callable[[], Config],
        write: Callable[[WriteOp], Awaitable[Any]],
        sessions: Collection[Connection],
        data_dir: str,
    ) -> None:
        self.users = users
        #: bumped whenever a user or a bucket changes (see the module docstring)
        self.epoch = 0
        self._config = config
        self._write = write
        self._sessions = sessions
        self._data_dir = data_dir
        #: credential digests verified since the user last changed
        self._verified: dict[bytes, str] = {}
        #: credential digests being verified now -> (done, [succeeded: None until known])
        self._verifying: dict[bytes, tuple[trio.Event, list[bool | None]]] = {}
        #: failed logins per source address (docs/security.md)
        self.login_limiter = auth.LoginLimiter(time.monotonic)
        #: ``serve --workers N``: tells the other workers of each login outcome
        #: (``"failed"``/``"succeeded"``, source, user), so that the limiter's
        #: windows are the node's, whatever worker a guess lands on. A failure is
        #: relayed before it is answered: the next guess, on any worker, counts it.
        self.relay: Callable[[str, str, str | None], Awaitable[None]] | None = None
        #: successes relayed in the background (they only loosen the limiter)
        self.relay_soon: Callable[[str, str, str | None], None] | None = None

    async def authenticate(self, name: Any, password: Any, peer: str | None = None) -> auth.User:
        """The user these credentials name, or AuthenticationFailed.

        With ``peer`` (the client's address), failed logins are limited per
        source, per user and per (user, source) (:class:`auth.LoginLimiter`; the
        rule is in docs/security.md): a login over a limit gets
        TooManyLoginFailures at once, before any scrypt is spent, and so does one
        whose credentials being verified would reach it. Concurrent logins with
        the same credentials share one verification.
        """
        source = auth.login_source(peer) if peer is not None else None
        who = name if isinstance(name, str) else None
        while True:
            if source is not None:
                self._check_login_rate(source, who)
            if not isinstance(name, str) or not isinstance(password, str):
                await self._login_failed(source, who)
                raise errors.AuthenticationFailed("user and password must be strings")
            user = self.users.get(name)
            key = auth.digest(name, password)
            if user is not None and self._verified.get(key) == name:
                if source is not None:
                    self._succeeded(source, name)
                return user
            pending = self._verifying.get(key)
            if pending is None:
                break
            # The same credentials are being verified: wait for that outcome.
            done, box = pending
            await done.wait()
            if box[0] is False:
                await self._login_failed(source, who)
                raise errors.AuthenticationFailed("unknown user or wrong password")
            # True: the next round finds it verified; None: that check was cancelled.
        done, box = trio.Event(), [None]
        self._verifying[key] = (done, box)
        if source is not None:
            self.login_limiter.begin(source, name)
        try:
            ok = await self._verify(user, name, password)
            box[0] = ok
        finally:
            del self._verifying[key]
            done.set()
            if source is not None:
                self.login_limiter.end(source, name)
        if not ok:
            await self._login_failed(source, who)
            raise errors.AuthenticationFailed("unknown user or wrong password")
        assert user is not None
        if source is not None:
            self._succeeded(source, name)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[key] = name
        return user

    async def _verify(self, user: auth.User | None, name: str, password: str) -> bool:
        """The slow check (scrypt on a worker thread); the same cost for unknown users."""
        if user is None or len(password.encode()) > auth.MAX_PASSWORD_BYTES:
            # Same cost as a real check, so a probe cannot tell unknown users apart.
            await trio.to_thread.run_sync(auth.hash_password, password[:1024], b"0" * 16)
            return False
        ok = await trio.to_thread.run_sync(auth.verify, user, password)
        return ok and self.users.get(name) is user

    def _check_login_rate(self, source: str, name: str | None) -> None:
        cfg = self._config()
        wait = self.login_limiter.retry_after(
            source,
            cfg.login_failure_limit,
            cfg.login_failure_window_secs,
            name,
            cfg.login_failure_user_limit,
        )
        if wait > 0:
            self.login_limiter.refused()
            raise errors.TooManyLoginFailures(
                "too many failed logins from this address or for this user; try again in "
                f"{math.ceil(wait)} s",
                retry_after_ms=math.ceil(wait * 1000),
            )

    def _succeeded(self, source: str, name: str) -> None:
        self.login_limiter.succeeded(source, name)
        if self.relay_soon is not None:
            self.relay_soon("succeeded", source, name)

    def remote_login(self, outcome: str, source: str, name: str | None) -> None:
        """A login outcome on another worker (see ``relay``): counted in the windows,
        not in this worker's ``failures`` total (the node's is the sum)."""
        if outcome == "succeeded" and name is not None:
            self.login_limiter.succeeded(source, name)
        elif outcome == "failed":
            cfg = self._config()
            self.login_limiter.failed(
                source,
                cfg.login_failure_limit,
                cfg.login_failure_window_secs,
                name,
                cfg.login_failure_user_limit,
                count=False,
            )

    async def _login_failed(self, source: str | None, name: str | None) -> None:
        if source is None:
            return
        if self.relay is not None:
            await self.relay("failed", source, name)
        cfg = self._config()
        hit = self.login_limiter.failed(
            source,
            cfg.login_failure_limit,
            cfg.login_failure_window_secs,
            name,
            cfg.login_failure_user_limit,
        )

        if hit == "source":
            log.warning(
                "%d failed logins from %s within %gs (login_failure_limit): refusing its "
                "logins until they age out",
                cfg.login_failure_limit,
                source,
                cfg.login_failure_window_secs,
            )
        elif hit == "user":
            # An existing user's name only: an unknown "user name" is often a password
            # typed in the wrong field, and passwords are never logged.
            who = repr(name) if name in self.users else "an unknown user name"
            log.warning(
                "%d failed logins for %s within %gs from all addresses "
                "(login_failure_user_limit): refusing its logins from addresses where it "
                "has not logged in until they age out",
                cfg.login_failure_user_limit,
                who,
                cfg.login_failure_window_secs,
            )

    def login_statistics(self) -> dict[str, Any]:
        cfg = self._config()
        return {
            "login_failure_limit": cfg.login_failure_limit,
            "login_failure_user_limit": cfg.login_failure_user_limit,
            "login_failure_window_secs": cfg.login_failure_window_secs,
            **self.login_limiter.statistics(
                cfg.login_failure_limit,
                cfg.login_failure_window_secs,
                cfg.login_failure_user_limit,
            ).as_dict(),
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
        self.users = users
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
