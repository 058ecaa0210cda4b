"""The load generator: one protocol-agnostic load loop, run in worker processes.

Why it looks like this:

- **The generator must not be the bottleneck.** One Python process saturates
  long before a server on the other core does, so connections are spread over
  several worker *processes* (``multiprocessing``, fork). Each worker owns raw
  non-blocking sockets and one ``epoll`` loop — no asyncio/Trio, no per-request
  objects. Request bytes are precomputed once per worker (a ring of encoded
  requests, stored twice back to back, so sending ``k`` requests is one
  zero-copy ``memoryview`` slice and one ``send``). Replies are only counted
  (ok / error) by a cheap streaming parser per protocol.
- **Pipeline depth N** = keep N requests outstanding per connection. In the
  default closed loop, every completed reply immediately releases one more
  request, so the server is driven at its maximum throughput.
- **Open loop from the start** (``rate``): each connection schedules requests
  at fixed intervals and sends whatever is due (at most ``depth`` outstanding);
  latency is measured from the *scheduled* send time, not the actual one, so a
  server stall shows up in the latencies instead of silently pausing the
  generator (coordinated omission).
- **Latency** is recorded per batch of replies (one clock read per ``recv``),
  into a log-linear histogram (8 significant bits, < 0.8 % bucket error) that
  is cheap to update and to send back to the parent.
- **Mixed loads** (op ``mixed``): every connection interleaves GETs and SETs
  in a fixed ratio, from the same precomputed ring; ``switch_after`` changes
  the ratio mid-run on the same connections. **Poisson arrivals**
  (``poisson``): open loop with exponential gaps, each connection's send
  times drawn before the start. ``split_errors`` keeps error replies (e.g.
  rejections) out of the latency histograms and counts them by code.
- **YCSB workloads** (op ``workload``): the ring is a seeded plan from
  :mod:`bench.workloads` — GETs, SETs and (tenantkv only) scans of zipfian,
  uniform or latest keys, in the workload's exact mix.
- **Codecs** are the only protocol-specific part: they encode a request, do
  the blocking handshake, and make a reply parser. Requests carry no per-op
  state the loop must track: replies come back in request order on both
  protocols, so a FIFO of send times pairs them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import select
import socket
import time
import traceback
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

import msgpack

from bench import workloads

RECV_BYTES = 256 * 1024
#: Cap on the bytes of one worker's request ring (matters only for big values).
RING_BYTES = 32 * 1024 * 1024
#: After the window closes, how long a worker waits for outstanding replies.
DRAIN_SECONDS = 10.0
#: Most expected-reply repetitions the RESP fast path compares at once.
RESP_RUN = 256
HANDSHAKE_TIMEOUT = 15.0
#: Open loop: waits shorter than this use select() for sub-millisecond timing.
FINE_WAIT = 0.005
#: select()'s bound on descriptor numbers (glibc)
FD_SETSIZE = 1024

OPS = ("get", "set")
#: ``LoadSpec.op`` of a mixed load: each request is a GET or a SET in the fixed
#: ratio ``LoadSpec.set_fraction`` (not offered on the throughput command line).
MIXED = "mixed"
#: ``LoadSpec.op`` of a YCSB workload (``LoadSpec.workload``, ``.distribution``):
#: the ring holds a plan from :mod:`bench.workloads` (GETs, SETs, scans).
WORKLOAD = "workload"
#: Most requests in a workload ring (fewer if ``RING_BYTES`` is reached first):
#: 13 per key over 10 000 records, so a zipfian ring holds the cold tail too.
WORKLOAD_RING = 1 << 17


class BenchError(RuntimeError):
    """The benchmark could not run (server unreachable, handshake refused, ...)."""


# -- reply parsers -----------------------------------------------------------------


class ReplyParser(Protocol):
    """Counts complete replies in a byte stream; keeps one error for the report."""

    error_sample: str | None

    def feed(self, data: bytes) -> tuple[int, int]:
        """Consume bytes; return (ok replies, error replies) completed by them."""
        ...


class MsgpackRpcParser:
    """tenantkv replies ``[1, msgid, error, result]``: a streaming Unpacker in C.

    ``raw=True`` and ``use_list=False`` skip UTF-8 decoding and list building
    (~0.3 µs per reply here); only the error slot is looked at.
    """

    __slots__ = ("_unpacker", "error_sample")

    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=True, use_list=False, max_buffer_size=1 << 30)
        self.error_sample: str | None = None

    def feed(self, data: bytes) -> tuple[int, int]:
        up = self._unpacker
        up.feed(data)
        ok = err = 0
        for obj in up:
            if obj[2] is None:
                ok += 1
            else:
                err += 1
                if self.error_sample is None:
                    self.error_sample = repr(obj[2])[:300]
        return ok, err


class MsgpackRpcFlagParser(MsgpackRpcParser):
    """Like :class:`MsgpackRpcParser`, and also says *which* replies failed.

    After each :meth:`feed`, ``flags`` holds one byte per reply it completed
    (1 = error), so the load loop can keep the latencies of errors (e.g.
    rejections) apart from those of successes, and ``codes`` counts that
    feed's errors by their numeric ``code``.
    """

    __slots__ = ("codes", "flags")

    def __init__(self) -> None:
        super().__init__()
        self.flags = bytearray()
        self.codes: dict[int, int] = {}

    def feed(self, data: bytes) -> tuple[int, int]:
        up = self._unpacker
        up.feed(data)
        flags = self.flags = bytearray()
        codes = self.codes = {}
        ok = err = 0
        for obj in up:
            e = obj[2]
            if e is None:
                ok += 1
                flags.append(0)
                continue
            err += 1
            flags.append(1)
            code = e.get(b"code", -1) if isinstance(e, dict) else -1
            codes[code] = codes.get(code, 0) + 1
            if self.error_sample is None:
                self.error_sample = repr(e)[:300]
        return ok, err


class RespParser:
    """Minimal RESP2 reply parser for the replies the benchmark causes.

    Handles ``+simple``, ``-error``, ``:integer`` and ``$n`` bulk / ``$-1`` nil.
    Fast path: when every success reply is known in advance (``+OK`` for SET,
    ``$n<value>`` for GET of keys holding the same value) a run of them is
    verified with one C-level ``startswith`` instead of a Python step per
    reply. Anything else (an error, a nil) falls back to the general parser.
    """

    __slots__ = ("_buf", "_expected", "_run", "_slow", "error_sample")

    def __init__(self, expected: bytes | None = None) -> None:
        self._buf = bytearray()
        self._expected = expected
        self._run = memoryview(expected * RESP_RUN) if expected else None
        self._slow = 0  # replies left to parse the slow way after a fast-path miss
        self.error_sample: str | None = None

    def feed(self, data: bytes) -> tuple[int, int]:
        buf = self._buf
        buf += data
        n = len(buf)
        pos = ok = err = 0
        exp, run = self._expected, self._run
        while pos < n:
            if exp is not None and run is not None and not self._slow:
                size = len(exp)
                k = min((n - pos) // size, RESP_RUN)
                if k and buf.startswith(run[: k * size], pos):
                    ok += k
                    pos += k * size
                    continue
                if not k and exp.startswith(bytes(buf[pos:n])):
                    break  # an incomplete expected reply: wait for more bytes
                self._slow = 64
            c = buf[pos]
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if c == 36:  # $ bulk string
                length = int(buf[pos + 1 : eol])
                end = eol + 2 if length < 0 else eol + 4 + length
                if end > n:
                    break
                ok += 1
            elif c == 43 or c == 58:  # + simple string, : integer
                end = eol + 2
                ok += 1
            elif c == 45:  # - error
                end = eol + 2
                err += 1
                if self.error_sample is None:
                    self.error_sample = bytes(buf[pos:eol]).decode(errors="replace")[:300]
            else:
                raise BenchError(f"unexpected RESP reply type {chr(c)!r}")
            pos = end
            if self._slow:
                self._slow -= 1
        if pos:
            del buf[:pos]
        return ok, err


# -- codecs ------------------------------------------------------------------------


class Codec(Protocol):
    """What the load loop needs to know about a wire protocol."""

    name: str

    def encode(self, op: str, key: bytes, value: bytes, seq: int) -> bytes:
        """The bytes of one request (``seq`` may become a request id)."""
        ...

    def parser(self, op: str, value: bytes) -> ReplyParser:
        """A fresh reply counter for a connection sending only ``op``."""
        ...

    def handshake(self, sock: socket.socket) -> None:
        """Authenticate / select the bucket on a new blocking socket; raise on failure."""
        ...


def _read_until(sock: socket.socket, parser: ReplyParser, replies: int) -> tuple[int, int]:
    """Blocking: read until ``replies`` replies are complete."""
    ok = err = 0
    while ok + err < replies:
        data = sock.recv(RECV_BYTES)
        if not data:
            raise BenchError("server closed the connection")
        o, e = parser.feed(data)
        ok, err = ok + o, err + e
    return ok, err


@dataclass(frozen=True)
class TenantKVCodec:
    """MessagePack-RPC: ``[0, msgid, method, params]``; keys and values as bin."""

    user: str
    password: str
    bucket: str
    name: str = "tenantkv"

    def encode(self, op: str, key: bytes, value: bytes, seq: int) -> bytes:
        params: dict[str, Any] = {"key": key} if op == "get" else {"key": key, "value": value}
        return msgpack.packb([0, seq & 0xFFFFFFFF, op, params], use_bin_type=True)

    def encode_scan(self, start: bytes, end: bytes | None, limit: int, seq: int) -> bytes:
        """``scan`` of up to ``limit`` records with ``start <= key < end`` (workload E)."""
        params: dict[str, Any] = {"start": start, "limit": limit}
        if end is not None:
            params["end"] = end
        return msgpack.packb([0, seq & 0xFFFFFFFF, "scan", params], use_bin_type=True)

    def parser(self, op: str, value: bytes) -> ReplyParser:
        # Any op: only the error slot is read, so a GET miss (nil result) and
        # a scan page both count as one ok reply.
        return MsgpackRpcParser()

    def handshake(self, sock: socket.socket) -> None:
        from tenantkv import __version__

        hello = {
            "user": self.user,
            "password": self.password,
            "bucket": self.bucket,
            "client": {"name": "tenantkv-bench", "version": __version__},
            "backpressure": True,
        }
        sock.sendall(msgpack.packb([0, 0, "hello", hello], use_bin_type=True))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = sock.recv(RECV_BYTES)
            if not data:
                raise BenchError("tenantkv closed the connection during hello")
            unpacker.feed(data)
            for reply in unpacker:
                if reply[2] is not None:
                    raise BenchError(f"tenantkv hello failed: {reply[2]}")
                return


def resp_command(*args: bytes) -> bytes:
    """A RESP array of bulk strings: how every Redis command is sent."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


@dataclass(frozen=True)
class RedisCodec:
    """RESP2 ``GET key`` / ``SET key value``."""

    password: str | None = None
    name: str = "redis"

    def encode(self, op: str, key: bytes, value: bytes, seq: int) -> bytes:
        if op == "get":
            return resp_command(b"GET", key)
        return resp_command(b"SET", key, value)

    def parser(self, op: str, value: bytes) -> ReplyParser:
        # ``mixed`` / ``workload``: the fast path expects GET hits; a +OK or a
        # nil ($-1, a GET miss) drops to the general parser for a while.
        expected = b"+OK\r\n" if op == "set" else b"$%d\r\n%s\r\n" % (len(value), value)
        return RespParser(expected)

    def handshake(self, sock: socket.socket) -> None:
        cmds = [resp_command(b"AUTH", self.password.encode())] if self.password else []
        cmds.append(resp_command(b"PING"))
        sock.sendall(b"".join(cmds))
        parser = RespParser()
        _, err = _read_until(sock, parser, len(cmds))
        if err:
            raise BenchError(f"redis handshake failed: {parser.error_sample}")


# -- what to run -------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    codec: Any  # a Codec; Any keeps the frozen dataclass picklable and simple


@dataclass(frozen=True)
class LoadSpec:
    """One cell of a benchmark: an op, a connection count, a pipeline depth."""

    op: str
    conns: int
    depth: int
    value: bytes
    keys: int
    seconds: float
    warmup: float
    #: total target ops/s over all connections (open loop); None = closed loop, max rate
    rate: float | None = None
    #: most worker processes (connections are spread round-robin over them)
    workers: int = 2
    #: CPUs the worker processes are pinned to (None = let the OS place them)
    cpus: frozenset[int] | None = None
    key_prefix: bytes = b"bench:"
    #: keys drawn uniformly at random (seeded by ``seed``), as redis-benchmark's
    #: ``-r`` draws them, instead of in order: each commit of SETs then dirties
    #: pages all over the B-tree, not a few neighbouring ones
    random_keys: bool = False
    #: op ``mixed``: the share of SETs (the rest are GETs), in a fixed pattern
    set_fraction: float = 0.0
    #: op ``mixed``: seconds after the load starts (warm-up included) at which
    #: every connection switches to ``switch_set_fraction`` (a workload change)
    switch_after: float | None = None
    switch_set_fraction: float = 0.0
    #: open loop: Poisson arrivals (exponential gaps, mean ``conns / rate``)
    #: instead of fixed intervals; latency still counts from the scheduled time
    poisson: bool = False
    #: seed of the Poisson gaps (each connection adds its index) and of a workload plan
    seed: int = 1
    #: keep error replies out of the latency histograms (they go to
    #: ``LoadResult.hist_err``) and count them by error code (tenantkv only)
    split_errors: bool = False
    #: op ``workload``: a YCSB workload of :data:`bench.workloads.WORKLOADS`
    #: ("A".."F"); ``keys`` are its preloaded records (indexes 0..keys-1)
    workload: str | None = None
    #: op ``workload``: key choice, one of :data:`bench.workloads.DISTRIBUTIONS`
    distribution: str = "zipfian"


def cell_spec(args: Any, op: str, conns: int, depth: int, value: bytes, **kw: Any) -> LoadSpec:
    """A cell of a subcommand's grid: its keys, window and generator CPUs from the
    flags (``--keys``, ``--seconds``, ``--warmup``, ``--pin``); ``kw`` overrides."""
    flags = {"keys": args.keys, "seconds": args.seconds, "warmup": args.warmup}
    flags["cpus"] = getattr(args, "client_cpus", None)
    return LoadSpec(op=op, conns=conns, depth=depth, value=value, **{**flags, **kw})


def key_name(prefix: bytes, i: int) -> bytes:
    return b"%s%08d" % (prefix, i)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no bound)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


@dataclass
class LoadResult:
    ok: int
    errors: int
    window_s: float
    #: latency histogram: bucket lower bound in ns -> count
    hist: dict[int, int]
    #: CPU seconds the worker processes used inside the window
    client_cpu_s: float
    #: CPU seconds the server process used inside the window (None if unknown)
    server_cpu_s: float | None
    error_sample: str | None = None
    workers: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    #: open loop only: latency from the *actual* send time instead of the
    #: scheduled one (what the server and network added, without the
    #: generator's own lateness in sending)
    hist_sent: dict[int, int] = field(default_factory=dict)
    #: ``split_errors`` only: latency histogram of the error replies, and
    #: error replies by numeric code
    hist_err: dict[int, int] = field(default_factory=dict)
    error_codes: dict[int, int] = field(default_factory=dict)

    @property
    def ops_per_s(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    def percentile_us(self, q: float, *, from_send: bool = False) -> float | None:
        """The q-quantile (0..1) of the recorded latencies, in µs.

        ``from_send`` (open loop): of the latencies counted from the actual send.
        """
        return hist_percentile_us(self.hist_sent if from_send else self.hist, q)


def hist_percentile_us(hist: dict[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of a latency histogram (ns buckets), in µs."""
    total = sum(hist.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(hist):
        seen += hist[bucket]
        if seen >= rank:
            return bucket / 1000.0
    return max(hist) / 1000.0


# -- the worker loop ---------------------------------------------------------------


class _Conn:
    __slots__ = (
        "fd",
        "inflight",
        "outstanding",
        "parser",
        "pos",
        "sched",
        "scheduled",
        "sock",
        "start_ns",
        "wbuf",
    )

    def __init__(self, sock: socket.socket, parser: ReplyParser, pos: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.parser = parser
        self.pos = pos  # next request in the ring
        self.outstanding = 0
        #: FIFO of (first scheduled/send time ns, count, step ns between them,
        #: actual send time ns)
        self.inflight: deque[tuple[int, int, int, int]] = deque()
        self.wbuf = bytearray()  # bytes the kernel did not take yet
        self.start_ns = 0  # open loop: the first scheduled send
        self.scheduled = 0  # open loop: requests scheduled so far
        #: Poisson open loop: scheduled send times (ns after start_ns), in order
        self.sched: array[int] | None = None


def mixed_op(i: int, set_fraction: float) -> str:
    """Request ``i`` of a mixed ring: SETs spread evenly, exactly ``set_fraction`` of them."""
    return "set" if int((i + 1) * set_fraction) > int(i * set_fraction) else "get"


def build_ring(
    codec: Codec, spec: LoadSpec, set_fraction: float | None = None
) -> tuple[bytes, list[int], int]:
    """Encode ``R`` requests once; stored twice so any run of <= R is contiguous.

    A ``mixed`` load interleaves SETs and GETs in the ratio ``set_fraction``
    (default ``spec.set_fraction``); a ``workload`` load replays a plan.
    """
    if spec.op == WORKLOAD:
        return _workload_ring(codec, spec)
    mixed = spec.op == MIXED
    frac = spec.set_fraction if set_fraction is None else set_fraction
    sample = len(
        codec.encode("set" if mixed else spec.op, key_name(spec.key_prefix, 0), spec.value, 0)
    )
    ring = max(2 * spec.depth, min(spec.keys, max(64, RING_BYTES // sample)))
    if mixed and frac not in (0.0, 1.0):
        ring = max(ring, 100)  # so the ratio holds over the ring to within 1 %
    rng = random.Random(spec.seed) if spec.random_keys else None
    reqs = [
        codec.encode(
            mixed_op(i, frac) if mixed else spec.op,
            key_name(spec.key_prefix, rng.randrange(spec.keys) if rng else i % spec.keys),
            spec.value,
            i,
        )
        for i in range(ring)
    ]
    return _ring(reqs)


def _ring(reqs: list[bytes]) -> tuple[bytes, list[int], int]:
    offs = [0]
    for r in reqs + reqs:
        offs.append(offs[-1] + len(r))
    return b"".join(reqs) * 2, offs, len(reqs)


def _workload_ring(codec: Codec, spec: LoadSpec) -> tuple[bytes, list[int], int]:
    """The ring of a YCSB workload: ``WORKLOAD_RING`` requests of its plan, or
    as many as ``RING_BYTES`` holds. Scans stay inside the spec's key prefix."""
    assert spec.workload is not None
    sample = len(codec.encode("set", key_name(spec.key_prefix, spec.keys), spec.value, 0))
    ring = max(2 * spec.depth, min(WORKLOAD_RING, max(64, RING_BYTES // sample)))
    steps = workloads.plan(spec.workload, ring, spec.keys, spec.distribution, spec.seed)
    end = prefix_end(spec.key_prefix)
    encode_scan = getattr(codec, "encode_scan", None)
    reqs = []
    for i, s in enumerate(steps):
        key = key_name(spec.key_prefix, s.key)
        if s.op != "scan":
            reqs.append(codec.encode(s.op, key, spec.value, i))
        elif encode_scan is None:
            raise BenchError(f"workload {spec.workload} scans; {codec.name} cannot")
        else:
            reqs.append(encode_scan(key, end, s.count, i))
    return _ring(reqs)


#: The phases of a worker's run, in order (:meth:`_Driver.phase`): before the
#: common start; load not counted; load counted; no new requests, outstanding
#: replies read (up to ``DRAIN_SECONDS``); done.
WAITING, WARMUP, MEASURING, DRAINING, DONE = "waiting", "warmup", "measuring", "draining", "done"


def _bucket(lat: int) -> int:
    """A latency's histogram bucket: its 8 most significant bits (< 0.8 % wide)."""
    b = lat.bit_length()
    return (lat >> (b - 8)) << (b - 8) if b > 8 else lat


def _add(hist: dict[int, int], lat: int, n: int) -> None:
    if n:
        b = _bucket(lat)
        hist[b] = hist.get(b, 0) + n


def _pop_inflight(
    q: deque[tuple[int, int, int, int]], n: int
) -> Iterator[tuple[int, int, int, int]]:
    """Take ``n`` completed replies off a connection's FIFO of in-flight runs,
    yielding ``(time, count, step, actual send)`` for each part a run gave.

    Closed loop: step 0, all sent at ``time``. Open loop: step > 0, request j
    was due at ``time + j * step``. Poisson: step -1, ``time`` is the index of
    the run's first request in the connection's ``sched``."""
    while n:
        t, k, step, sent = q[0]
        if k <= n:
            q.popleft()
            take = k
        else:
            q[0] = (t + n * step if step >= 0 else t + n, k - n, step, sent)
            take = n
        n -= take
        yield t, take, step, sent


def _scheduled_latencies(c: _Conn, now: int, t: int, take: int, step: int) -> list[int]:
    """Open loop: each reply's latency from the time its request was due."""
    if step < 0:
        base, sched = c.start_ns, c.sched
        assert sched is not None
        return [now - base - sched[j] for j in range(t, t + take)]
    return [now - t - j * step for j in range(take)]


@dataclass
class _Ring:
    """Encoded requests stored twice back to back (:func:`build_ring`)."""

    blob: memoryview
    offs: list[int]
    size: int


class _Driver:
    """One worker's connections from the common start to the last reply: a small
    state machine whose phase follows the clock (:data:`WAITING` ... :data:`DONE`).

    Each step waits for socket events (or for the next open-loop send), reads
    replies, records their latencies when the window is on, and sends: closed
    loop, one new request per reply; open loop, what the schedule has made due.
    ``switch`` = (instant, ring): from then on requests come from another ring
    (a workload change). ``split``: error replies go to ``hist_err`` instead of
    ``hist`` / ``hist_sent`` (the parsers are :class:`MsgpackRpcFlagParser`).
    A connection with a ``sched`` runs Poisson open loop.
    """

    IN = select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP
    OUT = select.EPOLLOUT

    def __init__(
        self,
        conns: list[_Conn],
        ring: _Ring,
        depth: int,
        interval_ns: int,
        window: tuple[int, int, int],
        switch: tuple[int, _Ring] | None = None,
        split: bool = False,
    ) -> None:
        self.conns, self.ring, self.depth, self.interval_ns = conns, ring, depth, interval_ns
        self.t_go, self.t_measure, self.t_end = window
        self.switch, self.split = switch, split
        self.by_fd = {c.fd: c for c in conns}
        self.fds = list(self.by_fd)
        # select() takes descriptors below FD_SETSIZE only (a process holding
        # thousands of sockets, as bench attack does, gets higher ones): else sleep.
        self.fine_select = max(self.fds, default=0) < FD_SETSIZE
        self.open_loop = interval_ns > 0
        self.poisson = self.open_loop and conns[0].sched is not None
        self.hist: dict[int, int] = {}
        self.hist_sent: dict[int, int] = {}
        self.hist_err: dict[int, int] = {}
        self.codes: dict[int, int] = {}  # split: error replies in the window by code
        self.ok = self.errors = 0
        self.lag_n = self.lag_sum = self.lag_max = 0
        self.cpu_start: float | None = None
        self.cpu_used = 0.0
        self.ep = select.epoll()

    def phase(self, now: int) -> str:
        if now < self.t_go:
            return WAITING
        if now < self.t_measure:
            return WARMUP
        if now < self.t_end:
            return MEASURING
        return DRAINING if any(c.outstanding for c in self.conns) else DONE

    def run(self) -> dict[str, Any]:
        clock = time.monotonic_ns
        for c in self.conns:
            self.ep.register(c.fd, select.EPOLLIN)
        try:
            while clock() < self.t_go:
                time.sleep(max(0.0, (self.t_go - clock()) / 1e9))
            self._start(clock())
            while self.phase(now := clock()) in (WARMUP, MEASURING):
                self._step(now)
            self.cpu_used = time.process_time() - (self.cpu_start or 0.0)
            self._drain()
        finally:
            self.ep.close()
        return self._result()

    def _start(self, now: int) -> None:
        for c in self.conns:
            if self.open_loop:
                c.start_ns += self.t_go
            else:
                self._send(c, self.depth, now, 0, now)

    def _step(self, now: int) -> None:
        if self.cpu_start is None and now >= self.t_measure:
            self.cpu_start = time.process_time()
        if self.switch is not None and now >= self.switch[0]:
            self.ring = self.switch[1]  # _send() takes from the new ring from here on
            for c in self.conns:
                c.pos %= self.ring.size
            self.switch = None
        events = self._wait(max(0.0, (self._wake() - now) / 1e9))
        now = time.monotonic_ns()
        refill = not self.open_loop and now < self.t_end
        for fd, ev in events:
            c = self.by_fd[fd]
            if ev & self.OUT:
                self._flush(c)
            if ev & self.IN:
                n = self._receive(c, now)
                if n and refill:
                    self._send(c, n, now, 0, now)
        if self.open_loop:
            self._send_due(now)

    def _wake(self) -> int:
        """The next instant this worker has something to do without a reply."""
        wake = self.t_end if self.cpu_start is not None else self.t_measure
        if self.switch is not None:
            wake = min(wake, self.switch[0])
        if self.open_loop:
            for c in self.conns:
                if c.outstanding < self.depth:
                    if self.poisson:
                        s = c.sched
                        assert s is not None
                        if c.scheduled < len(s):
                            wake = min(wake, c.start_ns + s[c.scheduled])
                    else:
                        wake = min(wake, c.start_ns + c.scheduled * self.interval_ns)
        return wake

    def _wait(self, timeout: float) -> list[tuple[int, int]]:
        if self.open_loop and 0 < timeout < FINE_WAIT:
            # epoll's timeout is whole milliseconds; select() waits to ~50 µs
            if self.fine_select:
                select.select(self.fds, (), (), timeout)
            else:
                time.sleep(timeout)
            return self.ep.poll(0)
        return self.ep.poll(timeout)

    def _send_due(self, now: int) -> None:
        """Open loop: send what each connection's schedule has made due."""
        depth, interval = self.depth, self.interval_ns
        for c in self.conns:
            i = c.scheduled
            if self.poisson:
                s = c.sched
                assert s is not None
                k = min(bisect_right(s, now - c.start_ns, i) - i, depth - c.outstanding)
                if k <= 0:
                    continue
                first = c.start_ns + s[i]
                self._send(c, k, i, -1, now)
            else:
                k = min((now - c.start_ns) // interval + 1 - i, depth - c.outstanding)
                if k <= 0:
                    continue
                first = c.start_ns + i * interval
                self._send(c, k, first, interval, now)
            c.scheduled += k
            if self.cpu_start is not None:  # how late the generator sent (diagnostic)
                self.lag_n += 1
                self.lag_sum += now - first
                self.lag_max = max(self.lag_max, now - first)

    def _send(self, c: _Conn, k: int, t: int, step: int, sent: int) -> None:
        ring, start = self.ring, c.pos
        data = ring.blob[ring.offs[start] : ring.offs[start + k]]
        c.pos = (start + k) % ring.size
        c.outstanding += k
        c.inflight.append((t, k, step, sent))
        if c.wbuf:
            c.wbuf += data
            return
        n = c.sock.send(data)
        if n < len(data):
            c.wbuf += data[n:]
            self.ep.modify(c.fd, select.EPOLLIN | self.OUT)

    def _flush(self, c: _Conn) -> None:
        n = c.sock.send(c.wbuf)
        del c.wbuf[:n]
        if not c.wbuf:
            self.ep.modify(c.fd, select.EPOLLIN)

    def _receive(self, c: _Conn, now: int) -> int:
        data = c.sock.recv(RECV_BYTES)
        if not data:
            raise BenchError("the server closed a connection during the run")
        ok, err = c.parser.feed(data)
        n = ok + err
        if not n:
            return 0
        c.outstanding -= n
        if not self.t_measure <= now < self.t_end:
            for _ in _pop_inflight(c.inflight, n):
                pass
            return n
        self.ok += ok
        self.errors += err
        if self.split:
            self._record_split(c, n, now)
            for code, m in c.parser.codes.items():  # type: ignore[attr-defined]
                self.codes[code] = self.codes.get(code, 0) + m
        else:
            self._record(c, n, now)
        return n

    def _record(self, c: _Conn, n: int, now: int) -> None:
        hist = self.hist
        for t, take, step, sent in _pop_inflight(c.inflight, n):
            if not step:
                _add(hist, now - t, take)
                continue
            _add(self.hist_sent, now - sent, take)  # open loop: also from the actual send
            for lat in _scheduled_latencies(c, now, t, take, step):
                _add(hist, lat, 1)

    def _record_split(self, c: _Conn, n: int, now: int) -> None:
        """As :meth:`_record`, with each reply's error flag from the parser."""
        flags = c.parser.flags  # type: ignore[attr-defined]
        pos = 0
        for t, take, step, sent in _pop_inflight(c.inflight, n):
            nerr = flags.count(1, pos, pos + take)
            if not step:
                _add(self.hist, now - t, take - nerr)
                _add(self.hist_err, now - t, nerr)
            else:
                _add(self.hist_sent, now - sent, take - nerr)
                for j, lat in enumerate(_scheduled_latencies(c, now, t, take, step)):
                    _add(self.hist_err if flags[pos + j] else self.hist, lat, 1)
            pos += take

    def _drain(self) -> None:
        clock = time.monotonic_ns
        deadline = clock() + int(DRAIN_SECONDS * 1e9)
        while self.phase(clock()) == DRAINING and clock() < deadline:
            for fd, ev in self.ep.poll(0.1):
                c = self.by_fd[fd]
                if ev & self.OUT:
                    self._flush(c)
                if ev & self.IN:
                    self._receive(c, clock())

    def _result(self) -> dict[str, Any]:
        errors = [c.parser.error_sample for c in self.conns if c.parser.error_sample]
        return {
            "ok": self.ok,
            "errors": self.errors,
            "hist": self.hist,
            "hist_sent": self.hist_sent,
            "hist_err": self.hist_err,
            "codes": self.codes,
            "cpu_s": self.cpu_used,
            "error_sample": errors[0] if errors else None,
            "undrained": sum(c.outstanding for c in self.conns),
            "lag": (self.lag_n, self.lag_sum, self.lag_max),
        }


def _connect(target: Target) -> socket.socket:
    try:
        sock = socket.create_connection((target.host, target.port), timeout=HANDSHAKE_TIMEOUT)
    except OSError as exc:
        raise BenchError(f"cannot connect to {target.host}:{target.port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _tight_timers() -> None:
    """Ask Linux for 1 µs timer slack (default 50 µs) so open-loop sends are on time."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns


def poisson_schedule(mean_gap_ns: int, seconds: float, seed: int) -> array[int]:
    """Send times (ns from the start) of a Poisson process: exponential gaps with
    mean ``mean_gap_ns``, covering ``seconds``."""
    rng = random.Random(seed)
    lam = 1.0 / mean_gap_ns
    horizon = int(seconds * 1e9)
    out = array("q")
    t = 0.0
    while t <= horizon:
        t += rng.expovariate(lam)
        out.append(int(t))
    return out


def _open_conns(
    target: Target, spec: LoadSpec, ring: int, conn_ids: list[int], interval_ns: int
) -> list[_Conn]:
    """Connect, handshake and set up the worker's connections (each starts at its
    own place in the ring and, open loop, its own offset inside one interval)."""
    socks: list[socket.socket] = []
    try:
        for _ in conn_ids:
            socks.append(_connect(target))
            target.codec.handshake(socks[-1])
            socks[-1].setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    conns = []
    for g, sock in zip(conn_ids, socks, strict=True):
        split = spec.split_errors
        parser = MsgpackRpcFlagParser() if split else target.codec.parser(spec.op, spec.value)
        c = _Conn(sock, parser, g * ring // spec.conns)
        c.start_ns = g * interval_ns // spec.conns
        if spec.poisson and interval_ns:
            c.sched = poisson_schedule(interval_ns, spec.warmup + spec.seconds + 1.0, spec.seed + g)
        conns.append(c)
    return conns


def _worker_main(
    pipe: Connection, target: Target, spec: LoadSpec, conn_ids: list[int], interval_ns: int
) -> None:
    """One worker process: connect and handshake, report ready, run when told."""
    conns: list[_Conn] = []
    _tight_timers()
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    try:
        blob, offs, size = build_ring(target.codec, spec)
        ring = _Ring(memoryview(blob), offs, size)
        second = None
        if spec.switch_after is not None:
            blob2, offs2, size2 = build_ring(target.codec, spec, spec.switch_set_fraction)
            second = _Ring(memoryview(blob2), offs2, size2)
        conns = _open_conns(target, spec, size, conn_ids, interval_ns)
        pipe.send(("ready", None))
        msg = pipe.recv()
        if msg[0] != "go":
            return
        window = msg[1:]
        switch = None
        if second is not None and spec.switch_after is not None:
            switch = (window[0] + int(spec.switch_after * 1e9), second)
        driver = _Driver(conns, ring, spec.depth, interval_ns, window, switch, spec.split_errors)
        pipe.send(("done", driver.run()))
    except BaseException as exc:
        detail = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
        with contextlib.suppress(OSError):
            pipe.send(("error", detail))
    finally:
        for c in conns:
            c.sock.close()
        pipe.close()


def run_load(
    target: Target,
    spec: LoadSpec,
    server_cpu: Callable[[], float | None] | None = None,
) -> LoadResult:
    """Run one cell: fork workers, start them together, merge what they measured.

    ``server_cpu`` (the server process's CPU seconds so far) is sampled at the
    window's edges so the report can show how busy the server was.
    """
    results, samples = run_loads([(target, spec)], server_cpu)
    res = results[0]
    if len(samples) == 2 and samples[0][1] is not None and samples[1][1] is not None:
        res.server_cpu_s = samples[1][1] - samples[0][1]
    return res


def run_loads(
    loads: Sequence[tuple[Target, LoadSpec]],
    probe: Callable[[], Any] | None = None,
    probe_every: float | None = None,
    on_ready: Callable[[], None] | None = None,
) -> tuple[list[LoadResult], list[tuple[int, Any]]]:
    """Run several loads at once over one shared window; one result per load.

    Each load (a target, e.g. one bucket, and its spec) gets its own worker
    processes; all start at the same instant, and every spec must have the same
    ``warmup`` and ``seconds``. ``probe`` (e.g. a ``server_status`` snapshot) is
    called at the start of the window, every ``probe_every`` seconds inside it,
    and at its end; the samples come back as ``(monotonic ns, value)`` pairs.
    ``on_ready`` is called once every worker has connected, just before the
    start (e.g. to begin a disturbance the connections must not meet).
    """
    _check_loads(loads)
    spec0 = loads[0][1]
    #: per load: its worker processes and their pipes
    groups: list[list[tuple[Any, Connection]]] = []
    samples: list[tuple[int, Any]] = []
    try:
        for li, (target, spec) in enumerate(loads):
            groups.append(_fork_workers(li, target, spec))
        for procs in groups:
            for _, pipe in procs:
                _expect(pipe, "ready", HANDSHAKE_TIMEOUT * 2)
        if on_ready is not None:
            on_ready()
        t_go = time.monotonic_ns() + 50_000_000
        t_measure = t_go + int(spec0.warmup * 1e9)
        t_end = t_measure + int(spec0.seconds * 1e9)
        for procs in groups:
            for _, pipe in procs:
                pipe.send(("go", t_go, t_measure, t_end))
        if probe is not None:
            samples = _probe_window(probe, probe_every, t_measure, t_end)
        limit = spec0.warmup + spec0.seconds + DRAIN_SECONDS + 30
        per_load = [[_expect(pipe, "done", limit) for _, pipe in procs] for procs in groups]
    finally:
        for procs in groups:
            _stop_workers(procs)
    return [_merge_results(results, (t_end - t_measure) / 1e9) for results in per_load], samples


def _check_loads(loads: Sequence[tuple[Target, LoadSpec]]) -> None:
    if not loads:
        raise ValueError("no loads")
    spec0 = loads[0][1]
    for target, spec in loads:
        if spec.op not in (*OPS, MIXED, WORKLOAD):
            raise ValueError(f"op must be one of {(*OPS, MIXED, WORKLOAD)}")
        if (spec.op == WORKLOAD) != (spec.workload is not None):
            raise ValueError("a workload needs op WORKLOAD, and op WORKLOAD a workload")
        if spec.op == WORKLOAD:
            _check_workload(target, spec)
        if spec.split_errors and not isinstance(target.codec, TenantKVCodec):
            raise ValueError("split_errors needs the tenantkv codec")
        if (spec.warmup, spec.seconds) != (spec0.warmup, spec0.seconds):
            raise ValueError("loads run together must share warmup and seconds")


def _fork_workers(li: int, target: Target, spec: LoadSpec) -> list[tuple[Any, Connection]]:
    """A load's worker processes (its connections spread round-robin over them)."""
    ctx = mp.get_context("fork")
    nworkers = max(1, min(spec.workers, spec.conns))
    interval_ns = int(1e9 * spec.conns / spec.rate) if spec.rate else 0
    procs: list[tuple[Any, Connection]] = []
    for w in range(nworkers):
        ids = list(range(w, spec.conns, nworkers))
        parent, child = ctx.Pipe()
        p = ctx.Process(
            target=_worker_main,
            args=(child, target, spec, ids, interval_ns),
            name=f"bench-worker-{li}-{w}",
            daemon=True,
        )
        p.start()
        child.close()
        procs.append((p, parent))
    return procs


def _probe_window(
    probe: Callable[[], Any], every: float | None, t_measure: int, t_end: int
) -> list[tuple[int, Any]]:
    """``probe()`` at the window's start, every ``every`` s inside it, and at its end."""
    _sleep_until(t_measure)
    samples = [(time.monotonic_ns(), probe())]
    if every:
        step = int(every * 1e9)
        t_next = t_measure + step
        while t_next < t_end - step // 4:
            _sleep_until(t_next)
            samples.append((time.monotonic_ns(), probe()))
            t_next += step
    _sleep_until(t_end)
    samples.append((time.monotonic_ns(), probe()))
    return samples


def _stop_workers(procs: list[tuple[Any, Connection]]) -> None:
    for p, pipe in procs:
        if p.is_alive():
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
        pipe.close()


def _merge_results(results: list[dict[str, Any]], window_s: float) -> LoadResult:
    """One load's result from its workers' reports."""
    hists: dict[str, dict[int, int]] = {"hist": {}, "hist_sent": {}, "hist_err": {}, "codes": {}}
    for r in results:
        for name, merged in hists.items():
            for b, n in r[name].items():
                merged[b] = merged.get(b, 0) + n
    errs = [r["error_sample"] for r in results if r["error_sample"]]
    return LoadResult(
        ok=sum(r["ok"] for r in results),
        errors=sum(r["errors"] for r in results),
        window_s=window_s,
        hist=hists["hist"],
        client_cpu_s=sum(r["cpu_s"] for r in results),
        server_cpu_s=None,
        error_sample=errs[0] if errs else None,
        workers=len(results),
        extra=_extra(results),
        hist_sent=hists["hist_sent"],
        hist_err=hists["hist_err"],
        error_codes=hists["codes"],
    )


def _check_workload(target: Target, spec: LoadSpec) -> None:
    w = workloads.WORKLOADS.get(spec.workload or "")
    if w is None:
        raise ValueError(f"workload must be one of {tuple(workloads.WORKLOADS)}")
    if spec.distribution not in workloads.DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {workloads.DISTRIBUTIONS}")
    if spec.keys < 2:
        raise ValueError("a workload needs keys >= 2")
    if w.scans and not hasattr(target.codec, "encode_scan"):
        raise ValueError(f"workload {w.name} scans; the {target.codec.name} codec cannot")


def _extra(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Diagnostics: replies never received, and (open loop) how late sends went out."""
    lag_n = sum(r["lag"][0] for r in results)
    out: dict[str, Any] = {"undrained": sum(r["undrained"] for r in results)}
    if lag_n:
        out["send_lag_mean_us"] = round(sum(r["lag"][1] for r in results) / lag_n / 1000, 1)
        out["send_lag_max_us"] = round(max(r["lag"][2] for r in results) / 1000, 1)
    return out


def _sleep_until(t_ns: int) -> None:
    while (left := t_ns - time.monotonic_ns()) > 0:
        time.sleep(left / 1e9)


def _expect(pipe: Connection, what: str, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise BenchError(f"a load worker did not report {what!r} within {timeout:.0f} s")
    try:
        msg = pipe.recv()
    except EOFError:
        raise BenchError("a load worker died") from None
    if msg[0] == "error":
        raise BenchError(f"load worker failed: {msg[1]}")
    if msg[0] != what:
        raise BenchError(f"load worker sent {msg[0]!r}, expected {what!r}")
    return msg[1]


def preload(target: Target, keys: int, value: bytes, key_prefix: bytes = b"bench:") -> None:
    """Write every key once (pipelined, 256 at a time) so GETs find a value."""
    codec = target.codec
    sock = _connect(target)
    try:
        codec.handshake(sock)
        parser = codec.parser("set", value)
        for start in range(0, keys, 256):
            batch = [
                codec.encode("set", key_name(key_prefix, i), value, i)
                for i in range(start, min(keys, start + 256))
            ]
            sock.sendall(b"".join(batch))
            _, err = _read_until(sock, parser, len(batch))
            if err:
                raise BenchError(f"preload failed on {codec.name}: {parser.error_sample}")
    finally:
        sock.close()
