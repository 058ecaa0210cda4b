"""``python -m bench overload``: front-door protection under open-loop overload.

One daemon (temporary data directory), three buckets, a plain ``bench`` user
with the readwrite role on each. Parts:

1. ``load`` — *capacity* first: the most GETs/s closed loop (pipelined, and
   unpipelined for context). Then the ingress request rate limiter is turned
   on the way an operator protects a node (``ingress_request_rate_limiter_
   enabled``, ``ingress_request_admission_rate_per_sec`` = C,
   ``…_burst_capacity_secs`` 0.1) and GETs arrive open loop with **Poisson**
   arrivals (exponential gaps; latency from each request's scheduled send
   time, so queueing in the generator or the server is not hidden) at
   0.5, 1, 2, 4 and 8 x C, spread over the buckets. A rejected request
   (462 IngressRequestRateLimitExceeded, or 26 AdmissionQueueOverflow) is
   counted and never retried. Per load: goodput, rejections, p50/p99/p99.9 of
   the admitted requests, CPU. Targets: goodput at 4 x and 8 x >= 95 % of the
   peak goodput; admitted p99 at 4 x <= 2 x the p99 at 0.5 x.
2. ``cost`` — server CPU per rejected vs per served GET, A/B at the same
   Poisson arrivals: the limiter at 10**9/s (everything served) against
   0.001/s (everything rejected), daemon CPU from /proc/PID/stat over the
   window minus its idle CPU, divided by the requests. Target: a rejection
   costs <= 20 % of a served GET.
3. ``storm`` — established clients (0.5 x C, Poisson) while other processes
   open TCP connections at thousands per second, send ``hello`` and close
   (abortive close, SO_LINGER 0, so the generator's ports do not pile up in
   TIME_WAIT), with the connection-establishment limiter on (a modest rate
   and queue depth). Established clients' p99 calm vs during the storm
   (target <= 2 x), and in the full run also with the limiter off.

Why a gate at C and not the daemon's own capacity: the daemon serves
~100-150k pipelined GETs/s, and a Python generator sharing its 2 cores
cannot offer 8 x that (it sustains roughly 40k Poisson requests/s next to the
daemon). The limiter at C makes "capacity" a number the operator chose, and
8 x C stays within what the generator can offer; the question the targets
ask is whether turning away 7 C requests/s costs the node its goodput and its
latency, which holds at any C the node can serve while it rejects the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import multiprocessing as mp
import select
import socket
import statistics
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

import msgpack

from bench import loadgen, options, report, servers
from bench.loadgen import BenchError, LoadResult, LoadSpec, hist_percentile_us
from bench.options import Quick
from bench.throttle import (
    CLIENT_CPU_WARN,
    OTHER_CPU_WARN,
    Daemon,
    Machine,
    Outcome,
    Parts,
    Snapshot,
    _merge,
    _pct,
    _verdict,
    daemon,
)

PARTS = ("load", "cost", "storm")
FACTORS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: Poisson requests/s the generator sustains next to the daemon on this VM
#: (measured: above it the sends fall behind schedule). 8 x C must fit.
GEN_MAX = 40_000
BUCKETS = ("b0", "b1", "b2")
#: Open loop: the most requests a connection may have outstanding (the
#: server's default max_inflight_per_connection), so the cap never hides queueing.
OPEN_DEPTH = 1024
REJECT_CODES = {462: "IngressRequestRateLimitExceeded", 26: "AdmissionQueueOverflow"}
REFUSED_CODE = 27  # TooManyConnections
#: A storm connection waits this long for its hello reply before it gives up.
#: Long on purpose: a client that closes while the server still owes it a
#: reply makes the server's next write meet a reset, and before commit 08d78df
#: one connection reset killed the whole daemon (see docs/benchmarking.md, overload).
STORM_TIMEOUT = 10.0
#: After the storm, how long its processes wait for replies still due.
STORM_DRAIN = 5.0
GOODPUT_TARGET = 0.95
P99_TARGET = 2.0
COST_TARGET = 0.20
STORM_TARGET = 2.0
LIMITER = "ingress_request_rate_limiter_enabled"
RATE = "ingress_request_admission_rate_per_sec"
BURST = "ingress_request_admission_burst_capacity_secs"
CONN_LIMITER = "ingress_connection_establishment_rate_limiter_enabled"
CONN_RATE = "ingress_connection_establishment_rate_per_sec"
CONN_BURST = "ingress_connection_establishment_burst_capacity_secs"
CONN_QUEUE = "ingress_connection_establishment_max_queue_depth"


# -- command line ------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--part", PARTS, "parts")
    options.common_flags(p)
    options.window_flags(
        p,
        Quick(8.0, 2.0),
        Quick(1.0, 0.5),
        Quick(3, 1),
        what=(
            "window per run",
            "load before each window",
            "repetitions of the load sweep and of the storm",
        ),
    )
    options.add(p, "--factors", options.float_list, list(FACTORS), "offered load / C")
    options.add(
        p,
        "--capacity",
        float,
        None,
        "C, the admission rate of the request limiter, req/s [min(capacity / 2, "
        f"{GEN_MAX:,} / max factor), rounded down to 500]",
        above=0,
    )
    options.add(p, "--burst-secs", float, 0.1, "request limiter burst, in s of C", above=0)
    options.add(p, "--conns", int, 4, "connections per bucket", low=1)
    options.data_flags(p, 1000, keys_help="keys per bucket, preloaded")
    g = p.add_argument_group("connection storm")
    options.add(g, "--storm-rate", float, 3000, "connections opened per second", above=0, parser=p)
    options.add(g, "--storm-procs", int, 2, "processes opening them", low=1, parser=p)
    g.add_argument(
        "--storm-rst",
        action="store_true",
        help="close storm connections with RST (SO_LINGER 0), as crashing clients do "
        "(before 08d78df one reset killed the daemon) [FIN]",
    )
    options.add(
        g, "--conn-rate", float, 200, "connection limiter: admitted per s", above=0, parser=p
    )
    options.add(g, "--conn-queue", int, 20, "connection limiter: max queue depth", low=0, parser=p)


def _finish_args(args: argparse.Namespace) -> None:
    servers.pin_cpus(args)


# -- helpers -----------------------------------------------------------------------


def set_params(d: Daemon, **params: Any) -> None:
    for name, value in params.items():
        d.admin.command("set_parameter", name=name, value=value)


@dataclass
class Edge:
    """Status and CPU at one edge of a window."""

    snap: Snapshot
    status: dict[str, Any]


def edge(d: Daemon) -> Edge:
    st = d.admin.server_status()
    snap = Snapshot.bare(float(st["uptime_secs"]), d.handle.cpu_seconds())
    return Edge(snap, st)


def _diff(a: dict[str, Any], b: dict[str, Any], keys: Sequence[str]) -> dict[str, int]:
    return {k: int(b.get(k, 0)) - int(a.get(k, 0)) for k in keys}


def _limiter(e: Edge) -> dict[str, Any]:
    return e.status["ingress"]["request_rate_limiter"]


def _conn_limiter(e: Edge) -> dict[str, Any]:
    return e.status["ingress"]["connection_establishment"]


def _us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f} µs" if x < 10_000 else f"{x / 1000:,.1f} ms"


def _uss(x: float | None) -> str:
    """Compact, for tables."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x < 10_000 else f"{x / 1000:,.1f}m"


def poisson_loads(
    d: Daemon, args: argparse.Namespace, value: bytes, total_rate: float, seed: int
) -> list[tuple[Any, LoadSpec]]:
    """One Poisson GET load per bucket, ``total_rate`` requests/s over all of them."""
    per = total_rate / len(BUCKETS)
    return [
        (
            d.target(b),
            LoadSpec(
                op="get",
                conns=args.conns,
                depth=OPEN_DEPTH,
                value=value,
                keys=args.keys,
                seconds=args.seconds,
                warmup=args.warmup,
                rate=per,
                workers=1,
                cpus=args.client_cpus,
                poisson=True,
                seed=seed + 1000 * i,
                split_errors=True,
            ),
        )
        for i, b in enumerate(BUCKETS)
    ]


@dataclass
class Window:
    """One measured run: merged client results and the server's view."""

    offered: float
    result: LoadResult
    a: Edge
    b: Edge
    extra_client_cpu_s: float = 0.0
    storm: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.b.snap.uptime - self.a.snap.uptime

    @property
    def server_pct(self) -> float:
        a, b = self.a.snap.cpu_s, self.b.snap.cpu_s
        return 0.0 if a is None or b is None else 100 * (b - a) / self.seconds

    @property
    def client_pct(self) -> float:
        r = self.result
        return _pct(r.client_cpu_s + self.extra_client_cpu_s, r.window_s) or 0.0

    @property
    def rejected(self) -> int:
        return sum(n for code, n in self.result.error_codes.items() if code in REJECT_CODES)

    @property
    def other_errors(self) -> int:
        return self.result.errors - self.rejected

    def other_pct(self) -> float:
        m = Machine()
        m.add(self.a.snap, self.b.snap, [])
        return m.pct()["other"]


def measure(
    d: Daemon,
    loads: list[tuple[Any, LoadSpec]],
    offered: float,
    mach: Machine,
    on_ready: Any = None,
) -> Window:
    edges: list[Edge] = []
    results, _ = loadgen.run_loads(loads, lambda: edges.append(edge(d)), None, on_ready)
    r = _merge(results)
    r.error_codes = {}
    for x in results:
        for code, n in x.error_codes.items():
            r.error_codes[code] = r.error_codes.get(code, 0) + n
        for b, n in x.hist_err.items():
            r.hist_err[b] = r.hist_err.get(b, 0) + n
    r.window_s = results[0].window_s
    lags = [x.extra.get("send_lag_mean_us") for x in results if x.extra.get("send_lag_mean_us")]
    r.extra = {
        "send_lag_mean_us": round(statistics.fmean(lags), 1) if lags else None,
        "send_lag_max_us": max((x.extra.get("send_lag_max_us") or 0 for x in results), default=0),
        "undrained": sum(x.extra.get("undrained", 0) for x in results),
    }
    w = Window(offered, r, edges[0], edges[-1])
    mach.add(w.a.snap, w.b.snap, results)
    return w


def merge_windows(ws: Sequence[Window]) -> LoadResult:
    r = _merge([w.result for w in ws])
    r.window_s = sum(w.result.window_s for w in ws)
    for w in ws:
        for b, n in w.result.hist_err.items():
            r.hist_err[b] = r.hist_err.get(b, 0) + n
        for code, n in w.result.error_codes.items():
            r.error_codes[code] = r.error_codes.get(code, 0) + n
    return r


def quiet_ratio(
    base: Sequence[Window], other: Sequence[Window]
) -> tuple[float, float, float, int, int] | None:
    """p99 of ``other`` over p99 of ``base``, from the rounds where other processes
    were quiet (< OTHER_CPU_WARN); None unless both have such a round and one was not."""
    qa = [w for w in base if w.other_pct() < OTHER_CPU_WARN]
    qb = [w for w in other if w.other_pct() < OTHER_CPU_WARN]
    if not qa or not qb or (len(qa) == len(base) and len(qb) == len(other)):
        return None
    pa = merge_windows(qa).percentile_us(0.99)
    pb = merge_windows(qb).percentile_us(0.99)
    if not pa or not pb:
        return None
    return pb / pa, pa, pb, len(qa), len(qb)


def _rejected(r: LoadResult) -> int:
    return sum(n for code, n in r.error_codes.items() if code in REJECT_CODES)


# -- 1. capacity and the load sweep --------------------------------------------------


def capacity_loads(
    d: Daemon, args: argparse.Namespace, value: bytes, depth: int = 64, conns: int = 4
) -> list[tuple[Any, LoadSpec]]:
    """Closed-loop GET on every bucket."""
    window = {"seconds": 1.5, "warmup": 0.3} if args.quick else {"seconds": 3.0, "warmup": 0.5}
    spec = loadgen.cell_spec(
        args, "get", conns, depth, value, workers=1, split_errors=True, **window
    )
    return [(d.target(b), spec) for b in BUCKETS]


def capacity(d: Daemon, args: argparse.Namespace, value: bytes, depth: int, conns: int) -> Window:
    return measure(d, capacity_loads(d, args, value, depth, conns), 0.0, Machine())


def part_load(
    d: Daemon, args: argparse.Namespace, value: bytes, out_meta: dict[str, Any]
) -> Outcome:
    out, c, caps = _load_capacity(d, args, value)
    out_meta["C"] = c
    set_params(d, **{RATE: c, BURST: args.burst_secs, LIMITER: True})
    mach = Machine()
    by: dict[float, list[Window]] = {f: [] for f in args.factors}
    for rnd in range(args.rounds):
        order = list(args.factors) if rnd % 2 == 0 else list(args.factors)[::-1]
        for f in order:
            offered = f * c
            report.log(f"  round {rnd + 1}: {f:g} x C = {offered:,.0f} req/s ...")
            w = measure(d, poisson_loads(d, args, value, offered, 7 + rnd), offered, mach)
            by[f].append(w)
            r = w.result
            report.log(
                f"    goodput {r.ops_per_s:,.0f}/s, rejected {w.rejected / r.window_s:,.0f}/s, "
                f"p99 {_us(r.percentile_us(0.99))}, server {w.server_pct:.0f} %, generator "
                f"{w.client_pct:.0f} %, others {w.other_pct():.0f} %"
            )
    rows = [_load_row(f, c, by[f]) for f in args.factors]
    peak = max(x["goodput_per_s"] for x in rows)
    _load_table(out, rows, peak)
    data_p99 = _load_p99_check(out, args, rows, by, peak)
    _load_notes(out, rows)
    k_p, k_u = caps
    out.data = {
        "capacity_pipelined": round(k_p, 1),
        "capacity_unpipelined": round(k_u, 1),
        "C": c,
        "burst_secs": args.burst_secs,
        "rows": rows,
        "peak_goodput": peak,
        "p99_ratio_4x": data_p99,
    }
    return mach.close(out)


def _load_capacity(
    d: Daemon, args: argparse.Namespace, value: bytes
) -> tuple[Outcome, float, tuple[float, float]]:
    """Part 1's capacities (pipelined, unpipelined) and C, the limiter's rate."""
    report.log("  capacity: closed-loop GET, pipelined and unpipelined ...")
    cap_p = capacity(d, args, value, 64, 4)
    cap_u = capacity(d, args, value, 1, args.conns)
    k_p, k_u = cap_p.result.ops_per_s, cap_u.result.ops_per_s
    fmax = max(args.factors)
    if args.capacity:
        c = args.capacity
        why = "set with --capacity"
    else:
        c = max(500.0, (min(k_u / 2, GEN_MAX / fmax) // 500) * 500)
        why = (
            f"min(unpipelined capacity / 2, {GEN_MAX:,} / {fmax:g}) rounded down to 500: "
            f"{fmax:g} x C must stay within what the generator can offer"
        )
    out = Outcome(
        "load",
        f"1. Poisson overload: GET open loop, exponential gaps, {len(BUCKETS)} buckets x "
        f"{args.conns} conns (<= {OPEN_DEPTH} outstanding each), latency from the scheduled "
        f"send; protection: {LIMITER} at C = {c:,.0f} req/s, burst {args.burst_secs:g} s; "
        f"{args.rounds} round(s) of {args.seconds:g} s per load; rejected requests are not "
        "retried",
    )
    out.lines += [
        f"   capacity, closed loop: {k_p:,.0f} GET/s pipelined ({len(BUCKETS)} x 4 conns x depth "
        f"64, server {cap_p.server_pct:.0f} %), {k_u:,.0f} GET/s unpipelined ({len(BUCKETS)} x "
        f"{args.conns} conns x depth 1, server {cap_u.server_pct:.0f} %, generator "
        f"{cap_u.client_pct:.0f} %)",
        f"   C = {c:,.0f} req/s: {why}; C = {100 * c / k_p:.1f} % of the pipelined and "
        f"{100 * c / k_u:.0f} % of the unpipelined capacity",
    ]
    return out, c, (k_p, k_u)


def _load_row(f: float, c: float, ws: list[Window]) -> dict[str, Any]:
    """One offered load's figures over its rounds."""
    r = merge_windows(ws)
    secs = r.window_s
    answered = (r.ok + r.errors) / secs
    return {
        "factor": f,
        "offered_per_s": f * c,
        "answered_per_s": round(answered, 1),
        "goodput_per_s": round(r.ok / secs, 1),
        "rejected_per_s": round(_rejected(r) / secs, 1),
        "other_errors": r.errors - _rejected(r),
        "rejections_by_code": {str(k): v for k, v in r.error_codes.items()},
        "p50_us": r.percentile_us(0.5),
        "p99_us": r.percentile_us(0.99),
        "p999_us": r.percentile_us(0.999),
        "p99_from_send_us": r.percentile_us(0.99, from_send=True),
        "rejected_p99_us": hist_percentile_us(r.hist_err, 0.99),
        "per_round": [
            {
                "goodput_per_s": round(w.result.ops_per_s, 1),
                "p99_us": w.result.percentile_us(0.99),
                "server_cpu_pct": round(w.server_pct, 1),
                "client_cpu_pct": round(w.client_pct, 1),
                "other_cpu_pct": w.other_pct(),
                "send_lag_mean_us": w.result.extra.get("send_lag_mean_us"),
                "limiter": _diff(
                    _limiter(w.a), _limiter(w.b), ("attempted", "successful", "rejected")
                ),
            }
            for w in ws
        ],
        "server_cpu_pct": statistics.fmean(w.server_pct for w in ws),
        "client_cpu_pct": statistics.fmean(w.client_pct for w in ws),
        "other_cpu_pct": statistics.fmean(w.other_pct() for w in ws),
        "server_us_per_request": statistics.fmean(w.server_pct for w in ws) / 100 / answered * 1e6
        if answered
        else None,
    }


def _load_table(out: Outcome, rows: list[dict[str, Any]], peak: float) -> None:
    out.lines.append(
        f"   {'load':>5} {'offered/s':>9} {'answered':>9} {'goodput/s':>9} {'%peak':>5} "
        f"{'rejected/s':>10} {'rej %':>5}  {'p50':>7} {'p99':>7} {'p99.9':>7} (µs, admitted)  "
        f"{'srv%':>4} {'gen%':>4} {'oth%':>4} {'srv µs/req':>10}"
    )
    for x in rows:
        total = x["answered_per_s"]
        out.lines.append(
            f"   {x['factor']:>4g}x {x['offered_per_s']:>9,.0f} {x['answered_per_s']:>9,.0f} "
            f"{x['goodput_per_s']:>9,.0f} {100 * x['goodput_per_s'] / peak:>5.0f} "
            f"{x['rejected_per_s']:>10,.0f} {100 * x['rejected_per_s'] / max(1.0, total):>5.1f}  "
            f"{_uss(x['p50_us']):>7} {_uss(x['p99_us']):>7} {_uss(x['p999_us']):>7}"
            f"{'':15}{x['server_cpu_pct']:>4.0f} {x['client_cpu_pct']:>4.0f} "
            f"{x['other_cpu_pct']:>4.0f} {x['server_us_per_request'] or 0:>10.1f}"
        )
    out.lines.append(
        "   per round, goodput/s p99 µs (other processes' CPU %): "
        + "; ".join(
            f"{x['factor']:g}x "
            + ", ".join(
                f"{y['goodput_per_s']:,.0f} {_uss(y['p99_us'])} ({y['other_cpu_pct']:.0f})"
                for y in x["per_round"]
            )
            for x in rows
        )
    )
    other = sum(x["other_errors"] for x in rows)
    out.lines.append(
        "   rejections by code: "
        + ", ".join(
            f"{x['factor']:g}x "
            + (" ".join(f"{k}:{v:,}" for k, v in x["rejections_by_code"].items()) or "none")
            for x in rows
        )
        + f"; other errors {other}"
    )


def _load_p99_check(
    out: Outcome,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    by: dict[float, list[Window]],
    peak: float,
) -> dict[str, Any] | None:
    """The goodput checks at 4x and 8x, and admitted p99 at 4x against 0.5x."""
    base = next((x for x in rows if x["factor"] == 0.5), rows[0])
    data_p99: dict[str, Any] | None = None
    for f in (4.0, 8.0):
        x = next((y for y in rows if y["factor"] == f), None)
        if x is None:
            continue
        g = x["goodput_per_s"] / peak
        out.check(
            f"goodput at {f:g}x / peak goodput",
            round(g, 4),
            f"{100 * g:.1f} %",
            ">= 95 %",
            g >= GOODPUT_TARGET,
        )
        if f == 4.0 and base["p99_us"] and x["p99_us"]:
            ratio = x["p99_us"] / base["p99_us"]
            out.lines.append(
                f"   admitted p99 at 4x {_us(x['p99_us'])} vs {base['factor']:g}x "
                f"{_us(base['p99_us'])}: {ratio:.2f} x (all rounds; from the actual send: "
                f"{_us(x['p99_from_send_us'])} vs {_us(base['p99_from_send_us'])})"
            )
            q = quiet_ratio(by[base["factor"]], by[f])
            if q is not None:
                qr, pa, pb, na, nb = q
                out.lines.append(
                    f"   the same from the rounds where other processes used < "
                    f"{OTHER_CPU_WARN:.0f} % of a core ({na} and {nb} of {args.rounds}): "
                    f"{_us(pb)} vs {_us(pa)}: {qr:.2f} x"
                )
                data_p99 = {"all_rounds": round(ratio, 3), "quiet_rounds": round(qr, 3)}
                ratio, label = qr, "quiet rounds"
            else:
                data_p99 = {"all_rounds": round(ratio, 3), "quiet_rounds": None}
                label = "all rounds"
            out.lines.append(
                f"   admitted p99 4x / {base['factor']:g}x ({label}): {ratio:.2f} x   target <= "
                f"{P99_TARGET:g} x   {_verdict(ratio <= P99_TARGET)}"
            )
            out.check(
                f"admitted p99 4x / {base['factor']:g}x ({label})",
                round(ratio, 3),
                f"{ratio:.2f} x",
                f"<= {P99_TARGET:g} x",
                ratio <= P99_TARGET,
            )
    return data_p99


def _load_notes(out: Outcome, rows: list[dict[str, Any]]) -> None:
    for x in rows:
        short = x["answered_per_s"] < 0.97 * x["offered_per_s"]
        lags = [y["send_lag_mean_us"] or 0 for y in x["per_round"]]
        if short or x["client_cpu_pct"] >= CLIENT_CPU_WARN or max(lags) > 1000:
            out.notes.append(
                f"load {x['factor']:g}x: {x['answered_per_s']:,.0f} of "
                f"{x['offered_per_s']:,.0f} req/s answered in the window, generator "
                f"{x['client_cpu_pct']:.0f} % of a core, mean send lag "
                + "/".join(f"{v:,.0f}" for v in lags)
                + " µs: the generator (or the machine) may not have offered the full load"
            )


# -- 2. cost of a rejection ----------------------------------------------------------------


def part_cost(d: Daemon, args: argparse.Namespace, value: bytes, c: float) -> Outcome:
    f = 4.0
    x = f * c
    secs = 1.5 if args.quick else 4.0
    reps = 1 if args.quick else 3
    out = Outcome(
        "cost",
        f"2. server CPU per rejected vs per served GET, A/B on the same load: limiter at "
        f"1e9/s (all served) vs 0.001/s (all rejected with 462); (a) the Poisson arrivals of "
        f"part 1 at {f:g} x C = {x:,.0f} req/s, (b) closed loop pipelined ({len(BUCKETS)} x 4 "
        f"conns x depth 64); {reps} x (served, rejected) each, {secs:g} s; daemon CPU from "
        "/proc/PID/stat minus its idle CPU, per request answered",
    )
    mach = Machine()
    a = edge(d)
    time.sleep(1.0 if args.quick else 2.0)
    b = edge(d)
    assert a.snap.cpu_s is not None and b.snap.cpu_s is not None
    idle = (b.snap.cpu_s - a.snap.cpu_s) / (b.snap.uptime - a.snap.uptime)
    out.lines.append(f"   idle daemon {100 * idle:.1f} % of a core (subtracted)")
    data: dict[str, Any] = {"offered_per_s": x, "idle_cpu_fraction": round(idle, 4)}
    variants = {
        "poisson": lambda i: [
            (t, replace(s, seconds=secs)) for t, s in poisson_loads(d, args, value, x, 50 + i)
        ],
        "pipelined": lambda i: [
            (t, replace(s, seconds=secs, warmup=0.3)) for t, s in capacity_loads(d, args, value)
        ],
    }
    for name, make in variants.items():
        per: dict[str, list[float]] = {"served": [], "rejected": []}
        pct: dict[str, list[float]] = {"served": [], "rejected": []}
        rates: dict[str, list[float]] = {"served": [], "rejected": []}
        counts: dict[str, list[tuple[int, int]]] = {"served": [], "rejected": []}
        for i in range(reps):
            for mode in ("served", "rejected"):
                if mode == "served":
                    set_params(d, **{RATE: 1e9, BURST: 1.0})
                else:
                    set_params(d, **{BURST: 0.001, RATE: 0.001})
                w = measure(d, make(i), x, mach)
                r = w.result
                n = r.ok + r.errors
                cpu = (w.server_pct / 100 - idle) * w.seconds
                per[mode].append(cpu / n * 1e6 if n else 0.0)
                pct[mode].append(w.server_pct)
                rates[mode].append(n / r.window_s)
                counts[mode].append((r.ok, w.rejected))
                report.log(
                    f"  {name} {mode}: {n / r.window_s:,.0f} req/s, server "
                    f"{w.server_pct:.0f} %, {per[mode][-1]:.1f} µs/request"
                )
        served, rejected = statistics.median(per["served"]), statistics.median(per["rejected"])
        ratio = rejected / served if served else float("inf")
        for mode, v in (("served", served), ("rejected", rejected)):
            out.lines.append(
                f"   ({'ab'[list(variants).index(name)]}) {name:<9} {mode:<8} {v:6.1f} µs per "
                "request (runs "
                + ", ".join(f"{y:.1f}" for y in per[mode])
                + f"; {statistics.fmean(rates[mode]):,.0f} req/s, server "
                f"{statistics.fmean(pct[mode]):.0f} %)"
            )
        out.lines.append(
            f"       {name:<9} rejected / served: {100 * ratio:.0f} %   target <= "
            f"{100 * COST_TARGET:.0f} %   {_verdict(ratio <= COST_TARGET)}"
        )
        if not (
            all(o == 0 for o, _ in counts["rejected"]) and all(r == 0 for _, r in counts["served"])
        ):
            out.notes.append(
                f"cost {name}: some runs were not all-served / all-rejected (ok, rejected): "
                f"{counts}"
            )
        out.check(
            f"CPU per rejection / served GET, {name}",
            round(ratio, 4),
            f"{100 * ratio:.0f} %",
            f"<= {100 * COST_TARGET:.0f} %",
            ratio <= COST_TARGET,
        )
        data[name] = {
            "served_us": [round(v, 2) for v in per["served"]],
            "rejected_us": [round(v, 2) for v in per["rejected"]],
            "served_req_per_s": [round(v, 1) for v in rates["served"]],
            "rejected_req_per_s": [round(v, 1) for v in rates["rejected"]],
            "ratio": round(ratio, 4),
            "counts": counts,
        }
    set_params(d, **{RATE: c, BURST: args.burst_secs})
    out.data = data
    return mach.close(out)


# -- 3. connection storm -------------------------------------------------------------------


class _Stormer:
    """One storm process's connections: each is opened (connect), sent its hello
    once writable, and closed at its reply, its reset, or its timeout; what
    happened to each is counted."""

    IN = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
    COUNTS = (
        "attempted",
        "hello_ok",
        "refused",
        "other_error",
        "no_reply",
        "reset",
        "timeout",
        "connect_failed",
        "skipped",
    )

    def __init__(self, address: tuple[str, int], hello: bytes, timeout: float, rst: bool) -> None:
        self.address, self.hello, self.timeout_ns = address, hello, int(timeout * 1e9)
        self.linger = struct.pack("ii", 1, 0) if rst else None
        self.counts = dict.fromkeys(self.COUNTS, 0)
        self.ep = select.epoll()
        #: fd -> [sock, state 0 connecting / 1 hello sent, unpacker]
        self.conns: dict[int, list[Any]] = {}
        self.expiry: deque[tuple[int, int, socket.socket]] = deque()

    def close(self, fd: int, outcome: str | None = None) -> None:
        if outcome is not None:
            self.counts[outcome] += 1
        c = self.conns.pop(fd, None)
        if c is None:
            return
        with contextlib.suppress(OSError):
            self.ep.unregister(fd)
        c[0].close()

    def open(self, now: int) -> None:
        self.counts["attempted"] += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        if self.linger is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, self.linger)
        err = s.connect_ex(self.address)
        if err not in (0, errno.EINPROGRESS):
            self.counts["connect_failed"] += 1
            s.close()
            return
        fd = s.fileno()
        self.conns[fd] = [s, 0, None]
        self.ep.register(fd, select.EPOLLOUT | self.IN)
        self.expiry.append((now + self.timeout_ns, fd, s))

    def expire(self, now: int) -> None:
        """Close the connections whose reply is overdue."""
        q, conns = self.expiry, self.conns
        while q and (q[0][0] <= now or conns.get(q[0][1], [None])[0] is not q[0][2]):
            _, fd, s = q.popleft()
            if conns.get(fd, [None])[0] is s:
                self.close(fd, "timeout")

    def poll(self, wait: float) -> None:
        for fd, ev in self.ep.poll(wait):
            c = self.conns.get(fd)
            if c is not None and (c[1] == 1 or self._connected(fd, c, ev)):
                self._read(fd, c)

    def _connected(self, fd: int, c: list[Any], ev: int) -> bool:
        """A connection became writable: send the hello; True if a reply may be there."""
        s = c[0]
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.close(fd, "connect_failed")
            return False
        try:
            s.send(self.hello)
        except OSError:
            self.close(fd, "reset")
            return False
        c[1], c[2] = 1, msgpack.Unpacker(raw=True)
        self.ep.modify(fd, self.IN)
        return bool(ev & select.EPOLLIN)

    def _read(self, fd: int, c: list[Any]) -> None:
        try:
            data = c[0].recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.close(fd, "reset")
            return
        if not data:
            self.close(fd, "no_reply")
            return
        c[2].feed(data)
        for obj in c[2]:
            e = obj[2]
            if e is None:
                self.close(fd, "hello_ok")
            elif isinstance(e, dict) and e.get(b"code") == REFUSED_CODE:
                self.close(fd, "refused")
            else:
                self.close(fd, "other_error")
            return

    def run(self, rate: float, t_start: int, t_stop: int, max_pending: int) -> dict[str, Any]:
        """Open connections at ``rate``/s from t_start to t_stop (monotonic ns), then
        wait up to STORM_DRAIN s for the replies still due."""
        clock = time.monotonic_ns
        interval = int(1e9 / rate)
        while clock() < t_start:
            time.sleep(max(0.0, (t_start - clock()) / 1e9))
        cpu0 = time.process_time()
        nxt = t_start
        t_drain = t_stop + int(STORM_DRAIN * 1e9)
        cpu_open = None
        while True:
            now = clock()
            opening = now < t_stop
            if not opening and cpu_open is None:
                cpu_open = time.process_time() - cpu0
            if not opening and (not self.conns or now >= t_drain):
                break
            while opening and nxt <= now:
                nxt += interval
                if len(self.conns) >= max_pending:
                    self.counts["skipped"] += 1
                else:
                    self.open(now)
            self.expire(now)
            self.poll(max(0.0, min(nxt, t_stop) - clock()) / 1e9 if opening else 0.05)
        self.counts["abandoned"] = len(self.conns)  # no reply STORM_DRAIN s after the storm
        for fd in list(self.conns):
            self.close(fd)
        return {
            "counts": self.counts,
            "cpu_s": cpu_open if cpu_open is not None else time.process_time() - cpu0,
            "seconds": (t_stop - t_start) / 1e9,
        }


def _storm_main(
    pipe: Connection,
    host: str,
    port: int,
    hello: bytes,
    rate: float,
    t_start: int,
    t_stop: int,
    timeout: float,
    max_pending: int,
    rst: bool,
) -> None:
    """One storm process (see :class:`_Stormer`); reports to the parent, never hangs it."""
    try:
        stormer = _Stormer((host, port), hello, timeout, rst)
        pipe.send(("done", stormer.run(rate, t_start, t_stop, max_pending)))
    except BaseException as exc:  # report, never hang the parent
        with contextlib.suppress(OSError):
            pipe.send(("error", repr(exc)))
    finally:
        pipe.close()


class Storm:
    """``procs`` processes opening connections at ``rate``/s in all, until stopped."""

    def __init__(
        self, d: Daemon, rate: float, procs: int, seconds: float, bucket: str, rst: bool
    ) -> None:
        from tenantkv import __version__

        self.d = d
        self.rate = rate
        self.procs = procs
        self.seconds = seconds
        self.rst = rst
        self.hello = msgpack.packb(
            [
                0,
                0,
                "hello",
                {
                    "user": d.user,
                    "password": d.password,
                    "bucket": bucket,
                    "client": {"name": "tenantkv-bench-storm", "version": __version__},
                },
            ],
            use_bin_type=True,
        )
        self._procs: list[tuple[Any, Connection]] = []

    def start(self) -> None:
        ctx = mp.get_context("fork")
        t_start = time.monotonic_ns() + 20_000_000
        t_stop = t_start + int(self.seconds * 1e9)
        h = self.d.handle
        for i in range(self.procs):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_storm_main,
                args=(
                    child,
                    h.host,
                    h.port,
                    self.hello,
                    self.rate / self.procs,
                    t_start,
                    t_stop,
                    STORM_TIMEOUT,
                    2000,
                    self.rst,
                ),
                name=f"bench-storm-{i}",
                daemon=True,
            )
            p.start()
            child.close()
            self._procs.append((p, parent))

    def finish(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        cpu = 0.0
        secs = self.seconds
        try:
            for _, pipe in self._procs:
                if not pipe.poll(self.seconds + STORM_DRAIN + 30):
                    raise BenchError("a storm process did not report")
                msg = pipe.recv()
                if msg[0] != "done":
                    raise BenchError(f"storm process failed: {msg[1]}")
                for k, v in msg[1]["counts"].items():
                    counts[k] = counts.get(k, 0) + v
                cpu += msg[1]["cpu_s"]
                secs = msg[1]["seconds"]
        finally:
            for p, pipe in self._procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
                pipe.close()
        return {"counts": counts, "cpu_s": cpu, "seconds": secs}


def part_storm(d: Daemon, args: argparse.Namespace, value: bytes, c: float) -> Outcome:
    est = 0.5 * c
    modes = ["calm", "storm"] + ([] if args.quick else ["storm, limiter off"])
    out = Outcome(
        "storm",
        f"3. connection storm: established clients {est:,.0f} GET/s Poisson ({len(BUCKETS)} x "
        f"{args.conns} conns, request limiter on at C); storm: {args.storm_procs} processes "
        f"opening {args.storm_rate:,.0f} connections/s (connect, hello, wait for the reply, "
        f"close{' with RST' if args.storm_rst else ''}); {CONN_LIMITER} on, "
        f"{CONN_RATE} {args.conn_rate:g}, "
        f"{CONN_BURST} 0.1, {CONN_QUEUE} {args.conn_queue}; {args.rounds} x "
        f"({', '.join(modes)}), {args.seconds:g} s each",
    )
    mach = Machine()
    set_params(
        d,
        **{CONN_RATE: args.conn_rate, CONN_BURST: 0.1, CONN_QUEUE: args.conn_queue},
    )
    by = _storm_rounds(d, args, value, est, modes, mach)
    set_params(d, **{CONN_LIMITER: False})
    rows = {m: _storm_row(m, ws) for m, ws in by.items()}
    _storm_table(out, rows)
    _storm_verdict(out, args, rows, by)
    out.data = {"established_per_s": est, "phases": rows}
    return mach.close(out)


def _storm_rounds(
    d: Daemon,
    args: argparse.Namespace,
    value: bytes,
    est: float,
    modes: list[str],
    mach: Machine,
) -> dict[str, list[Window]]:
    """Every round of every phase: the established clients' windows, with the storm's counts."""
    by: dict[str, list[Window]] = {m: [] for m in modes}
    for rnd in range(args.rounds):
        for m in modes:
            set_params(d, **{CONN_LIMITER: m != "storm, limiter off"})
            loads = poisson_loads(d, args, value, est, 100 + rnd)
            storm = None
            if m != "calm":
                storm = Storm(
                    d,
                    args.storm_rate,
                    args.storm_procs,
                    args.warmup + args.seconds + 0.3,
                    BUCKETS[0],
                    args.storm_rst,
                )
            report.log(f"  round {rnd + 1}: {m} ...")
            w = measure(d, loads, est, mach, storm.start if storm else None)
            if storm is not None:
                s = storm.finish()
                w.storm = s
                w.extra_client_cpu_s = s["cpu_s"] * w.result.window_s / s["seconds"]
                mach.client += w.extra_client_cpu_s
            by[m].append(w)
            r = w.result
            report.log(
                f"    p99 {_us(r.percentile_us(0.99))}, server {w.server_pct:.0f} %, generator "
                f"{w.client_pct:.0f} %, others {w.other_pct():.0f} %"
                + (f", storm {w.storm['counts']}" if w.storm else "")
            )
    return by


def _storm_row(m: str, ws: list[Window]) -> dict[str, Any]:
    """One phase's figures over its rounds."""
    r = merge_windows(ws)
    row: dict[str, Any] = {
        "p50_us": r.percentile_us(0.5),
        "p99_us": r.percentile_us(0.99),
        "p999_us": r.percentile_us(0.999),
        "p99_from_send_us": r.percentile_us(0.99, from_send=True),
        "ok_per_s": round(r.ops_per_s, 1),
        "errors": r.errors,
        "error_codes": {str(k): v for k, v in r.error_codes.items()},
        "per_round_p99_us": [w.result.percentile_us(0.99) for w in ws],
        "per_round_other_cpu_pct": [w.other_pct() for w in ws],
        "server_cpu_pct": statistics.fmean(w.server_pct for w in ws),
        "client_cpu_pct": statistics.fmean(w.client_pct for w in ws),
        "other_cpu_pct": statistics.fmean(w.other_pct() for w in ws),
    }
    if m != "calm":
        tot: dict[str, int] = {}
        secs = 0.0
        for w in ws:
            for k, v in w.storm["counts"].items():
                tot[k] = tot.get(k, 0) + v
            secs += w.storm["seconds"]
        row["storm_counts"] = tot
        row["storm_per_s"] = {k: round(v / secs, 1) for k, v in tot.items()}
        keys = (
            "attempted",
            "successful",
            "rejected",
            "queued",
            "interrupted_in_queue",
            "added_to_queue",
            "exempted",
        )
        srv: dict[str, int] = {}
        for w in ws:
            for k, v in _diff(_conn_limiter(w.a), _conn_limiter(w.b), keys).items():
                srv[k] = srv.get(k, 0) + v
        cr = sum(
            w.b.status["connections"]["rejected"] - w.a.status["connections"]["rejected"]
            for w in ws
        )
        row["server_connection_limiter"] = srv
        row["server_connections_rejected"] = cr
    return row


def _storm_table(out: Outcome, rows: dict[str, dict[str, Any]]) -> None:
    out.lines.append(
        f"   {'phase':<20} {'p50':>8} {'p99':>8} {'p99.9':>8}  {'p99 per round (oth%)':<26} "
        f"{'ok/s':>6} {'err':>4}  {'srv%':>4} {'gen%':>4} {'oth%':>4}"
    )
    for m, row in rows.items():
        rounds = ", ".join(
            f"{_uss(x)} ({o:.0f})"
            for x, o in zip(row["per_round_p99_us"], row["per_round_other_cpu_pct"], strict=True)
        )
        out.lines.append(
            f"   {m:<20} {_uss(row['p50_us']):>8} {_uss(row['p99_us']):>8} "
            f"{_uss(row['p999_us']):>8}  {rounds:<26} "
            f"{row['ok_per_s']:>6,.0f} {row['errors']:>4}  {row['server_cpu_pct']:>4.0f} "
            f"{row['client_cpu_pct']:>4.0f} {row['other_cpu_pct']:>4.0f}"
        )
    for m, row in rows.items():
        if m == "calm":
            continue
        ps = row["storm_per_s"]
        srv = row["server_connection_limiter"]
        out.lines.append(
            f"   {m}: storm opened {ps.get('attempted', 0):,.0f}/s: hello ok "
            f"{ps.get('hello_ok', 0):,.0f}/s, refused (27) {ps.get('refused', 0):,.0f}/s, "
            f"closed without reply {ps.get('no_reply', 0):,.0f}/s, "
            f"reset {ps.get('reset', 0):,.0f}/s, "
            f"timed out {ps.get('timeout', 0):,.0f}/s, connect failed "
            f"{ps.get('connect_failed', 0):,.0f}/s, not opened (2000 pending) "
            f"{ps.get('skipped', 0):,.0f}/s; server limiter: "
            + ", ".join(f"{k} {v:,}" for k, v in srv.items() if v)
            + f"; connections refused {row['server_connections_rejected']:,}"
        )


def _storm_verdict(
    out: Outcome,
    args: argparse.Namespace,
    rows: dict[str, dict[str, Any]],
    by: dict[str, list[Window]],
) -> None:
    """Established p99 during the storm against calm: the check."""
    calm = rows["calm"]
    row = rows["storm"]
    ratio = row["p99_us"] / calm["p99_us"] if row["p99_us"] and calm["p99_us"] else None
    out.lines.append(
        f"   established p99 during the storm / calm: {ratio or 0:.2f} x (all rounds; from "
        f"the actual send: {_us(row['p99_from_send_us'])} vs {_us(calm['p99_from_send_us'])})"
    )
    label = "all rounds"
    q = quiet_ratio(by["calm"], by["storm"])
    if q is not None:
        qr, pa, pb, na, nb = q
        out.lines.append(
            f"   the same from the rounds where other processes used < {OTHER_CPU_WARN:.0f} % "
            f"of a core ({na} and {nb} of {args.rounds}): {_us(pb)} vs {_us(pa)}: {qr:.2f} x"
        )
        ratio, label = qr, "quiet rounds"
        rows["storm"]["p99_ratio_quiet_rounds"] = round(qr, 3)
    met = ratio is not None and ratio <= STORM_TARGET
    out.lines.append(
        f"   established p99 storm / calm ({label}): {ratio or 0:.2f} x   target <= "
        f"{STORM_TARGET:g} x   {_verdict(met)}"
    )
    out.check(
        f"established p99 storm / calm ({label})",
        None if ratio is None else round(ratio, 3),
        "-" if ratio is None else f"{ratio:.2f} x",
        f"<= {STORM_TARGET:g} x",
        met,
    )
    if "storm, limiter off" in rows:
        off = rows["storm, limiter off"]
        r2 = off["p99_us"] / calm["p99_us"] if off["p99_us"] and calm["p99_us"] else None
        out.lines.append(
            f"   without the connection limiter: {r2 or 0:.2f} x calm (shown for comparison)"
        )


# -- driver ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    value = report.value_bytes(args.value_size, b"overload")
    out, meta = report.run_header(args, "overload")
    print(
        f"\n{args.value_size} B values, {args.keys:,} keys per bucket, buckets "
        f"{', '.join(BUCKETS)}; warm-up {args.warmup:g} s{' (quick)' if args.quick else ''}",
        file=out,
        flush=True,
    )
    parts = Parts(args, out, "overload")
    with daemon(list(BUCKETS), args.keys, value, args.server_cpus) as d:
        c = args.capacity
        if "load" in args.part:
            report.log("part load ...")
            parts.show(part_load(d, args, value, meta))
            c = meta["C"]
        if c is None:
            cap = capacity(d, args, value, 1, args.conns).result.ops_per_s
            c = max(500.0, (min(cap / 2, GEN_MAX / max(args.factors)) // 500) * 500)
            set_params(d, **{RATE: c, BURST: args.burst_secs, LIMITER: True})
            print(f"\nC = {c:,.0f} req/s (unpipelined capacity {cap:,.0f} GET/s)", file=out)
        if "cost" in args.part:
            report.log("part cost ...")
            parts.show(part_cost(d, args, value, c))
        if "storm" in args.part:
            report.log("part storm ...")
            set_params(d, **{RATE: c, BURST: args.burst_secs, LIMITER: True})
            parts.show(part_storm(d, args, value, c))
    return parts.finish(meta, widths=(8, 46, 10))
