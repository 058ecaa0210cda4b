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
from typing import Any, NamedTuple

import msgpack

from tenantkv import errors

REQUEST = 0
RESPONSE = 1

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


class Request(NamedTuple):
    msgid: int
    method: str
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    msgid: int
    error: dict[str, Any] | None
    result: Any


def _unpacker(max_frame_bytes: int) -> msgpack.Unpacker:
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        max_buffer_size=max_frame_bytes,
        max_bin_len=max_frame_bytes,
        max_str_len=min(max_frame_bytes, MAX_STR_BYTES),
        max_array_len=MAX_CONTAINER_LEN,
        max_map_len=MAX_CONTAINER_LEN,
        max_ext_len=0,
    )


class RequestDecoder:
    """Server side: feed received bytes, iterate complete, well-formed requests.

    Raises :class:`~tenantkv.errors.ProtocolError` or
    :class:`~tenantkv.errors.FrameTooLarge`; after either the decoder is dead
    and the connection must close.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._unpacker = _unpacker(max_frame_bytes)

    def feed(self, data: bytes) -> None:
        try:
            self._unpacker.feed(data)
        except msgpack.BufferFull:
            raise errors.FrameTooLarge(f"request frame larger than {self._max} bytes") from None

    def __iter__(self) -> Iterator[Request]:
        while True:
            try:
                obj = next(self._unpacker)
            except StopIteration:
                return
            except msgpack.BufferFull:
                raise errors.FrameTooLarge(f"request frame larger than {self._max} bytes") from None
            except ValueError as exc:  # ExtraData, FormatError, StackError, limits, bad UTF-8
                raise errors.ProtocolError(f"malformed MessagePack: {exc}") from None
            except Exception as exc:  # msgpack raises a few other types on hostile input
                raise errors.ProtocolError(f"malformed MessagePack: {exc!r}") from None
            yield self._validate(obj)

    def _validate(self, obj: Any) -> Request:
        if type(obj) is not list or len(obj) != 4:
            raise errors.ProtocolError("a request must be the array [0, msgid, method, params]")
        kind, msgid, method, params = obj
        if kind != REQUEST or type(kind) is not int:
            raise errors.ProtocolError("a request must start with type 0")
        if type(msgid) is not int or not 0 <= msgid < 2**32:
            raise errors.ProtocolError("msgid must be an integer in [0, 2**32)")
        if type(method) is not str:
            raise errors.ProtocolError("method must be a string")
        if params is None:
            params = {}
        elif type(params) is not dict:
            raise errors.ProtocolError("params must be a map")
        return Request(msgid, method, params)


_packer = msgpack.Packer(use_bin_type=True)


def encode_response(msgid: int, error: dict[str, Any] | None, result: Any) -> bytes:
    return _packer.pack([RESPONSE, msgid, error, result])


def encode_result(msgid: int, result: Any) -> bytes:
    return _packer.pack([RESPONSE, msgid, None, result])


def encode_error(msgid: int | None, exc: errors.TenantKVError) -> bytes:
    """An error response; ``msgid`` None (the frame was unreadable) encodes as nil."""
    return _packer.pack([RESPONSE, msgid, exc.to_wire(), None])


def encode_request(msgid: int, method: str, params: dict[str, Any]) -> bytes:
    return msgpack.packb([REQUEST, msgid, method, params], use_bin_type=True)


def _short(obj: Any) -> str:
    return reprlib.repr(obj)[:100]


class ResponseDecoder:
    """Client side: feed received bytes, iterate responses."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._unpacker = _unpacker(max_frame_bytes)

    def feed(self, data: bytes) -> None:
        try:
            self._unpacker.feed(data)
        except msgpack.BufferFull:
            raise errors.ConnectionClosed("response frame exceeds the frame bound") from None

    def __iter__(self) -> Iterator[Response]:
        while True:
            try:
                obj = next(self._unpacker)
            except StopIteration:
                return
            except Exception as exc:
                raise errors.ConnectionClosed(f"malformed response from server: {exc!r}") from None
            if type(obj) is not list or len(obj) != 4 or obj[0] != RESPONSE:
                # reprlib: a deeply nested reply must not blow the stack while we describe it
                raise errors.ConnectionClosed(f"malformed response from server: {_short(obj)}")
            yield Response(obj[1], obj[2], obj[3])
