"""The overload retry policy as a pure state machine: no sockets, no sleeping, no clock.

A tiny driver (:func:`drive`) plays the part of a client: it follows the
:class:`~tenantkv.client.retry.RetryState` decisions against a scripted list of
outcomes on a fake clock that only the backoffs move. The real drivers run the
same scenarios in tests/unit/test_client_retries.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from tenantkv import errors
from tenantkv.client.core import Call
from tenantkv.client.monitoring import (
    CommandEventLog,
    CommandFailedEvent,
    CommandStartedEvent,
    CommandSucceededEvent,
    EventPublisher,
)
from tenantkv.client.retry import (
    RETRY_TOKEN_CAPACITY,
    RetryPolicy,
    RetryTokenBucket,
    policy_from_settings,
)
from tenantkv.client.servers import ServerSet

GET = Call("get", {"key": b"k"}, lambda r: r, is_read=True)
SET = Call("set", {"key": b"k", "value": b"v"}, lambda r: r)
GENERIC = Call("get", {"key": b"k"}, lambda r: r, generic=True)
ADMIN = Call("server_status", {}, lambda r: r, is_read=True)
ALL_BACKOFFS_AT_JITTER_1 = [0.1, 0.2, 0.4, 0.8, 1.6]


def overloaded(retry_after_ms: int | None = None) -> errors.TenantKVError:
    return errors.Throttled("over", retry_after_ms=retry_after_ms)


@dataclass
class Run:
    result: Any = None
    error: BaseException | None = None
    #: (attempt number, server index, delay before it, timeout_ms sent)
    attempts: list[tuple[int, int, float, int | None]] = field(default_factory=list)
    now: float = 0.0

    @property
    def delays(self) -> list[float]:
        return [a[2] for a in self.attempts[1:]]


def drive(
    policy: RetryPolicy,
    outcomes: Sequence[BaseException | Any] | Callable[[int, int], Any],
    *,
    call: Call[Any] = GET,
    timeout: float | None = None,
    servers: ServerSet | None = None,
    monitor: EventPublisher | None = None,
    latency: float = 0.0,
) -> Run:
    """Run one operation; ``outcomes[i]`` (or ``outcomes(attempt, server)``) is attempt i+1's.

    An outcome that is an exception is raised by the "server"; anything else is the result.
    Running past the end of a list repeats its last outcome.
    """
    servers = servers or ServerSet([("127.0.0.1", 1)])
    run = Run()
    op = policy.begin(call, now=0.0, timeout=timeout, servers=servers, monitor=monitor)
    attempt = op.first_attempt()
    while True:
        run.now += attempt.delay
        params = op.params(run.now)
        run.attempts.append(
            (attempt.number, attempt.server, attempt.delay, params.get("timeout_ms"))
        )
        op.started(attempt, run.now)
        run.now += latency
        if callable(outcomes):
            outcome = outcomes(attempt.number, attempt.server)
        else:
            outcome = outcomes[min(attempt.number, len(outcomes)) - 1]
        if isinstance(outcome, BaseException):
            nxt = op.failed(outcome, run.now)
            if nxt is None:
                run.error = outcome
                return run
            attempt = nxt
            continue
        op.succeeded(run.now)
        run.result = outcome
        return run


def fixed(j: float) -> Callable[[], float]:
    return lambda: j


# -- how many attempts ------------------------------------------------------------


def test_always_overloaded_makes_one_plus_max_retries_attempts_then_raises() -> None:
    run = drive(RetryPolicy(random=fixed(0.5)), [overloaded()])
    assert len(run.attempts) == 1 + 5
    assert [a[0] for a in run.attempts] == [1, 2, 3, 4, 5, 6]
    assert isinstance(run.error, errors.Throttled)
    assert run.error.has_label("SystemOverloadedError") and run.error.has_label("RetryableError")


@pytest.mark.parametrize("limit", [0, 1, 2, 7])
def test_max_overload_retries_bounds_the_attempts(limit: int) -> None:
    run = drive(RetryPolicy(max_overload_retries=limit, random=fixed(0)), [overloaded()])
    assert len(run.attempts) == 1 + limit


def test_success_after_overloads_returns_the_result() -> None:
    run = drive(RetryPolicy(random=fixed(0)), [overloaded(), overloaded(), "ok"])
    assert run.result == "ok" and len(run.attempts) == 3


@pytest.mark.parametrize(
    "kw, call, attempts",
    [
        ({"retry_writes": False}, SET, 1),
        ({"retry_writes": False}, GET, 6),
        ({"retry_reads": False}, GET, 1),
        ({"retry_reads": False}, SET, 6),
        ({}, GENERIC, 6),
        ({"retry_reads": False}, GENERIC, 1),
        ({"retry_writes": False}, GENERIC, 1),
    ],
)
def test_eligibility_by_command_class(kw: dict, call: Call[Any], attempts: int) -> None:
    run = drive(RetryPolicy(random=fixed(0), **kw), [overloaded()], call=call)
    assert len(run.attempts) == attempts
    assert isinstance(run.error, errors.Throttled)


# -- how long between them --------------------------------------------------------


def test_backoff_with_jitter_one_doubles_from_the_base() -> None:
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded()])
    assert run.delays == pytest.approx(ALL_BACKOFFS_AT_JITTER_1)
    assert sum(run.delays) == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.6)


def test_backoff_with_jitter_zero_is_nothing() -> None:
    run = drive(RetryPolicy(random=fixed(0.0)), [overloaded()])
    assert run.delays == [0.0] * 5 and run.now == 0.0


def test_jitter_scales_the_backoff() -> None:
    run = drive(RetryPolicy(random=fixed(0.25)), [overloaded()])
    assert run.delays == pytest.approx([d / 4 for d in ALL_BACKOFFS_AT_JITTER_1])


def test_backoff_is_capped_by_max_backoff() -> None:
    policy = RetryPolicy(base_backoff=1.0, max_backoff=3.0, random=fixed(1.0))
    assert drive(policy, [overloaded()]).delays == pytest.approx([1, 2, 3, 3, 3])
    big = RetryPolicy(max_overload_retries=200, random=fixed(1.0))
    assert big.backoff(200) == 10.0  # 2**199 x 0.1, capped, no overflow


def test_retry_after_ms_stretches_a_short_backoff_and_never_shortens_a_long_one() -> None:
    run = drive(RetryPolicy(random=fixed(0.0)), [overloaded(retry_after_ms=250)])
    assert run.delays == pytest.approx([0.25] * 5)
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded(retry_after_ms=250)])
    assert run.delays == pytest.approx([0.25, 0.25, 0.4, 0.8, 1.6])


def test_backoff_draws_uniform_jitter_by_default() -> None:
    policy = RetryPolicy()
    draws = [policy.backoff(3) for _ in range(2000)]
    assert all(0 <= d < 0.4 for d in draws)
    assert 0.15 < sum(draws) / len(draws) < 0.25  # mean 0.2


# -- errors that are not retried ---------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        errors.KeyNotFound("no"),
        errors.Throttled("x", labels=("SystemOverloadedError",)),  # not retryable
        errors.ClientTimeout("slow"),
        errors.ConnectionClosed("gone"),
        KeyboardInterrupt(),
    ],
)
def test_errors_without_both_labels_are_raised_at_once(exc: BaseException) -> None:
    run = drive(RetryPolicy(random=fixed(1.0)), [exc])
    assert run.error is exc and len(run.attempts) == 1 and run.now == 0.0


@pytest.mark.parametrize("call", [GET, SET])
@pytest.mark.parametrize(
    "exc",
    [
        errors.ShuttingDown("restarting"),
        errors.RequestNotSent("broke before send"),
        errors.SlotMoving("slot 7 is switching to node4", retry_after_ms=50),
    ],
)
def test_a_request_that_provably_did_not_run_is_retried(
    call: Any, exc: errors.TenantKVError
) -> None:
    """A server restart: refused while stopping, or the connection broke before the
    request went out; or the key's slot is switching nodes (a rebalance's pause).
    Reads and writes alike are safe to send again."""
    run = drive(RetryPolicy(random=fixed(1.0)), [exc, "ok"], call=call)
    assert run.result == "ok" and len(run.attempts) == 2


def test_a_lost_reply_is_retried_for_a_read_and_raised_for_a_write() -> None:
    """After the request went out the fate of a write is unknown: it is not sent
    twice behind the caller's back (PeerClosed says so); a read may run twice."""
    lost = errors.PeerClosed("the server closed the connection")
    assert drive(RetryPolicy(random=fixed(1.0)), [lost, "ok"], call=GET).result == "ok"
    run = drive(RetryPolicy(random=fixed(1.0)), [lost, "ok"], call=SET)
    assert run.error is lost and len(run.attempts) == 1


def test_a_non_overload_error_after_an_overload_is_not_backed_off() -> None:
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded(), errors.CasMismatch("cas")])
    assert isinstance(run.error, errors.CasMismatch)
    assert len(run.attempts) == 2 and run.now == pytest.approx(0.1)  # one backoff only


# -- adaptive retries -----------------------------------------------------------------


def adaptive(tokens: float | None = None) -> RetryPolicy:
    return RetryPolicy(
        adaptive_retries=True, token_bucket=RetryTokenBucket(tokens=tokens), random=fixed(0)
    )


def test_bucket_starts_full_at_capacity() -> None:
    policy = RetryPolicy(adaptive_retries=True)
    assert policy.token_bucket is not None
    assert policy.token_bucket.tokens == policy.token_bucket.capacity == RETRY_TOKEN_CAPACITY
    assert RetryPolicy().token_bucket is None


def test_adaptive_with_two_tokens_and_three_failures_makes_three_attempts() -> None:
    policy = adaptive(tokens=2)
    run = drive(policy, [overloaded()])
    assert len(run.attempts) == 3
    assert isinstance(run.error, errors.Throttled)
    assert policy.token_bucket is not None and policy.token_bucket.tokens == 0


def test_adaptive_with_no_tokens_raises_the_first_error() -> None:
    run = drive(adaptive(tokens=0), [overloaded(), "ok"])
    assert len(run.attempts) == 1 and isinstance(run.error, errors.Throttled)


@pytest.mark.parametrize(
    "outcomes, before, after",
    [
        (["ok"], 10, 10.1),  # success at the first attempt: +0.1
        ([overloaded(), "ok"], 10, 10.1),  # a retry (-1) that succeeds (+1.1)
        ([overloaded(), overloaded(), "ok"], 10, 9.1),  # -1 -1 +1.1
        ([overloaded(), errors.KeyNotFound("x")], 10, 10),  # -1, then +1 back
        ([errors.KeyNotFound("x")], 10, 10),  # a first attempt's other error: nothing
        ([overloaded()], 10, 5),  # five retries, all overloaded: -5
        (["ok"], 1000, 1000),  # never beyond the capacity
        ([overloaded(), "ok"], 1000, 1000),  # -1 +1.1, capped
        ([overloaded(), errors.KeyNotFound("x")], 1000, 1000),
    ],
)
def test_adaptive_deposits(outcomes: list[Any], before: float, after: float) -> None:
    policy = adaptive(tokens=before)
    drive(policy, outcomes)
    assert policy.token_bucket is not None
    assert policy.token_bucket.tokens == pytest.approx(after)


def test_token_bucket_arithmetic_is_exact_and_capped() -> None:
    b = RetryTokenBucket(capacity=5, tokens=0)
    for _ in range(30):
        b.deposit(0.1)
    assert b.tokens == 3.0  # tenths, no float drift
    b.deposit(1.1)
    b.deposit(1.1)
    assert b.tokens == 5.0
    assert b.try_consume(5) and not b.try_consume(0.1) and b.tokens == 0


def test_token_bucket_is_safe_across_threads() -> None:
    b = RetryTokenBucket(capacity=100_000, tokens=50_000)
    taken = [0] * 8

    def worker(i: int) -> None:
        for _ in range(5_000):
            if b.try_consume(1):
                taken[i] += 1
            b.deposit(0.1)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 40_000
    assert b.tokens == pytest.approx(50_000 - 40_000 + 4_000)


def test_a_shared_policy_shares_its_bucket() -> None:
    policy = adaptive(tokens=3)
    first = drive(policy, [overloaded()])
    second = drive(policy, [overloaded()])
    assert len(first.attempts) == 4 and len(second.attempts) == 1


# -- deadlines --------------------------------------------------------------------------


def test_each_attempt_sends_the_time_left_as_timeout_ms() -> None:
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded(), overloaded(), "ok"], timeout=2.0)
    assert [a[3] for a in run.attempts] == [2000, 1900, 1700]


def test_no_timeout_sends_no_timeout_ms() -> None:
    run = drive(RetryPolicy(random=fixed(1.0)), ["ok"])
    assert run.attempts[0][3] is None


def test_no_retry_whose_backoff_would_end_past_the_deadline() -> None:
    # Backoffs 0.1, 0.2, 0.4 end at 0.7 s; the next (0.8 s) would end at 1.5 s > 1 s.
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded()], timeout=1.0)
    assert len(run.attempts) == 4 and run.now == pytest.approx(0.7)
    assert isinstance(run.error, errors.Throttled)


def test_retry_after_past_the_deadline_stops_at_once() -> None:
    run = drive(RetryPolicy(random=fixed(0)), [overloaded(retry_after_ms=5000)], timeout=0.3)
    assert len(run.attempts) == 1 and isinstance(run.error, errors.Throttled)


def test_the_deadline_counts_time_spent_in_attempts() -> None:
    # Each attempt takes 0.3 s: attempts start at 0, 0.3+0.1, 0.7+0.2; at 1.2 s a
    # 0.4 s backoff would end at 1.6 s > 1.5 s.
    run = drive(RetryPolicy(random=fixed(1.0)), [overloaded()], timeout=1.5, latency=0.3)
    assert len(run.attempts) == 3
    assert [a[3] for a in run.attempts] == [1500, 1100, 600]


def test_a_timeout_ms_in_the_parameters_shortens_the_deadline() -> None:
    call = Call("get", {"key": b"k", "timeout_ms": 300}, lambda r: r, generic=True)
    run = drive(RetryPolicy(random=fixed(0)), [overloaded(retry_after_ms=1000)], call=call)
    assert len(run.attempts) == 1 and run.attempts[0][3] == 300
    run = drive(RetryPolicy(random=fixed(0)), ["ok"], call=call, timeout=0.1)
    assert run.attempts[0][3] == 100


# -- several servers -----------------------------------------------------------------


def three() -> ServerSet:
    return ServerSet([("a", 1), ("b", 2), ("c", 3)])


def test_a_data_command_retries_on_the_servers_not_yet_overloaded() -> None:
    run = drive(RetryPolicy(random=fixed(0)), [overloaded()], servers=three())
    assert [a[1] for a in run.attempts] == [0, 1, 2, 0, 1, 2]


def test_a_retry_goes_where_the_server_is_not_overloaded() -> None:
    run = drive(
        RetryPolicy(random=fixed(0)),
        lambda n, s: overloaded() if s == 0 else f"ok from {s}",
        servers=three(),
    )
    assert run.result == "ok from 1" and [a[1] for a in run.attempts] == [0, 1]


def test_an_admin_command_retries_where_it_started() -> None:
    run = drive(RetryPolicy(random=fixed(0)), [overloaded()], call=ADMIN, servers=three())
    assert [a[1] for a in run.attempts] == [0] * 6


def test_one_server_retries_on_itself() -> None:
    run = drive(RetryPolicy(random=fixed(0)), [overloaded()])
    assert {a[1] for a in run.attempts} == {0}


def test_servers_marked_down_are_skipped_until_they_may_be_up_again() -> None:
    s = three()
    s.mark_down(1, now=0.0)
    assert s.pick_retry(0, {0}, now=1.0) == 2
    assert s.pick_retry(0, {0}, now=10.0) == 1
    s.mark_down(0, now=0.0)  # the home server is never down
    assert s.is_up(0, now=0.0)


def test_server_unavailable_reroutes_the_same_attempt() -> None:
    servers = three()
    op = RetryPolicy(random=fixed(0)).begin(GET, now=0.0, timeout=None, servers=servers)
    first = op.first_attempt()
    op.started(first, 0.0)
    second = op.failed(overloaded(), 0.0)
    assert second is not None and second.server == 1 and second.number == 2
    third = op.server_unavailable(second, errors.ConnectionClosed("refused"), 0.0)
    assert third is not None and (third.number, third.server, third.delay) == (2, 2, 0.0)
    assert not servers.is_up(1, now=0.0)
    # the home server (restarting?) is tried again, after a backoff
    again = op.server_unavailable(first, errors.ConnectFailed("x"), 0.0)
    assert again is not None and again.server == 0  # (jitter 0 here: no delay)


# -- monitoring and logging -----------------------------------------------------------


def test_every_started_event_has_exactly_one_end_event() -> None:
    log = CommandEventLog()
    monitor = EventPublisher([log])
    policy = RetryPolicy(random=fixed(0))
    drive(policy, [overloaded(), overloaded(), "ok"], monitor=monitor)
    drive(policy, [overloaded(), errors.KeyNotFound("x")], monitor=monitor, call=SET)
    drive(policy, [overloaded()], monitor=monitor, servers=three())
    assert len(log.of(CommandStartedEvent)) == 3 + 2 + 6
    _assert_paired(log.events)
    failed = log.of(CommandFailedEvent)
    assert [e.will_retry for e in failed[:2]] == [True, True]
    assert failed[2].will_retry is True and failed[3].will_retry is False  # KeyNotFound
    assert failed[3].code_name == "KeyNotFound" and failed[3].code == 14
    assert failed[0].labels == errors.OVERLOAD_LABELS and failed[0].code == 25
    assert [e.address for e in log.events[-12::2]] == [("a", 1), ("b", 2), ("c", 3)] * 2


def _assert_paired(events: list[Any]) -> None:
    """Each started event is followed, before the next started, by one end event of its attempt."""
    it: Iterator[Any] = iter(events)
    for started in it:
        assert isinstance(started, CommandStartedEvent)
        end = next(it)
        assert isinstance(end, CommandSucceededEvent | CommandFailedEvent)
        assert (end.operation_id, end.attempt, end.command, end.address) == (
            started.operation_id,
            started.attempt,
            started.command,
            started.address,
        )
        assert end.duration >= 0


def test_event_durations_use_the_driver_clock() -> None:
    log = CommandEventLog()
    monitor = EventPublisher([log])
    drive(RetryPolicy(random=fixed(0)), [overloaded(), "ok"], monitor=monitor, latency=0.25)
    ends = [e for e in log.events if not isinstance(e, CommandStartedEvent)]
    assert [e.duration for e in ends] == pytest.approx([0.25, 0.25])


def test_a_failing_listener_is_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(CommandEventLog):
        def started(self, event: CommandStartedEvent) -> None:
            raise RuntimeError("listener bug")

    good = CommandEventLog()
    run = drive(RetryPolicy(random=fixed(0)), ["ok"], monitor=EventPublisher([Broken(), good]))
    assert run.result == "ok" and len(good.events) == 2
    assert "listener bug" in caplog.text


def test_retries_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tenantkv.client")
    drive(RetryPolicy(random=fixed(1.0), max_overload_retries=1), [overloaded()])
    records = [r for r in caplog.records if r.name == "tenantkv.client"]
    assert all(r.levelno == logging.DEBUG for r in records)
    text = [r.getMessage() for r in records]
    assert any("retrying get" in t and "Throttled" in t and "0.100 s" in t for t in text)
    assert any("not retrying get" in t and "1 retries made" in t for t in text)


# -- settings -----------------------------------------------------------------------------


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_overload_retries"):
        RetryPolicy(max_overload_retries=-1)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(base_backoff=-0.1)
    with pytest.raises(ValueError, match="adaptive_retries"):
        RetryPolicy(token_bucket=RetryTokenBucket())


def test_a_policy_object_excludes_the_separate_settings() -> None:
    defaults: dict[str, Any] = {
        "retry_reads": True,
        "retry_writes": True,
        "max_overload_retries": 5,
        "base_backoff": 0.1,
        "max_backoff": 10.0,
        "adaptive_retries": False,
    }
    policy = RetryPolicy(max_overload_retries=2)
    assert policy_from_settings(policy, **defaults) is policy
    built = policy_from_settings(None, **{**defaults, "max_overload_retries": 3})
    assert built.max_overload_retries == 3
    with pytest.raises(ValueError, match="max_backoff"):
        policy_from_settings(policy, **{**defaults, "max_backoff": 1.0})


def test_the_event_log_is_a_bounded_ring_of_light_records() -> None:
    """~10^5 kept exceptions (with their tracebacks) paused a client for seconds in GC."""
    from tenantkv.client.monitoring import CommandFailedEvent

    log = CommandEventLog(max_events=100)
    for i in range(10_000):
        try:
            raise errors.Throttled(f"slow down {i}", retry_after_ms=5)
        except errors.Throttled as exc:
            err = exc
        log.failed(
            CommandFailedEvent(
                "get", i, 1, ("h", 1), 0.001, err, 25, "Throttled", err.labels, 5, False
            )
        )
        assert err.__traceback__ is not None  # the caller's exception is left whole
    kept = log.events
    assert len(kept) == 100 and kept[-1].operation_id == 9999
    last = kept[-1].error
    assert isinstance(last, errors.Throttled) and last.retry_after_ms == 5
    assert last.__traceback__ is None and last.__context__ is None
