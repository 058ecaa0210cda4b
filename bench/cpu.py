"""``python -m bench cpu``: server CPU per operation — tenantkv, the floor and redis-server.

The figure that drifts least on a shared machine is not ops/s but the CPU the
server process spends per operation (``/proc/<pid>/stat`` over the measured
window, all threads). Each cell (op x connections x pipeline depth x value
size) runs on three servers back to back with the same load generator:

- **tenantkv** — the daemon with its durable defaults;
- **floor** — ``bench/floor.py``: the same wire format on the same stack (Trio,
  msgpack, LMDB, group commit) with no gates: what the stack costs. tenantkv's
  µs/op over the floor's is what our own code costs;
- **redis** — redis-server with ``appendfsync always`` (when on PATH), spoken
  to in RESP by the same generator.

Each cell is measured ``--rounds`` times and the median kept. For tenantkv's
SETs the writer's statistics give the writes per commit over the window.
Exit status 1 when a cell had errors.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import BenchError, LoadSpec, RedisCodec, Target, TenantKVCodec

BUCKET = "bench"
SHAPES = ((1, 1), (16, 1), (1, 64), (16, 64))


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(n) for n in s.split("x")) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("shapes are CONNSxDEPTH, comma-separated") from None
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError("shapes are CONNSxDEPTH, comma-separated, each >= 1")
    return out  # type: ignore[return-value]


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.window_flags(
        p,
        2.0,
        0.5,
        3,
        what=(
            "measuring window per cell",
            "warm-up per cell",
            "rounds per cell; the median is kept",
        ),
    )
    options.add(p, "--keys", int, 10_000, "keys preloaded and read")
    options.add(p, "--ops", None, "get,set", "ops")
    options.add(
        p, "--shapes", _shapes, list(SHAPES), "CONNSxDEPTH list", show="1x1,16x1,1x64,16x64"
    )
    options.add(p, "--sizes", None, "64,4096", "value sizes in bytes")
    p.add_argument("--no-redis", action="store_true", help="leave redis-server out")
    options.quick_flag(p, "1 round of 0.5 s, 64 B, 1x1 and 16x64")
    p.add_argument("--json", metavar="PATH", help="write the cells as JSON here")


def _writer_stats(server: servers.ServerHandle) -> dict[str, Any]:
    import tenantkv

    with tenantkv.Client(
        server.host, server.port, user=server.user or "admin", password=server.password or ""
    ) as c:
        return dict(c.server_status()["storage"]["writer"])


def _measure(
    name: str, handle: servers.ServerHandle, target: Target, spec: LoadSpec
) -> dict[str, Any]:
    import tenantkv

    with contextlib.ExitStack() as stack:
        status = None
        if name == "tenantkv" and spec.op == "set":
            # One admin connection, opened before the load: its login (a password
            # hash) stays out of the window.
            admin = stack.enter_context(
                tenantkv.Client(
                    handle.host,
                    handle.port,
                    user=handle.user or "admin",
                    password=handle.password or "",
                )
            )
            status = admin.server_status

        def probe() -> tuple[float | None, dict[str, Any] | None]:
            """The server's CPU seconds and its writer's statistics, at one edge
            of the window: writes per commit count the window's commits only,
            not the load's start and end (a first write commits alone)."""
            writer = dict(status()["storage"]["writer"]) if status is not None else None
            return handle.cpu_seconds(), writer

        (res,), samples = loadgen.run_loads([(target, spec)], probe)
    (cpu0, w0), (cpu1, w1) = samples[0][1], samples[-1][1]
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    cell: dict[str, Any] = {
        "ops_per_s": res.ops_per_s,
        "errors": res.errors,
        "error_sample": res.error_sample,
        "server_us_per_op": cpu / res.ok * 1e6 if res.ok and cpu is not None else None,
    }
    if w0 is not None and w1 is not None:
        commits = w1["batches"] - w0["batches"]
        ops = w1["ops_committed"] - w0["ops_committed"]
        cell["writes_per_commit"] = ops / commits if commits else None
    return cell


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def run(args: argparse.Namespace) -> int:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 0.5, 0.2
        sizes, args.shapes = [64], [(1, 1), (16, 64)]
    if any(o not in ("get", "set") for o in ops) or args.rounds < 1 or args.seconds <= 0:
        raise BenchError("--ops is a subset of get,set; --rounds >= 1; --seconds > 0")
    cells: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        report.log("starting tenantkv, the floor and redis-server ...")
        tkv = stack.enter_context(servers.tenantkv_server())
        user, password = servers.prepare_tenantkv(tkv, BUCKET, dedicated_user=True)
        targets = [
            ("tenantkv", tkv, Target(tkv.host, tkv.port, TenantKVCodec(user, password, BUCKET)))
        ]
        fl = stack.enter_context(servers.floor_server())
        targets.append(("floor", fl, Target(fl.host, fl.port, TenantKVCodec("-", "-", BUCKET))))
        if not args.no_redis and servers.find_redis() is not None:
            rd = stack.enter_context(servers.redis_server("always"))
            targets.append(("redis", rd, Target(rd.host, rd.port, RedisCodec())))
        elif not args.no_redis:
            report.log("NOTE: redis-server is not on PATH; measuring tenantkv and the floor only")
        t0 = time.monotonic()
        for size in sizes:
            value = report.value_bytes(size, b"cpu")
            for _, _, target in targets:
                loadgen.preload(target, args.keys, value)
            for op in ops:
                for conns, depth in args.shapes:
                    spec = loadgen.cell_spec(args, op, conns, depth, value)
                    row: dict[str, Any] = {"op": op, "conns": conns, "depth": depth, "size": size}
                    for name, handle, target in targets:
                        rounds = [_measure(name, handle, target, spec) for _ in range(args.rounds)]
                        row[name] = {
                            "server_us_per_op": _median(rounds, "server_us_per_op"),
                            "ops_per_s": _median(rounds, "ops_per_s"),
                            "errors": sum(r["errors"] for r in rounds),
                            "error_sample": next(
                                (r["error_sample"] for r in rounds if r["error_sample"]), None
                            ),
                        }
                        if name == "tenantkv" and op == "set":
                            row[name]["writes_per_commit"] = _median(rounds, "writes_per_commit")
                    _ratios(row)
                    cells.append(row)
                    report.log("  " + _line(row))
        elapsed = time.monotonic() - t0
    print(_table(cells))
    if args.json:
        meta = report.run_meta(args)
        meta["elapsed_s"] = round(elapsed, 1)
        report.write_json(args.json, {"benchmark": "cpu", "meta": meta, "cells": cells})
    return 1 if any(c[n]["errors"] for c in cells for n in ("tenantkv", "floor")) else 0


def _ratios(row: dict[str, Any]) -> None:
    t = row["tenantkv"]["server_us_per_op"]
    f = row["floor"]["server_us_per_op"]
    r = row.get("redis", {}).get("server_us_per_op")
    row["cpu_over_floor"] = t / f if t and f else None
    row["cpu_over_redis"] = t / r if t and r else None
    tops, rops = row["tenantkv"]["ops_per_s"], row.get("redis", {}).get("ops_per_s")
    row["ops_over_redis"] = tops / rops if tops and rops else None


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['op']} {row['conns']}x{row['depth']} {row['size']} B: tenantkv "
        f"{_f(row['tenantkv']['server_us_per_op'], '.1f')} µs/op, floor "
        f"{_f(row['floor']['server_us_per_op'], '.1f')}, redis "
        f"{_f(row.get('redis', {}).get('server_us_per_op'), '.2f')}"
    )


def _table(cells: list[dict[str, Any]]) -> str:
    rows = [
        report.markdown_head(
            *("op", "connsxdepth", "value", "tenantkv µs/op", "floor µs/op", "redis µs/op"),
            *("÷ floor", "÷ redis", "tenantkv ops/s", "floor ops/s", "redis ops/s"),
            *("ops ÷ redis", "writes/commit"),
        )
    ]
    for c in cells:
        t, f, r = c["tenantkv"], c["floor"], c.get("redis", {})
        rows.append(
            f"| {c['op'].upper()} | {c['conns']}x{c['depth']} | {c['size']} B "
            f"| {_f(t['server_us_per_op'], '.1f')} | {_f(f['server_us_per_op'], '.1f')} "
            f"| {_f(r.get('server_us_per_op'), '.2f')} | {_f(c['cpu_over_floor'], '.2f')}x "
            f"| {_f(c['cpu_over_redis'], '.1f')}x | {_f(t['ops_per_s'], ',.0f')} "
            f"| {_f(f['ops_per_s'], ',.0f')} | {_f(r.get('ops_per_s'), ',.0f')} "
            f"| {_f(c['ops_over_redis'], '.2f')} | {_f(t.get('writes_per_commit'), '.0f')} |"
        )
    return "\n".join(rows)
