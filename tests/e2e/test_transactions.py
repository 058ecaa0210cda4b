"""Transactions through the bundled client and the MessagePack door, against the
real daemon: ``transaction()`` (one atomic request, sync and async), the
connection-level ``multi``/``exec``/``watch`` commands, and ``serve --workers 2``
where a write on one worker process breaks a WATCH on the other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import trio

from tenantkv import errors
from tests.conftest import Daemon

PW = "Secret-Pa55"


def _setup(d: Daemon) -> Daemon:
    with d.client() as c:
        c.create_bucket("red")
        c.create_user("alice", PW, roles={"red": "readwrite"})
        c.create_user("reader", PW, roles={"red": "read"})
    return d


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path_factory.mktemp("txn") / "data").start()
    yield _setup(daemon)
    daemon.kill()


def alice(d: Daemon, **kw: Any) -> Any:
    return d.client(user="alice", password=PW, bucket="red", **kw)


def test_client_transaction_is_atomic_and_reads_its_writes(d: Daemon) -> None:
    with alice(d) as c:
        c.set("text", "abc")
        got = c.transaction(
            [
                ("set", {"key": "a", "value": "1"}),
                ("incr", {"key": "a", "delta": 4}),
                ("get", {"key": "a"}),
                ("incr", {"key": "text"}),  # a runtime error: this op's only
                ("mget", {"keys": ["a", "none"]}),
                ("delete", {"key": "text"}),
            ]
        )
        assert got[0]["cas"] > 0 and got[1]["value"] == 5 and got[2]["value"] == b"5"
        assert isinstance(got[3], errors.NotANumber)
        assert got[4][0]["value"] == b"5" and got[4][1] is None and got[5] is True
        assert c.get("a") == b"5" and c.get("text") is None


def test_client_transaction_check_and_set_with_watch(d: Daemon) -> None:
    with alice(d) as c, alice(d) as other:
        c.set("balance", "10")
        rec = c.get_record("balance")
        ops = [("set", {"key": "balance", "value": "11"}), ("set", {"key": "log", "value": "+1"})]
        other.set("balance", "50")  # someone else, between our read and our write
        assert c.transaction(ops, watch={"balance": rec.cas, "nokey": 0}) is None
        assert c.get("balance") == b"50" and c.get("log") is None  # nothing ran
        rec = c.get_record("balance")
        assert c.transaction(ops, watch={"balance": rec.cas}) is not None
        assert c.get("balance") == b"11" and c.get("log") == b"+1"


def test_a_bad_op_fails_the_request_before_anything_runs(d: Daemon) -> None:
    with alice(d) as c:
        with pytest.raises(errors.BadValue, match=r"ops\[1\] \(set\)"):
            c.transaction([("set", {"key": "x", "value": "1"}), ("set", {"key": "x"})])
        with pytest.raises(errors.BadValue, match="no data command"):
            c.transaction([("create_bucket", {"name": "z"})])
        assert c.get("x") is None
    with (
        d.client(user="reader", password=PW, bucket="red") as r,
        pytest.raises(errors.Unauthorized),
    ):
        r.transaction([("get", {"key": "x"}), ("set", {"key": "x", "value": "1"})])


def test_async_client_transaction(d: Daemon) -> None:
    async def main() -> None:
        async with d.async_client(user="alice", password=PW, bucket="red") as c:
            await c.set("n", "1")
            got = await c.transaction([("incr", {"key": "n"}), ("get", {"key": "n"})])
            assert got[0]["value"] == 2 and got[1]["value"] == b"2"

    trio.run(main)


def test_msgpack_multi_exec_and_watch_on_the_connection(d: Daemon) -> None:
    with alice(d) as c, alice(d) as other:
        assert c.command("multi") is True
        assert c.command("set", key="m", value="1") == "QUEUED"
        assert c.command("incr", key="m") == "QUEUED"
        assert other.get("m") is None  # queued, not run
        got = c.command("exec")
        assert got[1] == {"result": {"value": 2, "cas": got[1]["result"]["cas"]}}
        with pytest.raises(errors.BadValue, match="EXEC without MULTI"):
            c.command("exec")
        c.command("watch", keys=["m"])
        other.set("m", "9")
        c.command("multi")
        c.command("set", key="m", value="0")
        assert c.command("exec") is None and c.get("m") == b"9"
        c.command("multi")
        with pytest.raises(errors.BadValue):
            c.command("set", key="m")  # a queue-time error
        with pytest.raises(errors.BadValue, match="EXECABORT"):
            c.command("exec")
        c.command("multi")
        c.command("set", key="m", value="gone")
        assert c.command("discard") is True and c.get("m") == b"9"


@pytest.fixture(scope="module")
def workers2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("txn-workers") / "data"
    daemon = Daemon(base, extra_args=["--workers", "2"]).start()
    yield _setup(daemon)
    daemon.kill()


def _on_each_worker(d: Daemon) -> dict[int, Any]:
    found: dict[int, Any] = {}
    spare = []
    for _ in range(200):
        c = alice(d)
        w = c.command("whoami").get("worker", 0)
        if w in found:
            spare.append(c)
        else:
            found[w] = c
        if len(found) == 2:
            break
    for c in spare:
        c.close()
    assert len(found) == 2
    return found


def test_watch_conflicts_across_worker_processes(workers2: Daemon) -> None:
    clients = _on_each_worker(workers2)
    try:
        for writer, watcher in ((0, 1), (1, 0)):
            a, b = clients[watcher], clients[writer]
            key = f"k{watcher}"
            a.set(key, "0")
            a.command("watch", keys=[key])
            b.set(key, "changed")  # the other worker process
            a.command("multi")
            a.command("set", key=key, value="mine")
            assert a.command("exec") is None
            assert a.get(key) == b"changed"
            rec = a.get_record(key)
            assert a.transaction([("get", {"key": key})], watch={key: rec.cas}) is not None
            b.set(key, "again")
            assert (
                a.transaction([("set", {"key": key, "value": "x"})], watch={key: rec.cas}) is None
            )
        # The RESP door on the same node: redis-py's WATCH sees a write on either worker.
        r = redis.Redis(host=workers2.host, port=workers2.resp_port, username="alice", password=PW)
        try:
            for i in range(6):  # (connections land on either worker)
                pipe = r.pipeline()
                pipe.watch("shared")
                clients[i % 2].set("shared", str(i))
                pipe.multi()
                pipe.set("shared", "resp")
                with pytest.raises(redis.WatchError):
                    pipe.execute()
                pipe.reset()
            got = r.pipeline().set("t", "1").incr("t").get("t").execute()
            assert got == [True, 2, b"2"]
        finally:
            r.close()
    finally:
        for c in clients.values():
            c.close()


def test_watch_of_an_absent_key_created_and_deleted_on_another_worker(workers2: Daemon) -> None:
    """The delete count lives in the supervisor's writer: a watch on one worker
    sees a key created and deleted through the other."""
    clients = _on_each_worker(workers2)
    try:
        for writer, watcher in ((0, 1), (1, 0)):
            a, b = clients[watcher], clients[writer]
            key = f"gone{watcher}"
            a.command("watch", keys=[key])
            b.set(key, "1")
            b.command("delete", key=key)
            a.command("multi")
            a.command("set", key="mark", value="x")
            assert a.command("exec") is None
            a.command("watch", keys=[key])  # nothing deleted since: it runs
            a.command("multi")
            a.command("set", key="mark", value="y")
            assert a.command("exec") is not None
        assert clients[0].get("mark") == b"y"
    finally:
        for c in clients.values():
            c.close()
