"""Client back-pressure against a real daemon: failpoints, throttled buckets, two servers.

The retry rules themselves are tested without sockets (tests/unit/test_retry_policy.py,
tests/unit/test_client_retries.py); these check that the real clients and the
real server agree: the failpoint's overload errors are retried transparently,
``retry_writes=False`` surfaces them, the deadline reaches the server as
``timeout_ms``, and a retry moves to a second server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

import tenantkv
from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon

TIMEOUT = 20


@pytest.fixture(scope="module")
def testing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("bp") / "data", extra_args=["--enable-test-commands"])
    d.start()
    with d.client() as c:
        c.create_bucket("bp")
        c.select_bucket("bp")
        c.set("k", b"v")
    yield d
    d.kill()


@pytest.fixture(autouse=True)
def failpoint_off(testing: Daemon) -> Iterator[None]:
    yield
    with testing.client() as c:
        c.command("configure_fail_point", name="failCommand", mode="off")


def fail(c: tenantkv.Client, mode: Any, commands: list[str], **data: Any) -> None:
    c.command(
        "configure_fail_point",
        name="failCommand",
        mode=mode,
        data={"failCommands": commands, "errorCode": 25, **data},
    )


def attempts(log: tenantkv.CommandEventLog, command: str) -> list[tuple[int, str]]:
    """(attempt, outcome) of each attempt of ``command``, outcome 'ok' or the code name."""
    out = []
    for e in log.events:
        if e.command != command or isinstance(e, tenantkv.CommandStartedEvent):
            continue
        ok = isinstance(e, tenantkv.CommandSucceededEvent)
        out.append((e.attempt, "ok" if ok else e.code_name))
    return out


def test_sync_client_retries_a_throttled_failpoint_transparently(testing: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    with testing.client(bucket="bp", event_listeners=[log]) as c:
        fail(c, {"times": 2}, ["get"], retryAfterMs=5)
        assert c.get("k") == b"v"
        assert attempts(log, "get") == [(1, "Throttled"), (2, "Throttled"), (3, "ok")]
        started = log.of(tenantkv.CommandStartedEvent, "get")
        assert {e.operation_id for e in started} == {started[0].operation_id}
        assert {e.address for e in started} == {(testing.host, testing.port)}
        assert c.server_status()["connections"]["backpressure"] >= 1


async def test_async_client_retries_a_throttled_failpoint_transparently(testing: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    with trio.fail_after(TIMEOUT):
        async with testing.async_client(bucket="bp", event_listeners=[log]) as c:
            await c.command(
                "configure_fail_point",
                name="failCommand",
                mode={"times": 2},
                data={"failCommands": ["get"], "errorCode": 25},
            )
            assert await c.get("k") == b"v"
    assert attempts(log, "get") == [(1, "Throttled"), (2, "Throttled"), (3, "ok")]


def test_always_overloaded_raises_after_max_retries_with_both_labels(testing: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    with testing.client(bucket="bp", event_listeners=[log], max_overload_retries=2) as c:
        fail(c, "alwaysOn", ["get"])
        with pytest.raises(errors.Throttled) as info:
            c.get("k")
        assert info.value.labels == ("SystemOverloadedError", "RetryableError")
    assert [a for a, _ in attempts(log, "get")] == [1, 2, 3]


def test_retry_writes_off_surfaces_the_error(testing: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    with testing.client(bucket="bp", retry_writes=False, event_listeners=[log]) as c:
        fail(c, {"times": 1}, ["set"])
        with pytest.raises(errors.Throttled):
            c.set("w", b"1")
        assert c.get("w") is None  # the rejected write never ran
        c.set("w", b"2")
    assert attempts(log, "set") == [(1, "Throttled"), (1, "ok")]


async def test_async_retry_writes_off_surfaces_the_error(testing: Daemon) -> None:
    with trio.fail_after(TIMEOUT):
        async with testing.async_client(bucket="bp", retry_writes=False) as c:
            await c.command(
                "configure_fail_point",
                name="failCommand",
                mode={"times": 1},
                data={"failCommands": ["incr"], "errorCode": 25},
            )
            with pytest.raises(errors.Throttled):
                await c.incr("n", initial=0)
            assert await c.incr("n", initial=0) == 0


def test_deadline_cuts_a_server_side_throttle_wait_short(testing: Daemon) -> None:
    # hard_limit 1 unit/s: after a 2-WU set (cost 4) the next get must wait ~4 s,
    # within the server's 5 s bound, so without a deadline the server parks it.
    # With timeout 1 s the server knows the wait would pass the deadline and
    # rejects at once (Throttled), before the client's own timeout could fire
    # (that would raise a timeout error, not Throttled: no wall clock needed).
    with testing.client() as c:
        c.create_bucket("slow", reserved=0, hard_limit=1)
    with testing.client(bucket="slow") as c:
        c.set("big", b"x" * 5000)
        with pytest.raises(errors.Throttled) as info:
            c.with_timeout(1.0).get("big")
        assert info.value.retry_after_ms is not None and info.value.retry_after_ms > 1000


def test_deadline_against_a_bucket_with_hard_limit_zero(testing: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    with testing.client() as c:
        c.create_bucket("zero", reserved=0, hard_limit=0)
    with (
        testing.client(bucket="zero", event_listeners=[log]) as c,
        pytest.raises(errors.HardLimitZero),
    ):
        c.with_timeout(0.3).get("k")
    assert attempts(log, "get") == [(1, "HardLimitZero")]  # not retryable: one attempt


@pytest.fixture
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("bp2") / "data").start()
    with d.client() as c:
        c.create_bucket("bp")
        c.select_bucket("bp")
        c.set("k", b"from the second server")
    yield d
    d.kill()


def test_an_overloaded_read_is_retried_on_the_other_server(testing: Daemon, second: Daemon) -> None:
    log = tenantkv.CommandEventLog()
    addresses = [(testing.host, testing.port), (second.host, second.port)]
    with tenantkv.Client(
        addresses=addresses,
        user="admin",
        password=ADMIN_PASSWORD,
        bucket="bp",
        event_listeners=[log],
        timeout=TIMEOUT,
    ) as c:
        assert (c.host, c.port) == addresses[0]
        fail(c, "alwaysOn", ["get"])
        assert c.get("k") == b"from the second server"
        got = [(e.attempt, e.address) for e in log.of(tenantkv.CommandStartedEvent, "get")]
        assert got == [(1, addresses[0]), (2, addresses[1])]
