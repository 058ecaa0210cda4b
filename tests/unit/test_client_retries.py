"""Both clients' retry loops on scripted fake servers: no sockets, time under control.

The blocking client gets a fake clock that only its injected sleep moves; the
Trio client sleeps for real under ``autojump_clock``, so virtual time shows
exactly how long it backed off. Connections are replaced (``_open``) by fakes
that answer from a script, so everything but the socket code runs: the
drivers, the shared policy, server selection, events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

import tenantkv
from tenantkv import errors
from tenantkv.client.core import Call, ClientCore
from tenantkv.client.servers import parse_address, resolve_addresses
from tenantkv.protocol import Response

OVERLOAD = errors.Throttled("over").to_wire()


def rec(value: bytes) -> dict[str, Any]:
    """A get result as the server sends it."""
    return {"value": value, "cas": 1, "flags": 0, "expiry_ms": 0}


def fixed(j: float) -> Callable[[], float]:
    return lambda: j


@dataclass
class Cluster:
    """Scripted servers. ``script(server, method, params, n)`` returns a result or an
    error map (a dict with ``codeName``); ``n`` counts that method's requests from 1."""

    script: Callable[[int, str, dict[str, Any], int], Any]
    requests: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    hellos: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    refuse: set[int] = field(default_factory=set)
    latency: float = 0.0
    count: dict[str, int] = field(default_factory=dict)

    def open(self, index: int, hello: Call[Any]) -> None:
        if index in self.refuse:
            raise errors.ConnectionClosed(f"cannot connect to server {index}")
        self.hellos.append((index, hello.params))

    def answer(self, index: int, call: Call[Any], params: dict[str, Any]) -> Any:
        self.requests.append((index, call.method, params))
        n = self.count[call.method] = self.count.get(call.method, 0) + 1
        out = self.script(index, call.method, params, n)
        if isinstance(out, dict) and "codeName" in out:
            return ClientCore.outcome(Response(1, out, None), call)
        return ClientCore.outcome(Response(1, None, out), call)

    def sent(self, method: str) -> list[tuple[int, dict[str, Any]]]:
        return [(i, p) for i, m, p in self.requests if m == method]


def always(result: Any) -> Callable[..., Any]:
    return lambda i, m, p, n: result


def fail_first(k: int, error: dict[str, Any] = OVERLOAD, ok: Any = None) -> Callable[..., Any]:
    return lambda i, m, p, n: error if n <= k else ok


# -- the blocking client on a fake clock ------------------------------------------------


class _FakeConn:
    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.closed = False
        self.info = {"server": "fake", "index": index}
        self.core = ClientCore()

    def roundtrip(self, call: Call[Any], params: dict[str, Any], deadline: float | None) -> Any:
        return self.cluster.answer(self.index, call, params)

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


class FakeClient(tenantkv.Client):
    def __init__(self, cluster: Cluster, **kw: Any) -> None:
        self.cluster = cluster
        self.now = 0.0
        self.slept: list[float] = []
        kw.setdefault("retry_policy", tenantkv.RetryPolicy(random=fixed(1.0)))
        super().__init__(user="u", password="p", **kw)

    def _open(self, index: int) -> Any:
        self.cluster.open(index, self._hello_call())
        return _FakeConn(self.cluster, index)

    def _sleep(self, secs: float) -> None:  # type: ignore[override]
        self.slept.append(secs)
        self.now += secs

    def _clock(self) -> float:  # type: ignore[override]
        return self.now


def test_sync_always_overloaded_gives_six_attempts_and_both_labels() -> None:
    log = tenantkv.CommandEventLog()
    c = FakeClient(Cluster(always(OVERLOAD)), event_listeners=[log])
    with pytest.raises(errors.Throttled) as info:
        c.get("k")
    assert info.value.labels == ("SystemOverloadedError", "RetryableError")
    assert len(c.cluster.sent("get")) == 6
    assert c.slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    started = log.of(tenantkv.CommandStartedEvent)
    assert [e.attempt for e in started] == [1, 2, 3, 4, 5, 6]
    assert len(log.of(tenantkv.CommandFailedEvent)) == 6


def test_sync_max_overload_retries_one_gives_two_attempts() -> None:
    c = FakeClient(Cluster(always(OVERLOAD)), retry_policy=None, max_overload_retries=1)
    c._sleep = lambda s: None  # type: ignore[method-assign]
    with pytest.raises(errors.Throttled):
        c.get("k")
    assert len(c.cluster.sent("get")) == 2


def test_sync_retry_writes_off_tries_a_write_once_but_retries_reads() -> None:
    policy = tenantkv.RetryPolicy(retry_writes=False, random=fixed(0))
    c = FakeClient(Cluster(fail_first(1, ok={"cas": 7})), retry_policy=policy)
    with pytest.raises(errors.Throttled):
        c.set("k", b"v")
    assert len(c.cluster.sent("set")) == 1
    assert c.set("k", b"v") == 7  # the script's one failure is spent
    c.cluster.script = lambda i, m, p, n: OVERLOAD if m == "get" and n == 1 else None
    assert c.get("k") is None and len(c.cluster.sent("get")) == 2


def test_sync_generic_command_needs_both_retry_settings() -> None:
    c = FakeClient(Cluster(fail_first(1, ok="pong")))
    assert c.command("ping") == "pong" and len(c.cluster.requests) == 2
    off = tenantkv.RetryPolicy(retry_reads=False)
    c = FakeClient(Cluster(fail_first(1, ok="pong")), retry_policy=off)
    with pytest.raises(errors.Throttled):
        c.command("ping")


def test_sync_jitter_zero_never_sleeps_and_retry_after_stretches() -> None:
    c = FakeClient(Cluster(always(OVERLOAD)), retry_policy=tenantkv.RetryPolicy(random=fixed(0)))
    with pytest.raises(errors.Throttled):
        c.get("k")
    assert c.slept == []  # zero-length backoffs are not slept at all
    hinted = errors.Throttled("over", retry_after_ms=300).to_wire()
    c = FakeClient(Cluster(always(hinted)), retry_policy=tenantkv.RetryPolicy(random=fixed(0)))
    with pytest.raises(errors.Throttled):
        c.get("k")
    assert c.slept == pytest.approx([0.3] * 5)


def test_sync_non_overload_error_is_raised_at_once() -> None:
    c = FakeClient(Cluster(always(errors.KeyNotFound("no").to_wire())))
    with pytest.raises(errors.KeyNotFound):
        c.touch("k", 1)
    assert len(c.cluster.requests) == 1 and c.slept == []


def test_sync_adaptive_bucket_limits_retries_and_is_refilled() -> None:
    bucket = tenantkv.RetryTokenBucket(tokens=2)
    policy = tenantkv.RetryPolicy(adaptive_retries=True, token_bucket=bucket, random=fixed(0))
    c = FakeClient(Cluster(always(OVERLOAD)), retry_policy=policy)
    with pytest.raises(errors.Throttled):
        c.get("k")
    assert len(c.cluster.requests) == 3 and bucket.tokens == 0
    c.cluster.script = always(rec(b"v"))
    for _ in range(10):
        c.get("k")
    assert bucket.tokens == pytest.approx(1.0)


def test_sync_timeout_is_sent_and_bounds_the_retries() -> None:
    c = FakeClient(Cluster(always(OVERLOAD)), timeout=1.0)
    with pytest.raises(errors.Throttled):
        c.get("k")
    assert [p["timeout_ms"] for _, p in c.cluster.sent("get")] == [1000, 900, 700, 300]
    assert c.slept == pytest.approx([0.1, 0.2, 0.4])
    c.cluster.requests.clear()
    with pytest.raises(errors.Throttled):
        c.with_timeout(0.25).get("k")
    assert [p["timeout_ms"] for _, p in c.cluster.sent("get")] == [250, 150]
    c.cluster.requests.clear()
    c.timeout = None
    c.cluster.script = always(None)
    c.get("k")
    assert "timeout_ms" not in c.cluster.requests[0][2]


def test_sync_hello_is_not_given_a_deadline_and_says_backpressure() -> None:
    c = FakeClient(Cluster(always(None)), bucket="b")
    ((index, hello),) = c.cluster.hellos
    assert index == 0 and hello["backpressure"] is True and hello["bucket"] == "b"
    assert "timeout_ms" not in hello


def test_sync_events_pair_up_across_mixed_outcomes() -> None:
    log = tenantkv.CommandEventLog()
    script = lambda i, m, p, n: OVERLOAD if n % 3 else (None if m == "get" else True)  # noqa: E731
    c = FakeClient(Cluster(script), event_listeners=[log])
    c.get("a")
    c.delete("b")
    with pytest.raises(errors.KeyNotFound):
        c.cluster.script = always(errors.KeyNotFound("x").to_wire())
        c.touch("c", 1)
    events = log.events
    assert len(events) == 2 * (3 + 3 + 1)
    for started, end in zip(events[::2], events[1::2], strict=True):
        assert isinstance(started, tenantkv.CommandStartedEvent)
        assert not isinstance(end, tenantkv.CommandStartedEvent)
        assert (started.operation_id, started.attempt) == (end.operation_id, end.attempt)
        assert started.address == end.address == ("127.0.0.1", 7207)
    assert [type(e).__name__ for e in events[:6]] == [
        "CommandStartedEvent",
        "CommandFailedEvent",
        "CommandStartedEvent",
        "CommandFailedEvent",
        "CommandStartedEvent",
        "CommandSucceededEvent",
    ]
    ids = {e.operation_id for e in events}
    assert len(ids) == 3


def test_sync_pipeline_is_one_attempt_per_command_with_events() -> None:
    log = tenantkv.CommandEventLog()
    script = lambda i, m, p, n: OVERLOAD if m == "set" else rec(b"v")  # noqa: E731
    c = FakeClient(Cluster(script), event_listeners=[log])

    # The fake connection answers roundtrips; a pipeline needs send/wait: give it those.
    class PipeConn(_FakeConn):
        def __init__(self, conn: _FakeConn) -> None:
            super().__init__(conn.cluster, conn.index)
            self.pending: dict[int, Response] = {}

        def send(self, data: bytes) -> None:
            for _, msgid, method, params in _decode(data):
                call = Call(method, params, lambda r: r)  # results are parsed by execute()
                try:
                    res = self.cluster.answer(self.index, call, params)
                    self.pending[msgid] = Response(msgid, None, res)
                except errors.ServerError as exc:
                    self.pending[msgid] = Response(msgid, exc.to_wire(), None)

        def wait(self, msgid: int, deadline: float | None) -> Response:
            return self.pending.pop(msgid)

    c._conns[0] = PipeConn(c._conns[0])  # type: ignore[arg-type]
    p = c.pipeline(raise_on_error=False)
    p.get("a")
    p.set("b", b"x")
    res = p.execute(timeout=2)
    assert res[0] == b"v" and isinstance(res[1], errors.Throttled)
    assert len(c.cluster.requests) == 2 and c.slept == []
    assert all(params["timeout_ms"] == 2000 for _, _, params in c.cluster.requests)
    assert [e.attempt for e in log.events] == [1, 1, 1, 1]
    kinds = [type(e).__name__ for e in log.events]
    assert kinds == [
        "CommandStartedEvent",
        "CommandStartedEvent",
        "CommandSucceededEvent",
        "CommandFailedEvent",
    ]
    assert log.of(tenantkv.CommandFailedEvent)[0].will_retry is False


def _decode(data: bytes) -> list[list[Any]]:
    import msgpack

    u = msgpack.Unpacker(raw=False)
    u.feed(data)
    return list(u)


# -- several servers ---------------------------------------------------------------------


def test_sync_overloaded_read_moves_to_another_server_lazily() -> None:
    cluster = Cluster(lambda i, m, p, n: OVERLOAD if i == 0 else rec(f"v{i}".encode()))
    c = FakeClient(cluster, addresses="h0:1,h1:2,h2:3", bucket="b")
    assert [i for i, _ in cluster.hellos] == [0]  # only the home server at start
    assert c.get("k") == b"v1"
    assert [i for i, _ in cluster.hellos] == [0, 1]
    assert all(h["bucket"] == "b" for _, h in cluster.hellos)
    assert (c.host, c.port) == ("h0", 1)
    with pytest.raises(errors.Throttled):
        c.server_status()  # admin: stays on the home server
    assert {i for i, m, _ in cluster.requests if m == "server_status"} == {0}


def test_sync_an_unreachable_server_is_skipped() -> None:
    cluster = Cluster(lambda i, m, p, n: OVERLOAD if i == 0 else rec(f"v{i}".encode()))
    cluster.refuse.add(1)
    c = FakeClient(cluster, addresses=[("h0", 1), ("h1", 2), ("h2", 3)])
    assert c.get("k") == b"v2"
    assert c.get("k") == b"v2"  # marked down: not tried again at once
    assert [i for i, _ in cluster.hellos] == [0, 2]


def test_sync_home_is_the_first_server_that_accepts() -> None:
    cluster = Cluster(always(b"v"))
    cluster.refuse.add(0)
    c = FakeClient(cluster, addresses="h0:1,h1:2")
    assert (c.host, c.port) == ("h1", 2) and c.server_info["index"] == 1
    cluster.refuse.add(1)
    with pytest.raises(errors.ConnectionClosed):
        FakeClient(cluster, addresses="h0:1,h1:2")


def test_sync_select_bucket_is_remembered_for_other_servers() -> None:
    cluster = Cluster(lambda i, m, p, n: OVERLOAD if i == 0 and m == "get" else None)
    c = FakeClient(cluster, addresses="h0:1,h1:2", bucket="a")
    c.get("k")
    other = c._conns[1]
    c.select_bucket("b")
    assert other is not None and other.closed and c._conns[1] is None
    c.get("k")
    assert [h.get("bucket") for _, h in cluster.hellos] == ["a", "a", "b"]


def test_address_forms() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h") == ("h", 7207)
    assert parse_address("[::1]:9") == ("::1", 9)
    assert parse_address("[::1]") == ("::1", 7207)
    for bad in ["", "h:x", "h:0", ":5", "[::1", "[::1]x"]:
        with pytest.raises(ValueError):
            parse_address(bad)
    assert resolve_addresses(None, None, None) == [("127.0.0.1", 7207)]
    assert resolve_addresses("h", 5, None) == [("h", 5)]
    assert resolve_addresses(None, None, "a:1, b:2,a:1") == [("a", 1), ("b", 2)]
    assert resolve_addresses(None, None, [("a", 1), "b:2"]) == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="not both"):
        resolve_addresses("h", None, "a:1")
    with pytest.raises(ValueError, match="empty"):
        resolve_addresses(None, None, [])


def test_client_refuses_a_policy_and_separate_settings_together() -> None:
    with pytest.raises(ValueError, match="adaptive_retries"):
        FakeClient(Cluster(always(None)), adaptive_retries=True)


# -- the Trio client on autojump time ------------------------------------------------------


class _FakeAsyncConn:
    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.failure: errors.TenantKVError | None = None
        self.info = {"server": "fake", "index": index}

    async def roundtrip(
        self, call: Call[Any], params: dict[str, Any], deadline: float | None
    ) -> Any:
        with trio.move_on_at(deadline if deadline is not None else float("inf")):
            await trio.sleep(self.cluster.latency)
            return self.cluster.answer(self.index, call, params)
        raise errors.ClientTimeout("no response within the timeout", command=call.method)

    async def aclose(self) -> None:
        self.failure = errors.ConnectionClosed("closed")


class FakeAsyncClient(tenantkv.AsyncClient):
    def __init__(self, cluster: Cluster, **kw: Any) -> None:
        self.cluster = cluster
        kw.setdefault("retry_policy", tenantkv.RetryPolicy(random=fixed(1.0)))
        super().__init__(user="u", password="p", **kw)

    async def _open(self, index: int) -> Any:
        self.cluster.open(index, self._hello_call())
        return _FakeAsyncConn(self.cluster, index)


async def test_async_always_overloaded_backs_off_exactly(autojump_clock: Any) -> None:
    log = tenantkv.CommandEventLog()
    async with FakeAsyncClient(Cluster(always(OVERLOAD)), event_listeners=[log]) as c:
        start = trio.current_time()
        with pytest.raises(errors.Throttled) as info:
            await c.get("k")
        assert trio.current_time() - start == pytest.approx(0.1 + 0.2 + 0.4 + 0.8 + 1.6)
    assert info.value.labels == errors.OVERLOAD_LABELS
    assert len(c.cluster.sent("get")) == 6
    assert [e.attempt for e in log.of(tenantkv.CommandStartedEvent)] == [1, 2, 3, 4, 5, 6]


async def test_async_jitter_zero_takes_no_time_and_retries_writes_unless_off(
    autojump_clock: Any,
) -> None:
    policy = tenantkv.RetryPolicy(random=fixed(0))
    async with FakeAsyncClient(Cluster(fail_first(2, ok={"cas": 1})), retry_policy=policy) as c:
        start = trio.current_time()
        assert await c.set("k", b"v") == 1
        assert trio.current_time() == start and len(c.cluster.requests) == 3
    policy = tenantkv.RetryPolicy(retry_writes=False)
    async with FakeAsyncClient(Cluster(fail_first(2, ok={"cas": 1})), retry_policy=policy) as c:
        with pytest.raises(errors.Throttled):
            await c.incr("n")
        assert len(c.cluster.requests) == 1


async def test_async_deadline_is_sent_and_stops_retries(autojump_clock: Any) -> None:
    cluster = Cluster(always(errors.Throttled("x", retry_after_ms=400).to_wire()))
    cluster.latency = 0.05
    async with FakeAsyncClient(cluster, timeout=1.0) as c:
        start = trio.current_time()
        with pytest.raises(errors.Throttled):
            await c.get("k")
        # attempts at 0, 0.45, 0.9 (0.05 s each + 0.4 s backoff); a third backoff
        # would end at 1.35 s, past the 1 s deadline.
        assert trio.current_time() - start == pytest.approx(0.95)
    assert [p["timeout_ms"] for _, p in cluster.sent("get")] == [1000, 550, 100]


async def test_async_client_timeout_is_not_retried(autojump_clock: Any) -> None:
    cluster = Cluster(always(None))
    cluster.latency = 5.0
    async with FakeAsyncClient(cluster) as c:
        with pytest.raises(errors.ClientTimeout):
            await c.with_timeout(0.5).get("k")
    assert cluster.requests == []


async def test_async_adaptive_bucket_is_shared_by_concurrent_tasks(autojump_clock: Any) -> None:
    bucket = tenantkv.RetryTokenBucket(tokens=10)
    policy = tenantkv.RetryPolicy(adaptive_retries=True, token_bucket=bucket)
    cluster = Cluster(always(OVERLOAD))
    cluster.latency = 0.001
    async with FakeAsyncClient(cluster, retry_policy=policy) as c:

        async def one() -> None:
            with pytest.raises(errors.Throttled):
                await c.get("k")

        async with trio.open_nursery() as n:
            for _ in range(8):
                n.start_soon(one)
    assert len(cluster.requests) == 8 + 10 and bucket.tokens == 0


async def test_async_events_pair_even_when_cancelled(autojump_clock: Any) -> None:
    log = tenantkv.CommandEventLog()
    cluster = Cluster(always(OVERLOAD))
    cluster.latency = 0.3
    async with FakeAsyncClient(cluster, event_listeners=[log]) as c:
        with trio.move_on_after(1.0):
            await c.get("k")
    kinds = [type(e).__name__ for e in log.events]
    assert kinds.count("CommandStartedEvent") == len(kinds) // 2
    last = log.events[-1]
    assert isinstance(last, tenantkv.CommandFailedEvent)
    assert last.code_name == "Cancelled" and last.will_retry is False


async def test_async_retry_moves_to_another_server(autojump_clock: Any) -> None:
    cluster = Cluster(lambda i, m, p, n: OVERLOAD if i == 0 else rec(b"x"))
    async with FakeAsyncClient(cluster, addresses="a:1,b:2") as c:
        assert [i for i, _ in cluster.hellos] == [0]
        assert await c.get("k") == b"x"
        assert [i for i, _, _ in cluster.requests] == [0, 1]
        assert [i for i, _ in cluster.hellos] == [0, 1]
