"""``python -m bench attack-memory``: what one tenant can make the server hold.

A self-started daemon (durable defaults) is pushed by one tenant, its bucket
at a hard limit (``--hard-limit``, 1,000 units/s: 4 MB/s), while a healthy
tenant, its own user and bucket on its own connection, runs GETs; each part
prints the server's ``RssAnon`` growth over idle (peak while attacked,
and after) and the healthy tenant's rate during the attack over its calm rate:

1. **large writes** — ``--connections`` connections each pipelining
   ``--pipelined`` SETs of ``--value-mib`` MiB (the MessagePack door), all at
   once, for at most ``--seconds``. Writes decoded and not yet durable count against
   ``max_receive_buffer_bytes`` (docs/security.md).
2. **value-returning writes** — RESP ``GETEX`` of one ``--value-mib`` MiB key,
   ``--pipelined-getex`` of them in a pipeline, pipeline after pipeline for
   ``--seconds``: each answer carries the
   value, so each counts as held until it is answered.

Targets (the isolation issue's): growth ≤ 256 MiB, healthy ≥ 80 % of calm.
Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

from bench import options, report, servers
from bench.attack import HEALTHY_TARGET, rss_anon_kib
from bench.loadgen import BenchError

RSS_GROWTH_TARGET_MIB = 256.0
ATTACKER, HEALTHY = "attacker", "healthy"


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--connections", int, 32, "attacking connections")
    options.add(p, "--pipelined", int, 4, "SETs per connection")
    options.add(p, "--value-mib", int, 20, "value size, MiB")
    options.add(p, "--pipelined-getex", int, 100, "GETEX in one pipeline")
    options.add(
        p, "--hard-limit", int, 1000, "the attacking bucket's hard limit, units/s (0: none)"
    )
    options.add(p, "--seconds", float, 20.0, "longest the large writes go on")
    options.add(
        p,
        "--attacker-nice",
        int,
        0,
        "niceness of the attacking process, which shares the server's and the healthy "
        "client's cores (its own CPU is not the server's doing)",
    )
    options.quick_flag(p, "16 connections, 8 MiB values, 10 s")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")


class Healthy:
    """A tenant's GETs in a thread: ops counted in windows while the attack runs."""

    def __init__(self, srv: servers.ServerHandle, password: str) -> None:
        import tenantkv

        self.client = tenantkv.Client(
            srv.host, srv.port, user=HEALTHY, password=password, bucket=HEALTHY, timeout=60
        )
        self.client.set("canary", b"alive")
        self.attacked_cpu = 0.0

    def rate(self, seconds: float) -> float:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            self.client.get("canary")
            n += 1
        return n / seconds

    def cpu_per_get(self, seconds: float, pid: int) -> tuple[float, float]:
        """This tenant's calm rate, and the server's CPU per second meanwhile."""
        cpu0, t0 = _server_cpu(pid), time.monotonic()
        rate = self.rate(seconds)
        return rate, (_server_cpu(pid) - cpu0) / (time.monotonic() - t0)

    def during(self, attack: Callable[[], None], pid: int, nice: int) -> tuple[float, float]:
        """Run ``attack`` in a process of its own (its client's work must not take
        this one's interpreter), at niceness ``nice``; this tenant's rate
        meanwhile, and peak RssAnon."""

        def attacker() -> None:
            if nice:
                os.nice(nice)
            attack()

        proc = mp.get_context("fork").Process(target=attacker)
        proc.start()
        ops, start, peak = 0, time.monotonic(), rss_anon_kib(pid)
        cpu0 = _server_cpu(pid)
        while proc.is_alive():
            self.client.get("canary")
            ops += 1
            if ops % 20 == 0:
                peak = max(peak, rss_anon_kib(pid))
        elapsed = time.monotonic() - start
        self.attacked_cpu = (_server_cpu(pid) - cpu0) / elapsed
        proc.join()
        if proc.exitcode:
            raise BenchError(f"the attack failed (exit status {proc.exitcode})")
        return ops / elapsed, peak / 1024


def _server_cpu(pid: int) -> float:
    """CPU seconds of the server process so far (all its threads)."""
    return servers._proc_cpu(pid) or 0.0


def _prepare(srv: servers.ServerHandle, hard_limit: int) -> str:
    import tenantkv

    assert srv.password is not None
    password = "bench-attack-pw"
    with tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password) as c:
        for name in (ATTACKER, HEALTHY):
            c.create_bucket(name)
            c.create_user(name, password, roles={name: "readwrite"})
        if hard_limit:
            c.set_bucket_throttle(ATTACKER, {"hard_limit": hard_limit})
    return password


def _large_writes(srv: servers.ServerHandle, password: str, args: argparse.Namespace) -> None:
    value = os.urandom(args.value_mib * 1024 * 1024 - 1024)
    until = time.monotonic() + args.seconds

    def one(i: int) -> None:
        # (the attack's time is up, or the server closed a frame held too long)
        with contextlib.suppress(TimeoutError, ConnectionError):
            send_and_wait(i)

    def send_and_wait(i: int) -> None:
        with socket.create_connection((srv.host, srv.port), timeout=120) as s:
            hello = {"user": ATTACKER, "password": password, "bucket": ATTACKER}
            s.sendall(msgpack.packb([0, 0, "hello", hello]))
            frames = [
                msgpack.packb([0, j + 1, "set", {"key": b"k%d-%d" % (i, j), "value": value}])
                for j in range(args.pipelined)
            ]
            # Until every write is answered or the attack's time is up: at the
            # bucket's hard limit, 128 writes of 20 MiB take ~11 minutes.
            s.settimeout(max(0.001, until - time.monotonic()))
            s.sendall(b"".join(frames))
            unpacker, got = msgpack.Unpacker(raw=False), 0
            while got < args.pipelined + 1:
                s.settimeout(max(0.001, until - time.monotonic()))
                data = s.recv(65536)
                if not data:
                    return
                unpacker.feed(data)
                got += sum(1 for _ in unpacker)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(args.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _getex(srv: servers.ServerHandle, password: str, args: argparse.Namespace) -> None:
    import redis

    r = redis.Redis(
        host=srv.host,
        port=srv.resp_port,
        username=f"{ATTACKER}@{ATTACKER}",
        password=password,
        socket_timeout=120,
    )
    until = time.monotonic() + args.seconds
    try:
        while time.monotonic() < until:  # (most are refused: the bucket is at its limit)
            pipe = r.pipeline(transaction=False)
            for _ in range(args.pipelined_getex):
                pipe.execute_command("GETEX", "big")
            pipe.execute(raise_on_error=False)
    finally:
        r.close()


def _part(
    srv: servers.ServerHandle,
    attack: Callable[[str], None],
    setup: Callable[[str], None],
    hard_limit: int,
    nice: int,
) -> dict[str, Any]:
    assert srv.pid is not None
    password = _prepare(srv, hard_limit)
    setup(password)
    healthy = Healthy(srv, password)
    try:
        calm, calm_cpu = healthy.cpu_per_get(2.0, srv.pid)
        idle = rss_anon_kib(srv.pid) / 1024
        under, peak = healthy.during(lambda: attack(password), srv.pid, nice)
        time.sleep(1.0)  # the sweep drops idle decoders
        after = rss_anon_kib(srv.pid) / 1024
        # Calm again after the attack: the reference is the mean of both, so a
        # machine whose load drifts meanwhile moves both sides alike.
        calm_after, calm_cpu_after = healthy.cpu_per_get(2.0, srv.pid)
        calm, calm_cpu = (calm + calm_after) / 2, (calm_cpu + calm_cpu_after) / 2
    finally:
        healthy.client.close()
    fig = {
        "rss_idle_mib": round(idle, 1),
        "rss_growth_peak_mib": round(peak - idle, 1),
        "rss_growth_after_mib": round(after - idle, 1),
        "healthy_calm_ops": round(calm),
        "healthy_under_attack_ops": round(under),
        "healthy_ratio": round(under / calm, 3) if calm else None,
        # The server's CPU share (of one core) calm and attacked: what the attack
        # made the server do, apart from its client's own CPU on shared cores.
        "server_cpu_calm": round(calm_cpu, 3),
        "server_cpu_attacked": round(healthy.attacked_cpu, 3),
    }
    fig["met"] = (
        fig["rss_growth_peak_mib"] <= RSS_GROWTH_TARGET_MIB
        and (fig["healthy_ratio"] or 0) >= HEALTHY_TARGET
    )
    return fig


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.connections, args.value_mib, args.seconds = 16, 8, 10.0
    figures: dict[str, Any] = {}
    report.log("attack-memory: large writes")
    with servers.tenantkv_server() as srv:
        figures["large_writes"] = _part(
            srv,
            lambda pw: _large_writes(srv, pw, args),
            lambda pw: None,
            args.hard_limit,
            args.attacker_nice,
        )

    def big_key(password: str) -> None:
        import tenantkv

        with tenantkv.Client(
            srv.host, srv.port, user=ATTACKER, password=password, bucket=ATTACKER, timeout=60
        ) as c:
            c.set("big", os.urandom(args.value_mib * 1024 * 1024 - 1024))

    report.log("attack-memory: value-returning writes")
    with servers.tenantkv_server() as srv:
        figures["getex"] = _part(
            srv, lambda pw: _getex(srv, pw, args), big_key, args.hard_limit, args.attacker_nice
        )
    print(
        f"{'part':14} {'RssAnon growth peak / after':30} {'healthy during / calm':27}"
        f" {'server CPU calm / attacked':27} met"
    )
    for name, f in figures.items():
        print(
            f"{name:14} {f['rss_growth_peak_mib']:>8} / {f['rss_growth_after_mib']:<8} MiB"
            f"{'':10} {f['healthy_under_attack_ops']:>6} / {f['healthy_calm_ops']:<6} "
            f"= {f['healthy_ratio']:<6} {f['server_cpu_calm']:>8} / {f['server_cpu_attacked']:<16}"
            f" {f['met']}"
        )
    print(f"targets: growth <= {RSS_GROWTH_TARGET_MIB:.0f} MiB, healthy >= {HEALTHY_TARGET}")
    return report.verdict(args, "attack-memory", figures)
