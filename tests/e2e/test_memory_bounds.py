"""What clients can make the server hold, end to end: large pipelined writes from
many connections stay within the node-wide cap while they are in flight, and
the memory goes back to the kernel once they are answered."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from tests.conftest import ADMIN_PASSWORD, Daemon, read_response, rss_anon_mb, wait_until

CAP_MIB = 32
CONNECTIONS = 16
PIPELINED = 4
VALUE_MIB = 4


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[Daemon]:
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text(
        f"[server]\nmax_receive_buffer_bytes = {CAP_MIB * 1024 * 1024}\ndurability = 'nosync'\n"
    )
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    with d.client() as c:
        c.create_bucket("big")
    yield d
    d.kill()


def _pipeline_writes(d: Daemon, i: int, value: bytes, answers: list[int]) -> None:
    with socket.create_connection((d.host, d.port), timeout=60) as s:
        hello = {"user": "admin", "password": ADMIN_PASSWORD, "bucket": "big"}
        s.sendall(msgpack.packb([0, 0, "hello", hello]))
        assert read_response(s)[2] is None
        s.sendall(
            b"".join(
                msgpack.packb([0, j + 1, "set", {"key": b"k%d-%d" % (i, j), "value": value}])
                for j in range(PIPELINED)
            )
        )
        unpacker = msgpack.Unpacker(raw=False)
        got = 0
        while got < PIPELINED:
            data = s.recv(65536)
            assert data, "closed before every write was answered"
            unpacker.feed(data)
            for resp in unpacker:
                assert resp[2] is None, resp[2]
                got += 1
        answers.append(got)


def test_pipelined_large_writes_stay_within_the_cap_and_memory_goes_back(
    capped: Daemon,
) -> None:
    """16 connections x 4 pipelined 4 MiB writes (256 MiB) against a 32 MiB cap.
    Counting only undecoded bytes, each connection held up to 64 MiB of decoded
    values waiting for their commit (the whole 256 MiB at once); and the C
    allocator kept what they used after they were answered."""
    assert capped.proc is not None
    pid = capped.proc.pid
    idle = rss_anon_mb(pid)
    value = os.urandom(VALUE_MIB * 1024 * 1024 - 256)
    peak = [idle]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_anon_mb(pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    answers: list[int] = []
    try:
        writers = [
            threading.Thread(target=_pipeline_writes, args=(capped, i, value, answers))
            for i in range(CONNECTIONS)
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join(120)
    finally:
        done.set()
        watcher.join()
    assert answers == [PIPELINED] * CONNECTIONS
    # The deadline sweep lets idle decoders go: wait for it (the assert below
    # says what is wrong if it never does).
    with contextlib.suppress(AssertionError):
        wait_until(lambda: rss_anon_mb(pid) - idle < 32, timeout=10, what="decoders freed")
    after = rss_anon_mb(pid)
    print(f"memory bounds: idle {idle:.0f} MiB, peak {peak[0]:.0f}, after {after:.0f}")
    # The cap, a value's copy in its commit, and a receive per connection.
    assert peak[0] - idle < 4 * CAP_MIB + CONNECTIONS * 0.5 + 32
    assert after - idle < 32
