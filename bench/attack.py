"""``python -m bench attack``: the pre-auth and connection-table attacks, measured.

A self-started daemon (durable defaults, temporary data directory) is attacked
from raw sockets on loopback while a healthy client on its own connection
runs GETs; each part prints its figures against the targets of the security
issue (docs/security.md lists the limits involved):

1. **pre-auth flood** — ``--flooders`` processes each open connection after
   connection and send, before ``hello``, a 20 MiB frame of nested empty arrays,
   a hello whose parameters nest, and a ``bin32`` header announcing 4 GiB followed
   by data. Target: the server's ``RssAnon`` grows ≤ 64 MiB and the healthy
   client keeps ≥ 80 % of its calm GET rate.
2. **idle connections** — ``--idle`` connections that never send a byte, spread
   over loopback addresses (``max_connections_per_address`` caps any one), then
   as many that said ``hello`` and went quiet. Target: ≤ 16 KiB ``RssAnon`` per
   connection; the admin logs in within 1 s while the table is full.
3. **churn** — connect/close cycles (half of them after ``hello``): ``RssAnon``
   after ``--churn`` cycles is within 10 % of what it was after a tenth of them.

Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import socket
import time
from collections.abc import Iterator
from typing import Any

import msgpack

from bench import options, report, servers
from bench.loadgen import BenchError

RSS_GROWTH_TARGET_MB = 64.0
#: a healthy tenant's rate under attack / calm, at least (every attack benchmark's)
HEALTHY_TARGET = 0.80
IDLE_TARGET_KIB = 16.0
ADMIN_LOGIN_TARGET_S = 1.0
CHURN_TARGET_PCT = 10.0
#: connections per source address in the idle part (under the per-address cap)
PER_ADDRESS = 900


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--seconds", float, 10.0, "flood duration")
    options.add(p, "--flooders", int, 2, "flooding processes")
    options.add(p, "--rate", float, 50.0, "attack connections a second per flooder")
    options.add(p, "--idle", int, 10_000, "idle connections")
    options.add(p, "--churn", int, 100_000, "connect/close cycles")
    options.quick_flag(p, "3 s flood, 2000 idle, 10000 cycles")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")


def rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise BenchError("no RssAnon in /proc status")


def _hello(password: str, **extra: Any) -> bytes:
    return msgpack.packb([0, 0, "hello", {"user": "admin", "password": password, **extra}])


def _flood(host: str, port: int, until: float, rate: float, counts: Any) -> None:
    """One flooding process: the three pre-auth payloads, round-robin, ``rate``
    connections a second until ``until`` (paced: this measures what a frame costs
    the server, not a connection storm, which the establishment limiter handles)."""
    nested = b"\xdd" + (100_000).to_bytes(4, "big") + b"\x90" * (20 * 1024 * 1024)
    deep = b"\x94\x00\x00\xa5hello\x81\xa4user" + b"\x91" * 100_000
    announce = b"\x94\x00\x00\xa5hello\x81\xa4user\xc6\xff\xff\xff\xff" + b"a" * (1 << 20)
    payloads = (nested, deep, announce)
    i = 0
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        if i > (now - start) * rate:
            time.sleep(min(0.01, until - now))
            continue
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                with contextlib.suppress(OSError):
                    s.sendall(payloads[i % 3])
                with contextlib.suppress(OSError):
                    while s.recv(65536):
                        pass
        except OSError:
            pass
        i += 1
    counts.value += i


def under_attack(client: Any, pid: int, until: float, peak: int) -> tuple[list[float], int]:
    """The healthy client's rate every 0.5 s until ``until``, and the server's
    highest RssAnon (KiB) seen meanwhile (from ``peak``)."""
    rates: list[float] = []
    while time.monotonic() < until:
        rates.append(healthy_rate(client, 0.5))
        peak = max(peak, rss_anon_kib(pid))
    return rates, peak


def healthy_rate(client: Any, seconds: float) -> float:
    """GETs of ``canary`` a second a client gets through in ``seconds``."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        client.get("canary")
        n += 1
    return n / seconds


def part_flood(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    import tenantkv

    assert srv.pid is not None and srv.password is not None
    with tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password) as c:
        c.create_bucket("healthy")
        c.select_bucket("healthy")
        c.set("canary", b"alive")
        calm = healthy_rate(c, min(3.0, args.seconds))
        before = rss_anon_kib(srv.pid)
        peak = before
        counts = mp.Value("q", 0)
        until = time.monotonic() + args.seconds
        procs = [
            mp.Process(target=_flood, args=(srv.host, srv.port, until, args.rate, counts))
            for _ in range(args.flooders)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)  # let the flood start before measuring
        rates, peak = under_attack(c, srv.pid, until - 0.5, peak)
        for p in procs:
            p.join(30)
        under = sum(rates) / len(rates) if rates else 0.0
    growth_mb = (peak - before) / 1024
    fig = {
        "attack_connections": counts.value,
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_growth_mib": round(growth_mb, 1),
        "healthy_calm_ops": round(calm),
        "healthy_under_flood_ops": round(under),
        "healthy_ratio": round(under / calm, 3) if calm else None,
    }
    fig["met"] = growth_mb <= RSS_GROWTH_TARGET_MB and (fig["healthy_ratio"] or 0) >= HEALTHY_TARGET
    return fig


def _open_idle(srv: servers.ServerHandle, n: int, first: bytes | None) -> list[socket.socket]:
    socks = []
    for i in range(n):
        s = socket.create_connection(
            (srv.host, srv.port), timeout=30, source_address=(f"127.0.0.{2 + i // PER_ADDRESS}", 0)
        )
        if first is not None:
            s.sendall(first)
        socks.append(s)
    if first is not None:
        for s in socks:
            s.recv(4096)  # the hello reply
    return socks


@contextlib.contextmanager
def _idle_connections(srv: servers.ServerHandle, n: int, first: bytes | None) -> Iterator[float]:
    """``n`` idle connections (sending ``first``, if given, then nothing); yields the
    server's RssAnon growth per connection, in KiB, once they are all open."""
    import tenantkv

    assert srv.pid is not None and srv.password is not None
    with tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password) as c:
        c.command("set_parameter", name="max_connections", value=n + 10)
    time.sleep(0.5)
    before = rss_anon_kib(srv.pid)
    socks = _open_idle(srv, n, first)
    try:
        time.sleep(1.0)
        yield round((rss_anon_kib(srv.pid) - before) / n, 1)
    finally:
        for s in socks:
            s.close()


def part_idle(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    """Idle connections that never said hello, then (on a fresh server, so freed
    memory does not flatter them) as many that did."""
    import tenantkv

    assert srv.password is not None
    fig: dict[str, Any] = {"connections": args.idle}
    with _idle_connections(srv, args.idle, None) as kib:
        fig["unauthenticated_kib_per_connection"] = kib
        time.sleep(1.1)  # older than EVICTABLE_AFTER_SECS: evictable
        start = time.monotonic()
        with tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password) as c:
            c.ping()
        fig["admin_login_secs_table_full"] = round(time.monotonic() - start, 3)
    with servers.tenantkv_server() as fresh:
        assert fresh.password is not None
        with _idle_connections(fresh, args.idle, _hello(fresh.password)) as kib:
            fig["authenticated_kib_per_connection"] = kib
    worst = max(fig["unauthenticated_kib_per_connection"], fig["authenticated_kib_per_connection"])
    fig["met"] = (
        worst <= IDLE_TARGET_KIB and fig["admin_login_secs_table_full"] < ADMIN_LOGIN_TARGET_S
    )
    return fig


def part_churn(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    assert srv.pid is not None and srv.password is not None
    hello = _hello(srv.password)
    marks = (args.churn // 10, args.churn)
    rss: list[int] = []
    n = 0
    start = time.monotonic()
    for target in marks:
        while n < target:
            batch = []
            for _ in range(100):
                s = socket.create_connection((srv.host, srv.port), timeout=30)
                if n % 2:
                    s.sendall(hello)
                batch.append(s)
                n += 1
            for s in batch:
                s.close()
        time.sleep(1.0)  # the server closes its side
        rss.append(rss_anon_kib(srv.pid))
    growth = (rss[1] - rss[0]) / rss[0] * 100
    return {
        "cycles": list(marks),
        "rss_mib": [round(r / 1024, 1) for r in rss],
        "growth_pct": round(growth, 1),
        "cycles_per_sec": round(n / (time.monotonic() - start)),
        "met": growth <= CHURN_TARGET_PCT,
    }


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.seconds, args.idle, args.churn = 3.0, 2000, 10_000
    figures: dict[str, Any] = {}
    # A fresh server per measurement: memory one part freed would hide the next's.
    for name, part in (("flood", part_flood), ("idle", part_idle), ("churn", part_churn)):
        report.log(f"attack: {name}")
        with servers.tenantkv_server() as srv:
            figures[name] = part(srv, args)
    f, i, c = figures["flood"], figures["idle"], figures["churn"]
    rows = [
        ("pre-auth flood: RssAnon growth", f"{f['rss_growth_mib']} MiB", "<= 64 MiB"),
        (
            "pre-auth flood: healthy client",
            f"{f['healthy_under_flood_ops']} / {f['healthy_calm_ops']} ops/s "
            f"= {f['healthy_ratio']}",
            ">= 0.80",
        ),
        (
            "idle connection, no hello",
            f"{i['unauthenticated_kib_per_connection']} KiB",
            "<= 16 KiB",
        ),
        (
            "idle connection, after hello",
            f"{i['authenticated_kib_per_connection']} KiB",
            "<= 16 KiB",
        ),
        ("admin login, table full", f"{i['admin_login_secs_table_full']} s", "< 1 s"),
        (
            f"churn: RssAnon after {c['cycles'][0]} / {c['cycles'][1]} cycles",
            f"{c['rss_mib'][0]} / {c['rss_mib'][1]} MiB ({c['growth_pct']:+} %)",
            "<= +10 %",
        ),
    ]
    print(report.columns([("figure", "measured", "target"), *rows], (46, 34)))
    return report.verdict(args, "attack", figures)
