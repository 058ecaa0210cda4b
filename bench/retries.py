"""``python -m bench retries``: the client's overload retries — goodput and retry amplification.

Overload comes from the tenant throttle: each run gets a fresh bucket with
``hard_limit`` H units/s (a GET of a 100 B value is 1 unit, so H GETs/s is the
bucket's **peak**) and the load connects with ``nonblocking_throttle``, so the
server rejects what it cannot admit at once with ``Throttled`` +
``retryAfterMs`` instead of making it wait. The load is open loop (operations
start on a fixed schedule whatever happens to earlier ones) from
:class:`tenantkv.AsyncClient` connections in this process that share one
:class:`tenantkv.RetryPolicy` (one application, one adaptive token bucket).

Two scenarios, each run once per retry mode (``off`` = ``max_overload_retries=0``,
``on`` = the defaults, ``adaptive`` = defaults + ``adaptive_retries``; ``on:N`` /
``adaptive:N`` set ``max_overload_retries=N``):

``burst``
    ``--burst-factor`` x H (4 x) for ``--burst-seconds`` (2 s), then calm
    (``--calm-factor`` x H, default no load) until every operation has ended.
    Reported: the share of operations that succeeded, and when the last one ended.
``sustained``
    ``--factors`` x H (2 x, 4 x) for ``--warmup`` + ``--seconds`` + 4 s; only the
    window counts (the load goes on after it so late operations retry under it too).
    Reported: goodput (successful operations/s that ended in the window) against
    peak, and retry amplification.

Retry amplification is **attempts per operation**: the requests the server
had to answer for each operation the application issued (1.0 = no retries).
Attempts are counted on the client (every ``CommandStartedEvent``) and
cross-checked on the server (the bucket's ``reject_count_total`` + ``ru_total``
over the same window). Attempts per *successful* operation are shown too; in
sustained overload at F x peak it can never be below F, retries or not.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

import tenantkv
from bench import options, report, servers
from bench.options import Quick

SCENARIOS = ("burst", "sustained")
DEFAULT_MODES = ("off", "on", "adaptive")
#: The generator's CPU may limit a figure above this share of one core.
CLIENT_CPU_WARN = 80.0
#: Per-operation timeout of the load (it bounds every retry loop).
OP_TIMEOUT = 30.0
#: Longest wait for the operations still under way after the schedule ends.
DRAIN_LIMIT = 60.0
#: Sustained load past the window: longer than the default retries' backoffs (3.1 s
#: at most) plus the server's retryAfterMs hints.
TAIL_SECONDS = 4.0


@dataclass(frozen=True)
class Mode:
    name: str
    retries: int
    adaptive: bool

    def policy(self) -> tenantkv.RetryPolicy:
        return tenantkv.RetryPolicy(
            max_overload_retries=self.retries, adaptive_retries=self.adaptive
        )


def _mode(text: str) -> Mode:
    base, _, n = text.partition(":")
    if base not in ("off", "on", "adaptive") or (n and (not n.isdigit() or base == "off")):
        raise argparse.ArgumentTypeError(f"bad mode {text!r}: off, on, adaptive, on:N, adaptive:N")
    if base == "off":
        return Mode("off", 0, False)
    return Mode(text, int(n) if n else 5, base == "adaptive")


def _mode_list(text: str) -> list[Mode]:
    return [_mode(x.strip()) for x in text.split(",") if x.strip()]


# -- command line ------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--scenario", SCENARIOS, "scenarios")
    options.add(
        p,
        "--modes",
        _mode_list,
        [_mode(m) for m in DEFAULT_MODES],
        "retry modes: off, on, adaptive, on:N, adaptive:N (N = max_overload_retries)",
        show="off,on,adaptive",
        metavar="MODE[,MODE]",
    )
    options.add(p, "--hard-limit", int, 200, "the bucket's units/s = peak", low=1)
    options.add(p, "--factors", options.float_list, [2.0, 4.0], "sustained: load / peak")
    options.window_flags(
        p,
        Quick(10.0, 4.0),
        Quick(2.0, 1.0),
        what=("sustained: measuring window", "sustained: load before the window", ""),
    )
    options.add(p, "--burst-factor", float, 4.0, "burst: load / peak", above=0)
    options.add(p, "--burst-seconds", float, 2.0, "burst: its length", above=0)
    options.add(p, "--calm-factor", float, 0.0, "burst: load / peak afterwards", low=0)
    options.add(p, "--calm-seconds", float, 10.0, "burst: calm load's length", low=0)
    p.add_argument(
        "--blocking",
        action="store_true",
        help="use the blocking throttle (requests wait at the server up to its "
        "throttle_max_wait_ms) instead of non-blocking rejections",
    )
    options.add(p, "--conns", int, 4, "client connections", low=1)
    options.add(p, "--keys", int, 100, "keys read, all preloaded", low=1)
    # a GET must cost 1 unit
    options.add(p, "--value-size", int, 100, "value bytes (<= 4096)", low=0, high=4096)
    options.quick_flag(p, "a fast smoke run")
    options.json_flag(p)
    p.add_argument(
        "--data-dir", help="data directory for the started daemon; must be new [a temp dir]"
    )


# -- one run ---------------------------------------------------------------------------


@dataclass
class RunResult:
    scenario: str
    mode: str
    factor: float
    peak: float
    #: the span the figures below refer to (s, relative to the load's start)
    window: tuple[float, float]
    offered_per_s: float
    ops: int = 0
    ok: int = 0
    failed: int = 0
    #: successful operations that ended in the window, per second
    goodput: float = 0.0
    #: attempts (client side) per operation issued in the window
    attempts_per_op: float = 0.0
    attempts_per_ok: float | None = None
    #: the same from the server's counters (rejections + units charged)
    server_attempts_per_op: float | None = None
    retries: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    #: when the last operation ended, seconds after the load started
    last_end: float = 0.0
    client_cpu_pct: float = 0.0
    tokens_left: float | None = None
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def ok_pct(self) -> float:
        return 100.0 * self.ok / self.ops if self.ops else 0.0

    @property
    def goodput_pct(self) -> float:
        return 100.0 * self.goodput / self.peak


class _Counter(tenantkv.CommandListener):
    """Counts attempts by their start time (seconds after ``t0``)."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.starts: list[float] = []

    def started(self, event: tenantkv.CommandStartedEvent) -> None:
        self.starts.append(trio.current_time() - self.t0)


async def _bucket_counters(admin: Any, bucket: str) -> tuple[int, int]:
    b = (await admin.server_status())["throttle"]["buckets"][bucket]
    return int(b["ru_total"]), int(b["reject_count_total"])


async def _load(
    handle: servers.ServerHandle,
    user: str,
    password: str,
    bucket: str,
    keys: int,
    conns: int,
    mode: Mode,
    phases: Sequence[tuple[float, float]],
    window: tuple[float, float],
    count_by_issue: bool,
    blocking: bool,
) -> tuple[list[tuple[float, float, str | None]], _Counter, tuple[int, int], float, float | None]:
    """Run the phases ``(seconds, ops/s)`` open loop; return per-op (issue, end, error),
    the attempt counter, the server's attempts in the window, CPU %, and tokens left."""
    policy = mode.policy()
    counter = _Counter()
    outcomes: list[tuple[float, float, str | None]] = []
    key_list = [f"key{i:06d}".encode() for i in range(keys)]
    server_before: tuple[int, int] | None = None
    server_after: tuple[int, int] | None = None
    async with tenantkv.AsyncClient(
        handle.host, handle.port, user=handle.user or "admin", password=handle.password or ""
    ) as admin:
        clients = [
            tenantkv.AsyncClient(
                handle.host,
                handle.port,
                user=user,
                password=password,
                bucket=bucket,
                nonblocking_throttle=not blocking,
                timeout=OP_TIMEOUT,
                retry_policy=policy,
                event_listeners=[counter],
            )
            for _ in range(conns)
        ]
        async with contextlib.AsyncExitStack() as stack:
            for c in clients:
                await stack.enter_async_context(c)

            async def one(c: Any, key: bytes, issued: float) -> None:
                err: str | None = None
                try:
                    await c.get(key)
                except tenantkv.errors.TenantKVError as exc:
                    err = exc.code_name
                outcomes.append((issued, trio.current_time() - t0, err))

            async def sample_server() -> None:
                nonlocal server_before, server_after
                await trio.sleep_until(t0 + window[0])
                server_before = await _bucket_counters(admin, bucket)
                await trio.sleep_until(t0 + window[1])
                server_after = await _bucket_counters(admin, bucket)

            cpu0 = time.process_time()
            t0 = trio.current_time()
            counter.t0 = t0
            total = sum(seconds for seconds, _ in phases)
            # The nursery waits for every operation; a stuck run is cut off after DRAIN_LIMIT.
            with trio.move_on_at(t0 + total + DRAIN_LIMIT):
                async with trio.open_nursery() as nursery:
                    if not count_by_issue:
                        nursery.start_soon(sample_server)
                    start = 0.0
                    n = 0
                    for seconds, rate in phases:
                        if rate > 0:
                            for i in range(round(seconds * rate)):
                                issued = start + i / rate
                                await trio.sleep_until(t0 + issued)
                                c = clients[n % conns]
                                nursery.start_soon(one, c, key_list[n % keys], issued)
                                n += 1
                        start += seconds
            elapsed = trio.current_time() - t0
            cpu = 100.0 * (time.process_time() - cpu0) / elapsed
    server = (0, 0)
    if server_before is not None and server_after is not None:
        server = (server_after[0] - server_before[0], server_after[1] - server_before[1])
    tokens = policy.token_bucket.tokens if policy.token_bucket is not None else None
    return outcomes, counter, server, cpu, tokens


def _run(
    args: argparse.Namespace,
    handle: servers.ServerHandle,
    user: str,
    password: str,
    bucket: str,
    scenario: str,
    mode: Mode,
    factor: float,
) -> RunResult:
    peak = float(args.hard_limit)
    if scenario == "burst":
        phases = [(args.burst_seconds, factor * peak)]
        if args.calm_factor > 0 and args.calm_seconds > 0:
            phases.append((args.calm_seconds, args.calm_factor * peak))
        window = (0.0, args.burst_seconds)
    else:
        # The load goes on for TAIL_SECONDS after the window, so that the operations
        # issued late in it meet the same overload during all their retries.
        phases = [(args.warmup + args.seconds + TAIL_SECONDS, factor * peak)]
        window = (args.warmup, args.warmup + args.seconds)
    by_issue = scenario == "burst"
    outcomes, counter, server, cpu, tokens = trio.run(
        _load,
        handle,
        user,
        password,
        bucket,
        args.keys,
        args.conns,
        mode,
        phases,
        window,
        by_issue,
        args.blocking,
    )
    res = RunResult(scenario, mode.name, factor, peak, window, factor * peak)
    res.client_cpu_pct = round(cpu, 1)
    res.tokens_left = tokens
    lo, hi = window
    if by_issue:
        # Every operation the burst issued, however late it ended. Attempts cannot be
        # told apart by operation, so attempts/op covers the calm load too (if any).
        chosen = [o for o in outcomes if o[0] < hi]
        attempts = round(len(counter.starts) * len(chosen) / max(1, len(outcomes)))
    else:
        chosen = [o for o in outcomes if lo <= o[0] < hi]
        attempts = sum(1 for t in counter.starts if lo <= t < hi)
    res.ops = len(chosen)
    res.ok = sum(1 for o in chosen if o[2] is None)
    res.failed = res.ops - res.ok
    for _, _, err in chosen:
        if err is not None:
            res.errors[err] = res.errors.get(err, 0) + 1
    res.last_end = round(max((o[1] for o in outcomes), default=0.0), 2)
    if by_issue:
        res.goodput = res.ok / max(res.last_end, 1e-9)
    else:
        res.goodput = sum(1 for o in outcomes if o[2] is None and lo <= o[1] < hi) / (hi - lo)
        srv_attempts = server[0] + server[1]
        res.server_attempts_per_op = round(srv_attempts / res.ops, 3) if res.ops else None
    res.attempts_per_op = round(attempts / res.ops, 3) if res.ops else 0.0
    res.attempts_per_ok = round(attempts / res.ok, 3) if res.ok else None
    res.retries = attempts - res.ops
    lat = sorted((o[1] - o[0]) * 1000 for o in chosen if o[2] is None)
    if lat:
        res.p50_ms = round(statistics.median(lat), 1)
        res.p99_ms = round(lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)], 1)
    return res


# -- set-up and report -------------------------------------------------------------------


def _prepare(
    handle: servers.ServerHandle, buckets: Sequence[str], args: argparse.Namespace
) -> tuple[str, str]:
    """Create the buckets (preloaded, then limited to H) and a ``bench`` user on them."""
    value = (b"tenantkv-retries-" * (args.value_size // 17 + 1))[: args.value_size]
    with tenantkv.Client(
        handle.host, handle.port, user=handle.user or "admin", password=handle.password or ""
    ) as admin:
        for b in buckets:
            admin.create_bucket(b, reserved=0, hard_limit="unlimited")
            admin.select_bucket(b)
            with admin.pipeline() as p:
                for i in range(args.keys):
                    p.set(f"key{i:06d}", value)
            admin.set_bucket_throttle(b, {"reserved": 0, "hard_limit": args.hard_limit})
        password = secrets.token_urlsafe(18)
        admin.create_user("bench", password, roles={b: "readwrite" for b in buckets})
    return "bench", password


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def format_tables(results: Sequence[RunResult]) -> str:
    out: list[str] = []
    burst = [r for r in results if r.scenario == "burst"]
    if burst:
        out.append("burst: operations issued during the burst, each followed to its end")
        out.append(
            f"{'mode':<12} {'load':>5} {'ops':>6} {'ok %':>7} {'failed %':>8} "
            f"{'attempts/op':>11} {'last end s':>10} {'p50 ms':>8} {'p99 ms':>8} {'cli%':>5}"
        )
        for r in burst:
            out.append(
                f"{r.mode:<12} {r.factor:>4g}x {r.ops:>6} {r.ok_pct:>7.2f} "
                f"{100 - r.ok_pct:>8.2f} {r.attempts_per_op:>11.3f} {r.last_end:>10.2f} "
                f"{_fmt(r.p50_ms, '.1f'):>8} {_fmt(r.p99_ms, '.1f'):>8} "
                f"{r.client_cpu_pct:>5.0f}"
            )
        out.append("")
    sus = [r for r in results if r.scenario == "sustained"]
    if sus:
        out.append(
            "sustained: the measuring window only (ops issued in it; goodput = successes "
            "ending in it / s)"
        )
        out.append(
            f"{'mode':<12} {'load':>5} {'goodput/s':>9} {'% peak':>7} {'ok %':>7} "
            f"{'attempts/op':>11} {'srv att/op':>10} {'att/ok':>7} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'tokens':>7} {'cli%':>5}"
        )
        for r in sus:
            out.append(
                f"{r.mode:<12} {r.factor:>4g}x {r.goodput:>9.1f} {r.goodput_pct:>7.1f} "
                f"{r.ok_pct:>7.2f} {r.attempts_per_op:>11.3f} "
                f"{_fmt(r.server_attempts_per_op, '.3f'):>10} {_fmt(r.attempts_per_ok):>7} "
                f"{_fmt(r.p50_ms, '.1f'):>8} {_fmt(r.p99_ms, '.1f'):>8} "
                f"{_fmt(r.tokens_left, '.0f'):>7} {r.client_cpu_pct:>5.0f}"
            )
        out.append("")
    return "\n".join(out)


def _targets(results: Sequence[RunResult]) -> list[str]:
    """The issue's targets, each with its figure and whether it is met."""
    lines = []

    def find(scenario: str, mode: str, factor: float) -> RunResult | None:
        for r in results:
            if (r.scenario, r.mode, r.factor) == (scenario, mode, factor):
                return r
        return None

    on, off = find("burst", "on", 4.0), find("burst", "off", 4.0)
    if on is not None:
        beside = f" (retries off: {100 - off.ok_pct:.2f} % failed)" if off else ""
        lines.append(
            f"burst 4x, retries on: {on.ok_pct:.2f} % succeeded, target >= 99 %: "
            f"{'met' if on.ok_pct >= 99 else 'NOT met'}{beside}"
        )
    s_on = find("sustained", "on", 4.0)
    if s_on is not None:
        lines.append(
            f"sustained 4x, retries on: goodput {s_on.goodput_pct:.1f} % of peak, "
            f"target >= 95 %: {'met' if s_on.goodput_pct >= 95 else 'NOT met'}"
        )
    s_ad = find("sustained", "adaptive", 4.0)
    if s_ad is not None:
        lines.append(
            f"sustained 4x, adaptive: {s_ad.attempts_per_op:.3f} attempts per operation, "
            f"target <= 1.1: {'met' if s_ad.attempts_per_op <= 1.1 else 'NOT met'}"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    plan: list[tuple[str, Mode, float]] = []
    for scenario in args.scenario:
        factors = [args.burst_factor] if scenario == "burst" else args.factors
        for factor in factors:
            for mode in args.modes:
                plan.append((scenario, mode, factor))
    names = [f"r{i}-{s}-{m.name.replace(':', '_')}-{f:g}x" for i, (s, m, f) in enumerate(plan)]
    meta: dict[str, Any] = {
        "machine": report.machine_info(),
        "source": report.source_info(),
        "settings": {
            k: (v if not isinstance(v, list) else [str(x) for x in v])
            for k, v in vars(args).items()
            if k != "func"
        },
    }
    results: list[RunResult] = []
    t_start = time.monotonic()
    report.log("starting tenantkv ...")
    with servers.tenantkv_server(args.data_dir) as handle:
        user, password = _prepare(handle, names, args)
        for name, (scenario, mode, factor) in zip(names, plan, strict=True):
            report.log(f"  {scenario} {factor:g}x peak, retries {mode.name} ...")
            r = _run(args, handle, user, password, name, scenario, mode, factor)
            results.append(r)
            report.log(
                f"    ops {r.ops}, ok {r.ok_pct:.2f} %, goodput {r.goodput:.1f}/s "
                f"({r.goodput_pct:.1f} % of peak), attempts/op {r.attempts_per_op:.3f}, "
                f"errors {r.errors or '-'}"
            )
            time.sleep(0.5)  # let the throttle forget the last run
    meta["elapsed_s"] = round(time.monotonic() - t_start, 1)
    out = sys.stderr if args.json == "-" else sys.stdout
    throttle = "blocking" if args.blocking else "non-blocking"
    print(
        f"\nretries: bucket hard_limit {args.hard_limit} units/s = peak {args.hard_limit} GET/s "
        f"({args.value_size} B values, 1 unit each), {throttle} throttle, open loop, "
        f"{args.conns} Trio client connections sharing one RetryPolicy\n"
        f"machine: {report.machine_line(meta)}; cli% = load generator CPU, % of one core\n",
        file=out,
    )
    print(format_tables(results), file=out)
    for line in _targets(results):
        print(line, file=out)
    if any(r.client_cpu_pct > CLIENT_CPU_WARN for r in results):
        print(
            f"NOTE: the load generator used > {CLIENT_CPU_WARN:.0f} % of a core in some runs; "
            "lower --hard-limit if its schedule may have slipped.",
            file=out,
        )
    if args.json:
        doc = {"meta": meta, "results": [asdict(r) for r in results]}
        report.write_json(args.json, doc)
    return 0
