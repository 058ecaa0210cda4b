"""Bucket queues: the pure core on a fake clock, the Trio adapter on mock time."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tenantkv.admission.bucket_queues import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PENDING_TIMEOUT_MS,
    DEFAULT_QUEUE_TOLERANCE,
    MAX_RETRY_AFTER_MS,
    READ,
    REQUEST_HANDLED,
    REQUEST_THROTTLED,
    WRITE,
    BucketQueue,
    BucketQueueGate,
    BucketQueues,
    QueueEvent,
    Waiter,
)
from tenantkv.errors import (
    OVERLOAD_LABELS,
    AdmissionQueueOverflow,
    BadValue,
    BucketExists,
    BucketNotFound,
)
from tests.conftest import FakeClock


def core(**kw: int) -> tuple[BucketQueues, FakeClock]:
    clock = FakeClock(10.0)
    qs = BucketQueues(clock, **kw)
    qs.add_bucket("a")
    qs.add_bucket("b")
    return qs, clock


def stats(qs: BucketQueues, bucket: str = "a", cls: str = WRITE):  # -> BucketQueueStatistics
    return qs.statistics().buckets[bucket][cls]


# --------------------------------------------------------------------------- pure core


def test_defaults() -> None:
    qs = BucketQueues(FakeClock())
    assert (qs.concurrency, qs.queue_tolerance, qs.pending_timeout_ms) == (
        DEFAULT_CONCURRENCY,
        DEFAULT_QUEUE_TOLERANCE,
        DEFAULT_PENDING_TIMEOUT_MS,
    )


def test_slots_then_queue_then_overflow() -> None:
    qs, _ = core(concurrency=2, queue_tolerance=1)
    q1 = qs.try_acquire("a", WRITE)
    q2 = qs.try_acquire("a", WRITE)
    assert isinstance(q1, BucketQueue) and q1 is q2
    assert qs.try_acquire("a", WRITE) is None  # full: take the slow path
    _, waiter = qs.enqueue("a", WRITE, "set", 3)
    assert waiter is not None and not waiter.granted
    with pytest.raises(AdmissionQueueOverflow, match="queue_tolerance 1") as exc:
        qs.enqueue("a", WRITE, "set", 3)
    assert exc.value.labels == OVERLOAD_LABELS
    assert exc.value.code == 26
    assert exc.value.retry_after_ms is not None and exc.value.retry_after_ms >= 1
    # Classes and buckets are independent.
    assert qs.try_acquire("a", READ) is not None
    assert qs.try_acquire("b", WRITE) is not None
    s = stats(qs)
    assert (s.running, s.queued, s.admitted, s.queued_total, s.rejected_overflow) == (2, 1, 2, 1, 1)


def test_release_hands_the_slot_to_the_head_waiter_fifo() -> None:
    qs, _ = core(concurrency=1, queue_tolerance=5)
    q = qs.try_acquire("a", READ)
    assert q is not None
    _, w1 = qs.enqueue("a", READ)
    _, w2 = qs.enqueue("a", READ)
    assert qs.release(q) is w1 and w1 is not None and w1.granted
    assert q.running == 1  # the slot passed on
    assert qs.try_acquire("a", READ) is None  # w2 waits: nobody overtakes it
    assert qs.release(q) is w2
    assert qs.release(q) is None
    assert q.running == 0
    assert qs.try_acquire("a", READ) is q


def test_a_run_adds_slots_and_gives_them_back_as_one_by_one() -> None:
    """``room`` is what ``try_acquire`` calls in a row would admit; ``release_many``
    hands the slots to the waiters in order, then frees the rest."""
    qs, _ = core(concurrency=3, queue_tolerance=5)
    q = qs.try_acquire("a", WRITE)
    assert q is not None and qs.room(q) == 2
    qs.add(q, 2)
    assert qs.room(q) == 0 and q.running == 3
    _, w1 = qs.enqueue("a", WRITE)
    _, w2 = qs.enqueue("a", WRITE)
    q.running -= 1
    assert qs.room(q) == 0  # nobody overtakes a waiter
    q.running += 1
    assert qs.release_many(q, 3) == [w1, w2]
    assert q.running == 2 and not q.waiters
    assert qs.release_many(q, 2) == [] and q.running == 0
    assert q.admitted == 5


def test_tolerance_zero_rejects_as_soon_as_slots_are_busy() -> None:
    qs, _ = core(concurrency=1, queue_tolerance=0)
    assert qs.try_acquire("a", READ) is not None
    with pytest.raises(AdmissionQueueOverflow):
        qs.enqueue("a", READ)


def test_growing_concurrency_grants_waiters_and_shrinking_lets_holders_finish() -> None:
    qs, _ = core(concurrency=2, queue_tolerance=10)
    q = qs.queue("a", WRITE)
    for _ in range(2):
        qs.try_acquire("a", WRITE)
    waiters = [qs.enqueue("a", WRITE)[1] for _ in range(4)]
    woken = qs.set_bucket("a", WRITE, concurrency=4)
    assert woken == waiters[:2] and all(w.granted for w in woken if w)
    assert (q.running, len(q.waiters)) == (4, 2)
    assert qs.set_bucket("a", WRITE, concurrency=1) == []
    assert q.running == 4  # nothing revoked
    for expected in (3, 2, 1):
        assert qs.release(q) is None
        assert q.running == expected
    assert qs.release(q) is waiters[2]  # back under the limit: hand-off resumes
    assert q.running == 1


def test_node_defaults_and_overrides() -> None:
    qs, _ = core(concurrency=8, queue_tolerance=16)
    qs.set_bucket("a", READ, concurrency=2)
    qs.configure(concurrency=32, queue_tolerance=64, pending_timeout_ms=250)
    s = qs.statistics()
    a_read, a_write = s.buckets["a"][READ], s.buckets["a"][WRITE]
    assert (a_read.concurrency, a_read.queue_tolerance, a_read.concurrency_overridden) == (
        2,
        64,
        True,
    )
    assert (a_write.concurrency, a_write.concurrency_overridden) == (32, False)
    assert s.pending_timeout_ms == 250
    qs.set_bucket("a", READ, concurrency=None, queue_tolerance=3)  # back to the default
    a_read = qs.statistics().buckets["a"][READ]
    assert (a_read.concurrency, a_read.queue_tolerance) == (32, 3)
    assert (a_read.concurrency_overridden, a_read.queue_tolerance_overridden) == (False, True)
    qs.set_bucket("a", READ, concurrency=5)  # tolerance override untouched
    assert qs.queue("a", READ).queue_tolerance == 3


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"concurrency": 0}, r"bucket_queue_concurrency must be an integer in \[1, 65536\], got 0"),
        ({"concurrency": 2.5}, "bucket_queue_concurrency"),
        ({"concurrency": True}, "bucket_queue_concurrency"),
        ({"queue_tolerance": -1}, r"bucket_queue_tolerance must be an integer in \[0, 1000000\]"),
        (
            {"pending_timeout_ms": 600_001},
            r"bucket_queue_pending_timeout_ms must be an integer in \[0, 600000\]",
        ),
    ],
)
def test_validation_names_the_parameter(kw: dict[str, object], message: str) -> None:
    with pytest.raises(BadValue, match=message):
        BucketQueues(FakeClock(), **kw)  # type: ignore[arg-type]
    qs, _ = core()
    with pytest.raises(BadValue, match=message):
        qs.configure(**kw)  # type: ignore[arg-type]


def test_configure_is_all_or_nothing() -> None:
    qs, _ = core()
    with pytest.raises(BadValue, match="bucket_queue_tolerance"):
        qs.configure(concurrency=3, queue_tolerance=-1)
    assert qs.concurrency == DEFAULT_CONCURRENCY
    assert qs.queue("a", READ).concurrency == DEFAULT_CONCURRENCY


def test_bucket_override_validation_and_lookup_errors() -> None:
    qs, _ = core()
    with pytest.raises(BadValue, match=r"bucket 'a' write concurrency must be an integer in \[1,"):
        qs.set_bucket("a", WRITE, concurrency=0)
    with pytest.raises(BadValue, match=r"bucket 'a' read queue_tolerance must be"):
        qs.set_bucket("a", READ, queue_tolerance=-5)
    with pytest.raises(BadValue, match="operation class must be one of read, write"):
        qs.set_bucket("a", "admin", concurrency=1)
    with pytest.raises(BadValue, match="operation class"):
        qs.try_acquire("a", "scan")
    with pytest.raises(BucketNotFound):
        qs.try_acquire("nope", READ)
    with pytest.raises(BucketExists):
        qs.add_bucket("a")


def test_retry_hint_follows_the_observed_release_rate() -> None:
    qs, clock = core(concurrency=4, queue_tolerance=8, pending_timeout_ms=2000)
    q = qs.queue("a", WRITE)
    for _ in range(4):
        qs.try_acquire("a", WRITE)
    with pytest.raises(AdmissionQueueOverflow):
        qs.set_bucket("a", WRITE, queue_tolerance=0)
        qs.enqueue("a", WRITE)
    qs.set_bucket("a", WRITE, queue_tolerance=8)
    # Nothing released yet: the hint is the wait bound.
    assert qs.retry_after_ms(q) == 2000
    clock.t += 2.0  # a queue forms after a quiet spell: the measurement restarts
    for _ in range(8):
        qs.enqueue("a", WRITE)
    # 100 releases per second for 0.5 s, each handing its slot on to a new waiter
    for _ in range(50):
        clock.t += 0.01
        waiter = qs.release(q)
        assert waiter is not None
        qs.enqueue("a", WRITE)
    with pytest.raises(AdmissionQueueOverflow) as exc:
        qs.enqueue("a", WRITE)
    # (8 queued + 1) / 100 per second = 90 ms, spread over up to one more drain time
    assert 90 <= (exc.value.retry_after_ms or 0) <= 180
    assert stats(qs).release_rate == pytest.approx(100.0)


def test_retry_hint_is_bounded() -> None:
    qs, clock = core(concurrency=1, queue_tolerance=0, pending_timeout_ms=0)
    q = qs.try_acquire("a", READ)
    assert q is not None
    assert qs.retry_after_ms(q) == 1000  # no timeout, no measurement
    clock.t += 1000.0
    qs.release(q)
    qs.try_acquire("a", READ)
    clock.t += 1000.0
    assert 1 <= qs.retry_after_ms(q) <= MAX_RETRY_AFTER_MS


def test_timed_out_and_abandoned_waiters_leave_the_queue() -> None:
    qs, clock = core(concurrency=1, queue_tolerance=4, pending_timeout_ms=500)
    q = qs.try_acquire("a", READ)
    assert q is not None
    _, w1 = qs.enqueue("a", READ, "get", 5)
    _, w2 = qs.enqueue("a", READ, "get", 5)
    assert w1 is not None and w2 is not None
    clock.t += 0.5
    err = qs.timed_out(q, w1, "get", 5)
    assert isinstance(err, AdmissionQueueOverflow)
    assert "waited 500 ms" in err.errmsg and "bucket_queue_pending_timeout_ms 500" in err.errmsg
    assert err.labels == OVERLOAD_LABELS
    qs.abandon(q, w2)
    s = stats(qs, "a", READ)
    assert (s.queued, s.queued_total, s.rejected_timeout, s.interrupted) == (0, 2, 1, 1)
    assert qs.release(q) is None and q.running == 0


def test_remove_bucket_returns_its_waiters() -> None:
    qs, _ = core(concurrency=1)
    q = qs.try_acquire("a", READ)
    assert q is not None
    _, w = qs.enqueue("a", READ)
    assert qs.remove_bucket("a") == [w]
    assert q.removed and "a" not in qs
    assert qs.release(q) is None  # a late release of an old slot is harmless
    with pytest.raises(BucketNotFound):
        qs.try_acquire("a", READ)
    assert qs.remove_bucket("a") == []


def test_statistics_as_dict_is_json() -> None:
    qs, _ = core(concurrency=3)
    qs.try_acquire("a", READ)
    doc = qs.statistics().as_dict()
    json.dumps(doc)
    assert doc["node"]["bucket_queue_concurrency"] == 3
    assert doc["buckets"]["a"]["read"]["running"] == 1
    assert set(doc["buckets"]["b"]) == {"read", "write"}
    assert {
        "concurrency",
        "queue_tolerance",
        "running",
        "queued",
        "admitted",
        "queued_total",
        "rejected_overflow",
        "rejected_timeout",
    } <= set(doc["buckets"]["a"]["write"])
    assert {"events_dropped", "subscribers"} <= set(doc["node"])


# --------------------------------------------------------------------------- events (core)


def test_no_subscriber_no_events_and_events_with_fields() -> None:
    qs, clock = core(concurrency=1, queue_tolerance=1)
    q = qs.try_acquire("a", WRITE)
    assert q is not None
    qs.release(q)  # nobody listens: nothing is built
    rx = qs.subscribe()
    q = qs.try_acquire("a", WRITE)
    assert q is not None
    qs.enqueue("a", WRITE, "set", 7)
    with pytest.raises(AdmissionQueueOverflow):
        qs.enqueue("a", WRITE, "delete", 9)
    clock.t += 0.25
    qs.release(q, "set", 4, "ok")
    events = [rx.receive_nowait() for _ in range(3)]
    with pytest.raises(trio.WouldBlock):
        rx.receive_nowait()
    assert [(e.kind, e.operation, e.key_len, e.outcome) for e in events] == [
        (REQUEST_THROTTLED, "set", 7, "queued"),
        (REQUEST_THROTTLED, "delete", 9, "rejected_overflow"),
        (REQUEST_HANDLED, "set", 4, "ok"),
    ]
    assert [(e.running, e.queued) for e in events] == [(1, 1), (1, 1), (1, 0)]
    assert events[2].time == 10.25
    doc = events[0].as_dict()
    assert doc["event"] == "request_throttled" and doc["bucket"] == "a" and doc["class"] == "write"
    json.dumps(doc)
    assert qs.statistics().events_delivered == 3


def test_bucket_filter_and_slow_subscriber_drops() -> None:
    qs, _ = core(concurrency=1000)
    only_b = qs.subscribe("b", max_buffer=100)
    slow = qs.subscribe(max_buffer=2)
    for name in ("a", "b", "a", "b", "b"):
        q = qs.try_acquire(name, READ)
        assert q is not None
        qs.release(q, "get", 1)
    got_b: list[QueueEvent] = []
    while True:
        try:
            got_b.append(only_b.receive_nowait())
        except trio.WouldBlock:
            break
    assert [e.bucket for e in got_b] == ["b", "b", "b"]
    assert [slow.receive_nowait().bucket for _ in range(2)] == ["a", "b"]
    s = qs.statistics()
    assert (s.subscribers, s.events_dropped) == (2, 3)


def test_unsubscribe_and_closed_subscribers() -> None:
    qs, _ = core()
    rx1 = qs.subscribe()
    rx2 = qs.subscribe()
    qs.unsubscribe(rx1)
    with pytest.raises(trio.EndOfChannel):
        rx1.receive_nowait()
    rx2.close()  # the watcher went away: dropped at the next event
    q = qs.try_acquire("a", READ)
    assert q is not None
    qs.release(q)
    assert qs.statistics().subscribers == 0
    qs.unsubscribe(rx2)  # unknown now: a no-op


# --------------------------------------------------------------------------- Trio adapter


async def test_concurrency_two_tolerance_three(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create(concurrency=2, queue_tolerance=3, pending_timeout_ms=10_000)
    gate.add_bucket("a")
    t0 = trio.current_time()
    admitted: list[float] = []
    rejected: list[tuple[float, AdmissionQueueOverflow]] = []

    async def request() -> None:
        try:
            q = await gate.acquire("a", WRITE, operation="set", key_len=3)
        except AdmissionQueueOverflow as exc:
            rejected.append((trio.current_time() - t0, exc))
            return
        admitted.append(trio.current_time() - t0)
        try:
            await trio.sleep(1.0)
        finally:
            gate.release(q, operation="set", key_len=3)

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(request)
    assert sorted(admitted) == [0.0, 0.0, 1.0, 1.0, 2.0]
    assert [t for t, _ in rejected] == [0.0] * 5  # at once, never after waiting
    assert all(exc.labels == OVERLOAD_LABELS for _, exc in rejected)
    s = gate.statistics().buckets["a"][WRITE]
    assert (s.admitted, s.queued_total, s.rejected_overflow, s.running, s.queued) == (5, 3, 5, 0, 0)


async def test_free_slot_admits_without_checkpoint(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create()
    gate.add_bucket("a")
    with trio.testing.assert_no_checkpoints():
        q = await gate.acquire("a", READ)
        gate.release(q)
        q2 = gate.try_acquire("a", READ)
        assert q2 is q
        gate.release(q)


async def test_pending_timeout_rejects_a_waiter(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create(concurrency=1, queue_tolerance=5, pending_timeout_ms=300)
    gate.add_bucket("a")
    q = gate.try_acquire("a", READ)
    assert q is not None
    start = trio.current_time()
    with pytest.raises(AdmissionQueueOverflow, match="waited 300 ms") as exc:
        await gate.acquire("a", READ, operation="get", key_len=1)
    assert trio.current_time() - start == pytest.approx(0.3)
    assert exc.value.retry_after_ms is not None
    s = gate.statistics().buckets["a"][READ]
    assert (s.rejected_timeout, s.queued, s.running) == (1, 0, 1)


async def test_release_from_another_task_wakes_the_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A write's slot is released by the group-commit callback, not by its own task."""
    gate = BucketQueueGate.create(concurrency=1, pending_timeout_ms=0)
    gate.add_bucket("a")
    q = gate.try_acquire("a", WRITE)
    assert q is not None
    order: list[str] = []

    async def durable_later() -> None:
        await trio.sleep(5.0)  # far past any timeout: 0 disables it
        order.append("durable")
        gate.release(q, operation="set", key_len=1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(durable_later)
        q2 = await gate.acquire("a", WRITE)
        order.append("second admitted")
        assert trio.current_time() == pytest.approx(5.0)
        gate.release(q2)
    assert order == ["durable", "second admitted"]


async def test_growing_concurrency_wakes_waiters(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create(concurrency=1, queue_tolerance=10, pending_timeout_ms=0)
    gate.add_bucket("a")
    q = gate.try_acquire("a", READ)
    assert q is not None
    admitted: list[float] = []

    async def waiter() -> None:
        q = await gate.acquire("a", READ)
        admitted.append(trio.current_time())
        await trio.sleep(100)
        gate.release(q)

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.sleep(1.0)
        assert admitted == []
        gate.set_bucket("a", READ, concurrency=3)  # two more slots
        await trio.sleep(1.0)
        assert len(admitted) == 2
        gate.configure(concurrency=10)  # the override still rules
        await trio.sleep(1.0)
        assert len(admitted) == 2
        gate.set_bucket("a", READ, concurrency=None)  # back to the default of 10
        await trio.sleep(1.0)
        assert len(admitted) == 3
        gate.release(q)
    assert admitted == pytest.approx([1.0, 1.0, 3.0])


async def test_cancelled_waiter_leaves_the_queue(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create(concurrency=1, queue_tolerance=1, pending_timeout_ms=0)
    gate.add_bucket("a")
    q = gate.try_acquire("a", READ)
    assert q is not None
    with trio.move_on_after(1.0):  # the request's deadline
        await gate.acquire("a", READ)
    s = gate.statistics().buckets["a"][READ]
    assert (s.queued, s.interrupted) == (0, 1)
    # Its place is free again, and the slot is not lost.
    gate.release(q)
    q = await gate.acquire("a", READ)
    gate.release(q)
    assert gate.statistics().buckets["a"][READ].running == 0


async def test_cancelled_at_the_moment_of_grant_passes_the_slot_on(
    mock_clock: trio.testing.MockClock,
) -> None:
    gate = BucketQueueGate.create(concurrency=1, queue_tolerance=5, pending_timeout_ms=0)
    gate.add_bucket("a")
    q = gate.try_acquire("a", READ)
    assert q is not None
    got: list[str] = []

    async def waiter(name: str, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            q = await gate.acquire("a", READ)
            got.append(name)
            gate.release(q)

    async with trio.open_nursery() as nursery:
        first = await nursery.start(waiter, "first")
        await nursery.start(waiter, "second")
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()  # the client of "first" goes away...
        gate.release(q)  # ...and the slot is granted to it before it notices
    assert got == ["second"]
    s = gate.statistics().buckets["a"][READ]
    assert (s.running, s.admitted, s.interrupted) == (0, 3, 0)  # "first" was granted


async def test_removed_bucket_fails_its_waiters(autojump_clock: trio.testing.MockClock) -> None:
    gate = BucketQueueGate.create(concurrency=1)
    gate.add_bucket("a")
    q = gate.try_acquire("a", WRITE)
    assert q is not None

    async def remove_soon() -> None:
        await trio.sleep(0.1)
        gate.remove_bucket("a")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(remove_soon)
        with pytest.raises(BucketNotFound, match="was removed"):
            await gate.acquire("a", WRITE)
    gate.release(q)


async def test_watch_stream(autojump_clock: trio.testing.MockClock) -> None:
    """What ``tenantkv-admin watch --bucket a`` would see."""
    gate = BucketQueueGate.create(concurrency=1, queue_tolerance=1, pending_timeout_ms=0)
    gate.add_bucket("a")
    gate.add_bucket("b")
    rx = gate.subscribe("a")
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for ev in rx:
            seen.append((ev.kind, ev.outcome))

    async def request(bucket: str) -> None:
        try:
            q = await gate.acquire(bucket, READ, operation="get", key_len=2)
        except AdmissionQueueOverflow:
            return
        await trio.sleep(0.1)
        gate.release(q, operation="get", key_len=2, outcome="ok")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        async with trio.open_nursery() as requests:
            for bucket in ("a", "a", "a", "b"):
                requests.start_soon(request, bucket)
        gate.unsubscribe(rx)  # ends the stream
    assert sorted(seen) == sorted(
        [
            (REQUEST_THROTTLED, "queued"),
            (REQUEST_THROTTLED, "rejected_overflow"),
            (REQUEST_HANDLED, "ok"),
            (REQUEST_HANDLED, "ok"),
        ]
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acquire", "release", "timeout", "abandon", "resize"]),
            st.integers(0, 5),
        ),
        max_size=80,
    )
)
def test_no_free_slot_while_someone_waits(steps: list[tuple[str, int]]) -> None:
    qs, clock = core(concurrency=2, queue_tolerance=3)
    q = qs.queue("a", READ)
    held = immediate = 0
    waiting: list[Waiter] = []
    for action, n in steps:
        clock.t += 0.01
        if action == "acquire":
            try:
                _, w = qs.enqueue("a", READ)
            except AdmissionQueueOverflow:
                assert len(q.waiters) >= q.queue_tolerance
                continue
            if w is None:
                held += 1
                immediate += 1
            else:
                waiting.append(w)
        elif action == "release" and held:
            held -= 1
            qs.release(q)
        elif action in ("timeout", "abandon") and waiting:
            w = waiting.pop(n % len(waiting))
            if w.granted:
                waiting.append(w)
            elif action == "timeout":
                qs.timed_out(q, w)
            else:
                qs.abandon(q, w)
        elif action == "resize":
            qs.set_bucket("a", READ, concurrency=n + 1)
        granted = [w for w in waiting if w.granted]
        held += len(granted)
        waiting = [w for w in waiting if not w.granted]
        assert q.running == held
        assert len(q.waiters) == len(waiting)
        assert not (q.waiters and q.running < q.concurrency)  # work-conserving
        s = stats(qs, "a", READ)
        admitted_after_waiting = s.admitted - immediate
        assert s.queued_total == (
            admitted_after_waiting + s.rejected_timeout + s.interrupted + s.queued
        )
