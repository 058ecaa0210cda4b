"""``python -m bench ycsb``: YCSB core workloads A-F, zipfian and uniform keys.

Why: ``throughput`` measures one op over keys taken in turn — a best case for
caches and for write batching alike. YCSB's core workloads are the common
yardstick for skewed, mixed key-value traffic (hot keys under zipfian 0.99,
read-mostly and update-heavy mixes, reads of the newest records, short range
scans), so these numbers can be read next to published YCSB results, and next
to redis-server on this machine with the same load loop.

Every cell is one workload x one key distribution (``--distributions``,
default zipfian and uniform; D always uses YCSB's ``latest``, the newest
records being the hottest). A cell first preloads ``--records`` records under
its own key prefix (so inserts and scans of one cell never see another's
keys), then runs a warm-up and a measuring window. The load generator replays
a seeded plan of the workload (:mod:`bench.workloads`, which also says where
it differs from YCSB — e.g. inserts become overwrites once the ring wraps).

The default load is YCSB's: closed loop, one outstanding op per connection
(``--conns`` 16 ~ 16 YCSB client threads; ``--depth`` pipelines more), or
``--rate`` for an open loop with Poisson arrivals (YCSB's ``-target`` paces
evenly instead), latency then counted from each request's scheduled time.

Values are ``--value-size`` 100 B by default, not YCSB's 1 KB record (10
fields x 100 B): the same size as the other scenarios, so the ratios here can
be set next to ``throughput``'s, and it keeps the measure on request handling
and key skew rather than on copying bytes. ``--value-size 1000`` gives
YCSB's record size.

What is counted: ``ops/s`` are YCSB operations per second. A
read-modify-write (F) is a GET then a SET of the same key — two requests, so
F's ops/s = requests/s / 1.5 (both are in ``--json``). Latency percentiles
are per *request* over all of a cell's ops (the load loop keeps one histogram;
YCSB reports one per op type, and F's RMW latency as GET + SET). A GET of a
key not inserted yet (D, rarely) is a nil reply and counts as a successful
read; only error replies count as errors. SETs are durable on both sides
(tenantkv's group commit; redis ``appendfsync always``).

``--vs-redis`` runs each cell on redis-server too, right after tenantkv.
Workload E is skipped there: its ordered short range scans have no plain
GET/SET form in Redis (``SCAN`` walks the hash table in no key order, and
YCSB's Redis binding emulates scans with a sorted-set index — a different
data model).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench import loadgen, options, report, servers, workloads
from bench.loadgen import (
    WORKLOAD,
    LoadSpec,
    Target,
    TenantKVCodec,
)
from bench.options import Quick

BUCKET = "bench"
NAMES = tuple(workloads.WORKLOADS)
E_ON_REDIS = (
    "redis: workload E skipped — its ordered short range scans have no plain GET/SET "
    "form in Redis (SCAN is unordered; YCSB's Redis binding keeps a sorted-set index, "
    "a different data model)"
)


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(
        p,
        "--workloads",
        options.names(NAMES, "workloads", str.upper),
        list(NAMES),
        "workloads to run",
        metavar="W[,W]",
    )
    options.add(
        p,
        "--distributions",
        options.names(workloads.DISTRIBUTIONS, "distributions", str.lower),
        ["zipfian", "uniform"],
        "key distributions, of zipfian, uniform, latest (D always uses latest)",
        metavar="D[,D]",
    )
    options.add(p, "--records", int, Quick(10_000, 1000), "records preloaded per cell", low=2)
    options.add(
        p,
        "--value-size",
        int,
        100,
        "value bytes",
        show="100, as the other scenarios; YCSB's record is 1000",
        low=0,
    )
    options.add(p, "--conns", int, 16, "connections (YCSB threads)", low=1)
    options.add(p, "--depth", int, 1, "outstanding requests per connection", low=1)
    options.window_flags(
        p,
        Quick(5.0, 1.0),
        Quick(1.0, 0.2),
        what=("measuring window per cell", "warm-up per cell", ""),
    )
    options.add(
        p,
        "--rate",
        float,
        None,
        "open loop: total YCSB ops/s per cell, Poisson arrivals; latency counts from "
        "the scheduled send [closed loop]",
        above=0,
    )
    options.add(
        p,
        "--workers",
        int,
        os.cpu_count() or 2,
        "most load-generator processes per cell",
        show="CPU count",
        low=1,
    )
    options.add(p, "--seed", int, 1, "seed of the workload plans")
    options.pin_flag(
        p,
        "split = servers on the first CPU, the load generator on the others",
    )
    p.add_argument(
        "--vs-redis",
        action="store_true",
        help="also run redis-server (appendfsync always): workloads A-D, F",
    )
    options.json_flag(p)
    options.quick_flag(p, "a fast smoke run (every workload in < 40 s)")


def cell_plan(names: list[str], dists: list[str]) -> list[tuple[str, str]]:
    """(workload, distribution) of every cell, in order; D only with ``latest``."""
    out: list[tuple[str, str]] = []
    for w in names:
        for d in ["latest"] if w == "D" else dists:
            if (w, d) not in out:
                out.append((w, d))
    return out


@dataclass
class Cell(report.Cell):
    """One workload x distribution measured on one server."""

    @property
    def key(self) -> tuple[str, str]:  # type: ignore[override]
        assert self.spec.workload is not None
        return (self.spec.workload, self.spec.distribution)

    @property
    def requests_per_op(self) -> float:
        return workloads.WORKLOADS[self.key[0]].requests_per_op

    @property
    def ops_per_s(self) -> float:
        return self.result.ops_per_s / self.requests_per_op

    def to_json(self) -> dict[str, Any]:
        r, s = self.result, self.spec
        return {
            "server": self.server,
            "workload": s.workload,
            "distribution": s.distribution,
            "conns": s.conns,
            "depth": s.depth,
            "records": s.keys,
            "value_size": len(s.value),
            "mode": "open" if s.rate else "closed",
            "target_ops_per_s": s.rate / self.requests_per_op if s.rate else None,
            "target_requests_per_s": s.rate,
            "seconds": r.window_s,
            "requests": r.ok,
            "requests_per_s": round(r.ops_per_s, 1),
            "requests_per_op": round(self.requests_per_op, 3),
            "ops": round(r.ok / self.requests_per_op),
            "ops_per_s": round(self.ops_per_s, 1),
            "errors": r.errors,
            **report.load_figures(r),
        }


def ratio(cells: list[Cell], key: tuple[str, str], a: str, b: str) -> float | None:
    """YCSB ops/s of server ``a`` over server ``b`` for one cell, None if either is missing."""
    by = {c.server: c.ops_per_s for c in cells if c.key == key}
    if by.get(a) and by.get(b):
        return by[a] / by[b]
    return None


#: one line per workload x distribution
LAYOUT = report.Layout(
    (f"{'':<2} {'':<8}", f"{'wl':<2} {'dist':<8}"),
    lambda k: f"{k[0]:<2} {k[1]:<8}",
    ["ops/s", "p50 µs", "p99 µs", "p99.9 µs", "err"],
    [9, 7, 7, 8, 4],
    "errors (not counted in ops/s):",
    lambda c: f"{c.server} {c.key[0]} {c.key[1]}: {c.result.errors} errors",
)


def _values(cell: Cell) -> list[str]:
    j = cell.to_json()
    us = [report._fmt_us(j[k]) for k in ("p50_us", "p99_us", "p999_us")]
    return [f"{cell.ops_per_s:,.0f}", *us, str(j["errors"])]


def format_table(cells: list[Cell], names: list[str]) -> str:
    """One line per workload x distribution, servers side by side."""
    return report.side_by_side(
        cells,
        names,
        LAYOUT,
        _values,
        lambda key: ratio(cells, key, "tenantkv", "redis"),
        lambda server, key: "skipped (no scan)" if server == "redis" and key[0] == "E" else "",
    )


def _prefix(workload: str, distribution: str) -> bytes:
    """Each cell's own key space (scans and inserts never meet another cell's keys)."""
    return f"ycsb:{workload}:{distribution}:".encode()


def run(args: argparse.Namespace) -> int:
    value = report.value_bytes(args.value_size, b"ycsb")
    servers.pin_cpus(args)
    meta = report.run_meta(args)
    for side in ("server_cpus", "client_cpus"):
        cpus = getattr(args, side)
        meta["settings"][side] = sorted(cpus) if cpus else None
    meta["servers"] = {}
    notes: list[str] = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        targets = _start(stack, args, meta, notes)
        cells = _measure(args, targets, value)
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    names = [n for n, _, _ in targets]
    _print(args, meta, cells, names, notes)
    if args.json:
        meta["notes"] = notes
        doc = {"cells": [c.to_json() for c in cells], "ratios": _ratios(cells, names)}
        report.write_json(args.json, {"benchmark": "ycsb", "meta": meta, **doc})
    return 1 if any(c.result.errors for c in cells) else 0


def _start(
    stack: contextlib.ExitStack, args: argparse.Namespace, meta: dict[str, Any], notes: list[str]
) -> list[servers.Measured]:
    """tenantkv, and redis-server with ``--vs-redis``."""
    report.log("starting tenantkv ...")
    tkv = stack.enter_context(servers.tenantkv_server(None, args.server_cpus))
    user, password = servers.prepare_tenantkv(tkv, BUCKET, dedicated_user=True)
    targets: list[servers.Measured] = [
        ("tenantkv", tkv, Target(tkv.host, tkv.port, TenantKVCodec(user, password, BUCKET)))
    ]
    meta["servers"]["tenantkv"] = servers.describe(tkv)
    if args.vs_redis:
        rd = servers.vs_redis(stack, args.server_cpus, meta)
        if rd is None:
            notes.append(servers.NO_REDIS)
        else:
            targets.append(rd)
            if "E" in args.workloads:
                notes.append(E_ON_REDIS)
    return targets


def _measure(args: argparse.Namespace, targets: list[servers.Measured], value: bytes) -> list[Cell]:
    """Every cell of the plan on every server that can run it."""
    cells: list[Cell] = []
    for wname, dist in cell_plan(args.workloads, args.distributions):
        w = workloads.WORKLOADS[wname]
        spec = LoadSpec(
            op=WORKLOAD,
            conns=args.conns,
            depth=args.depth,
            value=value,
            keys=args.records,
            seconds=args.seconds,
            warmup=args.warmup,
            rate=args.rate * w.requests_per_op if args.rate else None,
            workers=args.workers,
            cpus=args.client_cpus,
            key_prefix=_prefix(wname, dist),
            poisson=bool(args.rate),
            seed=args.seed,
            workload=wname,
            distribution=dist,
        )
        runnable = [t for t in targets if not w.scans or hasattr(t[2].codec, "encode_scan")]

        def preload(target: Target, spec: LoadSpec = spec) -> None:
            loadgen.preload(target, args.records, value, spec.key_prefix)

        cells += report.run_on_each(runnable, spec, Cell, f"{wname} {dist:<7}", preload)
    return cells


def _print(
    args: argparse.Namespace,
    meta: dict[str, Any],
    cells: list[Cell],
    names: list[str],
    notes: list[str],
) -> None:
    out = sys.stderr if args.json == "-" else sys.stdout
    mode = (
        f"open loop, Poisson arrivals at {args.rate:,.0f} ops/s per cell "
        "(latency from the scheduled send)"
        if args.rate
        else f"closed loop, {args.conns} conns x {args.depth} outstanding"
    )
    pin = servers.pinned(args)
    print(
        f"\nycsb: {args.records:,} records of {args.value_size} B preloaded per cell, "
        f"{args.seconds:g} s per cell after {args.warmup:g} s warm-up, {mode}; "
        f"SETs durable{' on both sides' if len(names) > 1 else ''}\n{servers.versions_line(meta)}\n"
        f"machine: {report.machine_line(meta)}{'; ' + pin if pin else ''}\n",
        file=out,
    )
    print(format_table(cells, names), file=out)
    notes += [
        "ops/s = YCSB operations/s; F's read-modify-write is a GET + a SET of one key "
        "(2 requests: F's requests/s = 1.5 x its ops/s). Latencies are per request, "
        "all ops of a cell together.",
        "D uses YCSB's 'latest' distribution (newest records hottest) whatever "
        "--distributions says; inserts (D, E) become overwrites once the request ring "
        "wraps (bench/workloads.py).",
    ]
    print("\nnotes:", file=out)
    for n in notes:
        print(f"- {n}", file=out)
    print(f"\n({meta['elapsed_s']:g} s)", file=out)


def _ratios(cells: list[Cell], names: list[str]) -> list[dict[str, Any]]:
    """tenantkv / redis per cell both ran (E is not run on redis)."""
    if "tenantkv" not in names or "redis" not in names:
        return []
    out = []
    for c in cells:
        r = ratio(cells, c.key, "tenantkv", "redis") if c.server == "tenantkv" else None
        if r is not None:
            out.append(
                {"workload": c.key[0], "distribution": c.key[1], "tenantkv_over_redis": round(r, 3)}
            )
    return out
