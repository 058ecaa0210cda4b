"""The RESP door over Trio memory streams: what each request may cost and hold.

Every request is bounded before it runs and pays for what it did: an MGET whose
values exceed what one reply may carry is refused up front as the MessagePack
mget is; a command naming too many keys costs the read floor per key it named,
and a tenant in debt that keeps sending refused commands waits as its reads
would; a pattern costs its compiling and the keys it examined; a client name
is bounded; an unexpected failure is logged at most once a second.

Tests that read what a bucket spent (``units_used``: the throttle's current
window) take the mock clock, so the window cannot roll over between readings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from typing import Any

import pytest
import trio
import trio.testing

from tenantkv.server import redis_commands, redis_scan
from tenantkv.server.commands import MAX_KEYS_PER_COMMAND
from tenantkv.server.connection import Connection
from tenantkv.server.doors import resp as resp_door
from tenantkv.server.doors.resp import RespDoor
from tenantkv.server.node import Node
from tenantkv.server.redis_connection import MAX_CLIENT_NAME_BYTES, MAX_CONFIG_PATTERNS
from tenantkv.storage.engine import KeyRange
from tests.e2e.test_fuzz_resp import replies
from tests.unit.test_session import hello_session, node, units_used

__all__ = ["node"]  # (the fixture, imported)

TIMEOUT = 10
_ids = itertools.count(10_000)


def encode(*argv: bytes) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)


class RespPeer:
    """The client end of a memory stream pair, speaking raw RESP."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = b""

    async def send(self, *commands: tuple[bytes, ...]) -> None:
        await self.stream.send_all(b"".join(encode(*c) for c in commands))

    async def replies(self, n: int) -> list[bytes]:
        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    got = replies(self.buf)
                except (ValueError, IndexError, AssertionError):
                    got = []  # (a reply cut short: read on)
                if len(got) >= n:
                    self.buf = b"".join(got[n:])
                    return got[:n]
                data = await self.stream.receive_some(1 << 20)
                assert data, f"connection closed after {got!r}"
                self.buf += data


async def resp_session(node: Node, nursery: trio.Nursery) -> RespPeer:
    """A RESP session authenticated as user ``u`` on bucket ``b``."""
    client, server = trio.testing.memory_stream_pair()
    conn_id = next(_ids)
    node.connection_table.admit(
        conn_id, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    session = Connection(node, server, "127.0.0.1:5555", conn_id, RespDoor())
    nursery.start_soon(session.run)
    peer = RespPeer(client)
    await peer.send((b"AUTH", b"u", b"pw"))
    assert await peer.replies(1) == [b"+OK\r\n"]
    return peer


def test_one_bound_on_keys_per_command_fits_the_decoder() -> None:
    """An MSET of the most keys a command may name decodes (2 arguments a key);
    the decoder refuses far longer commands before decoding an argument."""
    assert resp_door.MAX_ARGS >= 2 * MAX_KEYS_PER_COMMAND + 1
    assert redis_commands.MAX_MULTI_KEYS == MAX_KEYS_PER_COMMAND


async def test_an_mget_of_a_big_value_named_1000_times_is_refused_up_front(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """The issue's MGET: one 1 MiB key named 1,000 times built a 1,000 MiB reply.
    It is refused as the MessagePack mget is (the engine's check of the stored
    sizes), and costs the read floor for each key it named."""
    floor = node.config.min_op_units
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send((b"SET", b"big", bytes(1 << 20)))
        assert await peer.replies(1) == [b"+OK\r\n"]
        before = units_used(node)
        await peer.send((b"MGET", *[b"big"] * 1000))
        (got,) = await peer.replies(1)
        assert got.startswith(b"-ERR the values of these 1000 keys exceed"), got[:100]
        assert units_used(node) - before == 1000 * floor
        await peer.send((b"MGET", b"big", b"none"))
        (got,) = await peer.replies(1)
        assert got.startswith(b"*2\r\n$1048576\r\n")
        # EXISTS, STRLEN, TYPE, TTL read the record's header on a view (EXISTS of
        # the key named 1,000 times copied 1 GB), metered as the records read.
        before = units_used(node)
        await peer.send((b"EXISTS", *[b"big"] * 1000), (b"STRLEN", b"big"), (b"TYPE", b"big"))
        assert await peer.replies(3) == [b":1000\r\n", b":1048576\r\n", b"+string\r\n"]
        per_read = -(-(3 + (1 << 20) + 20) // node.config.read_unit_size)
        assert units_used(node) - before == 1002 * per_read
        nursery.cancel_scope.cancel()


async def test_too_many_keys_cost_a_floor_per_key_named_on_both_doors(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """A DEL (or MSET, EXISTS) naming more keys than a command may costs the read
    floor for each it named (a DEL of 100,000 keys cost one unit), and so does a
    MessagePack mget."""
    floor = node.config.min_op_units
    n = MAX_KEYS_PER_COMMAND + 500
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        for command, argv, named in (
            (b"DEL", [b"k%d" % i for i in range(n)], n),
            (b"EXISTS", [b"k%d" % i for i in range(n)], n),
            (b"MSET", [b"k%d" % (i // 2) for i in range(2 * n)], n),
        ):
            before = units_used(node)
            await peer.send((command, *argv))
            (got,) = await peer.replies(1)
            assert got == b"-ERR at most %d keys per command\r\n" % MAX_KEYS_PER_COMMAND
            assert units_used(node) - before == named * floor, command
        await peer.send((b"DEL", *[b"k"] * resp_door.MAX_ARGS))
        (got,) = await peer.replies(1)
        assert got.startswith(b"-ERR Protocol error: invalid multibulk length")
        msgpack = await hello_session(node, nursery)
        before = units_used(node)
        await msgpack.send((1, "mget", {"keys": [b"k"] * n}))
        (reply,) = await msgpack.responses(1)
        assert reply.error is not None and reply.error["codeName"] == "BadValue"
        assert units_used(node) - before == n * floor
        nursery.cancel_scope.cancel()


async def test_refused_commands_wait_for_the_buckets_allowance(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """A tenant over its allowance that keeps sending malformed or unknown commands
    is held as its reads are: the next is answered only once the debt is paid
    (each was decoded and answered at once, at any rate)."""
    node.throttle.set_bucket("b", reserved=10, hard_limit=10)
    node.throttle.max_wait_secs = 1000  # (past it a request is refused at once: TRYAGAIN;
    # 1,001 floors at 10 units/s are 100 s of debt, never forgiven)
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send((b"DEL", *[b"k%d" % i for i in range(MAX_KEYS_PER_COMMAND + 1)]))
        await peer.replies(1)  # 1,001 floors: its debt as deep as the throttle lets it
        await peer.send((b"NOSUCH",), (b"GET",))
        got: list[bytes] = []

        async def read() -> None:  # (no deadline: the test moves the clock)
            while len(got) < 2:
                peer.buf += await peer.stream.receive_some(1 << 16)
                with contextlib.suppress(ValueError, IndexError, AssertionError):
                    got[:] = replies(peer.buf)  # (once whole)

        nursery.start_soon(read)
        for _ in range(3):
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(1)
        assert got == [], "a refused command was answered while its bucket is in debt"
        mock_clock.jump(200)
        with trio.fail_after(TIMEOUT):
            while len(got) < 2:
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(1)
        assert got[0].startswith(b"-ERR unknown command 'NOSUCH'"), got
        assert got[1] == b"-ERR wrong number of arguments for 'get' command\r\n"
        nursery.cancel_scope.cancel()


async def test_keys_with_odd_ranges_answer_as_redis_and_cost_their_work(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """``KEYS [z-a]`` answered 'internal error' and logged a traceback: Redis swaps
    the ends of a reversed range. A pattern costs its compiling once per bucket
    and the read floor for every key it examined."""
    floor = node.config.min_op_units
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send(*[(b"SET", k, b"v") for k in (b"a", b"m", b"z", b"A", b"1")])
        await peer.replies(5)
        pattern = b"[z-a]"
        before = units_used(node)
        await peer.send((b"KEYS", pattern))
        (got,) = await peer.replies(1)
        assert got == b"*3\r\n$1\r\na\r\n$1\r\nm\r\n$1\r\nz\r\n"
        compiled = redis_scan.compile_floors(pattern)
        assert units_used(node) - before == (compiled + 5) * floor
        before = units_used(node)
        await peer.send((b"SCAN", b"0", b"MATCH", pattern, b"COUNT", b"3"))
        (got,) = await peer.replies(1)
        assert got.endswith(b"*1\r\n$1\r\na\r\n")  # (1, A and a examined)
        assert units_used(node) - before == 3 * floor  # compiled already
        for odd in (b"[^]", b"[", b"k[1-", b"\\", b"[]", b"x[", b"[a-"):
            await peer.send((b"KEYS", odd), (b"SCAN", b"0", b"MATCH", odd))
            for reply in await peer.replies(2):
                assert reply.startswith(b"*"), (odd, reply)
        await peer.send((b"KEYS", b"?" * (redis_scan.MAX_PATTERN_BYTES + 1)))
        (got,) = await peer.replies(1)
        assert got == b"-ERR pattern longer than %d bytes\r\n" % redis_scan.MAX_PATTERN_BYTES
        nursery.cancel_scope.cancel()


async def test_an_unknown_command_is_answered_in_redis_words(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """Redis 7.0's text (server.c, processCommand): the name as sent, each argument
    quoted and followed by a space while fewer than 128 bytes are shown."""
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send((b"LPush", b"l", b"a"), (b"XADD",), (b"hset", b"k" * 100, b"f" * 100))
        got = await peer.replies(3)
        assert got == [
            b"-ERR unknown command 'LPush', with args beginning with: 'l' 'a' \r\n",
            b"-ERR unknown command 'XADD', with args beginning with: \r\n",
            # 103 bytes shown after the first argument: the next is cut to 128 - 103.
            b"-ERR unknown command 'hset', with args beginning with: '%s' '%s' \r\n"
            % (b"k" * 100, b"f" * 25),
        ]
        nursery.cancel_scope.cancel()


async def test_client_names_are_bounded(node: Node, mock_clock: trio.testing.MockClock) -> None:
    """CLIENT SETNAME and HELLO SETNAME keep at most MAX_CLIENT_NAME_BYTES (a 20 MiB
    name was kept until the connection closed), with Redis's character rule."""
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        longest = b"n" * MAX_CLIENT_NAME_BYTES
        await peer.send(
            (b"CLIENT", b"SETNAME", longest),
            (b"CLIENT", b"GETNAME"),
            (b"CLIENT", b"SETNAME", longest + b"n"),
            (b"HELLO", b"2", b"SETNAME", longest + b"n"),
            (b"CLIENT", b"SETNAME", b"a b"),
            (b"HELLO", b"2", b"SETNAME", b"a\x00b"),
            (b"CLIENT", b"GETNAME"),
        )
        got = await peer.replies(7)
        too_long = b"-ERR Client names are limited to %d bytes\r\n" % MAX_CLIENT_NAME_BYTES
        special = b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n"
        assert got[0] == b"+OK\r\n" and got[1] == b"$128\r\n" + longest + b"\r\n"
        assert got[2:6] == [too_long, too_long, special, special]
        assert got[6] == got[1]
        # More than any handshake (the 20 MiB names), typed inline: refused
        # as a request, at a floor per 4 KB of it, its bytes not kept while it waits.
        before = units_used(node)
        inline = b"n" * (8 << 10)
        await peer.stream.send_all(b"CLIENT SETNAME " + inline + b"\r\n")
        (got_big,) = await peer.replies(1)
        assert got_big == b"-ERR 'client' takes at most 4096 bytes of arguments\r\n"
        floors = 1 + (len(inline) + 14) // node.config.read_unit_size
        assert units_used(node) - before == floors * node.config.min_op_units
        # As a multibulk command: refused on the header that crosses the bound,
        # before the body is received, and the connection closes (as for any
        # protocol error).
        await peer.stream.send_all(b"*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$20971520\r\n")
        (refused,) = await peer.replies(1)
        assert refused == b"-ERR Protocol error: CLIENT takes at most 4096 bytes of arguments\r\n"
        with trio.fail_after(TIMEOUT):
            assert await peer.stream.receive_some(100) == b""
        nursery.cancel_scope.cancel()


async def test_an_unexpected_failure_is_logged_once_a_second_with_a_count(
    node: Node,
    mock_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug a client can trigger at will must not fill the log: one line (with its
    traceback) per connection per second, saying how many were not logged."""

    def broken(s: Any, b: Any, p: Any) -> Any:
        raise RuntimeError("a bug")

    table = resp_door.COMMANDS
    monkeypatch.setitem(table, "strlen", dataclasses.replace(table["strlen"], handler=broken))
    caplog.set_level(logging.ERROR, "tenantkv.session")
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send(*[(b"STRLEN", b"k")] * 50)
        got = await peer.replies(50)
        assert all(g.startswith(b"-ERR internal error") for g in got)
        mock_clock.jump(1.0)
        await peer.send((b"STRLEN", b"k"))
        await peer.replies(1)
        lines = [r for r in caplog.records if "failed on connection" in r.getMessage()]
        assert len(lines) == 2, [r.getMessage() for r in lines]
        assert "(0 more" in lines[0].getMessage() and lines[0].exc_info is not None
        assert "(49 more" in lines[1].getMessage()
        nursery.cancel_scope.cancel()


async def test_keys_and_scan_read_keys_without_copying_values(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KEYS and SCAN examine keys on views of the records (a KEYS over 10,000 keys
    of 1 MiB copied 10 GB): the same keys as the engine's scan, expired ones
    skipped, from ``after`` to ``end``, ``limit`` at a time."""
    engine = node.engine
    b = engine.bucket("b")
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send(*[(b"SET", b"k%02d" % i, bytes(i * 1000)) for i in range(30)])
        await peer.send((b"PEXPIRE", b"k07", b"30000"), (b"PEXPIRE", b"k19", b"30000"))
        await peer.replies(32)
        later = engine.now_ms() + 60_000
        monkeypatch.setattr(engine, "now_ms", lambda: later)  # (k07, k19 expired, not gone)
        for start, end, after, limit in [
            (b"", None, None, 100),
            (b"k1", b"k2", None, 100),
            (b"", None, b"k05", 3),
            (b"k", b"l", b"k18", 5),
            (b"z", None, None, 10),
        ]:
            where = KeyRange(start, end, after)
            items, more = engine.scan(b, where, limit=limit)
            want = ([k for k, _ in items], more)
            assert engine.scan_keys(b, where, limit=limit) == want
        await peer.send((b"KEYS", b"k?7"), (b"KEYS", b"k*9"))
        assert await peer.replies(2) == [
            b"*2\r\n$3\r\nk17\r\n$3\r\nk27\r\n",
            b"*2\r\n$3\r\nk09\r\n$3\r\nk29\r\n",
        ]
        nursery.cancel_scope.cancel()


async def test_config_get_matches_redis_globs_case_insensitively_and_is_bounded(
    node: Node,
) -> None:
    """CONFIG GET reads its patterns as KEYS does (fnmatch compiled any pattern,
    kept up to 32,768 of them, and read ``[!a]`` as a negation), without case, and
    takes at most MAX_CONFIG_PATTERNS of them."""
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send(
            (b"CONFIG", b"GET", b"APPEND*", b"[z-a]ave"),
            (b"CONFIG", b"GET", b"[!a]ppendonly"),
            (b"CONFIG", b"GET", *[b"x%d" % i for i in range(MAX_CONFIG_PATTERNS + 1)]),
        )
        got = await peer.replies(3)
        assert got[0] == (
            b"*6\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n$11\r\nappendfsync\r\n$6\r\nalways\r\n"
            b"$4\r\nsave\r\n$0\r\n\r\n"
        )
        assert got[1] == b"*2\r\n$10\r\nappendonly\r\n$3\r\nyes\r\n"  # [!a]: ! or a
        assert got[2] == b"-ERR CONFIG GET takes at most %d patterns\r\n" % MAX_CONFIG_PATTERNS
        nursery.cancel_scope.cancel()


async def test_writes_that_answer_with_a_value_hold_and_pay_for_it(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """GETEX, GETDEL and SET ... GET answer with a stored value: it is counted before
    they run (held as a write in flight, against the connection's and the node's
    bounds) and charged as the read units a GET of it costs. Pipelined GETEX of a
    10 MiB key held 600 MB of answers, each charged one unit; and every plain SET
    copied the value it replaced, to answer OK."""
    stalled: list[Any] = []
    real_submit_many = node.writer.submit_many  # type: ignore[union-attr]
    value = bytes(400_000)
    async with trio.open_nursery() as nursery:
        peer = await resp_session(node, nursery)
        await peer.send((b"SET", b"big", value))
        assert await peer.replies(1) == [b"+OK\r\n"]
        node.writer.submit_many = stalled.extend  # type: ignore[union-attr]
        before = units_used(node)
        await peer.send(*[(b"GETEX", b"big") for _ in range(3)])
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered >= 3 * len(value)  # answers to come, held
        node.writer.submit_many = real_submit_many  # type: ignore[union-attr]
        real_submit_many(stalled)
        answers = (b"$400000\r\n" + value + b"\r\n") * 3
        with trio.fail_after(TIMEOUT):
            while len(peer.buf) < len(answers):
                peer.buf += await peer.stream.receive_some(1 << 20)
        assert peer.buf == answers
        peer.buf = b""
        read_units = -(-len(value) // node.config.read_unit_size)
        assert units_used(node) - before >= 3 * read_units
        # A plain SET answers OK: the value it replaces is neither copied nor held.
        ops: list[Any] = []
        node.writer.submit_many = lambda items: (ops.extend(items), real_submit_many(items))  # type: ignore[union-attr]
        await peer.send((b"SET", b"big", b"small"), (b"SET", b"big", b"v", b"GET"))
        assert await peer.replies(2) == [b"+OK\r\n", b"$5\r\nsmall\r\n"]
        node.writer.submit_many = real_submit_many  # type: ignore[union-attr]
        sets = [op for p in ops for op in getattr(p.op, "ops", [p.op])]  # (a run: one item)
        # (the old value's size as it stood when the op was built: before the first SET)
        assert [op.reply_hint for op in sets] == [0, len(value)]
        nursery.cancel_scope.cancel()


async def test_a_refused_set_get_leaves_no_reply_of_its_own_behind(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """SET ... GET replies differently from SET: the door keeps how, per command,
    until it is answered — also when the rate limiter refuses a flood of them."""
    await node.parameters.set("ingress_request_admission_rate_per_sec", 1.0)
    await node.parameters.set("ingress_request_admission_burst_capacity_secs", 2.0)
    await node.parameters.set("ingress_request_rate_limiter_enabled", True)
    mock_clock.jump(10)
    client, server = trio.testing.memory_stream_pair()
    conn_id = next(_ids)
    node.connection_table.admit(
        conn_id, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    door = RespDoor()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Connection(node, server, "127.0.0.1:5555", conn_id, door).run)
        peer = RespPeer(client)
        await peer.send((b"AUTH", b"u", b"pw"))
        assert await peer.replies(1) == [b"+OK\r\n"]
        await peer.send(*[(b"SET", b"k", b"v", b"GET")] * 50)
        got = await peer.replies(50)
        assert got[0] == b"$-1\r\n" and got[-1].startswith(b"-TRYAGAIN")
        assert door._special == {}
        nursery.cancel_scope.cancel()


async def test_resp_errors_speak_redis_terms(node: Node) -> None:
    """A RESP client is never told about MessagePack's hello or select_bucket."""
    from tests.unit.test_session import add_admin

    await add_admin(node)
    client, server = trio.testing.memory_stream_pair()
    conn_id = next(_ids)
    node.connection_table.admit(
        conn_id, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Connection(node, server, "127.0.0.1:5555", conn_id, RespDoor()).run)
        peer = RespPeer(client)
        await peer.send((b"GET", b"k"), (b"AUTH", b"adm", b"pw"), (b"GET", b"k"))
        got = await peer.replies(3)
        assert got[0] == b"-NOAUTH Authentication required.\r\n" and got[1] == b"+OK\r\n"
        assert got[2].startswith(b"-ERR no bucket selected: select a bucket with SELECT")
        for reply in got:
            assert b"hello" not in reply.lower() and b"select_bucket" not in reply
        nursery.cancel_scope.cancel()
