"""The real daemon on a loopback port, driven by both bundled clients."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import trio

import tenantkv
from tenantkv import errors
from tenantkv.server.server import GC_YOUNG_THRESHOLD
from tests.conftest import ADMIN_PASSWORD, Daemon, read_response

TIMEOUT = 30


@pytest.fixture(scope="module")
def setup(daemon: Daemon) -> Daemon:
    with daemon.client() as c:
        for b in ("alpha", "beta"):
            c.create_bucket(b)
        c.create_user("alice", "pw-a", roles={"alpha": "readwrite"})
        c.create_user("reader", "pw-r", roles={"alpha": "read"})
        c.create_user("bob", "pw-b", roles={"beta": "readwrite"})
    return daemon


def test_sync_client_data_commands(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        cas = c.set("k", b"v1", flags=3)
        rec = c.get_record("k")
        assert rec is not None and (rec.value, rec.cas, rec.flags) == (b"v1", cas, 3)
        assert c.get("missing") is None and c.exists("k") and not c.exists("missing")
        with pytest.raises(errors.CasMismatch):
            c.set("k", b"v2", cas=cas + 1)
        assert c.set("k", b"v2", cas=cas) > cas
        with pytest.raises(errors.KeyExists):
            c.add("k", b"x")
        with pytest.raises(errors.KeyNotFound):
            c.replace("nope", b"x")
        assert c.incr("n", initial=5) == 5 and c.incr("n", 10) == 15 and c.decr("n") == 14
        c.set("ttl", b"v", ttl=100)
        assert c.get_record("ttl").expiry_ms > 0  # type: ignore[union-attr]
        c.touch("ttl", 0)
        assert c.get_record("ttl").expiry_ms == 0  # type: ignore[union-attr]
        assert c.mget(["k", "zz", "n"]) == [b"v2", None, b"14"]
        assert c.delete("k") is True and c.delete("k") is False
        assert c.ping() == "pong"


def test_scan_pages_with_cursor(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        with c.pipeline() as p:
            for i in range(25):
                p.set(f"scan:{i:03d}", b"v")
        keys: list[bytes] = []
        page = c.scan(prefix="scan:", limit=10)
        while True:
            keys += [it.key for it in page.items]
            if page.cursor is None:
                break
            page = c.scan(prefix="scan:", after=page.cursor, limit=10)
        assert keys == [f"scan:{i:03d}".encode() for i in range(25)]


def test_pipeline_answers_in_order_and_reads_own_writes(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        p = c.pipeline()
        for i in range(500):
            p.set(f"p{i}", str(i))
            p.get(f"p{i}")
        results = p.execute()
        assert results[1::2] == [str(i).encode() for i in range(500)]
        status = c.with_timeout(5)  # view with its own timeout shares the socket
        assert status.get("p7") == b"7"


def test_pipeline_collects_errors(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        p = c.pipeline(raise_on_error=False)
        p.set("e1", b"v")
        p.add("e1", b"v")
        p.get("e1")
        res = p.execute()
        assert isinstance(res[1], errors.KeyExists) and res[2] == b"v"


def test_refused_pipelined_commands_leave_no_garbage_cycles(setup: Daemon) -> None:
    """A pipeline's refused commands are freed by reference counting: a client
    refused thousands of times a second (a throttled tenant) must not keep the
    garbage collector busy, which stalls every thread of its process."""
    import gc

    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        c.set("gc-k", b"v")
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                p = c.pipeline(raise_on_error=False)
                for _ in range(20):
                    p.add("gc-k", b"v")  # refused: KeyExists
                assert all(isinstance(r, errors.KeyExists) for r in p.execute())
            del p
            assert gc.collect() == 0
        finally:
            gc.enable()


async def test_async_client_concurrent_calls_pipeline(setup: Daemon) -> None:
    with trio.fail_after(TIMEOUT):
        async with setup.async_client(user="alice", password="pw-a", bucket="alpha") as c:
            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(c.set, f"a{i}", f"v{i}")
            got: dict[int, Any] = {}

            async def fetch(i: int) -> None:
                got[i] = await c.get(f"a{i}")

            async with trio.open_nursery() as n:
                for i in range(200):
                    n.start_soon(fetch, i)
            assert got == {i: f"v{i}".encode() for i in range(200)}
            with pytest.raises(errors.KeyNotFound):
                await c.touch("nope", 1)


def test_roles_keep_tenants_apart(setup: Daemon) -> None:
    with setup.client(user="bob", password="pw-b", bucket="beta") as c:
        c.set("secret", b"bob's")
        with pytest.raises(errors.Unauthorized):
            c.select_bucket("alpha")
        with pytest.raises(errors.Unauthorized):
            c.create_bucket("mine")
        with pytest.raises(errors.Unauthorized):
            c.server_status()
        with pytest.raises(errors.Unauthorized):
            c.create_user("x", "y")
    with pytest.raises(errors.Unauthorized):
        setup.client(user="alice", password="pw-a", bucket="beta")
    with setup.client(user="reader", password="pw-r", bucket="alpha") as r:
        r.get("k")
        with pytest.raises(errors.Unauthorized):
            r.set("k", b"v")
    with pytest.raises(errors.BadValue):  # a non-admin must name a bucket
        setup.client(user="alice", password="pw-a")


def test_authentication_errors(setup: Daemon) -> None:
    with pytest.raises(errors.AuthenticationFailed):
        setup.client(user="alice", password="wrong", bucket="alpha")
    with pytest.raises(errors.AuthenticationFailed):
        setup.client(user="nobody", password="x", bucket="alpha")
    with pytest.raises(errors.BucketNotFound):
        setup.client(bucket="no-such-bucket")


def test_bad_parameters_get_precise_errors(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        with pytest.raises(errors.UnknownCommand, match="frobnicate"):
            c.command("frobnicate")
        with pytest.raises(errors.BadValue, match="'tll'"):
            c.command("set", key=b"k", value=b"v", tll=5)
        with pytest.raises(errors.BadValue, match="'value'"):
            c.command("set", key=b"k", value=5)
        with pytest.raises(errors.BadValue, match="'ttl'"):
            c.command("set", key=b"k", value=b"v", ttl="soon")
        with pytest.raises(errors.KeyTooLong):
            c.set(b"k" * 251, b"v")
        with pytest.raises(errors.KeyTooLong):
            c.get(b"")
        with pytest.raises(errors.BadValue, match="mode"):
            c.set("k", b"v", mode="sometimes")
        with pytest.raises(errors.BadValue):
            c.command("hello", user="a", password="b")
        assert c.ping() == "pong"  # the connection survived all of that


def test_oversized_value_is_refused_and_nothing_stored(setup: Daemon) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        big = b"x" * (tenantkv.protocol.MAX_VALUE_BYTES + 1)
        with pytest.raises(errors.ValueTooLarge):
            c.set("big", big)
        assert c.ping() == "pong"  # refused before it was sent: the connection is fine
    with setup.client(user="alice", password="pw-a", bucket="alpha") as c:
        assert c.get("big") is None
        c.set("big", b"y" * (1024 * 1024))  # a large value within limits works
        assert len(c.get("big")) == 1024 * 1024


@pytest.fixture
def raw(setup: Daemon) -> Iterator[Callable[[], socket.socket]]:
    """Opens raw sockets to the daemon; closes them after the test."""
    opened: list[socket.socket] = []

    def connect() -> socket.socket:
        opened.append(socket.create_connection((setup.host, setup.port), timeout=TIMEOUT))
        return opened[-1]

    yield connect
    for s in opened:
        s.close()


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_bytes_get_an_error_then_close(
    setup: Daemon, raw: Callable[[], socket.socket]
) -> None:
    s = raw()
    s.sendall(b"\xc1\xc1\xc1 GET / HTTP/1.1\r\n\r\n")
    resp = read_response(s)
    assert resp[0] == 1 and resp[2]["codeName"] == "ProtocolError"
    assert _closed(s)


def test_non_hello_first_request_is_refused(
    setup: Daemon, raw: Callable[[], socket.socket]
) -> None:
    s = raw()
    s.sendall(msgpack.packb([0, 9, "get", {"key": b"k"}]))
    resp = read_response(s)
    assert resp[1] == 9 and resp[2]["codeName"] == "HelloRequired"
    assert _closed(s)


def test_huge_frame_is_refused_without_buffering(
    setup: Daemon, raw: Callable[[], socket.socket]
) -> None:
    s = raw()
    s.sendall(msgpack.packb([0, 1, "hello", {"user": "admin", "password": ADMIN_PASSWORD}]))
    assert read_response(s)[2] is None
    # declare a 1 GiB bin and start streaming it
    s.sendall(b"\x94\x00\x02\xa3set\x82\xa3key\xc4\x01k\xa5value\xc6\x40\x00\x00\x00")
    resp = None
    try:
        for _ in range(200):
            s.sendall(b"\x00" * 262144)
    except OSError:
        pass
    resp = read_response(s)
    assert resp is None or (resp[1] is None and resp[2]["codeName"] == "FrameTooLarge")


def test_wrong_shape_after_hello_closes_only_that_connection(
    setup: Daemon, raw: Callable[[], socket.socket]
) -> None:
    with setup.client(user="alice", password="pw-a", bucket="alpha") as healthy:
        s = raw()
        s.sendall(
            msgpack.packb([0, 1, "hello", {"user": "alice", "password": "pw-a", "bucket": "alpha"}])
        )
        assert read_response(s)[2] is None
        s.sendall(msgpack.packb(["not", "a", "request"]))
        assert read_response(s)[2]["codeName"] == "ProtocolError"
        assert _closed(s)
        assert healthy.ping() == "pong"


def test_status_document(setup: Daemon) -> None:
    with setup.client() as c:
        st = c.server_status()
    assert st["version"] == tenantkv.__version__
    assert st["connections"]["current"] >= 1
    assert {"alpha", "beta"} <= set(st["buckets"])
    assert st["storage"]["durability"] == "fsync"
    assert st["storage"]["writer"]["ops_committed"] > 0
    # What start-up built is out of the collector's reach, and the young
    # generation's threshold is the server's own (GC_YOUNG_THRESHOLD).
    assert st["gc"]["frozen_objects"] > 1000
    assert st["gc"]["thresholds"][0] == GC_YOUNG_THRESHOLD


def test_delete_bucket_drops_data_and_detaches_sessions(setup: Daemon) -> None:
    with setup.client() as admin:
        admin.create_bucket("tmp")
        admin.select_bucket("tmp")
        admin.set("k", b"v")
        with setup.client(bucket="tmp") as other:
            admin.delete_bucket("tmp")
            with pytest.raises(errors.NoBucketSelected):
                other.get("k")
        admin.create_bucket("tmp")
        admin.select_bucket("tmp")
        assert admin.get("k") is None
        assert "tmp" in [b["name"] for b in admin.list_buckets()]
        with pytest.raises(errors.BucketExists):
            admin.create_bucket("tmp")
        with pytest.raises(errors.BadValue):
            admin.create_bucket("bad name!")


def test_user_admin(setup: Daemon) -> None:
    with setup.client() as c:
        c.create_user("temp", "pw", roles={"alpha": "read"})
        with pytest.raises(errors.UserExists):
            c.create_user("temp", "pw")
        with pytest.raises(errors.BucketNotFound):
            c.create_user("temp2", "pw", roles={"nope": "read"})
        with pytest.raises(errors.BadValue):
            c.create_user("temp3", "pw", roles={"alpha": "owner"})
        names = [u["name"] for u in c.list_users()]
        assert {"admin", "alice", "temp"} <= set(names)
        assert all("hash" not in u and "salt" not in u for u in c.list_users())
        c.delete_user("temp")
        with pytest.raises(errors.UserNotFound):
            c.delete_user("temp")
    with pytest.raises(errors.AuthenticationFailed):
        setup.client(user="temp", password="pw", bucket="alpha")


def test_acknowledged_writes_survive_kill_9(fresh_daemon: Daemon) -> None:
    with fresh_daemon.client() as c:
        c.create_bucket("d")
        c.select_bucket("d")
        with c.pipeline() as p:
            for i in range(2000):
                p.set(f"k{i}", f"v{i}")
        c.set("last", b"acked")
    fresh_daemon.stop(signal.SIGKILL)
    fresh_daemon.start()
    with fresh_daemon.client(bucket="d") as c:
        assert c.get("last") == b"acked"
        assert c.mget([f"k{i}" for i in range(0, 2000, 7)]) == [
            f"v{i}".encode() for i in range(0, 2000, 7)
        ]


def test_sigterm_is_graceful_and_state_persists(fresh_daemon: Daemon) -> None:
    with fresh_daemon.client() as c:
        c.create_bucket("g")
        c.create_user("gu", "pw", roles={"g": "readwrite"})
    with fresh_daemon.client(user="gu", password="pw", bucket="g") as c:
        c.set("k", b"v")
    assert fresh_daemon.stop(signal.SIGTERM) == 0
    log = fresh_daemon.log()
    assert "listening on 127.0.0.1:" in log and "storage closed" in log
    assert ADMIN_PASSWORD not in log
    fresh_daemon.start()
    with fresh_daemon.client(user="gu", password="pw", bucket="g") as c:
        assert c.get("k") == b"v"
