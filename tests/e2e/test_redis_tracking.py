"""Client-side caching (CLIENT TRACKING) on the RESP door, against the real daemon:
redis-py's own client-side cache (RESP3) never serves a value after another
client — RESP or MessagePack — changed it; the pushes as Redis sends them;
FLUSHDB, expiry, BCAST, OPTIN, the options' errors and the bounds."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cache import CacheConfig

from tests.conftest import Daemon, wait_until

PW = "Secret-Pa55"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("redis-tracking") / "data").start()
    with daemon.client() as c:
        for b in ("red", "blue"):
            c.create_bucket(b)
        c.create_user("alice", PW, roles={"red": "readwrite", "blue": "readwrite"})
    yield daemon
    daemon.kill()


def connect(d: Daemon, bucket: str = "red", **kw: Any) -> redis.Redis:
    return redis.Redis(
        host=d.host,
        port=d.resp_port,
        username=f"alice@{bucket}",
        password=PW,
        socket_timeout=20,
        **kw,
    )


def cached(d: Daemon, bucket: str = "red") -> redis.Redis:
    return connect(d, bucket, protocol=3, cache_config=CacheConfig())


def eventually(read: Any, want: Any) -> None:
    """The cache's read equals ``want`` once the push arrived (it is sent when the
    write commits: redis-py reads it before its next cached answer)."""
    wait_until(lambda: read() == want, timeout=5, what=f"the cached read to become {want!r}")


def test_cached_value_is_invalidated_by_another_connection(d: Daemon) -> None:
    r, w = cached(d), connect(d)
    w.set("k", "v1")
    assert r.get("k") == b"v1"
    cache = r.get_cache()
    assert cache is not None and cache.size == 1  # it is cached
    for i in range(20):
        # The push is on the reader's socket before the writer's answer is sent:
        # the very next cached read sees the write (no waiting).
        w.set("k", f"v{i}")
        assert r.get("k") == f"v{i}".encode()
    w.delete("k")
    assert r.get("k") is None
    r.close()
    w.close()


def test_msgpack_write_invalidates_a_resp_cache(d: Daemon) -> None:
    r = cached(d)
    with d.client(user="alice", password=PW, bucket="red") as c:
        c.set(b"m", b"one")
        assert r.get("m") == b"one"
        c.set(b"m", b"two")
        eventually(lambda: r.get("m"), b"two")
    r.close()


def test_every_write_kind_invalidates(d: Daemon) -> None:
    r, w = cached(d), connect(d)
    w.mset({"a": "1", "b": "2", "n": "5"})
    assert r.mget("a", "b") == [b"1", b"2"]
    assert r.get("n") == b"5"
    w.incr("n")
    eventually(lambda: r.get("n"), b"6")
    w.append("a", "x")
    eventually(lambda: r.mget("a", "b"), [b"1x", b"2"])
    w.rename("b", "c")
    eventually(lambda: r.mget("a", "b"), [b"1x", None])
    pipe = w.pipeline()  # MULTI ... EXEC
    pipe.set("a", "in-txn").set("n", "7")
    pipe.execute()
    eventually(lambda: r.mget("a", "b"), [b"in-txn", None])
    eventually(lambda: r.get("n"), b"7")
    r.close()
    w.close()


def _sock(d: Daemon, *commands: bytes) -> socket.socket:
    s = socket.create_connection((d.host, d.resp_port), timeout=10)
    s.sendall(b"HELLO 3 AUTH alice@red " + PW.encode() + b"\r\n" + b"".join(commands))
    return s


def _read_until(s: socket.socket, want: bytes) -> bytes:
    got = b""
    deadline = time.monotonic() + 10
    while want not in got and time.monotonic() < deadline:
        got += s.recv(65536)
    return got


def test_the_push_is_redis_s_bytes_and_once(d: Daemon) -> None:
    w = connect(d)
    w.set("once", "1")
    s = _sock(d, b"CLIENT TRACKING ON\r\n", b"GET once\r\n")
    _read_until(s, b"$1\r\n1\r\n")
    w.set("once", "2")
    push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$4\r\nonce\r\n"
    assert _read_until(s, push).endswith(push)
    w.set("once", "3")  # not read again: forgotten, nothing pushed
    s.sendall(b"PING\r\n")
    assert _read_until(s, b"+PONG\r\n") == b"+PONG\r\n"
    s.close()
    w.close()


def test_flushdb_sends_a_null_invalidation(d: Daemon) -> None:
    w = connect(d)
    w.set("f", "1")
    s = _sock(d, b"CLIENT TRACKING ON\r\n", b"GET f\r\n")
    _read_until(s, b"$1\r\n1\r\n")
    w.flushdb()
    push = b">2\r\n$10\r\ninvalidate\r\n_\r\n"
    assert _read_until(s, push).endswith(push)
    s.close()
    w.close()


def test_cache_after_flushdb(d: Daemon) -> None:
    r, w = cached(d), connect(d)
    w.set("g", "1")
    assert r.get("g") == b"1"
    w.flushdb()
    eventually(lambda: r.get("g"), None)
    r.close()
    w.close()


def test_other_buckets_are_not_told(d: Daemon) -> None:
    w = connect(d, "blue")
    s = _sock(d, b"CLIENT TRACKING ON\r\n", b"GET iso\r\n")
    _read_until(s, b"_\r\n")
    w.set("iso", "blue's")  # same key, other bucket
    s.sendall(b"PING\r\n")
    assert _read_until(s, b"+PONG\r\n") == b"+PONG\r\n"
    s.close()
    w.close()


def test_expiry_invalidates(d: Daemon) -> None:
    r, w = cached(d), connect(d)
    w.set("ttl", "soon", px=300)
    assert r.get("ttl") == b"soon"
    eventually(lambda: r.get("ttl"), None)  # the pager removed it and said so
    r.close()
    w.close()


def test_bcast_with_prefix(d: Daemon) -> None:
    w = connect(d)
    s = _sock(d, b"CLIENT TRACKING ON BCAST PREFIX user:\r\n")
    _read_until(s, b"+OK\r\n")
    w.set("user:1", "x")
    w.set("other", "y")
    push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$6\r\nuser:1\r\n"
    s.sendall(b"PING\r\n")
    got = _read_until(s, b"+PONG\r\n")
    assert got == push + b"+PONG\r\n"
    s.close()
    w.close()


def test_optin_tracks_only_after_caching_yes(d: Daemon) -> None:
    w = connect(d)
    w.mset({"o1": "a", "o2": "b"})
    s = _sock(
        d, b"CLIENT TRACKING ON OPTIN\r\n", b"GET o1\r\n", b"CLIENT CACHING yes\r\n", b"GET o2\r\n"
    )
    _read_until(s, b"$1\r\nb\r\n")
    w.set("o1", "A")
    w.set("o2", "B")
    push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\no2\r\n"
    s.sendall(b"PING\r\n")
    assert _read_until(s, b"+PONG\r\n") == push + b"+PONG\r\n"
    s.close()
    w.close()


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("CLIENT TRACKING ON PREFIX a", "PREFIX option requires BCAST mode to be enabled"),
        ("CLIENT TRACKING ON OPTIN OPTOUT", "You can't use both OPTIN and OPTOUT"),
        ("CLIENT TRACKING ON BCAST OPTIN", "OPTIN and OPTOUT are not compatible with BCAST"),
        ("CLIENT TRACKING ON BOGUS", "syntax error"),
        ("CLIENT TRACKING MAYBE", "syntax error"),
        ("CLIENT TRACKING ON REDIRECT x", "value is not an integer or out of range"),
        ("CLIENT TRACKING ON REDIRECT 5", "REDIRECT is not supported"),
        ("CLIENT CACHING yes", "CLIENT CACHING can be called only when"),
        ("CLIENT TRACKING ON BCAST PREFIX a PREFIX ab", "overlaps with another provided prefix"),
    ],
)
def test_option_errors(d: Daemon, command: str, error: str) -> None:
    r = connect(d, protocol=3)
    with pytest.raises(redis.ResponseError, match=error):
        r.execute_command(*command.split())
    r.close()


def test_resp2_is_refused_and_trackinginfo(d: Daemon) -> None:
    r2 = connect(d, protocol=2)
    with pytest.raises(redis.ResponseError, match="needs RESP3"):
        r2.execute_command("CLIENT", "TRACKING", "ON")
    r2.close()
    r = connect(d, protocol=3)
    conn = r.connection_pool.get_connection()
    for args, want in [
        (("CLIENT", "GETREDIR"), -1),
        (("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "p", "NOLOOP"), b"OK"),
        (("CLIENT", "GETREDIR"), 0),
        (
            ("CLIENT", "TRACKINGINFO"),
            {b"flags": [b"on", b"bcast", b"noloop"], b"redirect": 0, b"prefixes": [b"p"]},
        ),
        (("CLIENT", "TRACKING", "OFF"), b"OK"),
        (("CLIENT", "TRACKINGINFO"), {b"flags": [b"off"], b"redirect": -1, b"prefixes": []}),
    ]:
        conn.send_command(*args)
        assert conn.read_response() == want, args
    r.connection_pool.release(conn)
    r.close()


def test_a_client_that_reads_no_pushes_is_closed(d: Daemon) -> None:
    """Invalidations it never reads cannot pile up in the server: past the bound
    (twice OUT_HIGH_WATER) the connection is closed, as Redis closes a client past
    its output-buffer limit; other clients are unaffected."""
    w = connect(d)
    keys = [f"big:{i}:" + "k" * 200 for i in range(500)]
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((d.host, d.resp_port))
    s.sendall(b"HELLO 3 AUTH alice@red " + PW.encode() + b"\r\nCLIENT TRACKING ON BCAST\r\n")
    time.sleep(0.2)
    for _ in range(120):  # ~13 MB of pushes owed, none read meanwhile
        w.mset({k: "v" for k in keys})
    received = 0
    while chunk := s.recv(1 << 20):  # what was sent before the close, then EOF
        received += len(chunk)
    assert received < 12_000_000
    s.close()
    assert w.ping()
    w.close()


@pytest.fixture(scope="module")
def workers2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(
        tmp_path_factory.mktemp("tracking-workers") / "data", extra_args=["--workers", "2"]
    ).start()
    with daemon.client() as c:
        c.create_bucket("red")
        c.create_user("alice", PW, roles={"red": "readwrite"})
    yield daemon
    daemon.kill()


def _on_another_worker(d: Daemon, than: redis.Redis) -> redis.Redis:
    """A plain connection served by another worker process than ``than``'s."""
    pid = than.info("server")["process_id"]
    for _ in range(100):
        c = connect(d)
        if c.info("server")["process_id"] != pid:
            return c
        c.close()
    raise AssertionError("every connection reached the same worker")


def test_workers_a_write_on_one_worker_invalidates_a_cache_on_another(workers2: Daemon) -> None:
    r = cached(workers2)
    w = _on_another_worker(workers2, r)
    w.set("wk", "1")
    assert r.get("wk") == b"1"
    for i in range(2, 20):
        w.set("wk", str(i))
        # The write is acknowledged once the other worker pushed the invalidation:
        # the very next cached read sees it (no waiting).
        assert r.get("wk") == str(i).encode()
    w.flushdb()
    assert r.get("wk") is None
    r.close()
    w.close()


def test_workers_expiry_reaches_every_worker(workers2: Daemon) -> None:
    r = cached(workers2)
    w = _on_another_worker(workers2, r)
    w.set("wttl", "soon", px=300)
    assert r.get("wttl") == b"soon"
    eventually(lambda: r.get("wttl"), None)
    r.close()
    w.close()


def test_the_tracking_table_is_bounded(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past tracking_table_max_keys the oldest key is evicted, its reader told."""
    monkeypatch.setenv("TENANTKV_TRACKING_TABLE_MAX_KEYS", "3")
    d = Daemon(tmp_path_factory.mktemp("tracking-bound") / "data").start()
    try:
        with d.client() as c:
            c.create_bucket("red")
            c.create_user("alice", PW, roles={"red": "readwrite"})
        s = _sock(d, b"CLIENT TRACKING ON\r\n", b"MGET k1 k2 k3\r\n")
        _read_until(s, b"*3\r\n_\r\n_\r\n_\r\n")
        s.sendall(b"GET k4\r\n")
        evicted = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\nk1\r\n"
        assert _read_until(s, evicted + b"_\r\n") == evicted + b"_\r\n"
        s.close()
    finally:
        d.kill()


def test_a_dropped_bucket_sends_a_null_invalidation(d: Daemon) -> None:
    with d.client() as admin:
        admin.create_bucket("doomed")
        admin.create_user("dana", PW, roles={"doomed": "readwrite"})
    s = socket.create_connection((d.host, d.resp_port), timeout=10)
    s.sendall(b"HELLO 3 AUTH dana@doomed " + PW.encode() + b"\r\nCLIENT TRACKING ON\r\nGET x\r\n")
    _read_until(s, b"+OK\r\n_\r\n")
    with d.client() as admin:
        admin.delete_bucket("doomed")
    push = b">2\r\n$10\r\ninvalidate\r\n_\r\n"
    assert _read_until(s, push).endswith(push)
    s.close()
