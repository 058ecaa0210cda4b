"""``python -m bench probing``: execution tickets sized by throughput probing.

Three parts, on self-started daemons (temporary data directories), configured
by ``admin`` and loaded by a plain ``bench`` user with the readwrite role:

1. ``sweep`` — the read and the write ticket pools fixed at N each
   (``storage_engine_concurrent_{read,write}_transactions``, which turns
   probing off) for N in 1, 2, 4, ..., 256, under a read-heavy (95 % GET /
   5 % durable SET) and a write-heavy (10 % / 90 %) workload: many
   connections, pipelined, every connection mixing both ops in a fixed
   ratio. Two passes (ascending, then descending) cancel a steady drift. The
   best fixed size of each workload is the reference for part 2.
2. ``probing`` — both fixed sizes back to 0 with
   ``throughput_probing_initial_concurrency`` = 2 x min (both pools at the
   minimum): the time until the throughput reaches 95 % of the best fixed
   size's (target <= 10 s), the steady-state ratio and the pool sizes probing
   settles on; then the workload switches from read-heavy to write-heavy in
   mid-run (the same connections) and the same figures are taken from the
   switch; and write-heavy from the minimum. Each run also re-measures the
   best fixed size next to it, so drift on the shared machine does not pass
   for probing's merit.
3. ``overhead`` — the cost of ticket accounting: the default server
   (probing on, pools 128 + 128), a "huge pools" mode (fixed 100 000 each:
   tickets are still taken, never waited for), and a daemon started with the
   execution-ticket gate replaced by one that hands out a no-op ticket
   without counting anything ("no tickets", a patched launch; the server
   code on disk is untouched). Runs alternate default, huge, none, ...,
   default; medians compared (target: tickets cost <= 3 %).

Throughput in parts 1 and 2 is the server's own count: the change of
``execution.read.finished_processing + execution.write.finished_processing``
between two ``server_status`` samples taken every 0.5 s, over the change of
``uptime_secs``. Part 3 counts ok replies at the client (the patched daemon
has no ticket counters).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import MIXED, BenchError, LoadResult, LoadSpec
from bench.options import Quick
from bench.throttle import (
    Daemon,
    Machine,
    Outcome,
    Parts,
    Snapshot,
    _cpu_note,
    _pct,
    _verdict,
)
from tenantkv.admission.execution_tickets import NOOP_TICKET, Ticket, TicketHolder

PARTS = ("sweep", "probing", "overhead")
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUICK_SIZES = (1, 16, 256)
READ_P = "storage_engine_concurrent_read_transactions"
WRITE_P = "storage_engine_concurrent_write_transactions"
MAX_P = "throughput_probing_max_concurrency"
MIN_P = "throughput_probing_min_concurrency"
INITIAL_P = "throughput_probing_initial_concurrency"
#: Sample period of the server's counters (s).
TICK = 0.5
#: Target: probing reaches this share of the best fixed throughput ...
REACH = 0.95
#: ... within this many seconds.
REACH_SECONDS = 10.0
#: Target: ticket accounting costs at most this share of throughput.
OVERHEAD_TARGET = 0.03
#: "Huge pools" of part 3 (the probing maximum is raised to match).
HUGE = 100_000
#: Part 1 / 2: gates that would otherwise bound a bucket's concurrency before
#: the execution pools do (64 each by default) are opened this wide.
OPEN_GATES = {"bucket_queue_concurrency": 1024, "write_permit_max_capacity": 1024}
#: Part 3: pipelined GET as in ``throttle``'s overhead scenario.
O_CONNS, O_DEPTH = 4, 64
BUCKET = "bench"


# -- command line ------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.parts(p, "--part", PARTS, "parts", " (probing needs the sweep)")
    options.common_flags(p)
    options.add(
        p,
        "--sizes",
        options.int_list,
        Quick(list(SIZES), list(QUICK_SIZES)),
        "pool sizes swept",
        show="1,2,4,...,512; quick 1,16,256",
    )
    options.add(p, "--seconds", float, Quick(2.5, 1.0), "sweep: window per size, a multiple of 0.5")
    options.add(
        p, "--passes", int, Quick(2, 1), "sweep: 1 = ascending, 2 = and descending", low=1, high=2
    )
    options.add(
        p,
        "--probe-seconds",
        float,
        Quick(30.0, 3.0),
        "probing: length of each probing phase, a multiple of 0.5",
    )
    options.add(
        p,
        "--reference-seconds",
        float,
        Quick(3.0, 0.5),
        "probing: window of the adjacent best-fixed re-measurement",
    )
    options.add(p, "--conns", int, 32, "connections of the mixed loads", low=1)
    options.add(p, "--depth", int, 16, "pipeline depth per connection", low=1)
    options.add(p, "--workers", int, 2, "load-generator processes", low=1)
    options.add(p, "--read-heavy-sets", float, 0.05, "SET share of read-heavy", low=0, high=1)
    options.add(p, "--write-heavy-sets", float, 0.90, "SET share of write-heavy", low=0, high=1)
    options.data_flags(p, Quick(10_000, 2000), keys_help="keys, all preloaded")
    options.add(
        p, "--overhead-seconds", float, Quick(2.0, 1.0), "overhead: window of each run", above=0
    )
    options.add(
        p,
        "--overhead-reps",
        int,
        Quick(5, 1),
        "overhead: rounds of (default, huge, none, a/a)",
        low=1,
    )


def _ticks(x: float, what: str) -> int:
    n = round(x / TICK)
    if n < 1 or abs(n * TICK - x) > 1e-9:
        raise BenchError(f"{what} must be a positive multiple of {TICK:g} s")
    return n


def _finish_args(args: argparse.Namespace) -> None:
    q = args.quick
    args.warmup = 0.5 if q else 1.0
    args.window_ticks = _ticks(args.seconds, "--seconds")
    args.probe_ticks = _ticks(args.probe_seconds, "--probe-seconds")
    args.ref_ticks = _ticks(args.reference_seconds, "--reference-seconds")
    if "probing" in args.part and "sweep" not in args.part:
        args.part = ["sweep", *args.part]  # probing's reference is the sweep's best
    servers.pin_cpus(args)


# -- daemons and samples ---------------------------------------------------------------


def _launcher(no_tickets: bool) -> list[str]:
    """``python -c ...``: run ``tenantkv serve`` with the execution-ticket gate replaced
    (``no_tickets``) or, as the A/A control, unchanged but started the same way."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        f"import sys; sys.path.insert(0, {root!r}); "
        "from bench.probing import serve_without_tickets; "
        f"sys.exit(serve_without_tickets(sys.argv[1:], patch={no_tickets!r}))"
    )
    return [sys.executable, "-c", code]


class FreeTickets:
    """Stands in for a ticket pool: every operation gets the shared no-op ticket."""

    def try_acquire(
        self, priority: Any = None, *, held: bool = False, readmission: bool = False
    ) -> Ticket:
        return NOOP_TICKET

    async def acquire(
        self, priority: Any = None, *, deadline: float | None = None, **kwargs: Any
    ) -> Ticket:
        return NOOP_TICKET

    def try_pass(self, n: int = 1) -> bool:
        return True

    def room(self) -> int:
        return sys.maxsize  # a run of writes may take any number of no-op tickets

    def add(self, ticket: Ticket, n: int) -> None:
        pass  # more operations of a run on the no-op ticket: nothing counted


def micro_cost(n: int = 300_000) -> tuple[float, float]:
    """µs per ``try_acquire().release()`` of a real pool and of :class:`FreeTickets`,
    in this process (best of 3): what one data operation pays in each daemon."""
    out = []
    for pool in (TicketHolder(128, name="read"), FreeTickets()):
        take = pool.try_acquire
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(n):
                take().release()
            best = min(best, time.perf_counter() - t)
        out.append(best / n * 1e6)
    return out[0], out[1]


def serve_without_tickets(argv: Sequence[str], patch: bool = True) -> int:
    """``tenantkv serve`` whose admission pipeline takes no execution tickets.

    Runs in the daemon's process (see :func:`_no_ticket_launcher`): the
    pipeline built at start-up gets, for both pools, an object whose
    ``try_acquire`` / ``acquire`` return the shared no-op ticket, so a data
    operation does one method call and no accounting. Everything else (the
    other gates, the prober, exempt work) is the unmodified server. For the
    overhead A/B only.
    """
    import tenantkv.server.node as node_mod
    from tenantkv.server import cli

    if not patch:
        return cli.main(list(argv))

    def free_tickets(pipeline: Any) -> None:
        pipeline.read_tickets = pipeline.write_tickets = FreeTickets()

    node_mod.PIPELINE_HOOKS.append(free_tickets)
    return cli.main(list(argv))


@contextlib.contextmanager
def daemon(
    keys: int,
    value: bytes,
    cpus: set[int] | None = None,
    launcher: Sequence[str] | None = None,
) -> Iterator[Daemon]:
    """A started daemon with bucket ``bench``, user ``bench`` and every key preloaded."""

    what = "" if not launcher else " (no execution tickets)" if "True" in launcher[-1] else " (A/A)"
    report.log(f"  starting tenantkv{what} ...")
    with (
        servers.tenantkv_server(cpus=cpus, launcher=launcher) as handle,
        servers.bench_user(handle, BUCKET) as (admin, password),
    ):
        d = Daemon(handle, admin, "bench", password)
        loadgen.preload(d.target(BUCKET), keys, value)
        yield d


def set_params(d: Daemon, **params: Any) -> None:
    """``set_parameter`` each, in the order given."""
    for name, value in params.items():
        d.admin.command("set_parameter", name=name, value=value)


def fixed(d: Daemon, n: int) -> None:
    set_params(d, **{READ_P: n, WRITE_P: n})


@dataclass
class Sample:
    """The execution section of one ``server_status``, the daemon's CPU, the machine's."""

    t: float  # time.monotonic()
    snap: Snapshot  # uptime, daemon CPU and other processes' CPU (for Machine)
    finished_r: int
    finished_w: int
    queued_r: int  # execution.*.added_to_queue: admissions that had to wait
    queued_w: int
    size_r: int
    size_w: int
    state: str
    stable: float

    @property
    def uptime(self) -> float:
        return self.snap.uptime

    @property
    def finished(self) -> int:
        return self.finished_r + self.finished_w


def sample(d: Daemon) -> Sample:
    st = d.admin.server_status()
    ex = st["execution"]
    r, w, pr = ex["read"], ex["write"], ex.get("probing", {})
    snap = Snapshot.bare(float(st["uptime_secs"]), d.handle.cpu_seconds())
    return Sample(
        t=time.monotonic(),
        snap=snap,
        finished_r=r["finished_processing"],
        finished_w=w["finished_processing"],
        queued_r=r["added_to_queue"],
        queued_w=w["added_to_queue"],
        size_r=r["total_tickets"],
        size_w=w["total_tickets"],
        state=str(pr.get("state", "?")),
        stable=float(pr.get("stable_concurrency", 0.0)),
    )


def rate(a: Sample, b: Sample) -> float:
    """Operations finished per second of the server's clock between two samples."""
    dt = b.uptime - a.uptime
    return (b.finished - a.finished) / dt if dt > 0 else 0.0


def srv_pct(a: Sample, b: Sample) -> float | None:
    if a.snap.cpu_s is None or b.snap.cpu_s is None:
        return None
    return _pct(b.snap.cpu_s - a.snap.cpu_s, b.uptime - a.uptime)


def mixed_spec(
    args: argparse.Namespace, value: bytes, set_fraction: float, ticks: int, **kw: Any
) -> LoadSpec:
    return LoadSpec(
        op=MIXED,
        conns=args.conns,
        depth=args.depth,
        value=value,
        keys=args.keys,
        seconds=ticks * TICK,
        warmup=kw.pop("warmup", 1.0),
        workers=args.workers,
        cpus=args.client_cpus,
        set_fraction=set_fraction,
        **kw,
    )


def timeline(
    d: Daemon,
    spec: LoadSpec,
    actions: dict[int, Callable[[], None]],
    machine: Machine,
) -> tuple[LoadResult, list[Sample]]:
    """Run ``spec`` (``seconds`` = N ticks) and sample the server every tick.

    ``actions[i]`` runs right after sample ``i`` (sample 0 is at the start of
    the window, sample N at its end).
    """
    samples: list[Sample] = []

    def probe() -> None:
        i = len(samples)
        samples.append(sample(d))
        act = actions.get(i)
        if act is not None:
            act()

    (res,), _ = loadgen.run_loads([(d.target(BUCKET), spec)], probe, TICK)
    machine.add(samples[0].snap, samples[-1].snap, [res])
    return res, samples


# -- 1. fixed pool sweep ---------------------------------------------------------------


@dataclass
class Workload:
    name: str
    set_fraction: float

    def describe(self) -> str:
        s = round(100 * self.set_fraction)
        return f"{self.name} ({100 - s} % GET / {s} % SET)"


@dataclass
class SweepResult:
    workload: Workload
    #: size -> throughput (ops/s) of each pass
    runs: dict[int, list[float]]
    #: size -> (read waits, write waits, ops) over all passes
    waits: dict[int, tuple[int, int, int]]
    srv: dict[int, list[float]]

    def mean(self, n: int) -> float:
        return statistics.fmean(self.runs[n])

    @property
    def best(self) -> int:
        return max(self.runs, key=self.mean)

    @property
    def best_rate(self) -> float:
        return self.mean(self.best)


def sweep(
    d: Daemon, args: argparse.Namespace, value: bytes, w: Workload, machine: Machine
) -> SweepResult:
    sizes = list(args.sizes)
    plan = sizes + (sizes[::-1] if args.passes == 2 else [])
    seg = 1 + args.window_ticks  # one tick settling, then the window
    actions = {j * seg: (lambda n=n: fixed(d, n)) for j, n in enumerate(plan)}
    fixed(d, plan[0])
    spec = mixed_spec(args, value, w.set_fraction, seg * len(plan), warmup=args.warmup)
    report.log(f"  sweep {w.name}: sizes {' '.join(map(str, plan))} ({spec.seconds:g} s) ...")
    res, ss = timeline(d, spec, actions, machine)
    out = SweepResult(w, {}, {}, {})
    for j, n in enumerate(plan):
        a, b = ss[j * seg + 1], ss[(j + 1) * seg]
        if (b.size_r, b.size_w) != (n, n):
            raise BenchError(f"pool sizes {b.size_r}/{b.size_w} while {n} was set")
        out.runs.setdefault(n, []).append(rate(a, b))
        out.srv.setdefault(n, []).append(srv_pct(a, b) or 0.0)
        qr, qw, ops = out.waits.get(n, (0, 0, 0))
        out.waits[n] = (
            qr + b.queued_r - a.queued_r,
            qw + b.queued_w - a.queued_w,
            ops + b.finished - a.finished,
        )
    if res.errors:
        raise BenchError(f"sweep {w.name}: {res.errors} requests failed, e.g. {res.error_sample}")
    return out


def part_sweep(
    d: Daemon, args: argparse.Namespace, value: bytes, loads: Sequence[Workload]
) -> tuple[Outcome, list[SweepResult]]:
    passes = "ascending then descending" if args.passes == 2 else "ascending"
    out = Outcome(
        "sweep",
        f"1. fixed pool sweep: read pool = write pool = N (probing off); {passes}, "
        f"{args.seconds:g} s per size after {TICK:g} s settling; ops/s = server "
        "finished_processing (read + write)",
    )
    mach = Machine()
    results = [sweep(d, args, value, w, mach) for w in loads]
    head = f"   {'N':>4}"
    for r in results:
        head += f" | {r.workload.name + ' ops/s':>20} {'%best':>5} {'w-wait':>6} {'srv%':>4}"
    out.lines.append(head)
    for n in args.sizes:
        line = f"   {n:>4}"
        for r in results:
            runs = r.runs[n]
            shown = " / ".join(f"{x:,.0f}" for x in runs) if len(runs) > 1 else f"{runs[0]:,.0f}"
            _, qw, ops = r.waits[n]
            line += (
                f" | {shown:>20} {100 * r.mean(n) / r.best_rate:>5.0f}"
                f" {100 * qw / max(1, ops):>5.0f}% {statistics.fmean(r.srv[n]):>4.0f}"
            )
        out.lines.append(line)
    if args.passes == 2:
        out.lines.append(
            "   (two figures: ascending / descending pass; %best uses their mean; w-wait = "
            "share of ops that waited for a write ticket)"
        )
    data: dict[str, Any] = {"sizes": list(args.sizes), "passes": args.passes}
    for r in results:
        n = r.best
        near = min(m for m in args.sizes if r.mean(m) >= REACH * r.best_rate)
        spread = (
            max((max(v) - min(v)) / statistics.fmean(v) for v in r.runs.values() if len(v) > 1)
            if args.passes == 2
            else None
        )
        out.lines.append(
            f"   best fixed, {r.workload.describe()}: N = {n}, {r.best_rate:,.0f} ops/s; "
            f"smallest N within {100 * REACH:.0f} %: {near}"
            + (f"; passes differ by up to {100 * spread:.0f} %" if spread is not None else "")
        )
        read_waits = sum(x[0] for x in r.waits.values())
        data[r.workload.name] = {
            "set_fraction": r.workload.set_fraction,
            "ops_per_s": {str(k): [round(x, 1) for x in v] for k, v in r.runs.items()},
            "server_cpu_pct": {str(k): [round(x, 1) for x in v] for k, v in r.srv.items()},
            "read_ticket_waits": {str(k): v[0] for k, v in r.waits.items()},
            "write_ticket_waits": {str(k): v[1] for k, v in r.waits.items()},
            "best_size": n,
            "best_ops_per_s": round(r.best_rate, 1),
            "smallest_size_within_95pct": near,
            "read_waits_total": read_waits,
        }
    if all(sum(x[0] for x in r.waits.values()) == 0 for r in results):
        out.lines.append(
            "   reads never waited for a read ticket, even at N = 1 (execution.read."
            "added_to_queue stayed 0): a GET takes and returns its ticket inside one "
            "synchronous step, so the read pool never binds; only the write pool matters"
        )
    out.data = data
    return mach.close(out), results


# -- 2. probing ------------------------------------------------------------------------


@dataclass
class Phase:
    """One probing phase of a timeline: samples [start, end] and its reference."""

    label: str
    short: str
    start: int
    end: int
    best: float  # the sweep's best fixed throughput of this workload
    best_size: int
    reference: float | None = None  # the best fixed size re-measured in the same run


def _rates(ss: Sequence[Sample], p: Phase) -> list[tuple[float, float, Sample]]:
    """(seconds since the phase began, ops/s over the tick ending there, sample)."""
    t0 = ss[p.start].uptime
    return [
        (ss[i].uptime - t0, rate(ss[i - 1], ss[i]), ss[i]) for i in range(p.start + 1, p.end + 1)
    ]


def analyse(ss: Sequence[Sample], p: Phase) -> dict[str, Any]:
    ref = max(p.best, p.reference or 0.0)
    rs = _rates(ss, p)
    first = next((t for t, r, _ in rs if r >= REACH * ref), None)
    held = None
    for k in range(1, len(rs)):
        a, b = ss[p.start + k - 1], ss[p.start + k + 1]
        if rate(a, b) >= REACH * ref:  # the 1 s (two-tick) average
            held = rs[k][0]
            break
    span = max(1, min(len(rs) // 3, round(10 / TICK)))
    a, b = ss[p.end - span], ss[p.end]
    steady = rate(a, b)
    tail = [s for _, _, s in rs[-span:]]
    at = {}
    for mark in (1, 2, 5, 10, 20, 30, 60):
        if mark <= rs[-1][0] + TICK / 2:
            _, r, s = min(rs, key=lambda x: abs(x[0] - mark))
            at[mark] = (r / ref, s.size_r, s.size_w)
    return {
        "phase": p.label,
        "short": p.short,
        "reference_ops_per_s": round(ref, 1),
        "sweep_best_ops_per_s": round(p.best, 1),
        "sweep_best_size": p.best_size,
        "adjacent_fixed_ops_per_s": None if p.reference is None else round(p.reference, 1),
        "reached_95pct_s": first,
        "reached_95pct_1s_avg_s": held,
        "steady_window_s": span * TICK,
        "steady_ops_per_s": round(steady, 1),
        "steady_ratio": round(steady / ref, 4),
        "steady_read_pool": statistics.median(s.size_r for s in tail),
        "steady_write_pool": statistics.median(s.size_w for s in tail),
        "steady_stable_concurrency": round(statistics.median(s.stable for s in tail), 1),
        "at": {str(k): [round(v[0], 3), v[1], v[2]] for k, v in at.items()},
        "series": [[round(t, 2), round(r, 1), s.size_r, s.size_w, s.state] for t, r, s in rs],
    }


def _secs(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def part_probing(
    d: Daemon, args: argparse.Namespace, value: bytes, sweeps: Sequence[SweepResult]
) -> Outcome:
    rh, wh = sweeps[0], sweeps[1]
    mn = int(d.admin.command("get_parameter", name=MIN_P)["value"])
    init = 2 * mn
    mx = max(args.sizes)
    out = Outcome(
        "probing",
        f"2. throughput probing from the minimum: {INITIAL_P} = 2 x min = {init} "
        f"({mn} read + {mn} write), {MAX_P} = {mx}, other probing parameters at their "
        f"defaults; {args.probe_seconds:g} s per phase, ops/s sampled every {TICK:g} s; "
        f"reference = max(sweep best, the best size re-measured in the same run)",
    )
    mach = Machine()
    P, R = args.probe_ticks, args.ref_ticks
    seg_ref = 1 + R

    def probing_on() -> None:
        # stable concurrency := 2 x min while still fixed, then both fixed sizes to 0
        set_params(d, **{INITIAL_P: init, READ_P: 0, WRITE_P: 0})

    analyses: list[dict[str, Any]] = []
    # A: read-heavy reference, probing on read-heavy, switch to write-heavy, reference
    fixed(d, rh.best)
    total = seg_ref + 2 * P + seg_ref
    warm = args.warmup
    spec = mixed_spec(
        args,
        value,
        rh.workload.set_fraction,
        total,
        warmup=warm,
        switch_after=warm + (seg_ref + P) * TICK,
        switch_set_fraction=wh.workload.set_fraction,
    )
    actions: dict[int, Callable[[], None]] = {
        seg_ref: probing_on,
        seg_ref + 2 * P: lambda: fixed(d, wh.best),
    }
    report.log(f"  probing: read-heavy, then write-heavy ({spec.seconds:g} s) ...")
    res, ss = timeline(d, spec, actions, mach)
    ref_rh = rate(ss[1], ss[seg_ref])
    ref_wh = rate(ss[seg_ref + 2 * P + 1], ss[total])
    pa = Phase(
        "read-heavy from the minimum",
        "read-heavy",
        seg_ref,
        seg_ref + P,
        rh.best_rate,
        rh.best,
        ref_rh,
    )
    pb = Phase(
        "after the switch to write-heavy",
        "read->write switch",
        seg_ref + P,
        seg_ref + 2 * P,
        wh.best_rate,
        wh.best,
        ref_wh,
    )
    errors = res.errors
    analyses += [analyse(ss, pa), analyse(ss, pb)]
    # B: write-heavy reference, then probing on write-heavy from the minimum
    fixed(d, wh.best)
    total = seg_ref + P
    spec = mixed_spec(args, value, wh.workload.set_fraction, total, warmup=warm)
    report.log(f"  probing: write-heavy ({spec.seconds:g} s) ...")
    res, ss2 = timeline(d, spec, {seg_ref: probing_on}, mach)
    ref_wh2 = rate(ss2[1], ss2[seg_ref])
    pc = Phase(
        "write-heavy from the minimum",
        "write-heavy",
        seg_ref,
        seg_ref + P,
        wh.best_rate,
        wh.best,
        ref_wh2,
    )
    analyses.append(analyse(ss2, pc))
    errors += res.errors
    if errors:
        out.notes.append(f"probing: {errors} requests failed ({res.error_sample})")
    for a in analyses:
        _probing_phase(out, a)
    out.data = {
        "min_concurrency": mn,
        "initial_concurrency": init,
        "max_concurrency": mx,
        "probe_seconds": args.probe_seconds,
        "phases": analyses,
    }
    return mach.close(out)


def _probing_phase(out: Outcome, a: dict[str, Any]) -> None:
    """One probing phase's lines and checks."""
    ok = a["reached_95pct_1s_avg_s"] is not None and a["reached_95pct_1s_avg_s"] <= REACH_SECONDS
    adj = a["adjacent_fixed_ops_per_s"]
    out.lines += [
        f"   {a['phase']}: reference {a['reference_ops_per_s']:,.0f} ops/s (sweep best "
        f"N = {a['sweep_best_size']}: {a['sweep_best_ops_per_s']:,.0f}; re-measured next "
        f"to it: {'-' if adj is None else f'{adj:,.0f}'})",
        f"     reached 95 % after {_secs(a['reached_95pct_s'])} (one 0.5 s sample), "
        f"{_secs(a['reached_95pct_1s_avg_s'])} (1 s average)   target <= "
        f"{REACH_SECONDS:g} s   {_verdict(ok)}",
        f"     steady state (last {a['steady_window_s']:g} s): {a['steady_ops_per_s']:,.0f} "
        f"ops/s = {100 * a['steady_ratio']:.1f} % of the reference; pools read "
        f"{a['steady_read_pool']:g} / write {a['steady_write_pool']:g} (stable "
        f"concurrency {a['steady_stable_concurrency']:g})",
        "     % of reference (read / write pool) at "
        + ", ".join(f"{k} s {100 * v[0]:.0f} % ({v[1]}/{v[2]})" for k, v in a["at"].items()),
    ]
    out.check(
        f"{a['short']}: time to 95 % of best",
        a["reached_95pct_1s_avg_s"],
        _secs(a["reached_95pct_1s_avg_s"]),
        f"<= {REACH_SECONDS:g} s",
        ok,
    )
    out.check(
        f"{a['short']}: steady state / best",
        a["steady_ratio"],
        f"{100 * a['steady_ratio']:.1f} %",
        ">= 95 %",
        a["steady_ratio"] >= REACH,
    )


# -- 3. ticket accounting overhead -----------------------------------------------------


def part_overhead(args: argparse.Namespace, value: bytes) -> Outcome:
    secs, reps = args.overhead_seconds, args.overhead_reps
    control = not args.quick
    modes = ("default", "huge", "none", *(("a/a",) if control else ()))
    warm = 0.3
    out = Outcome(
        "overhead",
        f"3. ticket accounting overhead: max closed-loop throughput of the default server "
        f"(probing on, pools 128 + 128) vs huge fixed pools ({HUGE:,} each: tickets taken, "
        f"never waited for) vs 'none', a second daemon whose execution-ticket gate hands "
        f"out a no-op ticket"
        + (", and 'a/a', a third daemon started the same way but unpatched" if control else "")
        + f"; {reps} x ({', '.join(modes)}) then default, {secs:g} s each, medians",
    )
    mach = Machine()
    get = loadgen.cell_spec(args, "get", O_CONNS, O_DEPTH, value, seconds=secs, warmup=warm)
    loads: list[tuple[str, LoadSpec]] = [("get", get)]
    if not args.quick:
        wt = _ticks(secs, "--overhead-seconds")
        loads.append(
            ("write-heavy", mixed_spec(args, value, args.write_heavy_sets, wt, warmup=warm))
        )
    runs, cpu, pools = _overhead_runs(args, value, loads, modes, mach)
    out.lines.append(
        f"   {'load':<12}"
        + "".join(f" {m:>9}" for m in modes)
        + f"  {'tickets cost':>12}  {'pool limit':>10}"
        + (f"  {'a/a diff':>8}" if control else "")
        + "   target   result"
    )
    data: dict[str, Any] = {}
    for name, by in runs.items():
        data[name] = _overhead_load(out, data, name, by, cpu[name], pools[name], modes)
    out.notes.append(
        "overhead: 'tickets cost' = 1 - default / none (what taking and counting execution "
        "tickets costs); 'pool limit' = 1 - default / huge (what the default pool sizes cost "
        "by making operations wait)"
        + (
            "; 'a/a diff' = 1 - default / a/a, two unpatched daemons: how far two server "
            "processes differ for no reason (hash seeds, memory layout), the noise floor of "
            "'tickets cost'"
            if control
            else ""
        )
        + ". Huge pools still take a ticket per operation, so they do not approximate 'no "
        "tickets'; the patched daemon does"
    )
    out.data = {"loads": data, "reps": reps, "seconds": secs, "modes": list(modes)}
    return mach.close(out)


def _overhead_runs(
    args: argparse.Namespace,
    value: bytes,
    loads: list[tuple[str, LoadSpec]],
    modes: tuple[str, ...],
    mach: Machine,
) -> tuple[
    dict[str, dict[str, list[float]]],
    dict[str, dict[str, list[float]]],
    dict[str, list[tuple[int, int]]],
]:
    """Each load on each mode's daemon, ``--overhead-reps`` times, modes alternating:
    ops/s and server CPU % per run, and the default pools after its runs."""
    reps, control = args.overhead_reps, "a/a" in modes
    runs: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    pools: dict[str, list[tuple[int, int]]] = {}
    with contextlib.ExitStack() as stack:
        dt = stack.enter_context(daemon(args.keys, value, args.server_cpus))
        dn = stack.enter_context(daemon(args.keys, value, args.server_cpus, _launcher(True)))
        daemons = {"default": dt, "huge": dt, "none": dn}
        if control:
            daemons["a/a"] = stack.enter_context(
                daemon(args.keys, value, args.server_cpus, _launcher(False))
            )

        def mode(m: str) -> Daemon:
            if m == "default":
                set_params(dt, **{READ_P: 0, WRITE_P: 0, MAX_P: 128, INITIAL_P: 256})
            elif m == "huge":
                set_params(dt, **{MAX_P: HUGE, READ_P: HUGE, WRITE_P: HUGE})
            return daemons[m]

        for name, spec in loads:
            runs[name] = {m: [] for m in modes}
            cpu[name] = {m: [] for m in modes}
            pools[name] = []
            prime = dataclasses.replace(spec, seconds=0.5, warmup=0.2)
            for dd in set(daemons.values()):  # first-run effects, not measured
                loadgen.run_load(dd.target(BUCKET), prime)
            order = [m for _ in range(reps) for m in modes] + ["default"]
            for m in order:
                dd = mode(m)
                snap0 = Snapshot.bare(0.0, dd.handle.cpu_seconds())
                t0 = time.monotonic()
                r = loadgen.run_load(dd.target(BUCKET), spec, dd.handle.cpu_seconds)
                snap1 = Snapshot.bare(time.monotonic() - t0, dd.handle.cpu_seconds())
                mach.add(snap0, snap1, [r])
                if r.errors:
                    raise BenchError(f"overhead {name} {m}: {r.errors} errors ({r.error_sample})")
                if dd is dt:
                    b = sample(dd)
                    if (m == "huge") != (b.state == "fixed"):
                        raise BenchError(f"overhead {m}: probing state {b.state!r}")
                    if m == "default":
                        pools[name].append((b.size_r, b.size_w))
                runs[name][m].append(r.ops_per_s)
                cpu[name][m].append(_pct(r.server_cpu_s, r.window_s) or 0.0)
                report.log(f"  overhead {name} {m:<7} {r.ops_per_s:>10,.0f} ops/s")
    return runs, cpu, pools


def _overhead_load(
    out: Outcome,
    data: dict[str, Any],
    name: str,
    by: dict[str, list[float]],
    cpu: dict[str, list[float]],
    pools: list[tuple[int, int]],
    modes: tuple[str, ...],
) -> dict[str, Any]:
    """One load's line, runs, check and JSON (``data`` gets the micro check)."""
    control = "a/a" in modes
    med = {m: statistics.median(v) for m, v in by.items()}
    cost = 1 - med["default"] / med["none"]
    limit = 1 - med["default"] / med["huge"]
    aa = 1 - med["default"] / med["a/a"] if control else None
    ok = cost <= OVERHEAD_TARGET
    out.lines.append(
        f"   {name:<12}"
        + "".join(f" {med[m]:>9,.0f}" for m in modes)
        + f"  {100 * cost:>+11.1f}%  {100 * limit:>+9.1f}%"
        + (f"  {100 * aa:>+7.1f}%" if aa is not None else "")
        + f"   <= {100 * OVERHEAD_TARGET:.0f} %   {_verdict(ok)}"
    )
    srv = {m: statistics.median(v) for m, v in cpu.items()}
    ends = sorted(set(pools))
    out.lines.append(
        "        runs: " + "; ".join(f"{m} " + " ".join(f"{x:,.0f}" for x in by[m]) for m in modes)
    )
    out.lines.append(
        "        server cpu % (median): "
        + ", ".join(f"{m} {srv[m]:.0f}" for m in modes)
        + "; default's pools (read/write) after its runs: "
        + ", ".join(f"{r}/{w}" for r, w in ends)
    )
    if name == "get":
        real, free = micro_cost()
        per_op = (srv["default"] / 100) / med["default"] * 1e6 if med["default"] else 0.0
        est = (real - free) / per_op if per_op else 0.0
        data["micro"] = {
            "ticket_us": round(real, 3),
            "free_us": round(free, 3),
            "daemon_us_per_get": round(per_op, 2),
            "expected_cost": round(est, 4),
        }
        out.lines.append(
            f"        in-process check: try_acquire() + release() {real:.2f} µs on a real "
            f"pool, {free:.2f} µs on the no-op one; the daemon spends {per_op:.1f} µs of "
            f"CPU per pipelined GET (default runs), so tickets should cost "
            f"~{100 * est:.1f} %"
        )
    out.check(
        f"{name}: tickets cost (1 - default/none)",
        round(cost, 4),
        f"{100 * cost:+.1f} %",
        f"<= {100 * OVERHEAD_TARGET:.0f} %",
        ok,
    )
    figures = {
        "runs": {m: [round(x, 1) for x in v] for m, v in by.items()},
        "medians": {m: round(x, 1) for m, x in med.items()},
        "tickets_cost": round(cost, 4),
        "pool_limit_cost": round(limit, 4),
        "a_a_difference": None if aa is None else round(aa, 4),
        "server_cpu_pct": {m: [round(x, 1) for x in v] for m, v in cpu.items()},
        "default_pools_after_runs": ends,
    }
    _cpu_note(out, 0.0, max(srv.values()), f"overhead {name}")
    return figures


# -- driver ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    _finish_args(args)
    value = report.value_bytes(args.value_size, b"probing")
    loads = [
        Workload("read-heavy", args.read_heavy_sets),
        Workload("write-heavy", args.write_heavy_sets),
    ]
    out, meta = report.run_header(args, "probing")
    print(
        f"\nworkloads: {loads[0].describe()} and {loads[1].describe()}, "
        f"durable SETs, both ops mixed on every connection in a fixed ratio; "
        f"{args.conns} conns x depth {args.depth} closed loop, {args.workers} worker "
        f"processes; {args.value_size} B values over {args.keys:,} keys"
        f"{' (quick)' if args.quick else ''}",
        file=out,
        flush=True,
    )
    parts = Parts(args, out, "probing")
    if "sweep" in args.part:
        report.log("part sweep + probing ..." if "probing" in args.part else "part sweep ...")
        with daemon(args.keys, value, args.server_cpus) as d:
            set_params(d, **{MAX_P: max(256, max(args.sizes))}, **OPEN_GATES)
            print(
                f"parts 1-2: {MAX_P} raised to {max(256, max(args.sizes))}; "
                + ", ".join(f"{k} {v}" for k, v in OPEN_GATES.items())
                + " (per bucket, default 64), so that the execution pools are the only "
                "gate bounding concurrency",
                file=out,
                flush=True,
            )
            o, sweeps = part_sweep(d, args, value, loads)
            parts.show(o)
            if "probing" in args.part:
                parts.show(part_probing(d, args, value, sweeps))
    if "overhead" in args.part:
        report.log("part overhead ...")
        parts.show(part_overhead(args, value))
    return parts.finish(meta, widths=(10, 44, 10))
