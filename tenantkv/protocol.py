"""MessagePack-RPC framing for tenantkv — bytes in, messages out, no I/O.

A request is ``[0, msgid, method, params]`` and a response
``[1, msgid, error, result]``; frames are concatenated MessagePack objects, so
requests may be pipelined and ``msgid`` pairs each response with its request.
``params`` is always a map. ``error`` is ``None`` or the error map of
:meth:`tenantkv.errors.TenantKVError.to_wire`.

The decoder is a bounded streaming ``msgpack.Unpacker``: no frame may exceed
``max_frame_bytes`` and any decode error is fatal to the connection (the
caller replies with the error and closes), so nothing a client sends can grow
the server's memory without bound.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from tenantkv import errors

REQUEST = 0
RESPONSE = 1

#: The server's default TCP port: unassigned by IANA and clear of common database
#: ports. Here, not in the server's config, so a client needs no server module.
DEFAULT_PORT = 7207

#: Longest key accepted, in bytes (memcached's limit; LMDB allows 511).
MAX_KEY_BYTES = 250
#: Longest value accepted, in bytes.
MAX_VALUE_BYTES = 20 * 1024 * 1024
#: Bound on one encoded frame: a maximal value plus room for key and params.
MAX_FRAME_BYTES = MAX_VALUE_BYTES + 64 * 1024
#: Longest method name or string parameter.
MAX_STR_BYTES = 64 * 1024
#: Most elements in one array/map (mget keys, user roles, ...).
MAX_CONTAINER_LEN = 100_000


#: A decoded request, ``(msgid, method, params)``: a plain tuple, which the
#: decoders make once per request (a named tuple costs ~6x as much to build).
Request = tuple[int, str, dict[str, Any]]
#: msgids are unsigned 32-bit.
_MSGID_END = 2**32


@dataclass(frozen=True, slots=True)
class Response:
    msgid: int
    error: dict[str, Any] | None
    result: Any


class _Budget:
    """What the frame being decoded may still build (see :class:`RequestDecoder`)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = FRAME_DECODE_BUDGET

    def count(self, value: Any) -> Any:
        """The unpacker's hook for every array and map it completes (hot: one
        subtraction per container)."""
        self.left -= CONTAINER_COST + len(value)
        if self.left < 0:
            raise _ShapeExceeded
        return value


def _unpacker(max_frame_bytes: int, **hooks: Any) -> msgpack.Unpacker:
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        max_buffer_size=max_frame_bytes,
        max_bin_len=max_frame_bytes,
        max_str_len=min(max_frame_bytes, MAX_STR_BYTES),
        max_array_len=MAX_CONTAINER_LEN,
        max_map_len=MAX_CONTAINER_LEN,
        max_ext_len=0,
        **hooks,
    )


class _ShapeExceeded(Exception):
    """Raised from the unpacker's hooks; turned into a ProtocolError by the decoder."""


#: Largest frame accepted before ``hello``: its credentials and client info fit
#: many times over, and an unauthenticated client can make the server hold no more.
MAX_HELLO_FRAME_BYTES = 4096
#: What decoding one request frame larger than :data:`UNCOUNTED_FRAME_BYTES` may
#: build, whatever its shape: each element (array item or map pair) costs 1 and
#: each array or map CONTAINER_COST more. Unbounded, ``[[], [], ...]`` turns each
#: wire byte into ~64 bytes of Python objects; a real request is an array holding
#: a params map with at most one big list (mget keys) or map (roles) in it, well
#: inside the budget.
FRAME_DECODE_BUDGET = 2 * MAX_CONTAINER_LEN
CONTAINER_COST = 1024
#: So at most this many arrays and maps in one such frame (nesting included).
MAX_FRAME_CONTAINERS = FRAME_DECODE_BUDGET // (CONTAINER_COST + 1)
#: After hello, frames up to this size are decoded without counting what they build: the
#: count costs two Python calls per request (its hooks run for every array and
#: map), about a third of decoding one, and a frame this small cannot build more
#: than ~100x its size (an empty map is 1 byte on the wire and 64 in memory; a
#: map's one pair 3 and ~230), 1.6 MiB — less than a counted frame may.
UNCOUNTED_FRAME_BYTES = 16 * 1024
#: How many leading bytes of a frame :func:`check_frame_head` looks at.
FRAME_HEAD_BYTES = 256
#: A counting unpacker that has decoded this many bytes is replaced by a fresh
#: one when it stops inside a frame: its buffer grew to the largest frame it
#: held and never shrinks, while the connection holds only the partial frame.
COUNTING_RENEW_BYTES = 1024 * 1024

#: ``[0, ...]``: a fixarray of 4 starting with the request type.
_REQUEST_START = bytes([0x94, REQUEST])


class RequestDecoder:
    """Server side: feed received bytes, iterate complete, well-formed requests.

    Bounded in every dimension an attacker controls, as the bytes arrive:

    * a frame's first bytes must be a request (``[0, ...]``), and the lengths its
      head declares must fit the frame bound (:func:`check_frame_head`), so a
      header announcing 4 GiB is refused before its body is buffered;
    * a frame may not exceed :attr:`frame_limit` bytes (lowered to
      :data:`MAX_HELLO_FRAME_BYTES` until ``hello`` succeeds);
    * what a frame decodes to is bounded: after hello, one of at most
      :data:`UNCOUNTED_FRAME_BYTES` (every usual request) is decoded by an
      unpacker that never sees more of the stream than that past the frame's
      start, so it cannot build a larger frame; the moment a frame turns out
      larger, its bytes move to a second unpacker whose hooks count what it
      builds — at most :data:`FRAME_DECODE_BUDGET` elements and
      :data:`MAX_FRAME_CONTAINERS` containers — and which decodes until the
      stream is back at a frame boundary. Before hello every frame is counted;
    * the unpackers (~40 KiB each, mostly the parse stack) are dropped by
      :meth:`release_if_idle` once everything received has been decoded — the
      server's deadline sweep calls it, so an idle connection holds no decoder
      memory past one sweep, while a busy one keeps its unpacker from request to
      request (making one per unpipelined request cost ~1.3 µs and 40 KiB of
      allocation each time).

    Raises :class:`~tenantkv.errors.ProtocolError` or
    :class:`~tenantkv.errors.FrameTooLarge`; after either the decoder is dead
    and the connection must close.
    """

    def __init__(
        self, max_frame_bytes: int = MAX_FRAME_BYTES, *, chunk_bytes: int = 256 * 1024
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        #: the bound on one frame now (the caller lowers it before hello)
        self.frame_limit = max_frame_bytes
        # Room for a partial frame plus one received chunk of whole frames.
        self._buffer_bytes = max_frame_bytes + chunk_bytes
        #: the unpacker of small frames (no hooks), and the counting one; at most
        #: one of them holds undecoded bytes (``_counted`` says which)
        self._fast: msgpack.Unpacker | None = None
        self._counting: msgpack.Unpacker | None = None
        self._counted = False
        # Stream offsets: bytes received, bytes fed to the unpacker in use, the
        # start of the frame being decoded, and where that unpacker's tell() is 0.
        self._got = 0
        self._fed = 0
        self._frame_start = 0
        self._base = 0
        #: received, not yet fed to the fast unpacker (it takes a piece at a time)
        self._rest: bytes | bytearray | memoryview = b""
        #: the bytes of the fast unpacker's partial frame (what moves if it grows)
        self._carry: bytes | bytearray = b""
        self._piece: bytes | bytearray | memoryview = b""  # the last piece fed to it
        self._last: bytes | bytearray = b""  # counting: the last chunk fed, until decoded
        self._head: bytes | bytearray = b""  # counting: a partial frame's first bytes
        self._head_decided = -1  # the frame (count) whose head was decided
        #: what the frame being decoded may still build; the counting unpacker's
        #: hooks count it down (an object of its own: hooks bound to the decoder
        #: would make decoder and unpacker a reference cycle, which only the
        #: garbage collector frees, so a closed connection's unpacker lingered)
        self._budget = _Budget()
        #: requests decoded so far
        self.frames = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded into requests (what this connection holds)."""
        return self._got - self._frame_start

    @property
    def in_frame(self) -> bool:
        """A frame has started and is not complete (its deadline is running)."""
        return self._got > self._frame_start

    @property
    def unpackers(self) -> int:
        """How many unpackers this decoder holds (~41 KiB each; none once idle)."""
        return (self._fast is not None) + (self._counting is not None)

    def feed(self, data: bytes | bytearray) -> None:
        """Take received bytes; iterate the decoder after each feed."""
        if self._got - self._frame_start + len(data) > self._buffer_bytes:
            raise self._too_large()
        self._got += len(data)
        if self._counted:
            assert self._counting is not None
            self._counting.feed(data)
            self._fed += len(data)
            self._last = data
            if self._head:  # a partial frame whose head is still undecided
                self._head += data[: FRAME_HEAD_BYTES - len(self._head)]
                self._decide_head(self._head)
        elif self._rest:  # received again before the last was decoded (rare)
            self._rest = bytes(self._rest) + data
        else:
            self._rest = data

    def _decide_head(self, head: bytes | bytearray) -> None:
        if check_frame_head(head, self.frame_limit) or len(head) >= FRAME_HEAD_BYTES:
            self._head = b""
            self._head_decided = self.frames

    def __iter__(self) -> Iterator[Request]:
        u = self._next_unpacker(None)
        if u is None:
            return
        tell, counted, fed = u.tell, self._counted, self._fed
        while True:
            try:
                obj = next(u)
            except StopIteration:
                u = self._next_unpacker(u)
                if u is None:
                    return
                tell, counted, fed = u.tell, self._counted, self._fed
                continue
            except _ShapeExceeded:
                raise errors.ProtocolError(
                    f"a request frame decodes to too much: at most {FRAME_DECODE_BUDGET} "
                    f"elements, each array or map counting {CONTAINER_COST} more"
                ) from None
            except msgpack.BufferFull:
                raise self._too_large() from None
            except ValueError as exc:  # ExtraData, FormatError, StackError, limits, bad UTF-8
                raise errors.ProtocolError(f"malformed MessagePack: {exc}") from None
            except Exception as exc:  # msgpack raises a few other types on hostile input
                raise errors.ProtocolError(f"malformed MessagePack: {exc!r}") from None
            end = self._base + tell()
            if counted:  # (the fast unpacker cannot complete a frame over its bound)
                if end - self._frame_start > self.frame_limit:
                    raise self._too_large()
                self._budget.left = FRAME_DECODE_BUDGET
            self._frame_start = end
            self.frames += 1
            # The well-formed request, checked inline (hot: once per request);
            # anything else goes to _validate for its precise error.
            if type(obj) is list and len(obj) == 4:
                kind, msgid, method, params = obj
                if (
                    kind == REQUEST
                    and type(kind) is int
                    and type(msgid) is int
                    and 0 <= msgid < _MSGID_END
                    and type(method) is str
                    and type(params) is dict
                ):
                    yield (msgid, method, params)
                else:
                    yield self._validate(obj)
            else:
                yield self._validate(obj)
            if end == fed:
                # All it was fed is decoded: go on without the StopIteration
                # (catching it costs ~0.5 µs, once per received chunk).
                u = self._next_unpacker(u)
                if u is None:
                    return
                tell, counted, fed = u.tell, self._counted, self._fed

    def _next_unpacker(self, u: msgpack.Unpacker | None) -> msgpack.Unpacker | None:
        """The unpacker to take the next frame from, once ``u`` (None: at the start
        of an iteration) has no complete frame left; None when everything received
        is decoded or waits for more bytes."""
        if self._counted:
            if u is None:
                return self._counting
            if self._fed != self._frame_start:
                self._counted_frame_pending()
                return None
            # Back at a frame boundary, with everything received decoded: small
            # frames need no counting again.
            self._counted = False
            self._last = b""
            return None
        pending = self._fed - self._frame_start
        if u is None and pending:
            return self._fast  # what it holds first (a partial frame)
        piece = self._piece
        if piece:  # keep the partial frame's bytes, in case it outgrows the bound
            if not pending:
                self._carry = b""
            elif pending > len(piece):  # the frame began before this piece: extend it
                self._carry += piece  # (a bytearray: a byte-at-a-time sender costs no copies)
            else:
                self._carry = bytearray(piece[-pending:])
            self._piece = b""
        rest = self._rest
        if not rest and not pending:
            return None  # everything received is decoded (the usual end of a chunk)
        bound = self._uncounted_bound()
        if pending >= bound:  # it had that much and did not complete a frame
            return self._count_from_here()
        if not rest:
            if pending and self._head_decided != self.frames:
                self._decide_head(self._carry[:FRAME_HEAD_BYTES])
            return None
        fast = self._fast
        if fast is None:  # at a frame boundary: made once per busy stretch
            fast = self._fast = _unpacker(UNCOUNTED_FRAME_BYTES)
            self._base = self._fed
        # A piece that leaves no frame it can complete over the bound.
        room = bound - pending
        if len(rest) <= room:
            piece, self._rest = rest, b""
        else:
            view = rest if isinstance(rest, memoryview) else memoryview(rest)
            piece, self._rest = view[:room], view[room:]
        fast.feed(piece)
        self._fed += len(piece)
        self._piece = piece
        return fast

    def _too_large(self) -> errors.FrameTooLarge:
        return errors.FrameTooLarge(f"request frame larger than {self.frame_limit} bytes")

    def _uncounted_bound(self) -> int:
        """The largest frame the fast unpacker may complete: none before hello (a
        frame bound of at most :data:`MAX_HELLO_FRAME_BYTES`), so an anonymous
        client's frames are always counted — 4 KiB of empty maps would otherwise
        hold ~290 KiB through authentication."""
        if self.frame_limit <= MAX_HELLO_FRAME_BYTES:
            return 0
        return min(UNCOUNTED_FRAME_BYTES, self.frame_limit)

    def _count_from_here(self) -> msgpack.Unpacker:
        """The fast unpacker's partial frame is over its bound: refuse it, or move
        it and the rest of the chunk to the counting unpacker."""
        carry = self._carry
        if len(carry) >= self.frame_limit:
            raise self._too_large()
        if self._head_decided != self.frames:
            self._decide_head(carry[:FRAME_HEAD_BYTES])
        counting = self._counting
        if counting is None:
            counting = self._counting = self._new_counting()
        self._base = self._frame_start - counting.tell()
        rest = bytes(self._rest)
        counting.feed(carry)
        counting.feed(rest)
        self._fed = self._got
        self._last = rest
        self._fast, self._rest, self._carry = None, b"", b""
        self._budget.left = FRAME_DECODE_BUDGET
        self._counted = True
        return counting

    def _new_counting(self) -> msgpack.Unpacker:
        return _unpacker(
            self._buffer_bytes, list_hook=self._budget.count, object_hook=self._budget.count
        )

    def release_if_idle(self) -> None:
        """Drop the unpackers when nothing received waits to be decoded."""
        if self._got == self._frame_start:
            self._fast = self._counting = None
            self._counted = False
            self._piece = self._carry = self._last = b""

    def _counted_frame_pending(self) -> None:
        """The counting unpacker stopped inside a frame: bound it, and check its
        head before buffering more."""
        pending = self._fed - self._frame_start
        last, self._last = self._last, b""  # hold no received chunk while waiting
        if pending > self.frame_limit:
            raise self._too_large()
        if self._head_decided != self.frames and not self._head:
            # A frame began in the last chunk: check its head before buffering more.
            start = len(last) - pending
            self._head = last[start : start + FRAME_HEAD_BYTES] if start >= 0 else b""
            if self._head:
                self._decide_head(self._head)
        counting = self._counting
        if (
            counting is not None
            and pending <= len(last)
            and counting.tell() >= COUNTING_RENEW_BYTES
        ):
            # Pipelined 20 MiB frames kept a 20 MiB buffer per connection while
            # the cap on what connections hold counted only the frame begun.
            # The partial frame is all in the last chunk: it moves to a fresh
            # unpacker, which decodes it from its start (so its budget restarts).
            self._counting = self._new_counting()
            self._counting.feed(last[len(last) - pending :])
            self._base = self._frame_start
            self._budget.left = FRAME_DECODE_BUDGET

    def _validate(self, obj: Any) -> Request:
        if type(obj) is not list or len(obj) != 4:
            raise errors.ProtocolError("a request must be the array [0, msgid, method, params]")
        kind, msgid, method, params = obj
        if kind != REQUEST or type(kind) is not int:
            raise errors.ProtocolError("a request must start with type 0")
        if type(msgid) is not int or not 0 <= msgid < _MSGID_END:
            raise errors.ProtocolError("msgid must be an integer in [0, 2**32)")
        if type(method) is not str:
            raise errors.ProtocolError("method must be a string")
        if params is None:
            params = {}
        elif type(params) is not dict:
            raise errors.ProtocolError("params must be a map")
        return (msgid, method, params)


def check_frame_head(head: bytes | bytearray, frame_limit: int) -> bool:
    """Walk the MessagePack headers in a frame's first bytes; True once decided.

    Raises ProtocolError unless the frame starts as a request (``[0, ...]``) and
    FrameTooLarge when a declared length (bin/str/ext body, array or map count)
    cannot fit ``frame_limit``. Returns False when ``head`` ends before the walk
    reached a body it can skip past the end of (feed more bytes and call again).
    Looks at a few dozen headers at most: a cheap test before buffering.
    """
    if len(head) < 2:
        if head and head[0] != 0x94:
            raise errors.ProtocolError("a request must be the array [0, msgid, method, params]")
        return False
    if head[:2] != _REQUEST_START:
        if head[0] != 0x94:
            raise errors.ProtocolError("a request must be the array [0, msgid, method, params]")
        raise errors.ProtocolError("a request must start with type 0")
    pos, n = 2, len(head)
    for _ in range(64):
        if pos >= n:
            return False
        b = head[pos]
        size, length_bytes, kind = _HEADERS.get(b, (0, 0, "")) if b >= 0xC0 else _fix(b)
        if kind == "bad":
            raise errors.ProtocolError(f"malformed MessagePack: byte 0x{b:02x}")
        if length_bytes:
            if pos + 1 + length_bytes > n:
                return False
            size = int.from_bytes(head[pos + 1 : pos + 1 + length_bytes], "big")
        pos += 1 + length_bytes
        if kind == "body":
            if size > frame_limit or pos + size > frame_limit:
                raise errors.FrameTooLarge(
                    f"request frame declares {size} bytes; the bound is {frame_limit}"
                )
            pos += size
            if pos > n:
                return True  # the rest is a body the unpacker bounds
        elif kind == "container" and size > MAX_CONTAINER_LEN:
            raise errors.ProtocolError(
                f"a request array or map may hold at most {MAX_CONTAINER_LEN} elements"
            )
        elif kind == "ext":
            raise errors.ProtocolError("MessagePack extension types are not accepted")
    return True


def _fix(b: int) -> tuple[int, int, str]:
    """(size, length bytes, kind) of a one-byte MessagePack header below 0xc0."""
    if b <= 0x7F:
        return 0, 0, "scalar"
    if b <= 0x8F:
        return b & 0x0F, 0, "container"
    if b <= 0x9F:
        return b & 0x0F, 0, "container"
    return b & 0x1F, 0, "body"  # fixstr


def _family(
    first: int, kind: str, *, lengths: tuple[int, ...] = (), sizes: tuple[int, ...] = ()
) -> dict[int, tuple[int, int, str]]:
    """A family of MessagePack headers from ``first`` on, one per width, as the
    specification lists them: bin 8/16/32 has a length field of 1, 2 or 4
    bytes (``lengths``); uint 8..64 a fixed body of 1, 2, 4 or 8 (``sizes``)."""
    widths = [(0, n) for n in lengths] + [(n, 0) for n in sizes]
    return {first + i: (size, length, kind) for i, (size, length) in enumerate(widths)}


#: Headers from 0xc0 on: (fixed body size, length-field bytes, kind).
_HEADERS: dict[int, tuple[int, int, str]] = {
    0xC0: (0, 0, "scalar"),  # nil
    0xC1: (0, 0, "bad"),
    0xC2: (0, 0, "scalar"),  # false, true
    0xC3: (0, 0, "scalar"),
    **_family(0xC4, "body", lengths=(1, 2, 4)),  # bin 8/16/32
    **_family(0xC7, "ext", lengths=(1, 2, 4)),  # ext 8/16/32
    **_family(0xCA, "body", sizes=(4, 8)),  # float 32/64
    **_family(0xCC, "body", sizes=(1, 2, 4, 8)),  # uint 8..64
    **_family(0xD0, "body", sizes=(1, 2, 4, 8)),  # int 8..64
    **_family(0xD4, "ext", sizes=(0, 0, 0, 0, 0)),  # fixext 1..16 (refused unread)
    **_family(0xD9, "body", lengths=(1, 2, 4)),  # str 8/16/32
    **_family(0xDC, "container", lengths=(2, 4)),  # array 16/32
    **_family(0xDE, "container", lengths=(2, 4)),  # map 16/32
    **{b: (0, 0, "scalar") for b in range(0xE0, 0x100)},  # negative fixint
}


_packer = msgpack.Packer(use_bin_type=True)
#: Encode one object (bound once: the server packs a reply per request).
pack = _packer.pack


def encode_response(msgid: int, error: dict[str, Any] | None, result: Any) -> bytes:
    return _packer.pack([RESPONSE, msgid, error, result])


def encode_result(msgid: int, result: Any) -> bytes:
    return _packer.pack([RESPONSE, msgid, None, result])


#: Encoded error maps by what they say: a flood of the same rejection (462, 25)
#: is answered from a template — the msgid packed, the rest copied — not
#: rebuilt and re-packed each time. Bounded: emptied when full.
_ERROR_MAPS: dict[tuple[Any, ...], bytes] = {}
_ERROR_MAPS_MAX = 4096
#: What every response starts with: an array of 4, then 1 (the msgid follows).
RESPONSE_HEAD = _packer.pack([RESPONSE, 0, None, None])[:2]
_NIL = _packer.pack(None)


def error_tail(exc: errors.TenantKVError) -> bytes:
    """What follows the msgid in the error response of ``exc``: its error map and a
    nil result. ``RESPONSE_HEAD + pack(msgid) + error_tail(exc)`` is the response."""
    key = (exc.code, exc.code_name, exc.errmsg, exc.labels, exc.retry_after_ms)
    tail = _ERROR_MAPS.get(key)
    if tail is None:
        if len(_ERROR_MAPS) >= _ERROR_MAPS_MAX:
            _ERROR_MAPS.clear()
        tail = _ERROR_MAPS[key] = _packer.pack(exc.to_wire()) + _NIL
    return tail


def encode_error(msgid: int | None, exc: errors.TenantKVError) -> bytes:
    """An error response; ``msgid`` None (the frame was unreadable) encodes as nil."""
    return RESPONSE_HEAD + _packer.pack(msgid) + error_tail(exc)


def encode_request(msgid: int, method: str, params: dict[str, Any]) -> bytes:
    return msgpack.packb([REQUEST, msgid, method, params], use_bin_type=True)


def _short(obj: Any) -> str:
    return reprlib.repr(obj)[:100]


class ResponseDecoder:
    """Client side: feed received bytes, iterate responses."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._unpacker = _unpacker(max_frame_bytes)

    def feed(self, data: bytes | bytearray) -> None:
        try:
            self._unpacker.feed(data)
        except msgpack.BufferFull:
            raise errors.MalformedReply("response frame exceeds the frame bound") from None

    def __iter__(self) -> Iterator[Response]:
        while True:
            try:
                obj = next(self._unpacker)
            except StopIteration:
                return
            except Exception as exc:
                raise errors.MalformedReply(f"malformed response from server: {exc!r}") from None
            if type(obj) is not list or len(obj) != 4 or obj[0] != RESPONSE:
                # reprlib: a deeply nested reply must not blow the stack while we describe it
                raise errors.MalformedReply(f"malformed response from server: {_short(obj)}")
            yield Response(obj[1], obj[2], obj[3])
