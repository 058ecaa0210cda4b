"""``python -m bench attack-throttle``: the tenant throttle attacked, measured.

A self-started daemon (durable defaults, temporary data directory) per part;
attackers are raw MessagePack sockets on loopback, measured figures come from
the server's status document (the units it charged) and from a second
tenant's client. Printed against the targets of docs/throttling.md:

a. **writes in flight** — 8 connections each keep 4 SETs of 400 KB (then
   800 KB) in flight against a bucket at hard limit 100 units/s, on one process
   and on ``--workers 2``. Figure: the units the bucket was charged over
   ``--seconds`` (40; 10 with ``--quick``) as a ratio to the hard limit — the
   slope of the charged units sampled every 100 ms (least squares), and the
   plain window ratio beside it. A write costs ~200 (~400) units, two (four)
   seconds of the limit, so a window's plain ratio carries up to one write of
   quantization; the slope does not. Target: ≤ 1.03.
b. **after an unthrottled burst** — node capacity 1000; an ``Unthrottled``
   user pipelines GETs far past the capacity for 3 s, then stops, while another
   bucket's client runs GETs (blocking) and a probe on it asks non-blocking every
   20 ms. Figures: how long after the burst the other bucket's rate (200 ms
   windows) is back to ≥ 95 % of its calm rate (target ≤ 1 s) and the largest
   ``retryAfterMs`` the probe was told (target ≤ 1000 ms).
c. **a bucket held at its limit by its unthrottled user** — hard limit 100;
   the unthrottled user keeps 300 units/s going; a normal user's GET on it.
   Target: answered at once (< 0.5 s) or served, with a message whose numbers
   agree with its ``retryAfterMs``.

Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack

from bench import options, report, servers

RATIO_TARGET = 1.03
RECOVERY_TARGET_S = 1.0
RECOVERY_SHARE = 0.95
HINT_TARGET_MS = 1000
AT_ONCE_S = 0.5
HARD_LIMIT = 100
CONNECTIONS = 8
IN_FLIGHT = 4


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--seconds", float, 40.0, "part (a) window")
    options.quick_flag(p, "10 s windows")
    options.add(p, "--parts", None, "abc", "which parts to run, e.g. 'a' or 'bc'")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON here")


# --------------------------------------------------------------------------- wire


class Conn:
    """A blocking MessagePack-RPC connection (no retries, no pooling)."""

    def __init__(self, host: str, port: int, **hello: Any) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=64 * 1024 * 1024)
        self.msgid = 0
        self.call("hello", **hello)

    def send(self, method: str, **params: Any) -> int:
        self.msgid += 1
        self.sock.sendall(msgpack.packb([0, self.msgid, method, params]))
        return self.msgid

    def recv(self) -> tuple[int, Any, Any]:
        while True:
            for msg in self.unpacker:
                return msg[1], msg[2], msg[3]
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.unpacker.feed(data)

    def call(self, method: str, **params: Any) -> Any:
        self.send(method, **params)
        _, err, result = self.recv()
        if err is not None:
            raise RuntimeError(f"{method}: {err}")
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@contextlib.contextmanager
def admin_conn(srv: servers.ServerHandle) -> Iterator[Any]:
    import tenantkv

    with tenantkv.Client(srv.host, srv.port, user=srv.user, password=srv.password) as c:
        yield c


def make_user(
    srv: servers.ServerHandle, admin: Any, name: str, bucket: str, *, unthrottled: bool = False
) -> str:
    import secrets

    password = secrets.token_urlsafe(12)
    admin.create_user(name, password, roles={bucket: "readwrite"}, unthrottled=unthrottled)
    servers.wait_for_login(srv, name, password, bucket)
    return password


def bucket_units(admin: Any, bucket: str) -> tuple[int, int]:
    b = admin.server_status()["throttle"]["buckets"][bucket]
    return int(b["ru_total"]), int(b["wu_total"])


# --------------------------------------------------------------------------- (a)


def part_writes(args: argparse.Namespace, value_kib: int, workers: int) -> dict[str, Any]:
    with servers.tenantkv_server(workers=workers) as srv, admin_conn(srv) as admin:
        admin.create_bucket("w")
        admin.set_bucket_throttle("w", {"hard_limit": HARD_LIMIT})
        password = make_user(srv, admin, "writer", "w")
        value = b"v" * (value_kib * 1024)
        stop = threading.Event()
        acked = [0] * CONNECTIONS
        refused = [0] * CONNECTIONS

        def writer(i: int) -> None:
            c = Conn(srv.host, srv.port, user="writer", password=password, bucket="w")
            try:
                for j in range(IN_FLIGHT):
                    c.send("set", key=b"k%d-%d" % (i, j), value=value)
                n = IN_FLIGHT
                while not stop.is_set():
                    _, err, _ = c.recv()
                    if err is None:
                        acked[i] += 1
                    else:
                        refused[i] += 1
                    n += 1
                    c.send("set", key=b"k%d-%d" % (i, n % 16), value=value)
            except (OSError, ConnectionError):
                pass
            finally:
                c.close()

        threads = [
            threading.Thread(target=writer, args=(i,), daemon=True) for i in range(CONNECTIONS)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)  # warm-up: every connection has its writes in flight
        samples: list[tuple[float, int]] = []
        t0 = time.monotonic()
        end = t0 + args.seconds
        while True:
            now = time.monotonic()
            samples.append((now - t0, bucket_units(admin, "w")[1] * 2))  # write_weight 2
            if now >= end:
                break
            time.sleep(min(0.1, max(0.0, end - now)))
        stop.set()
        for t in threads:
            t.join(timeout=10)
        slope = _slope(samples)
        span = samples[-1][0] - samples[0][0]
        window = (samples[-1][1] - samples[0][1]) / span
        cost = 2 * -(-(value_kib * 1024 + 40) // 4096)
        return {
            "value_kib": value_kib,
            "workers": workers,
            "seconds": round(span, 1),
            "write_cost_units": cost,
            "slope_units_per_s": round(slope, 1),
            "ratio": round(slope / HARD_LIMIT, 3),
            "window_units_per_s": round(window, 1),
            "window_ratio": round(window / HARD_LIMIT, 3),
            "acked": sum(acked),
            "refused_throttled": sum(refused),
            "met": slope / HARD_LIMIT <= RATIO_TARGET,
        }


def _slope(samples: list[tuple[float, int]]) -> float:
    n = len(samples)
    mx = sum(t for t, _ in samples) / n
    my = sum(u for _, u in samples) / n
    sxx = sum((t - mx) ** 2 for t, _ in samples)
    sxy = sum((t - mx) * (u - my) for t, u in samples)
    return sxy / sxx if sxx else 0.0


# --------------------------------------------------------------------------- (b)


class _Burst:
    """Part (b)'s clients: ``other`` keeps its bucket's whole rate in flight
    (blocking GETs), ``probe`` asks without blocking and records the hints it
    is told, ``burster`` (unthrottled) pipelines GETs far past the node's
    capacity while ``burst_on`` is set."""

    def __init__(self, srv: servers.ServerHandle, opw: str, upw: str) -> None:
        self.srv, self.opw, self.upw = srv, opw, upw
        self.stop, self.burst_on = threading.Event(), threading.Event()
        self.served: list[float] = []
        self.hints: list[int] = []
        self.lock = threading.Lock()

    def conn(self, **kw: Any) -> Conn:
        return Conn(self.srv.host, self.srv.port, user="other", password=self.opw, bucket="o", **kw)

    def other(self) -> None:  # blocking GETs, 8 in flight: the bucket's whole rate
        c = self.conn()
        try:
            for _ in range(8):
                c.send("get", key=b"k")
            while not self.stop.is_set():
                _, err, _ = c.recv()
                if err is None:
                    with self.lock:
                        self.served.append(time.monotonic())
                elif err.get("retryAfterMs") is not None:
                    with self.lock:
                        self.hints.append(int(err["retryAfterMs"]))
                c.send("get", key=b"k")
        except (OSError, ConnectionError):
            pass
        finally:
            c.close()

    def probe(self) -> None:  # non-blocking: what hints is it told?
        c = self.conn(nonblocking_throttle=True)
        try:
            while not self.stop.is_set():
                c.send("get", key=b"k")
                _, err, _ = c.recv()
                if err is not None and err.get("retryAfterMs") is not None:
                    with self.lock:
                        self.hints.append(int(err["retryAfterMs"]))
                time.sleep(0.02)
        finally:
            c.close()

    def burster(self) -> None:  # unthrottled: pipelined GETs far past the capacity
        c = Conn(self.srv.host, self.srv.port, user="burster", password=self.upw, bucket="u")
        c.call("set", key=b"k", value=b"x" * 100)
        try:
            self.burst_on.wait()
            while self.burst_on.is_set():
                for _ in range(64):
                    c.send("get", key=b"k")
                for _ in range(64):
                    c.recv()
        finally:
            c.close()


def part_burst(args: argparse.Namespace) -> dict[str, Any]:
    with servers.tenantkv_server() as srv, admin_conn(srv) as admin:
        admin.set_node_throttle({"capacity": 1000})
        for name in ("u", "o"):
            admin.create_bucket(name)
            admin.set_bucket_throttle(name, {"reserved": 0})
        upw = make_user(srv, admin, "burster", "u", unthrottled=True)
        opw = make_user(srv, admin, "other", "o")
        b = _Burst(srv, opw, upw)
        setup = b.conn()
        setup.call("set", key=b"k", value=b"x" * 100)
        setup.close()
        threads = [threading.Thread(target=f, daemon=True) for f in (b.other, b.probe, b.burster)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        calm_from = time.monotonic()
        time.sleep(2.0)
        burst_at = time.monotonic()
        b.burst_on.set()
        time.sleep(3.0)
        b.burst_on.clear()
        stopped_at = time.monotonic()
        time.sleep(3.0)
        b.stop.set()
        for t in threads:
            t.join(timeout=10)
        with b.lock:
            times, told = list(b.served), list(b.hints)
        return _burst_figures(times, told, (calm_from, burst_at, stopped_at))


def _burst_figures(
    times: list[float], told: list[int], marks: tuple[float, float, float]
) -> dict[str, Any]:
    """The other bucket's rate calm, during the burst, and how soon after it
    its rate came back; the longest hint it was told."""
    calm_from, burst_at, stopped_at = marks
    calm = sum(1 for t in times if calm_from <= t < burst_at) / (burst_at - calm_from)
    during = sum(1 for t in times if burst_at + 0.5 <= t < stopped_at) / (
        stopped_at - burst_at - 0.5
    )
    recovery = None
    w = 0.2
    t = stopped_at
    while t + w <= stopped_at + 3.0:
        rate = sum(1 for s in times if t <= s < t + w) / w
        if rate >= RECOVERY_SHARE * calm:
            recovery = t + w - stopped_at  # the window that reached it, ended
            break
        t += 0.05
    max_hint = max(told) if told else 0
    bins = [
        sum(1 for s in times if stopped_at + k * 0.1 <= s < stopped_at + (k + 1) * 0.1)
        for k in range(20)
    ]
    return {
        "served_per_100ms_after_burst": bins,
        "calm_ops": round(calm),
        "during_burst_ops": round(during),
        "recovery_secs": None if recovery is None else round(recovery, 2),
        "max_retry_after_ms": max_hint,
        "hints_seen": len(told),
        "met": recovery is not None
        and recovery <= RECOVERY_TARGET_S
        and max_hint <= HINT_TARGET_MS,
    }


# --------------------------------------------------------------------------- (c)

_HELD = re.compile(r"\((\d+) units/s\) takes all of its rate \((\d+) units/s\).*repaid in (\d+) ms")
_WAIT = re.compile(r"the wait \((\d+) ms\)")
_BOUND = re.compile(r"throttle_max_wait_ms \((\d+) ms\)")
_PARKED = re.compile(r"after (\d+) ms parked")


def part_held(args: argparse.Namespace) -> dict[str, Any]:
    with servers.tenantkv_server() as srv, admin_conn(srv) as admin:
        admin.create_bucket("h")
        admin.set_bucket_throttle("h", {"hard_limit": HARD_LIMIT})
        upw = make_user(srv, admin, "vip", "h", unthrottled=True)
        npw = make_user(srv, admin, "normal", "h")
        stop = threading.Event()

        def vip() -> None:  # 300 units/s: 3 GETs of a 1-unit value every 10 ms
            c = Conn(srv.host, srv.port, user="vip", password=upw, bucket="h")
            c.call("set", key=b"k", value=b"x" * 100)
            try:
                while not stop.is_set():
                    for _ in range(3):
                        c.send("get", key=b"k")
                    for _ in range(3):
                        c.recv()
                    time.sleep(0.01)
            finally:
                c.close()

        t = threading.Thread(target=vip, daemon=True)
        t.start()
        time.sleep(2.0)
        c = Conn(srv.host, srv.port, user="normal", password=npw, bucket="h")
        answers = []
        try:
            for _ in range(3):
                t0 = time.monotonic()
                c.send("get", key=b"k")
                _, err, _ = c.recv()
                answers.append((time.monotonic() - t0, err))
                time.sleep(0.3)
        finally:
            c.close()
            stop.set()
            t.join(timeout=10)
        rows = []
        met = True
        for secs, err in answers:
            agree = True
            msg = "" if err is None else str(err.get("errmsg", ""))
            hint = None if err is None else err.get("retryAfterMs")
            if err is not None:
                m = _HELD.search(msg)
                w = _WAIT.search(msg)
                if m is not None:
                    used, rate, repaid = (int(x) for x in m.groups())
                    agree = (
                        used >= rate == HARD_LIMIT
                        and hint is not None
                        and (repaid <= hint <= repaid + 101)
                    )
                elif w is not None:
                    # The wait must outlast what was left of the bound it names.
                    b = _BOUND.search(msg)
                    parked = _PARKED.search(msg)
                    waited = int(parked.group(1)) if parked else 0
                    agree = (
                        hint is not None
                        and int(w.group(1)) <= hint
                        and (b is None or waited + int(w.group(1)) > int(b.group(1)))
                    )
                else:
                    agree = False
            ok = secs < AT_ONCE_S and agree
            met = met and ok
            rows.append(
                {
                    "secs": round(secs, 3),
                    "served": err is None,
                    "retry_after_ms": hint,
                    "errmsg": msg,
                    "numbers_agree": agree,
                }
            )
        return {"answers": rows, "met": met}


# --------------------------------------------------------------------------- run


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.seconds = 10.0
    figures: dict[str, Any] = {}
    rows: list[tuple[str, str, str]] = []
    if "a" in args.parts:
        figures["writes"] = []
        for workers in (1, 2):
            for kib in (400, 800):
                report.log(
                    f"attack-throttle: {CONNECTIONS} x {IN_FLIGHT} x {kib} KB SETs "
                    f"in flight, workers {workers}"
                )
                f = part_writes(args, kib, workers)
                figures["writes"].append(f)
                rows.append(
                    (
                        f"(a) {kib} KB SETs, {workers} process{'es' if workers > 1 else ''}",
                        f"{f['slope_units_per_s']} units/s = {f['ratio']}x "
                        f"(window {f['window_ratio']}x)",
                        f"<= {RATIO_TARGET}x",
                    )
                )
    if "b" in args.parts:
        report.log("attack-throttle: unthrottled burst to node capacity")
        f = figures["burst"] = part_burst(args)
        rows.append(
            (
                "(b) other bucket back to 95 % after burst",
                f"{f['recovery_secs']} s (calm {f['calm_ops']}/s, "
                f"during {f['during_burst_ops']}/s)",
                f"<= {RECOVERY_TARGET_S} s",
            )
        )
        rows.append(
            ("(b) largest retryAfterMs told", f"{f['max_retry_after_ms']} ms", "<= 1000 ms")
        )
    if "c" in args.parts:
        report.log("attack-throttle: a GET on a bucket held by its unthrottled user")
        f = figures["held"] = part_held(args)
        worst = max(a["secs"] for a in f["answers"])
        agree = all(a["numbers_agree"] for a in f["answers"])
        rows.append(
            (
                "(c) GET on a held bucket: answered in",
                f"{worst} s, numbers agree: {agree}",
                f"< {AT_ONCE_S} s, agree",
            )
        )
        print("(c) message:", f["answers"][0]["errmsg"] or "served")
    print(report.columns([("figure", "measured", "target"), *rows], (44, 46)))
    met = all(
        (all(x["met"] for x in v) if isinstance(v, list) else v["met"]) for v in figures.values()
    )
    print("all targets met" if met else "TARGET MISSED")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0 if met else 1
