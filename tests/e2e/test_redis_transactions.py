"""Transactions on the RESP door, driven by redis-py (sync and asyncio, RESP2 and
RESP3) against the real daemon: MULTI/EXEC atomicity, queue-time errors
(EXECABORT), runtime errors, WATCH conflicts from another connection, bounds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import trio

from tests.conftest import Daemon
from tests.e2e.test_redis import raw

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


def connect(d: Daemon, user: str = "alice", **kw: Any) -> redis.Redis:
    return redis.Redis(
        host=d.host, port=d.resp_port, username=user, password=PW, socket_timeout=20, **kw
    )


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
