"""Transactions on the RESP door, driven by redis-py (sync and asyncio, RESP2 and
RESP3) against the real daemon: MULTI/EXEC atomicity, queue-time errors
(EXECABORT), runtime errors, WATCH conflicts from another connection, bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.conftest import Daemon
from tests.e2e.test_redis import connect, raw

PW = "Secret-Pa55"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("redis-txn")
    daemon = Daemon(base / "data").start()
    with daemon.client() as c:
        for b in ("red", "blue"):
            c.create_bucket(b)
        c.create_user("alice", PW, roles={"red": "readwrite"})
        c.create_user("reader", PW, roles={"red": "read"})
    yield daemon
    daemon.kill()


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def r(d: Daemon, request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    c = connect(d, protocol=request.param)
    c.flushdb()
    yield c
    c.close()


def test_pipeline_is_atomic_and_reads_see_its_writes(r: redis.Redis) -> None:
    r.set("other", "x")
    pipe = r.pipeline()  # transaction=True: MULTI ... EXEC
    pipe.set("k", 1).incr("k").get("k").mset({"a": "1", "b": "2"}).mget("a", "b", "zz")
    pipe.delete("other").exists("other").strlen("k")
    assert pipe.execute() == [True, 2, b"2", True, [b"1", b"2", None], 1, 0, 1]
    assert r.get("k") == b"2" and r.exists("other") == 0


def call(conn: Any, *args: Any) -> Any:
    """One command on a redis-py connection, its reply as sent (no callbacks)."""
    conn.send_command(*args)
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


@pytest.fixture
def conn(r: redis.Redis) -> Iterator[Any]:
    c = r.connection_pool.get_connection()
    yield c
    r.connection_pool.release(c)


def test_queue_time_error_aborts_with_execabort(r: redis.Redis, conn: Any) -> None:
    r.set("k", "before")
    assert call(conn, "MULTI") == b"OK"
    assert call(conn, "SET", "k", "in-txn") == b"QUEUED"
    assert "wrong number of arguments for 'get'" in str(call(conn, "GET"))
    assert "unknown command" in str(call(conn, "NOSUCH", "x"))
    assert call(conn, "GET", "k") == b"QUEUED"  # still checked and answered
    err = call(conn, "EXEC")
    assert str(err) == "Transaction discarded because of previous errors."
    assert r.get("k") == b"before"  # nothing ran
    assert str(call(conn, "EXEC")) == "EXEC without MULTI"


def test_pipeline_with_a_bad_command_raises_execabort(r: redis.Redis) -> None:
    pipe = r.pipeline()
    pipe.set("a", "1").execute_command("SET", "only-key")
    with pytest.raises(redis.ResponseError):
        pipe.execute()
    assert r.get("a") is None


def test_runtime_error_is_that_commands_reply_only(r: redis.Redis) -> None:
    r.set("text", "abc")
    pipe = r.pipeline()
    pipe.set("a", "1").incr("text").set("b", "2")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        pipe.execute()
    assert r.get("a") == b"1" and r.get("b") == b"2"  # the others applied, as in Redis
    pipe = r.pipeline()
    got = pipe.set("c", "3").incr("text").get("c").execute(raise_on_error=False)
    assert got[0] is True and isinstance(got[1], redis.ResponseError) and got[2] == b"3"


def test_nesting_discard_and_control_errors(r: redis.Redis, conn: Any) -> None:
    assert str(call(conn, "DISCARD")) == "DISCARD without MULTI"
    assert call(conn, "MULTI") == b"OK"
    assert str(call(conn, "MULTI")) == "MULTI calls can not be nested"
    assert str(call(conn, "WATCH", "k")) == "WATCH inside MULTI is not allowed"
    assert call(conn, "SET", "k", "v") == b"QUEUED"
    assert call(conn, "DISCARD") == b"OK"
    assert r.get("k") is None
    assert call(conn, "MULTI") == b"OK"
    assert call(conn, "PING") == b"QUEUED"
    assert call(conn, "ECHO", "hi") == b"QUEUED"
    assert call(conn, "SET", "k", "v") == b"QUEUED"
    # (nesting and WATCH errors abort nothing)
    assert call(conn, "EXEC") == [b"PONG", b"hi", b"OK"] and r.get("k") == b"v"
    call(conn, "MULTI")
    assert str(call(conn, "SELECT", "blue")) == "Command not allowed inside a transaction"
    assert str(call(conn, "EXEC")).startswith("Transaction discarded")


def test_watch_conflict_from_another_connection(d: Daemon, r: redis.Redis) -> None:
    r.set("balance", "10")
    other = connect(d)
    try:
        pipe = r.pipeline()
        pipe.watch("balance")
        assert pipe.get("balance") == b"10"  # immediate mode after WATCH
        other.set("balance", "99")  # someone else writes it
        pipe.multi()
        pipe.set("balance", "11")
        with pytest.raises(redis.WatchError):
            pipe.execute()
        assert r.get("balance") == b"99"  # nothing applied
        # Unchanged, it applies; transaction() retries a conflict until it holds.
        calls = []

        def add_one(p: Any) -> None:
            value = int(p.get("balance"))
            if not calls:
                other.set("balance", str(value + 100))  # the first try conflicts
            calls.append(value)
            p.multi()
            p.set("balance", value + 1)

        r.transaction(add_one, "balance")
        assert r.get("balance") == b"200" and calls == [99, 199]
    finally:
        other.close()


def test_watch_expired_own_write_and_unwatch(r: redis.Redis, conn: Any) -> None:
    r.set("t", "v", px=300)
    call(conn, "WATCH", "t")
    time.sleep(0.5)  # (it expires: a change, as in Redis 7)
    call(conn, "MULTI")
    call(conn, "SET", "x", "1")
    assert call(conn, "EXEC") is None
    assert r.get("x") is None
    call(conn, "SET", "w", "1")
    call(conn, "WATCH", "w")
    call(conn, "SET", "w", "2")  # the connection's own write counts too
    call(conn, "MULTI")
    call(conn, "SET", "x", "1")
    assert call(conn, "EXEC") is None
    call(conn, "WATCH", "w")
    call(conn, "SET", "w", "3")
    assert call(conn, "UNWATCH") == b"OK"
    call(conn, "MULTI")
    call(conn, "SET", "x", "2")
    assert call(conn, "EXEC") == [b"OK"]
    assert r.get("x") == b"2"


def test_exec_null_reply_forms(d: Daemon) -> None:
    """A WATCH conflict answers a null array: ``*-1`` on RESP2, ``_`` on RESP3."""
    login = b"*3\r\n$4\r\nAUTH\r\n$9\r\nalice@red\r\n$11\r\n" + PW.encode() + b"\r\n"
    watch = b"*2\r\n$5\r\nWATCH\r\n$1\r\nq\r\n*3\r\n$3\r\nSET\r\n$1\r\nq\r\n$1\r\n1\r\n"
    txn = b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$1\r\nz\r\n$1\r\n1\r\n*1\r\n$4\r\nEXEC\r\n"
    quit_ = b"*1\r\n$4\r\nQUIT\r\n"
    out = raw(d, login + watch + txn + quit_)
    assert out == b"+OK\r\n+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*-1\r\n+OK\r\n"
    hello3 = b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"
    out = raw(d, login + hello3 + watch + txn + quit_)
    assert out.endswith(b"+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n_\r\n+OK\r\n")


def test_permissions_are_checked_at_queue_time(d: Daemon) -> None:
    c = connect(d, "reader")
    try:
        pipe = c.pipeline()
        pipe.get("k").set("k", "v")
        with pytest.raises(redis.ResponseError):
            pipe.execute()
        assert c.get("k") is None
    finally:
        c.close()


def test_bounds_abort_the_transaction(d: Daemon) -> None:
    """Past MAX_TRANSACTION_COMMANDS the transaction aborts, and what follows is
    not kept: a client that goes on sending is answered, not buffered."""
    from tenantkv.server.transaction import MAX_TRANSACTION_COMMANDS

    c = connect(d)
    try:
        pipe = c.pipeline()
        for i in range(MAX_TRANSACTION_COMMANDS + 50):
            pipe.set(f"k{i}", "v")
        with pytest.raises(redis.ResponseError):
            pipe.execute()
        assert c.exists("k0") == 0
        assert c.ping() is True  # the connection goes on
    finally:
        c.close()


def test_asyncio_pipeline_and_transaction(d: Daemon) -> None:
    async def main() -> None:
        c = redis.asyncio.Redis(
            host=d.host, port=d.resp_port, username="alice", password=PW, protocol=3
        )
        try:
            async with c.pipeline() as pipe:
                got = await pipe.set("ak", 5).incrby("ak", 10).get("ak").execute()
            assert got == [True, 15, b"15"]

            async def double(p: Any) -> None:
                value = int(await p.get("ak"))
                p.multi()
                p.set("ak", value * 2)

            await c.transaction(double, "ak")
            assert await c.get("ak") == b"30"
        finally:
            await c.aclose()

    asyncio.run(main())


def test_reset_inside_multi_discards_it(r: redis.Redis, conn: Any) -> None:
    assert call(conn, "MULTI") == b"OK"
    assert call(conn, "SET", "gone", "1") == b"QUEUED"
    assert call(conn, "RESET") == b"RESET"
    assert call(conn, "SET", "k", "v") == b"OK"  # runs: no longer in MULTI
    assert str(call(conn, "EXEC")) == "EXEC without MULTI"
    assert r.get("gone") is None and r.get("k") == b"v"


def test_pipeline_with_connection_commands_answers_them_in_place(r: redis.Redis) -> None:
    """redis-py's pipeline queues connection commands as Redis 7.0 does: each
    answered in EXEC's array where it stood."""
    pipe = r.pipeline()
    pipe.set("c", "1").client_setname("piped").time().client_getname().ping().incr("c")
    ok, named, now, name, pong, n = pipe.execute()
    assert ok is True and named is True and pong is True and n == 2
    assert isinstance(now, tuple) and abs(now[0] - time.time()) < 60
    assert name in ("piped", b"piped")
    assert r.get("c") == b"2"


def test_watch_of_an_absent_key_created_and_deleted_raises_watch_error(r: redis.Redis) -> None:
    other = redis.Redis(connection_pool=r.connection_pool)
    with r.pipeline() as pipe:
        pipe.watch("ghost")
        other.set("ghost", "1")
        other.delete("ghost")
        pipe.multi()
        pipe.set("after", "1")
        with pytest.raises(redis.WatchError):
            pipe.execute()
    assert r.get("after") is None


def test_connection_commands_count_their_bytes_against_the_bounds(d: Daemon) -> None:
    """An ECHO queued in MULTI holds its argument until EXEC as a SET holds its
    value: past MAX_TRANSACTION_BYTES the transaction aborts, nothing kept."""
    c = connect(d)
    try:
        pipe = c.pipeline()
        pipe.set("ek", "v")
        for _ in range(2):
            pipe.echo(b"e" * (17 * 1024 * 1024))  # 2 x 17 MiB > 32 MiB
        with pytest.raises(redis.ResponseError):
            pipe.execute()
        assert c.exists("ek") == 0
        assert c.ping() is True
    finally:
        c.close()


@pytest.mark.parametrize(
    "command",
    [("KEYS", "*"), ("SCAN", "0", "MATCH", "[[[a-"), ("LCS", "a", "b"), ("BITCOUNT", "a")],
)
def test_reads_whose_work_is_unbounded_are_refused_in_multi(
    d: Daemon, command: tuple[str, ...]
) -> None:
    """EXEC's reads run in the node's one writer: a scan, a pattern or LCS's table
    there would hold every tenant's writes, so they abort the transaction."""
    c = connect(d)
    try:
        pipe = c.pipeline()
        pipe.set("uk", "v")
        pipe.execute_command(*command)
        with pytest.raises(redis.ResponseError) as err:
            pipe.execute()
        assert "not allowed inside a transaction" in str(err.value) or "EXECABORT" in str(err.value)
        assert c.exists("uk") == 0
    finally:
        c.close()


def test_a_watched_key_that_expires_or_is_created_expiring_fails_exec(d: Daemon) -> None:
    """A key watched while absent, then set with a TTL that has run out by EXEC,
    and a watched key that expires before EXEC, both fail EXEC (Redis since
    6.0.9), whether or not the expiry pager has removed the record yet."""
    c, other = connect(d), connect(d)
    try:
        for setup in ("absent", "expiring"):
            c.delete("wk")
            if setup == "expiring":
                c.set("wk", "v", px=100)
            pipe = c.pipeline()
            pipe.watch("wk")
            if setup == "absent":
                other.set("wk", "other", px=1)
            time.sleep(0.2)
            pipe.multi()
            pipe.set("wk", "mine")
            with pytest.raises(redis.WatchError):
                pipe.execute()
            pipe.reset()
            assert c.get("wk") is None
    finally:
        c.close()
        other.close()
