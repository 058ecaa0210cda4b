"""``python -m bench workers``: one worker process against N, on this machine's cores.

``serve --workers N`` is meant to turn more cores into more throughput without
costing more CPU per operation and without splitting group commits into
smaller ones (docs/scaling.md). This measures exactly that, against issue 19's
targets, for each ``--workers-list`` entry against the first (1):

- **pipelined GET** on the RESP port, driven by ``redis-benchmark``: ops/s
  (target: 2 workers >= 1.5x one) and server CPU µs per operation, summed over
  the supervisor and every worker (target: <= 1.1x one);
- **durable SET** on the RESP port, same shape: ops/s and ops per group commit
  (``storage.writer.ops_committed`` / ``batches`` over the run, node totals),
  both >= one worker's;
- **GET on the MessagePack-RPC port** with :mod:`bench.loadgen`, same shape,
  with the generator's own CPU: informational (no target), since a Python
  generator on the same two cores takes much of the machine the workers need;
- **durable SET on the MessagePack-RPC port** with :mod:`bench.loadgen` (issue
  35's targets: ops/s >= one worker's, server CPU per SET <= 1.3x one worker's),
  where a worker's writes travel to the node's writer: the link's cost.

Why ``redis-benchmark``: the generator shares the two cores with the server (no
``--pin`` by default: a worker per core is the point, and pinning the server to
one core would measure nothing), so it must be light. ``redis-benchmark`` is C,
one thread, epoll; it takes a fraction of a core where our Python generator
takes one or more.

Why fresh servers and alternating rounds: the machine is shared and noisy, and
an idle ``--workers 2`` server still spends a few % of a core on its 100 ms
lease round. So only one server runs at a time, each round starts a fresh one
per configuration in the order 1, 2, 1, 2, ..., every cell is measured in
every round, and the tables show medians. Ratios are ratios of medians.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from bench import cpu, loadgen, options, report, resp, servers, throttle
from bench.loadgen import BenchError, LoadSpec, Target, TenantKVCodec
from bench.options import Quick

BUCKET = "bench"
#: the loads: (front door, op). RESP GET and SET carry the targets.
LOADS = (("resp", "get"), ("resp", "set"), ("msgpack", "get"), ("msgpack", "set"))
#: issue 19's targets, N workers over 1
GET_SPEEDUP = 1.5
CPU_RATIO = 1.1
SET_RATIO = 1.0
#: issue 35's target for durable SET from the Python generator (MessagePack):
#: server CPU per SET, all processes, N workers over 1
SET_CPU_RATIO = 1.3


def _workers_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of worker counts") from None
    if len(out) < 2 or out[0] != 1 or any(not 1 <= n <= 256 for n in out):
        raise argparse.ArgumentTypeError(
            "at least two worker counts, 1 first (the baseline), each 1 to 256: e.g. 1,2"
        )
    return list(dict.fromkeys(out))


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(
        p,
        "--workers-list",
        _workers_list,
        [1, 2],
        "worker counts to compare, the first (1) is the baseline",
        metavar="1,N[,M]",
    )
    options.add(
        p,
        "--shapes",
        cpu._shapes,
        Quick([(16, 64), (64, 64)], [(16, 64)]),
        "CONNSxPIPELINE list (-c x -P)",
        show="16x64,64x64; quick 16x64",
    )
    load_names = [f"{d}-{o}" for d, o in LOADS]
    options.add(
        p,
        "--loads",
        options.names(load_names, "loads"),
        load_names,
        "resp-get, resp-set, msgpack-get, msgpack-set (comma-separated)",
        show="all four",
    )
    resp.redis_benchmark_flags(
        p, Quick(10_000, 2000), Quick(3.0, 0.5), "rounds (1,N,1,N,...), median kept"
    )
    options.pin_flag(
        p,
        "split = every server process on the first CPU, the generators on the others "
        "(one core for N workers: for comparison only, the targets assume none)",
    )
    options.quick_flag(p, "1 round of 0.5 s, 16x64 only, 2000 keys (about 15 s)")
    options.json_flag(p)


def _finish_args(args: argparse.Namespace) -> None:
    options.check(
        not any(ld.startswith("resp-") for ld in args.loads)
        or resp.find_redis_benchmark() is not None,
        "redis-benchmark is not on PATH (Debian: apt-get install redis-tools)",
    )
    servers.pin_cpus(args)


# -- one server, every cell ------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    door: str
    op: str
    conns: int
    depth: int

    @property
    def name(self) -> str:
        door = "RESP" if self.door == "resp" else "MessagePack"
        return f"{door} {self.op.upper()} {self.conns}x{self.depth}"

    def to_json(self) -> dict[str, Any]:
        return {"door": self.door, "op": self.op, "conns": self.conns, "depth": self.depth}


def _cells(args: argparse.Namespace) -> list[Cell]:
    out = []
    for load in args.loads:
        door, op = load.split("-")
        out += [Cell(door, op, c, d) for c, d in args.shapes]
    return out


def _status(handle: servers.ServerHandle) -> dict[str, Any]:
    import tenantkv

    assert handle.password is not None
    with tenantkv.Client(handle.host, handle.port, user="admin", password=handle.password) as c:
        return dict(c.server_status())


def _worker_ops(st: dict[str, Any]) -> list[int]:
    """Operations so far, one entry per worker (one entry for a single process)."""
    if "workers" in st:
        return [int(w["ops"]) for w in st["workers"]]
    return [sum(sum(b.get("ops", {}).values()) for b in st.get("buckets", {}).values())]


@contextlib.contextmanager
def _split(handle: servers.ServerHandle) -> Iterator[dict[str, Any]]:
    """Each worker's share of the operations done in the ``with`` block.

    Connections land on whichever worker the kernel wakes: an uneven split is
    the first thing to look at when N workers do not scale.
    """
    got: dict[str, Any] = {}
    before = _worker_ops(_status(handle))
    yield got
    after = _worker_ops(_status(handle))
    done = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(done)
    got["worker_share_pct"] = [round(100 * d / total, 1) for d in done] if total else None


@contextlib.contextmanager
def _machine(handle: servers.ServerHandle) -> Iterator[dict[str, Any]]:
    """CPU over the ``with`` block of what is not ours, and of the supervisor alone.

    On two cores, two busy workers leave no slack: any other process on the
    machine takes its CPU from them, where one worker leaves a core to absorb
    it. So each run says how much CPU other processes took (% of one core);
    a round with a lot of it is a disturbed round, not a scaling figure. The
    supervisor's own share is what the quota and connection traffic cost.
    """
    got: dict[str, Any] = {}
    others0, _ = throttle.machine_cpu()
    sup0, t0 = servers._proc_cpu(handle.pid) if handle.pid else None, time.monotonic()
    yield got
    others1, _ = throttle.machine_cpu()
    sup1, dt = servers._proc_cpu(handle.pid) if handle.pid else None, time.monotonic() - t0
    # a process new since the first snapshot: all of its CPU is in the window
    other = sum(max(0.0, c - others0.get(pid, 0.0)) for pid, c in others1.items())
    got["other_cpu_pct"] = round(100 * other / dt, 1) if dt > 0 else None
    if handle.workers > 1 and sup0 is not None and sup1 is not None and dt > 0:
        got["supervisor_cpu_pct"] = round(100 * (sup1 - sup0) / dt, 2)


def _r(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def _measure_resp(
    args: argparse.Namespace, side: resp.RespSide, cell: Cell, procs: int
) -> dict[str, Any]:
    # The first measure() of a cell sizes -n with probe runs, which also warm
    # the server up; it is measured like any run.
    with _split(side.handle) as split, _machine(side.handle) as mach:
        res = side.measure(args, cell.op, cell.conns, cell.depth)
    out = res.to_json()
    out["server_cpu_pct"] = _r(
        100 * res.server_cpu_s / res.wall_s
        if res.server_cpu_s is not None and res.wall_s
        else None,
        1,
    )
    out["processes"] = procs
    out.update(split)
    out.update(mach)
    return out


def _measure_msgpack(
    args: argparse.Namespace, handle: servers.ServerHandle, target: Target, cell: Cell, procs: int
) -> dict[str, Any]:
    spec = LoadSpec(
        op=cell.op,
        conns=cell.conns,
        depth=cell.depth,
        value=resp.VALUE_BYTE * args.value_size,
        keys=args.keys,
        seconds=args.seconds,
        warmup=args.warmup,
        cpus=args.client_cpus,
        key_prefix=resp.KEY_PREFIX,
    )
    commits = resp._commits(handle if cell.op == "set" else None)
    with _split(handle) as split, _machine(handle) as mach, commits as wpc:
        res = loadgen.run_load(target, spec, handle.cpu_seconds)
    return {
        **resp.loadgen_figures(res, wpc()),
        "processes": procs,
        **split,
        **mach,
    }


def one_server(args: argparse.Namespace, workers: int, cells: list[Cell]) -> dict[Cell, Any]:
    """Start ``serve --workers N``, preload, measure every cell once, stop it."""
    value = resp.VALUE_BYTE * args.value_size
    out: dict[Cell, Any] = {}
    with servers.tenantkv_server(cpus=args.server_cpus, workers=workers) as h:
        if h.resp_port is None:
            raise BenchError("tenantkv's ready file names no resp_port: RESP door off?")
        procs = h.process_count()
        if procs != workers + (1 if workers > 1 else 0):
            raise BenchError(f"--workers {workers}: found {procs} server processes")
        user, password = servers.prepare_tenantkv(h, BUCKET, dedicated_user=True)
        target = Target(h.host, h.port, TenantKVCodec(user, password, BUCKET))
        # RESP and MessagePack loads read the same preloaded records
        loadgen.preload(target, args.keys, value, resp.KEY_PREFIX)
        # user@bucket picks the bucket on the RESP port (docs/redis.md)
        side = resp.RespSide("resp", h, h.resp_port, f"{user}@{BUCKET}", password, {})
        for cell in cells:
            if cell.door == "resp":
                out[cell] = _measure_resp(args, side, cell, procs)
            else:
                out[cell] = _measure_msgpack(args, h, target, cell, procs)
            report.log(f"    {workers} worker(s) {cell.name}: {_run_line(out[cell])}")
    return out


def _run_line(r: dict[str, Any]) -> str:
    text = (
        f"{_f(r['ops_per_s'], ',.0f')} ops/s, {_f(r['server_us_per_op'], '.2f')} µs/op, "
        f"server {_f(r.get('server_cpu_pct'), '.0f')} %, client "
        f"{_f(r.get('client_cpu_pct'), '.0f')} %"
    )
    if r.get("writes_per_commit") is not None:
        text += f", {r['writes_per_commit']:.0f} ops/commit"
    if r.get("other_cpu_pct") is not None:
        text += f", other {r['other_cpu_pct']:.0f} %"
    if r.get("worker_share_pct") and len(r["worker_share_pct"]) > 1:
        text += ", split " + "/".join(f"{x:.0f}" for x in r["worker_share_pct"])
    if r.get("error"):
        text += f"  ERROR {r['error']}"
    return text


# -- the run -------------------------------------------------------------------------------


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    return cpu._median(rounds, key)


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    shares = [r["worker_share_pct"] for r in rounds if r.get("worker_share_pct")]
    errors = [r["error"] for r in rounds if r.get("error")]
    return {
        "ops_per_s": _median(rounds, "ops_per_s"),
        "server_us_per_op": _median(rounds, "server_us_per_op"),
        "server_cpu_pct": _median(rounds, "server_cpu_pct"),
        "client_cpu_pct": _median(rounds, "client_cpu_pct"),
        "ops_per_commit": _median(rounds, "writes_per_commit"),
        "p50_ms": _median(rounds, "p50_ms"),
        "p99_ms": _median(rounds, "p99_ms"),
        "other_cpu_pct": _median(rounds, "other_cpu_pct"),
        "supervisor_cpu_pct": _median(rounds, "supervisor_cpu_pct"),
        # the most uneven split of any round: the one that explains a bad figure
        "worker_share_pct": max(shares, key=max) if shares else None,
        "errors": sum(r.get("errors") or (1 if r.get("error") else 0) for r in rounds),
        "error_sample": errors[0] if errors else None,
        "rounds": rounds,
    }


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    cells = _cells(args)
    meta = report.run_meta(args)
    meta["redis_benchmark"] = resp._version([resp.find_redis_benchmark() or "", "--version"])
    runs: dict[tuple[Cell, int], list[dict[str, Any]]] = {
        (c, n): [] for c in cells for n in args.workers_list
    }
    t0 = time.monotonic()
    for i in range(args.rounds):
        for n in args.workers_list:
            report.log(f"round {i + 1}/{args.rounds}: serve --workers {n} ...")
            for cell, res in one_server(args, n, cells).items():
                runs[(cell, n)].append(res)
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    base = args.workers_list[0]
    rows: list[dict[str, Any]] = []
    for cell in cells:
        by = {str(n): _summary(runs[(cell, n)]) for n in args.workers_list}
        b = by[str(base)]
        ratios = {
            str(n): {
                "ops_per_s": _div(by[str(n)]["ops_per_s"], b["ops_per_s"]),
                "server_us_per_op": _div(by[str(n)]["server_us_per_op"], b["server_us_per_op"]),
                "ops_per_commit": _div(by[str(n)]["ops_per_commit"], b["ops_per_commit"]),
            }
            for n in args.workers_list[1:]
        }
        rows.append({**cell.to_json(), "size": args.value_size, "workers": by, "ratios": ratios})
    checks = _checks(rows, args.workers_list)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(_header(args, meta), file=out)
    print(_table(rows, args.workers_list), file=out)
    print(_ratio_table(rows, args.workers_list), file=out)
    _print_checks(checks, out)
    print(f"\n({meta['elapsed_s']:g} s)", file=out)
    if args.json:
        report.write_json(
            args.json,
            {
                "benchmark": "workers",
                "meta": meta,
                "cells": rows,
                "checks": checks,
                "all_met": all(c["met"] for c in checks) if checks else None,
            },
        )
    failed = any(s["errors"] for r in rows for s in r["workers"].values())
    return 1 if failed else 0


def _checks(rows: list[dict[str, Any]], workers: list[int]) -> list[dict[str, Any]]:
    """Issue 19's targets for each N in ``workers`` past the baseline, on the RESP loads,
    and issue 35's on the MessagePack SET load."""
    out: list[dict[str, Any]] = []

    def add(figure: str, value: float | None, target: str, ok: bool | None) -> None:
        out.append(
            {"scenario": "workers", "figure": figure, "value": value, "target": target, "met": ok}
        )

    for n in workers[1:]:
        for r in rows:
            ratio = r["ratios"][str(n)]
            shape = f"{r['op'].upper()} {r['conns']}x{r['depth']}"
            if r["door"] != "resp":
                if r["op"] == "set":
                    v = ratio["ops_per_s"]
                    add(f"MessagePack {shape}: ops/s {n} ÷ 1 workers", v, f">= {SET_RATIO:.2f}",
                        None if v is None else v >= SET_RATIO)  # fmt: skip
                    v = ratio["server_us_per_op"]
                    add(f"MessagePack {shape}: CPU/op {n} ÷ 1 workers", v,
                        f"<= {SET_CPU_RATIO:.2f}",
                        None if v is None else v <= SET_CPU_RATIO)  # fmt: skip
                continue
            if r["op"] == "get":
                v = ratio["ops_per_s"]
                add(f"{shape}: ops/s {n} ÷ 1 workers", v, f">= {GET_SPEEDUP:.2f}",
                    None if v is None else v >= GET_SPEEDUP)  # fmt: skip
                v = ratio["server_us_per_op"]
                add(f"{shape}: CPU/op {n} ÷ 1 workers", v, f"<= {CPU_RATIO:.2f}",
                    None if v is None else v <= CPU_RATIO)  # fmt: skip
            else:
                v = ratio["ops_per_s"]
                add(f"{shape}: ops/s {n} ÷ 1 workers", v, f">= {SET_RATIO:.2f}",
                    None if v is None else v >= SET_RATIO)  # fmt: skip
                v = ratio["ops_per_commit"]
                add(f"{shape}: ops/commit {n} ÷ 1 workers", v, f">= {SET_RATIO:.2f}",
                    None if v is None else v >= SET_RATIO)  # fmt: skip
    return out


# -- printing ------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return cpu._f(x, fmt)


def _header(args: argparse.Namespace, meta: dict[str, Any]) -> str:
    place = "not pinned: the server processes and the load generator share every core"
    if args.server_cpus:
        place = f"pinned: every server process on CPU {sorted(args.server_cpus)}, "
        place += f"generators on {sorted(args.client_cpus)}"
    m = meta["machine"]
    return (
        f"\nworkers: {report.version_line(meta)}; {meta['redis_benchmark']}\n"
        f"serve --workers N for N in {','.join(map(str, args.workers_list))}, a fresh server "
        f"per round, rounds alternate ({args.rounds}), medians shown\n"
        f"RESP: redis-benchmark -t get|set -c CONNS -P PIPELINE -d {args.value_size} "
        f"-r {args.keys}, -n sized for ~{args.seconds:g} s; MessagePack: bench/loadgen.py, "
        "same shape, same keys (preloaded)\n"
        f"machine: {m['cpus']} cores ({m['cpu_model']}); {place}\n"
        "µs/op = server CPU per request, summed over the supervisor and every worker; "
        "server/client % of one core; other % = every process that is neither server nor "
        "generator (the shared machine's noise); ops/commit = node ops_committed / batches; "
        "split = each worker's share of the ops (most uneven round)\n"
    )


def _table(rows: list[dict[str, Any]], workers: list[int]) -> str:
    head = (
        "| load | c x P | workers | ops/s | server µs/op | server % | of it supervisor % "
        "| client % | other % | ops/commit | p99 ms | worker split % |\n|" + "---|" * 12
    )
    lines = [head]
    for r in rows:
        cell = Cell(r["door"], r["op"], r["conns"], r["depth"])
        for n in workers:
            s = r["workers"][str(n)]
            split = s["worker_share_pct"]
            lines.append(
                f"| {cell.name.rsplit(' ', 1)[0]} | {r['conns']}x{r['depth']} | {n} "
                f"| {_f(s['ops_per_s'], ',.0f')}{'!' if s['errors'] else ''} "
                f"| {_f(s['server_us_per_op'], '.2f')} | {_f(s['server_cpu_pct'], '.0f')} "
                f"| {_f(s['supervisor_cpu_pct'], '.1f')} | {_f(s['client_cpu_pct'], '.0f')} "
                f"| {_f(s['other_cpu_pct'], '.0f')} | {_f(s['ops_per_commit'], ',.0f')} "
                f"| {_f(s['p99_ms'], '.2f')} "
                f"| {'/'.join(f'{x:.0f}' for x in split) if split and len(split) > 1 else ''} |"
            )
    return "\n".join(lines)


def _ratio_table(rows: list[dict[str, Any]], workers: list[int]) -> str:
    lines = [
        "\n| load | c x P | workers | ops/s ÷ 1 worker | CPU/op ÷ 1 worker "
        "| ops/commit ÷ 1 worker |\n|" + "---|" * 6
    ]
    for r in rows:
        cell = Cell(r["door"], r["op"], r["conns"], r["depth"])
        for n in workers[1:]:
            x = r["ratios"][str(n)]
            lines.append(
                f"| {cell.name.rsplit(' ', 1)[0]} | {r['conns']}x{r['depth']} | {n} "
                f"| {_f(x['ops_per_s'], '.2f')} | {_f(x['server_us_per_op'], '.2f')} "
                f"| {_f(x['ops_per_commit'], '.2f')} |"
            )
    return "\n".join(lines)


def _print_checks(checks: list[dict[str, Any]], out: TextIO) -> None:
    if not checks:
        return
    print(
        f"\ntargets (issue 19): pipelined GET ops/s >= {GET_SPEEDUP}x and CPU/op <= "
        f"{CPU_RATIO}x one worker's; durable SET ops/s and ops/commit >= one worker's; "
        f"(issue 35) MessagePack SET ops/s >= {SET_RATIO}x and CPU/op <= {SET_CPU_RATIO}x",
        file=out,
    )
    for c in checks:
        met = {True: "met", False: "MISSED", None: "-"}[c["met"]]
        print(f"  {c['figure']:<44} {_f(c['value'], '.2f'):>6}  {c['target']:<8} {met}", file=out)
