"""Every performance target the project set itself, and how to read it off a result.

One row per target named in an issue. ``measure`` takes the raw result of the
scenario that measures it (the ``result`` of a ``bench/results/*.json``
envelope) and returns the figure as text and whether the target is met, so the
published table and the closing notes quote the same numbers. Targets met by
the test suite rather than a benchmark have no scenario; they say which tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Result = dict[str, Any]
#: (figure as text, met?) — met None: not measurable from this result
Verdict = tuple[str, bool | None]


@dataclass(frozen=True)
class Goal:
    anchor: str
    issues: str
    text: str
    #: the harness scenario that measures it; None = verified by tests
    scenario: str | None
    measure: Callable[[Result], Verdict] | None = None
    #: for targets the test suite verifies: which tests
    tests: str = ""


def find_check(result: Result, part: str, figure: str) -> dict[str, Any] | None:
    """The module-reported check of ``part`` whose figure starts with ``figure``."""
    for c in result.get("checks", []):
        if c.get("scenario") == part and str(c.get("figure", "")).startswith(figure):
            return c
    return None


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:.1f} %"


def _checks(
    result: Result, part: str, items: list[tuple[str, str]], fmt: Callable[[Any], str]
) -> Verdict:
    """Several checks joined: ``label figure`` each; met when all are."""
    texts: list[str] = []
    mets: list[bool] = []
    for label, figure in items:
        c = find_check(result, part, figure)
        if c is None:
            texts.append(f"{label} not run")
            continue
        texts.append(f"{label} {fmt(c['value'])}".strip())
        mets.append(bool(c["met"]))
    return "; ".join(texts), (all(mets) if mets else None)


# -- measures -----------------------------------------------------------------------


def _cpu_cells(result: Result, op: str, shapes: tuple[tuple[int, int], ...]) -> list[Any]:
    return [
        c for c in result.get("cells", []) if c["op"] == op and (c["conns"], c["depth"]) in shapes
    ]


def _cpu_ratio(
    op: str, shapes: tuple[tuple[int, int], ...], limit: float
) -> Callable[[Result], Verdict]:
    def measure(result: Result) -> Verdict:
        cells = [c for c in _cpu_cells(result, op, shapes) if c.get("cpu_over_floor")]
        if not cells:
            return "not measured", None
        text = ", ".join(
            f"{c['conns']}x{c['depth']} {c['size']} B: {c['cpu_over_floor']:.2f}x" for c in cells
        )
        return text, all(c["cpu_over_floor"] <= limit for c in cells)

    return measure


def _cpu_commit(result: Result) -> Verdict:
    cells = [
        c for c in _cpu_cells(result, "set", ((16, 64),)) if c["tenantkv"].get("writes_per_commit")
    ]
    if not cells:
        return "not measured", None
    text = ", ".join(f"{c['size']} B: {c['tenantkv']['writes_per_commit']:.0f}" for c in cells)
    return text, all(c["tenantkv"]["writes_per_commit"] >= 500 for c in cells)


def redis_ratios(op: str, threshold: float, pipelined_only: bool) -> Callable[[Result], Verdict]:
    def measure(result: Result) -> Verdict:
        rows = [
            r
            for r in result.get("ratios", [])
            if r["op"] == op and (r["depth"] > 1 or not pipelined_only)
        ]
        rows = [r for r in rows if r["tenantkv_over_redis"] is not None]
        if not rows:
            return "not measured (no redis-server on the machine)", None
        text = ", ".join(
            f"{r['conns']}x{r['depth']}: {r['tenantkv_over_redis']:.2f}x" for r in rows
        )
        return text, all(r["tenantkv_over_redis"] >= threshold for r in rows)

    return measure


def _hard_limit(result: Result) -> Verdict:
    c = find_check(result, "hard-limit", "achieved units/s")
    if c is None:
        return "not run", None
    return f"{c['value']:+.2f} % of the hard limit", bool(c["met"])


def _resp_vs_msgpack(op: str) -> Callable[[Result], Verdict]:
    """RESP ops/s over MessagePack ops/s in every load shape of ``op`` (bench/resp.py)."""

    def measure(result: Result) -> Verdict:
        cells = [
            c
            for c in result.get("cells", [])
            if c["op"] == op and c.get("resp_over_msgpack") is not None
        ]
        if not cells:
            return "not measured", None
        text = ", ".join(f"{c['conns']}x{c['depth']}: {c['resp_over_msgpack']:.2f}x" for c in cells)
        return text, all(c["resp_over_msgpack"] >= 1.0 for c in cells)

    return measure


def _workers(op: str, metric: str) -> Callable[[Result], Verdict]:
    """bench/workers.py's checks of ``op`` and ``metric`` (``ops/s``, ``CPU/op``,
    ``ops/commit``) for 2 workers over 1, every load shape; met when all are."""

    def measure(result: Result) -> Verdict:
        found = [
            c
            for c in result.get("checks", [])
            if c.get("scenario") == "workers"
            and str(c.get("figure", "")).startswith(f"{op} ")
            and f": {metric} 2 ÷ 1 workers" in str(c.get("figure", ""))
        ]
        if not found:
            return "not measured", None
        text = ", ".join(
            f"{c['figure'].split(':')[0].split(' ', 1)[1]}: {_x(c['value'])}" for c in found
        )
        mets = [c["met"] for c in found]
        return text, (None if None in mets else all(mets))

    return measure


def _workers_set(result: Result) -> Verdict:
    ops, ok_ops = _workers("SET", "ops/s")(result)
    commit, ok_commit = _workers("SET", "ops/commit")(result)
    met = None if ok_ops is None or ok_commit is None else ok_ops and ok_commit
    return f"ops/s {ops}; ops/commit {commit}", met


def _reservation(result: Result) -> Verdict:
    c = find_check(result, "reservation", "Q achieved / reserved")
    if c is None:
        return "not run", None
    return f"{c['value']:.1f} % of the reservation", bool(c["met"])


def _reservation_p99(result: Result) -> Verdict:
    return _checks(result, "reservation", [("", "Q p99 with N")], _x)


def _jain(result: Result) -> Verdict:
    return _checks(result, "fairness", [("", "Jain's index")], lambda v: f"{v:.4f}")


def _throttle_overhead(result: Result) -> Verdict:
    return _checks(
        result,
        "overhead",
        [("GET", "GET on/off"), ("SET", "SET on/off")],
        lambda v: f"{v:.3f}",
    )


def _probing(result: Result) -> Verdict:
    parts: list[str] = []
    mets: list[bool] = []
    for phase in ("read-heavy", "read->write switch", "write-heavy"):
        t = find_check(result, "probing", f"{phase}: time to 95 %")
        s = find_check(result, "probing", f"{phase}: steady state")
        if t is None or s is None:
            continue
        when = "not within the run" if t["value"] is None else f"{t['value']:.1f} s"
        parts.append(f"{phase}: {when}, steady {_pct(s['value'])} of best")
        mets.append(bool(t["met"]))
    return ("; ".join(parts) or "not run"), (all(mets) if mets else None)


def _tickets(result: Result) -> Verdict:
    texts: list[str] = []
    mets: list[bool] = []
    for c in result.get("checks", []):
        if c.get("scenario") == "overhead" and "tickets cost" in str(c.get("figure")):
            op = str(c["figure"]).split(":")[0].upper()
            texts.append(f"{op} {_pct(c['value'])}")
            mets.append(bool(c["met"]))
    return ("; ".join(texts) or "not run"), (all(mets) if mets else None)


def _goodput(result: Result) -> Verdict:
    return _checks(result, "load", [("4x", "goodput at 4x"), ("8x", "goodput at 8x")], _pct)


def _admitted_p99(result: Result) -> Verdict:
    return _checks(result, "load", [("", "admitted p99 4x")], _x)


def _rejection_cost(result: Result) -> Verdict:
    return _checks(
        result,
        "cost",
        [
            ("Poisson", "CPU per rejection / served GET, poisson"),
            ("pipelined", "CPU per rejection / served GET, pipelined"),
        ],
        _pct,
    )


def _storm(result: Result) -> Verdict:
    return _checks(result, "storm", [("", "established p99 storm")], _x)


def _retry_row(result: Result, scenario: str, mode: str, factor: float) -> dict[str, Any] | None:
    for r in result.get("results", []):
        if r["scenario"] == scenario and r["mode"] == mode and r["factor"] == factor:
            return r
    return None


def _burst(result: Result) -> Verdict:
    on = _retry_row(result, "burst", "on", 4.0)
    if on is None:
        return "not run", None
    ok = on["ok"] / on["ops"] if on["ops"] else 0.0
    off = _retry_row(result, "burst", "off", 4.0)
    text = f"{_pct(ok)} succeeded"
    if off is not None and off["ops"]:
        text += f" (retries off: {_pct(off['ok'] / off['ops'])})"
    return text, ok >= 0.99


def _sustained(result: Result) -> Verdict:
    on = _retry_row(result, "sustained", "on", 4.0)
    if on is None:
        return "not run", None
    share = on["goodput"] / on["peak"]
    return f"{_pct(share)} of peak", share >= 0.95


def _amplification(result: Result) -> Verdict:
    row = _retry_row(result, "sustained", "adaptive", 4.0)
    if row is None:
        return "not run", None
    return f"{row['attempts_per_op']:.3f} attempts per operation", row["attempts_per_op"] <= 1.1


def _crash(result: Result) -> Verdict:
    s = result.get("summary")
    if not s:
        return "not run", None
    return (
        f"{s['lost']} of {s['acknowledged']:,} lost over {len(result.get('cycles', []))} kills",
        s["lost"] == 0,
    )


def _soak(key: str, target: float) -> Callable[[Result], Verdict]:
    def measure(result: Result) -> Verdict:
        v = result.get("summary", {}).get(key)
        if v is None:
            return "not run", None
        minutes = result.get("args", {}).get("minutes")
        return f"{v:+.1f} % over {minutes:g} min", v < target

    return measure


GOALS: tuple[Goal, ...] = (
    Goal(
        "t-get-vs-redis",
        "2, 9",
        "Pipelined GET ≥ 0.5x redis-server, same generator, same run",
        "throughput",
        redis_ratios("get", 0.5, pipelined_only=True),
    ),
    Goal(
        "t-set-vs-redis",
        "2, 9",
        "Durable SET ≥ 1.0x redis-server `appendfsync always`, same run",
        "durable",
        redis_ratios("set", 1.0, pipelined_only=False),
    ),
    Goal(
        "t-hard-limit",
        "3",
        "Hard limit held within ±3 % over 10 s",
        "throttle-accuracy",
        _hard_limit,
    ),
    Goal(
        "t-reservation",
        "3",
        "Reserved bucket gets ≥ 97 % of its reservation under a 10x noisy neighbour",
        "isolation",
        _reservation,
    ),
    Goal(
        "t-reservation-p99",
        "3",
        "…and its p99 stays within 1.2x of its p99 alone",
        "isolation",
        _reservation_p99,
    ),
    Goal("t-jain", "3", "Jain's index ≥ 0.99, 1 vs 64 connections", "isolation", _jain),
    Goal(
        "t-throttle-overhead",
        "3",
        "Throttling on but unlimited ≥ 0.95x throttling off",
        "throttle-overhead",
        _throttle_overhead,
    ),
    Goal(
        "t-probing",
        "4",
        "Probing reaches ≥ 95 % of the best fixed pool size within 10 s, "
        "both workloads and after the switch",
        "probing",
        _probing,
    ),
    Goal(
        "t-tickets",
        "4",
        "Ticket accounting costs ≤ 3 % of throughput vs no tickets",
        "ticket-overhead",
        _tickets,
    ),
    Goal("t-goodput", "5", "Goodput at 4x and 8x overload ≥ 95 % of peak", "overload", _goodput),
    Goal(
        "t-admitted-p99",
        "5",
        "Admitted requests' p99 at 4x ≤ 2x unloaded",
        "overload",
        _admitted_p99,
    ),
    Goal(
        "t-rejection-cost",
        "5",
        "A rejection costs ≤ 20 % of a served GET's server CPU",
        "overload",
        _rejection_cost,
    ),
    Goal("t-storm", "5", "Connection storm: established clients' p99 ≤ 2x calm", "storm", _storm),
    Goal(
        "t-burst",
        "6",
        "2 s burst at 4x: ≥ 99 % of operations succeed with retries on",
        "retries",
        _burst,
    ),
    Goal(
        "t-sustained",
        "6",
        "Sustained 4x with retries: goodput ≥ 95 % of peak",
        "retries",
        _sustained,
    ),
    Goal(
        "t-amplification",
        "6",
        "Adaptive retries at 4x: ≤ 1.1 attempts per operation",
        "retries",
        _amplification,
    ),
    Goal("t-crash", "8", "0 acknowledged writes lost over all crash cycles", "crash", _crash),
    Goal(
        "t-fuzz",
        "8",
        "0 server crashes and 0 cross-bucket accesses in fuzz and matrix tests",
        None,
        tests="`tests/e2e/test_fuzz.py` (hypothesis frames against a live daemon), "
        "`tests/e2e/test_auth_matrix.py` (29 commands x 5 users x 2 buckets), "
        "`tests/e2e/test_abuse.py`; they fail CI on any crash or cross-bucket access",
    ),
    Goal(
        "t-soak-rss",
        "8",
        "10-minute soak: resident memory growth < 10 %",
        "soak",
        _soak("rss_anon_growth_pct", 10.0),
    ),
    Goal(
        "t-soak-p99", "8", "10-minute soak: p99 drift < 20 %", "soak", _soak("p99_drift_pct", 20.0)
    ),
    Goal(
        "t-cpu-get-pipelined",
        "17",
        "GET 16x64 and 1x64: tenantkv server CPU ≤ 1.5x the floor's",
        "cpu",
        _cpu_ratio("get", ((16, 64), (1, 64)), 1.5),
    ),
    Goal(
        "t-cpu-get-single",
        "17",
        "GET 1x1 and 16x1: tenantkv server CPU ≤ 1.3x the floor's",
        "cpu",
        _cpu_ratio("get", ((1, 1), (16, 1)), 1.3),
    ),
    Goal(
        "t-cpu-set",
        "17",
        "Durable SET 16x64: ≤ 2x the floor's µs/op",
        "cpu",
        _cpu_ratio("set", ((16, 64),), 2.0),
    ),
    Goal(
        "t-cpu-set-commit",
        "17",
        "Durable SET 16x64: ≥ 500 writes per commit",
        "cpu",
        lambda r: _cpu_commit(r),
    ),
    Goal(
        "t-preauth-rss",
        "14",
        "Pre-auth flood: server RssAnon growth ≤ 64 MiB",
        "attack",
        lambda r: (
            f"{r['flood']['rss_growth_mib']} MiB",
            r["flood"]["rss_growth_mib"] <= 64,
        ),
    ),
    Goal(
        "t-preauth-healthy",
        "14",
        "Pre-auth flood: a healthy client keeps ≥ 80 % of its calm rate",
        "attack",
        lambda r: (
            _pct(r["flood"]["healthy_ratio"]),
            (r["flood"]["healthy_ratio"] or 0) >= 0.8,
        ),
    ),
    Goal(
        "t-idle-conn",
        "14",
        "RSS per idle connection at 10,000 connections ≤ 16 KiB",
        "attack",
        lambda r: (
            f"{r['idle']['unauthenticated_kib_per_connection']} KiB without hello, "
            f"{r['idle']['authenticated_kib_per_connection']} KiB after",
            max(
                r["idle"]["unauthenticated_kib_per_connection"],
                r["idle"]["authenticated_kib_per_connection"],
            )
            <= 16,
        ),
    ),
    Goal(
        "t-admin-login",
        "14",
        "Admin login while the connection table is full < 1 s",
        "attack",
        lambda r: (
            f"{r['idle']['admin_login_secs_table_full']} s",
            r["idle"]["admin_login_secs_table_full"] < 1,
        ),
    ),
    Goal(
        "t-churn",
        "14",
        "RSS after 100,000 connect/close cycles within 10 % of after 10,000",
        "attack",
        lambda r: (f"{r['churn']['growth_pct']:+} %", r["churn"]["growth_pct"] <= 10),
    ),
    Goal(
        "t-resp-get",
        "18",
        "redis-benchmark GET on the RESP port ≥ the MessagePack-RPC port's ops/s, "
        "each load shape (1/16 connections x pipeline 1/64)",
        "resp",
        _resp_vs_msgpack("get"),
    ),
    Goal(
        "t-resp-set",
        "18",
        "redis-benchmark durable SET on the RESP port ≥ the MessagePack-RPC port's ops/s, "
        "each load shape",
        "resp",
        _resp_vs_msgpack("set"),
    ),
    Goal(
        "t-resp-hard-limit",
        "18",
        "Hard limit held within ±3 % over 10 s through RESP (redis-benchmark)",
        "throttle-accuracy-resp",
        _hard_limit,
    ),
    Goal(
        "t-workers-get",
        "19",
        "2 workers on this 2-core machine: pipelined GET (redis-benchmark, RESP, generator "
        "on the same cores) ≥ 1.5x one worker's ops/s",
        "workers",
        _workers("GET", "ops/s"),
    ),
    Goal(
        "t-workers-cpu",
        "19",
        "…and server CPU per GET, summed over the supervisor and all workers, ≤ 1.1x one worker's",
        "workers",
        _workers("GET", "CPU/op"),
    ),
    Goal(
        "t-workers-set",
        "19",
        "Durable SET with 2 workers: ops/s and ops per commit ≥ one worker's",
        "workers",
        _workers_set,
    ),
    Goal(
        "t-workers-hard-limit",
        "19",
        "`--workers 2`: hard limit held within ±3 % over 10 s",
        "throttle-accuracy-workers",
        _hard_limit,
    ),
    Goal(
        "t-workers-reservation",
        "19",
        "`--workers 2`: reserved bucket gets ≥ 97 % of its reservation under a 10x noisy neighbour",
        "throttle-accuracy-workers",
        _reservation,
    ),
    Goal(
        "t-workers-reservation-p99",
        "19",
        "`--workers 2`: …and its p99 stays within 1.2x of its p99 alone",
        "throttle-accuracy-workers",
        _reservation_p99,
    ),
    Goal(
        "t-workers-jain",
        "19",
        "`--workers 2`: Jain's index ≥ 0.99, 1 vs 64 connections",
        "throttle-accuracy-workers",
        _jain,
    ),
)
