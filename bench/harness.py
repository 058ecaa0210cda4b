"""``python -m bench list | run | all | smoke``: one harness over every scenario.

Each scenario is a preset invocation of one of the measuring subcommands
(``throughput``, ``throttle``, ``overload``, ...), so the detailed flags stay
where they are and the harness only decides *which* runs make up the published
figures. A run writes the subcommand's raw JSON wrapped in an envelope (what
ran, on which machine and versions, how long it took) to a folder of its own,
``bench/results/runs/<time>/<scenario>.json``, and says where; ``--publish``
writes ``bench/results/<scenario>.json`` instead, which ``python -m bench
report`` turns into ``docs/benchmarks.md``. A run for a look never replaces a
published figure.

Why in-process and sequential: every scenario starts its own daemon (and
redis-server) and forks its own load generators; running two at once on a
2-core machine would measure each other. A failing scenario is reported and
the rest still run, so one bad run does not cost an hour of results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench import options, report, servers
from bench.loadgen import BenchError

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
#: quick runs published go to their own folder so they never replace full results
QUICK_DIR = RESULTS_DIR / "quick"
#: every run that is not published gets a folder of its own here
RUNS_DIR = RESULTS_DIR / "runs"


@dataclass(frozen=True)
class Scenario:
    """One published measurement: a subcommand and the flags that define it."""

    name: str
    title: str
    what: str
    #: the subcommand and its flags for the full run
    argv: tuple[str, ...]
    #: rough wall time of the full and the quick run, in minutes (for progress)
    minutes: float
    quick_minutes: float
    #: flags added for --quick
    quick: tuple[str, ...] = ("--quick",)
    #: compares with redis-server: ``--vs-redis`` is added when it is on PATH
    redis: bool = False
    #: flags of the CI smoke run; None = not in the smoke set
    smoke: tuple[str, ...] | None = None
    #: the earlier issues whose targets this scenario measures
    issues: tuple[int, ...] = field(default=())


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "throughput",
        "GET throughput vs redis-server",
        "pipelined and unpipelined GET, 1 and 16 connections, same generator as redis",
        ("throughput", "--ops", "get", "--conns", "1,16", "--depths", "1,64", "--pin", "split"),
        1.0,
        0.3,
        redis=True,
        smoke=("--quick", "--seconds", "0.5", "--conns", "2", "--depths", "8"),
        issues=(2,),
    ),
    Scenario(
        "durable",
        "Durable SET vs redis-server appendfsync always",
        "SETs acknowledged after fsync, pipelined and not, 1 and 16 connections",
        ("throughput", "--ops", "set", "--conns", "1,16", "--depths", "1,64", "--pin", "split"),
        1.0,
        0.3,
        redis=True,
        smoke=("--quick", "--seconds", "0.5", "--conns", "2", "--depths", "8"),
        issues=(2,),
    ),
    Scenario(
        "ycsb",
        "YCSB workloads A-F",
        "core workloads with zipfian (0.99) and uniform keys, vs redis where it can run them",
        ("ycsb", "--pin", "split"),
        4.0,
        0.7,
        redis=True,
    ),
    Scenario(
        "gates",
        "Admission overhead: all gates on but generous vs off",
        "what the whole admission path costs when it never has to say no",
        ("gates",),
        2.0,
        0.6,
    ),
    Scenario(
        "throttle-overhead",
        "Tenant throttle on but unlimited vs off",
        "the throttle's fast path on GET and SET",
        ("throttle", "--scenario", "overhead"),
        1.0,
        0.3,
        issues=(3,),
    ),
    Scenario(
        "ticket-overhead",
        "Execution-ticket accounting vs no tickets",
        "read/write ticket pools sized so they never bind, vs none",
        ("probing", "--part", "overhead"),
        1.5,
        0.3,
        issues=(4,),
    ),
    Scenario(
        "overload",
        "Overload curve 0.5x-8x and the cost of a rejection",
        "Poisson GETs at multiples of the admitted capacity: goodput, latency, rejections",
        ("overload", "--part", "load,cost"),
        4.0,
        0.5,
        smoke=("--quick", "--part", "load", "--factors", "0.5,4", "--seconds", "1"),
        issues=(5,),
    ),
    Scenario(
        "isolation",
        "Tenant isolation and fairness",
        "a reservation under a 10x noisy neighbour; 1 vs 64 connections at one limit",
        ("throttle", "--scenario", "reservation,fairness"),
        2.5,
        0.4,
        issues=(3,),
    ),
    Scenario(
        "throttle-accuracy",
        "Hard-limit accuracy",
        "units/s of a bucket pushed past its hard limit, per second over 10 s",
        ("throttle", "--scenario", "hard-limit"),
        0.5,
        0.15,
        smoke=("--quick", "--scenario", "hard-limit", "--seconds", "2"),
        issues=(3,),
    ),
    Scenario(
        "throttle-accuracy-resp",
        "Hard-limit accuracy through RESP",
        "units/s of a bucket driven past its hard limit by redis-benchmark on the RESP port, "
        "per second over 10 s",
        ("throttle", "--scenario", "hard-limit", "--client", "resp"),
        0.5,
        0.15,
        issues=(18,),
    ),
    Scenario(
        "throttle-accuracy-workers",
        "Tenant throttle across worker processes (serve --workers 2)",
        "hard-limit accuracy, a reservation under a 10x noisy neighbour and 1-vs-64-connection "
        "fairness, each on a daemon with 2 worker processes whose limits are leased from the "
        "supervisor (connections land on either worker)",
        ("throttle", "--scenario", "hard-limit,reservation,fairness", "--workers", "2"),
        1.7,
        0.6,
        issues=(19,),
    ),
    Scenario(
        "probing",
        "Throughput probing convergence",
        "fixed ticket-pool sweep, then probing from the minimum and after a workload switch",
        ("probing", "--part", "sweep,probing"),
        6.0,
        0.6,
        issues=(4,),
    ),
    Scenario(
        "retries",
        "Client retries and amplification",
        "a 4x burst and sustained 2x/4x overload with retries off, on and adaptive",
        ("retries",),
        2.0,
        0.6,
        issues=(6,),
    ),
    Scenario(
        "storm",
        "Connection storm",
        "established clients' latency while thousands of connections/s arrive",
        ("overload", "--part", "storm"),
        1.0,
        0.3,
        issues=(5,),
    ),
    Scenario(
        "crash",
        "Crash cycles",
        "SIGKILL under concurrent durable writers; every acknowledged write checked",
        ("crash",),
        1.0,
        0.4,
        smoke=("--quick", "--cycles", "2", "--run-seconds", "0.5"),
        issues=(8,),
    ),
    Scenario(
        "soak",
        "10-minute soak",
        "steady tenants, a bursting noisy tenant, churn and admin changes: memory and p99",
        ("soak", "--minutes", "10"),
        10.5,
        0.7,
        quick=("--minutes", "0.5", "--interval", "5"),
        issues=(8,),
    ),
    Scenario(
        "cpu",
        "Server CPU per operation: tenantkv, the floor, redis-server",
        "GET and durable SET, 1x1, 16x1, 1x64, 16x64, 64 B and 4 KiB, median of 3 rounds; "
        "the floor is our stack with no gates (bench/floor.py)",
        ("cpu",),
        5.0,
        0.3,
        redis=False,
        issues=(17,),
    ),
    Scenario(
        "resp",
        "RESP front door under redis-benchmark: vs redis-server and the MessagePack door",
        "redis-benchmark GET/SET/INCR/MSET, 1 and 16 connections x pipeline 1 and 64, 64 B, "
        "on tenantkv's RESP port and redis-server; GET and SET also on the MessagePack-RPC "
        "port (bench/loadgen.py), same shape; server CPU µs/op",
        ("resp", "--pin", "split"),
        4.5,
        0.8,
        redis=True,
        issues=(18,),
    ),
    Scenario(
        "attack",
        "Pre-auth flood, idle connections, churn",
        "raw-socket attacks before hello and on the connection table while a healthy "
        "client runs: memory, the healthy client's rate, the admin's way in",
        ("attack",),
        2.0,
        0.5,
        issues=(14,),
    ),
    Scenario(
        "workers",
        "One worker process vs two (serve --workers 2)",
        "redis-benchmark pipelined GET and durable SET on the RESP port (16 and 64 connections "
        "x pipeline 64, 64 B) and bench/loadgen.py GET on the MessagePack-RPC port, 1 vs 2 "
        "workers on the generator's cores, a fresh server per round, 5 rounds alternating 1,2,1,2; "
        "ops/s, server CPU µs/op over all processes, ops per commit",
        ("workers", "--rounds", "5"),
        4.0,
        0.3,
        issues=(19,),
    ),
    Scenario(
        "cluster",
        "A 3-node cluster: CPU per GET vs one node, kill -9 of a node, of etcd",
        "3 nodes and etcd on loopback vs one node, GETs from a cluster-aware load (each "
        "node its own keys): server CPU µs per GET over every node process, 3 rounds "
        "alternating; a node killed with SIGKILL under load (the others' rate), etcd killed "
        "(reads served, writes fenced, admin refused, convergence after its restart)",
        ("cluster",),
        2.0,
        1.0,
        issues=(37,),
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}


def scenario_names(text: str) -> str:
    """argparse type: a known scenario name."""
    if text not in BY_NAME:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {text!r}; `python -m bench list` names them"
        )
    return text


def add_parsers(sub: Any, build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Register ``list``, ``run``, ``all`` and ``smoke``.

    ``build_parser`` makes the full ``python -m bench`` parser; a scenario run
    parses its preset flags with it, exactly as if typed on the command line.
    """
    p = sub.add_parser("list", help="name every scenario, its time and what it measures")
    p.set_defaults(func=cmd_list)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--quick",
            action="store_true",
            help="short runs (a few minutes for all)",
        )
        p.add_argument(
            "--publish",
            action="store_true",
            help="write the published results, bench/results (quick: bench/results/quick), "
            "which `report` reads",
        )
        p.add_argument(
            "--out",
            type=Path,
            help="directory for the result JSON [a new bench/results/runs/<time>/]",
        )
        p.add_argument(
            "--no-redis",
            action="store_true",
            help="skip the redis-server comparisons even when redis-server is on PATH",
        )
        p.set_defaults(build_parser=build_parser)

    p = sub.add_parser(
        "run",
        help="run the named scenarios",
        description="Run scenarios one after another; each writes OUT/<scenario>.json "
        "(OUT: a new folder of this run, or the published results with --publish).",
    )
    p.add_argument("scenarios", nargs="+", type=scenario_names, metavar="SCENARIO")
    common(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "all",
        help="run every scenario (~45 min; --quick: a few minutes)",
        description="Run every scenario in `python -m bench list` order.",
    )
    common(p)
    p.set_defaults(func=cmd_all)

    p = sub.add_parser(
        "smoke",
        help="CI regression guard: tiny runs plus sanity checks on their results",
        description="Run the smoke set with very short windows and check that the results "
        "are sane (non-zero throughput, no unexpected errors, limits holding, no lost "
        "writes). Absolute speeds are not checked. Exits 1 on any failed check.",
    )
    p.add_argument(
        "--out", type=Path, help="directory for the result JSON [a new temporary folder, kept]"
    )
    p.set_defaults(func=cmd_smoke, build_parser=build_parser, no_redis=True)


# -- list ---------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    rows = [("scenario", "full", "quick", "vs redis", "smoke", "measures")]
    for s in SCENARIOS:
        rows.append(
            (
                s.name,
                f"~{s.minutes:g} min",
                f"~{s.quick_minutes:g} min",
                "yes" if s.redis else "",
                "yes" if s.smoke is not None else "",
                s.what,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    total = sum(s.minutes for s in SCENARIOS)
    quick = sum(s.quick_minutes for s in SCENARIOS)
    print(f"\nall: ~{total:.0f} min; all --quick: ~{quick:.0f} min. redis-server: ", end="")
    print(servers.find_redis() or "not found (comparisons are skipped)")
    return 0


# -- run ----------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    """Versions of everything a figure depends on."""
    import importlib.metadata as md
    import subprocess

    from tenantkv import __version__

    out: dict[str, Any] = {"tenantkv": __version__}
    for dist in ("trio", "msgpack", "lmdb", "prometheus-client"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[dist] = md.version(dist)
    exe = servers.find_redis()
    if exe:
        text = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, check=False
        ).stdout
        out["redis-server"] = text.split(" v=")[-1].split()[0] if " v=" in text else text.strip()
    return out


class _Tee(io.StringIO):
    """Keeps what a scenario prints while still showing it as it runs."""

    def __init__(self, through: TextIO) -> None:
        super().__init__()
        self._through = through

    def write(self, s: str) -> int:
        self._through.write(s)
        return super().write(s)

    def flush(self) -> None:
        self._through.flush()


def scenario_argv(s: Scenario, *, quick: bool, smoke: bool, redis: bool) -> list[str]:
    argv = list(s.argv)
    if smoke:
        assert s.smoke is not None
        argv += s.smoke
    elif quick:
        argv += s.quick
    if s.redis and redis:
        argv.append("--vs-redis")
    return argv


def run_one(
    s: Scenario,
    build_parser: Callable[[], argparse.ArgumentParser],
    out_dir: Path,
    *,
    quick: bool = False,
    smoke: bool = False,
    redis: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Run one scenario in this process; write and return its result envelope."""
    argv = scenario_argv(s, quick=quick, smoke=smoke, redis=redis)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, raw_path = tempfile.mkstemp(prefix=f"bench-{s.name}-", suffix=".json")
    os.close(fd)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    printed = _Tee(sys.stdout)
    try:
        args = options.resolve(build_parser().parse_args([*argv, "--json", raw_path]))
        with contextlib.redirect_stdout(printed):
            rc = int(args.func(args))
        with open(raw_path) as f:
            text = f.read()
        if not text.strip():
            raise BenchError(f"{s.name}: the scenario wrote no results (exit {rc})")
        raw = json.loads(text)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(raw_path)
    envelope = {
        "scenario": s.name,
        "title": s.title,
        "mode": "smoke" if smoke else "quick" if quick else "full",
        "command": "python -m bench " + " ".join(argv),
        "exit_code": rc,
        "started": started.isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
        "machine": report.machine_info(),
        "source": report.source_info(),
        "versions": versions(),
        "result": raw,
        #: the table the scenario printed, kept for the report's full-output blocks
        "printed": printed.getvalue(),
    }
    path = out_dir / f"{s.name}.json"
    report.write_json(str(path), envelope)
    return path, envelope


def run_many(
    names: Sequence[str],
    build_parser: Callable[[], argparse.ArgumentParser],
    out_dir: Path,
    *,
    quick: bool = False,
    smoke: bool = False,
    redis: bool = True,
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str]]]:
    """Run scenarios in order with progress lines; collect results and failures."""
    chosen = [BY_NAME[n] for n in names]
    redis = redis and servers.find_redis() is not None
    if not redis and any(s.redis for s in chosen) and not smoke:
        report.log("bench: redis-server not used (not on PATH or --no-redis); no comparisons")
    done: list[tuple[str, dict[str, Any]]] = []
    failed: list[tuple[str, str]] = []
    t_all = time.monotonic()
    for i, s in enumerate(chosen, 1):
        left = sum(x.quick_minutes if quick or smoke else x.minutes for x in chosen[i - 1 :])
        report.log(
            f"\n=== [{i}/{len(chosen)}] {s.name}: {s.title} "
            f"(~{left:.1f} min left of this run; {time.monotonic() - t_all:.0f} s so far)"
        )
        try:
            path, env = run_one(s, build_parser, out_dir, quick=quick, smoke=smoke, redis=redis)
        except (BenchError, OSError, ValueError) as exc:
            failed.append((s.name, str(exc)))
            report.log(f"=== [{i}/{len(chosen)}] {s.name} FAILED: {exc}")
            continue
        if env["exit_code"] != 0:
            # a scenario exits 1 when a target check inside it failed; the
            # results are still written and published
            report.log(f"=== {s.name}: exit code {env['exit_code']} (results kept)")
        report.log(f"=== [{i}/{len(chosen)}] {s.name} done in {env['seconds']:.0f} s -> {path}")
        done.append((s.name, env))
    report.log(
        f"\n=== {len(done)} of {len(chosen)} scenarios done in "
        f"{(time.monotonic() - t_all) / 60:.1f} min; results in {out_dir}"
    )
    for name, why in failed:
        report.log(f"=== FAILED {name}: {why}")
    return done, failed


def run_dir(parent: Path = RUNS_DIR) -> Path:
    """A new folder for one run's results, named by its start time."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-", dir=parent))


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return Path(args.out)
    if args.publish:
        return QUICK_DIR if args.quick else RESULTS_DIR
    return run_dir()


def cmd_run(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.scenarios))
    _, failed = run_many(
        names, args.build_parser, _out_dir(args), quick=args.quick, redis=not args.no_redis
    )
    return 1 if failed else 0


def cmd_all(args: argparse.Namespace) -> int:
    _, failed = run_many(
        [s.name for s in SCENARIOS],
        args.build_parser,
        _out_dir(args),
        quick=args.quick,
        redis=not args.no_redis,
    )
    return 1 if failed else 0


# -- smoke --------------------------------------------------------------------------


def cmd_smoke(args: argparse.Namespace) -> int:
    from bench import sanity

    names = [s.name for s in SCENARIOS if s.smoke is not None]
    # The folder is kept: its path is printed, and a failed check is read there.
    out = Path(args.out) if args.out is not None else Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    done, failed = run_many(names, args.build_parser, out, smoke=True, redis=False)
    problems = [f"{name}: {why}" for name, why in failed]
    for name, env in done:
        problems += [f"{name}: {p}" for p in sanity.check(name, env["result"])]
    if problems:
        print("smoke: FAILED", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(f"smoke: {len(done)} scenarios ran and their results are sane")
    return 0
