"""``tenantkv-admin top``: a live per-bucket view, like ``mongotop`` or ``cbtop``.

Every ``--interval`` seconds it reads ``server_status`` and shows, per bucket,
the rates over the last interval: units/s against the bucket's reservation and
hard limit, operations/s, throttled/s (requests the tenant throttle made
wait), rejected/s (requests refused with an overload error by any gate) and
the p99 latency of its operations; above the table, the node: connections,
write lag, commits/s and their p99, ticket pools and probing.

The arithmetic is pure (:func:`sample`, :func:`frame`, :func:`render`); only
:func:`run` touches the terminal. On a terminal the screen is redrawn in place
and ``q`` (or Ctrl-C) quits; otherwise frames are printed one after another.
``--once --json`` prints one frame (two samples ``--interval`` apart) as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from tenantkv.metrics import OVERLOAD_CODE_NAMES, quantile

from . import format as fmt

#: Columns of the table: (header, frame key).
COLUMNS = (
    ("bucket", "bucket"),
    ("units/s", "units_per_sec"),
    ("reserved", "reserved"),
    ("hard_limit", "hard_limit"),
    ("%hard", "hard_limit_used_pct"),
    ("ops/s", "ops_per_sec"),
    ("throttled/s", "throttled_per_sec"),
    ("rejected/s", "rejected_per_sec"),
    ("p99_ms", "p99_ms"),
    ("waiting", "waiting"),
    ("conns", "connections"),
)


@dataclass(slots=True)
class BucketSample:
    ops: int = 0
    rejected: int = 0
    throttled: int = 0
    ru: int = 0
    wu: int = 0
    reserved: Any = None
    hard_limit: Any = None
    allowance_rate: Any = None
    used_previous_window: Any = None
    waiting: int = 0
    connections: int = 0
    #: latency histogram of all its operations: counts per bound of ``bounds_us`` + +Inf
    latency: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Sample:
    """The counters ``top`` needs from one status document."""

    uptime: float
    listening: str
    write_weight: int
    connections: int
    write_lag: int
    batches: int
    ops_committed: int
    bounds_us: list[int]
    commit_latency: list[int]
    read_tickets: str
    write_tickets: str
    probing: str
    capacity: Any
    buckets: dict[str, BucketSample]
    #: ``serve --workers N``: each worker's line of the document (else empty)
    workers: list[Mapping[str, Any]] = field(default_factory=list)


def _latency_counts(h: Mapping[str, Any] | None) -> list[int]:
    return [n for _, n in (h or {}).get("histogram_us") or []]


def _add(a: list[int], b: list[int]) -> list[int]:
    if not a:
        return list(b)
    return [x + y for x, y in zip(a, b, strict=False)]


def sample(doc: Mapping[str, Any]) -> Sample:
    """What one ``server_status`` document says (missing sections read as zero)."""
    throttle = doc.get("throttle") or {}
    tb = throttle.get("buckets") or {}
    lat = doc.get("latency") or {}
    lat_buckets = lat.get("buckets") or {}
    buckets: dict[str, BucketSample] = {}
    for name, b in (doc.get("buckets") or {}).items():
        t = tb.get(name) or {}
        errors = b.get("errors") or {}
        hist: list[int] = []
        for op in (lat_buckets.get(name) or {}).values():
            hist = _add(hist, _latency_counts(op))
        buckets[name] = BucketSample(
            ops=sum((b.get("ops") or {}).values()),
            rejected=sum(errors.get(code, 0) for code in OVERLOAD_CODE_NAMES),
            throttled=t.get("throttle_count_total", 0),
            ru=t.get("ru_total", 0),
            wu=t.get("wu_total", 0),
            reserved=t.get("reserved"),
            hard_limit=t.get("hard_limit"),
            allowance_rate=t.get("allowance_rate"),
            used_previous_window=t.get("units_used_previous_window"),
            waiting=t.get("waiting", 0),
            connections=b.get("connections", 0),
            latency=hist,
        )
    writer = (doc.get("storage") or {}).get("writer") or {}
    execution = doc.get("execution") or {}

    def pool(name: str) -> str:
        p = execution.get(name) or {}
        return f"{p.get('out', 0)}/{p.get('total_tickets', 0)}"

    return Sample(
        uptime=float(doc.get("uptime_secs", 0.0)),
        listening=str(doc.get("listening", "?")),
        write_weight=int((throttle.get("node") or {}).get("write_weight", 2)),
        connections=(doc.get("connections") or {}).get("current", 0),
        write_lag=writer.get("queued", 0),
        batches=writer.get("batches", 0),
        ops_committed=writer.get("ops_committed", 0),
        bounds_us=list(lat.get("bounds_us") or []),
        commit_latency=_latency_counts(lat.get("commit")),
        read_tickets=pool("read"),
        write_tickets=pool("write"),
        probing=str((execution.get("probing") or {}).get("state", "-")),
        capacity=(throttle.get("node") or {}).get("capacity"),
        buckets=buckets,
        workers=[w for w in doc.get("workers") or [] if isinstance(w, Mapping)],
    )


def _p99_ms(bounds: list[int], before: list[int], after: list[int]) -> float | None:
    """p99 in ms of what a histogram gained between two samples (None: no data)."""
    if not bounds or not after:
        return None
    delta = [a - b for a, b in zip(after, before, strict=False)] if before else after
    q = quantile([*zip([*bounds, "+Inf"], delta, strict=False)], 0.99)
    return None if q is None else round(q / 1000, 3)


def _rate(n: float, secs: float) -> float:
    return round(n / secs, 1) if secs > 0 else 0.0


def frame(prev: Sample, cur: Sample) -> dict[str, Any]:
    """Rates between two samples, as printed by ``--json``: ``{time, interval_secs,
    node: {...}, buckets: [{bucket, units_per_sec, reserved, hard_limit, ...}]}``,
    buckets by units/s, then ops/s, descending."""
    dt = cur.uptime - prev.uptime
    rows = []
    for name, b in cur.buckets.items():
        p = prev.buckets.get(name) or BucketSample()
        units = _rate((b.ru - p.ru) + cur.write_weight * (b.wu - p.wu), dt)
        hard = b.hard_limit
        rows.append(
            {
                "bucket": name,
                "units_per_sec": units,
                "reserved": b.reserved,
                "hard_limit": hard,
                "hard_limit_used_pct": (
                    round(100 * units / hard, 1) if isinstance(hard, int) and hard > 0 else None
                ),
                "allowance_rate": b.allowance_rate,
                "ops_per_sec": _rate(b.ops - p.ops, dt),
                "throttled_per_sec": _rate(b.throttled - p.throttled, dt),
                "rejected_per_sec": _rate(b.rejected - p.rejected, dt),
                "p99_ms": _p99_ms(cur.bounds_us, p.latency, b.latency),
                "waiting": b.waiting,
                "connections": b.connections,
            }
        )
    rows.sort(key=lambda r: (-r["units_per_sec"], -r["ops_per_sec"], r["bucket"]))
    batches = cur.batches - prev.batches
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "interval_secs": round(dt, 3),
        "node": {
            "listening": cur.listening,
            "uptime_secs": cur.uptime,
            "connections": cur.connections,
            "write_lag": cur.write_lag,
            "commits_per_sec": _rate(batches, dt),
            "ops_per_commit": round((cur.ops_committed - prev.ops_committed) / batches, 1)
            if batches > 0
            else None,
            "commit_p99_ms": _p99_ms(cur.bounds_us, prev.commit_latency, cur.commit_latency),
            "read_tickets": cur.read_tickets,
            "write_tickets": cur.write_tickets,
            "probing": cur.probing,
            "capacity": cur.capacity,
            "ops_per_sec": round(sum(r["ops_per_sec"] for r in rows), 1),
        },
        "buckets": rows,
        **({"workers": _worker_rows(prev, cur, dt)} if cur.workers else {}),
    }


def _worker_rows(prev: Sample, cur: Sample, dt: float) -> list[dict[str, Any]]:
    """Each worker's share of the node between two samples (a restarted worker,
    with a new pid, starts from zero). Commits are the node's: one writer."""
    before = {(w.get("worker"), w.get("pid")): w for w in prev.workers}
    rows = []
    for w in cur.workers:
        p = before.get((w.get("worker"), w.get("pid"))) or {}
        rows.append(
            {
                "worker": w.get("worker"),
                "pid": w.get("pid"),
                "connections": w.get("connections", 0),
                "ops_per_sec": _rate(w.get("ops", 0) - p.get("ops", 0), dt),
                # committed by the node's writer, which all workers share
                "writes_per_sec": _rate(w.get("writes_done", 0) - p.get("writes_done", 0), dt),
            }
        )
    return rows


def render(f: Mapping[str, Any], *, height: int | None = None, interactive: bool = False) -> str:
    """A frame as text: two node lines, then the table (cut to ``height`` lines)."""
    n = f["node"]
    commit = "-" if n["commit_p99_ms"] is None else f"{n['commit_p99_ms']:g} ms"
    batch = "-" if n["ops_per_commit"] is None else f"{n['ops_per_commit']:g}"
    lines = [
        f"tenantkv {fmt.cell(n['listening'])}  up {fmt.human_seconds(n['uptime_secs'])}  "
        f"{f['time']}  every {f['interval_secs']:g} s" + ("  (q quits)" if interactive else ""),
        f"connections {n['connections']}  ops/s {n['ops_per_sec']:g}  "
        f"capacity {fmt.cell(n['capacity'])}  write lag {n['write_lag']}  "
        f"commits/s {n['commits_per_sec']:g} (p99 {commit}, {batch} ops each)  "
        f"tickets read {n['read_tickets']} write {n['write_tickets']} ({n['probing']})",
        "",
    ]
    for w in f.get("workers") or []:
        lines.insert(
            -1,
            f"  worker {w['worker']} (pid {w['pid']})  connections {w['connections']}  "
            f"ops/s {w['ops_per_sec']:g}  writes/s {w['writes_per_sec']:g}",
        )
    rows = [[r[key] for _, key in COLUMNS] for r in f["buckets"]]
    if height is not None:
        rows = rows[: max(1, height - len(lines) - 1)]
    lines.append(fmt.table([h for h, _ in COLUMNS], rows) if f["buckets"] else "(no buckets)")
    return "\n".join(lines)


# -- the terminal ---------------------------------------------------------------------


@contextlib.contextmanager
def _screen(stream: IO[str], stdin: IO[str] | None) -> Iterator[None]:
    """Alternate screen, hidden cursor and (if stdin is a terminal) keys without Enter."""
    saved = None
    if stdin is not None:
        import termios
        import tty

        saved = termios.tcgetattr(stdin.fileno())
        tty.setcbreak(stdin.fileno())
    stream.write("\x1b[?1049h\x1b[?25l")
    try:
        yield
    finally:
        stream.write("\x1b[?25h\x1b[?1049l")
        stream.flush()
        if saved is not None:
            import termios

            termios.tcsetattr(stdin.fileno(), termios.TCSADRAIN, saved)  # type: ignore[union-attr]


def _quit_pressed(stdin: IO[str] | None, timeout: float) -> bool:
    """Wait up to ``timeout`` s for a key; True if it was q (or Q)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if stdin is None:
            time.sleep(left)
            return False
        ready, _, _ = select.select([stdin], [], [], left)
        if ready:
            key = os.read(stdin.fileno(), 1)
            if key in (b"q", b"Q"):
                return True


def run(
    fetch: Callable[[], Mapping[str, Any]],
    *,
    interval: float,
    once: bool = False,
    as_json: bool = False,
    count: int | None = None,
    out: IO[str] | None = None,
    stdin: IO[str] | None = None,
) -> int:
    """Show frames until ``q``, Ctrl-C or ``count`` frames; returns the frames shown.
    ``once``: one frame from two samples ``interval`` apart (for scripts)."""
    out = out or sys.stdout
    if once:
        count = 1
    interactive = not as_json and not once and out.isatty()
    keys = stdin if interactive and stdin is not None and stdin.isatty() else None
    prev = sample(fetch())
    shown = 0
    ctx = _screen(out, keys) if interactive else contextlib.nullcontext()
    with ctx:
        try:
            while count is None or shown < count:
                if _quit_pressed(keys, interval):
                    break
                cur = sample(fetch())
                f = frame(prev, cur)
                prev = cur
                shown += 1
                if as_json:
                    out.write(json.dumps(fmt.to_jsonable(f), indent=2 if once else None) + "\n")
                elif interactive:
                    size = shutil.get_terminal_size()
                    text = render(f, height=size.lines, interactive=True)
                    out.write("\x1b[H\x1b[2J" + _clip(text, size.columns))
                else:
                    out.write(("\n" if shown > 1 else "") + render(f) + "\n")
                out.flush()
        except KeyboardInterrupt:
            pass
    return shown


def _clip(text: str, width: int) -> str:
    return "\n".join(line[:width] for line in text.splitlines())
