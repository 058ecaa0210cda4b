"""``python -m bench attack-login``: wrong passwords against the login limiter, measured.

A self-started daemon (durable defaults, temporary data directory) is attacked
with wrong passwords from loopback addresses while other users log in and a
healthy tenant runs GETs; each part prints its figures against the targets of
the isolation issue (rules in docs/security.md, "Logins"):

a. **redis-py** — one ``redis.Redis(password=wrong).ping()`` (redis-py retries
   a failed AUTH), then a user who never logged in from that address logs in,
   over RESP and MessagePack. Target: < 200 ms each, while the guesser waits.
b. **admin slots** — 1,000 idle authenticated connections of a tenant from the
   admin's address (``max_connections_per_address``), then the admin's hello.
   Target: it succeeds, < 1 s.
c. **many addresses** — 60 addresses (127.0.0.x) x 10 concurrent wrong
   passwords, retried as their ``retryAfterMs`` hints say for ``--seconds``.
   Targets: the server's RssAnon, once the last held failures are answered,
   < 32 MiB above where it started (the peak is printed too), a real user's
   login (known at its address, credential not cached) < 200 ms, the healthy
   tenant ≥ 80 % of its calm GET rate. The attacking process shares the
   server's cores; ``--attacker-nice`` lowers its priority.
d. **same address** — another tenant at the user's address sends 1,000 wrong
   passwords (40 at a time); the user logs in with the right one. Target: < 200 ms.
e. **--workers 2** — 300 concurrent wrong logins from one address. Target: at
   most 10 reach scrypt (``authentication.hashes`` in ``server_status``).

Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import threading
import time
from typing import Any

import msgpack

from bench import options, report, servers
from bench.attack import HEALTHY_TARGET, healthy_rate, rss_anon_kib

LOGIN_TARGET_S = 0.200
ADMIN_TARGET_S = 1.0
RSS_TARGET_MIB = 32.0
HASHES_TARGET = 10


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--seconds", float, 10.0, "part c's attack")
    options.quick_flag(p, "part c for 4 s")
    options.add(p, "--only", None, "abcde", "the parts to run, e.g. 'ce'")
    options.add(
        p,
        "--attacker-nice",
        int,
        0,
        "niceness of part c's attacking process, which shares the server's cores "
        "here (a remote attacker would not)",
    )
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")


def _hello(user: str, password: str, **extra: Any) -> bytes:
    return msgpack.packb([0, 0, "hello", {"user": user, "password": password, **extra}])


def _answer(s: socket.socket) -> Any:
    u = msgpack.Unpacker(raw=False)
    while True:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("closed before answering")
        u.feed(data)
        for msg in u:
            return msg


def _login(host: str, port: int, user: str, password: str, bucket: str | None, src: str) -> Any:
    """One hello on a new connection from ``src``: its error map (None: success)."""
    with socket.create_connection((host, port), timeout=30, source_address=(src, 0)) as s:
        s.sendall(_hello(user, password, **({"bucket": bucket} if bucket else {})))
        return _answer(s)[2]


def _timed_login(srv: servers.ServerHandle, user: str, password: str, bucket: str) -> float:
    start = time.monotonic()
    err = _login(srv.host, srv.port, user, password, bucket, "127.0.0.1")
    if err is not None:
        raise RuntimeError(f"{user}'s login failed: {err}")
    return time.monotonic() - start


def _admin(srv: servers.ServerHandle) -> Any:
    import tenantkv

    assert srv.password is not None
    return tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password)


def _setup(srv: servers.ServerHandle, users: dict[str, str]) -> None:
    """A bucket per user, each its own tenant."""
    with _admin(srv) as c:
        for user, password in users.items():
            c.create_bucket(user)
            c.create_user(user, password, roles={user: "readwrite"})


# -- a. redis-py with a wrong password -----------------------------------------------


def part_redis(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    import redis

    _setup(srv, {"alice": "pw-alice", "bob": "pw-bob"})
    guesser = redis.Redis(
        srv.host, srv.resp_port, username="alice", password="wrong", socket_timeout=30
    )
    outcome: list[str] = []

    def guess() -> None:
        try:
            guesser.ping()
        except redis.RedisError as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=guess, daemon=True)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)  # a few AUTHs failed, the next being held
    start = time.monotonic()
    bob = redis.Redis(srv.host, srv.resp_port, username="bob", password="pw-bob")
    bob.ping()
    resp_s = time.monotonic() - start
    bob.close()
    msgpack_s = _timed_login(srv, "bob", "pw-bob", "bob")
    t.join(60)
    with _admin(srv) as c:
        failures = c.server_status()["authentication"]["failures"]
    return {
        "other_user_resp_login_secs": round(resp_s, 3),
        "other_user_msgpack_login_secs": round(msgpack_s, 3),
        "guesser_failed_auths": failures,
        "guesser_gave_up_after_secs": round(time.monotonic() - t0, 1) if outcome else None,
        "met": max(resp_s, msgpack_s) < LOGIN_TARGET_S,
    }


# -- b. the admin's slots at its address ----------------------------------------------


def part_admin(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    assert srv.password is not None
    _setup(srv, {"tenant": "pw-tenant"})
    with _admin(srv) as c:
        per_address = c.command("get_parameter", name="max_connections_per_address")
    per_address = int(per_address["value"])
    hello = _hello("tenant", "pw-tenant", bucket="tenant")
    socks = []
    try:
        for _ in range(per_address):
            s = socket.create_connection((srv.host, srv.port), timeout=30)
            s.sendall(hello)
            socks.append(s)
        ok = sum(_answer(s)[2] is None for s in socks)
        start = time.monotonic()
        err = _login(srv.host, srv.port, "admin", srv.password, None, "127.0.0.1")
        secs = time.monotonic() - start
        refused = _login(srv.host, srv.port, "tenant", "pw-tenant", "tenant", "127.0.0.1")
    finally:
        for s in socks:
            s.close()
    return {
        "idle_authenticated": ok,
        "admin_hello_secs": round(secs, 3),
        "admin_hello_error": err,
        "tenant_beyond_cap": (refused or {}).get("codeName"),
        "met": ok == per_address and err is None and secs < ADMIN_TARGET_S,
    }


# -- c. 60 addresses x 10 wrong passwords ---------------------------------------------


def _guessers(
    host: str, port: int, sources: list[str], per_source: int, until: float, out: Any, nice: int
) -> None:
    """The attacking process: ``per_source`` concurrent guessers per address, each
    guessing, waiting its answer, and after a refusal its ``retryAfterMs``."""
    import trio

    if nice:
        os.nice(nice)
    counts = {"failed": 0, "refused": 0, "errors": 0}

    async def guesser(src: str, n: int) -> None:
        i = 0
        while trio.current_time() < until:
            i += 1
            try:
                stream = await trio.open_tcp_stream(host, port, local_address=src)
            except OSError:
                counts["errors"] += 1
                await trio.sleep(0.1)
                continue
            async with stream:
                await stream.send_all(_hello(f"user{n}", f"guess-{src}-{n}-{i}"))
                u = msgpack.Unpacker(raw=False)
                err: Any = None
                while err is None:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    u.feed(data)
                    for msg in u:
                        err = msg[2] or {}
                        break
            code = (err or {}).get("codeName")
            if code == "AuthenticationFailed":
                counts["failed"] += 1
            elif code == "TooManyLoginFailures":
                counts["refused"] += 1
                await trio.sleep(err.get("retryAfterMs", 100) / 1000)
            else:
                counts["errors"] += 1

    async def main() -> None:
        nonlocal until
        until = trio.current_time() + (until - time.monotonic())
        async with trio.open_nursery() as nursery:
            for src in sources:
                for n in range(per_source):
                    nursery.start_soon(guesser, src, n)

    trio.run(main)
    out.put(counts)


def _fresh_login(srv: servers.ServerHandle, admin: Any, user: str, password: str) -> float:
    """A login that needs scrypt: the password set again empties the server's
    cache of verified credentials (the pair stays known-good)."""
    admin.command("update_user", name=user, password=password)
    return _timed_login(srv, user, password, user)


def part_addresses(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    import tenantkv

    assert srv.pid is not None
    _setup(srv, {"healthy": "pw-healthy", "alice": "pw-alice"})
    _timed_login(srv, "alice", "pw-alice", "alice")  # alice's address is known-good
    with (
        _admin(srv) as admin,
        tenantkv.Client(
            srv.host, srv.port, user="healthy", password="pw-healthy", bucket="healthy"
        ) as healthy,
    ):
        healthy.set("canary", b"alive")
        calm = healthy_rate(healthy, 2.0)
        calm_login = _fresh_login(srv, admin, "alice", "pw-alice")
        time.sleep(0.5)
        before = rss_anon_kib(srv.pid)
        hashes_before = admin.server_status()["authentication"]["hashes"]
        out: Any = mp.Queue()
        cpu_before, t_before = srv.cpu_seconds() or 0.0, time.monotonic()
        until = time.monotonic() + args.seconds
        sources = [f"127.0.0.{i}" for i in range(2, 62)]
        proc = mp.Process(
            target=_guessers,
            args=(srv.host, srv.port, sources, 10, until, out, args.attacker_nice),
        )
        proc.start()
        time.sleep(1.0)
        peak, rates, logins = before, [], []
        while time.monotonic() < until - 0.5:
            rates.append(healthy_rate(healthy, 0.5))
            logins.append(_fresh_login(srv, admin, "alice", "pw-alice"))
            peak = max(peak, rss_anon_kib(srv.pid))
        counts = out.get(timeout=120)
        cpu = ((srv.cpu_seconds() or 0.0) - cpu_before) / (time.monotonic() - t_before)
        proc.join(60)
        hashes = admin.server_status()["authentication"]["hashes"] - hashes_before
        # What stays once the last held failures are answered (login_delay_max_ms).
        time.sleep(6.0)
        after = rss_anon_kib(srv.pid)
    under = sum(rates) / len(rates) if rates else 0.0
    ratio = under / calm if calm else 0.0
    growth = (after - before) / 1024
    return {
        "addresses": len(sources),
        "guesses_answered_failed": counts["failed"],
        "guesses_refused": counts["refused"],
        "attack_errors": counts["errors"],
        "scrypt_hashes": hashes,
        "server_cpu_cores": round(cpu, 2),
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_growth_mib": round((max(peak, after) - before) / 1024, 1),
        "rss_kept_mib": round(growth, 1),
        "attacker_nice": args.attacker_nice,
        "user_login_calm_secs": round(calm_login, 3),
        "user_login_max_secs": round(max(logins), 3) if logins else None,
        "healthy_calm_ops": round(calm),
        "healthy_under_attack_ops": round(under),
        "healthy_ratio": round(ratio, 3),
        "met": growth < RSS_TARGET_MIB
        and bool(logins)
        and max(logins) < LOGIN_TARGET_S
        and ratio >= HEALTHY_TARGET,
    }


# -- d. a tenant's 1,000 guesses at the user's address ----------------------------------


def part_same_address(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    _setup(srv, {"alice": "pw-alice", "mallory": "pw-mallory"})
    _timed_login(srv, "alice", "pw-alice", "alice")
    _timed_login(srv, "mallory", "pw-mallory", "mallory")  # mallory is known here too
    done = threading.Event()
    sent = [0]
    lock = threading.Lock()

    def mallory() -> None:
        while not done.is_set():
            with lock:
                if sent[0] >= 1000:
                    return
                sent[0] += 1
                i = sent[0]
            try:
                err = _login(srv.host, srv.port, "mallory", f"guess-{i}", "mallory", "127.0.0.1")
            except OSError:
                continue
            if err and err.get("codeName") == "TooManyLoginFailures":
                time.sleep(err.get("retryAfterMs", 100) / 1000)

    threads = [threading.Thread(target=mallory, daemon=True) for _ in range(40)]
    with _admin(srv) as admin:
        for t in threads:
            t.start()
        time.sleep(0.5)
        logins = []
        while sent[0] < 1000 and len(logins) < 400:
            logins.append(_fresh_login(srv, admin, "alice", "pw-alice"))
            time.sleep(0.05)
        done.set()
        for t in threads:
            t.join(30)
        st = admin.server_status()["authentication"]
    worst = max(logins) if logins else None
    return {
        "guesses_sent": sent[0],
        "guesses_failed": st["failures"],
        "user_logins": len(logins),
        "user_login_max_secs": round(worst, 3) if worst is not None else None,
        "met": worst is not None and worst < LOGIN_TARGET_S,
    }


# -- e. --workers 2 -----------------------------------------------------------------------


def part_workers(srv: servers.ServerHandle, args: argparse.Namespace) -> dict[str, Any]:
    _setup(srv, {"victim": "right"})
    with _admin(srv) as admin:
        before = admin.server_status()["authentication"]["hashes"]
    socks = [socket.create_connection((srv.host, srv.port), timeout=30) for _ in range(300)]
    try:
        for i, s in enumerate(socks):
            s.sendall(_hello("victim", f"guess-{i}"))
        codes = [(_answer(s)[2] or {}).get("codeName") for s in socks]
    finally:
        for s in socks:
            s.close()
    with _admin(srv) as admin:
        hashes = admin.server_status()["authentication"]["hashes"] - before
    return {
        "logins": len(codes),
        "failed": codes.count("AuthenticationFailed"),
        "refused": codes.count("TooManyLoginFailures"),
        "scrypt_hashes": hashes,
        "met": hashes <= HASHES_TARGET,
    }


PARTS = (
    ("a_redis", part_redis, 1),
    ("b_admin", part_admin, 1),
    ("c_addresses", part_addresses, 1),
    ("d_same_address", part_same_address, 1),
    ("e_workers", part_workers, 2),
)


def _rows(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    if a := figures.get("a_redis"):
        rows += [
            (
                "a. other user's login, redis-py guessing",
                f"{a['other_user_resp_login_secs']} s",
                "< 0.2 s",
            ),
            (
                "a. other user's login (MessagePack)",
                f"{a['other_user_msgpack_login_secs']} s",
                "< 0.2 s",
            ),
        ]
    if b := figures.get("b_admin"):
        got = f"{b['admin_hello_secs']} s ({(b['admin_hello_error'] or {}).get('codeName', 'ok')})"
        rows += [("b. admin hello, 1,000 idle at its address", got, "< 1 s")]
    if c := figures.get("c_addresses"):
        rows += [
            (
                "c. RssAnon kept, 60 addresses x 10",
                f"{c['rss_kept_mib']} MiB (peak +{c['rss_peak_growth_mib']})",
                "< 32 MiB",
            ),
            (
                "c. real user's login (scrypt), max",
                f"{c['user_login_max_secs']} s (calm {c['user_login_calm_secs']})",
                "< 0.2 s",
            ),
            (
                "c. healthy tenant",
                f"{c['healthy_under_attack_ops']} / {c['healthy_calm_ops']} ops/s"
                f" = {c['healthy_ratio']}",
                ">= 0.80",
            ),
        ]
    if d := figures.get("d_same_address"):
        rows += [
            (
                "d. user's login, 1,000 guesses at its address",
                f"{d['user_login_max_secs']} s",
                "< 0.2 s",
            )
        ]
    if e := figures.get("e_workers"):
        rows += [
            ("e. --workers 2: 300 guesses reach scrypt", f"{e['scrypt_hashes']} times", "<= 10")
        ]
    return rows


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.seconds = 4.0
    figures: dict[str, Any] = {}
    for name, part, workers in PARTS:
        if name[0] not in args.only:
            continue
        report.log(f"attack-login: {name}")
        with servers.tenantkv_server(workers=workers) as srv:
            figures[name] = part(srv, args)
    print(report.columns([("figure", "measured", "target"), *_rows(figures)], (50, 40)))
    return report.verdict(args, "attack-login", figures)
