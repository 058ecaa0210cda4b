"""``python -m bench resp``: the RESP front door under ``redis-benchmark``.

Why ``redis-benchmark`` and not :mod:`bench.loadgen`: a Redis-compatible port
is only as good as what unmodified Redis tools see, and a load generator of
our own could share our own mistakes about the protocol. So both tenantkv's
RESP port and (``--vs-redis``) a real redis-server are driven by Debian's
``redis-benchmark`` (``redis-tools``), the same binary with the same flags,
cell by cell, back to back: GET, SET, INCR, MSET x connections (``-c``) x
pipeline (``-P``), 64-byte values (``-d``) over ``--keys`` random keys (``-r``).

For the target of issue 18 — RESP parsing is not the bottleneck — each GET
and SET cell is also run on the MessagePack-RPC port of the same daemon and
bucket with :mod:`bench.loadgen`, the generator every other benchmark uses,
with the same shape, the same key names and the same value bytes: RESP ops/s
over MessagePack ops/s should be >= 1. Its keys are drawn at random over
``--keys``, as ``redis-benchmark -r`` draws them (``--msgpack-keys random``,
the default): in order, a commit of 480 SETs dirties a few neighbouring
B-tree pages where random keys dirty ~200, measured at ~0.55 against ~2.05 ms
of CPU per commit (~3 µs per SET) and 2-3x its time, and a run of GETs reads
neighbouring records — a difference of the generators, not of the doors.

Each side also gets the server's CPU µs per operation: its ``/proc`` CPU time
(:meth:`bench.servers.ServerHandle.cpu_seconds`, as ``bench cpu`` reads it)
over the measured run, divided by the requests answered. On a 2-core machine
that is the figure that says what the server spent, whatever the client took.

``redis-benchmark`` has no time limit, only a request count (``-n``); each
side of a cell is sized by a short probe run (which doubles as its warm-up)
to last about ``--seconds``. It exits with an error on the first error reply,
so a cell either ran clean or is reported with the error it printed.
Exit status 1 when a tenantkv cell failed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench import cpu, loadgen, options, report, servers
from bench.loadgen import BenchError, RedisCodec, Target, TenantKVCodec
from bench.options import Quick

BUCKET = "bench"
OPS = ("get", "set", "incr", "mset")
#: the ops the MessagePack-RPC door is measured on too (its generator's ops)
MSGPACK_OPS = ("get", "set")
#: redis-benchmark's GET/SET/MSET keys are ``key:`` + 12 digits of ``-r``'s
#: random number; ``key:0000`` + loadgen's 8 digits gives the same names, so
#: the preload and the MessagePack load touch exactly the records RESP does
KEY_PREFIX = b"key:0000"
#: what redis-benchmark writes as the value of ``-d N``: N bytes of ``x``
VALUE_BYTE = b"x"
#: a probe run (sizing ``-n``) should take at least this long to be trusted
PROBE_SECONDS = 0.3
#: a redis-benchmark run longer than this many times its expected time has hung
HANG_FACTOR = 10.0


def find_redis_benchmark() -> str | None:
    return shutil.which("redis-benchmark")


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    p.add_argument("--vs-redis", action="store_true", help="also run redis-server and compare")
    p.add_argument(
        "--msgpack-keys",
        choices=("random", "ordered"),
        default="random",
        help="the MessagePack load's keys: at random, as redis-benchmark -r draws them, "
        "or in order [random]",
    )
    options.add(
        p, "--ops", options.names(OPS, "ops"), list(OPS), "redis-benchmark tests", show="all four"
    )
    options.add(
        p,
        "--shapes",
        cpu._shapes,
        list(cpu.SHAPES),
        "CONNSxPIPELINE list (-c x -P)",
        show="1x1,16x1,1x64,16x64",
    )
    redis_benchmark_flags(p, 10_000, Quick(2.0, 0.5), "rounds per cell, median kept")
    options.pin_flag(
        p,
        "split = servers on the first CPU, redis-benchmark and the load generator on the others",
    )
    options.quick_flag(p, "1 round of 0.5 s per cell (about a minute for the whole grid)")
    options.json_flag(p)


def redis_benchmark_flags(p: argparse.ArgumentParser, keys: Any, seconds: Any, rounds: str) -> None:
    """The load flags of a redis-benchmark subcommand (this one and ``workers``):
    ``-d``, ``-r``, each run's length, the MessagePack load's warm-up, rounds."""
    options.data_flags(
        p,
        keys,
        64,
        keys_help="keyspace (-r), preloaded",
        value_help="value bytes (-d)",
        value_low=1,
    )
    what = ("length of each measured run", "MessagePack load: warm-up before the window", rounds)
    options.window_flags(p, seconds, Quick(0.5, 0.2), Quick(3, 1), what=what)


def _finish_args(args: argparse.Namespace) -> None:
    servers.pin_cpus(args)


# -- one redis-benchmark run ----------------------------------------------------------


@dataclass
class BenchRun:
    """What one ``redis-benchmark`` invocation did, and what the server spent on it."""

    requests: int
    ops_per_s: float | None
    wall_s: float
    server_cpu_s: float | None
    client_cpu_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    error: str | None = None
    #: tenantkv writes: write commands per group commit over the run (an MSET is one)
    writes_per_commit: float | None = None

    @property
    def server_us_per_op(self) -> float | None:
        if self.error or self.server_cpu_s is None or not self.requests:
            return None
        return self.server_cpu_s / self.requests * 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "ops_per_s": _r(self.ops_per_s, 1),
            "server_us_per_op": _r(self.server_us_per_op, 2),
            "client_cpu_pct": _r(100 * self.client_cpu_s / self.wall_s if self.wall_s else None, 1),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "error": self.error,
            "writes_per_commit": _r(self.writes_per_commit, 1),
        }


def _r(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)


def command(
    port: int,
    *,
    test: str,
    conns: int,
    depth: int,
    requests: int,
    size: int,
    keys: int,
    user: str | None = None,
    password: str | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """The redis-benchmark command line of one run (``--csv``: one parseable row)."""
    exe = find_redis_benchmark()
    if exe is None:
        raise BenchError("redis-benchmark is not on PATH (Debian: apt-get install redis-tools)")
    cmd = [exe, "-h", host, "-p", str(port), "-t", test, "-c", str(conns), "-P", str(depth)]
    cmd += ["-n", str(requests), "-d", str(size), "-r", str(keys), "--csv"]
    if user is not None:
        cmd += ["--user", user]
    if password is not None:
        cmd += ["-a", password]
    return cmd


def parse_csv(text: str) -> dict[str, str] | None:
    """The one result row of ``redis-benchmark --csv -t X``, or None."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return rows[-1] if rows and rows[-1].get("rps") else None


def _float(row: dict[str, str], key: str) -> float | None:
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return None


def _error_text(stdout: str, stderr: str, rc: int) -> str:
    lines = [ln for ln in (stderr + "\n" + stdout).splitlines() if ln.strip()]
    # the warning about -a on the command line is not the error
    lines = [ln for ln in lines if "Using a password with" not in ln]
    return f"exit {rc}: " + (" | ".join(lines[-3:]) or "no output")[:300]


def start(cmd: list[str], cpus: frozenset[int] | None = None) -> subprocess.Popen[str]:
    """Start redis-benchmark (pinned to ``cpus``); finish it with :func:`finish`."""
    pin = None if not cpus else (lambda: os.sched_setaffinity(0, cpus))
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin
    )


def finish(proc: subprocess.Popen[str], requests: int, timeout: float) -> BenchRun:
    """Wait for a started redis-benchmark (killing it after ``timeout``) and parse it.

    Server CPU and client CPU are left for the caller, who knows the window.
    """
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        why = f"no end after {timeout:.0f} s (a hang?), killed; {_error_text(out, err, -9)}"
        return BenchRun(requests, None, time.monotonic() - t0, None, 0.0, error=why)
    row = parse_csv(out)
    if proc.returncode != 0 or row is None:
        return BenchRun(
            requests, None, 0.0, None, 0.0, error=_error_text(out, err, proc.returncode)
        )
    return BenchRun(
        requests,
        _float(row, "rps"),
        0.0,
        None,
        0.0,
        p50_ms=_float(row, "p50_latency_ms"),
        p99_ms=_float(row, "p99_latency_ms"),
    )


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_once(
    cmd: list[str],
    requests: int,
    server_cpu: Callable[[], float | None],
    cpus: frozenset[int] | None,
    timeout: float,
) -> BenchRun:
    """One redis-benchmark run, with the server's and the client's CPU over it."""
    cli0, srv0, t0 = _children_cpu(), server_cpu(), time.monotonic()
    res = finish(start(cmd, cpus), requests, timeout)
    srv1, wall = server_cpu(), time.monotonic() - t0
    res.wall_s = wall
    res.client_cpu_s = _children_cpu() - cli0
    if srv0 is not None and srv1 is not None:
        res.server_cpu_s = srv1 - srv0
    return res


@contextlib.contextmanager
def _commits(handle: servers.ServerHandle | None) -> Iterator[Callable[[], float | None]]:
    """Writes per group commit of a tenantkv daemon over the ``with`` block (None: not asked).

    A pipelined write load that commits in small batches is latency-bound on
    fsync, whatever the CPU figures say: this tells the two apart.
    """
    got: list[float | None] = [None]
    before = cpu._writer_stats(handle) if handle is not None else None
    yield lambda: got[0]
    if handle is not None and before is not None:
        after = cpu._writer_stats(handle)
        commits = after["batches"] - before["batches"]
        got[0] = (after["ops_committed"] - before["ops_committed"]) / commits if commits else None


# -- a side of a cell: one server and how to drive it ---------------------------------------


@dataclass
class RespSide:
    """A server driven by redis-benchmark (tenantkv's RESP port, or redis-server)."""

    name: str
    handle: servers.ServerHandle
    port: int
    user: str | None
    password: str | None
    #: ``-n`` per (op, conns, depth), found by the first probe and kept for the rounds
    sized: dict[tuple[str, int, int], int]

    def measure(self, args: argparse.Namespace, op: str, conns: int, depth: int) -> BenchRun:
        key = (op, conns, depth)

        def go(n: int, expect_s: float) -> BenchRun:
            cmd = command(
                self.port,
                test=op,
                conns=conns,
                depth=depth,
                requests=n,
                size=args.value_size,
                keys=args.keys,
                user=self.user,
                password=self.password,
                host=self.handle.host,
            )
            timeout = max(30.0, HANG_FACTOR * expect_s)
            return run_once(cmd, n, self.handle.cpu_seconds, args.client_cpus, timeout)

        if key not in self.sized:
            # Probe runs: grow -n until a run takes PROBE_SECONDS, then size the
            # measured runs from its rate. They also warm the server up.
            n = max(200, 8 * conns * depth)
            probe_s = min(PROBE_SECONDS, args.seconds / 2)
            for _ in range(5):
                r = go(n, probe_s)
                if r.error or not r.ops_per_s:
                    return r
                if math.isinf(r.ops_per_s):  # too short for redis-benchmark's clock
                    n *= 4
                    continue
                took = n / r.ops_per_s
                if took >= probe_s:
                    break
                n = max(n * 2, int(r.ops_per_s * probe_s * 1.2))
            self.sized[key] = max(8 * conns * depth, int(r.ops_per_s * args.seconds))
        n = self.sized[key]
        with _commits(self.handle if self.name == "resp" and op != "get" else None) as wpc:
            res = go(n, args.seconds)
        res.writes_per_commit = wpc()
        return res


# -- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    if find_redis_benchmark() is None:
        raise BenchError("redis-benchmark is not on PATH (Debian: apt-get install redis-tools)")
    value = VALUE_BYTE * args.value_size
    meta = report.run_meta(args)
    meta["redis_benchmark"] = _version([find_redis_benchmark() or "", "--version"])
    cells: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        report.log("starting tenantkv ...")
        tkv = stack.enter_context(servers.tenantkv_server(cpus=args.server_cpus))
        if tkv.resp_port is None:
            raise BenchError("tenantkv's ready file names no resp_port: RESP door off?")
        user, password = servers.prepare_tenantkv(tkv, BUCKET, dedicated_user=True)
        msgpack_target = Target(tkv.host, tkv.port, TenantKVCodec(user, password, BUCKET))
        # user@bucket picks the bucket (docs/redis.md), as any Redis client can say it
        sides = [RespSide("resp", tkv, tkv.resp_port, f"{user}@{BUCKET}", password, {})]
        meta["servers"] = {"tenantkv": {"version": tkv.version, "settings": tkv.settings}}
        if args.vs_redis and servers.find_redis() is not None:
            report.log("starting redis-server (appendonly yes, appendfsync always) ...")
            rd = stack.enter_context(servers.redis_server("always", args.server_cpus))
            sides.append(RespSide("redis", rd, rd.port, None, None, {}))
            meta["servers"]["redis"] = {"version": rd.version, "settings": rd.settings}
            loadgen.preload(Target(rd.host, rd.port, RedisCodec()), args.keys, value, KEY_PREFIX)
        elif args.vs_redis:
            report.log("NOTE: redis-server is not on PATH; measuring tenantkv only")
            meta["redis_skipped"] = "redis-server not on PATH"
        report.log(f"preloading {args.keys} keys of {args.value_size} B ...")
        loadgen.preload(msgpack_target, args.keys, value, KEY_PREFIX)
        t0 = time.monotonic()
        for op in args.ops:
            for conns, depth in args.shapes:
                row = _cell(args, op, conns, depth, value, sides, tkv, msgpack_target)
                cells.append(row)
                report.log("  " + _line(row))
        meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    checks = _checks(cells)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(_header(args, meta), file=out)
    print(_table(cells), file=out)
    _print_checks(checks, cells, out)
    if args.json:
        report.write_json(
            args.json,
            {
                "benchmark": "resp",
                "meta": meta,
                "cells": cells,
                "checks": checks,
                "all_met": all(c["met"] for c in checks) if checks else None,
            },
        )
    failed = any(c[n].get("errors") for c in cells for n in ("resp", "msgpack") if n in c)
    return 1 if failed else 0


def _version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


def _cell(
    args: argparse.Namespace,
    op: str,
    conns: int,
    depth: int,
    value: bytes,
    sides: list[RespSide],
    tkv: servers.ServerHandle,
    msgpack_target: Target,
) -> dict[str, Any]:
    """Every side of one cell, ``--rounds`` times interleaved; medians."""
    row: dict[str, Any] = {"op": op, "conns": conns, "depth": depth, "size": args.value_size}
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in sides}
    spec = None
    if op in MSGPACK_OPS:
        runs["msgpack"] = []
        spec = loadgen.cell_spec(
            args,
            op,
            conns,
            depth,
            value,
            key_prefix=KEY_PREFIX,
            random_keys=args.msgpack_keys == "random",
        )
    for _ in range(args.rounds):
        for s in sides:
            if any(r["error"] for r in runs[s.name]):
                continue  # an error (or a hang) once is the cell's finding: no repeats
            runs[s.name].append(s.measure(args, op, conns, depth).to_json())
        if spec is not None:
            with _commits(tkv if op != "get" else None) as wpc:
                res = loadgen.run_load(msgpack_target, spec, tkv.cpu_seconds)
            runs["msgpack"].append(loadgen_figures(res, wpc()))
    for name, rounds in runs.items():
        errors = [r["error"] for r in rounds if r.get("error")]
        row[name] = {
            "ops_per_s": cpu._median(rounds, "ops_per_s"),
            "server_us_per_op": cpu._median(rounds, "server_us_per_op"),
            "client_cpu_pct": cpu._median(rounds, "client_cpu_pct"),
            "p50_ms": cpu._median(rounds, "p50_ms"),
            "p99_ms": cpu._median(rounds, "p99_ms"),
            "writes_per_commit": cpu._median(rounds, "writes_per_commit"),
            "errors": sum(r.get("errors", 1 if r.get("error") else 0) for r in rounds),
            "error_sample": errors[0] if errors else None,
            "rounds": rounds,
        }
    _ratios(row)
    return row


def loadgen_figures(res: loadgen.LoadResult, writes_per_commit: float | None) -> dict[str, Any]:
    """One MessagePack run's figures (``bench/loadgen.py``), as a run of
    ``redis-benchmark`` reports them (:meth:`BenchRun.to_json`), so both doors'
    rounds take the same medians."""
    return {
        "requests": res.ok,
        "ops_per_s": round(res.ops_per_s, 1),
        "server_us_per_op": _r(
            res.server_cpu_s / res.ok * 1e6 if res.ok and res.server_cpu_s is not None else None,
            2,
        ),
        "server_cpu_pct": _r(
            100 * res.server_cpu_s / res.window_s if res.server_cpu_s is not None else None, 1
        ),
        "client_cpu_pct": _r(100 * res.client_cpu_s / res.window_s, 1),
        "p50_ms": _r(_ms(res.percentile_us(0.5)), 3),
        "p99_ms": _r(_ms(res.percentile_us(0.99)), 3),
        "errors": res.errors,
        "error": res.error_sample,
        "writes_per_commit": _r(writes_per_commit, 1),
    }


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _ratios(row: dict[str, Any]) -> None:
    resp, redis, mp = row["resp"], row.get("redis", {}), row.get("msgpack", {})
    row["resp_over_redis"] = _div(resp["ops_per_s"], redis.get("ops_per_s"))
    row["resp_over_msgpack"] = _div(resp["ops_per_s"], mp.get("ops_per_s"))
    row["cpu_resp_over_msgpack"] = _div(resp["server_us_per_op"], mp.get("server_us_per_op"))
    row["cpu_resp_over_redis"] = _div(resp["server_us_per_op"], redis.get("server_us_per_op"))


def _checks(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 18's target, per GET/SET load shape: RESP ops/s >= MessagePack ops/s."""
    out = []
    for c in cells:
        if c["op"] not in MSGPACK_OPS:
            continue
        ratio = c.get("resp_over_msgpack")
        out.append(
            {
                "scenario": "resp-vs-msgpack",
                "figure": f"{c['op'].upper()} {c['conns']}x{c['depth']}: RESP / MessagePack ops/s",
                "value": ratio,
                "target": ">= 1.00",
                "met": None if ratio is None else ratio >= 1.0,
            }
        )
    return out


# -- printing ------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return cpu._f(x, fmt)


def _line(row: dict[str, Any]) -> str:
    r, rd, mp = row["resp"], row.get("redis", {}), row.get("msgpack", {})
    return (
        f"{row['op']} {row['conns']}x{row['depth']}: RESP {_f(r['ops_per_s'], ',.0f')} ops/s "
        f"({_f(r['server_us_per_op'], '.1f')} µs/op), redis {_f(rd.get('ops_per_s'), ',.0f')}, "
        f"msgpack {_f(mp.get('ops_per_s'), ',.0f')}"
        + (f"  ERROR {r['error_sample']}" if r.get("error_sample") else "")
    )


def _header(args: argparse.Namespace, meta: dict[str, Any]) -> str:
    pin = servers.pinned(args)
    redis = meta["servers"].get("redis")
    return (
        f"\nresp: {report.version_line(meta)}"
        + (f"; redis-server {redis['version']} (appendfsync always)" if redis else "")
        + f"; {meta['redis_benchmark']}\n"
        f"redis-benchmark -t OP -c CONNS -P PIPELINE -d {args.value_size} -r {args.keys}, "
        f"-n sized for ~{args.seconds:g} s, median of {args.rounds} round(s); MessagePack "
        f"column: bench/loadgen.py, same shape, same keys ({args.msgpack_keys})\n"
        f"machine: {report.machine_line(meta, 'servers and clients')}"
        f"{'; ' + pin if pin else ''}; "
        "µs/op = server CPU per request (MSET: per 10-key command); writes/commit = "
        "write commands per group commit\n"
    )


def _table(cells: list[dict[str, Any]]) -> str:
    rows = [
        report.markdown_head(
            *("op", "c x P", "RESP ops/s", "redis ops/s", "RESP ÷ redis", "MessagePack ops/s"),
            *("RESP ÷ MessagePack", "RESP µs/op", "MessagePack µs/op", "redis µs/op"),
            "writes/commit RESP, MessagePack",
        )
    ]
    for c in cells:
        r, rd, mp = c["resp"], c.get("redis", {}), c.get("msgpack", {})
        bang = "!" if r.get("errors") else ""
        rows.append(
            f"| {c['op'].upper()} | {c['conns']}x{c['depth']} "
            f"| {_f(r['ops_per_s'], ',.0f')}{bang} | {_f(rd.get('ops_per_s'), ',.0f')} "
            f"| {_f(c['resp_over_redis'], '.2f')} | {_f(mp.get('ops_per_s'), ',.0f')} "
            f"| {_f(c['resp_over_msgpack'], '.2f')} | {_f(r['server_us_per_op'], '.1f')} "
            f"| {_f(mp.get('server_us_per_op'), '.1f')} | {_f(rd.get('server_us_per_op'), '.2f')} "
            f"| {commits_text(c)} |"
        )
    return "\n".join(rows)


def commits_text(cell: dict[str, Any]) -> str:
    """``RESP, MessagePack`` writes per group commit of a write cell, '' for reads."""
    if cell["op"] == "get":
        return ""
    mp = cell.get("msgpack", {}).get("writes_per_commit")
    return f"{_f(cell['resp'].get('writes_per_commit'), '.0f')}" + (
        f", {_f(mp, '.0f')}" if "msgpack" in cell else ""
    )


def _print_checks(checks: list[dict[str, Any]], cells: list[dict[str, Any]], out: Any) -> None:
    if checks:
        print("\ntarget (issue 18): RESP ops/s >= MessagePack ops/s, same load shape", file=out)
        for c in checks:
            met = {True: "met", False: "MISSED", None: "-"}[c["met"]]
            print(f"  {c['figure']:<45} {_f(c['value'], '.2f'):>6}  {met}", file=out)
    errs = [
        (c, n) for c in cells for n in ("resp", "redis", "msgpack") if c.get(n, {}).get("errors")
    ]
    if errs:
        print("\n! = errors (not counted in ops/s):", file=out)
        for c, n in errs:
            print(
                f"  {n} {c['op']} {c['conns']}x{c['depth']}: {c[n]['errors']} error(s), "
                f"e.g. {c[n]['error_sample']}",
                file=out,
            )
