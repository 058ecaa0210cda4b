"""``python -m bench attack-resp``: one tenant attacks the RESP door, measured.

A self-started daemon (durable defaults, temporary data directory) per part; an
attacking tenant on its own bucket with a small hard limit sends, from raw
sockets in other processes, what the isolation issue's table lists, while a
healthy tenant's redis-py client on another bucket runs GETs. Each part prints,
against the issue's targets: the healthy tenant's GET rate during the attack
over its calm rate (>= 0.80), the server's RssAnon growth (<= 256 MiB), the
internal-error replies the attacker got (0) and the server's log lines per
attacking request (no line per request: <= 0.05).

1. **mget** — a read-only user of a bucket at hard limit 10 sends ``MGET`` naming
   one 1 MiB key 1,000 times, 4 in flight per connection (refused up front from
   the stored sizes, at a floor per key named).
2. **keys-range** — ``KEYS [z-a]`` pipelined 20 at a time, bucket at hard limit 100
   (Redis swaps a reversed range; it answered "internal error" and logged a
   traceback).
3. **pattern** — a fresh ``KEYS [<510 random bytes>]`` and ``SCAN 0 MATCH ... COUNT
   1`` each time, and one 16,000-byte pattern per round, on an empty bucket at
   hard limit 100 (compiled in linear time, charged a floor per class).
4. **del** — 40 pipelined ``DEL``\\ s of 99,999 keys (past the argument bound: a
   protocol error before any argument is decoded), and 40 pipelined ``DEL``\\ s of
   1,000 keys (a floor per key), bucket at hard limit 100.
5. **setname** — 20 connections each sending ``CLIENT SETNAME`` of 20 MiB
   (a command that stores nothing takes at most 4 KiB: refused on the argument's
   header, the connection closed before the body is received).

Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import options, report, servers
from bench.attack import HEALTHY_TARGET, healthy_rate, rss_anon_kib, under_attack

RSS_GROWTH_TARGET_MIB = 256.0
#: No log line per request. (A connection closed for a protocol error logs one
#: line: the DEL part opens one per 40 requests it sends.)
LOG_LINES_PER_REQUEST_TARGET = 0.05
PASSWORD = "attack-pw"
ATTACKER, ATTACKED = "mallory", "att"


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--seconds", float, 10.0, "attack duration per part")
    options.add(p, "--attackers", int, 2, "attacking processes")
    options.quick_flag(p, "4 s per part")
    options.add(
        p, "--parts", None, "mget,keys-range,pattern,del,setname", "parts to run", show="all"
    )
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")


# -- RESP on a raw socket ------------------------------------------------------------


def encode(*argv: bytes) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)


def _skip(data: bytes, pos: int) -> int | None:
    """The end of the reply at ``pos``, or None when it is not all there yet."""
    eol = data.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, head = data[pos : pos + 1], data[pos + 1 : eol]
    if kind in (b"$", b"="):
        n = int(head)
        end = eol + 2 if n < 0 else eol + 2 + n + 2
        return end if end <= len(data) else None
    if kind in (b"*", b"%", b"~"):
        end: int | None = eol + 2
        for _ in range(max(int(head), 0) * (2 if kind == b"%" else 1)):
            assert end is not None
            end = _skip(data, end)
            if end is None:
                return None
        return end
    return eol + 2


class Conn:
    """An attacker's connection: send commands, read whole replies, count them."""

    def __init__(self, host: str, port: int, auth: bool = True) -> None:
        self.sock = socket.create_connection((host, port), timeout=60)
        self.buf = b""
        self.internal_errors = 0
        if auth:
            self.call(b"AUTH", ATTACKER.encode(), PASSWORD.encode())

    def send(self, *commands: bytes) -> None:
        self.sock.sendall(b"".join(commands))

    def replies(self, n: int) -> list[bytes]:
        out: list[bytes] = []
        pos = 0
        while len(out) < n:
            end = _skip(self.buf, pos) if pos < len(self.buf) else None
            if end is None:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("closed by the server")
                self.buf = self.buf[pos:] + data
                pos = 0
                continue
            out.append(self.buf[pos:end])
            pos = end
        self.buf = self.buf[pos:]
        self.internal_errors += sum(b"internal error" in r for r in out)
        return out

    def call(self, *argv: bytes) -> bytes:
        self.send(encode(*argv))
        return self.replies(1)[0]

    def close(self) -> None:
        self.sock.close()


# -- the attacks (each runs in its own process until ``until``) ----------------------


def _rounds(until: float) -> Iterator[None]:
    """An attack's rounds: at least one, however late its process got going (on a
    loaded machine a fork and a login can take the whole window), then until ``until``."""
    yield
    while time.monotonic() < until:
        yield


def _repeat(command: bytes, n: int) -> Callable[[str, int, float, Any], None]:
    """An attack sending ``n`` x ``command`` a round on one connection."""

    def attack(host: str, port: int, until: float, out: Any) -> None:
        c = Conn(host, port)
        for _ in _rounds(until):
            c.send(command * n)
            c.replies(n)
            _count(out, n, c)
        c.close()

    return attack


_mget = _repeat(encode(b"MGET", *[b"big"] * 1000), 4)
_keys_range = _repeat(encode(b"KEYS", b"[z-a]"), 5)


def _pattern(host: str, port: int, until: float, out: Any) -> None:
    c = Conn(host, port)
    rng = random.Random()

    def fresh(n: int) -> bytes:
        return b"[" + bytes(rng.randrange(33, 127) for _ in range(n)) + b"]"

    for _ in _rounds(until):
        batch = [encode(b"KEYS", fresh(510)) for _ in range(5)]
        batch += [encode(b"SCAN", b"0", b"MATCH", fresh(510), b"COUNT", b"1") for _ in range(4)]
        batch.append(encode(b"KEYS", fresh(16_000)))
        c.send(*batch)
        c.replies(len(batch))
        _count(out, len(batch), c)
    c.close()


def _del(host: str, port: int, until: float, out: Any) -> None:
    big = encode(b"DEL", *[b"key:%06d" % i for i in range(99_999)])  # (the most it took)
    most = encode(b"DEL", *[b"key:%06d" % i for i in range(1000)])
    c = Conn(host, port)
    for _ in _rounds(until):
        c.send(most * 40)
        c.replies(40)
        _count(out, 40, c)
        closing = Conn(host, port)  # (the too-long DEL ends its connection)
        with contextlib.suppress(OSError):
            closing.send(big * 40)
        with contextlib.suppress(OSError, ConnectionError):
            closing.replies(1)
        _count(out, 40, closing)
        closing.close()
    c.close()


def _setname(host: str, port: int, until: float, out: Any) -> None:
    """20 connections that each send a CLIENT SETNAME of 20 MiB, then stay open until
    the attack ends if the server lets them (a command that stores nothing takes at
    most 4 KiB: it is refused on the argument's header and the connection closed,
    before the body is received). Reconnecting after each refusal would measure a
    connection flood instead, which the connection limiter bounds."""
    name = encode(b"CLIENT", b"SETNAME", b"n" * (20 << 20))
    conns = []
    requests = 0
    for _ in range(20):
        if time.monotonic() >= until:
            break
        c = Conn(host, port)
        try:
            c.send(name)
            c.replies(1)
        except OSError:  # closed while the name was still being sent
            pass
        requests += 1
        conns.append(c)
    while time.monotonic() < until:
        time.sleep(0.05)
    for c in conns:
        _count(out, 0, c)
        c.close()
    with out.get_lock():
        out[0] += requests


def _count(out: Any, n: int, c: Conn) -> None:
    with out.get_lock():
        out[0] += n
        out[1] += c.internal_errors
    c.internal_errors = 0


SMALL = {k: b"v" for k in ("a", "m", "z", "A", "1")}
#: part -> (attacker's hard limit, its role, the attack, the keys of its bucket)
PARTS: dict[str, tuple[int, str, Callable[..., None], dict[str, bytes]]] = {
    "mget": (10, "read", _mget, {"big": bytes(1 << 20)}),
    "keys-range": (100, "read", _keys_range, SMALL),
    "pattern": (100, "read", _pattern, {}),
    "del": (100, "readwrite", _del, SMALL),
    "setname": (100, "read", _setname, {}),
}


# -- measuring -------------------------------------------------------------------------


def _log_lines(srv: servers.ServerHandle) -> int:
    assert srv.log_path is not None
    with open(srv.log_path, "rb") as f:
        return sum(1 for _ in f)


@contextlib.contextmanager
def _tenants(
    srv: servers.ServerHandle, hard_limit: int, role: str, keys: dict[str, bytes]
) -> Iterator[Any]:
    """The attacking tenant (bucket ``att`` holding ``keys``, its hard limit) and the
    healthy one's redis-py client (bucket ``healthy``, unlimited)."""
    import redis

    import tenantkv

    assert srv.password is not None and srv.resp_port
    with tenantkv.Client(srv.host, srv.port, user="admin", password=srv.password) as c:
        c.create_bucket(ATTACKED)
        c.create_bucket("healthy")
        c.create_user(ATTACKER, PASSWORD, roles={ATTACKED: role})
        c.create_user("healthy", PASSWORD, roles={"healthy": "readwrite"})
        c.select_bucket(ATTACKED)
        for key, value in keys.items():  # (before the limit: 1 MiB costs 5 s of 10/s)
            c.set(key, value)
        c.set_bucket_throttle(ATTACKED, {"reserved": hard_limit, "hard_limit": hard_limit})
    servers.wait_for_login(srv, ATTACKER, PASSWORD, ATTACKED)
    r = redis.Redis(host=srv.host, port=srv.resp_port, username="healthy", password=PASSWORD)
    try:
        r.set("canary", "alive")
        yield r
    finally:
        r.close()


def run_part(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One attack on a fresh server: the healthy tenant's rate calm (before and
    after), and during it; RSS, the attacker's replies and the log meanwhile."""
    hard_limit, role, attack, keys = PARTS[name]
    with servers.tenantkv_server() as srv, _tenants(srv, hard_limit, role, keys) as healthy:
        assert srv.pid is not None and srv.resp_port
        calm = healthy_rate(healthy, min(3.0, args.seconds))
        time.sleep(0.2)
        before, lines_before = rss_anon_kib(srv.pid), _log_lines(srv)
        peak = before
        counts = mp.Array("q", 2)
        until = time.monotonic() + args.seconds
        procs = [
            mp.Process(target=attack, args=(srv.host, srv.resp_port, until, counts))
            for _ in range(args.attackers)
        ]
        for p in procs:
            p.start()
        time.sleep(0.5)
        rates, peak = under_attack(healthy, srv.pid, until - 0.3, peak)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        peak = max(peak, rss_anon_kib(srv.pid))
        lines = _log_lines(srv) - lines_before
        under = sum(rates) / len(rates) if rates else 0.0
        # Calm again after it (the mean of both): on a shared machine the rate
        # drifts with other load, and one calm window would take drift for harm.
        calm = (calm + healthy_rate(healthy, min(3.0, args.seconds))) / 2
    requests, internal = counts[0], counts[1]
    fig: dict[str, Any] = {
        "attacker_hard_limit": hard_limit,
        "attack_requests": requests,
        "attack_requests_per_sec": round(requests / args.seconds),
        "internal_error_replies": internal,
        "log_lines": lines,
        "log_lines_per_request": round(lines / requests, 4) if requests else None,
        "rss_before_mib": round(before / 1024, 1),
        "rss_growth_mib": round((peak - before) / 1024, 1),
        "healthy_calm_ops": round(calm),
        "healthy_under_attack_ops": round(under),
        "healthy_ratio": round(under / calm, 3) if calm else None,
    }
    fig["met"] = (
        (fig["healthy_ratio"] or 0) >= HEALTHY_TARGET
        and fig["rss_growth_mib"] <= RSS_GROWTH_TARGET_MIB
        and internal == 0
        and (fig["log_lines_per_request"] or 0) <= LOG_LINES_PER_REQUEST_TARGET
    )
    return fig


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.seconds = 4.0
    figures: dict[str, Any] = {}
    for name in args.parts.split(","):
        report.log(f"attack-resp: {name}")
        figures[name] = run_part(name, args)
    print(
        f"{'part':11} {'healthy ops/s':>22} {'ratio':>6} {'RSS +MiB':>9} "
        f"{'attack req/s':>12} {'internal':>8} {'log/req':>8}  met"
    )
    for name, f in figures.items():
        print(
            f"{name:11} {f['healthy_under_attack_ops']:>10} / {f['healthy_calm_ops']:<9} "
            f"{f['healthy_ratio']!s:>6} {f['rss_growth_mib']:>9} "
            f"{f['attack_requests_per_sec']:>12} "
            f"{f['internal_error_replies']:>8} {f['log_lines_per_request']!s:>8}  {f['met']}"
        )
    print(
        f"targets: ratio >= {HEALTHY_TARGET}, RSS <= +{RSS_GROWTH_TARGET_MIB:g} MiB, "
        f"0 internal errors, <= {LOG_LINES_PER_REQUEST_TARGET} log lines per request"
    )
    return report.verdict(args, "attack-resp", figures)
