"""``python -m bench micro``: what each gate's fast path costs, in-process.

The per-operation arithmetic of the sans-IO cores, timed in a tight loop with
no server around it (µs per admit and release/charge): the figures that a unit
test must not assert, since a loaded CI machine can be 10x slower.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tenantkv.admission.bucket_queues import READ, BucketQueues
from tenantkv.admission.execution_tickets import TicketHolder
from tenantkv.admission.rate_limiter import TokenBucket
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.write_permits import WritePermits
from tenantkv.metrics import OpLatency
from tenantkv.server.redis_scan import MAX_PATTERN_BYTES, compiled_glob


def per_op_us(step: Callable[[], None], n: int) -> float:
    """The best of 5 runs of ``n`` calls, in µs per call."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def cases() -> dict[str, Callable[[], None]]:
    throttle = TenantThrottle(time.monotonic, capacity=10**12)
    throttle.add_bucket("a")
    throttle.connection_opened("a")
    tokens = TokenBucket(time.monotonic, rate_per_sec=1e9, burst_capacity_secs=1.0)
    queues = BucketQueues(time.monotonic)
    queues.add_bucket("a")
    permits = WritePermits(time.monotonic)
    permits.add_bucket("a")
    tickets = TicketHolder(1_000_000, name="read")

    def throttle_step() -> None:
        throttle.admission_wait("a")
        throttle.charge("a", 1, 0)

    def queue_step() -> None:
        q = queues.try_acquire("a", READ)
        assert q is not None
        queues.release(q)

    def permit_step() -> None:
        p = permits.try_acquire("a")
        assert p is not None
        permits.release(p)

    def ticket_step() -> None:
        t = tickets.try_acquire()
        assert t is not None
        t.release()

    latency = OpLatency()
    glob_patterns = iter(range(10**9))

    def glob_step() -> None:
        # a class as long as a pattern may be, never seen before (not cached)
        body = b"%d" % next(glob_patterns)
        compiled_glob("b", b"[" + body.rjust(MAX_PATTERN_BYTES - 2, b"x") + b"]")

    return {
        "tenant throttle: admission_wait + charge": throttle_step,
        "rate limiter: take": lambda: tokens.take() and None,
        "bucket queue: try_acquire + release": queue_step,
        "write permit: try_acquire + release": permit_step,
        "execution ticket: try_acquire + release": ticket_step,
        "op latency: observe": lambda: latency.observe("orders", "get", 0.000123),
        "RESP glob: compile a longest class": glob_step,
    }


def run(args: argparse.Namespace) -> int:
    print(f"{'fast path':45} {'µs/op':>8}")
    for name, step in cases().items():
        print(f"{name:45} {per_op_us(step, args.n):8.3f}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("micro", help="µs per call of each gate's fast path, in-process")
    p.add_argument("-n", type=int, default=20_000, help="calls per run (best of 5 runs)")
    p.set_defaults(func=run)
