"""``python -m bench soak``: hours-long behaviour in minutes — memory and latency drift.

A self-started daemon (durable defaults, temporary data directory) serves, for
``--minutes``:

- **steady tenants** — ``--tenants`` buckets, one user each, each driven open
  loop at ``--rate`` ops/s (80 % GET, 20 % durable SET of ``--value-size``
  bytes over a fixed key space, so the data set stops growing after a while).
  Their latencies, measured from each operation's *scheduled* start, are the
  drift signal;
- **a noisy tenant** — every ``--burst-every`` s, for ``--burst-secs`` s,
  pipelined SETs as fast as one connection goes into a bucket with a hard limit,
  with ``nonblocking_throttle``: it is rejected with ``Throttled`` (counted as
  *overload*, expected, never retried);
- **connection churn** — a client that logs in, pings and leaves, 5 times a second;
- **admin changes** — every ``--admin-every`` s one of: a runtime parameter
  changed and reset, a bucket's throttle properties changed and reset, a
  bucket created, written and deleted, a user created and deleted, the status
  document read.

Every ``--interval`` s a row: steady ops/s, p50/p99/max latency, the server's
``VmRSS`` and ``RssAnon`` (its own heap; LMDB's file pages are page cache and
only count in VmRSS), overload rejections and unexpected errors. After the
warm-up, the summary compares the start with the end against the targets of a
10-minute soak: RssAnon growth < 10 % and p99 drift < 20 % (pooled latencies
of the first third of the measured time against the last third, so each third
holds the same number of bursts), and no unexpected error.

Exit status 0 when every target is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import array
import itertools
import json
import os
import random
import secrets
import statistics
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import options, report, servers
from bench.loadgen import BenchError

RSS_TARGET_PCT = 10.0
P99_DRIFT_TARGET_PCT = 20.0
NOISY = "noisy"


def add_parser(sub: Any) -> None:
    p = options.subcommand(sub, run, __doc__)
    options.add(p, "--minutes", float, 10.0, "how long to run", above=0)
    options.add(p, "--warmup", float, None, "seconds not measured at the start [min(60, 20%%)]")
    options.add(p, "--interval", float, 10.0, "seconds per report row", above=0)
    options.add(p, "--tenants", int, 4, "steady tenant buckets", low=1)
    options.add(p, "--rate", float, 200.0, "ops/s per steady tenant", above=0)
    options.data_flags(p, 2000, 200, keys_help="keys per steady tenant")
    options.add(p, "--burst-every", float, 30.0, "seconds between bursts")
    options.add(p, "--burst-secs", float, 5.0, "length of a burst")
    options.add(p, "--noisy-hard-limit", int, 2000, "noisy bucket's hard_limit")
    options.add(p, "--admin-every", float, 5.0, "seconds between admin changes")
    options.add(p, "--seed", int, 1, "random seed")
    p.add_argument("--json", metavar="PATH", help="write the rows and summary as JSON here")


def proc_memory_mb(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return out


def percentile(sorted_xs: list[float], q: float) -> float | None:
    if not sorted_xs:
        return None
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


@dataclass
class Shared:
    """What the workers report to the sampler (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: list[float] = field(default_factory=list)
    ops: int = 0
    overload: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def error(self, where: str, exc: BaseException) -> None:
        from tenantkv import errors

        with self.lock:
            if isinstance(exc, errors.TenantKVError) and exc.has_label(errors.SYSTEM_OVERLOADED):
                self.overload[f"{where}:{exc.code_name}"] += 1
            else:
                name = getattr(exc, "code_name", type(exc).__name__)
                self.unexpected[f"{where}:{name}"] += 1
                if len(self.samples) < 20:
                    self.samples.append(f"{where}: {exc!r}"[:300])

    def drain(self) -> tuple[list[float], int, Counter[str], Counter[str]]:
        with self.lock:
            lat, self.latencies = self.latencies, []
            ops, self.ops = self.ops, 0
            over, self.overload = self.overload, Counter()
            unexp, self.unexpected = self.unexpected, Counter()
        return lat, ops, over, unexp


@dataclass
class Env:
    host: str
    port: int
    admin_password: str
    users: dict[str, tuple[str, str]]  # bucket -> (user, password)
    args: argparse.Namespace
    shared: Shared

    def client(self, bucket: str | None = None, **kw: Any) -> Any:
        import tenantkv

        if bucket is None:
            user, password = "admin", self.admin_password
        else:
            user, password = self.users[bucket]
        return tenantkv.Client(
            self.host, self.port, user=user, password=password, bucket=bucket, **kw
        )


# -- workers -------------------------------------------------------------------------------


def steady(env: Env, bucket: str, seed: int) -> None:
    rng = random.Random(seed)
    a = env.args
    value = os.urandom(a.value_size)
    period = 1.0 / a.rate
    sh = env.shared
    with env.client(bucket, timeout=10) as c:
        next_t = time.perf_counter()
        while not sh.stop.is_set():
            now = time.perf_counter()
            if next_t > now:
                time.sleep(next_t - now)
            key = f"k{rng.randrange(a.keys)}"
            try:
                if rng.random() < 0.8:
                    c.get(key)
                else:
                    c.set(key, value)
            except Exception as exc:
                sh.error("steady", exc)
            else:
                lat = time.perf_counter() - next_t  # from the scheduled start: open loop
                with sh.lock:
                    sh.latencies.append(lat)
                    sh.ops += 1
            next_t += period


def noisy(env: Env, start: float) -> None:
    a = env.args
    sh = env.shared
    value = b"n" * a.value_size
    with env.client(NOISY, timeout=10, max_overload_retries=0, nonblocking_throttle=True) as c:
        for burst in itertools.count(1):
            begin = start + burst * a.burst_every - a.burst_secs / 2
            while time.monotonic() < begin:
                if sh.stop.wait(min(0.2, begin - time.monotonic())):
                    return
            end = begin + a.burst_secs
            i = 0
            while time.monotonic() < end and not sh.stop.is_set():
                p = c.pipeline(raise_on_error=False)
                for _ in range(50):
                    i += 1
                    p.set(f"n{i % 5000}", value)
                try:
                    results = p.execute()
                except Exception as exc:
                    sh.error("noisy", exc)
                    continue
                for r in results:
                    if isinstance(r, BaseException):
                        sh.error("noisy", r)


def churn(env: Env, buckets: list[str]) -> None:
    sh = env.shared
    for i in itertools.count():
        if sh.stop.wait(0.2):
            return
        try:
            with env.client(buckets[i % len(buckets)], timeout=10) as c:
                c.ping()
        except Exception as exc:
            sh.error("churn", exc)


def admin_changes(env: Env, buckets: list[str]) -> None:
    sh = env.shared
    a = env.args
    n = itertools.count()
    actions = ("parameter", "bucket-throttle", "bucket", "user", "status")
    try:
        admin = env.client(timeout=30)
    except Exception as exc:
        sh.error("admin", exc)
        return
    with admin:
        for i in itertools.count():
            if sh.stop.wait(a.admin_every):
                return
            what = actions[i % len(actions)]
            try:
                if what == "parameter":
                    admin.command("set_parameter", name="bucket_queue_tolerance", value=512)
                    admin.command("set_parameter", name="bucket_queue_tolerance", value=None)
                elif what == "bucket-throttle":
                    b = buckets[i % len(buckets)]
                    admin.command(
                        "SetBucketThrottleProperties", bucket=b, json='{"hard_limit": 1000000}'
                    )
                    admin.command(
                        "SetBucketThrottleProperties", bucket=b, json='{"hard_limit": "unlimited"}'
                    )
                elif what == "bucket":
                    name = f"soak-tmp-{next(n)}"
                    admin.create_bucket(name)
                    admin.select_bucket(name)
                    admin.set("k", b"v")
                    admin.delete_bucket(name)
                elif what == "user":
                    name = f"soak-user-{next(n)}"
                    admin.create_user(name, secrets.token_urlsafe(12), roles={buckets[0]: "read"})
                    admin.delete_user(name)
                else:
                    admin.server_status()
            except Exception as exc:
                sh.error(f"admin-{what}", exc)


# -- the run ------------------------------------------------------------------------------


def _finish_args(a: argparse.Namespace) -> None:
    if a.warmup is None:
        a.warmup = min(60.0, a.minutes * 60 * 0.2)
    options.check(a.warmup < a.minutes * 60, "--warmup must be shorter than the run")


def _fmt(x: float | None, scale: float = 1000.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def run(args: argparse.Namespace) -> int:
    import tenantkv

    _finish_args(args)
    buckets = [f"tenant{i}" for i in range(args.tenants)]
    with servers.tenantkv_server() as handle:
        assert handle.password is not None and handle.pid is not None
        users: dict[str, tuple[str, str]] = {}
        with tenantkv.Client(
            handle.host, handle.port, user="admin", password=handle.password
        ) as admin:
            for b in [*buckets, NOISY]:
                admin.create_bucket(b)
                users[b] = (f"{b}-app", secrets.token_urlsafe(12))
                admin.create_user(users[b][0], users[b][1], roles={b: "readwrite"})
            admin.command(
                "SetBucketThrottleProperties",
                bucket=NOISY,
                json=json.dumps({"hard_limit": args.noisy_hard_limit}),
            )
        shared = Shared()
        env = Env(handle.host, handle.port, handle.password, users, args, shared)
        start = time.monotonic()
        threads = [
            threading.Thread(target=steady, args=(env, b, args.seed + i), daemon=True)
            for i, b in enumerate(buckets)
        ]
        threads += [
            threading.Thread(target=noisy, args=(env, start), daemon=True),
            threading.Thread(target=churn, args=(env, buckets), daemon=True),
            threading.Thread(target=admin_changes, args=(env, buckets), daemon=True),
        ]
        for t in threads:
            t.start()
        report.log(
            f"soak: {args.minutes:g} min, {args.tenants} tenants x {args.rate:g} ops/s, bursts "
            f"{args.burst_secs:g}s every {args.burst_every:g}s, warm-up {args.warmup:g}s"
        )
        report.log(
            f"{'t s':>6} {'ops/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
            f"{'RSS MiB':>8} {'anon MiB':>8} {'overload':>8} {'errors':>6}"
        )
        rows: list[dict[str, Any]] = []
        # Flat float arrays, not lists of floats: the garbage collector never walks
        # them, so the soak's own bookkeeping (~0.5 M latencies by the end) does
        # not make the generator's collections, and so its measured tail, grow.
        pooled: list[tuple[float, array.array[float]]] = []
        end = start + args.minutes * 60
        next_row = start + args.interval
        try:
            while (now := time.monotonic()) < end:
                time.sleep(max(0.0, min(next_row, end) - now))
                lat, ops, over, unexp = shared.drain()
                t = time.monotonic() - start
                elapsed = args.interval if not rows else t - rows[-1]["t"]
                mem = proc_memory_mb(handle.pid)
                lat.sort()
                row = {
                    "t": round(t, 1),
                    "ops_per_s": round(ops / max(elapsed, 1e-9), 1),
                    "p50_ms": _round_ms(percentile(lat, 0.5)),
                    "p99_ms": _round_ms(percentile(lat, 0.99)),
                    "max_ms": _round_ms(lat[-1] if lat else None),
                    "rss_mb": round(mem.get("VmRSS", 0), 1),
                    "rss_anon_mb": round(mem.get("RssAnon", 0), 1),
                    "overload": sum(over.values()),
                    "unexpected": dict(unexp),
                    "warmup": t <= args.warmup,
                }
                rows.append(row)
                if not row["warmup"]:
                    pooled.append((t, array.array("d", lat)))
                report.log(
                    f"{t:6.0f} {row['ops_per_s']:7.0f} {_fmt(percentile(lat, 0.5)):>7} "
                    f"{_fmt(percentile(lat, 0.99)):>7} {_fmt(lat[-1] if lat else None):>7} "
                    f"{row['rss_mb']:8.1f} {row['rss_anon_mb']:8.1f} {row['overload']:8d} "
                    f"{sum(unexp.values()):6d}" + ("  (warm-up)" if row["warmup"] else "")
                )
                next_row += args.interval
        finally:
            shared.stop.set()
            for t in threads:
                t.join(15)
        summary = summarize(rows, pooled, shared.samples)
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args) | {"func": None}, "rows": rows, "summary": summary}, f)
            f.write("\n")
    return 0 if summary["met"] else 1


def _round_ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def summarize(
    rows: list[dict[str, Any]],
    pooled: Sequence[tuple[float, Sequence[float]]],
    samples: list[str],
) -> dict[str, Any]:
    measured = [r for r in rows if not r["warmup"]]
    if len(measured) < 3:
        raise BenchError("too few rows after the warm-up: run longer or use a shorter --interval")
    k = max(1, len(measured) // 3)
    anon_start = statistics.median(r["rss_anon_mb"] for r in measured[:k])
    anon_end = statistics.median(r["rss_anon_mb"] for r in measured[-k:])
    rss_start = statistics.median(r["rss_mb"] for r in measured[:k])
    rss_end = statistics.median(r["rss_mb"] for r in measured[-k:])
    third = max(1, len(pooled) // 3)
    first = sorted(x for _, lat in pooled[:third] for x in lat)
    last = sorted(x for _, lat in pooled[-third:] for x in lat)
    p99_first, p99_last = percentile(first, 0.99), percentile(last, 0.99)
    growth = 100.0 * (anon_end - anon_start) / anon_start if anon_start else None
    drift = (
        100.0 * (p99_last - p99_first) / p99_first if p99_first and p99_last is not None else None
    )
    unexpected: Counter[str] = Counter()
    for r in rows:
        unexpected.update(r["unexpected"])
    overload = sum(r["overload"] for r in rows)
    met = (
        growth is not None
        and growth < RSS_TARGET_PCT
        and drift is not None
        and drift < P99_DRIFT_TARGET_PCT
        and not unexpected
    )
    return {
        "rss_anon_mb": [round(anon_start, 1), round(anon_end, 1)],
        "rss_mb": [round(rss_start, 1), round(rss_end, 1)],
        "rss_anon_growth_pct": None if growth is None else round(growth, 2),
        "p99_ms": [_round_ms(p99_first), _round_ms(p99_last)],
        "p99_drift_pct": None if drift is None else round(drift, 2),
        "ops_measured": sum(len(lat) for _, lat in pooled),
        "overload_rejections": overload,
        "unexpected_errors": dict(unexpected),
        "error_samples": samples,
        "targets": {"rss_anon_growth_pct": RSS_TARGET_PCT, "p99_drift_pct": P99_DRIFT_TARGET_PCT},
        "met": met,
    }


def print_summary(s: dict[str, Any]) -> None:
    def verdict(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    g, d = s["rss_anon_growth_pct"], s["p99_drift_pct"]
    print(
        f"RssAnon  {s['rss_anon_mb'][0]} -> {s['rss_anon_mb'][1]} MiB: {g:+.1f} % "
        f"(target < {RSS_TARGET_PCT:g} %) {verdict(g < RSS_TARGET_PCT)}"
    )
    print(f"VmRSS    {s['rss_mb'][0]} -> {s['rss_mb'][1]} MiB (includes LMDB's file pages)")
    print(
        f"p99      {s['p99_ms'][0]} -> {s['p99_ms'][1]} ms: {d:+.1f} % "
        f"(target < {P99_DRIFT_TARGET_PCT:g} %) {verdict(d < P99_DRIFT_TARGET_PCT)}"
    )
    print(
        f"ops {s['ops_measured']} measured; overload rejections (expected, noisy tenant) "
        f"{s['overload_rejections']}; unexpected errors {sum(s['unexpected_errors'].values())} "
        f"{verdict(not s['unexpected_errors'])}"
    )
    for line in s["error_samples"][:5]:
        print(f"  {line}")
