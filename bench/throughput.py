"""``python -m bench throughput``: GET and durable SET ops/s over a grid of cells.

The grid is op x connections x pipeline depth (default get,set x 1,16 x 1,64)
at one value size. Every cell gets a warm-up, then a fixed measuring window.
With ``--vs-redis`` each cell runs on tenantkv and then on a redis-server with
``appendfsync always``, back to back with the same load loop, so drift on the
shared machine (page cache, disk, CPU frequency) hits both sides alike and the
ratio compares like with like.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import Target, TenantKVCodec
from bench.options import Quick

BUCKET = "bench"


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.window_flags(
        p, 3.0, Quick(0.5, 0.1), what=("measuring window per cell", "warm-up per cell", "")
    )
    options.data_flags(p, Quick(10_000, 1000), keys_help="distinct keys written and read")
    options.add(p, "--ops", options.names(loadgen.OPS, "ops"), ["get", "set"], "ops to run")
    options.add(p, "--conns", options.int_list, Quick([1, 16], [1, 4]), "connection counts")
    options.add(p, "--depths", options.int_list, [1, 64], "pipeline depths")
    options.add(
        p,
        "--workers",
        int,
        os.cpu_count() or 2,
        "most load-generator processes per cell; connections are spread over them",
        show="CPU count",
        low=1,
    )
    options.add(
        p,
        "--rate",
        float,
        None,
        "open loop: total target ops/s per cell, spread evenly over the connections; "
        "latency counts from the scheduled send time [closed loop, max rate]",
        above=0,
    )
    options.pin_flag(
        p,
        "split = servers on the first CPU, the load generator on the others "
        "(repeatable 1-connection cells)",
    )
    p.add_argument("--vs-redis", action="store_true", help="also run redis-server and compare")
    options.json_flag(p)
    options.quick_flag(p, "a fast smoke run (see [... quick ...])")
    options.server_flags(p)


def _finish_args(args: argparse.Namespace) -> None:
    options.check(
        not args.host or bool(args.password), "--host needs --password (or env TENANTKV_PASSWORD)"
    )


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    value = report.value_bytes(args.value_size, b"bench")
    servers.pin_cpus(args)
    meta: dict[str, Any] = {
        "machine": report.machine_info(),
        "source": report.source_info(),
        "settings": _settings(args),
        "servers": {},
    }
    with contextlib.ExitStack() as stack:
        targets = _start(stack, args, meta)
        for name, _, target in targets:
            report.log(f"preloading {args.keys} keys of {args.value_size} B into {name} ...")
            loadgen.preload(target, args.keys, value)
        t0 = time.monotonic()
        cells = _measure(args, targets, value)
        meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    names = [n for n, _, _ in targets]
    _print(args, meta, targets[0][1], cells, names)
    if args.json:
        report.write_json(args.json, report.results_doc(cells, names, meta))
    return 1 if any(c.result.errors for c in cells) else 0


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "seconds": args.seconds,
        "warmup": args.warmup,
        "value_size": args.value_size,
        "keys": args.keys,
        "workers": args.workers,
        "mode": "open loop" if args.rate else "closed loop",
        "rate": args.rate,
        "pin": args.pin,
        "server_cpus": sorted(args.server_cpus) if args.server_cpus else None,
        "client_cpus": sorted(args.client_cpus) if args.client_cpus else None,
    }


def _start(
    stack: contextlib.ExitStack, args: argparse.Namespace, meta: dict[str, Any]
) -> list[servers.Measured]:
    """tenantkv (started, or ``--host``), and redis-server with ``--vs-redis``."""
    if args.host:
        tkv = servers.ServerHandle(
            "tenantkv", args.host, args.port, user=args.user, password=args.password
        )
        user, password = servers.prepare_tenantkv(tkv, BUCKET, dedicated_user=False)
    else:
        report.log("starting tenantkv ...")
        tkv = stack.enter_context(servers.tenantkv_server(args.data_dir, args.server_cpus))
        user, password = servers.prepare_tenantkv(tkv, BUCKET, dedicated_user=True)
    codec = TenantKVCodec(user, password, BUCKET)
    targets: list[servers.Measured] = [("tenantkv", tkv, Target(tkv.host, tkv.port, codec))]
    meta["servers"]["tenantkv"] = servers.describe(tkv)
    if args.vs_redis:
        rd = servers.vs_redis(stack, args.server_cpus, meta)
        if rd is None:
            note = f"NOTE: {servers.NO_REDIS}."
            print(note, file=sys.stderr if args.json == "-" else sys.stdout)
            meta["redis_skipped"] = note
        else:
            targets.append(rd)
    return targets


def _measure(
    args: argparse.Namespace, targets: list[servers.Measured], value: bytes
) -> list[report.Cell]:
    """Every cell of the grid on every server, back to back."""
    cells: list[report.Cell] = []
    for op, conns, depth in itertools.product(args.ops, args.conns, args.depths):
        spec = loadgen.cell_spec(
            args, op, conns, depth, value, rate=args.rate, workers=args.workers
        )
        for name, handle, target in targets:
            res = loadgen.run_load(target, spec, handle.cpu_seconds)
            cell = report.Cell(name, spec, res)
            cells.append(cell)
            j = cell.to_json()
            report.log(
                f"  {name:<8} {op} conns={conns:<3} depth={depth:<3} "
                f"{res.ops_per_s:>10,.0f} ops/s  p50 {j['p50_us']} µs  "
                f"p99 {j['p99_us']} µs  errors {res.errors}"
            )
    return cells


def _print(
    args: argparse.Namespace,
    meta: dict[str, Any],
    tkv: servers.ServerHandle,
    cells: list[report.Cell],
    names: list[str],
) -> None:
    out = sys.stderr if args.json == "-" else sys.stdout
    mode = (
        f"open loop at {args.rate:,.0f} ops/s per cell (latency from scheduled send)"
        if args.rate
        else "closed loop (max throughput)"
    )
    src = meta["source"]
    versions = f"tenantkv {tkv.version}"
    if src["commit"]:
        versions += f" @ {src['commit']}" + (
            " (+local changes)" if src["server_code_modified"] else ""
        )
    if "redis" in meta["servers"]:
        versions += f"; redis {meta['servers']['redis']['version']} (appendfsync always)"
    pin = servers.pinned(args)
    print(
        f"\nthroughput: {args.value_size} B values, {args.keys} keys, {args.seconds:g} s per cell "
        f"after {args.warmup:g} s warm-up, {mode}; SET is durable on both sides\n"
        f"{versions}\n"
        f"machine: {report.machine_line(meta)}{f' ({pin})' if pin else ''}; "
        f"cli% = load generator, srv% = server, % of one core\n",
        file=out,
    )
    print(report.format_table(cells, names), file=out)
