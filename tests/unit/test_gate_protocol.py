"""Every admission gate speaks one protocol (``tenantkv/admission/gate.py``), and
every runtime parameter is applied by exactly one owner or read where it is used."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tenantkv import config as config_mod
from tenantkv.admission.bucket_queues import READ, WRITE, BucketQueueGate
from tenantkv.admission.cidr import CidrMatcher
from tenantkv.admission.execution_tickets import TicketHolder
from tenantkv.admission.gate import ADMITTED
from tenantkv.admission.pipeline import Pipeline
from tenantkv.admission.rate_limiter import RateLimiter
from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_gate import TenantThrottleGate
from tenantkv.admission.write_permits import PermitSettings, WritePermitGate
from tenantkv.config import Config
from tenantkv.server.node import Node
from tenantkv.server.role import SingleProcess
from tenantkv.storage.engine import Engine

GATES = [RateLimiter, TicketHolder, TenantThrottleGate, BucketQueueGate, WritePermitGate, Pipeline]

#: Runtime settings no live object applies: read from the config on every use.
READ_PER_USE = {
    "max_connections",
    "max_connections_per_address",
    "admin_reserved_connections",
    "max_inflight_per_connection",
    "hello_timeout_secs",
    "idle_timeout_secs",
    "frame_timeout_secs",
    "shutdown_grace_secs",
    "expiry_pager_interval_secs",
    "ingress_connection_establishment_rate_limiter_enabled",
    "login_failure_limit",
    "login_failure_window_secs",
    "login_delay_ms",
    "login_delay_max_ms",
    "login_hash_concurrency",
    "login_hash_queue",
    "login_hash_per_address",
    "admin_reserved_connections_per_address",
}


@pytest.mark.parametrize("gate", GATES, ids=lambda g: g.__name__)
def test_every_gate_speaks_the_protocol(gate: type) -> None:
    for name in ("try_acquire", "acquire", "release", "statistics", "parameter_table"):
        assert callable(getattr(gate, name, None)), f"{gate.__name__} lacks {name}"
    assert inspect.iscoroutinefunction(gate.acquire)
    assert not inspect.iscoroutinefunction(gate.try_acquire)
    acquire = inspect.signature(gate.acquire).parameters
    assert "deadline" in acquire and acquire["deadline"].kind is inspect.Parameter.KEYWORD_ONLY
    # Choices are keywords, never bare positional booleans.
    for method in (gate.try_acquire, gate.acquire):
        for p in inspect.signature(method).parameters.values():
            if p.annotation in ("bool", bool):
                assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{gate.__name__}.{p.name}"
    record = typing.get_type_hints(gate.statistics)["return"]
    assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen  # type: ignore[attr-defined]


async def test_rate_limiter_and_throttle_answer_with_a_hold_not_a_float(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=1)
    assert limiter.try_acquire() is ADMITTED
    assert limiter.try_acquire() is None
    assert limiter.rejection().retry_after_ms
    assert await limiter.acquire(deadline=trio.current_time() + 2) is ADMITTED

    throttle = TenantThrottle(trio.current_time, capacity=10)
    throttle.add_bucket("a", reserved=0, hard_limit=10)
    throttle.connection_opened("a")
    gate = TenantThrottleGate(throttle)
    assert gate.try_acquire("a") is ADMITTED
    throttle.charge("a", 1000, 0)  # deep in debt
    assert gate.try_acquire("a") is None
    assert gate.try_acquire("a", unthrottled=True) is ADMITTED


def _pipeline(
    *,
    exemptions: str = "",
    ingress: TicketHolder | None = None,
    read_tickets: TicketHolder | None = None,
) -> Pipeline:
    """Every gate for one bucket ``b``, on Trio's clock, generous unless given."""
    throttle = TenantThrottle(trio.current_time)
    throttle.add_bucket("b")
    queues = BucketQueueGate.create()
    queues.add_bucket("b")
    permits = WritePermitGate.create(lambda: 0)
    permits.add_bucket("b")
    return Pipeline(
        request_limiter=RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1),
        request_exemptions=CidrMatcher(exemptions, name="x"),
        ingress=ingress or TicketHolder(10, name="ingress"),
        throttle=TenantThrottleGate(throttle),
        queues=queues,
        permits=permits,
        read_tickets=read_tickets or TicketHolder(10, name="read"),
        write_tickets=TicketHolder(10, name="write"),
    )


async def test_pipeline_fast_and_slow_paths_hold_the_same_gates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    p = _pipeline(exemptions="127.0.0.0/8")
    assert p.check_request_rate("10.0.0.1", admin=False) is None
    assert p.check_request_rate("10.0.0.1", admin=False) is not None  # 462, 1/s
    assert p.check_request_rate("127.0.0.1", admin=False) is None  # exempt address
    assert p.check_request_rate("10.0.0.1", admin=True) is None  # admin commands pass
    fast = p.try_acquire("b", WRITE, unthrottled=False)
    assert fast is not None and fast.permit is not None
    slow = await p.acquire(
        "b",
        READ,
        unthrottled=False,
        deadline=None,
        nonblocking=False,
        operation="get",
        key_len=1,
    )
    assert slow.permit is None and slow.queue is not None
    st = p.statistics()
    assert st.ingress.out == 2 and st.write_tickets.out == 1 and st.read_tickets.out == 1
    p.release(fast)
    p.release(slow)
    st = p.statistics()
    assert st.ingress.out == st.read_tickets.out == st.write_tickets.out == 0


async def test_an_inline_read_passes_every_gate_holding_nothing_and_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """try_pass_read: each gate checks a slot is free and nobody waits, counts the
    read as taken and given back, and holds nothing afterwards; when any gate is
    full (or has waiters) it answers False so the read takes the waiting path."""
    ingress, reads = TicketHolder(2, name="ingress"), TicketHolder(2, name="read")
    p = _pipeline(ingress=ingress, read_tickets=reads)
    queues = p.queues
    for _ in range(5):
        assert p.try_pass_read("b", unthrottled=False)
    st = p.statistics()
    assert st.ingress.out == st.read_tickets.out == 0
    assert st.ingress.started_processing == st.ingress.finished_processing == 5
    assert st.read_tickets.finished_processing == 5  # the prober sees inline reads
    q = queues.queues.queue("b", READ)
    assert q.admitted == 5 and q.running == 0
    # A full ingress pool (writes in flight hold both tickets): the read must wait.
    held = [ingress.try_acquire(), ingress.try_acquire()]
    assert not p.try_pass_read("b", unthrottled=False)
    for t in held:
        assert t is not None
        t.release()
    # A full read queue: the same.
    queues.set_bucket("b", READ, concurrency=1)
    slot = queues.try_acquire("b", READ)
    assert slot is not None and not p.try_pass_read("b", unthrottled=False)
    queues.release(slot)
    assert p.try_pass_read("b", unthrottled=False)


async def test_every_runtime_parameter_has_one_owner(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path))
    try:
        node = Node(Config(data_dir=str(tmp_path)), engine, role=SingleProcess())
        node.start()
        try:
            applied = set(node.parameters.table)
            runtime = {s.name for s in config_mod.SETTINGS if s.runtime}
            assert applied <= runtime, sorted(applied - runtime)
            assert not applied & READ_PER_USE, sorted(applied & READ_PER_USE)
            assert runtime - applied == READ_PER_USE, sorted(runtime - applied ^ READ_PER_USE)
        finally:
            await node.stop_writer()
    finally:
        engine.close()


async def test_a_parameter_reaches_its_live_gate(tmp_path: Path) -> None:
    engine = Engine(str(tmp_path))
    try:
        node = Node(Config(data_dir=str(tmp_path)), engine, role=SingleProcess())
        node.start()
        try:
            changes: dict[str, Any] = {
                "bucket_queue_tolerance": 7,
                "write_permit_max_capacity": 99,
                "ingress_request_admission_rate_per_sec": 123.0,
                "ingress_admission_tickets": 55,
                "throttle_max_wait_ms": 250,
                "execution_write_max_queue_depth": 9,
                "bucket_queue_enabled": False,
            }
            for name, value in changes.items():
                await node.parameters.set(name, value)
            st = node.pipeline.statistics()
            assert st.bucket_queues.queue_tolerance == 7
            assert st.write_permits.settings.max_capacity == 99
            assert st.request_rate.rate_per_sec == 123.0
            assert st.ingress.total_tickets == 55
            assert node.throttle.max_wait_secs == 0.25
            assert node.write_tickets.max_queue_depth == 9
            assert node.pipeline.queues_enabled is False
            assert node.config.bucket_queue_tolerance == 7
        finally:
            await node.stop_writer()
    finally:
        engine.close()


async def test_a_request_that_must_not_wait_is_refused_by_try_acquire(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Non-blocking over its allowance, or a hard limit of 0: the fast path raises
    the same rejection the waiting path would, and the pipeline keeps nothing."""
    from tenantkv import errors

    throttle = TenantThrottle(trio.current_time, capacity=100)
    throttle.add_bucket("a", reserved=0, hard_limit=10)
    throttle.add_bucket("zero", reserved=0, hard_limit=0)
    throttle.connection_opened("a")
    gate = TenantThrottleGate(throttle)
    throttle.charge("a", 1000, 0)  # deep in debt
    assert gate.try_acquire("a") is None  # blocking: the caller waits in acquire()
    with pytest.raises(errors.Throttled) as got:
        gate.try_acquire("a", nonblocking=True)
    assert (got.value.retry_after_ms or 0) > 0  # the real wait, spread
    with pytest.raises(errors.HardLimitZero):
        gate.try_acquire("zero")  # waiting cannot help, whatever the mode
    assert throttle.statistics().buckets["a"].reject_count_total == 1

    queues = BucketQueueGate.create()
    queues.add_bucket("a")
    ingress = TicketHolder(10, name="ingress")
    p = Pipeline(
        request_limiter=RateLimiter.create(rate_per_sec=1),
        request_exemptions=CidrMatcher("", name="x"),
        ingress=ingress,
        throttle=gate,
        queues=queues,
        permits=WritePermitGate.create(lambda: 0),
        read_tickets=TicketHolder(10, name="read"),
        write_tickets=TicketHolder(10, name="write"),
    )
    with pytest.raises(errors.Throttled):
        p.try_acquire("a", READ, unthrottled=False, nonblocking=True)
    assert ingress.statistics().out == 0  # the ingress ticket went back


async def test_multi_key_commands_pay_the_floor_per_key(tmp_path: Path) -> None:
    """An mget of 50 missing keys costs 50 units, not 1; a 10-key delete costs what
    10 deletes would; single-key charges are unchanged."""
    from tenantkv.storage.string_ops import MultiDeleteOp

    engine = Engine(str(tmp_path))
    try:
        node = Node(Config(data_dir=str(tmp_path)), engine, role=SingleProcess())
        node.start()
        try:
            th = node.throttle
            th.add_bucket("b", reserved=0, hard_limit=1_000_000)

            def spent(charge: Any) -> float:
                before = th.statistics().buckets["b"].allowance or 0.0
                charge()
                return before - (th.statistics().buckets["b"].allowance or 0.0)

            assert spent(lambda: node.charge_read("b", [], False)) == 1  # a GET miss
            assert spent(lambda: node.charge_read("b", [100], False)) == 1  # a small hit
            assert spent(lambda: node.charge_read("b", [], False, keys=50)) == 50
            assert spent(lambda: node.charge_read("b", [100, 9000], False, keys=5)) == 1 + 3 + 3
            op = MultiDeleteOp(None, [b"k%d" % i for i in range(10)])  # type: ignore[arg-type]
            op.record_bytes = [2, 2]  # two of the ten existed
            ww = node.config.write_weight
            wu, cost = node.write_cost(op, wrote=True)
            assert (wu, cost) == (2, 10 * ww)
            assert spent(lambda: node.charge_writes("b", wu, cost, False)) == 10 * ww
        finally:
            await node.stop_writer()
    finally:
        engine.close()


@pytest.mark.parametrize("full", ["ingress", "queue", "permit", "ticket"])
async def test_a_run_joins_as_many_writes_as_its_fullest_gate_would_admit(
    autojump_clock: trio.testing.MockClock, full: str
) -> None:
    """A run's room is the fewest free at any gate it holds: exactly as many
    writes as ``try_acquire`` calls in a row would admit. The joins are counted
    at every gate once, and a run given back takes no more."""
    throttle = TenantThrottle(trio.current_time)
    throttle.add_bucket("a", reserved=0)
    queues = BucketQueueGate.create(concurrency=3 if full == "queue" else 100)
    queues.add_bucket("a")
    permits = WritePermitGate.create(
        lambda: 0, PermitSettings(min_capacity=1, max_capacity=3 if full == "permit" else 100)
    )
    permits.add_bucket("a")
    ingress = TicketHolder(3 if full == "ingress" else 100, name="ingress")
    writes = TicketHolder(3 if full == "ticket" else 100, name="write")
    p = Pipeline(
        request_limiter=RateLimiter.create(rate_per_sec=1),
        request_exemptions=CidrMatcher("", name="x"),
        ingress=ingress,
        throttle=TenantThrottleGate(throttle),
        queues=queues,
        permits=permits,
        read_tickets=TicketHolder(10, name="read"),
        write_tickets=writes,
    )
    holds = p.try_acquire("a", WRITE, unthrottled=False)
    assert holds is not None and p.join_room(holds) == 2

    def state() -> tuple[Any, ...]:
        q = queues.queues.queue("a", WRITE)
        return (
            ingress.statistics().out,
            q.running,
            permits.permits.permits("a").in_use,
            writes.statistics().out,
            holds.held,
            holds.untaken,
            holds.unanswered,
        )

    p.join(holds, 2)
    assert state() == (3, 3, 3, 3, 3, 3, 3)
    assert p.join_room(holds) == 0
    assert p.try_acquire("a", WRITE, unthrottled=False) is None  # the per-write answer too
    assert state() == (3, 3, 3, 3, 3, 3, 3)
    holds.release_queue_bounds(3)  # the writer took the run
    holds.release(n=3)  # and answered it
    assert state()[:4] == (0, 0, 0, 0)
    assert p.join_room(holds) == 0  # a run given back takes no more writes
