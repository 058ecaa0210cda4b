"""Writes in flight cannot overshoot a hard limit (the real daemon, one process and
``--workers 2``).

Connections each keep several 400 KB SETs in flight against a bucket at hard
limit 100 units/s: each write costs ~202 units, two seconds of the limit. They
used to be admitted together while the bucket had any allowance and charged
only once durable, the debt beyond ``throttle_max_request_secs`` forgiven: 7-9x
the limit. Admitted at their known cost, they are charged what the limit allows:
at most ``hard_limit x (T + a slice)`` plus one write (per worker) of overshoot,
which is repaid. Asserted on the units the server charged (its status), not on
wall-clock rates.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from tests.conftest import ADMIN_PASSWORD, Daemon

HARD_LIMIT = 100
VALUE = b"v" * (400 * 1024)
COST = 2 * -(-(len(VALUE) + 64) // 4096)  # write_weight 2: ~202 units
SLICE_UNITS = HARD_LIMIT // 10


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Daemon, int]]:
    workers: int = request.param
    extra = ["--workers", "2"] if workers > 1 else []
    d = Daemon(tmp_path / "data", extra_args=extra).start()
    try:
        yield d, workers
    finally:
        d.kill()


def _connection(d: Daemon) -> tuple[socket.socket, msgpack.Unpacker]:
    """A connection past hello. Its login may be told to come back (retryable: with
    ``--workers 2``, the other worker may be verifying the same pair's login)."""
    for _ in range(50):
        s = socket.create_connection((d.host, d.port), timeout=20)
        hello = {"user": "admin", "password": ADMIN_PASSWORD, "bucket": "w"}
        s.sendall(msgpack.packb([0, 0, "hello", hello]))
        unpacker = msgpack.Unpacker(raw=False)
        try:
            error = _next(s, unpacker)[2]
        except BaseException:
            s.close()
            raise
        if error is None:
            return s, unpacker
        s.close()
        assert "RetryableError" in error["errorLabels"], error  # type: ignore[index]
        time.sleep(error["retryAfterMs"] / 1000)  # type: ignore[index]
    raise AssertionError("no login in 50 tries")


def _next(s: socket.socket, unpacker: msgpack.Unpacker) -> list[object]:
    while True:
        for msg in unpacker:
            return msg  # type: ignore[no-any-return]
        data = s.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        unpacker.feed(data)


def _units(d: Daemon) -> int:
    with d.client() as admin:
        return int(admin.server_status()["throttle"]["buckets"]["w"]["wu_total"]) * 2


def test_writes_in_flight_are_charged_within_the_hard_limit(served: tuple[Daemon, int]) -> None:
    d, workers = served
    with d.client() as admin:
        admin.create_bucket("w")
        admin.set_bucket_throttle("w", {"hard_limit": HARD_LIMIT})
    stop = threading.Event()
    acked = [0]
    lock = threading.Lock()
    socks: list[socket.socket] = []

    def writer(i: int) -> None:
        s, unpacker = _connection(d)
        with lock:
            socks.append(s)
        try:
            for j in range(4):  # four in flight
                s.sendall(msgpack.packb([0, j + 1, "set", {"key": b"k%d" % j, "value": VALUE}]))
            n = 4
            while not stop.is_set():
                msg = _next(s, unpacker)
                if msg[2] is None:
                    with lock:
                        acked[0] += 1
                n += 1
                s.sendall(msgpack.packb([0, n, "set", {"key": b"k%d" % (n % 8), "value": VALUE}]))
        except OSError:
            pass
        finally:
            s.close()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(2.5)
    units = _units(d)
    elapsed = time.monotonic() - start
    stop.set()
    with lock:
        for s in socks:  # a writer may be waiting for a parked write's answer
            s.shutdown(socket.SHUT_RDWR)
    for t in threads:
        t.join(timeout=10)
    # At most the limit over the time, one slice of burst and one write's overshoot
    # per process admitting (each worker's counter holds its share of the limit).
    bound = HARD_LIMIT * elapsed + workers * (SLICE_UNITS + COST)
    assert units <= bound, (units, bound)
    assert units >= COST  # and the bucket does get to write
    assert acked[0] * COST <= bound
