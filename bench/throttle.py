"""``python -m bench throttle``: does the tenant throttle do what docs/throttling.md says?

Four scenarios, each on its own freshly started daemon (temporary data
directory), configured by ``admin`` and loaded by a plain ``bench`` user with
the readwrite role on every bucket (the application's path through the gates):

1. ``hard-limit`` — one bucket with a finite ``hard_limit`` H, offered 3 x H
   GETs/s open loop: the units/s it achieves, from the server's own
   ``ru_total``/``wu_total`` over the window, against H (target within +-3 %).
   ``--client resp`` drives it through the RESP front door instead, with
   ``redis-benchmark`` (closed loop, the same connections and outstanding
   requests), so the limit is checked as an unmodified Redis client meets it.
2. ``reservation`` — node capacity C; a quiet bucket Q reserved R offers
   exactly R open loop while a noisy bucket N (reserved 0, hard limit) is
   driven closed loop on many connections. Q's achieved rate / R (target
   >= 97 %) and Q's p99 latency against the same load with N idle (<= 1.2 x),
   plus a control phase (throttling off, N open loop at the rate it achieved)
   that tells the throttle's part from the cost of merely sharing the server.
3. ``fairness`` — node capacity C, two equal buckets (reserved 0, unlimited),
   both saturating closed loop, one on 1 connection and one on 64: their
   units/s from the server counters and Jain's fairness index (>= 0.99).
4. ``overhead`` — maximum pipelined GET and SET throughput with throttling off
   (capacity "unlimited": admission is skipped, only metering runs) against
   on-but-unlimited (capacity 10**12: every op takes the admission fast path),
   alternated off, on, ..., off (every "on" between two "off"), medians compared
   (on/off >= 0.95), with the execution-ticket pools fixed so SET does not drift.

Rates are always taken from the server's counters (``server_status`` before
and after the window, divided by the server's own ``uptime_secs`` delta), so
they are what the throttle admitted and charged, not what the generator
thinks it got; client-side ok ops/s are shown next to them. The load
generator is :mod:`bench.loadgen` (forked workers, precomputed requests,
replies only counted), several loads sharing one window via
:func:`bench.loadgen.run_loads`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import secrets
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from bench import loadgen, options, report, resp, servers
from bench.loadgen import BenchError, LoadResult, LoadSpec, Target, TenantKVCodec
from bench.options import Quick

SCENARIOS = ("hard-limit", "reservation", "fairness", "overhead")
#: ``--client``: which front door (and client) drives the hard-limit scenario
CLIENTS = ("msgpack", "resp")
#: Bytes of metadata a record carries on top of key and value (docs/throttling.md).
RECORD_OVERHEAD = 20
UNIT_SIZE = 4096
#: ``capacity`` of the "on but unlimited" runs of the overhead scenario.
HUGE_CAPACITY = 10**12
#: Overhead scenario: execution-ticket pool sizes (server parameters
#: ``storage_engine_concurrent_{read,write}_transactions``; non-zero turns
#: throughput probing off), so SET throughput does not climb run after run
#: while probing grows the write pool.
FIXED_TICKETS = 128
TICKET_PARAMS = (
    "storage_engine_concurrent_read_transactions",
    "storage_engine_concurrent_write_transactions",
)
#: The generator's CPU may limit a figure above these shares (% of one core).
CLIENT_CPU_WARN = 80.0
MACHINE_CPU_WARN = 170.0
#: CPU of processes other than the daemon and the generator above this (% of
#: one core) is worth a note: something else on the machine disturbed a window.
OTHER_CPU_WARN = 15.0
TICKS = os.sysconf("SC_CLK_TCK")


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--scenario", SCENARIOS, "scenarios")
    options.common_flags(p)
    options.add(
        p, "--seconds", float, Quick(10.0, 3.0), "measuring window of scenarios 1-3", above=0
    )
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default="msgpack",
        help="1: who drives the bucket: msgpack = bench/loadgen.py on the MessagePack-RPC "
        "port; resp = redis-benchmark (redis-tools) on the RESP port [msgpack]",
    )
    options.add(
        p, "--warmup", float, Quick(1.0, 0.5), "load before each window, not counted", low=0
    )
    options.add(
        p,
        "--workers",
        int,
        1,
        "serve --workers N for every daemon: a supervisor and N worker processes, so "
        "the limits are held across workers by leased quotas (docs/scaling.md); 1 = the "
        "single process",
        metavar="N",
        low=1,
        high=256,
    )
    options.data_flags(
        p,
        1000,
        value_help="value bytes; 100 B makes a GET 1 unit",
        keys_help="keys per bucket, all preloaded",
    )
    g = p.add_argument_group("scenario settings (limits in units/s)")
    options.add(g, "--hard-limit", int, 2000, "1: the bucket's hard_limit", low=1, parser=p)
    options.add(g, "--capacity", int, 10_000, "2, 3: node capacity", low=1, parser=p)
    options.add(g, "--reserved", int, 2000, "2: quiet bucket's reserved", low=0, parser=p)
    options.add(g, "--noisy-hard-limit", int, 8000, "2: noisy bucket's hard_limit", low=1, parser=p)
    options.add(
        g,
        "--rounds",
        int,
        Quick(2, 1),
        "2: repetitions of (quiet alone, quiet + noisy, control)",
        low=1,
        parser=p,
    )
    options.add(
        g,
        "--overhead-seconds",
        float,
        Quick(3.0, 1.0),
        "4: measuring window of each off/on run",
        above=0,
        parser=p,
    )
    options.add(g, "--overhead-reps", int, Quick(3, 1), "4: off/on pairs per op", low=1, parser=p)
    options.add(
        g,
        "--tickets",
        int,
        FIXED_TICKETS,
        "4: fix both execution-ticket pools at this size (throughput probing off) so "
        "SET does not drift from run to run; 0 = leave probing on",
        low=0,
        parser=p,
    )


def _finish_args(args: argparse.Namespace) -> None:
    options.check(args.reserved <= args.capacity, "--reserved can't exceed --capacity")
    if args.client == "resp":
        if args.scenario != ["hard-limit"]:
            raise BenchError("--client resp drives the hard-limit scenario only")
        if resp.find_redis_benchmark() is None:
            raise BenchError("--client resp needs redis-benchmark (apt-get install redis-tools)")
    servers.pin_cpus(args)


# -- a daemon per scenario -------------------------------------------------------


def _proc_stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of one process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def machine_cpu() -> tuple[dict[int, float], float]:
    """CPU seconds so far of every process *outside* this benchmark's own tree
    (not the daemon, not the load workers), and the machine's stolen seconds.

    Per-process times are precise; /proc/stat's busy ticks are sampled and
    miss much of a bursty load, so they are not used for this. A process that
    both starts and ends between two snapshots is missed: a lower bound.
    """
    procs: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _proc_stat(name)
            if st is not None:
                procs[int(name)] = st
    mine = {os.getpid()}
    grew = True
    while grew:  # descendants of this process (daemon, workers)
        grew = False
        for pid, (ppid, _) in procs.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    others = {pid: cpu for pid, (_, cpu) in procs.items() if pid not in mine}
    steal = 0.0
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        steal = int(fields[8]) / TICKS if len(fields) > 8 else 0.0
    except (OSError, ValueError):
        pass
    return others, steal


@dataclass
class Snapshot:
    """What ``server_status`` said at one instant, plus the server's CPU time."""

    uptime: float
    cpu_s: float | None
    write_weight: int
    node: dict[str, Any]
    buckets: dict[str, dict[str, Any]]
    errors: dict[str, dict[str, int]]
    #: CPU seconds so far of each process outside the benchmark, and stolen seconds
    machine_s: tuple[dict[int, float], float] = field(default_factory=lambda: ({}, 0.0))

    @classmethod
    def bare(cls, uptime: float, cpu_s: float | None) -> Snapshot:
        """Only the clocks (no bucket figures): the server's uptime and CPU, the machine's."""
        return cls(uptime, cpu_s, 2, {}, {}, {}, machine_cpu())


@dataclass
class Delta:
    """One bucket between two snapshots, as rates over the server's own clock."""

    seconds: float
    units: int
    ru: int
    wu: int
    throttled: int
    wait_us: int
    rejected: int
    errors: dict[str, int]

    @property
    def units_per_s(self) -> float:
        return self.units / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_wait_ms(self) -> float | None:
        parked = self.throttled - self.rejected
        return self.wait_us / parked / 1000 if parked > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "units": self.units,
            "units_per_s": round(self.units_per_s, 1),
            "ru": self.ru,
            "wu": self.wu,
            "throttle_count": self.throttled,
            "throttle_wait_micros": self.wait_us,
            "mean_wait_ms": None if self.mean_wait_ms is None else round(self.mean_wait_ms, 2),
            "reject_count": self.rejected,
            "server_errors": self.errors,
        }


def delta(a: Snapshot, b: Snapshot, bucket: str) -> Delta:
    x, y = a.buckets[bucket], b.buckets[bucket]
    ru = y["ru_total"] - x["ru_total"]
    wu = y["wu_total"] - x["wu_total"]
    ex, ey = a.errors.get(bucket, {}), b.errors.get(bucket, {})
    errs = {k: n - ex.get(k, 0) for k, n in ey.items() if n - ex.get(k, 0)}
    return Delta(
        seconds=b.uptime - a.uptime,
        units=ru + b.write_weight * wu,
        ru=ru,
        wu=wu,
        throttled=y["throttle_count_total"] - x["throttle_count_total"],
        wait_us=y["throttle_wait_micros_total"] - x["throttle_wait_micros_total"],
        rejected=y["reject_count_total"] - x["reject_count_total"],
        errors=errs,
    )


def per_interval(samples: Sequence[Snapshot], bucket: str) -> list[float]:
    """units/s of ``bucket`` between consecutive snapshots (about 1 s apart)."""
    return [delta(a, b, bucket).units_per_s for a, b in itertools.pairwise(samples)]


class Daemon:
    """A started tenantkv, an admin client, and a plain user for the load."""

    def __init__(self, handle: servers.ServerHandle, admin: Any, user: str, password: str) -> None:
        self.handle = handle
        self.admin = admin
        self.user = user
        self.password = password

    def target(self, bucket: str) -> Target:
        codec = TenantKVCodec(self.user, self.password, bucket)
        return Target(self.handle.host, self.handle.port, codec)

    def snapshot(self) -> Snapshot:
        st = self.admin.server_status()
        th = st["throttle"]
        return Snapshot(
            uptime=float(st["uptime_secs"]),
            cpu_s=self.handle.cpu_seconds(),
            write_weight=int(th["node"].get("write_weight", 2)),
            node=th["node"],
            buckets=th["buckets"],
            errors={n: dict(b.get("errors") or {}) for n, b in st["buckets"].items()},
            machine_s=machine_cpu(),
        )


@contextlib.contextmanager
def daemon(
    buckets: Sequence[str],
    keys: int,
    value: bytes,
    cpus: set[int] | None = None,
    workers: int = 1,
) -> Iterator[Daemon]:
    """Start a daemon, create ``buckets`` (no limits yet) and preload every key.

    Throttle properties are set by the scenario after the preload, so the
    preload itself is never throttled. ``workers`` > 1 runs ``serve --workers
    N``: the status read for every rate is then the node's (all workers
    summed), which is what a limit promises.
    """
    import tenantkv

    report.log("  starting tenantkv" + (f" --workers {workers}" if workers > 1 else "") + " ...")
    with servers.tenantkv_server(cpus=cpus, workers=workers) as handle:
        assert handle.password is not None
        admin = tenantkv.Client(handle.host, handle.port, user="admin", password=handle.password)
        with admin:
            for b in buckets:
                admin.create_bucket(b)
            password = secrets.token_urlsafe(18)
            admin.create_user("bench", password, roles={b: "readwrite" for b in buckets})
            # --workers N: the other workers learn of the user by notification
            servers.wait_for_login(handle, "bench", password, buckets[0])
            d = Daemon(handle, admin, "bench", password)
            for b in buckets:
                loadgen.preload(d.target(b), keys, value)
            yield d


def unit_cost(
    op: str, value_size: int, write_weight: int = 2, key_prefix: bytes = b"bench:"
) -> int:
    """Cost units of one GET hit / SET of a preloaded key (docs/throttling.md, Units)."""
    nbytes = len(loadgen.key_name(key_prefix, 0)) + value_size + RECORD_OVERHEAD
    units = -(-nbytes // UNIT_SIZE)
    return units if op == "get" else write_weight * units


# -- results -----------------------------------------------------------------------


@dataclass
class Check:
    scenario: str
    figure: str
    value: float | None
    shown: str
    target: str
    met: bool | None

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "figure": self.figure,
            "value": self.value,
            "target": self.target,
            "met": self.met,
        }


@dataclass
class Outcome:
    name: str
    title: str
    lines: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, figure: str, value: float | None, shown: str, target: str, met: bool) -> None:
        self.checks.append(Check(self.name, figure, value, shown, target, met))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            **self.data,
            "checks": [c.to_json() for c in self.checks],
            "notes": self.notes,
        }


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "MISSED")


def finish(
    args: argparse.Namespace,
    out: TextIO,
    benchmark: str,
    meta: dict[str, Any],
    outcomes: list[Outcome],
    *,
    part: str = "part",
    widths: tuple[int, int, int] = (8, 46, 10),
    key: str = "parts",
) -> None:
    """The end every parts benchmark shares: the table of checks, the notes, the
    elapsed time, and the ``--json`` document (``key`` holds the parts)."""
    checks = [c for o in outcomes for c in o.checks]
    pw, fw, tw = widths
    if checks:
        print(f"\n{part:<{pw}} {'figure':<{fw}} {'value':>10} {'target':>{tw}}  result", file=out)
        print("-" * (pw + fw + tw + 22), file=out)
        for c in checks:
            print(
                f"{c.scenario:<{pw}} {c.figure:<{fw}} {c.shown:>10} {c.target:>{tw}}  "
                f"{_verdict(c.met)}",
                file=out,
            )
    notes = [n for o in outcomes for n in o.notes]
    if notes:
        print("\nnotes:", file=out)
        for n in notes:
            print(f"- {n}", file=out)
    print(f"\n({meta['elapsed_s']:g} s)", file=out)
    if args.json:
        report.write_json(
            args.json,
            {
                "benchmark": benchmark,
                "meta": meta,
                key: [o.to_json() for o in outcomes],
                "checks": [c.to_json() for c in checks],
                "all_met": all(c.met for c in checks),
            },
        )


class Parts:
    """A parts benchmark's outcomes as they come: each printed at once, all of
    them summed up by :meth:`finish` (the table of checks, notes, ``--json``)."""

    def __init__(self, args: argparse.Namespace, out: TextIO, benchmark: str) -> None:
        self.args, self.out, self.benchmark = args, out, benchmark
        self.outcomes: list[Outcome] = []
        self.t0 = time.monotonic()

    def show(self, o: Outcome) -> None:
        self.outcomes.append(o)
        print(f"\n{o.title}", file=self.out)
        print("\n".join(o.lines), file=self.out, flush=True)

    def finish(self, meta: dict[str, Any], **how: Any) -> int:
        meta["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        finish(self.args, self.out, self.benchmark, meta, self.outcomes, **how)
        return 0


class Machine:
    """Adds up, over a scenario's windows, where the machine's CPU went (seconds
    of the windows; CPU seconds of other processes, stolen, the server's, the
    load generator's)."""

    def __init__(self) -> None:
        self.seconds = self.other = self.steal = self.server = self.client = 0.0

    def add(self, a: Snapshot, b: Snapshot, results: Sequence[LoadResult]) -> None:
        self.seconds += b.uptime - a.uptime
        before, after = a.machine_s[0], b.machine_s[0]
        # a process new since the first snapshot: all of its CPU is in the window
        self.other += sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())
        self.steal += b.machine_s[1] - a.machine_s[1]
        if a.cpu_s is not None and b.cpu_s is not None:
            self.server += b.cpu_s - a.cpu_s
        self.client += sum(r.client_cpu_s for r in results)

    def pct(self) -> dict[str, float]:
        t = self.seconds or 1.0
        busy = self.server + self.client + self.other
        return {
            "machine": round(100 * busy / t, 1),
            "server": round(100 * self.server / t, 1),
            "generator": round(100 * self.client / t, 1),
            "other": round(100 * self.other / t, 1),
            "steal": round(100 * self.steal / t, 1),
        }

    def line(self) -> str:
        p = self.pct()
        return (
            f"   machine during the windows (% of one core, of 200): daemon {p['server']:.0f}"
            f" + generator {p['generator']:.0f} + other processes {p['other']:.0f} = "
            f"{p['machine']:.0f}; hypervisor steal {p['steal']:.0f}"
        )

    def close(self, out: Outcome) -> Outcome:
        """The outcome's last line and note: where the machine's CPU went."""
        out.lines.append(self.line())
        self.note(out)
        return out

    def note(self, out: Outcome) -> None:
        p = self.pct()
        out.data["machine_cpu_pct"] = p
        if p["other"] >= OTHER_CPU_WARN or p["steal"] >= OTHER_CPU_WARN:
            out.notes.append(
                f"{out.name}: other processes used {p['other']:.0f} % and the hypervisor "
                f"stole {p['steal']:.0f} % of a core during the windows: the machine was "
                "not quiet, so repeat before trusting these figures"
            )


def _cpu_note(out: Outcome, cli_pct: float, srv_pct: float | None, what: str) -> None:
    srv = srv_pct or 0.0
    if cli_pct >= CLIENT_CPU_WARN or cli_pct + srv >= MACHINE_CPU_WARN:
        out.notes.append(
            f"{what}: load generator {cli_pct:.0f} % + server {srv:.0f} % of one core (of "
            "200 %): the generator's CPU share may limit this figure"
        )


def _pct(cpu_s: float | None, seconds: float) -> float | None:
    return None if cpu_s is None or seconds <= 0 else 100.0 * cpu_s / seconds


def _srv_pct(a: Snapshot, b: Snapshot) -> float | None:
    if a.cpu_s is None or b.cpu_s is None:
        return None
    return _pct(b.cpu_s - a.cpu_s, b.uptime - a.uptime)


def _us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f} µs" if x < 10_000 else f"{x / 1000:,.1f} ms"


def _client_json(r: LoadResult) -> dict[str, Any]:
    return {
        "ok": r.ok,
        "errors": r.errors,
        "ok_per_s": round(r.ops_per_s, 1),
        "p50_us": _r1(r.percentile_us(0.5)),
        "p99_us": _r1(r.percentile_us(0.99)),
        "p999_us": _r1(r.percentile_us(0.999)),
        "max_us": _r1(max(r.hist) / 1000 if r.hist else None),
        "client_cpu_pct": _r1(_pct(r.client_cpu_s, r.window_s)),
        "error_sample": r.error_sample,
        **r.extra,
    }


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _spec(
    args: argparse.Namespace,
    value: bytes,
    op: str,
    conns: int,
    depth: int,
    rate: float | None = None,
    workers: int = 1,
    seconds: float | None = None,
    warmup: float | None = None,
) -> LoadSpec:
    timing = {k: v for k, v in (("seconds", seconds), ("warmup", warmup)) if v is not None}
    return loadgen.cell_spec(args, op, conns, depth, value, rate=rate, workers=workers, **timing)


def _run(
    d: Daemon,
    loads: Sequence[tuple[str, LoadSpec]],
    probe_every: float | None = 1.0,
    machine: Machine | Sequence[Machine] | None = None,
) -> tuple[list[LoadResult], list[Snapshot]]:
    results, samples = loadgen.run_loads(
        [(d.target(b), spec) for b, spec in loads], d.snapshot, probe_every
    )
    snaps = [s for _, s in samples]
    for m in [machine] if isinstance(machine, Machine) else machine or ():
        m.add(snaps[0], snaps[-1], results)
    return results, snaps


# -- 1. hard-limit accuracy --------------------------------------------------------

HL_CONNS, HL_DEPTH = 8, 32


def scenario_hard_limit(args: argparse.Namespace, value: bytes) -> Outcome:
    h = args.hard_limit
    through_resp = args.client == "resp"
    if through_resp:
        cost = unit_cost("get", args.value_size, key_prefix=resp.KEY_PREFIX)
        offered: float | None = None
        how = (
            f"redis-benchmark GET on the RESP port, closed loop ({HL_CONNS} conns x pipeline "
            f"{HL_DEPTH}: {HL_CONNS * HL_DEPTH} always outstanding)"
        )
    else:
        cost = unit_cost("get", args.value_size)
        offered = 3 * h / cost
        how = (
            f"offered {offered:,.0f} GET/s = 3 x H open loop "
            f"({HL_CONNS} conns, <= {HL_DEPTH} outstanding each)"
        )
    out = Outcome(
        "hard-limit",
        f"1. hard-limit accuracy{' through RESP' if through_resp else ''}: bucket hard_limit "
        f"{h:,} units/s (reserved 0, node capacity unlimited), {how}, {args.seconds:g} s",
    )
    mach = Machine()
    with daemon(["limited"], args.keys, value, args.server_cpus, args.workers) as d:
        if through_resp:
            # redis-benchmark reads its own key names; preloaded before the limit is set
            loadgen.preload(d.target("limited"), args.keys, value, key_prefix=resp.KEY_PREFIX)
        d.admin.set_bucket_throttle("limited", {"reserved": 0, "hard_limit": h})
        if through_resp:
            res, snaps = _run_resp(d, "limited", args, cost, mach)
        else:
            assert offered is not None
            spec = _spec(args, value, "get", HL_CONNS, HL_DEPTH, rate=offered)
            (res,), snaps = _run(d, [("limited", spec)], machine=mach)
    dl = delta(snaps[0], snaps[-1], "limited")
    err = 100.0 * (dl.units_per_s - h) / h
    secs = per_interval(snaps, "limited")
    srv = _srv_pct(snaps[0], snaps[-1])
    cli = _pct(res.client_cpu_s, res.window_s) or 0.0
    ops = dl.ru / cost if cost else 0
    srv_us = srv / 100 * dl.seconds / ops * 1e6 if srv is not None and ops else None
    client_line = (
        f"   redis-benchmark GET/s          {res.ops_per_s:>10,.1f}           "
        f"(its whole run, warm-up included; x {cost} unit)"
        if through_resp
        else f"   client ok GET/s                {res.ops_per_s:>10,.1f}           "
        f"(x {cost} unit = {res.ops_per_s * cost:,.1f} units/s)"
    )
    out.lines += [
        f"   achieved (server ru/wu delta)  {dl.units_per_s:>10,.1f} units/s   "
        f"error {err:+.2f} % vs H        target +-3 %   {_verdict(abs(err) <= 3)}",
        client_line,
        f"   per ~1 s interval (server)     {_range(secs)} units/s",
        f"   throttled {dl.throttled:,} requests, mean wait {_ms(dl.mean_wait_ms)}, "
        f"rejected {dl.rejected}, client errors {res.errors}",
        f"   cpu: server {_fmt_pct(srv)} (~{_num(srv_us)} µs per admitted op), load "
        f"generator {cli:.0f} % (of one core)",
    ]
    out.check(
        "achieved units/s vs hard_limit, error %",
        round(err, 3),
        f"{err:+.2f} %",
        "within +-3 %",
        abs(err) <= 3,
    )
    out.data = {
        "settings": {
            "hard_limit": h,
            "offered_ops_per_s": offered,
            "unit_cost": cost,
            "conns": HL_CONNS,
            "depth": HL_DEPTH,
            "seconds": args.seconds,
            "client": "redis-benchmark (RESP port)" if through_resp else "loadgen (MessagePack)",
        },
        "server": dl.to_json(),
        "per_interval_units_per_s": [round(x, 1) for x in secs],
        "client": _client_json(res),
        "server_cpu_pct": _r1(srv),
        "server_cpu_us_per_op": _r1(srv_us),
        "error_pct": round(err, 3),
    }
    _cpu_note(out, cli, srv, "hard-limit")
    return mach.close(out)


def _run_resp(
    d: Daemon, bucket: str, args: argparse.Namespace, cost: int, mach: Machine
) -> tuple[LoadResult, list[Snapshot]]:
    """redis-benchmark GETs on the RESP port, with ``server_status`` snapshots at
    the window's edges and every second inside it (as :func:`_run` takes them).

    redis-benchmark knows requests, not seconds: it gets enough for the warm-up,
    the window and 1.5 s more at the limit, and must still be running when the
    window ends, or the bucket was not pushed for the whole window.
    """
    port = d.handle.resp_port
    if port is None:
        raise BenchError("the daemon's ready file names no resp_port")
    requests = int(args.hard_limit / cost * (args.warmup + args.seconds + 1.5))
    cmd = resp.command(
        port,
        test="get",
        conns=HL_CONNS,
        depth=HL_DEPTH,
        requests=requests,
        size=args.value_size,
        keys=args.keys,
        user=f"{d.user}@{bucket}",
        password=d.password,
        host=d.handle.host,
    )
    proc = resp.start(cmd, args.client_cpus)
    try:
        t_measure = time.monotonic() + args.warmup
        t_end = t_measure + args.seconds
        _sleep_to(t_measure)
        snaps = [d.snapshot()]
        cli0 = _proc_stat(str(proc.pid))
        t_next = t_measure + 1.0
        while t_next < t_end - 0.25:
            _sleep_to(t_next)
            snaps.append(d.snapshot())
            t_next += 1.0
        _sleep_to(t_end)
        snaps.append(d.snapshot())
        cli1 = _proc_stat(str(proc.pid))
        early = proc.poll() is not None
        rb = resp.finish(proc, requests, timeout=max(30.0, 3 * (args.warmup + args.seconds)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    error = rb.error
    if early and error is None:
        error = "redis-benchmark ended before the window did: the limit was not pushed throughout"
    window = snaps[-1].uptime - snaps[0].uptime
    res = LoadResult(
        ok=round((rb.ops_per_s or 0.0) * window),
        errors=0 if error is None else 1,
        window_s=window,
        hist={},
        client_cpu_s=cli1[1] - cli0[1] if cli0 and cli1 else 0.0,
        server_cpu_s=None,
        error_sample=error,
        extra={
            "client": "redis-benchmark",
            "requests": requests,
            "redis_benchmark_ops_per_s": rb.ops_per_s,
            "redis_benchmark_p50_ms": rb.p50_ms,
            "redis_benchmark_p99_ms": rb.p99_ms,
        },
    )
    mach.add(snaps[0], snaps[-1], [res])
    return res, snaps


def _sleep_to(t: float) -> None:
    while (left := t - time.monotonic()) > 0:
        time.sleep(left)


def _range(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    return f"min {min(xs):,.0f} / median {statistics.median(xs):,.0f} / max {max(xs):,.0f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f} ms"


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


# -- 2. reservation under a noisy neighbour -----------------------------------------

Q_CONNS, Q_DEPTH = 4, 64
N_CONNS, N_DEPTH = 64, 16


def _merge(results: Sequence[LoadResult]) -> LoadResult:
    hist: dict[int, int] = {}
    hist_sent: dict[int, int] = {}
    for r in results:
        for b, n in r.hist.items():
            hist[b] = hist.get(b, 0) + n
        for b, n in r.hist_sent.items():
            hist_sent[b] = hist_sent.get(b, 0) + n
    samples = [r.error_sample for r in results if r.error_sample]
    return LoadResult(
        ok=sum(r.ok for r in results),
        errors=sum(r.errors for r in results),
        window_s=sum(r.window_s for r in results),
        hist=hist,
        client_cpu_s=sum(r.client_cpu_s for r in results),
        server_cpu_s=None,
        error_sample=samples[0] if samples else None,
        workers=max(r.workers for r in results),
        hist_sent=hist_sent,
    )


@dataclass
class _Phase:
    """One phase of the reservation scenario, round by round: Q's results and
    its server figures, the server's and the load generator's CPU %."""

    q: list[LoadResult] = field(default_factory=list)
    dq: list[Delta] = field(default_factory=list)
    srv: list[float] = field(default_factory=list)
    cli: list[float] = field(default_factory=list)


class _ReservationRuns:
    """What the reservation scenario measured: Q alone, Q with the noisy N (and
    N's own figures), and the control (throttling off, N open loop at its rate)."""

    def __init__(self) -> None:
        self.alone, self.noisy, self.control = _Phase(), _Phase(), _Phase()
        self.noisy_n: list[LoadResult] = []
        self.d_n: list[Delta] = []
        self.node_units: list[float] = []
        #: per round: CPU % of other processes in (alone, with N, control)
        self.others: list[tuple[float, ...]] = []


def scenario_reservation(args: argparse.Namespace, value: bytes) -> Outcome:
    cap, res_q, hard_n = args.capacity, args.reserved, args.noisy_hard_limit
    q_rate = res_q / unit_cost("get", args.value_size)
    out = Outcome(
        "reservation",
        f"2. reservation under a noisy neighbour: node capacity {cap:,}; quiet Q reserved "
        f"{res_q:,} offers {q_rate:,.0f} GET/s open loop ({Q_CONNS} conns); noisy N reserved 0 / "
        f"hard_limit {hard_n:,}, closed loop {N_CONNS} conns x depth {N_DEPTH}; "
        f"{args.rounds} x (Q alone, Q + N, control), {args.seconds:g} s each",
    )
    mach = Machine()
    runs = _ReservationRuns()
    with daemon(["quiet", "noisy"], args.keys, value, args.server_cpus, args.workers) as d:
        d.admin.set_node_throttle({"capacity": cap})
        d.admin.set_bucket_throttle("quiet", {"reserved": res_q, "hard_limit": "unlimited"})
        d.admin.set_bucket_throttle("noisy", {"reserved": 0, "hard_limit": hard_n})
        q_spec = _spec(args, value, "get", Q_CONNS, Q_DEPTH, rate=q_rate)
        n_spec = _spec(args, value, "get", N_CONNS, N_DEPTH)
        # The first run after a start has a worse tail (first-time code paths,
        # page faults): prime the server and the generator, unmeasured.
        report.log("  priming (not measured) ...")
        ps = 0.5 if args.quick else 1.0
        prime = dataclasses.replace(q_spec, seconds=ps, warmup=0.2)
        _run(
            d,
            [("quiet", prime), ("noisy", dataclasses.replace(n_spec, seconds=ps, warmup=0.2))],
            probe_every=None,
        )
        _run(d, [("quiet", prime)], probe_every=None)
        # Only window-edge snapshots here: a status call every second adds to
        # Q's tail, which is the figure under test.
        for i in range(args.rounds):
            _reservation_round(d, args, runs, mach, i, (q_spec, n_spec))
    _reservation_report(out, args, runs, q_rate)
    return mach.close(out)


def _reservation_round(
    d: Any,
    args: argparse.Namespace,
    runs: _ReservationRuns,
    mach: Machine,
    i: int,
    specs: tuple[LoadSpec, LoadSpec],
) -> None:
    """One round: Q alone, Q with N, then the control."""
    q_spec, n_spec = specs
    cap, hard_n = args.capacity, args.noisy_hard_limit
    report.log(f"  round {i + 1}: Q alone ...")
    (rq,), snaps = _run(d, [("quiet", q_spec)], None, [mach, m_a := Machine()])
    runs.alone.q.append(rq)
    runs.alone.dq.append(delta(snaps[0], snaps[-1], "quiet"))
    runs.alone.srv.append(_srv_pct(snaps[0], snaps[-1]) or 0.0)
    runs.alone.cli.append(_pct(rq.client_cpu_s, rq.window_s) or 0.0)
    report.log(f"  round {i + 1}: Q + noisy N ...")
    (rq, rn), snaps = _run(
        d, [("quiet", q_spec), ("noisy", n_spec)], None, [mach, m_n := Machine()]
    )
    runs.noisy.q.append(rq)
    runs.noisy_n.append(rn)
    dq, dn = delta(snaps[0], snaps[-1], "quiet"), delta(snaps[0], snaps[-1], "noisy")
    runs.noisy.dq.append(dq)
    runs.d_n.append(dn)
    runs.node_units.append(dq.units_per_s + dn.units_per_s)
    runs.noisy.srv.append(_srv_pct(snaps[0], snaps[-1]) or 0.0)
    runs.noisy.cli.append(_pct(rq.client_cpu_s + rn.client_cpu_s, rq.window_s) or 0.0)
    # Control: the same node load without the throttle's waiting: throttling
    # off, N offered open loop at the rate it just achieved.
    report.log(f"  round {i + 1}: control (throttling off, N open loop at its rate) ...")
    d.admin.set_node_throttle({"capacity": "unlimited"})
    d.admin.set_bucket_throttle("noisy", {"hard_limit": "unlimited"})
    cost = unit_cost("get", args.value_size)
    c_spec = dataclasses.replace(n_spec, rate=max(1.0, dn.units_per_s / cost))
    (rc, _), snaps = _run(d, [("quiet", q_spec), ("noisy", c_spec)], None, [mach, m_c := Machine()])
    d.admin.set_bucket_throttle("noisy", {"hard_limit": hard_n})
    d.admin.set_node_throttle({"capacity": cap})
    runs.control.q.append(rc)
    runs.others.append(tuple(m.pct()["other"] for m in (m_a, m_n, m_c)))
    runs.control.srv.append(_srv_pct(snaps[0], snaps[-1]) or 0.0)
    report.log(
        f"    p99 alone {_us(runs.alone.q[-1].percentile_us(0.99))}, with N "
        f"{_us(rq.percentile_us(0.99))}, control {_us(rc.percentile_us(0.99))}; "
        f"Q {dq.units_per_s:,.0f} units/s, N {dn.units_per_s:,.0f} units/s"
    )


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _reservation_report(
    out: Outcome, args: argparse.Namespace, r: _ReservationRuns, q_rate: float
) -> None:
    """The reservation scenario's lines, checks and JSON from its rounds."""
    res_q, hard_n = args.reserved, args.noisy_hard_limit
    a, q, n, c = _merge(r.alone.q), _merge(r.noisy.q), _merge(r.noisy_n), _merge(r.control.q)
    q_units, n_units, a_units = _sum_rate(r.noisy.dq), _sum_rate(r.d_n), _sum_rate(r.alone.dq)
    frac = 100.0 * q_units / res_q
    p99_a, p99_q, p99_c = (x.percentile_us(0.99) for x in (a, q, c))
    ratio, c_ratio = _ratio(p99_q, p99_a), _ratio(p99_c, p99_a)
    s99_a, s99_q = (x.percentile_us(0.99, from_send=True) for x in (a, q))
    s_ratio = _ratio(s99_q, s99_a)
    rounds_p99 = [
        (x.percentile_us(0.99), y.percentile_us(0.99), z.percentile_us(0.99))
        for x, y, z in zip(r.alone.q, r.noisy.q, r.control.q, strict=True)
    ]
    m_srv_a, m_srv_n = statistics.fmean(r.alone.srv), statistics.fmean(r.noisy.srv)
    # What N's admitted ops cost the server: the CPU added by N over Q alone.
    n_cpu_us = (m_srv_n - m_srv_a) / 100 / n_units * 1e6 if n_units else None
    q_cpu_us = m_srv_a / 100 / a_units * 1e6 if a_units else None
    cli_a, cli_n = statistics.fmean(r.alone.cli), statistics.fmean(r.noisy.cli)
    out.lines += [
        f"   Q achieved with N (server)     {q_units:>10,.1f} units/s = {frac:.1f} % of "
        f"reserved   target >= 97 %   {_verdict(frac >= 97)}",
        f"   Q p99 latency  alone {_us(p99_a):>9}  with N {_us(p99_q):>9}  ratio "
        f"{_x(ratio)}   target <= 1.2 x   {_verdict(ratio is not None and ratio <= 1.2)}",
        "     per round, alone / with N / control (other processes' CPU %): "
        + ", ".join(
            f"{_us(x)} / {_us(y)} / {_us(z)} ({' / '.join(f'{o:.0f}' for o in oth)})"
            for (x, y, z), oth in zip(rounds_p99, r.others, strict=True)
        ),
        f"     control, throttling off and N open loop at its achieved rate: Q p99 "
        f"{_us(p99_c)} = {_x(c_ratio)} alone, p50 {_us(c.percentile_us(0.5))}; "
        f"server {statistics.fmean(r.control.srv):.0f} %",
        f"     p99 from the actual send (generator's lateness left out): alone {_us(s99_a)}, "
        f"with N {_us(s99_q)}, ratio {_x(s_ratio)}",
        f"     p50 alone {_us(a.percentile_us(0.5))}, with N {_us(q.percentile_us(0.5))}; "
        f"p99.9 alone {_us(a.percentile_us(0.999))}, with N {_us(q.percentile_us(0.999))}",
        f"   Q alone (server)               {a_units:>10,.1f} units/s;  client ok GET/s "
        f"alone {a.ops_per_s:,.1f}, with N {q.ops_per_s:,.1f};  Q throttled with N: "
        f"{sum(x.throttled for x in r.noisy.dq)}",
        f"   N achieved (server)            {n_units:>10,.1f} units/s (hard_limit {hard_n:,});"
        f"  node total {statistics.fmean(r.node_units):,.0f} of capacity {args.capacity:,}",
        f"   N throttled {sum(x.throttled for x in r.d_n):,} requests, mean wait "
        f"{_ms(_mean_wait(r.d_n))}, rejected {sum(x.rejected for x in r.d_n):,}; N client ok "
        f"{n.ops_per_s:,.0f} GET/s, errors {n.errors:,}"
        + (f" ({n.error_sample})" if n.error_sample else ""),
        f"   cpu: server {m_srv_a:.0f} % with Q alone, {m_srv_n:.0f} % with N (N's ops cost "
        f"~{_num(n_cpu_us)} µs of server CPU each, Q's ~{_num(q_cpu_us)} µs); load generator "
        f"{cli_a:.0f} % / {cli_n:.0f} %",
    ]
    out.check("Q achieved / reserved, %", round(frac, 2), f"{frac:.1f} %", ">= 97 %", frac >= 97)
    out.check(
        "Q p99 with N / Q p99 alone",
        _r3(ratio),
        _x(ratio),
        "<= 1.2 x",
        ratio is not None and ratio <= 1.2,
    )
    n_errs: dict[str, int] = {}
    for x in r.d_n:
        for k, v in x.errors.items():
            n_errs[k] = n_errs.get(k, 0) + v
    out.data = {
        "settings": _reservation_settings(args, q_rate),
        "quiet_alone": _reservation_part(r.alone.dq, a, s99_a, [x for x, _, _ in rounds_p99]),
        "quiet_with_noisy": _reservation_part(r.noisy.dq, q, s99_q, [y for _, y, _ in rounds_p99]),
        "quiet_control": {
            "client": _client_json(c),
            "p99_from_send_us": _r1(c.percentile_us(0.99, from_send=True)),
            "per_round_p99_us": [_r1(z) for _, _, z in rounds_p99],
            "per_round_other_cpu_pct": r.others,
            "server_cpu_pct": _r1(statistics.fmean(r.control.srv)),
        },
        "noisy": {
            "server": [x.to_json() for x in r.d_n],
            "client": _client_json(n),
            "server_errors": n_errs,
        },
        "quiet_units_per_s": round(q_units, 1),
        "noisy_units_per_s": round(n_units, 1),
        "quiet_fraction_of_reserved_pct": round(frac, 2),
        "p99_ratio": _r3(ratio),
        "p99_from_send_ratio": _r3(s_ratio),
        "control_p99_ratio": _r3(c_ratio),
        "server_cpu_pct": {"alone": _r1(m_srv_a), "with_noisy": _r1(m_srv_n)},
        "server_cpu_us_per_op": {"quiet_alone": _r1(q_cpu_us), "noisy": _r1(n_cpu_us)},
        "client_cpu_pct": {"alone": _r1(cli_a), "with_noisy": _r1(cli_n)},
    }
    out.notes.append(
        "reservation: Q's latency is counted from each request's scheduled send time, so it "
        "includes the generator's own lateness on the shared 2 cores (Q's worker competes "
        "with N's worker and the server); the 'from the actual send' line leaves that out"
    )
    _cpu_note(out, cli_n, m_srv_n, "reservation")


def _reservation_settings(args: argparse.Namespace, q_rate: float) -> dict[str, Any]:
    return {
        "capacity": args.capacity,
        "quiet_reserved": args.reserved,
        "noisy_hard_limit": args.noisy_hard_limit,
        "quiet_rate_ops_per_s": q_rate,
        "quiet_conns": Q_CONNS,
        "quiet_depth_cap": Q_DEPTH,
        "noisy_conns": N_CONNS,
        "noisy_depth": N_DEPTH,
        "rounds": args.rounds,
        "seconds": args.seconds,
    }


def _reservation_part(
    ds: list[Delta], merged: LoadResult, s99: float | None, p99s: list[float | None]
) -> dict[str, Any]:
    return {
        "server": [x.to_json() for x in ds],
        "client": _client_json(merged),
        "p99_from_send_us": _r1(s99),
        "per_round_p99_us": [_r1(x) for x in p99s],
    }


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _sum_rate(ds: Sequence[Delta]) -> float:
    secs = sum(x.seconds for x in ds)
    return sum(x.units for x in ds) / secs if secs > 0 else 0.0


def _mean_wait(ds: Sequence[Delta]) -> float | None:
    parked = sum(x.throttled - x.rejected for x in ds)
    return sum(x.wait_us for x in ds) / parked / 1000 if parked > 0 else None


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f} x"


def _r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# -- 3. fairness 1 vs 64 connections -------------------------------------------------

F_DEPTH = 16
F_MANY = 64


def jain(xs: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    sq = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * sq) if sq > 0 else 1.0


def scenario_fairness(args: argparse.Namespace, value: bytes) -> Outcome:
    cap = args.capacity
    out = Outcome(
        "fairness",
        f"3. fairness 1 vs {F_MANY} connections: node capacity {cap:,}; buckets 'one' and "
        f"'many' reserved 0 / hard_limit unlimited; closed loop GET depth {F_DEPTH} per "
        f"connection on 1 and {F_MANY} connections; {args.seconds:g} s",
    )
    mach = Machine()
    with daemon(["one", "many"], args.keys, value, args.server_cpus, args.workers) as d:
        d.admin.set_node_throttle({"capacity": cap})
        for b in ("one", "many"):
            d.admin.set_bucket_throttle(b, {"reserved": 0, "hard_limit": "unlimited"})
        loads = [
            ("one", _spec(args, value, "get", 1, F_DEPTH)),
            ("many", _spec(args, value, "get", F_MANY, F_DEPTH)),
        ]
        (r1, rm), snaps = _run(d, loads, machine=mach)
    d1, dm = delta(snaps[0], snaps[-1], "one"), delta(snaps[0], snaps[-1], "many")
    u1, um = d1.units_per_s, dm.units_per_s
    total = u1 + um
    j = jain([u1, um])
    s1, sm = per_interval(snaps, "one"), per_interval(snaps, "many")
    per_j = [jain([a, b]) for a, b in zip(s1, sm, strict=True)]
    srv = _srv_pct(snaps[0], snaps[-1])
    cli = _pct(r1.client_cpu_s + rm.client_cpu_s, r1.window_s) or 0.0
    out.lines += [
        f"   'one'  (1 conn)    {u1:>10,.1f} units/s  share {100 * u1 / total:5.1f} %   "
        f"client ok {r1.ops_per_s:,.0f} GET/s, throttled {d1.throttled:,}, "
        f"mean wait {_ms(d1.mean_wait_ms)}",
        f"   'many' ({F_MANY} conns)  {um:>10,.1f} units/s  share {100 * um / total:5.1f} %   "
        f"client ok {rm.ops_per_s:,.0f} GET/s, throttled {dm.throttled:,}, "
        f"mean wait {_ms(dm.mean_wait_ms)}",
        f"   node total         {total:>10,.1f} units/s = {100 * total / cap:.1f} % of capacity",
        f"   Jain's index       {j:.4f}   target >= 0.99   {_verdict(j >= 0.99)}",
        f"   per ~1 s interval: Jain min {min(per_j, default=float('nan')):.4f}; "
        f"'one' {_range(s1)}, 'many' {_range(sm)}",
        f"   rejected {d1.rejected + dm.rejected}, client errors {r1.errors + rm.errors}; "
        f"cpu: server {_fmt_pct(srv)}, load generator {cli:.0f} %",
    ]
    out.check("Jain's index (1 vs 64 conns)", round(j, 5), f"{j:.4f}", ">= 0.99", j >= 0.99)
    out.data = {
        "settings": {
            "capacity": cap,
            "depth": F_DEPTH,
            "conns": [1, F_MANY],
            "seconds": args.seconds,
        },
        "one": {
            "server": d1.to_json(),
            "client": _client_json(r1),
            "per_interval_units_per_s": [round(x, 1) for x in s1],
        },
        "many": {
            "server": dm.to_json(),
            "client": _client_json(rm),
            "per_interval_units_per_s": [round(x, 1) for x in sm],
        },
        "jain": round(j, 5),
        "per_interval_jain": [round(x, 5) for x in per_j],
        "server_cpu_pct": _r1(srv),
        "client_cpu_pct": _r1(cli),
    }
    _cpu_note(out, cli, srv, "fairness")
    return mach.close(out)


# -- 4. throttling overhead ------------------------------------------------------------

O_CONNS, O_DEPTH = 4, 64


def scenario_overhead(args: argparse.Namespace, value: bytes) -> Outcome:
    secs, reps = args.overhead_seconds, args.overhead_reps
    out = Outcome(
        "overhead",
        f"4. throttling overhead: max pipelined throughput, {O_CONNS} conns x depth {O_DEPTH}, "
        f"off (capacity unlimited: gate skipped, metering only) vs on-but-unlimited "
        f"(capacity {HUGE_CAPACITY:.0e}, bucket 0 / unlimited); per op {reps} x (off, on) "
        f"then off, {secs:g} s each, after an unmeasured priming run; medians",
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    mach = Machine()
    with daemon(["bench"], args.keys, value, args.server_cpus, args.workers) as d:
        d.admin.set_bucket_throttle("bench", {"reserved": 0, "hard_limit": "unlimited"})
        tickets = "throughput probing (server default)"
        if args.tickets:
            try:
                for name in TICKET_PARAMS:
                    d.admin.command("set_parameter", name=name, value=args.tickets)
                tickets = f"fixed at {args.tickets} read + {args.tickets} write (probing off)"
            except Exception as exc:  # an older/newer server without these parameters
                tickets = "throughput probing (server default)"
                out.notes.append(f"overhead: could not fix the execution tickets ({exc})")
        out.lines.append(f"   execution tickets: {tickets}")
        for op in ("get", "set"):
            runs[op] = _overhead_runs(d, args, value, op, mach)
    out.lines.append(
        f"   {'op':<4} {'off ops/s (median)':>19} {'on ops/s (median)':>18} {'on/off':>7}"
        f"   target   result   runs off | on"
    )
    summary: dict[str, Any] = {}
    for op, by in runs.items():
        summary[op] = _overhead_op(out, op, by)
    out.data = {
        "execution_tickets": tickets,
        "settings": {
            "conns": O_CONNS,
            "depth": O_DEPTH,
            "seconds": secs,
            "reps": reps,
            "on_capacity": HUGE_CAPACITY,
        },
        "ops": summary,
    }
    out.notes.append(
        "overhead: GET is bound by the daemon's event loop (server cpu near 100 %); the "
        "generator's share of the 2 cores is the same in off and on runs, so the ratio "
        "holds even where the absolute ops/s do not. SET also depends on the disk and on "
        "the write-ticket pool, which throughput probing grows from run to run: the "
        "off/on/.../off order cancels a steady drift, not jumps"
    )
    return mach.close(out)


def _overhead_runs(
    d: Daemon, args: argparse.Namespace, value: bytes, op: str, mach: Machine
) -> dict[str, list[dict[str, Any]]]:
    """One op's runs, off and on alternating (after a priming run)."""
    secs, reps = args.overhead_seconds, args.overhead_reps
    warm = 0.3 if args.quick else min(args.warmup, 0.5)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    spec = _spec(args, value, op, O_CONNS, O_DEPTH, workers=2, seconds=secs, warmup=warm)
    # Prime (first-run effects, execution-ticket probing), not measured.
    d.admin.set_node_throttle({"capacity": "unlimited"})
    prime_s = 0.5 if args.quick else 1.0
    _run(d, [("bench", dataclasses.replace(spec, seconds=prime_s))], None)
    # off, on, off, on, ..., off: every "on" run lies between two "off"
    # runs, so a steady drift shifts both medians alike.
    order = [(i, m) for i in range(reps) for m in ("off", "on")] + [(reps, "off")]
    for i, mode in order:
        cap: int | str = "unlimited" if mode == "off" else HUGE_CAPACITY
        d.admin.set_node_throttle({"capacity": cap})
        (r,), snaps = _run(d, [("bench", spec)], None, mach)
        enabled = snaps[-1].node.get("enabled")
        if enabled != (mode == "on"):
            raise BenchError(f"throttle enabled={enabled!r} in the {mode!r} run")
        dl = delta(snaps[0], snaps[-1], "bench")
        srv = _srv_pct(snaps[0], snaps[-1])
        cli = _pct(r.client_cpu_s, r.window_s) or 0.0
        runs[mode].append(
            {
                "ops_per_s": round(r.ops_per_s, 1),
                "errors": r.errors,
                "p50_us": _r1(r.percentile_us(0.5)),
                "p99_us": _r1(r.percentile_us(0.99)),
                "server_cpu_pct": _r1(srv),
                "client_cpu_pct": _r1(cli),
                "throttle_count": dl.throttled,
            }
        )
        report.log(
            f"  {op} {mode:<3} run {i + 1}: {r.ops_per_s:>10,.0f} ops/s  "
            f"srv {_fmt_pct(srv)}  cli {cli:.0f} %  throttled {dl.throttled}"
        )
    return runs


def _overhead_op(out: Outcome, op: str, by: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One op's line, check and figures: on/off medians and each on against its offs."""
    off = [x["ops_per_s"] for x in by["off"]]
    on = [x["ops_per_s"] for x in by["on"]]
    m_off, m_on = statistics.median(off), statistics.median(on)
    ratio = m_on / m_off if m_off else 0.0
    # each "on" run against the mean of the "off" runs just before and after it
    pairs = [b / ((off[k] + off[k + 1]) / 2) for k, b in enumerate(on) if off[k] + off[k + 1]]
    out.lines.append(
        f"   {op:<4} {m_off:>19,.0f} {m_on:>18,.0f} {ratio:>7.3f}   >= 0.95   "
        f"{_verdict(ratio >= 0.95):<6}   {' '.join(f'{x:,.0f}' for x in off)} | "
        f"{' '.join(f'{x:,.0f}' for x in on)}"
    )
    thr = sum(x["throttle_count"] for x in by["on"])
    errs = sum(x["errors"] for x in by["off"] + by["on"])
    srv_off = statistics.median(x["server_cpu_pct"] or 0 for x in by["off"])
    srv_on = statistics.median(x["server_cpu_pct"] or 0 for x in by["on"])
    cli_all = statistics.median(x["client_cpu_pct"] or 0 for x in by["off"] + by["on"])
    out.lines.append(
        f"        each on / mean of its neighbouring offs: {_range_f(pairs)}; server cpu "
        f"off {srv_off:.0f} % / on {srv_on:.0f} %, generator {cli_all:.0f} %; "
        f"throttled while on: {thr}, errors {errs}"
    )
    out.check(
        f"{op.upper()} on/off throughput (medians)",
        round(ratio, 4),
        f"{ratio:.3f}",
        ">= 0.95",
        ratio >= 0.95,
    )
    figures = {
        "off": by["off"],
        "on": by["on"],
        "median_off": m_off,
        "median_on": m_on,
        "ratio": round(ratio, 4),
        "on_over_neighbouring_off": [round(x, 4) for x in pairs],
    }
    _cpu_note(out, cli_all, max(srv_off, srv_on), f"overhead {op}")
    return figures


def _range_f(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.3f}..{max(xs):.3f}"


# -- driver ------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[argparse.Namespace, bytes], Outcome]] = {
    "hard-limit": scenario_hard_limit,
    "reservation": scenario_reservation,
    "fairness": scenario_fairness,
    "overhead": scenario_overhead,
}


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    value = report.value_bytes(args.value_size, b"throttle")
    g, s = unit_cost("get", args.value_size), unit_cost("set", args.value_size)
    out, meta = report.run_header(args, "throttle")
    print(
        f"\n{args.value_size} B values, {args.keys} keys per bucket: a GET hit "
        f"costs {g} unit(s), a SET {s}; rates from the server's ru_total/wu_total over its "
        f"own clock; warm-up {args.warmup:g} s{' (quick)' if args.quick else ''}"
        + (
            f"\nserve --workers {args.workers}: a supervisor and {args.workers} worker "
            "processes; rates are the node's (all workers), server CPU sums every process"
            if args.workers > 1
            else ""
        )
        + (
            f"\npinned: daemon on CPU {sorted(args.server_cpus)}, load on "
            f"{sorted(args.client_cpus)}"
            if args.server_cpus
            else ""
        ),
        file=out,
        flush=True,
    )
    parts = Parts(args, out, "throttle")
    for name in args.scenario:
        report.log(f"scenario {name} ...")
        t1 = time.monotonic()
        o = RUNNERS[name](args, value)
        o.data["elapsed_s"] = round(time.monotonic() - t1, 1)
        report.log(f"scenario {name} done in {o.data['elapsed_s']:g} s")
        parts.show(o)
    return parts.finish(meta, part="scenario", widths=(12, 42, 12), key="scenarios")
