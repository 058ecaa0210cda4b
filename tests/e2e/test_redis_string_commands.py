"""Redis's range, bit, float and keyspace commands through redis-py against a real
daemon with ``--workers 2``: every new write travels to the node's writer as
plain data (``storage/op_wire.py``) and answers as Redis does; SCAN pages with
cursors redis-cli and redis-py parse, to the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tenantkv.server.worker import MAX_WORKERS
from tests.conftest import Daemon

PW = "Secret-Pa55"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("redis-strings")
    daemon = Daemon(base / "data", extra_args=["--workers", "2"]).start()
    with daemon.client() as c:
        c.create_bucket("red")
        c.create_user("alice", PW, roles={"red": "readwrite"})
    yield daemon
    daemon.kill()


@pytest.fixture
def r(d: Daemon) -> Iterator[redis.Redis]:
    c = redis.Redis(host=d.host, port=d.resp_port, username="alice", password=PW, socket_timeout=20)
    c.flushdb()
    yield c
    c.close()


def test_range_and_float_commands(r: redis.Redis) -> None:
    r.set("k", "Hello World")
    assert r.getrange("k", 0, 4) == b"Hello"
    assert r.substr("k", -5, -1) == b"World"
    assert r.setrange("k", 6, "Redis") == 11
    assert r.get("k") == b"Hello Redis"
    assert r.setrange("pad", 3, "x") == 4 and r.get("pad") == b"\0\0\0x"
    with pytest.raises(redis.ResponseError, match="string exceeds maximum allowed size"):
        r.setrange("k", 2**40, "x")
    r.set("f", "10.50")
    assert r.incrbyfloat("f", 0.1) == pytest.approx(10.6)
    assert r.get("f") == b"10.6"
    with pytest.raises(redis.ResponseError, match="value is not a valid float"):
        r.incrbyfloat("k", 1)
    r.mset({"virus1": "ohmytext", "virus2": "mynewtext"})
    assert r.lcs("virus1", "virus2") == b"mytext"
    assert r.lcs("virus1", "virus2", len=True) == 6


def test_bit_commands(r: redis.Redis) -> None:
    assert r.setbit("b", 7, 1) == 0
    assert r.getbit("b", 7) == 1 and r.get("b") == b"\x01"
    r.set("s", "foobar")
    assert r.bitcount("s") == 26
    assert r.bitcount("s", 1, 1) == 6
    assert r.bitpos("s", 1) == 1
    r.set("a", "abcdef")
    assert r.bitop("AND", "dest", "s", "a") == 6
    assert r.get("dest") == b"`bc`ab"
    bf = r.bitfield("bf")
    assert bf.set("i8", 0, -100).get("i8", 0).incrby("u2", 100, 1).execute() == [0, -100, 1]
    assert r.bitfield_ro("bf", "i8", 0) == [-100]
    with pytest.raises(redis.ResponseError, match="bit offset is not an integer"):
        r.setbit("b", -1, 1)


def test_keyspace_commands(r: redis.Redis) -> None:
    r.set("src", "v", px=3_600_000)
    assert r.copy("src", "dst") is True
    assert r.copy("src", "dst") is False
    assert r.pexpiretime("dst") == r.pexpiretime("src") > 0
    assert r.expiretime("dst") == r.pexpiretime("dst") // 1000
    assert r.rename("src", "moved") is True
    assert r.exists("src") == 0 and r.get("moved") == b"v"
    assert r.renamenx("moved", "dst") is False
    with pytest.raises(redis.ResponseError, match="no such key"):
        r.rename("none", "x")
    assert r.touch("moved", "dst", "none") == 2
    assert r.object("encoding", "moved") == b"embstr"
    assert r.randomkey() in (b"moved", b"dst")
    with pytest.raises(redis.ResponseError, match="unknown command 'HSET'"):
        r.hset("h", "f", "v")


def test_scan_iter_with_count_1_reaches_every_key(r: redis.Redis) -> None:
    keys = {b"user:%06d" % i for i in range(2500)}
    for i in range(0, 2500, 500):
        r.mset({k: b"v" for k in sorted(keys)[i : i + 500]})
    cursor, page = r.scan(0, count=10)
    assert 0 < cursor < 2**64 and len(page) == 10
    got = list(r.scan_iter(count=1))
    assert len(got) == len(keys) and set(got) == keys
    assert set(r.scan_iter(match="user:0001*", count=3)) == {
        k for k in keys if k.startswith(b"user:0001")
    }
    assert r.scan(2**64 - 1) == (0, [])
    assert r.keys("user:00000[1-") == [b"user:000001"]


def test_a_scan_continues_on_any_connection_whichever_worker_serves_it(
    d: Daemon, r: redis.Redis
) -> None:
    """With --workers 2 the kernel spreads connections over the workers: a scan
    whose pages go round connections of both workers returns every key once."""
    keys = {b"k:%05d" % i for i in range(300)}
    r.mset({k: b"v" for k in keys})
    conns: list[redis.Redis] = []
    workers: set[int] = set()
    try:
        while len(workers) < 2 or len(conns) < 4:  # (ids carry the worker's index)
            conns.append(redis.Redis(host=d.host, port=d.resp_port, username="alice", password=PW))
            workers.add(int(conns[-1].client_id()) % MAX_WORKERS)
            assert len(conns) < 64, "every connection went to one worker"
        got: list[bytes] = []
        cursor = 0
        for i in range(10_000):
            cursor, page = conns[i % len(conns)].scan(cursor, count=7)
            got += page
            if cursor == 0:
                break
        assert sorted(got) == sorted(keys)
    finally:
        for c in conns:
            c.close()
