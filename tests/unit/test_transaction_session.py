"""Transactions on the one connection path (server/transaction.py hooked into the
chunk executor), on both doors, through memory streams: the same queue, the
same errors, the same bounds and the same charges whichever door a client
uses."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from tenantkv import protocol
from tenantkv.server import transaction
from tenantkv.server.node import Node
from tests.e2e.test_fuzz_resp import replies
from tests.unit.test_session import DOORS, TIMEOUT, hello_session, node

__all__ = ["node"]

#: a command in both forms: (RESP argv, MessagePack method and params)
Cmd = tuple[tuple[bytes, ...], str, dict[str, Any]]


def cmd(*argv: bytes | str) -> Cmd:
    """The command ``argv`` (Redis form) and its MessagePack form."""
    args = tuple(a.encode() if isinstance(a, str) else a for a in argv)
    name = args[0].decode().lower()
    rest = list(args[1:])
    params: dict[str, Any] = {}
    if name == "set" and len(rest) == 2:
        params = {"key": rest[0], "value": rest[1]}
    elif name in ("set", "get", "incr", "exists"):
        params = {"key": rest[0]} if rest else {}
    elif name == "watch":
        params = {"keys": rest}
    elif name == "nosuch":
        params = {}
    return args, name, params


class Talk:
    """One client of either door: sends commands, reads each reply as a plain value
    (an error as ("error", text))."""

    def __init__(self, peer: Any, door: str) -> None:
        self.peer, self.door = peer, door
        self.buf = b""
        self.msgid = 100

    async def __call__(self, *cmds: Cmd) -> list[Any]:
        if self.door == "msgpack":
            reqs = []
            for _, method, params in cmds:
                self.msgid += 1
                reqs.append((self.msgid, method, params))
            await self.peer.send(*reqs)
            return [self._msgpack(r) for r in await self.peer.responses(len(cmds))]
        data = b"".join(
            b"*%d\r\n" % len(a) + b"".join(b"$%d\r\n%b\r\n" % (len(x), x) for x in a)
            for a, _, _ in cmds
        )
        await self.peer.stream.send_all(data)
        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    got = replies(self.buf)
                except (ValueError, IndexError, AssertionError):
                    got = []
                if len(got) >= len(cmds):
                    self.buf = b"".join(got[len(cmds) :])
                    return [_resp_value(r) for r in got[: len(cmds)]]
                self.buf += await self.peer.stream.receive_some(1 << 20)

    @staticmethod
    def _msgpack(r: protocol.Response) -> Any:
        if r.error is not None:
            return ("error", r.error["errmsg"])
        res = r.result
        if isinstance(res, list):  # exec: each {result} or {error}
            return [
                ("error", x["error"]["errmsg"]) if "error" in x else _plain(x["result"])
                for x in res
            ]
        return _plain(res)


def _plain(v: Any) -> Any:
    """A MessagePack result as the RESP door's plain value."""
    if v is True or v == "QUEUED":
        return "OK" if v is True else "QUEUED"
    if isinstance(v, dict) and "value" in v:
        return v["value"]
    if isinstance(v, dict) and "cas" in v:
        return "OK"
    return v


def _resp_value(r: bytes) -> Any:
    kind, body = r[:1], r[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        return ("error", body.decode().split(" ", 1)[1] if b" " in body else body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        return None if body == b"-1" else r[r.index(b"\r\n") + 2 : -2]
    if r in (b"*-1\r\n", b"_\r\n"):
        return None
    if kind == b"*":
        inner = replies(r[r.index(b"\r\n") + 2 :])
        return [_resp_value(x) for x in inner]
    raise AssertionError(r)


@pytest.mark.parametrize("door", DOORS)
async def test_exec_runs_the_queue_in_order_reads_seeing_its_writes(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        b = Talk(await hello_session(node, nursery, door), door)
        got = await a(cmd("MULTI"), cmd("SET", "k", "1"), cmd("INCR", "k"), cmd("GET", "k"))
        assert got == ["OK", "QUEUED", "QUEUED", "QUEUED"]
        assert await b(cmd("GET", "k")) == [None]  # queued, not run
        done = (await a(cmd("EXEC")))[0]
        assert done == ["OK", 2, b"2"]
        assert await b(cmd("GET", "k")) == [b"2"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_a_queue_time_error_aborts_and_a_runtime_error_does_not(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        got = await a(cmd("MULTI"), cmd("SET", "x", "1"), cmd("SET", "x"), cmd("EXEC"))
        assert got[:2] == ["OK", "QUEUED"] and got[2][0] == "error"
        assert got[3] == ("error", transaction.EXECABORT.split(" ", 1)[1]) or (
            got[3][0] == "error" and "Transaction discarded" in got[3][1]
        )
        assert await a(cmd("GET", "x")) == [None]
        got = await a(
            cmd("SET", "t", "abc"),
            cmd("MULTI"),
            cmd("INCR", "t"),
            cmd("SET", "y", "2"),
            cmd("EXEC"),
        )
        runtime_error, ok = got[4]
        assert runtime_error[0] == "error" and "integer" in runtime_error[1]
        assert ok == "OK" and await a(cmd("GET", "y")) == [b"2"]
        assert (await a(cmd("EXEC")))[0] == ("error", "EXEC without MULTI")
        assert (await a(cmd("DISCARD")))[0] == ("error", "DISCARD without MULTI")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_watch_broken_by_another_connection_runs_nothing(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        b = Talk(await hello_session(node, nursery, door), door)
        await a(cmd("SET", "w", "1"), cmd("WATCH", "w"))
        await b(cmd("SET", "w", "2"))  # the other connection (the other door's alike)
        got = await a(cmd("MULTI"), cmd("SET", "z", "1"), cmd("EXEC"))
        assert got[2] is None and await a(cmd("GET", "z")) == [None]
        got = await a(cmd("WATCH", "w"), cmd("MULTI"), cmd("SET", "z", "1"), cmd("EXEC"))
        assert got[3] == ["OK"]  # unchanged: it runs (and EXEC unwatched)
        assert (await a(cmd("MULTI"), cmd("WATCH", "w")))[1][0] == "error"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_bounds_abort_and_nothing_more_is_kept(
    node: Node, mock_clock: trio.testing.MockClock, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transaction, "MAX_TRANSACTION_COMMANDS", 3)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        a = Talk(peer, door)
        sets = [cmd("SET", f"k{i}", "v") for i in range(6)]
        got = await a(cmd("MULTI"), *sets)
        assert got[1:4] == ["QUEUED"] * 3 and got[4][0] == "error"
        assert got[5] == "QUEUED"  # checked and answered, kept nowhere
        (ex,) = [c for c in _executors(node) if c.in_multi]
        assert ex.txn.queue == [] and ex.txn.nbytes == 0
        assert (await a(cmd("EXEC")))[0][0] == "error"
        assert await a(cmd("GET", "k0")) == [None]
        nursery.cancel_scope.cancel()


def _executors(node: Node) -> list[Any]:
    import gc

    from tenantkv.server.executor import Executor

    return [o for o in gc.get_objects() if isinstance(o, Executor) and o.node is node]


@pytest.mark.parametrize("door", DOORS)
async def test_exec_is_charged_what_its_commands_cost_alone(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    counters = node.throttle._buckets["b"]
    big = "v" * 10_000
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        ru0, wu0 = counters.ru_total, counters.wu_total
        await a(cmd("SET", "p", big), cmd("INCR", "n"), cmd("GET", "p"))
        alone = counters.ru_total - ru0, counters.wu_total - wu0
        ru0, wu0 = counters.ru_total, counters.wu_total
        await a(cmd("MULTI"), cmd("SET", "q", big), cmd("INCR", "m"), cmd("GET", "q"), cmd("EXEC"))
        assert (counters.ru_total - ru0, counters.wu_total - wu0) == alone
        assert alone[0] >= 3 and alone[1] >= 3  # (10 KB: 3 read units, 3 write units)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_a_command_the_rate_limiter_refuses_fails_the_transaction(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """Refused by the request rate limiter inside MULTI, a command is not queued: the
    transaction must not run without it; a refused EXEC ends the transaction, so
    the client's next commands are not queued unseen."""
    from tests.unit.test_session import limit_requests_to_five_tokens

    await limit_requests_to_five_tokens(node, mock_clock)
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        got = await a(
            cmd("MULTI"),
            *(cmd("SET", f"r{i}", "v") for i in range(5)),  # the 5th and later: refused
            cmd("EXEC"),
        )
        assert got[:5] == ["OK"] + ["QUEUED"] * 4
        assert all(g[0] == "error" for g in got[5:])
        mock_clock.jump(10)  # 5 tokens again
        got = await a(cmd("SET", "after", "1"), cmd("GET", "r0"), cmd("GET", "after"))
        assert got == ["OK", None, b"1"]  # out of MULTI; nothing of it ran
        got = await a(cmd("MULTI"), cmd("SET", "r1", "v"), cmd("EXEC"))  # 2 tokens left
        assert got[:2] == ["OK", "QUEUED"] and got[2][0] == "error"
        mock_clock.jump(10)
        assert (await a(cmd("EXEC")))[0] == ("error", "EXEC without MULTI")
        assert await a(cmd("GET", "r1")) == [None]
        nursery.cancel_scope.cancel()


async def test_msgpack_ping_and_whoami_answer_at_once_inside_multi(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send(
            (1, "multi", {}),
            (2, "ping", {}),
            (3, "set", {"key": b"k", "value": b"v"}),
            (4, "whoami", {}),
            (5, "select_bucket", {"bucket": "b"}),
            (6, "exec", {}),
        )
        got = await peer.responses(6)
        assert got[1].result == "pong" and got[2].result == "QUEUED"
        assert got[3].result["bucket"] == "b"
        assert got[4].error["errmsg"] == transaction.NOT_IN_TRANSACTION
        assert "EXECABORT" in got[5].error["errmsg"]
        nursery.cancel_scope.cancel()


class Spent:
    """What the tenant throttle spent of bucket ``b``'s allowance: every charge
    (less what it settles of a reservation), reservation and refund, summed."""

    def __init__(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        self.units = 0
        throttle = node.throttle
        charge, reserve, refund = throttle.charge, throttle.reserve, throttle.refund
        weight = throttle._write_weight

        def spy_charge(bucket: str, ru: int, wu: int, **kw: Any) -> None:
            if bucket == "b":
                cost = max(ru + weight * wu, kw.get("min_cost", 0))
                self.units += cost - kw.get("reserved", 0)
            charge(bucket, ru, wu, **kw)

        def spy_reserve(bucket: str, cost: int, **kw: Any) -> int:
            got = reserve(bucket, cost, **kw)
            self.units += got if bucket == "b" else 0
            return got

        def spy_refund(bucket: str, units: int) -> None:
            self.units -= units if bucket == "b" else 0
            refund(bucket, units)

        monkeypatch.setattr(throttle, "charge", spy_charge)
        monkeypatch.setattr(throttle, "reserve", spy_reserve)
        monkeypatch.setattr(throttle, "refund", spy_refund)


@pytest.mark.parametrize("door", DOORS)
async def test_queued_commands_are_charged_as_queued_even_when_never_run(
    node: Node, mock_clock: trio.testing.MockClock, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a queued command is work: each costs at least a read's floor as it
    is queued, so MULTI + commands + DISCARD (or a disconnect) is not free."""
    spent = Spent(node, monkeypatch)
    floor = node.config.min_op_units
    sets = [cmd("SET", f"k{i}", "v" * 100) for i in range(20)]
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        a = Talk(peer, door)
        got = await a(cmd("MULTI"), *sets, cmd("DISCARD"))
        assert got == ["OK"] + ["QUEUED"] * 20 + ["OK"]
        assert spent.units == 22 * floor  # MULTI, 20 queued, DISCARD
        got = await a(cmd("MULTI"), *sets)
        assert spent.units == 43 * floor
        assert node.receive_buffers.buffered >= 20 * 102  # the queue's bytes count
        await peer.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()  # (the connection closed)
        assert node.receive_buffers.buffered == 0  # its queue was let go
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_exec_charges_what_its_commands_cost_less_what_queueing_charged(
    node: Node, mock_clock: trio.testing.MockClock, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spent = Spent(node, monkeypatch)
    floor = node.config.min_op_units
    big = "v" * 10_000
    work = [cmd("SET", "p", big), cmd("INCR", "n"), cmd("GET", "p"), cmd("GET", "none")]
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        await a(*work)
        alone = spent.units
        assert alone > 4 * floor  # (10 KB: more than floors)
        got = await a(cmd("MULTI"), *work, cmd("EXEC"))
        assert got[-1][0] == "OK" and got[-1][2] == b"2"[:0] + big.encode()
        assert spent.units - alone == alone + 2 * floor  # + MULTI's and EXEC's floors
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_queueing_past_the_node_wide_cap_aborts_the_transaction(
    node: Node, mock_clock: trio.testing.MockClock, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued bytes count against max_receive_buffer_bytes with everything else
    clients make the server hold: past it a command is refused (overload) and
    the transaction aborts, its bytes let go."""
    buffers = node.receive_buffers
    monkeypatch.setattr(buffers, "capacity", 50_000)
    monkeypatch.setattr(buffers, "user_capacity", 50_000)
    value = "v" * 20_000
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        b = Talk(await hello_session(node, nursery, door), door)
        assert await b(cmd("MULTI"), cmd("SET", "b1", value)) == ["OK", "QUEUED"]
        assert await a(cmd("MULTI")) == ["OK"]
        for i in range(2):  # (one at a time: each chunk settles what it holds)
            assert await a(cmd("SET", f"a{i}", value)) == ["QUEUED"]
        assert buffers.buffered >= 60_000  # over the cap
        got = (await b(cmd("SET", "b2", value)))[0]
        assert got[0] == "error" and "max_receive_buffer_bytes" in got[1]
        got = (await b(cmd("EXEC")))[0]
        assert got[0] == "error" and "discarded" in got[1]  # EXECABORT
        assert 40_000 <= buffers.buffered < 50_000  # b's queue was let go
        got = await a(cmd("EXEC"), cmd("GET", "a1"), cmd("GET", "b1"))
        assert got == [["OK", "OK"], value.encode(), None]
        assert buffers.buffered == 0
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_exec_refused_by_the_throttle_keeps_the_transaction_for_a_retry(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """EXEC refused by admission (an overload error: nothing ran) leaves the
    transaction queued: the same EXEC, retried, runs it."""
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door, nonblocking_throttle=True), door)
        node.throttle.set_bucket("b", hard_limit=200)  # 20 units a 100 ms slice
        # A write costing more than the bucket may owe is admitted only when it
        # owes nothing: the floors of MULTI and of the queued SET are owed.
        value = "v" * int(1024 * node.throttle.max_request_units("b") * 2)
        mock_clock.jump(10)
        got = await a(cmd("MULTI"), cmd("SET", "t", value), cmd("SET", "s", "1"), cmd("EXEC"))
        got = got[:2] + got[3:]
        assert got[:2] == ["OK", "QUEUED"] and got[2][0] == "error"
        assert "Throttled" in got[2][1] or "allowance" in got[2][1], got[2]
        node.throttle.set_bucket("b", hard_limit=None)  # (unlimited: it is admitted now)
        mock_clock.jump(10)
        assert await a(cmd("EXEC")) == [["OK", "OK"]]
        assert await a(cmd("GET", "s")) == [b"1"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("door", DOORS)
async def test_a_watched_absent_key_created_and_deleted_fails_exec(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """Absent at WATCH, absent again at EXEC, written in between: Redis flags any
    write, so EXEC must fail although the key has no CAS either time."""
    delete: Cmd = ((b"DEL", b"w"), "delete", {"key": b"w"})
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, door), door)
        b = Talk(await hello_session(node, nursery, door), door)
        assert await a(cmd("WATCH", "w")) == ["OK"]
        await b(cmd("SET", "w", "1"), delete)
        got = await a(cmd("MULTI"), cmd("SET", "z", "1"), cmd("EXEC"))
        assert got[2] is None and await a(cmd("GET", "z")) == [None]
        # Nothing deleted meanwhile: it runs (an empty queue alike).
        got = await a(cmd("WATCH", "w"), cmd("MULTI"), cmd("SET", "z", "1"), cmd("EXEC"))
        assert got[3] == ["OK"]
        got = await a(cmd("WATCH", "w"), cmd("MULTI"), cmd("EXEC"))
        assert got[2] == []
        await a(cmd("WATCH", "w"))
        await b(cmd("SET", "w", "1"), delete)
        assert (await a(cmd("MULTI"), cmd("EXEC")))[1] is None  # (an empty queue)
        # Created since the watch (and still there): its CAS differs.
        await a(cmd("WATCH", "new"))
        await b(cmd("SET", "new", "1"))
        assert (await a(cmd("MULTI"), cmd("SET", "z", "2"), cmd("EXEC")))[2] is None
        nursery.cancel_scope.cancel()


async def test_resp_connection_commands_are_queued_and_answered_in_exec(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """As Redis 7.0 does: TIME, CLIENT SETNAME/GETNAME, INFO, ECHO inside MULTI are
    answered QUEUED and run in EXEC's array, in place; SELECT (it picks what the
    queued commands were checked against) is refused and aborts the transaction."""
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, "resp"), "resp")
        got = await a(
            cmd("MULTI"),
            cmd("SET", "k", "1"),
            cmd("CLIENT", "SETNAME", "txn"),
            cmd("TIME"),
            cmd("CLIENT", "GETNAME"),
            cmd("INFO", "server"),
            cmd("ECHO", "e"),
            cmd("GET", "k"),
            cmd("CLIENT", "NOSUCH"),
            cmd("EXEC"),
        )
        assert got[:9] == ["OK"] + ["QUEUED"] * 8
        done = got[9]
        assert done[0] == "OK" and done[1] == "OK"
        assert isinstance(done[2], list) and len(done[2]) == 2 and int(done[2][0]) > 0
        assert done[3] == b"txn" and b"redis_version" in done[4]
        assert done[5:7] == [b"e", b"1"] and done[7][0] == "error"
        assert await a(cmd("CLIENT", "GETNAME")) == [b"txn"]
        got = await a(cmd("MULTI"), cmd("SELECT", "b"), cmd("SET", "k", "2"), cmd("EXEC"))
        assert got[1] == ("error", transaction.NOT_IN_TRANSACTION)
        assert got[3][0] == "error" and "discarded" in got[3][1]
        nursery.cancel_scope.cancel()


async def test_resp_reset_outside_multi_forgets_the_watched_keys(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        a = Talk(await hello_session(node, nursery, "resp"), "resp")
        b = Talk(await hello_session(node, nursery, "resp"), "resp")
        assert await a(cmd("WATCH", "w"), cmd("RESET")) == ["OK", "RESET"]
        await b(cmd("SET", "w", "1"))
        got = await a(cmd("MULTI"), cmd("SET", "z", "1"), cmd("EXEC"))
        assert got[2] == ["OK"]  # no longer watched: it runs
        nursery.cancel_scope.cancel()
