"""The token-bucket rate limiter (pure, fake clock; Trio adapter on mock time) and CIDR lists."""

from __future__ import annotations

import json
import math

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from tenantkv.admission import cidr
from tenantkv.admission.cidr import CidrMatcher, parse_cidrs
from tenantkv.admission.gate import ADMITTED
from tenantkv.admission.rate_limiter import (
    MAX_RETRY_AFTER_MS,
    RateLimiter,
    TokenBucket,
    retry_after_ms,
)
from tenantkv.errors import (
    OVERLOAD_LABELS,
    AdmissionQueueOverflow,
    BadValue,
    IngressRequestRateLimitExceeded,
)
from tests.conftest import FakeClock


def bucket(**kw: object) -> tuple[TokenBucket, FakeClock]:
    clock = FakeClock(100.0)
    return TokenBucket(clock, **kw), clock  # type: ignore[arg-type]


def check_invariants(tb: TokenBucket) -> None:
    s = tb.statistics()
    assert s.attempted == s.successful + s.rejected + s.interrupted_in_queue + s.queued
    assert s.added_to_queue == s.removed_from_queue + s.queued


# --------------------------------------------------------------------------- pure core


def test_starts_full_and_refills_lazily() -> None:
    tb, clock = bucket(rate_per_sec=4, burst_capacity_secs=0.5)  # burst 2
    assert tb.take() == 0.0
    assert tb.take() == 0.0
    assert tb.take() == pytest.approx(0.25)  # the next token in 1/4 s
    clock.t += 0.1
    assert tb.take() == pytest.approx(0.15)
    clock.t += 0.15
    assert tb.take() == 0.0
    clock.t += 10.0  # a long idle spell refills one burst, no more
    assert [tb.take() for _ in range(3)][:2] == [0.0, 0.0]
    s = tb.statistics()
    assert (s.attempted, s.successful, s.rejected) == (8, 5, 3)
    assert s.burst_size == 2.0
    check_invariants(tb)


def test_burst_below_one_token_is_one_token() -> None:
    tb, _ = bucket(rate_per_sec=2, burst_capacity_secs=0.1)
    assert tb.statistics().burst_size == 1.0
    assert tb.take() == 0.0
    assert tb.take() == pytest.approx(0.5)


def test_exempt_is_counted_never_limited() -> None:
    tb, _ = bucket(rate_per_sec=1, burst_capacity_secs=1)
    assert tb.take() == 0.0
    assert all(tb.take(exempt=True) == 0.0 for _ in range(5))
    tb.record_exemption()
    s = tb.statistics()
    assert (s.exempted, s.attempted, s.successful) == (6, 1, 1)
    assert s.total_available_tokens == 0.0


def test_rejection_error_carries_retry_hint() -> None:
    tb, _ = bucket(rate_per_sec=4, burst_capacity_secs=0.25, name="ingress request rate limiter")
    tb.take()
    wait = tb.take()
    err = tb.rejection(wait)
    assert isinstance(err, IngressRequestRateLimitExceeded)
    assert err.code == 462
    assert err.labels == OVERLOAD_LABELS
    # the real wait (250 ms), spread over up to one more: never sooner
    assert 250 <= (err.retry_after_ms or 0) <= 500
    assert "ingress request rate limiter" in err.errmsg
    assert err.to_wire()["retryAfterMs"] == err.retry_after_ms


def test_retry_after_ms_bounds() -> None:
    assert retry_after_ms(0.0) == 1
    assert retry_after_ms(0.0004) == 1
    assert retry_after_ms(0.2501) == 251
    assert retry_after_ms(1e9) == MAX_RETRY_AFTER_MS
    assert retry_after_ms(math.inf) == MAX_RETRY_AFTER_MS


def test_borrow_queues_fifo_and_bounds_the_queue() -> None:
    tb, clock = bucket(rate_per_sec=2, burst_capacity_secs=0.5, max_queue_depth=2)
    assert tb.borrow() is None  # the one token of the burst
    w1 = tb.borrow()
    w2 = tb.borrow()
    assert w1 is not None and w2 is not None
    assert (w1.deadline - clock.t, w2.deadline - clock.t) == pytest.approx((0.5, 1.0))
    with pytest.raises(IngressRequestRateLimitExceeded, match="max_queue_depth 2") as exc:
        tb.borrow()
    assert 1500 <= (exc.value.retry_after_ms or 0) <= 3000  # behind the two borrowed tokens
    assert tb.statistics().token_balance == pytest.approx(-2.0)  # the reject took nothing
    clock.t = w1.deadline
    tb.finish(w1)
    clock.t = w2.deadline
    tb.finish(w2)
    s = tb.statistics()
    assert (s.successful, s.rejected, s.added_to_queue, s.removed_from_queue) == (3, 1, 2, 2)
    check_invariants(tb)


def test_borrow_rejects_at_once_when_the_wait_outlasts_the_deadline() -> None:
    tb, clock = bucket(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=5)
    tb.borrow()
    with pytest.raises(IngressRequestRateLimitExceeded, match="deadline") as exc:
        tb.borrow(deadline=clock.t + 0.5)
    assert 1000 <= (exc.value.retry_after_ms or 0) <= 2000
    assert tb.borrow(deadline=clock.t + 1.0) is not None
    check_invariants(tb)


def test_cancel_returns_the_token_and_moves_the_others_up() -> None:
    tb, clock = bucket(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=5)
    tb.borrow()
    ws = [tb.borrow() for _ in range(3)]
    assert [w.deadline - 100.0 for w in ws if w] == pytest.approx([1.0, 2.0, 3.0])
    clock.t += 0.5
    assert ws[0] is not None
    tb.cancel(ws[0])
    assert [w.deadline - 100.0 for w in ws[1:] if w] == pytest.approx([1.0, 2.0])
    s = tb.statistics()
    assert s.interrupted_in_queue == 1
    assert s.token_balance == pytest.approx(-2.0 + 0.5 - 0.0)  # -3 + 0.5 refill + 1 back
    check_invariants(tb)


def test_average_time_queued_is_a_moving_average() -> None:
    tb, clock = bucket(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=5)
    tb.borrow()  # admitted at once: sample 0
    w = tb.borrow()
    assert w is not None
    clock.t = w.deadline
    tb.finish(w)  # waited 1 s
    assert tb.statistics().average_time_queued_micros == pytest.approx(0.2 * 1e6)
    tb.take()  # does not feed the average
    assert tb.statistics().average_time_queued_micros == pytest.approx(0.2 * 1e6)


def test_configure_changes_rate_burst_and_depth() -> None:
    tb, clock = bucket(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=5)
    tb.borrow()
    w1, w2 = tb.borrow(), tb.borrow()
    assert w1 is not None and w2 is not None
    clock.t += 0.5  # half a token earned at the old rate
    tb.configure(rate_per_sec=10)
    # 1.5 tokens still owed, now at 10/s
    assert (w1.deadline - clock.t, w2.deadline - clock.t) == pytest.approx((0.05, 0.15))
    tb.configure(burst_capacity_secs=3, max_queue_depth=0)
    s = tb.statistics()
    assert (s.rate_per_sec, s.burst_capacity_secs, s.burst_size, s.max_queue_depth) == (
        10.0,
        3.0,
        30.0,
        0,
    )
    clock.t += 100.0
    tb.finish(w1)
    tb.finish(w2)
    assert tb.statistics().token_balance == 30.0  # a raised burst fills over time
    tb.configure(burst_capacity_secs=0.5)
    assert tb.statistics().token_balance == 5.0  # a lowered one clips at once


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            {"burst_capacity_secs": 0},
            r"ingress_request_burst_capacity_secs must be a number in \(0",
        ),
        ({"burst_capacity_secs": -1}, "burst_capacity_secs"),
        ({"rate_per_sec": 0}, r"ingress_request_rate_per_sec must be a number in \(0, 1e\+09\]"),
        ({"rate_per_sec": math.nan}, "rate_per_sec"),
        ({"rate_per_sec": True}, "rate_per_sec"),
        ({"rate_per_sec": "5"}, "rate_per_sec"),
        ({"max_queue_depth": -1}, r"ingress_request_max_queue_depth must be an integer in \[0, "),
        ({"max_queue_depth": 1.5}, "max_queue_depth"),
    ],
)
def test_validation_names_the_parameter(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"rate_per_sec": 10, "param_prefix": "ingress_request_", **kw}
    with pytest.raises(BadValue, match=message):
        bucket(**args)
    tb, _ = bucket(rate_per_sec=10, param_prefix="ingress_request_")
    with pytest.raises(BadValue, match=message):
        tb.configure(**{"rate_per_sec": 7, **kw})  # type: ignore[arg-type]
    assert tb.rate_per_sec == 10.0  # all or nothing


@given(
    st.lists(
        st.tuples(st.floats(0, 2), st.sampled_from(["try", "borrow", "cancel", "finish"])),
        max_size=60,
    )
)
def test_counters_stay_consistent(steps: list[tuple[float, str]]) -> None:
    tb, clock = bucket(rate_per_sec=3, burst_capacity_secs=1, max_queue_depth=3)
    waiting = []
    for dt, action in steps:
        clock.t += dt
        if action == "try":
            tb.take()
        elif action == "borrow":
            try:
                w = tb.borrow()
            except IngressRequestRateLimitExceeded:
                continue
            if w is not None:
                waiting.append(w)
        elif waiting and action == "cancel":
            tb.cancel(waiting.pop())
        elif waiting and action == "finish":
            tb.finish(waiting.pop(0))
        check_invariants(tb)
        deadlines = [w.deadline for w in tb.waiters]
        assert deadlines == sorted(deadlines)  # FIFO holds through every change
        assert tb.statistics().token_balance <= tb.statistics().burst_size


# --------------------------------------------------------------------------- Trio adapter


async def run_callers(limiter: RateLimiter, n: int) -> tuple[list[float], list[Exception]]:
    """Start ``n`` callers at once; admission times (from now) and rejections."""
    t0 = trio.current_time()
    times: list[float] = []
    errors: list[Exception] = []

    async def caller() -> None:
        try:
            await limiter.acquire()
        except IngressRequestRateLimitExceeded as exc:
            errors.append(exc)
            return
        times.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(caller)
    return sorted(times), errors


async def test_burst_of_two_then_one_every_quarter_second(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter.create(rate_per_sec=4, burst_capacity_secs=0.5, max_queue_depth=16)
    times, errors = await run_callers(limiter, 10)
    assert not errors
    assert times == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0])
    s = limiter.statistics()
    assert (s.successful, s.added_to_queue, s.removed_from_queue, s.queued) == (10, 8, 8, 0)
    assert s.average_time_queued_micros > 0


async def test_queue_depth_four_admits_five_of_ten(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter.create(rate_per_sec=2, burst_capacity_secs=0.5, max_queue_depth=4)
    times, errors = await run_callers(limiter, 10)
    assert times == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert len(errors) == 5
    for exc in errors:
        assert exc.labels == OVERLOAD_LABELS
        assert exc.retry_after_ms is not None and 1 <= exc.retry_after_ms <= 5000
    s = limiter.statistics()
    assert (s.attempted, s.successful, s.rejected, s.interrupted_in_queue) == (10, 5, 5, 0)


async def test_depth_zero_rejects_the_second_caller(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=0)
    with trio.testing.assert_no_checkpoints():
        await limiter.acquire()  # the admitted fast path does not checkpoint
    with pytest.raises(IngressRequestRateLimitExceeded, match="queue full") as exc:
        await limiter.acquire()
    assert 1000 <= (exc.value.retry_after_ms or 0) <= 2000


async def test_exempt_acquire_never_waits(autojump_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1)
    await limiter.acquire()
    with trio.testing.assert_no_checkpoints():
        for _ in range(100):
            await limiter.acquire(exempt=True)
    assert limiter.statistics().exempted == 100


async def test_cancelled_waiter_gives_its_token_back(mock_clock: trio.testing.MockClock) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=4)
    await limiter.acquire()  # the burst
    admitted: dict[str, float] = {}

    async def caller(name: str, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await limiter.acquire()
            admitted[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        b = await nursery.start(caller, "b")  # owed the token of t=1
        await nursery.start(caller, "c")  # owed the token of t=2
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().queued == 2
        mock_clock.jump(0.5)
        b.cancel()  # the client went away
        await trio.testing.wait_all_tasks_blocked()
        s = limiter.statistics()
        assert (s.queued, s.interrupted_in_queue) == (1, 1)
        assert s.token_balance == pytest.approx(-0.5)  # -2 + 0.5 refilled + 1 back
        mock_clock.jump(0.5)  # c moved up to t=1
    assert admitted == {"c": pytest.approx(1.0)}
    check_invariants(limiter.bucket)


async def test_waiter_past_its_deadline_is_rejected_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=4)
    await limiter.acquire()
    start = trio.current_time()
    with pytest.raises(IngressRequestRateLimitExceeded, match="deadline"):
        await limiter.acquire(deadline=start + 0.5)
    assert trio.current_time() == start  # no sleeping just to fail


async def test_runtime_rate_change_retimes_the_waiters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter.create(rate_per_sec=1, burst_capacity_secs=1, max_queue_depth=10)
    t0 = trio.current_time()
    times: list[float] = []

    async def caller() -> None:
        await limiter.acquire()
        times.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(caller)  # 1 now, then t = 1, 2, 3, 4 at 1/s
        await trio.sleep(1.5)
        # 2.5 tokens still owed, now at 10/s: 0.5, 1.5 and 2.5 tokens away
        limiter.configure(rate_per_sec=10)
    assert times == pytest.approx([0.0, 1.0, 1.55, 1.65, 1.75])

    limiter.configure(rate_per_sec=2, burst_capacity_secs=1)  # a burst of 2 tokens
    await trio.sleep(10)  # earned back
    times.clear()
    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(caller)  # 2 now, then t = 0.5, 1.0
        await trio.sleep(0.25)
        # 1.5 owed, now at 1/s: 0.5 and 1.5 tokens away
        limiter.configure(rate_per_sec=1)
    assert times == pytest.approx([0.0, 0.0, 0.75, 1.75])

    limiter.configure(max_queue_depth=0, burst_capacity_secs=2)
    await trio.sleep(10)
    await limiter.acquire()
    await limiter.acquire()
    with pytest.raises(IngressRequestRateLimitExceeded):
        await limiter.acquire()
    assert limiter.statistics().max_queue_depth == 0


async def test_try_acquire_and_rejection_through_the_adapter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = RateLimiter.create(
        rate_per_sec=10,
        burst_capacity_secs=0.1,
        name="session establishment",
        param_prefix="ingress_connection_establishment_",
        error=AdmissionQueueOverflow,
    )
    assert limiter.try_acquire() is ADMITTED
    assert limiter.try_acquire() is None
    err = limiter.rejection()
    assert isinstance(err, AdmissionQueueOverflow)
    assert 100 <= (err.retry_after_ms or 0) <= 200
    assert "ingress_connection_establishment_rate_per_sec" in err.errmsg
    doc = limiter.statistics().as_dict()
    json.dumps(doc)
    assert doc["attempted"] == 2 and doc["rejected"] == 1 and doc["total_available_tokens"] == 0


# --------------------------------------------------------------------------- CIDR


def test_cidr_matches_ipv4_and_ipv6() -> None:
    m = CidrMatcher(["10.0.0.0/8", "192.168.1.7", "2001:db8::/32", "::1", "0.0.0.0/32"])
    assert len(m) == 5
    assert m.ranges == ["10.0.0.0/8", "192.168.1.7/32", "2001:db8::/32", "::1/128", "0.0.0.0/32"]
    for peer, hit in [
        ("10.0.0.0", True),
        ("10.255.255.255", True),
        ("11.0.0.0", False),
        ("9.255.255.255", False),
        ("192.168.1.7", True),
        ("192.168.1.8", False),
        ("2001:db8::1", True),
        ("2001:db8:ffff:ffff::", True),
        ("2001:db9::", False),
        ("::1", True),
        ("::2", False),
        ("::ffff:10.1.2.3", True),  # IPv4-mapped, as a dual-stack socket reports it
        ("::ffff:11.1.2.3", False),
        ("fe80::1%eth0", False),
        ("/run/tenantkv.sock", False),
        ("", False),
    ]:
        assert m.matches(peer) is hit, peer
        assert m.matches(peer) is hit, peer  # cached


def test_cidr_whole_space_and_empty_list() -> None:
    assert CidrMatcher(["0.0.0.0/0"]).matches("203.0.113.9")
    assert not CidrMatcher(["0.0.0.0/0"]).matches("2001:db8::1")
    assert CidrMatcher(["::/0"]).matches("2001:db8::1")
    assert CidrMatcher("fe80::/10").matches("fe80::1%eth0")  # the zone is ignored
    empty = CidrMatcher()
    assert not empty.matches("127.0.0.1")
    assert len(empty) == 0


def test_cidr_accepts_a_comma_separated_string() -> None:
    m = CidrMatcher("10.0.0.0/8, 127.0.0.1  ::1")
    assert m.ranges == ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "10.0.0.1/8",
            r"exemptions\[1\] '10.0.0.1/8' has host bits set; did you mean '10.0.0.0/8'",
        ),
        ("10.0.0.0/33", r"prefix length '33' must be an integer in \[0, 32\] for IPv4"),
        ("2001:db8::/129", r"prefix length '129' must be an integer in \[0, 128\] for IPv6"),
        ("10.0.0.0/x", "prefix length 'x'"),
        ("10.0.0.0/", "prefix length ''"),
        ("300.1.2.3", "'300.1.2.3' is not an IPv4 or IPv6 address"),
        ("example.com/24", "'example.com' is not an IPv4 or IPv6 address"),
        ("   ", r"exemptions\[1\] is empty"),
        (7, r"exemptions\[1\] must be a string"),
    ],
)
def test_cidr_bad_entries_are_named(entry: object, message: str) -> None:
    with pytest.raises(BadValue, match=message):
        CidrMatcher(["127.0.0.1", entry])  # type: ignore[list-item]


def test_cidr_bad_container() -> None:
    with pytest.raises(BadValue, match="ingress_request_rate_limiter_exemptions must be a list"):
        parse_cidrs(b"10.0.0.0/8", name="ingress_request_rate_limiter_exemptions")  # type: ignore[arg-type]
    with pytest.raises(BadValue, match="must be a list"):
        parse_cidrs(42, name="x")  # type: ignore[arg-type]


def test_cidr_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cidr, "CACHE_SIZE", 8)
    m = CidrMatcher(["10.0.0.0/8"])
    for i in range(100):
        assert m.matches(f"10.0.0.{i}")
        assert len(m._cache) <= 8


def test_rejection_hints_spread_and_are_never_sooner_than_the_wait() -> None:
    """Deterministic hints made every rejected client retry at the same instant."""
    tb, _ = bucket(rate_per_sec=10, burst_capacity_secs=0.1)
    tb.take()
    wait = tb.take()
    hints = {tb.rejection(wait).retry_after_ms for _ in range(200)}
    assert len(hints) > 20
    assert min(h or 0 for h in hints) >= round(wait * 1000)


@given(
    tokens_at=st.floats(0.0, 10.0),
    n=st.integers(0, 30),
    rate=st.sampled_from([0.5, 1.0, 3.0, 100.0]),
)
def test_a_loan_answers_each_caller_as_take_would_at_that_instant(
    tokens_at: float, n: int, rate: float
) -> None:
    """lend/settle (one received chunk's requests): the same admissions, refusal
    waits, tokens left and counters as n calls of take at the same instant."""
    buckets = []
    for _ in range(2):
        now = [0.0]
        b = TokenBucket(lambda now=now: now[0], rate_per_sec=rate, burst_capacity_secs=10)
        b._tokens, b._last = tokens_at, 0.0
        now[0] = 0.0
        buckets.append(b)
    one, lent = buckets
    by_take = [one.take() for _ in range(n)]
    left = lent.lend()
    assert left is not None
    by_loan = []
    admitted = refused = 0
    for _ in range(n):
        if left >= 1.0 - 1e-9:
            left -= 1.0
            admitted += 1
            by_loan.append(0.0)
        else:
            refused += 1
            by_loan.append((1.0 - left) / rate)
    lent.settle(left, admitted, refused)
    assert by_loan == pytest.approx(by_take)
    assert lent._tokens == pytest.approx(one._tokens)
    a, b = one.statistics(), lent.statistics()
    assert (a.attempted, a.successful, a.rejected) == (b.attempted, b.successful, b.rejected)
