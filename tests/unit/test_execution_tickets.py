"""Execution tickets: the pure core on a fake clock, the Trio adapter on autojump time."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tenantkv.admission.execution_tickets import (
    NOOP_TICKET,
    Priority,
    Ticket,
    TicketHolder,
)
from tenantkv.errors import (
    RETRYABLE,
    SYSTEM_OVERLOADED,
    AdmissionQueueOverflow,
    DeadlineExceeded,
)
from tests.conftest import FakeClock

STAT_FIELDS = {
    "out",
    "available",
    "total_tickets",
    "added_to_queue",
    "removed_from_queue",
    "queue_length",
    "started_processing",
    "processing",
    "finished_processing",
    "total_time_processing_micros",
    "total_time_queued_micros",
    "canceled",
    "new_admissions",
    "exempt",
}
EXEMPT_FIELDS = {
    "started_processing",
    "processing",
    "finished_processing",
    "total_time_processing_micros",
}


def check_consistent(h: TicketHolder) -> dict[str, object]:
    """The statistics invariants; returns ``as_dict()``."""
    s = h.statistics()
    d = s.as_dict()
    assert set(d) == STAT_FIELDS
    assert set(d["exempt"]) == EXEMPT_FIELDS  # type: ignore[arg-type]
    assert s.processing == s.started_processing - s.finished_processing == s.out == h.out
    assert s.queue_length == s.added_to_queue - s.removed_from_queue == h.queue_length
    assert s.available == max(0, s.total_tickets - s.out) == h.available
    assert s.total_tickets == h.total_tickets
    assert s.canceled <= s.removed_from_queue
    assert s.new_admissions <= s.started_processing
    assert s.finished_processing == h.finished_processing
    e = s.exempt
    assert e.processing == e.started_processing - e.finished_processing >= 0
    if s.queue_length:
        assert s.out >= s.total_tickets  # nobody waits while a ticket is free
    return d


async def park(h: TicketHolder, order: list[str], name: str, **kw: object) -> None:
    """Acquire (waiting), note the admission, release at once."""
    ticket = await h.acquire(**kw)  # type: ignore[arg-type]
    order.append(name)
    ticket.release()


# --------------------------------------------------------------------------- pure core


def test_try_acquire_and_release_counts_and_times() -> None:
    clock = FakeClock(10.0)
    h = TicketHolder(2, clock=clock)
    a = h.try_acquire()
    b = h.try_acquire()
    assert a is not None and b is not None
    assert h.try_acquire() is None  # exhausted: would have to queue
    clock.t = 10.5
    a.release()
    clock.t = 11.0
    b.release()
    s = h.statistics()
    assert (s.out, s.available, s.started_processing, s.finished_processing) == (0, 2, 2, 2)
    assert s.total_time_processing_micros == 1_500_000
    assert s.new_admissions == 2
    assert (s.added_to_queue, s.queue_length, s.canceled) == (0, 0, 0)
    check_consistent(h)


def test_release_is_idempotent_and_context_manager() -> None:
    h = TicketHolder(1, clock=FakeClock())
    t = h.try_acquire()
    assert t is not None and not t.released and not t.exempt
    t.release()
    t.release()
    assert t.released
    assert h.statistics().finished_processing == 1
    with h.try_acquire() as t2:  # type: ignore[union-attr]
        assert h.out == 1
    assert t2.released and h.out == 0
    check_consistent(h)


def test_peak_used_read_and_reset() -> None:
    h = TicketHolder(8, clock=FakeClock())
    tickets = [h.try_acquire() for _ in range(3)]
    for t in tickets[:2]:
        t.release()  # type: ignore[union-attr]
    assert h.peak_used_and_reset() == 3
    assert h.peak_used_and_reset() == 1  # restarts from what is out now
    tickets[2].release()  # type: ignore[union-attr]
    assert h.peak_used_and_reset() == 1
    assert h.peak_used_and_reset() == 0


def test_exempt_bypasses_the_count_but_is_recorded() -> None:
    clock = FakeClock()
    h = TicketHolder(1, clock=clock)
    normal = h.try_acquire()
    assert normal is not None
    ex = h.try_acquire(Priority.EXEMPT)
    assert ex is not None and ex.exempt
    assert h.out == 1 and h.peak_used_and_reset() == 1
    assert h.statistics().exempt.processing == 1
    clock.t = 0.25
    ex.release()
    ex.release()
    e = h.statistics().exempt
    assert (e.started_processing, e.processing, e.finished_processing) == (1, 0, 1)
    assert e.total_time_processing_micros == 250_000
    s = h.statistics()
    assert (s.started_processing, s.finished_processing) == (1, 0)  # normal untouched
    check_consistent(h)


def test_held_gets_the_noop_ticket_even_when_exhausted() -> None:
    h = TicketHolder(0, clock=FakeClock())
    before = h.statistics()
    t = h.try_acquire(held=True)
    assert t is NOOP_TICKET and t.released
    t.release()
    assert h.try_acquire(Priority.EXEMPT, held=True) is NOOP_TICKET
    assert h.statistics() == before


def test_readmission_is_not_a_new_admission() -> None:
    h = TicketHolder(2, clock=FakeClock())
    h.try_acquire().release()  # type: ignore[union-attr]
    h.try_acquire(readmission=True).release()  # type: ignore[union-attr]
    s = h.statistics()
    assert (s.started_processing, s.new_admissions) == (2, 1)


def test_shrink_retires_released_tickets_until_below_size() -> None:
    h = TicketHolder(4, clock=FakeClock())
    held = [h.try_acquire() for _ in range(4)]
    h.resize(2)
    assert h.out == 4 and h.available == 0 and h.total_tickets == 2
    held[0].release()  # type: ignore[union-attr]
    held[1].release()  # type: ignore[union-attr]
    assert h.out == 2 and h.try_acquire() is None
    held[2].release()  # type: ignore[union-attr]
    t = h.try_acquire()
    assert t is not None and h.out == 2
    check_consistent(h)


def test_bad_sizes_rejected() -> None:
    with pytest.raises(ValueError, match="total_tickets"):
        TicketHolder(-1)
    h = TicketHolder(1)
    with pytest.raises(ValueError, match="total_tickets"):
        h.resize(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_queue_depth"):
        h.max_queue_depth = -1
    with pytest.raises(ValueError, match="priority"):
        h.try_acquire("exempt")  # type: ignore[arg-type]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("acquire"), st.integers(0, 0)),
            st.tuples(st.just("exempt"), st.integers(0, 0)),
            st.tuples(st.just("release"), st.integers(0, 50)),
            st.tuples(st.just("resize"), st.integers(0, 6)),
            st.tuples(st.just("peak"), st.integers(0, 0)),
        ),
        max_size=60,
    )
)
def test_sync_invariants_hold_for_any_sequence(ops: list[tuple[str, int]]) -> None:
    h = TicketHolder(3, clock=FakeClock())
    held: list[Ticket] = []
    peak = 0
    for op, arg in ops:
        if op == "acquire":
            full = h.out >= h.total_tickets
            t = h.try_acquire()
            assert (t is None) == full
            if t is not None:
                held.append(t)
        elif op == "exempt":
            held.append(h.try_acquire(Priority.EXEMPT))  # type: ignore[arg-type]
        elif op == "release" and held:
            held.pop(arg % len(held)).release()
        elif op == "resize":
            h.resize(arg)
        elif op == "peak":
            assert h.peak_used_and_reset() == peak
            peak = h.out
        peak = max(peak, h.out)
        check_consistent(h)
        assert h.out == sum(1 for t in held if not t.exempt)


# --------------------------------------------------------------------------- Trio adapter


async def test_fast_path_takes_no_checkpoint() -> None:
    h = TicketHolder(1)
    with trio.testing.assert_no_checkpoints():
        t = await h.acquire()
        ex = await h.acquire(Priority.EXEMPT)  # pool exhausted: still immediate
        noop = await h.acquire(held=True)
    assert noop is NOOP_TICKET
    t.release()
    ex.release()


async def test_waiters_admitted_fifo(autojump_clock: trio.testing.MockClock) -> None:
    h = TicketHolder(1, clock=trio.current_time)
    first = h.try_acquire()
    assert first is not None
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        for name in "abcde":
            nursery.start_soon(park, h, order, name)
            await trio.testing.wait_all_tasks_blocked()
        assert h.queue_length == 5
        assert h.try_acquire() is None  # FIFO: no overtaking the queue
        await trio.sleep(1.0)
        first.release()
    assert order == list("abcde")
    s = check_consistent(h)
    assert s["added_to_queue"] == s["removed_from_queue"] == 5
    assert s["total_time_queued_micros"] == pytest.approx(5 * 1_000_000, abs=5)


async def test_release_hands_off_before_the_waiter_runs() -> None:
    h = TicketHolder(1)
    first = h.try_acquire()
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(park, h, order, "waiter")
        await trio.testing.wait_all_tasks_blocked()
        first.release()  # type: ignore[union-attr]
        # The waiter holds the ticket already, though it has not run yet.
        assert h.out == 1 and h.queue_length == 0
        assert h.try_acquire() is None
    assert order == ["waiter"]
    check_consistent(h)


async def test_a_run_shares_one_ticket_and_hands_each_back_on_release() -> None:
    """Operations admitted together on one ticket (``room``, ``add``) count as
    that many taken, have room where single tickets would, and their one release
    gives each back: to the queued waiters first, then to the pool."""
    h = TicketHolder(3)
    run = h.try_acquire()
    assert run is not None and h.room() == 2
    h.add(run, 2)
    assert (run.count, h.out) == (3, 3)
    assert h.room() == 0 and h.try_acquire() is None  # exhausted: as try_acquire says
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(park, h, order, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(park, h, order, "second")
        await trio.testing.wait_all_tasks_blocked()
        assert h.queue_length == 2
        assert h.room() == 0  # nobody overtakes a waiter
        run.release()  # all three: one to each waiter, in order, one to the pool
        assert (h.out, h.queue_length) == (2, 0)
    assert sorted(order) == ["first", "second"]
    s = check_consistent(h)
    assert (s["started_processing"], s["finished_processing"]) == (5, 5)


async def test_resize_down_lets_holders_finish_and_blocks_newcomers() -> None:
    h = TicketHolder(3)
    held = [h.try_acquire() for _ in range(3)]
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        h.resize(1)
        nursery.start_soon(park, h, order, "newcomer")
        await trio.testing.wait_all_tasks_blocked()
        held[0].release()  # type: ignore[union-attr]
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and h.out == 2
        held[1].release()  # type: ignore[union-attr]
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and h.out == 1  # still the last old holder in
        held[2].release()  # type: ignore[union-attr]
    assert order == ["newcomer"]
    assert h.out == 0
    check_consistent(h)


async def test_resize_up_wakes_waiters_at_once() -> None:
    h = TicketHolder(1)
    first = h.try_acquire()
    admitted: list[Ticket] = []

    async def wait_and_hold() -> None:
        admitted.append(await h.acquire())

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(wait_and_hold)
        await trio.testing.wait_all_tasks_blocked()
        h.resize(3)
        assert h.out == 3 and h.queue_length == 1
        assert h.peak_used_and_reset() == 3
        await trio.testing.wait_all_tasks_blocked()
        assert len(admitted) == 2
        first.release()  # type: ignore[union-attr]
    assert len(admitted) == 3
    for t in admitted:
        t.release()
    check_consistent(h)


async def test_queue_overflow_rejects_at_once() -> None:
    h = TicketHolder(1, max_queue_depth=1, name="write")
    first = h.try_acquire()
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(park, h, order, "queued")
        await trio.testing.wait_all_tasks_blocked()
        with trio.testing.assert_no_checkpoints(), pytest.raises(AdmissionQueueOverflow) as ei:
            await h.acquire()
        assert ei.value.code == 26
        assert set(ei.value.labels) == {SYSTEM_OVERLOADED, RETRYABLE}
        assert "write" in ei.value.errmsg and "max_queue_depth 1" in ei.value.errmsg
        assert h.statistics().added_to_queue == 1
        first.release()  # type: ignore[union-attr]
    assert order == ["queued"]
    h.max_queue_depth = 0  # never queue: the fast path still admits
    t = await h.acquire()
    with pytest.raises(AdmissionQueueOverflow):
        await h.acquire()
    t.release()
    check_consistent(h)


async def test_cancellation_counted_and_leaves_no_ghost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    h = TicketHolder(1, clock=trio.current_time)
    first = h.try_acquire()
    order: list[str] = []
    scope = trio.CancelScope()

    async def cancellable() -> None:
        with scope:
            await park(h, order, "cancelled")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(park, h, order, "a")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(cancellable)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(park, h, order, "c")
        await trio.testing.wait_all_tasks_blocked()
        assert h.queue_length == 3
        await trio.sleep(2.0)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert h.queue_length == 2
        s = h.statistics()
        assert (s.canceled, s.removed_from_queue) == (1, 1)
        assert s.total_time_queued_micros == pytest.approx(2_000_000, abs=5)
        first.release()  # type: ignore[union-attr]
    assert order == ["a", "c"]
    assert h.out == 0 and h.queue_length == 0
    s = h.statistics()
    assert (s.added_to_queue, s.removed_from_queue, s.canceled) == (3, 3, 1)
    assert h.try_acquire() is not None  # the pool is whole again
    check_consistent(h)


async def test_deadline_exceeded_while_queued(autojump_clock: trio.testing.MockClock) -> None:
    h = TicketHolder(1, clock=trio.current_time)
    first = h.try_acquire()
    start = trio.current_time()
    with pytest.raises(DeadlineExceeded):
        await h.acquire(deadline=start + 0.5)
    assert trio.current_time() - start == pytest.approx(0.5)
    s = h.statistics()
    assert (s.added_to_queue, s.canceled, s.queue_length) == (1, 1, 0)
    # A deadline already passed: rejected without queueing.
    with trio.testing.assert_no_checkpoints(), pytest.raises(DeadlineExceeded):
        await h.acquire(deadline=trio.current_time())
    assert h.statistics().added_to_queue == 1
    # A ticket in time beats the deadline.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_release_later, first, 0.1)
        t = await h.acquire(deadline=trio.current_time() + 0.5)
    t.release()
    check_consistent(h)


async def _release_later(ticket: Ticket, secs: float) -> None:
    await trio.sleep(secs)
    ticket.release()


async def test_release_from_another_task_and_from_a_thread_callback() -> None:
    h = TicketHolder(1)
    send, receive = trio.open_memory_channel[Ticket](1)
    order: list[str] = []

    async def releaser() -> None:
        async with receive:
            async for ticket in receive:
                # The group-commit writer's thread hands the release to the Trio thread.
                await trio.to_thread.run_sync(trio.from_thread.run_sync, ticket.release)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(releaser)
            async with send:
                t = await h.acquire()
                nursery.start_soon(park, h, order, "next")
                await trio.testing.wait_all_tasks_blocked()
                await send.send(t)
        assert order == ["next"]
        # A plain callback on the Trio thread (no task) may release too.
        ticket = h.try_acquire()
        assert ticket is not None
        done = trio.Event()

        def callback() -> None:
            ticket.release()
            done.set()

        trio.lowlevel.current_trio_token().run_sync_soon(callback)
        await done.wait()
    assert h.out == 0
    s = check_consistent(h)
    assert s["finished_processing"] == 3


async def test_exempt_while_queue_full() -> None:
    h = TicketHolder(1, max_queue_depth=0)
    first = h.try_acquire()
    with trio.testing.assert_no_checkpoints():
        ex = await h.acquire(Priority.EXEMPT)
    ex.release()
    first.release()  # type: ignore[union-attr]
    e = h.statistics().exempt
    assert (e.started_processing, e.finished_processing) == (1, 1)
