"""Logins on the real daemon: a guesser slows itself, never its neighbours
(docs/security.md, "Logins"). One daemon per test: each sets its own limits."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tenantkv
from tenantkv import errors
from tenantkv.server import auth
from tenantkv.storage.engine import Engine
from tests.conftest import ADMIN_PASSWORD, Daemon, read_response, wait_until

TIMEOUT = 20
HOLD_MS = 5000


def start(tmp_path: Path, config: str = "", *args: str) -> Daemon:
    cfg = tmp_path / "t.toml"
    cfg.write_text(config)
    return Daemon(tmp_path / "data", extra_args=["--config", str(cfg), *args]).start()


@pytest.fixture
def d(tmp_path: Path) -> Iterator[Daemon]:
    # A failed login's answer is held, and its pair refused, for 5 s: far longer than
    # a loaded machine takes between seeing the failure counted and asking again.
    daemon = start(tmp_path, f"login_delay_ms = {HOLD_MS}\nlogin_delay_max_ms = {2 * HOLD_MS}\n")
    with daemon.client() as admin:
        admin.create_bucket("b")
        for name in ("alice", "bob"):
            admin.create_user(name, "pw-" + name, roles={"b": "readwrite"})
    yield daemon
    daemon.kill()


def hello(user: str, password: str, **extra: Any) -> bytes:
    return msgpack.packb([0, 0, "hello", {"user": user, "password": password, **extra}])


def resp(d: Daemon, *commands: list[str], source: str = "127.0.0.1") -> list[bytes]:
    """Send RESP commands pipelined on one new connection; each reply's first line."""
    with socket.create_connection((d.host, d.resp_port), TIMEOUT, (source, 0)) as s:
        s.sendall(
            b"".join(
                f"*{len(c)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in c)
                for c in commands
            )
        )
        buf = b""
        while buf.count(b"\r\n") < len(commands):
            data = s.recv(65536)
            if not data:
                break
            buf += data
    return buf.split(b"\r\n")[: len(commands)]


def failures(d: Daemon) -> int:
    """The node's failed logins so far (counted before a failure's answer is held)."""
    with d.client() as admin:
        return int(admin.server_status()["authentication"]["failures"])


def test_a_redis_client_with_a_wrong_password_locks_no_neighbour_out(d: Daemon) -> None:
    """Row 7: redis-py retries a failed AUTH; today that refused every user new at
    the address for 60 s. Now only the guesser waits, and a limited AUTH says how
    long, in words a Redis client reads as a failed AUTH. The guesser sends one AUTH
    (each retry would be one more failure of the same pair, as the unit tests of the
    limiter count them) and is held while its neighbours log in."""
    # No retries: redis-py's default (10, with backoff) retries a failed AUTH — its
    # AuthenticationError is a ConnectionError — so the guesser sent 11 AUTHs, each
    # hashed and held, and on a loaded machine did not finish within the join. Its
    # socket timeout is far above the hold, and the join above the socket timeout: the
    # thread always ends, with the held answer or a TimeoutError that says why.
    wrong = redis.Redis(
        d.host,
        d.resp_port,
        username="alice",
        password="wrong",
        socket_timeout=HOLD_MS / 1000 + 4 * TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    outcome: list[BaseException] = []

    def guess() -> None:
        try:
            wrong.ping()
        except redis.RedisError as exc:
            outcome.append(exc)

    guesser = threading.Thread(target=guess, daemon=True)
    guesser.start()
    try:
        # its first AUTH is being held: failed (counted), its answer not yet sent
        wait_until(lambda: failures(d) >= 1, TIMEOUT, what="the guess counted")
        # The same pair meanwhile: refused up front, WRONGPASS with the hint.
        [line] = resp(d, ["AUTH", "alice", "another-guess"])
        assert line.startswith(b"-WRONGPASS retryAfterMs="), line
        ms = int(line.split(b"=")[1].split()[0])
        assert 0 < ms <= HOLD_MS
        # bob never logged in from this address: in, on both doors (not refused:
        # a successful login is never held, so no clock is asked).
        assert resp(d, ["AUTH", "bob", "pw-bob"], ["PING"]) == [b"+OK", b"+PONG"]
        with d.client(user="bob", password="pw-bob", bucket="b") as c:
            assert c.ping() == "pong"
        # alice herself, from another address: in at once too.
        assert resp(d, ["AUTH", "alice", "pw-alice"], source="127.0.0.7") == [b"+OK"]
    finally:
        guesser.join(HOLD_MS / 1000 + 5 * TIMEOUT)
        wrong.close()
    assert not guesser.is_alive()
    assert outcome and isinstance(outcome[0], redis.AuthenticationError), outcome
    with d.client() as admin:
        st = admin.server_status()["authentication"]
    # Exactly: the guesser's one AUTH failed (and alone was held), the other guess
    # was refused without a hash, every other login succeeded.
    assert st["failures"] == 1 and st["refused"] == 1, st


def test_the_admin_gets_in_past_its_address_full_of_idle_users(tmp_path: Path) -> None:
    """Row 8: a user's idle connections fill the address; the admin's hello still
    succeeds (admin_reserved_connections_per_address), a user's does not."""
    d = start(tmp_path, "max_connections_per_address = 20\n")
    try:
        with d.client() as admin:
            admin.create_bucket("b")
            admin.create_user("u", "pw", roles={"b": "read"})
        idle = [d.client(user="u", password="pw", bucket="b") for _ in range(20)]
        try:
            with pytest.raises(errors.TooManyConnections, match="per_address"):
                d.client(user="u", password="pw", bucket="b", max_overload_retries=0)
            with d.client() as admin:  # one of the admins' three
                assert admin.ping() == "pong"
                with d.client() as second:  # and a reserved one
                    assert second.ping() == "pong"
                    table = admin.server_status()["connections"]["table"]
            assert table["refused_reserved_for_admins_per_address"] == 1
        finally:
            for c in idle:
                c.close()
    finally:
        d.kill()


def test_users_named_with_at_log_in_on_messagepack_and_hear_why_not_on_resp(
    tmp_path: Path,
) -> None:
    """Row 12: '@' is refused in new names (RESP's AUTH takes user@bucket); a user
    made with one before keeps the MessagePack door and is told why not on RESP."""
    d = start(tmp_path)
    with d.client() as admin:
        admin.create_bucket("b")
        with pytest.raises(errors.BadValue, match="'@' is not allowed"):
            admin.create_user("ann@corp", "pw", roles={"b": "read"})
    d.stop()
    engine = Engine(tmp_path / "data")
    try:  # as a version before the rule made it
        user = auth.new_user("ann@corp", "pw-ann", roles={"b": "read"})
        with engine.env.begin(write=True) as txn:
            txn.put(b"user:ann@corp", msgpack.packb(user.to_record()), db=engine.system)
    finally:
        engine.close()
    d.start()
    try:
        with d.client(user="ann@corp", password="pw-ann", bucket="b") as c:
            assert c.ping() == "pong"
        [right, wrong] = [resp(d, ["AUTH", "ann@corp", pw])[0] for pw in ("pw-ann", "not-hers")]
        assert right.startswith(b"-WRONGPASS user names containing '@' cannot log in over RESP")
        assert wrong == b"-WRONGPASS invalid username-password pair or user is disabled."
    finally:
        d.kill()


def test_known_good_logins_survive_a_restart(tmp_path: Path) -> None:
    d = start(tmp_path)
    try:
        with d.client() as admin:
            admin.create_bucket("b")
            admin.create_user("u", "pw", roles={"b": "read"})
        with d.client(user="u", password="pw", bucket="b") as c:
            assert c.ping() == "pong"
        time.sleep(0.2)  # written in the background
        d.stop()
        d.start()
        with d.client() as admin:
            st = admin.server_status()["authentication"]
        assert st["known_good_pairs"] == 2  # (admin, 127.0.0.1) and (u, 127.0.0.1)
    finally:
        d.kill()


def test_workers_share_one_limit_exactly(tmp_path: Path) -> None:
    """Row 9: 300 concurrent guesses from one address over two workers reach
    scrypt at most 10 times (24 before the supervisor held the limiter)."""
    d = start(tmp_path, "", "--workers", "2")
    try:
        with d.client() as admin:
            admin.create_user("victim", "right", roles={})
            before = admin.server_status()["authentication"]["hashes"]
        socks = [socket.create_connection((d.host, d.port), TIMEOUT) for _ in range(300)]
        try:
            for i, s in enumerate(socks):
                s.sendall(hello("victim", f"guess-{i}"))
            codes = [read_response(s)[2]["codeName"] for s in socks]
        finally:
            for s in socks:
                s.close()
        assert set(codes) <= {"AuthenticationFailed", "TooManyLoginFailures"}
        with tenantkv.Client(d.host, d.port, user="admin", password=ADMIN_PASSWORD) as admin:
            st = admin.server_status()["authentication"]
        assert st["hashes"] - before <= 10
        assert codes.count("AuthenticationFailed") == st["failures"]
    finally:
        d.kill()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_pool_of_logins_with_the_right_password_all_get_in(tmp_path: Path, workers: int) -> None:
    """A client's connection pool opening at once: eight concurrent logins of one
    user with the right password, from one address, on a fresh node. Concurrent
    logins of a pair in one process share one verification instead of each
    asking the limiter, which refuses a second login of a pair while one is
    verified (they were refused 'failed recently', not retryable, and two racing
    logins lost their shared entry: KeyError, connection dropped)."""
    d = start(tmp_path, "", *(["--workers", "2"] if workers > 1 else []))
    try:
        with d.client() as admin:
            admin.create_bucket("b")
            admin.create_user("pool", "right", roles={"b": "readwrite"})
        for _ in range(3):  # the first round from a stranger's address, then known-good
            socks = [socket.create_connection((d.host, d.port), TIMEOUT) for _ in range(8)]
            try:
                for s in socks:
                    s.sendall(hello("pool", "right", bucket="b"))
                answers = [read_response(s) for s in socks]
            finally:
                for s in socks:
                    s.close()
            errs = [a[2] for a in answers if a[2] is not None]
            if workers == 1:
                assert errs == [], errs
            # Across workers, a pair's login while the other worker verifies one is
            # told to come back (retryable: it ran no hash), and then gets in.
            assert all(errors.RETRYABLE in e["errorLabels"] for e in errs), errs
            for e in errs:
                time.sleep(e["retryAfterMs"] / 1000)
                with socket.create_connection((d.host, d.port), TIMEOUT) as s:
                    s.sendall(hello("pool", "right", bucket="b"))
                    assert read_response(s)[2] is None
        assert "Traceback" not in d.log()
    finally:
        d.kill()
