"""Crash safety of the real daemon: SIGKILL at random moments, and SIGTERM under load.

Writers are threads with the blocking client, each writing keys that name the
cycle, the writer and a sequence number, with values derived from the key
(so a value identifies its write). Every write is recorded as *acknowledged*
(the call returned) or *unknown* (sent, and the connection died first). After
each restart:

- every acknowledged write is present with exactly its value;
- every unknown write is wholly present (exactly its value) or absent;
- each writer's counter (``incr``) lies between its acknowledged and its sent
  increments.

The daemon starts with a 1 MiB map, so the map also grows while it is killed.
``CRASH_SEED`` (environment) replays a failing run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tenantkv import errors
from tests.conftest import Daemon, read_response, wait_until

SEED = int(os.environ.get("CRASH_SEED", "20261108"))
#: Each cycle is the same path (load, SIGKILL, restart, check); more cycles are
#: more random moments, which ``python -m bench crash`` runs by the hundred. With
#: the default seed the 5 cycles of ``--workers 2`` kill a worker 4 times and the
#: supervisor once, and the 1-process map grows past its 1 MiB start either way.
CYCLES = int(os.environ.get("CRASH_CYCLES", "5"))
WRITERS = 4
BUCKET = "crash"
USER, PASSWORD = "writer", "writer-pw"
TIMEOUT = 20


def value_for(key: bytes, size: int) -> bytes:
    """A value that names its key (so its write), ``size`` bytes long."""
    head = key + b"|"
    body = hashlib.blake2b(key).digest()
    return (head + body * (size // len(body) + 1))[: max(size, len(head))]


@dataclass
class Ledger:
    """What one writer knows about its writes."""

    acked: dict[bytes, bytes] = field(default_factory=dict)
    unknown: dict[bytes, bytes] = field(default_factory=dict)
    counter: bytes = b""
    counter_base_acked: bool = False
    incr_acked: int = 0
    incr_sent: int = 0
    errors: list[str] = field(default_factory=list)


def run_writer(
    d: Daemon, cycle: int, wid: int, seed: int, stop: threading.Event, led: Ledger
) -> None:
    rng = random.Random(seed)
    c = _log_in(d, stop, led)
    if c is None:
        return
    n = 0
    led.counter = f"ctr:c{cycle}:w{wid}".encode()

    def next_write() -> tuple[bytes, bytes]:
        nonlocal n
        n += 1
        key = f"c{cycle}:w{wid}:n{n}".encode()
        size = rng.choice((16, 100, 700, 4000)) if rng.random() < 0.95 else 30_000
        return key, value_for(key, size)

    try:
        with c:
            led.unknown[led.counter] = b"0"
            c.set(led.counter, b"0")
            led.counter_base_acked = True
            del led.unknown[led.counter]
            while not stop.is_set():
                r = rng.random()
                if r < 0.5:  # one durable write
                    key, value = next_write()
                    led.unknown[key] = value
                    c.set(key, value)
                    led.acked[key] = led.unknown.pop(key)
                elif r < 0.8:  # a pipeline: one write of many requests, one group commit
                    batch = [next_write() for _ in range(rng.randint(2, 60))]
                    led.unknown.update(batch)
                    with c.pipeline() as p:
                        for key, value in batch:
                            p.set(key, value)
                    for key, _ in batch:
                        led.acked[key] = led.unknown.pop(key)
                else:  # a read-modify-write on the server
                    led.incr_sent += 1
                    c.incr(led.counter)
                    led.incr_acked += 1
    except errors.TenantKVError as exc:
        led.errors.append(repr(exc))


def _log_in(d: Daemon, stop: threading.Event, led: Ledger) -> Any:
    """The writer's client, or None once the cycle stops first. A login the node
    refuses for now (its hashing pool busy with the other writers' logins, a
    worker restarting) is tried again: on a loaded machine that is where a cycle's
    writers may still be when the moment to kill comes."""
    while True:
        try:
            return d.client(user=USER, password=PASSWORD, bucket=BUCKET, timeout=10)
        except errors.TenantKVError as exc:  # killed before we got in, or busy
            again = isinstance(exc, errors.ConnectFailed) or exc.has_label(errors.RETRYABLE)
            if not again or stop.is_set():
                led.errors.append(repr(exc))
                return None
            time.sleep(0.02)


def _writing(ledgers: list[Ledger], threads: list[threading.Thread]) -> bool:
    """Has every writer had a write acknowledged (or ended)? The load is then on."""
    return all(led.acked or not t.is_alive() for led, t in zip(ledgers, threads, strict=True))


def read_all(c: object, keys: list[bytes]) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for i in range(0, len(keys), 200):
        chunk = keys[i : i + 200]
        out.update(zip(chunk, c.mget(chunk), strict=True))  # type: ignore[attr-defined]
    return out


def verify(d: Daemon, ledgers: list[Ledger]) -> tuple[int, int]:
    """Check the invariants; returns (acknowledged, unknown) write counts."""
    acked = {k: v for led in ledgers for k, v in led.acked.items()}
    unknown = {k: v for led in ledgers for k, v in led.unknown.items()}
    with d.client(user=USER, password=PASSWORD, bucket=BUCKET, timeout=TIMEOUT) as c:
        stored = read_all(c, [*acked, *unknown])
        for key, value in acked.items():
            got = stored[key]
            assert got == value, f"acknowledged {key!r} lost or changed: {got!r:.80}"
        for key, value in unknown.items():
            got = stored[key]
            assert got is None or got == value, f"partial or foreign {key!r}: {got!r:.80}"
        for led in ledgers:
            if not led.counter:
                continue
            got = c.get(led.counter)
            if got is None:
                assert not led.counter_base_acked, f"acknowledged counter {led.counter!r} lost"
                continue
            assert led.incr_acked <= int(got) <= led.incr_sent, (led.counter, got, led)
    return len(acked), len(unknown)


@pytest.fixture(params=[1, 2], ids=["1-process", "2-workers"])
def crash_daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("[server]\nmap_size_mb = 1\n")
    extra = ["--config", str(cfg), "--workers", str(request.param)]
    d = Daemon(tmp_path / "data", extra_args=extra).start()
    with d.client() as c:
        c.create_bucket(BUCKET)
        c.create_user(USER, PASSWORD, roles={BUCKET: "readwrite"})
    yield d
    d.kill()


def _worker_pids(d: Daemon) -> list[int]:
    with d.client() as c:
        return [w["pid"] for w in c.server_status().get("workers", [])]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _sigkill_a_process(d: Daemon, rng: random.Random, workers: list[int]) -> None:
    """One process, without a word: the single server; with workers, one of
    them (the supervisor restarts it) or the supervisor (the workers stop)."""
    victim = rng.choice(["supervisor", *workers]) if workers else "supervisor"
    if victim == "supervisor":
        d.stop(signal.SIGKILL)
        wait_until(lambda: all(_gone(p) for p in workers), timeout=TIMEOUT, what="workers gone")
        d.start()
    else:
        assert isinstance(victim, int)
        os.kill(victim, signal.SIGKILL)
        wait_until(
            lambda: (p := _worker_pids(d)) and len(p) == len(workers) and victim not in p,
            timeout=TIMEOUT,
            what="the worker restarted",
        )


def test_sigkill_at_random_moments_loses_nothing_acknowledged(crash_daemon: Daemon) -> None:
    d = crash_daemon
    rng = random.Random(SEED)
    multi = "--workers" in d.extra_args and d.extra_args[-1] != "1"
    history: list[Ledger] = []
    totals = [0, 0]
    for cycle in range(CYCLES):
        workers = _worker_pids(d) if multi else []
        stop = threading.Event()
        ledgers = [Ledger() for _ in range(WRITERS)]
        threads = [
            threading.Thread(
                target=run_writer,
                args=(d, cycle, w, rng.randrange(2**32), stop, ledgers[w]),
                daemon=True,
            )
            for w in range(WRITERS)
        ]
        for t in threads:
            t.start()
        # The scenario: SIGKILL at a random moment of the load (seeded, so CI
        # repeats the same moments), counted from when every writer is writing:
        # a loaded machine may take longer than the moment to log them in.
        writing = functools.partial(_writing, ledgers, threads)
        wait_until(writing, timeout=TIMEOUT, what="the writers writing")
        time.sleep(rng.uniform(0.1, 0.7))
        if multi:
            _sigkill_a_process(d, rng, workers)
            stop.set()
        else:
            d.stop(signal.SIGKILL)
            stop.set()
        for t in threads:
            t.join(TIMEOUT)
            assert not t.is_alive()
        if not multi:
            d.start()
        a, u = verify(d, ledgers)
        assert a > 0, f"cycle {cycle}: nothing was acknowledged: {[x.errors for x in ledgers]}"
        totals[0] += a
        totals[1] += u
        history += ledgers
    # A later crash must not have lost an earlier cycle's writes either.
    verify(d, history)
    with d.client() as c:
        st = c.server_status()["storage"]
    if not multi:  # (workers map one fixed size from the start: nothing grows)
        assert st["map_size_bytes"] > 1024 * 1024  # the map grew during the cycles
    print(f"crash: {CYCLES} SIGKILL cycles, {totals[0]} acknowledged, {totals[1]} unknown")


# -- SIGTERM -----------------------------------------------------------------------


@dataclass
class TermLedger:
    acked: dict[bytes, bytes] = field(default_factory=dict)
    refused: dict[bytes, bytes] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)


def term_writer(d: Daemon, wid: int, pipelined: bool, go: threading.Event, led: TermLedger) -> None:
    n = 0
    with d.client(
        user=USER, password=PASSWORD, bucket=BUCKET, timeout=TIMEOUT, max_overload_retries=0
    ) as c:
        go.set()
        while True:
            batch = []
            for _ in range(40 if pipelined else 1):
                n += 1
                key = f"t:w{wid}:n{n}".encode()
                batch.append((key, value_for(key, 200)))
            try:
                if pipelined:
                    p = c.pipeline(raise_on_error=False)
                    for key, value in batch:
                        p.set(key, value)
                    results = p.execute()
                else:
                    try:
                        c.set(*batch[0])
                        results: list[object] = [None]
                    except errors.ShuttingDown as exc:
                        results = [exc]
            except errors.TenantKVError as exc:
                led.other.append(repr(exc))
                return
            done = False
            for (key, value), r in zip(batch, results, strict=True):
                if isinstance(r, errors.ShuttingDown):
                    assert r.has_label(errors.RETRYABLE) and not r.has_label(
                        errors.SYSTEM_OVERLOADED
                    )
                    led.refused[key] = value
                    done = True
                elif isinstance(r, BaseException):
                    led.other.append(repr(r))
                    done = True
                else:
                    led.acked[key] = value
            if done:
                return


def test_sigterm_under_load_completes_or_refuses_in_flight_requests(tmp_path: Path) -> None:
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("[server]\nshutdown_grace_secs = 5.0\n")
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        with d.client() as c:
            c.create_bucket(BUCKET)
            c.create_user(USER, PASSWORD, roles={BUCKET: "readwrite"})
        ledgers = [TermLedger() for _ in range(6)]
        started = [threading.Event() for _ in ledgers]
        threads = [
            threading.Thread(target=term_writer, args=(d, w, w % 2 == 1, started[w], led))
            for w, led in enumerate(ledgers)
        ]
        for t in threads:
            t.start()
        for ev in started:
            assert ev.wait(TIMEOUT)
        # A connection that keeps talking holds the server in its drain, so we can
        # see what a new connection and a late request get meanwhile.
        with socket.create_connection((d.host, d.port), timeout=TIMEOUT) as chatty:
            chatty.sendall(
                msgpack.packb(
                    [0, 1, "hello", {"user": USER, "password": PASSWORD, "bucket": BUCKET}]
                )
            )
            assert read_response(chatty)[2] is None  # type: ignore[index]
            # Writes in flight when the signal comes: wait until some were answered.
            wait_until(lambda: sum(len(led.acked) for led in ledgers) >= 60, TIMEOUT, "writes")
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
            # Part of the scenario, not a wait for something: a second SIGTERM right
            # after the first, as an impatient supervisor sends; still graceful.
            time.sleep(0.05)
            d.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + TIMEOUT
            while any(t.is_alive() for t in threads):  # keep chatty talking meanwhile
                assert time.monotonic() < deadline, "writers did not finish"
                chatty.sendall(msgpack.packb([0, 3, "ping", {}]))
                pong = read_response(chatty)
                assert pong is not None and pong[1] == 3
                time.sleep(0.05)
            chatty.sendall(msgpack.packb([0, 2, "set", {"key": b"late", "value": b"x"}]))
            late = read_response(chatty)
            assert late is not None and late[1] == 2 and late[2]["codeName"] == "ShuttingDown"
            assert late[2]["errorLabels"] == ["RetryableError"]
            with pytest.raises(errors.ShuttingDown):  # a new connection is told why
                d.client(user=USER, password=PASSWORD, bucket=BUCKET, max_overload_retries=0)
        assert d.proc.wait(TIMEOUT) == 0
        assert "storage closed" in d.log() and "received SIGTERM again" in d.log()
        for led in ledgers:
            assert led.other == [], led.other  # nothing lost its connection unanswered
            assert led.acked or led.refused
        assert any(led.refused for led in ledgers)
        d.start()
        with d.client(user=USER, password=PASSWORD, bucket=BUCKET) as c:
            acked = {k: v for led in ledgers for k, v in led.acked.items()}
            refused = [k for led in ledgers for k in led.refused]
            stored = read_all(c, [*acked, *refused, b"late"])
            for key, value in acked.items():
                assert stored[key] == value, key
            for key in [*refused, b"late"]:
                assert stored[key] is None, f"{key!r} got ShuttingDown yet was written"
    finally:
        d.kill()
