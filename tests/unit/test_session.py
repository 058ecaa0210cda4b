"""Framing and dispatch of one connection over Trio memory streams (the Hypercorn
habit): a real Node on real LMDB files in a temp dir, no sockets.

Tests taking ``door`` run on both doors — the MessagePack door and the RESP
door, whose requests take the same chunk executor — through one client
(:class:`Peer` or :class:`RespPeer`) that sends MessagePack-style requests and
reads MessagePack-style responses.

Checks what a socket test cannot pin down cheaply: the order of pipelined
answers, that hello is the only thing read before authentication, the frame
bound switching after hello, and the node-wide receive-buffer accounting
returning to zero when a connection ends mid-frame.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tenantkv import errors, protocol
from tenantkv.admission.tenant_throttle import TenantThrottle, write_units
from tenantkv.admission.throttle_gate import TenantThrottleGate
from tenantkv.config import Config
from tenantkv.server import auth
from tenantkv.server.connection import Connection
from tenantkv.server.doors.msgpack import MsgpackDoor
from tenantkv.server.doors.resp import RespDoor
from tenantkv.server.executor import REFUSAL_PAUSE_MAX_SECS, Executor
from tenantkv.server.node import Node
from tenantkv.server.role import SingleProcess
from tenantkv.server.server import open_engine
from tenantkv.storage.ops import CreateBucketOp

TIMEOUT = 10
#: the hello of user u on bucket b, msgid 0
HELLO = (0, "hello", {"user": "u", "password": "pw", "bucket": "b"})


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = Config(data_dir=str(tmp_path / "data"), durability="nosync")
    engine = open_engine(config)
    n = Node(config, engine, role=SingleProcess())
    n.start()
    user = await trio.to_thread.run_sync(lambda: auth.new_user("u", "pw", roles={"b": "readwrite"}))
    n.bucket_added(await n.write(CreateBucketOp("b", {})))
    await n.accounts.save_user(user, expect="absent")
    try:
        yield n
    finally:
        with trio.CancelScope(shield=True):
            await n.stop_writer()
        engine.close()


class Peer:
    """The client end of a memory stream pair, speaking raw MessagePack-RPC."""

    def __init__(self, stream: trio.testing.MemorySendStream | Any) -> None:
        self.stream = stream
        self.decoder = protocol.ResponseDecoder()
        self.got: list[protocol.Response] = []

    async def send(self, *reqs: tuple[int, str, dict[str, Any]]) -> None:
        await self.stream.send_all(b"".join(protocol.encode_request(*r) for r in reqs))

    async def responses(self, n: int) -> list[protocol.Response]:
        with trio.fail_after(TIMEOUT):
            while len(self.got) < n:
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                self.decoder.feed(data)
                self.got.extend(self.decoder)
        out, self.got = self.got[:n], self.got[n:]
        return out


def _resp_command(method: str, params: dict[str, Any]) -> tuple[bytes, ...]:
    """The RESP command of a MessagePack-style request (the ones these tests send)."""
    if method == "get":
        return (b"GET", params["key"])
    if method == "set":
        return (b"SET", params["key"], params["value"])
    if method == "ping":
        return (b"PING",)
    if method == "no_such_command":
        return (b"NO_SUCH_COMMAND",)
    raise AssertionError(f"no RESP form for {method}")


def _resp_error(text: bytes) -> dict[str, Any]:
    """A RESP error reply as a MessagePack error map: ``TRYAGAIN <CodeName>
    retryAfterMs=<n> ...`` carries its code name; others their prefix."""
    words = text[1:].decode().split()
    if words[0] == "TRYAGAIN":
        return {"codeName": words[1], "retryAfterMs": int(words[2].split("=")[1])}
    return {"codeName": words[0], "errmsg": " ".join(words[1:])}


class RespPeer:
    """:class:`Peer` on the RESP door: requests as RESP commands, replies (in
    order: RESP has no msgid) back as :class:`protocol.Response`."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.buf = b""
        self.sent: list[int] = []

    async def send(self, *reqs: tuple[int, str, dict[str, Any]]) -> None:
        data = b""
        for msgid, method, params in reqs:
            argv = _resp_command(method, params)
            data += b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)
            self.sent.append(msgid)
        await self.stream.send_all(data)

    async def responses(self, n: int) -> list[protocol.Response]:
        from tests.e2e.test_fuzz_resp import replies

        with trio.fail_after(TIMEOUT):
            while True:
                try:
                    got = replies(self.buf)
                except (ValueError, IndexError, AssertionError):
                    got = []  # (a reply cut short: read on)
                if len(got) >= n:
                    self.buf = b"".join(got[n:])
                    break
                data = await self.stream.receive_some(1 << 20)
                assert data, f"connection closed after {got!r}"
                self.buf += data
        out = []
        for reply in got[:n]:
            msgid = self.sent.pop(0)
            if reply.startswith(b"-"):
                out.append(protocol.Response(msgid, _resp_error(reply.strip()), None))
            elif reply.startswith(b"$-1"):
                out.append(protocol.Response(msgid, None, None))
            elif reply.startswith(b"$"):
                value = reply[reply.index(b"\r\n") + 2 : -2]
                out.append(protocol.Response(msgid, None, {"value": value}))
            else:
                out.append(protocol.Response(msgid, None, reply[1:-2].decode()))
        return out


#: the doors a ``door`` test runs on
DOORS = ["msgpack", "resp"]

_ids = itertools.count(1)


async def start_session(node: Node, nursery: trio.Nursery) -> tuple[Connection, Peer]:
    """A session on one end of a memory stream pair, admitted as the server would,
    and the peer on the other end."""
    client, server = trio.testing.memory_stream_pair()
    conn_id = next(_ids)
    node.connection_table.admit(
        conn_id, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    session = Connection(node, server, "127.0.0.1:5555", conn_id, MsgpackDoor())
    nursery.start_soon(session.run)
    return session, Peer(client)


async def run_session(node: Node, nursery: trio.Nursery) -> Peer:
    """:func:`start_session`'s peer."""
    return (await start_session(node, nursery))[1]


async def hello_session(
    node: Node, nursery: trio.Nursery, door: str = "msgpack", **hello: Any
) -> Any:
    """:func:`run_session`, past a hello as user ``u`` on bucket ``b`` (``hello``:
    more of its parameters); on the RESP door (``door``), an AUTH and, for
    ``nonblocking_throttle``, CLIENT NONBLOCKING."""
    if door == "msgpack":
        peer = await run_session(node, nursery)
        await peer.send((0, "hello", {"user": "u", "password": "pw", "bucket": "b", **hello}))
        await peer.responses(1)
        return peer
    client, server = trio.testing.memory_stream_pair()
    conn_id = next(_ids)
    node.connection_table.admit(
        conn_id, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    nursery.start_soon(Connection(node, server, "127.0.0.1:5555", conn_id, RespDoor()).run)
    login = b"%s@b" % hello.pop("user", "u").encode()
    await client.send_all(b"*3\r\n$4\r\nAUTH\r\n$%d\r\n%b\r\n$2\r\npw\r\n" % (len(login), login))
    resp_peer = RespPeer(client)
    resp_peer.sent.append(0)
    assert (await resp_peer.responses(1))[0].error is None
    if hello.pop("nonblocking_throttle", False):
        await client.send_all(b"*3\r\n$6\r\nCLIENT\r\n$11\r\nNONBLOCKING\r\n$2\r\non\r\n")
        resp_peer.sent.append(0)
        assert (await resp_peer.responses(1))[0].error is None
    assert not hello, hello
    return resp_peer


def frozen_copy(throttle: TenantThrottle) -> TenantThrottle:
    """A copy of ``throttle``'s state whose clock stays at now: the reference a
    per-operation replay is checked against."""
    ref = copy.copy(throttle)
    ref._buckets = copy.deepcopy(throttle._buckets)
    now = trio.current_time()
    ref._clock = lambda: now
    return ref


async def test_pipelined_requests_are_answered_in_order(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send(
            HELLO,
            (1, "set", {"key": b"k", "value": b"v1"}),
            (2, "get", {"key": b"k"}),
            (3, "set", {"key": b"k", "value": b"v2"}),
            (4, "get", {"key": b"k"}),
            (5, "nope", {}),
            (6, "get", {"key": b"missing"}),
        )
        got = await peer.responses(7)
        assert [r.msgid for r in got] == list(range(7))
        assert got[2].result["value"] == b"v1" and got[4].result["value"] == b"v2"
        assert got[5].error["codeName"] == "UnknownCommand" and got[6].result is None
        await peer.stream.aclose()
    assert node.receive_buffers.buffered == 0


async def test_nothing_but_hello_runs_before_authentication(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send((1, "get", {"key": b"k"}), (2, "hello", {"user": "u", "password": "pw"}))
        (resp,) = await peer.responses(2)
        assert resp.msgid == 1 and resp.error["codeName"] == "HelloRequired"
        assert await peer.stream.receive_some(10) == b""  # closed; the hello never ran


async def test_frames_are_small_until_hello_and_full_size_after(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        big = {"user": "u", "password": "pw", "bucket": "b", "client": {"name": "x" * 5000}}
        await peer.send((0, "hello", big))
        (resp,) = await peer.responses(1)
        assert resp.error["codeName"] == "FrameTooLarge"
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send(
            HELLO,
            (1, "set", {"key": b"big", "value": b"x" * 100_000}),
        )
        got = await peer.responses(2)
        assert got[0].error is None and got[1].error is None
        await peer.stream.aclose()


async def test_a_connection_that_ends_mid_frame_releases_its_buffer(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        frame = protocol.encode_request(1, "set", {"key": b"k", "value": b"y" * 50_000})
        await peer.stream.send_all(frame[:30_000])
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered == 30_000
        await peer.stream.aclose()
    assert node.receive_buffers.buffered == 0


async def test_connections_holding_partial_frames_at_the_cap_all_finish(node: Node) -> None:
    """Past the node's receive-buffer cap, connections that each hold part of a
    large write still complete it: one at a time (the finisher), not each
    waiting on the others until its frame deadline."""
    from tenantkv.admission.receive_buffers import ReceiveBuffers

    node.receive_buffers = ReceiveBuffers(1_000_000)
    async with trio.open_nursery() as nursery:
        peers = [await hello_session(node, nursery) for _ in range(4)]
        frames = [
            protocol.encode_request(1, "set", {"key": b"k%d" % i, "value": bytes(600_000)})
            for i in range(4)
        ]
        for peer, frame in zip(peers, frames, strict=True):
            await peer.stream.send_all(frame[:400_000])
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered >= 1_000_000  # at the cap, every frame partial
        for peer, frame in zip(peers, frames, strict=True):
            await peer.stream.send_all(frame[400_000:])
        with trio.fail_after(5):
            for peer in peers:
                assert [r.error for r in await peer.responses(1)] == [None]
        assert node.receive_buffers.buffered == 0
        for peer in peers:
            await peer.stream.aclose()


async def test_what_a_chunk_still_holds_is_counted_while_its_handling_waits(node: Node) -> None:
    """The receive-buffer cap learns what a connection holds when its chunk
    settles, which is before anything awaits: a read waiting behind the
    connection's unanswered write leaves the rest of the chunk counted as held."""
    stalled: list[Any] = []
    real_submit_many = node.writer.submit_many  # type: ignore[union-attr]
    node.writer.submit_many = stalled.extend  # type: ignore[union-attr]
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        rest = protocol.encode_request(3, "get", {"key": b"w"})
        await peer.stream.send_all(
            protocol.encode_request(1, "set", {"key": b"w", "value": b"v"})
            + protocol.encode_request(2, "get", {"key": b"w"})  # waits for the set
            + rest
        )
        await trio.testing.wait_all_tasks_blocked()
        # the rest of the chunk, and the set's value until it is durable
        assert node.receive_buffers.buffered == len(rest) + stalled[0].op.size_hint
        node.writer.submit_many = real_submit_many  # type: ignore[union-attr]
        real_submit_many(stalled)
        got = await peer.responses(3)
        assert [r.result["value"] for r in got[1:]] == [b"v", b"v"]
        assert node.receive_buffers.buffered == 0
        await peer.stream.aclose()


async def test_writes_not_yet_durable_count_against_the_receive_buffer_cap(node: Node) -> None:
    """A decoded write's value is still held until the write is durable: it counts
    against the node-wide cap, so connections pipelining large writes cannot hold
    many times the cap between decoding and commit. Connections waiting for room
    read again as the writer answers (not only when another frame is decoded)."""
    # (hello_session's hellos, before the cap binds: a session waiting to receive
    # was given its room when it began to wait)
    from tenantkv.admission.receive_buffers import SMALL_READ_BYTES, ReceiveBuffers

    node.receive_buffers = ReceiveBuffers(1_000_000)
    stalled: list[Any] = []
    real_submit_many = node.writer.submit_many  # type: ignore[union-attr]
    node.writer.submit_many = stalled.extend  # type: ignore[union-attr]

    def set_frame(key: bytes, size: int) -> bytes:
        return protocol.encode_request(1, "set", {"key": key, "value": bytes(size)})

    async with trio.open_nursery() as nursery:
        a = await hello_session(node, nursery)
        await a.stream.send_all(set_frame(b"a", 900_000))
        await trio.testing.wait_all_tasks_blocked()
        a_held = node.receive_buffers.buffered
        assert a_held >= 900_000  # decoded, queued, not durable: still held
        # Past the user's half, connections that come now read a little each, and
        # then wait: the one finishing a frame is still a, until its write is durable.
        b, c = [await hello_session(node, nursery) for _ in range(2)]
        for peer in (b, c):
            await peer.stream.send_all(set_frame(b"x", 150_000))
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered == a_held + 2 * SMALL_READ_BYTES
        # The writer answers: the room a's write held is free and b, then c, read on.
        node.writer.submit_many = real_submit_many  # type: ignore[union-attr]
        real_submit_many(stalled)
        for peer in (a, b, c):
            assert [r.error for r in await peer.responses(1)] == [None]
        assert node.receive_buffers.buffered == 0
        for peer in (a, b, c):
            await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_large_write_waiting_at_the_throttle_counts_as_held(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A decoded write waiting for its bucket's allowance holds its value: it counts
    against the node-wide cap until it joins the writer's queue (then as a write
    not yet durable), so connections of a tenant held at its limit cannot each
    keep a large value uncounted."""
    node.throttle.set_bucket("b", reserved=10, hard_limit=10)
    node.throttle.max_wait_secs = 1000
    value = bytes(200_000)  # 49 units: ~5 s of the bucket's rate
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send((1, "set", {"key": b"first", "value": value}))
        assert [r.error for r in await peer.responses(1)] == [None]  # its debt: ~4 s
        await peer.send((2, "set", {"key": b"second", "value": value}))
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered >= len(value)  # waiting, and held
        mock_clock.jump(60)
        assert [r.error for r in await peer.responses(1)] == [None]
        await trio.testing.wait_all_tasks_blocked()
        assert node.receive_buffers.buffered == 0
        await peer.stream.aclose()


async def test_a_client_that_does_not_read_its_replies_stops_being_read(node: Node) -> None:
    """Replies wait in one send of at most OUT_HIGH_WATER plus a reply; meanwhile the
    connection is not read (its client's requests wait in TCP) and what the send
    holds counts against the node-wide cap. (A lockstep stream: a send waits until
    the peer receives, as a socket whose peer stops reading does.)"""
    from tenantkv.server.executor import OUT_HIGH_WATER

    value = bytes(200_000)
    client, server = trio.testing.lockstep_stream_pair()
    node.connection_table.admit(
        9999, "127.0.0.1", trio.current_time(), max_connections=10, per_address=10
    )
    session = Connection(node, server, "127.0.0.1:5555", 9999, MsgpackDoor())
    peer = Peer(client)
    gets = 100  # 20 MB of replies
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        await peer.send(HELLO, (1, "set", {"key": b"v", "value": value}))
        assert [r.error for r in await peer.responses(2)] == [None, None]
        await peer.send(*[(i, "get", {"key": b"v"}) for i in range(2, 2 + gets)])
        await trio.testing.wait_all_tasks_blocked()  # answering them, stuck in a send
        sent = trio.Event()

        async def send_more() -> None:
            await peer.send(*[(i, "get", {"key": b"v"}) for i in range(2 + gets, 2 + 2 * gets)])
            sent.set()

        nursery.start_soon(send_more)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()  # the server stopped reading
        held = node.receive_buffers.buffered
        assert OUT_HIGH_WATER < held <= OUT_HIGH_WATER + len(value) + 64 * 1024
        got = await peer.responses(2 * gets)
        assert all(r.result["value"] == value for r in got)
        await trio.testing.wait_all_tasks_blocked()
        assert sent.is_set() and node.receive_buffers.buffered == 0
        await client.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_chunk_of_reads_is_admitted_where_the_per_operation_path_would_split_it(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """The reads of one received chunk are admitted as a run and charged once; the
    outcome per read and the throttle's state afterwards are those of admitting and
    charging each read on its own (the reference below), across the hard limit."""
    sizes = [10, 5000, 9000, 0, 100, 13000, 0, 4096, 1, 0] * 3  # 0: a miss
    unit, floor = node.config.read_unit_size, node.config.min_op_units
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door, nonblocking_throttle=True)
        for i, n in enumerate(sizes):
            if n:
                await peer.send((100 + i, "set", {"key": b"k%d" % i, "value": b"x" * n}))
                await peer.responses(1)
        node.throttle.set_bucket("b", hard_limit=200)  # 20 units a 100 ms slice
        mock_clock.jump(1.0)  # past the sets' window: a fresh slice for the reads
        ref = frozen_copy(node.throttle)  # the per-operation reference, same state
        gate = TenantThrottleGate(ref)
        expected = []
        for i, n in enumerate(sizes):
            try:
                gate.try_acquire("b", nonblocking=True)
            except Exception:
                expected.append("Throttled")
                continue
            ru = -(-(len(b"k%d" % i) + 20 + n) // unit) if n else 0
            ref.charge("b", ru, 0, min_cost=floor)
            expected.append("ok")
        assert "ok" in expected and "Throttled" in expected  # the limit falls mid-chunk
        await peer.send(*((i, "get", {"key": b"k%d" % i}) for i in range(len(sizes))))
        got = await peer.responses(len(sizes))
        assert [r.msgid for r in got] == list(range(len(sizes)))
        assert ["ok" if r.error is None else r.error["codeName"] for r in got] == expected
        b, r = node.throttle._buckets["b"], ref._buckets["b"]
        assert (b.credit, b.hard, b.ru_total, b.used_window) == (
            r.credit,
            r.hard,
            r.ru_total,
            r.used_window,
        )
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # (the refusals paused reading)
        await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_read_that_waited_its_turn_takes_the_rest_of_its_chunk_while_allowance_lasts(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """Two connections send a chunk of reads each to a bucket over its hard limit:
    a connection admitted from the throttle queue runs the reads after it in the
    same turn while the bucket has allowance, instead of queueing behind the
    other connection again for each one. Every read is answered, in order, the
    hard limit holds, and the queue sees a wait per turn, not one per read."""
    n, per_slice = 60, 20
    async with trio.open_nursery() as nursery:
        a = await hello_session(node, nursery, door)
        b = await hello_session(node, nursery, door)
        await a.send((1, "set", {"key": b"k", "value": b"x" * 100}))  # a read: 1 unit
        await a.responses(1)
        node.throttle.set_bucket("b", hard_limit=per_slice * 10)  # 20 units a 100 ms slice
        mock_clock.jump(1.0)
        mock_clock.autojump_threshold = 0  # (after the hellos: they hash in a thread)
        before = node.throttle.statistics().buckets["b"]
        t0 = trio.current_time()
        await a.send(*((i, "get", {"key": b"k"}) for i in range(n)))
        await b.send(*((i, "get", {"key": b"k"}) for i in range(n)))
        for peer in (a, b):
            got = await peer.responses(n)
            assert [r.msgid for r in got] == list(range(n))
            assert all(r.error is None and r.result["value"] == b"x" * 100 for r in got)
        after = node.throttle.statistics().buckets["b"]
        # 120 reads at 20 a slice: at least 5 slices after the first.
        assert trio.current_time() - t0 >= 0.5 - 1e-9
        waits = after.throttle_count_total - before.throttle_count_total
        # A turn per connection per slice at most (6 slices), not a wait per read
        # (~100 without turns).
        assert 0 < waits <= 2 * (2 * n // per_slice)
        await a.stream.aclose()
        await b.stream.aclose()


async def limit_requests_to_five_tokens(node: Node, mock_clock: trio.testing.MockClock) -> None:
    """The request rate limiter on at 1/s with a full burst of 5 tokens."""
    await node.parameters.set("ingress_request_admission_rate_per_sec", 1.0)
    await node.parameters.set("ingress_request_admission_burst_capacity_secs", 5.0)
    await node.parameters.set("ingress_request_rate_limiter_enabled", True)
    mock_clock.jump(10)


@pytest.mark.parametrize("door", DOORS)
async def test_a_chunk_past_the_request_rate_is_refused_once_decided_and_counted(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """The request rate limiter decides once per chunk: the requests after its first
    refusal get the same 462 without a new look; every one is counted."""
    await limit_requests_to_five_tokens(node, mock_clock)
    before = node.pipeline.request_limiter.statistics()
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(1, 21)))
        got = await peer.responses(20)
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        assert codes == ["ok"] * 5 + ["IngressRequestRateLimitExceeded"] * 15
        assert len({r.error["retryAfterMs"] for r in got[5:]}) == 1  # one decision
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # the session reads (and sees EOF) again
        await peer.stream.aclose()
    st = node.pipeline.request_limiter.statistics()
    assert st.rejected - before.rejected == 15
    assert st.attempted - before.attempted == 20
    assert node.bucket_stats["b"].errors["IngressRequestRateLimitExceeded"] == 15


@pytest.mark.parametrize("door", DOORS)
async def test_a_chunks_first_request_takes_its_token_without_a_loan(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A chunk's first request takes a token directly, a loan starts with its
    second, and a chunk whose first finds none is refused as a loan refuses:
    the limiter admits exactly its tokens, each request counted once."""
    await limit_requests_to_five_tokens(node, mock_clock)
    limiter = node.pipeline.request_limiter
    lends = 0
    lend = limiter.lend

    def counted_lend(now: float | None = None) -> float | None:
        nonlocal lends
        lends += 1
        return lend(now)

    limiter.lend = counted_lend
    before = limiter.statistics()
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        for i in range(3):  # unpipelined: a chunk each, no loan
            await peer.send((i, "get", {"key": b"k"}))
            assert (await peer.responses(1))[0].error is None
        assert lends == 0
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(10, 15)))
        got = await peer.responses(5)
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        assert codes == ["ok"] * 2 + ["IngressRequestRateLimitExceeded"] * 3
        assert lends == 1  # (the chunk's second request)
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)
        await peer.send((20, "get", {"key": b"k"}))  # no token: refused as by a loan
        (refused,) = await peer.responses(1)
        assert refused.error is not None and refused.error["retryAfterMs"] > 0
        assert lends == 2
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)
        await peer.stream.aclose()
    st = limiter.statistics()
    assert (st.attempted - before.attempted, st.successful - before.successful) == (9, 5)
    assert st.rejected - before.rejected == 4


@pytest.mark.parametrize("door", DOORS)
async def test_each_request_takes_one_token_where_a_run_of_reads_ends(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A pipelined chunk of reads takes one request-rate token per request, also
    for the read at which a run's throttle allowance runs out (it ends the run
    and begins another, or is throttled): the limiter admits what was served
    and refused by the throttle, no more."""
    await node.parameters.set("ingress_request_admission_rate_per_sec", 1000.0)
    await node.parameters.set("ingress_request_admission_burst_capacity_secs", 1.0)
    await node.parameters.set("ingress_request_rate_limiter_enabled", True)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door, nonblocking_throttle=True)
        await peer.send((100, "set", {"key": b"k", "value": b"x" * 5000}))  # 2 units a read
        await peer.responses(1)
        node.throttle.set_bucket("b", hard_limit=200)  # 20 units a 100 ms slice
        mock_clock.jump(10)
        before = node.pipeline.request_limiter.statistics()
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(30)))
        got = await peer.responses(30)
        codes = {"ok" if r.error is None else r.error["codeName"] for r in got}
        assert codes == {"ok", "Throttled"}  # the allowance ran out mid-chunk
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # (the refusals paused reading)
        await peer.stream.aclose()
    st = node.pipeline.request_limiter.statistics()
    assert st.attempted - before.attempted == 30
    assert st.successful - before.successful == 30
    assert st.rejected == before.rejected


@pytest.mark.parametrize("door", DOORS)
async def test_a_loan_after_the_chunk_waited_counts_the_time_that_passed(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A chunk's requests share its clock reading until it waits: a read that waits
    in the throttle queue settles the request-rate loan, and the next loan of the
    same chunk, seconds later, gets the tokens earned meanwhile. Here each read
    waits ~1 s for its hard limit while the limiter earns a token a second, so
    none of the chunk's reads is refused (with the reading taken when the chunk
    arrived, the sixth would be)."""
    await limit_requests_to_five_tokens(node, mock_clock)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send((1, "set", {"key": b"k", "value": b"x" * 100}))  # a read: 1 unit
        await peer.responses(1)
        node.throttle.set_bucket("b", hard_limit=1)  # a unit a second
        mock_clock.jump(10)
        mock_clock.autojump_threshold = 0
        t0 = trio.current_time()
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(2, 10)))
        got = await peer.responses(8)
        assert [r.error for r in got] == [None] * 8
        assert trio.current_time() - t0 >= 5  # they waited for the hard limit
        await peer.stream.aclose()


async def answered_so_far(peer: Peer, nursery: trio.Nursery, n: int) -> list[protocol.Response]:
    """The list the peer's next ``n`` responses go to as they arrive (a task reads
    them), once every task is blocked: what the session answered without the
    clock moving."""
    got: list[protocol.Response] = []

    async def collect() -> None:
        got.extend(await peer.responses(n))

    nursery.start_soon(collect)
    await trio.testing.wait_all_tasks_blocked()
    return got


async def read_when_the_pause_ends(
    mock_clock: trio.testing.MockClock, got: list[protocol.Response]
) -> None:
    """A refusal paused the connection: nothing sent meanwhile is answered a
    moment before the pause ends (``got``: :func:`answered_so_far`'s list), and
    it is read once it is over."""
    mock_clock.jump(REFUSAL_PAUSE_MAX_SECS - 0.001)
    await trio.testing.wait_all_tasks_blocked()
    assert got == [], "read before the pause ended"
    mock_clock.jump(0.001)
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("door", DOORS)
async def test_a_refused_connection_is_read_again_when_a_token_could_be_there(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """After a refusal by the request rate limiter the connection is not read until
    the limiter could admit again (at most REFUSAL_PAUSE_MAX_SECS): what the client
    sends meanwhile is answered together once the pause ends, so a client that
    ignores retryAfterMs costs one receive and one send per pause, not per request."""
    await limit_requests_to_five_tokens(node, mock_clock)  # 1/s: a token is 1 s off
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(1, 7)))
        assert [r.error is None for r in await peer.responses(6)] == [True] * 5 + [False]
        assert node.refusal_pauses == 1
        for i in range(7, 10):
            await peer.send((i, "get", {"key": b"k"}))
        got = await answered_so_far(peer, nursery, 3)
        await read_when_the_pause_ends(mock_clock, got)
        assert [r.msgid for r in got] == [7, 8, 9]
        assert {r.error["codeName"] for r in got} == {"IngressRequestRateLimitExceeded"}
        # A token's wait later the next request is served.
        mock_clock.jump(1.0)
        await peer.send((10, "get", {"key": b"k"}))
        assert (await peer.responses(1))[0].error is None
        await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_throttled_refusal_pauses_the_connection_too(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A refusal by the tenant throttle (Throttled, with retryAfterMs) costs no
    units, so a client that ignores it and keeps sending — on a non-blocking
    connection, or with a short timeout_ms — must not be served refusals as fast
    as it sends: its connection is not read again until the refusal's wait (at
    most REFUSAL_PAUSE_MAX_SECS), as after a request-rate refusal."""
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door, nonblocking_throttle=True)
        node.throttle.set_bucket("b", hard_limit=1)  # a unit a second
        mock_clock.jump(10)
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(1, 4)))
        codes = [r.error["codeName"] if r.error else "ok" for r in await peer.responses(3)]
        assert codes[0] == "ok" and set(codes[1:]) == {"Throttled"}
        pauses = node.refusal_pauses
        assert pauses >= 1
        await peer.send((4, "get", {"key": b"k"}))
        got = await answered_so_far(peer, nursery, 1)
        await read_when_the_pause_ends(mock_clock, got)
        assert [r.msgid for r in got] == [4]
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # the session reads (and sees EOF) again
        await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_refused_large_request_pauses_its_connection_longer(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """A large write refused by the throttle was received and decoded whole to be
    refused: its connection is not read again until the refusal's wait, up to
    LARGE_REFUSAL_PAUSE_MAX_SECS (not REFUSAL_PAUSE_MAX_SECS), so a client that
    pipelines large writes past its limit is not served refusals of them as fast
    as it can send them. (A refusal on the inline path, a non-blocking one, pauses
    it as any refusal does.)"""
    from tenantkv.server.executor import LARGE_REFUSAL_PAUSE_MAX_SECS

    value = bytes(100_000)  # 25 units: ~2 s of debt at 10 units/s
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        node.throttle.set_bucket("b", hard_limit=10)
        node.throttle.max_wait_secs = 1  # (the second waits longer: refused at once)
        mock_clock.jump(10)
        await peer.send((1, "set", {"key": b"k1", "value": value}))
        assert (await peer.responses(1))[0].error is None
        await peer.send((2, "set", {"key": b"k2", "value": value}))
        assert (await peer.responses(1))[0].error["codeName"] == "Throttled"
        await peer.send((3, "get", {"key": b"k1"}))
        got = await answered_so_far(peer, nursery, 1)
        assert LARGE_REFUSAL_PAUSE_MAX_SECS > 10 * REFUSAL_PAUSE_MAX_SECS
        mock_clock.jump(10 * REFUSAL_PAUSE_MAX_SECS)  # where a small request's would end
        await trio.testing.wait_all_tasks_blocked()
        assert got == [], "read before the pause ended"
        mock_clock.jump(LARGE_REFUSAL_PAUSE_MAX_SECS - 10 * REFUSAL_PAUSE_MAX_SECS)
        await trio.testing.wait_all_tasks_blocked()
        assert [r.msgid for r in got] == [3]
        mock_clock.jump(60)
        await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_refusal_with_a_token_due_soon_does_not_pause_the_connection(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """At a rate where the next token is under REFUSAL_PAUSE_MIN_SECS away the
    connection is read again at once: the limiter admits its next requests soon,
    and a pause would only delay them."""
    await node.parameters.set("ingress_request_admission_rate_per_sec", 5000.0)
    await node.parameters.set("ingress_request_admission_burst_capacity_secs", 0.001)
    await node.parameters.set("ingress_request_rate_limiter_enabled", True)
    mock_clock.jump(10)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send(*((i, "get", {"key": b"k"}) for i in range(1, 9)))
        got = await peer.responses(8)
        assert [r.error is None for r in got] == [True] * 5 + [False] * 3
        await peer.send((9, "get", {"key": b"k"}))
        got = await answered_so_far(peer, nursery, 1)
        assert [r.msgid for r in got] == [9]  # answered without the clock moving
        assert node.refusal_pauses == 0
        await peer.stream.aclose()


async def add_admin(node: Node) -> None:
    """An admin user ``adm`` (password ``pw``)."""
    adm = await trio.to_thread.run_sync(lambda: auth.new_user("adm", "pw", admin=True))
    await node.accounts.save_user(adm, expect="absent")


@pytest.mark.parametrize(("user", "admin_answer"), [("adm", "ok"), ("u", "Unauthorized")])
async def test_an_admins_admin_commands_in_a_rate_limited_chunk_take_no_token(
    node: Node, mock_clock: trio.testing.MockClock, user: str, admin_answer: str
) -> None:
    """The loan's tokens go to data requests and to what anyone but an admin
    sends: an admin's admin command in the middle of a chunk passes as exempt
    and leaves its token to the requests after it. Another user's admin command
    takes a token like any request (and is refused for want of the role): a
    command's name exempts no one."""
    await add_admin(node)
    await limit_requests_to_five_tokens(node, mock_clock)
    before = node.pipeline.request_limiter.statistics()
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, user=user)
        reqs = [(i, "get", {"key": b"k"}) for i in range(1, 9)]
        reqs.insert(3, (100, "list_buckets", {}))
        await peer.send(*reqs)
        got = await peer.responses(9)
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        refused = "IngressRequestRateLimitExceeded"
        if user == "adm":
            assert codes == ["ok"] * 3 + [admin_answer] + ["ok"] * 2 + [refused] * 3
        else:
            assert codes == ["ok"] * 3 + [admin_answer] + ["ok"] + [refused] * 4
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # the session reads (and sees EOF) again
        await peer.stream.aclose()
    st = node.pipeline.request_limiter.statistics()
    assert st.successful - before.successful == 5
    assert st.rejected - before.rejected == (3 if user == "adm" else 4)


@pytest.mark.parametrize("user", ["adm", "u"])
async def test_the_rest_of_a_refused_chunk_is_refused_alike_but_an_admins_admin_commands(
    node: Node, mock_clock: trio.testing.MockClock, user: str
) -> None:
    """Once the limiter refused a chunk, every next data request of it — unknown
    commands and malformed parameters too, as on their own — gets the same 462
    in order, counted; an admin's admin command among them still passes, anyone
    else's is refused alike (a flood of admin command names is no way past the
    limiter). A chunk of many (past the fair-share pause and several output
    writes) is answered in full, each request once."""
    await add_admin(node)
    await limit_requests_to_five_tokens(node, mock_clock)
    before = node.pipeline.request_limiter.statistics()
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, user=user)
        reqs: list[tuple[int, str, dict[str, Any]]] = [
            (i, "get", {"key": b"k"}) for i in range(1, 1001)
        ]
        reqs[10] = (11, "no_such_command", {})
        reqs[11] = (12, "get", {"key": 5, "bogus": True})
        reqs[20] = (21, "list_buckets", {})
        reqs[700] = (701, "list_buckets", {})
        await peer.send(*reqs)
        got = await peer.responses(len(reqs))
        assert [r.msgid for r in got] == [r[0] for r in reqs]
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        refused = "IngressRequestRateLimitExceeded"
        expected = ["ok"] * 5 + [refused] * 995
        if user == "adm":
            expected[20] = expected[700] = "ok"
        assert codes == expected
        mock_clock.jump(REFUSAL_PAUSE_MAX_SECS)  # the session reads (and sees EOF) again
        await peer.stream.aclose()
    st = node.pipeline.request_limiter.statistics()
    exempt = 2 if user == "adm" else 0
    assert st.rejected - before.rejected == 995 - exempt
    assert st.attempted - before.attempted == 1000 - exempt
    assert node.bucket_stats["b"].errors[refused] == 995 - exempt


def units_used(node: Node) -> float:
    """What bucket b has spent in the throttle's current window."""
    return node.throttle.statistics().buckets["b"].units_used_window


async def test_requests_that_are_no_data_operation_cost_the_floor(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """ping, whoami, select_bucket, unknown commands, malformed requests (inline
    or not) and an admin command from a user who is no admin each cost the
    bucket a read's floor (min_op_units), once: none is free."""
    floor = node.config.min_op_units
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        before = units_used(node)
        await peer.send(
            (1, "ping", {}),
            (2, "whoami", {}),
            (3, "no_such_command", {}),
            (4, "get", {"key": 5}),  # inline: the handler refuses it
            (5, "get", {"key": b"k", "bogus": 1}),  # the waiting path refuses it
            (6, "list_buckets", {}),
            (7, "hello", {"user": "u", "password": "pw"}),
            (8, "select_bucket", {"bucket": "nope"}),
            (9, "select_bucket", {"bucket": "b"}),
        )
        got = await peer.responses(9)
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        assert codes == [
            "ok",
            "ok",
            "UnknownCommand",
            "BadValue",
            "BadValue",
            "Unauthorized",
            "BadValue",
            "BucketNotFound",
            "ok",
        ]
        assert units_used(node) - before == 9 * floor
        await peer.stream.aclose()


async def test_an_mget_refused_for_its_size_costs_a_floor_per_key(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """An mget whose values exceed what one response carries is refused, having
    looked every key up: it costs the floor for each key, as one that succeeds
    does (it cost a single floor, so a flood of them copied ~40 MB a unit)."""
    floor = node.config.min_op_units
    big = bytes(11 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send((1, "set", {"key": b"big1", "value": big}))
        await peer.send((2, "set", {"key": b"big2", "value": big}))
        assert [r.error for r in await peer.responses(2)] == [None, None]
        keys = [b"big1", b"big2"] + [b"none%d" % i for i in range(998)]
        before = units_used(node)
        await peer.send((3, "mget", {"keys": keys}))
        (got,) = await peer.responses(1)
        assert got.error is not None and got.error["codeName"] == "BadValue"
        assert "exceed" in got.error["errmsg"]
        assert units_used(node) - before == 1000 * floor
        await peer.stream.aclose()


@pytest.mark.parametrize("nonblocking", [True, False])
async def test_a_flood_of_pings_is_held_to_the_buckets_allowance(
    node: Node, mock_clock: trio.testing.MockClock, nonblocking: bool
) -> None:
    """Past the bucket's allowance a ping is refused with Throttled on a
    non-blocking connection, and waits for its turn on a blocking one — as a
    read would — while an error is still answered at once (charged: debt)."""
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, nonblocking_throttle=nonblocking)
        node.throttle.set_bucket("b", hard_limit=200)  # 20 units a 100 ms slice
        mock_clock.jump(1)
        mock_clock.autojump_threshold = 0  # (waits pass in virtual time)
        t0 = trio.current_time()
        await peer.send(*((i, "ping", {}) for i in range(1, 51)))
        got = await peer.responses(50)
        codes = [r.error["codeName"] if r.error else "ok" for r in got]
        if nonblocking:
            served = codes.count("ok")
            assert 0 < served <= 21
            assert codes == ["ok"] * served + ["Throttled"] * (50 - served)
        else:
            assert codes == ["ok"] * 50
            assert trio.current_time() - t0 >= 0.1  # they waited for the hard limit
        await peer.send((99, "no_such_command", {}))
        assert [r.error["codeName"] for r in await peer.responses(1) if r.error] == [
            "UnknownCommand"
        ]
        await peer.stream.aclose()


async def test_a_user_created_again_elsewhere_is_not_the_connections_user(node: Node) -> None:
    """Another worker deleted user u and created it again before this one reloaded
    (serve --workers N): the new u is another user, with its own password and
    roles, so the old u's connection closes instead of taking them."""
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send((1, "get", {"key": b"k"}))
        assert (await peer.responses(1))[0].error is None
        again = await trio.to_thread.run_sync(
            lambda: auth.new_user("u", "other", roles={"b": "readwrite"})
        )
        node.accounts.reload({**node.accounts.users, "u": again})
        with trio.fail_after(TIMEOUT):
            assert await peer.stream.receive_some(1) == b""  # closed, as for a deletion


async def test_a_user_created_again_while_its_hello_waits_is_not_the_connections_user(
    node: Node,
) -> None:
    """u is deleted and created again while a hello as the old u is being
    authenticated: the connection's first request finds another user under the
    name and fails, and the connection closes; it never runs with the new u's
    roles on the old u's password."""
    real = node.accounts.authenticate

    async def racing(name: Any, password: Any, peer: str | None = None) -> auth.User:
        user = await real(name, password, peer=peer)
        await node.accounts.drop_user("u")
        again = await trio.to_thread.run_sync(
            lambda: auth.new_user("u", "other", roles={"b": "readwrite"})
        )
        await node.accounts.save_user(again, expect="absent")
        return user

    node.accounts.authenticate = racing  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send((1, "get", {"key": b"k"}))
        (got,) = await peer.responses(1)
        assert got.error is not None and got.error["codeName"] == "Unauthorized"
        assert "was deleted" in got.error["errmsg"]
        assert await peer.stream.receive_some(1) == b""


async def test_what_a_client_sent_is_quoted_short_in_errors(node: Node) -> None:
    """An error quoting what the client sent (an unknown parameter's name, a bad
    value, an unknown method) quotes a bounded part of it: a 5 MiB parameter
    name once made a 20-million-character reply, kept in the server's cache of
    error templates (20 of them took ~900 MiB)."""
    huge = b"\x01" * (5 * 1024 * 1024)
    async with trio.open_nursery() as nursery:
        anonymous = await run_session(node, nursery)
        await anonymous.send((0, "hello", {"user": "u", "password": "pw", "x" * 3000: 1}))
        (got,) = await anonymous.responses(1)
        assert got.error is not None and len(got.error["errmsg"]) < 200
        peer = await hello_session(node, nursery)
        await peer.send(
            (1, "get", {"key": b"k", huge: 1}),
            (2, "set", {"key": b"k", "value": b"v", "ttl": [huge, huge]}),
            (3, "set", {"key": b"k", "value": b"v", "mode": huge}),
            (4, "m" * 60_000, {}),
        )
        got = await peer.responses(4)
        assert [r.error["codeName"] for r in got if r.error] == [
            "BadValue",
            "BadValue",
            "BadValue",
            "UnknownCommand",
        ]
        assert max(len(r.error["errmsg"]) for r in got if r.error) < 1000
        await peer.stream.aclose()
    assert max(len(t) for t in protocol._ERROR_MAPS.values()) < 1000


def test_no_error_message_is_longer_than_the_bound() -> None:
    assert len(errors.BadValue("x" * 10**6).errmsg) <= errors.MAX_ERRMSG_CHARS + 3
    assert errors.shown(b"a" * 10**7).endswith("...(10000000 bytes)")
    assert len(errors.shown([b"b" * 10**6] * 10)) < 600


@pytest.mark.parametrize("door", DOORS)
async def test_a_commits_writes_are_charged_once_as_if_one_by_one(
    node: Node, mock_clock: trio.testing.MockClock, door: str
) -> None:
    """The writes a commit delivers are charged to the throttle in one sum per
    bucket, less what was reserved for each when it was admitted; the state
    afterwards is that of charging each write on its own."""
    from tenantkv.storage.records import HEADER_BYTES

    cfg = node.config
    sizes = [10, 5000, 9000, 100, 13000, 1, 4096, 20000] * 2
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        node.throttle.set_bucket("b", hard_limit=800)  # 80 units a slice: 76 of them spent
        mock_clock.jump(1.0)
        ref = frozen_copy(node.throttle)
        for i, n in enumerate(sizes):
            wu = write_units(len(b"w%d" % i) + HEADER_BYTES + n, cfg.write_unit_size)
            floor = cfg.min_op_units * cfg.write_weight
            ref.charge("b", 0, wu, min_cost=max(floor, cfg.write_weight * wu))
        reqs = [(i, "set", {"key": b"w%d" % i, "value": b"x" * n}) for i, n in enumerate(sizes)]
        await peer.send(*reqs)
        got = await peer.responses(len(sizes))
        assert all(r.error is None for r in got)
        b, r = node.throttle._buckets["b"], ref._buckets["b"]
        assert r.hard < 5  # the writes spent nearly all of the slice
        assert (b.credit, b.hard, b.wu_total, b.used_window) == (
            r.credit,
            r.hard,
            r.wu_total,
            r.used_window,
        )
        assert node.bucket_stats["b"].ops["set"] == len(sizes)
        await peer.stream.aclose()


async def test_each_write_of_a_run_is_admitted_at_its_own_cost(node: Node) -> None:
    """A run's writes used to join it on the room of the other gates alone, the
    throttle asked once: a chunk of large writes overshot the hard limit by all
    but the first. Each joining write is admitted at its own cost and reserved;
    one the throttle cannot admit now waits its turn. A write costlier than
    throttle_max_request_secs of the hard limit runs once the bucket owes nothing."""
    node.throttle.set_bucket("b", hard_limit=1000)  # 100 units a slice
    node.throttle.max_debt_secs = 0.05  # 50 units: the 200-unit write is a big one
    big = b"x" * (100 * node.config.write_unit_size - 100)  # 100 WU: 200 units
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send(HELLO)
        assert [r.error for r in await peer.responses(1)] == [None]
        await trio.sleep(0.2)  # a fresh slice: the counter full
        start = trio.current_time()
        # One chunk: the big write would join the run of the write before it.
        await peer.send(
            (1, "set", {"key": b"a", "value": b"1"}),
            (2, "set", {"key": b"big", "value": big}),
            (3, "set", {"key": b"c", "value": b"3"}),
            (4, "set", {"key": b"d", "value": b"4"}),
        )
        got = sorted(await peer.responses(4), key=lambda r: r.msgid)
        assert [r.error for r in got] == [None] * 4
        # The big write waited for the next refill (the counter full again), then
        # its 200 units were repaid before c ran: 100 units a slice.
        assert trio.current_time() - start >= 0.2
        st = node.throttle.statistics().buckets["b"]
        assert st.wu_total == 1 + 100 + 1 + 1
        await peer.stream.aclose()


@pytest.mark.parametrize("door", DOORS)
async def test_a_pipelined_chunk_of_writes_keeps_to_max_inflight_per_connection(
    node: Node, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    """A connection never has more than max_inflight_per_connection writes
    unanswered, however many its chunk carries: the rest wait for answers."""
    from tenantkv.server.write_run import WriteRun

    await node.parameters.set("max_inflight_per_connection", 8)
    seen: list[int] = []
    added: list[int] = []
    add_many = WriteRun.add_many  # (add calls it too)

    def counted_add(self: WriteRun, msgids: list[int], ops: list[Any], nbytes: int) -> None:
        add_many(self, msgids, ops, nbytes)
        added.extend(msgids)
        seen.append(self._session.pending_writes)

    monkeypatch.setattr(WriteRun, "add_many", counted_add)
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send(*((i, "set", {"key": b"k%d" % i, "value": b"v"}) for i in range(40)))
        got = await peer.responses(40)
        assert sorted(r.msgid for r in got) == list(range(40))
        assert all(r.error is None for r in got)
        await peer.stream.aclose()
    # (each write added once: RESP numbers its commands from its AUTH)
    assert len(set(added)) == len(added) == 40 and max(seen) == 8


async def test_a_write_that_fails_its_checks_within_a_run_gets_its_own_error(
    node: Node,
) -> None:
    """A write joining its run is checked like any write (parameters, value): one
    that fails gets its own error and the run goes on; a write of another
    command starts a run of its own, in order."""
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send(
            (1, "set", {"key": b"a", "value": b"1"}),
            (2, "set", {"key": b"b", "value": b"2", "nope": 1}),
            (3, "set", {"key": b"b", "value": 2}),
            (4, "set", {"key": b"b", "value": b"2"}),
            (5, "delete", {"key": b"a"}),
            (6, "set", {"key": b"c", "value": b"3"}),
            (7, "get", {"key": b"a"}),
            (8, "get", {"key": b"b"}),
        )
        # (a write refused by its checks is answered at once, before the writes
        # ahead of it are durable: answers go by msgid)
        got = sorted(await peer.responses(8), key=lambda r: r.msgid)
        assert [r.error["codeName"] if r.error else r.result for r in got[:5]] == [
            {"cas": got[0].result["cas"]},
            "BadValue",
            "BadValue",
            {"cas": got[3].result["cas"]},
            True,
        ]
        assert got[5].error is None and got[6].result is None
        assert got[7].result["value"] == b"2"
        await peer.stream.aclose()


async def test_reads_that_fail_in_a_run_are_errors_not_served_operations(node: Node) -> None:
    """Inline reads are counted per run: one that fails (a bad key) is an error
    of its bucket, not one of its operations, wherever it falls in the run."""
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send(
            HELLO,
            (1, "get", {"key": b"a"}),
            (2, "get", {"key": 5}),
            (3, "get", {"key": b"x" * 300}),
            (4, "get", {"key": "b"}),
            (5, "exists", {"key": b"a"}),
        )
        got = await peer.responses(6)
        codes = [r.error["codeName"] if r.error else None for r in got]
        assert codes == [None, None, "BadValue", "KeyTooLong", None, None]
        await peer.stream.aclose()
    stats = node.bucket_stats["b"]
    assert stats.ops["get"] == 2 and stats.ops["exists"] == 1
    assert stats.errors["BadValue"] == 1 and stats.errors["KeyTooLong"] == 1


async def test_a_long_run_of_reads_answers_each_in_order_and_pauses_for_fairness(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipelined chunk of reads runs as runs of the same command: every request
    answered once, in order, each with its own outcome — an unknown parameter,
    another read command, a handler's internal error among them — and the chunk
    still yields to other connections every FAIR_SHARE_REQUESTS requests."""
    from tenantkv.server import commands, executor

    pauses: list[int] = []
    pause = Executor._pause

    async def counted_pause(self: Executor) -> None:
        pauses.append(len(pauses))
        await pause(self)

    monkeypatch.setattr(Executor, "_pause", counted_pause)
    get = commands.COMMANDS["get"]

    def flaky(s: Any, b: Any, p: dict[str, Any]) -> Any:
        if p.get("key") == b"boom":
            raise RuntimeError("a handler bug")
        return get.handler(s, b, p)

    monkeypatch.setitem(commands.COMMANDS, "get", dataclasses.replace(get, handler=flaky))
    n = 3 * executor.FAIR_SHARE_REQUESTS + 10
    reqs: list[tuple[int, str, dict[str, Any]]] = [(i, "get", {"key": b"k"}) for i in range(n)]
    reqs[100] = (100, "get", {"key": b"k", "bogus": 1})
    reqs[200] = (200, "exists", {"key": b"k"})
    reqs[300] = (300, "get", {"key": b"boom"})
    reqs[executor.FAIR_SHARE_REQUESTS - 1] = (255, "get", {"key": 7})
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send((9999, "set", {"key": b"k", "value": b"v"}))
        await peer.responses(1)
        pauses.clear()
        await peer.send(*reqs)
        got = await peer.responses(n)
        assert [r.msgid for r in got] == list(range(n))
        codes = {i: r.error["codeName"] for i, r in enumerate(got) if r.error}
        assert codes == {100: "BadValue", 255: "BadValue", 300: "InternalError"}
        assert got[200].result is True
        assert all(r.result["value"] == b"v" for i, r in enumerate(got) if i not in (200, *codes))
        assert len(pauses) >= 3  # at each FAIR_SHARE_REQUESTS requests, a failure's too
        await peer.stream.aclose()
    stats = node.bucket_stats["b"]
    assert stats.ops["get"] == n - 4 and stats.ops["exists"] == 1
    assert stats.errors["BadValue"] == 2


@pytest.mark.parametrize("door", DOORS)
async def test_a_chunk_of_writes_holds_the_gates_as_the_per_operation_path_would(
    node: Node, door: str
) -> None:
    """The writes of one chunk are admitted as a run sharing one set of holds: with
    4 write slots in the bucket queue, the first 4 run and the 5th waits — where
    admitting each write on its own would split them — and the gates hold exactly
    what 4 held writes and 1 waiting one hold until the writer takes them. Once
    every write is answered, every gate is back where it started."""
    pipeline = node.pipeline
    node.queues.set_bucket("b", "write", concurrency=4)
    stalled: list[Any] = []
    real_submit_many = node.writer.submit_many  # type: ignore[union-attr]
    node.writer.submit_many = stalled.extend  # type: ignore[union-attr]
    before = pipeline.statistics()
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery, door)
        await peer.send(*((i, "set", {"key": b"w%d" % i, "value": b"v"}) for i in range(1, 13)))
        await trio.testing.wait_all_tasks_blocked()
        # The run, as one item of 4 writes; the 5th waits for a slot.
        assert [p.op.op_count for p in stalled] == [4]
        q = node.queues.queues.queue("b", "write")
        assert (q.running, len(q.waiters)) == (4, 1)
        assert node.write_tickets._out == 4
        assert node.permits.permits.permits("b").in_use == 4
        assert node.ingress_tickets._out == 5  # the waiting write holds its ingress ticket
        node.writer.submit_many = real_submit_many  # type: ignore[union-attr]
        real_submit_many(stalled)
        got = await peer.responses(12)
        assert [r.msgid for r in got] == list(range(1, 13))
        assert all(r.error is None for r in got)
        await peer.stream.aclose()
    after = pipeline.statistics()
    assert (q.running, len(q.waiters), q.admitted) == (0, 0, 12)
    assert node.write_tickets._out == 0 and node.ingress_tickets._out == 0
    assert node.permits.permits.permits("b").in_use == 0
    b, a = before.write_tickets, after.write_tickets
    assert a.finished_processing - b.finished_processing == 12  # one per write
    b, a = before.ingress, after.ingress  # (a write that must wait tries twice)
    started, finished = a.started_processing, a.finished_processing
    assert started - b.started_processing == finished - b.finished_processing
    assert node.bucket_stats["b"].ops["set"] == 12


async def test_a_run_of_writes_answers_counts_and_charges_each_write_as_its_own(
    node: Node, mock_clock: trio.testing.MockClock
) -> None:
    """Writes that fail in the writer (``add`` of a key that exists) share a run with
    writes that succeed: each gets its own answer, the failures are their bucket's
    errors (and cost the floor: they ran), the successes its operations."""
    from tenantkv.storage.records import HEADER_BYTES

    cfg = node.config
    async with trio.open_nursery() as nursery:
        peer = await hello_session(node, nursery)
        await peer.send((1, "set", {"key": b"a", "value": b"old"}))
        await peer.responses(1)
        mock_clock.jump(1.0)
        ref = frozen_copy(node.throttle)
        before = node.bucket_stats["b"].ops["set"]
        reqs = [
            (2, "set", {"key": b"a", "value": b"x", "mode": "add"}),
            (3, "set", {"key": b"b", "value": b"y" * 5000, "mode": "add"}),
            (4, "set", {"key": b"a", "value": b"z", "mode": "add"}),
            (5, "set", {"key": b"c", "value": b"w", "mode": "add"}),
        ]
        floor = cfg.min_op_units * cfg.write_weight
        for _, _, p in reqs:
            if p["key"] == b"a":
                ref.charge("b", 0, 0, min_cost=floor)  # ran and failed: the floor
            else:
                n = len(p["key"]) + HEADER_BYTES + len(p["value"])
                wu = write_units(n, cfg.write_unit_size)
                ref.charge("b", 0, wu, min_cost=max(floor, cfg.write_weight * wu))
        await peer.send(*reqs)
        got = await peer.responses(4)
        assert [(r.msgid, r.error["codeName"] if r.error else None) for r in got] == [
            (2, "KeyExists"),
            (3, None),
            (4, "KeyExists"),
            (5, None),
        ]
        await peer.stream.aclose()
    stats = node.bucket_stats["b"]
    assert stats.ops["set"] - before == 2 and stats.errors["KeyExists"] == 2
    b, r = node.throttle._buckets["b"], ref._buckets["b"]
    assert (b.wu_total, b.used_window) == (r.wu_total, r.used_window)


async def test_a_connection_that_authenticates_and_idles_holds_no_unpacker(node: Node) -> None:
    """The unpacker made for hello (41 KiB) goes once hello is answered, unless
    more came with it; between requests it stays (the sweep drops it once idle)."""
    async with trio.open_nursery() as nursery:
        session, peer = await start_session(node, nursery)
        await peer.send(HELLO)
        assert [r.error for r in await peer.responses(1)] == [None]
        decoder = session.decoder
        assert isinstance(decoder, protocol.RequestDecoder)
        assert not decoder.unpackers
        await peer.send((1, "get", {"key": b"k"}), (2, "get", {"key": b"k"}))
        assert len(await peer.responses(2)) == 2
        assert decoder.unpackers  # kept from request to request
        nursery.cancel_scope.cancel()


async def test_hello_with_a_request_behind_it_keeps_the_unpacker(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        peer = await run_session(node, nursery)
        await peer.send(
            HELLO,
            (1, "set", {"key": b"k", "value": b"v"}),
            (2, "get", {"key": b"k"}),
        )
        answers = await peer.responses(3)
        assert [r.error for r in answers] == [None, None, None]
        assert answers[2].result["value"] == b"v"
        nursery.cancel_scope.cancel()
