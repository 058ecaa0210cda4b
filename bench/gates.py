"""``python -m bench gates``: what the whole admission path costs when nothing binds.

One self-started daemon (durable defaults, temporary data directory) is
measured in two modes, switched at runtime by ``admin`` with
``set_parameter`` and ``set_node_throttle`` (no restart between runs):

- **off** — every gate that has a switch is off: the tenant throttle at
  capacity ``"unlimited"`` (its admission check is skipped; metering, the
  RU/WU charge after each operation, runs in both modes), the ingress request
  rate limiter, the connection-establishment limiter, the ingress admission
  controller, the bucket queues and the write permits disabled, throughput
  probing off (execution pools fixed);
- **on** — every gate on but generous, so nothing is ever rejected or queued:
  capacity 10**12, both limiters enabled at 10**9 per second, 10**9 ingress
  tickets, bucket queues and write permits far above the load, throughput
  probing on with pools that cannot shrink below the load.

One gate has **no off switch**: the execution tickets are taken by every
operation in both modes, with pools set generous (:data:`GATES` says how), so
their cost is in both columns and the on/off ratio does not show it.

Each cell (op x connections x pipeline depth, closed loop, a plain ``bench``
user with the readwrite role) runs ``--reps`` off/on pairs; the pairs
alternate which mode runs first (off, on / on, off / ...) so a steady drift
of the shared machine does not favour one mode. Per cell: ops/s, p50/p99
latency and the server's CPU µs per operation (``/proc`` of the daemon over
the window) of each mode, and the on/off throughput ratio as the median over
the pairs of the ratio within each pair.

Every run is checked against the server's own counters (``server_status``
before and after): in the on runs the throttle was enabled and charged units,
the request limiter admitted every operation, the connection limiter every
connection, and the ingress tickets, bucket queues, write permits and
execution tickets every operation; in the off runs the switchable gates saw
nothing and were reported disabled; in both, no gate queued or rejected anything
and no request failed. The evidence is in the output and the JSON; the exit
status is 1 if any check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

from bench import loadgen, options, report, servers
from bench.loadgen import LoadResult, LoadSpec, Target, TenantKVCodec
from bench.options import Quick
from bench.throttle import OTHER_CPU_WARN, machine_cpu

BUCKET = "gates"
MODES = ("off", "on")
#: Node capacity of the on runs (cost units/s): finite, so the throttle is enabled.
HUGE_CAPACITY = 10**12
#: Rates of the two limiters in the on runs (their largest allowed value).
HUGE_RATE = 1e9
#: Execution pools at least this big (and 2 x the most requests in flight).
MIN_POOL = 4096

FIXED_READ = "storage_engine_concurrent_read_transactions"
FIXED_WRITE = "storage_engine_concurrent_write_transactions"
REQ_ENABLED = "ingress_request_rate_limiter_enabled"
CONN_ENABLED = "ingress_connection_establishment_rate_limiter_enabled"
INGRESS_ENABLED = "ingress_admission_controller_enabled"
QUEUES_ENABLED = "bucket_queue_enabled"
PERMITS_ENABLED = "write_permit_enabled"

#: Parameters set once, for both modes: the limits the on mode runs under (inert
#: while a gate is off), all generous.
COMMON: dict[str, Any] = {
    "ingress_admission_tickets": 1_000_000_000,
    "bucket_queue_concurrency": 65536,
    "bucket_queue_tolerance": 1_000_000,
    # critical before target: the server requires critical > target at every step
    "write_permit_max_capacity": 65536,
    "write_permit_critical_lag": 2_000_000,
    "write_permit_target_lag": 1_000_000,
    "ingress_request_admission_rate_per_sec": HUGE_RATE,
    "ingress_request_admission_burst_capacity_secs": 1.0,
    "ingress_connection_establishment_rate_per_sec": HUGE_RATE,
    "ingress_connection_establishment_burst_capacity_secs": 1.0,
    "ingress_connection_establishment_max_queue_depth": 1_000_000,
}

#: How each gate was turned off and on; ``switch`` False: it has no off switch.
GATES: dict[str, dict[str, Any]] = {
    "tenant_throttle": {
        "switch": True,
        "off": 'set_node_throttle capacity "unlimited" (bucket reserved 0, hard_limit '
        '"unlimited"): the admission check is skipped; metering (RU/WU charges) still runs',
        "on": f"set_node_throttle capacity {HUGE_CAPACITY:.0e}: every operation takes the "
        "throttle's admission check and is charged",
    },
    "ingress_request_rate_limiter": {
        "switch": True,
        "off": f"{REQ_ENABLED}=false",
        "on": f"{REQ_ENABLED}=true, ingress_request_admission_rate_per_sec={HUGE_RATE:.0e}, "
        "burst 1 s",
    },
    "ingress_connection_establishment_limiter": {
        "switch": True,
        "off": f"{CONN_ENABLED}=false",
        "on": f"{CONN_ENABLED}=true, rate {HUGE_RATE:.0e}/s, burst 1 s, max_queue_depth "
        "1000000; it acts when a connection opens, before each run's window",
    },
    "execution_tickets": {
        "switch": False,
        "off": "no off switch for the tickets (taken in both modes); throughput probing off: "
        f"pools fixed with {FIXED_READ} / {FIXED_WRITE} = POOL",
        "on": "throughput probing on (a probe every 100 ms), "
        "throughput_probing_min_concurrency=POOL, max 2 x POOL: the pools never shrink "
        "below POOL",
    },
    "ingress_admission_tickets": {
        "switch": True,
        "off": f"{INGRESS_ENABLED}=false",
        "on": f"{INGRESS_ENABLED}=true, ingress_admission_tickets=1000000000",
    },
    "bucket_queues": {
        "switch": True,
        "off": f"{QUEUES_ENABLED}=false",
        "on": f"{QUEUES_ENABLED}=true, bucket_queue_concurrency=65536, "
        "bucket_queue_tolerance=1000000",
    },
    "write_permits": {
        "switch": True,
        "off": f"{PERMITS_ENABLED}=false",
        "on": f"{PERMITS_ENABLED}=true, write_permit_max_capacity=65536, target/critical "
        "lag 1000000/2000000 (capacity stays at the maximum)",
    },
}


#: Evidence figures that are states or sizes, not counts.
GAUGES = frozenset(
    {"enabled", "probing", "read_pool", "write_pool", "tickets", "concurrency", "capacity"}
)

#: Evidence figures that count requests a gate made wait or turned away: all must be 0.
WAIT_KEYS = ("queued", "rejected", "throttled", "waited", "canceled")

# -- command line ------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--ops", options.names(loadgen.OPS, "ops"), ["get", "set"], "ops to run")
    options.add(p, "--reps", int, Quick(3, 1), "off/on pairs per cell", low=1)
    options.window_flags(
        p,
        Quick(3.0, 1.0),
        Quick(0.5, 0.2),
        what=("measuring window of each run", "load before each window", ""),
    )
    options.add(p, "--conns", options.int_list, [16], "connection counts")
    options.add(p, "--depths", options.int_list, [16, 1], "pipeline depths (closed loop)")
    options.data_flags(p, Quick(10_000, 1000), keys_help="distinct keys, all preloaded")
    options.common_flags(p)


def _finish_args(args: argparse.Namespace) -> None:
    args.pool = max(MIN_POOL, 2 * max(args.conns) * max(args.depths))
    servers.pin_cpus(args)


# -- modes -------------------------------------------------------------------------


def _set(admin: Any, name: str, value: Any) -> None:
    admin.command("set_parameter", name=name, value=value)


def configure_common(admin: Any, pool: int) -> None:
    """Both modes: the on mode's limits (generous), the pools, the bucket unlimited."""
    for name, value in COMMON.items():
        _set(admin, name, value)
    # max before min: the server requires min <= max at every step
    _set(admin, "throughput_probing_max_concurrency", 2 * pool)
    _set(admin, "throughput_probing_min_concurrency", pool)
    admin.set_bucket_throttle(BUCKET, {"reserved": 0, "hard_limit": "unlimited"})


def set_mode(admin: Any, mode: str, pool: int) -> None:
    """Switch every gate that has a switch (see :data:`GATES`)."""
    on = mode == "on"
    admin.set_node_throttle({"capacity": HUGE_CAPACITY if on else "unlimited"})
    for name in (REQ_ENABLED, CONN_ENABLED, INGRESS_ENABLED, QUEUES_ENABLED, PERMITS_ENABLED):
        _set(admin, name, on)
    # 0 and 0: probing on (the pools follow the stable concurrency, >= pool each)
    _set(admin, FIXED_READ, 0 if on else pool)
    _set(admin, FIXED_WRITE, 0 if on else pool)


# -- evidence from the server's counters -------------------------------------------


def counters(st: dict[str, Any]) -> dict[str, Any]:
    """The figures of ``server_status`` that show what each gate did (bucket ``gates``)."""
    th = st["throttle"]["node"]
    ing = st["ingress"]
    req, conn, adm = ing["request_rate_limiter"], ing["connection_establishment"], ing["admission"]
    q = st["bucket_queues"]["buckets"][BUCKET]
    wp = st["write_permits"]["buckets"][BUCKET]
    ex = st["execution"]
    b = st["buckets"][BUCKET]
    return {
        "throttle_enabled": bool(th["enabled"]),
        "throttle_ru": th["ru_total"],
        "throttle_wu": th["wu_total"],
        "throttle_weight": th.get("write_weight", 2),
        "throttle_throttled": th["throttle_count_total"],
        "throttle_rejected": th["reject_count_total"],
        "req_enabled": bool(req["enabled"]),
        "req_admitted": req["successful"],
        "req_attempted": req["attempted"],  # exempt admin commands not included
        "req_rejected": req["rejected"],
        "req_queued": req["added_to_queue"],
        "conn_enabled": bool(conn["enabled"]),
        "conn_admitted": conn["successful"],
        "conn_attempted": conn["attempted"],
        "conn_rejected": conn["rejected"],
        "conn_queued": conn["added_to_queue"],
        "conn_refused": st["connections"]["rejected"],
        "ingress_enabled": bool(adm["enabled"]),
        "ingress_admitted": adm["started_processing"],
        "ingress_queued": adm["added_to_queue"],
        "ingress_tickets": adm["total_tickets"],
        "queue_enabled": bool(st["bucket_queues"]["enabled"]),
        "queue_admitted": q["read"]["admitted"] + q["write"]["admitted"],
        "queue_queued": q["read"]["queued_total"] + q["write"]["queued_total"],
        "queue_rejected": sum(
            q[c]["rejected_overflow"] + q[c]["rejected_timeout"] for c in ("read", "write")
        ),
        "queue_concurrency": q["read"]["concurrency"],
        "permit_enabled": bool(st["write_permits"]["enabled"]),
        "permit_granted": wp["granted"],
        "permit_waited": wp["waited"],
        "permit_capacity": wp["capacity"],
        "exec_admitted": ex["read"]["started_processing"] + ex["write"]["started_processing"],
        "exec_queued": ex["read"]["added_to_queue"] + ex["write"]["added_to_queue"],
        # waits given up; an overflow rejection is a server error (server_errors)
        "exec_canceled": ex["read"]["canceled"] + ex["write"]["canceled"],
        "probing": ex["probing"]["state"],
        "read_pool": ex["read"]["total_tickets"],
        "write_pool": ex["write"]["total_tickets"],
        "server_ops": sum(b["ops"].values()),
        "server_set_ops": b["ops"].get("set", 0),
        "server_errors": sum(b["errors"].values()),
    }


def evidence(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per gate, what it did between two :func:`counters` (the whole run, warm-up included)."""

    def d(key: str) -> int:
        return int(b[key] - a[key])

    return {
        "server": {"ops": d("server_ops"), "set_ops": d("server_set_ops")},
        "tenant_throttle": {
            "enabled": [a["throttle_enabled"], b["throttle_enabled"]],
            "units_charged": d("throttle_ru") + b["throttle_weight"] * d("throttle_wu"),
            "throttled": d("throttle_throttled"),
            "rejected": d("throttle_rejected"),
        },
        "ingress_request_rate_limiter": {
            "enabled": [a["req_enabled"], b["req_enabled"]],
            "attempted": d("req_attempted"),
            "admitted": d("req_admitted"),
            "queued": d("req_queued"),
            "rejected": d("req_rejected"),
        },
        "ingress_connection_establishment_limiter": {
            "enabled": [a["conn_enabled"], b["conn_enabled"]],
            "attempted": d("conn_attempted"),
            "admitted": d("conn_admitted"),
            "queued": d("conn_queued"),
            "rejected": d("conn_rejected") + d("conn_refused"),
        },
        "execution_tickets": {
            "probing": b["probing"],
            "read_pool": b["read_pool"],
            "write_pool": b["write_pool"],
            "admitted": d("exec_admitted"),
            "queued": d("exec_queued"),
            "canceled": d("exec_canceled"),
        },
        "ingress_admission_tickets": {
            "enabled": [a["ingress_enabled"], b["ingress_enabled"]],
            "tickets": b["ingress_tickets"],
            "admitted": d("ingress_admitted"),
            "queued": d("ingress_queued"),
        },
        "bucket_queues": {
            "enabled": [a["queue_enabled"], b["queue_enabled"]],
            "concurrency": b["queue_concurrency"],
            "admitted": d("queue_admitted"),
            "queued": d("queue_queued"),
            "rejected": d("queue_rejected"),
        },
        "write_permits": {
            "enabled": [a["permit_enabled"], b["permit_enabled"]],
            "capacity": b["permit_capacity"],
            "granted": d("permit_granted"),
            "waited": d("permit_waited"),
        },
        "server_errors": d("server_errors"),
    }


def problems(ev: dict[str, Any], mode: str, conns: int, pool: int) -> list[str]:
    """What contradicts "on: every gate active, off: switchable gates idle, never a
    wait or a rejection"; empty when the run was what it claims to be."""
    out: list[str] = []
    ops, sets = ev["server"]["ops"], ev["server"]["set_ops"]
    on = mode == "on"
    if ops <= 0:
        out.append("the server counted no operations")
    for gate, figures in ev.items():
        if not isinstance(figures, dict):
            continue
        for key in WAIT_KEYS:
            if figures.get(key):
                out.append(f"{gate}: {key} {figures[key]}")
    if ev["server_errors"]:
        out.append(f"server counted {ev['server_errors']} errors")
    th = ev["tenant_throttle"]
    if th["enabled"] != [on, on]:
        out.append(f"tenant_throttle: enabled {th['enabled']}, expected {on}")
    if th["units_charged"] <= 0:
        out.append("tenant_throttle: no units charged")
    for gate in ("ingress_request_rate_limiter", "ingress_connection_establishment_limiter"):
        g = ev[gate]
        if g["enabled"] != [on, on]:
            out.append(f"{gate}: enabled {g['enabled']}, expected {on}")
        if not on and g["attempted"]:
            out.append(f"{gate}: {g['attempted']} attempts while off")
    if on and ev["ingress_request_rate_limiter"]["admitted"] < ops:
        out.append(
            f"ingress_request_rate_limiter: admitted "
            f"{ev['ingress_request_rate_limiter']['admitted']} of {ops} operations"
        )
    if on and ev["ingress_connection_establishment_limiter"]["admitted"] < conns:
        out.append(
            f"ingress_connection_establishment_limiter: admitted "
            f"{ev['ingress_connection_establishment_limiter']['admitted']} of {conns} connections"
        )
    if ev["execution_tickets"]["admitted"] < ops:  # (no off switch: on in both modes)
        out.append(f"execution_tickets: admitted {ev['execution_tickets']['admitted']} of {ops}")
    for gate, count, want in (
        ("ingress_admission_tickets", "admitted", ops),
        ("bucket_queues", "admitted", ops),
        ("write_permits", "granted", sets),
    ):
        g = ev[gate]
        if g["enabled"] != [on, on]:
            out.append(f"{gate}: enabled {g['enabled']}, expected {on}")
        if on and g[count] < want:
            out.append(f"{gate}: {count} {g[count]} of {want}")
        if not on and g[count]:
            out.append(f"{gate}: {count} {g[count]} while off")
    ex = ev["execution_tickets"]
    want = "stable" if on else "fixed"
    if (ex["probing"] == "fixed") == on:
        out.append(f"execution_tickets: probing {ex['probing']!r}, expected {want!r}")
    if min(ex["read_pool"], ex["write_pool"]) < pool:
        out.append(f"execution_tickets: pools {ex['read_pool']}/{ex['write_pool']} < {pool}")
    return out


# -- runs and results --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    spec: LoadSpec
    mode: str
    rep: int
    #: 0 = ran first in its pair, 1 = second
    position: int
    result: LoadResult
    evidence: dict[str, Any]
    problems: list[str]
    #: CPU of processes outside this benchmark (not the daemon, not the load)
    #: during the run, and the hypervisor's steal, in % of one core
    other_cpu_pct: float = 0.0
    steal_pct: float = 0.0

    @property
    def cpu_us_per_op(self) -> float | None:
        r = self.result
        if r.server_cpu_s is None or not r.ok:
            return None
        return r.server_cpu_s / r.ok * 1e6

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "op": self.spec.op,
            "conns": self.spec.conns,
            "depth": self.spec.depth,
            "mode": self.mode,
            "rep": self.rep,
            "position_in_pair": self.position,
            "value_size": len(self.spec.value),
            "seconds": r.window_s,
            "ops": r.ok,
            "errors": r.errors,
            "ops_per_s": round(r.ops_per_s, 1),
            **report.load_figures(r),
            "server_cpu_s": None if r.server_cpu_s is None else round(r.server_cpu_s, 3),
            "server_cpu_us_per_op": _r1(self.cpu_us_per_op),
            "other_cpu_pct": round(self.other_cpu_pct, 1),
            "steal_pct": round(self.steal_pct, 1),
            "evidence": self.evidence,
            "verified": not self.problems,
            "problems": self.problems,
        }


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _med(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    """One entry per cell: medians of each mode, ratio on/off = median of the pair ratios."""
    out = []
    for key, cell in _cells(runs):
        op, conns, depth = key
        by = {m: [r for r in cell if r.mode == m] for m in MODES}
        pairs = []
        deltas = []
        for off in by["off"]:
            on = next((r for r in by["on"] if r.rep == off.rep), None)
            if on is None:
                continue
            if off.result.ops_per_s > 0:
                pairs.append(on.result.ops_per_s / off.result.ops_per_s)
            if on.cpu_us_per_op is not None and off.cpu_us_per_op is not None:
                deltas.append(on.cpu_us_per_op - off.cpu_us_per_op)
        entry: dict[str, Any] = {"op": op, "conns": conns, "depth": depth, "pairs": len(pairs)}
        ratio = _med(pairs)
        entry["ratio_on_over_off"] = None if ratio is None else round(ratio, 4)
        entry["ratio_pairs"] = [round(x, 4) for x in pairs]
        for m in MODES:
            rs = by[m]
            entry[f"ops_per_s_{m}"] = _r1(_med([r.result.ops_per_s for r in rs]))
            entry[f"p50_us_{m}"] = _r1(_med([r.result.percentile_us(0.5) for r in rs]))
            entry[f"p99_us_{m}"] = _r1(_med([r.result.percentile_us(0.99) for r in rs]))
            entry[f"server_cpu_us_per_op_{m}"] = _r1(_med([r.cpu_us_per_op for r in rs]))
            entry[f"errors_{m}"] = sum(r.result.errors for r in rs)
        entry["server_cpu_us_per_op_delta"] = _r1(_med(deltas))
        entry["verified"] = all(not r.problems for r in cell)
        out.append(entry)
    return out


def _cells(runs: list[Run]) -> Iterator[tuple[tuple[str, int, int], list[Run]]]:
    keys: list[tuple[str, int, int]] = []
    for r in runs:
        k = (r.spec.op, r.spec.conns, r.spec.depth)
        if k not in keys:
            keys.append(k)
    for k in keys:
        yield k, [r for r in runs if (r.spec.op, r.spec.conns, r.spec.depth) == k]


def verification(runs: list[Run]) -> dict[str, Any]:
    """The evidence of every run added up per mode (the distinct values of the
    :data:`GAUGES`), and every problem found."""
    doc: dict[str, Any] = {
        "verified": all(not r.problems for r in runs),
        "problems": [
            f"{r.spec.op} conns={r.spec.conns} depth={r.spec.depth} {r.mode} rep {r.rep}: {p}"
            for r in runs
            for p in r.problems
        ],
    }
    for m in MODES:
        rs = [r for r in runs if r.mode == m]
        total: dict[str, Any] = {"runs": len(rs), "client_errors": sum(r.result.errors for r in rs)}
        for r in rs:
            for gate, figures in r.evidence.items():
                if not isinstance(figures, dict):
                    total[gate] = total.get(gate, 0) + figures
                    continue
                g = total.setdefault(gate, {})
                for k, v in figures.items():
                    if k in GAUGES:  # the distinct values seen, not a sum
                        seen = g.setdefault(k, [])
                        for x in v if isinstance(v, list) else [v]:
                            if x not in seen:
                                seen.append(x)
                    else:
                        g[k] = g.get(k, 0) + v
        doc[m] = total
    return doc


def machine_summary(runs: list[Run]) -> dict[str, Any]:
    """How quiet the machine was: other processes' CPU and steal over the runs."""
    other = [r.other_cpu_pct for r in runs]
    steal = [r.steal_pct for r in runs]
    disturbed = [
        r for r in runs if r.other_cpu_pct >= OTHER_CPU_WARN or r.steal_pct >= OTHER_CPU_WARN
    ]
    return {
        "other_cpu_pct_median": round(statistics.median(other), 1) if other else None,
        "other_cpu_pct_max": round(max(other), 1) if other else None,
        "steal_pct_max": round(max(steal), 1) if steal else None,
        "disturbed_runs": len(disturbed),
        "runs": len(runs),
        "warn_pct": OTHER_CPU_WARN,
    }


# -- output -------------------------------------------------------------------------


def _fmt(x: float | None, ops: bool = False) -> str:
    if x is None:
        return "-"
    if ops:
        return f"{x:,.0f}"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def format_table(summary: list[dict[str, Any]]) -> str:
    per = ["ops/s", "p50 µs", "p99 µs", "srv µs/op"]
    widths = [10, 8, 8, 9]
    block = sum(widths) + len(widths)
    head1 = f"{'':<4} {'':>5} {'':>5} |" + "gates OFF".center(block) + " |"
    head1 += "gates ON (generous)".center(block) + " |"
    head2 = f"{'op':<4} {'conns':>5} {'depth':>5}"
    for _ in MODES:
        head2 += " |" + "".join(f" {h:>{w}}" for h, w in zip(per, widths, strict=True))
    head2 += f" | {'on/off':>6} {'pairs min..max':>14} {'Δ srv µs/op':>11}"
    lines = [head1, head2, "-" * len(head2)]
    for s in summary:
        line = f"{s['op']:<4} {s['conns']:>5} {s['depth']:>5}"
        for m in MODES:
            vals = [
                _fmt(s[f"ops_per_s_{m}"], ops=True) + ("!" if s[f"errors_{m}"] else ""),
                _fmt(s[f"p50_us_{m}"]),
                _fmt(s[f"p99_us_{m}"]),
                _fmt(s[f"server_cpu_us_per_op_{m}"]),
            ]
            line += " |" + "".join(f" {v:>{w}}" for v, w in zip(vals, widths, strict=True))
        ratio = s["ratio_on_over_off"]
        pairs = s["ratio_pairs"]
        rng = f"{min(pairs):.3f}..{max(pairs):.3f}" if pairs else "-"
        delta = s["server_cpu_us_per_op_delta"]
        line += f" | {'-' if ratio is None else f'{ratio:.3f}':>6} {rng:>14} "
        line += f"{'-' if delta is None else f'{delta:+.1f}':>11}"
        if not s["verified"]:
            line += "  NOT VERIFIED"
        lines.append(line)
    return "\n".join(lines)


def format_gates(pool: int) -> list[str]:
    lines = ["how each gate was set (off | on):"]
    for name, g in GATES.items():
        off, on = (g[m].replace("POOL", str(pool)) for m in MODES)
        tag = "" if g["switch"] else "  [NO OFF SWITCH]"
        lines.append(f"  {name}{tag}")
        lines.append(f"    off: {off}")
        lines.append(f"    on:  {on}")
    return lines


def format_machine(m: dict[str, Any]) -> list[str]:
    if not m["runs"]:
        return []
    lines = [
        f"\nmachine: other processes used {m['other_cpu_pct_median']:.0f} % of one core "
        f"(median over the runs; max {m['other_cpu_pct_max']:.0f} %), hypervisor steal max "
        f"{m['steal_pct_max']:.0f} %"
    ]
    if m["disturbed_runs"]:
        lines.append(
            f"NOTE: in {m['disturbed_runs']} of {m['runs']} runs other processes or steal took "
            f">= {m['warn_pct']:.0f} % of a core: the machine was not quiet, so the ratios are "
            "noisier than usual; repeat before trusting them"
        )
    return lines


def _show(seen: list[Any]) -> str:
    """The distinct values of a gauge over the runs: ``True``, ``4096``, ``stable/fixed``."""
    return "/".join(str(x) for x in seen) or "-"


def _waits(total: dict[str, Any]) -> int:
    """Requests any gate made wait or rejected, over one mode's runs."""
    return sum(g.get(k, 0) for g in total.values() if isinstance(g, dict) for k in WAIT_KEYS)


def format_evidence(doc: dict[str, Any]) -> list[str]:
    on, off = doc["on"], doc["off"]
    ops_on, ops_off = on["server"]["ops"], off["server"]["ops"]
    th, req, conn = (
        on["tenant_throttle"],
        on["ingress_request_rate_limiter"],
        on["ingress_connection_establishment_limiter"],
    )
    ex, ing, q, wp = (
        on["execution_tickets"],
        on["ingress_admission_tickets"],
        on["bucket_queues"],
        on["write_permits"],
    )
    waits_on, waits_off = _waits(on), _waits(off)
    lines = [
        f"evidence (server counters over every run; on: {on['runs']} runs, "
        f"{ops_on:,} ops; off: {off['runs']} runs, {ops_off:,} ops):",
        f"  on:  tenant throttle enabled {_show(th['enabled'])}, {th['units_charged']:,} units "
        f"charged, {th['throttled']} throttled, {th['rejected']} rejected",
        f"       request limiter enabled {_show(req['enabled'])}, admitted {req['admitted']:,} of "
        f"{ops_on:,} ops, {req['rejected']} rejected; connection limiter admitted "
        f"{conn['admitted']} connections, {conn['rejected']} rejected",
        f"       execution tickets {ex['admitted']:,} (probing {_show(ex['probing'])}, pools "
        f"{_show(ex['read_pool'])}/{_show(ex['write_pool'])}), ingress tickets "
        f"{ing['admitted']:,}, bucket queue slots {q['admitted']:,}, write permits "
        f"{wp['granted']:,} of "
        f"{on['server']['set_ops']:,} SETs",
        f"  off: tenant throttle enabled {_show(off['tenant_throttle']['enabled'])} "
        f"({off['tenant_throttle']['units_charged']:,} units metered), request limiter saw "
        f"{off['ingress_request_rate_limiter']['attempted']} ops, connection limiter "
        f"{off['ingress_connection_establishment_limiter']['attempted']} connections, probing "
        f"{_show(off['execution_tickets']['probing'])}, ingress tickets "
        f"{off['ingress_admission_tickets']['admitted']}, bucket queue slots "
        f"{off['bucket_queues']['admitted']}, write permits "
        f"{off['write_permits']['granted']}; execution tickets (no off switch) "
        f"{off['execution_tickets']['admitted']:,}",
        f"  queued/throttled/rejected anywhere: on {waits_on}, off {waits_off}; failed "
        f"requests: client {on['client_errors'] + off['client_errors']}, server "
        f"{on['server_errors'] + off['server_errors']}",
        "  verified: " + ("yes" if doc["verified"] else "NO"),
    ]
    lines += [f"    ! {p}" for p in doc["problems"][:20]]
    return lines


# -- driver ---------------------------------------------------------------------------


def _order(reps: int) -> list[tuple[int, str]]:
    """(rep, mode) in run order: off, on / on, off / off, on / ..."""
    out = []
    for i in range(reps):
        out += [(i, m) for m in (MODES if i % 2 == 0 else MODES[::-1])]
    return out


def run(args: argparse.Namespace) -> int:

    _finish_args(args)
    value = report.value_bytes(args.value_size, b"gates")
    meta = report.run_meta(args)
    pool = args.pool
    runs: list[Run] = []
    t0 = time.monotonic()
    report.log("starting tenantkv ...")
    with (
        servers.tenantkv_server(cpus=args.server_cpus) as handle,
        servers.bench_user(handle, BUCKET) as (admin, password),
    ):
        target = Target(handle.host, handle.port, TenantKVCodec("bench", password, BUCKET))
        report.log(f"preloading {args.keys} keys of {args.value_size} B ...")
        loadgen.preload(target, args.keys, value)
        configure_common(admin, pool)
        for op in args.ops:
            for conns in args.conns:
                for depth in args.depths:
                    workers = min(conns, os.cpu_count() or 2)
                    spec = loadgen.cell_spec(args, op, conns, depth, value, workers=workers)
                    runs += _cell(admin, handle, target, spec, args, pool)
    meta["elapsed_s"] = round(time.monotonic() - t0, 1)
    summary = summarize(runs)
    ver = verification(runs)
    out, _ = report.run_header(args, "gates")
    if args.server_cpus:
        print(
            f" (pinned: daemon on CPU {sorted(args.server_cpus)}, load on "
            f"{sorted(args.client_cpus)})",
            end="",
            file=out,
        )
    print(
        f"\nevery admission gate on but generous vs every switchable gate off, one daemon "
        f"switched at runtime; {args.value_size} B values, {args.keys} keys, closed loop, "
        f"{args.seconds:g} s per run after {args.warmup:g} s warm-up; {args.reps} off/on "
        f"pair(s) per cell, alternating which runs first; SET is durable (fsync)\n"
        f"ops/s, latency, server CPU µs/op: medians over the runs of each mode; on/off: median "
        f"of the pair ratios; Δ = on - off (median over pairs)\n",
        file=out,
    )
    print(format_table(summary), file=out)
    print("", file=out)
    print("\n".join(format_gates(pool)), file=out)
    print("", file=out)
    print("\n".join(format_evidence(ver)), file=out)
    machine = machine_summary(runs)
    print("\n".join(format_machine(machine)), file=out)
    errs = [r for r in runs if r.result.errors]
    if errs:
        print("\n! = some requests failed (not counted in ops/s):", file=out)
        for r in errs:
            print(
                f"  {r.spec.op} conns={r.spec.conns} depth={r.spec.depth} {r.mode}: "
                f"{r.result.errors} errors, e.g. {r.result.error_sample}",
                file=out,
            )
    print(f"\n({meta['elapsed_s']:g} s)", file=out)
    if args.json:
        doc = {
            "benchmark": "gates",
            "meta": meta,
            "cells": [r.to_json() for r in runs],
            "summary": summary,
            "gates": {
                name: f"off: {g['off']} | on: {g['on']}".replace("POOL", str(pool))
                for name, g in GATES.items()
            },
            "no_off_switch": [name for name, g in GATES.items() if not g["switch"]],
            "verification": ver,
            "machine": machine,
        }
        report.write_json(args.json, doc)
    return 0 if ver["verified"] and not errs else 1


def _cell(
    admin: Any,
    handle: servers.ServerHandle,
    target: Target,
    spec: LoadSpec,
    args: argparse.Namespace,
    pool: int,
) -> list[Run]:
    """One cell: an unmeasured priming run, then ``--reps`` off/on pairs."""
    order = _order(args.reps)
    set_mode(admin, order[0][1], pool)
    prime = dataclasses.replace(spec, warmup=0.0, seconds=max(args.warmup, 0.1))
    loadgen.run_load(target, prime)
    out: list[Run] = []
    for k, (rep, mode) in enumerate(order):
        set_mode(admin, mode, pool)
        before = counters(admin.server_status())
        m0, t0 = machine_cpu(), time.monotonic()
        res = loadgen.run_load(target, spec, handle.cpu_seconds)
        m1, t1 = machine_cpu(), time.monotonic()
        after = counters(admin.server_status())
        ev = evidence(before, after)
        run = Run(spec, mode, rep, k % 2, res, ev, problems(ev, mode, spec.conns, pool))
        # a process new since the first snapshot: all of its CPU is in the run
        other = sum(max(0.0, cpu - m0[0].get(pid, 0.0)) for pid, cpu in m1[0].items())
        run.other_cpu_pct = 100 * other / (t1 - t0)
        run.steal_pct = 100 * (m1[1] - m0[1]) / (t1 - t0)
        out.append(run)
        cpu = run.cpu_us_per_op
        report.log(
            f"  {spec.op} conns={spec.conns} depth={spec.depth:<3} rep {rep + 1} {mode:<3} "
            f"{res.ops_per_s:>10,.0f} ops/s  p50 {_fmt(res.percentile_us(0.5))} µs  "
            f"p99 {_fmt(res.percentile_us(0.99))} µs  srv {_fmt(cpu)} µs/op  "
            f"errors {res.errors}  other procs {run.other_cpu_pct:.0f} %"
            + (f"  PROBLEMS: {'; '.join(run.problems)}" if run.problems else "")
        )
    return out
