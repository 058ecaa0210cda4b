"""The Redis protocol (RESP2 and RESP3) for tenantkv's second front door — bytes in,
commands out, replies in, bytes out; no I/O.

Clients send a command as an array of bulk strings (``*2\\r\\n$3\\r\\nGET\\r\\n$1\\r\\nk\\r\\n``)
or, typed by hand (redis-cli, telnet), as an inline line (``GET k\\r\\n``). The
decoder is bounded like :class:`tenantkv.protocol.RequestDecoder`, as the
bytes arrive: a declared bulk length above ``max_bulk_bytes``, an argument
count above :data:`MAX_ARGS`, a command that stores nothing above
:data:`MAX_CONTROL_BYTES`, an inline line longer than
:data:`MAX_INLINE_BYTES`, a nested array or a frame above ``max_frame_bytes`` is
a :class:`~tenantkv.errors.ProtocolError` (or FrameTooLarge) before the bytes
are buffered, and the connection closes after the error reply, as Redis does.
Arguments are bytes; the command name is compared case-insensitively by the
caller.

Replies are built by :class:`Encoder` for the connection's protocol version:
RESP3 types (null, map, double, boolean) fall back to their RESP2 forms on a
version-2 connection, exactly as Redis does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tenantkv import errors

#: Most arguments in one command: an MSET of the most keys a command may name
#: (``server.commands.MAX_KEYS_PER_COMMAND``, 1,000: 2,001 arguments) and room
#: to spare. Past it the command is a protocol error before any argument is
#: decoded (Redis allows 1024 * 1024: at 100,000, one DEL took ~150 ms of the
#: event loop to decode, and was refused only then).
MAX_ARGS = 4096
#: Most bytes (counted as for the frame bound) of a command that stores nothing
#: (``AUTH``, ``HELLO``, ``CLIENT SETNAME`` ...), and of any command's name. Past
#: it the command is a protocol error on the ``$N`` header that crosses it,
#: before that argument's body is buffered: such a command cannot use the bytes
#: (a password is at most 1 KiB, a name 128 bytes), and receiving 20 MiB of a
#: client name only to refuse it cost the node work and memory its sender did
#: not pay for.
MAX_CONTROL_BYTES = 4096
#: Commands whose arguments are names, passwords and options, never values.
CONTROL_COMMANDS = frozenset(
    {b"AUTH", b"HELLO", b"CLIENT", b"SELECT", b"COMMAND", b"INFO", b"CONFIG", b"QUIT", b"RESET"}
)
#: The largest bulk string an authenticated client may declare and have
#: refused in-band (Redis's default ``proto-max-bulk-len``, 512 MB): one above
#: ``max_bulk_bytes`` is answered with an error and its bytes dropped as they
#: arrive (:attr:`RequestDecoder.refused`); one above this is a protocol error
#: and the connection closes, as in Redis.
MAX_DISCARD_BYTES = 512 * 1024 * 1024
#: Longest inline command line (Redis's PROTO_INLINE_MAX_SIZE).
MAX_INLINE_BYTES = 64 * 1024
#: Longest line of a multibulk header (``*N`` or ``$N``).
_MAX_HEADER = 32
#: Each argument counts this many bytes against the frame bound on top of its own
#: (a Python bytes object costs ~33 bytes: a frame of empty arguments cannot grow
#: many times its size in memory).
ARG_OVERHEAD = 16
_CRLF = b"\r\n"
#: A well-formed ``*N`` / ``$N`` header's number and CRLF (the fast path of _parse).
_number = re.compile(rb"(-?[0-9]{1,18})\r\n").match
#: First bytes of a MessagePack-RPC frame (an array: fixarray, array 16, array 32).
#: No Redis client starts a command so, and a MessagePack client sent here would
#: otherwise wait, unanswered, for an inline command's newline until the hello
#: timeout.
_MSGPACK_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
#: A command of at most this many arguments and MAX_CONTROL_BYTES (counted as
#: for the frame bound) gives its shape — its argument count and lengths — to
#: the next command: one regular expression of exactly that shape decodes a
#: pipeline of like commands (GET of one key length, SET of one value length)
#: in one match each, in C (:meth:`RequestDecoder._shape_of`), where a header at a time took
#: three matches, a loop and a copy per argument in Python.
SHAPE_ARGS = 8
#: Shapes compiled, node-wide (no more are made once it is full: the decoder
#: then parses as before), and the most a decoder may compile (~50 us each): a
#: client cycling through shapes cannot make each command cost a compile.
MAX_SHAPES = 1024
SHAPES_PER_DECODER = 8
_shapes: dict[tuple[int, ...], re.Pattern[bytes]] = {}


class RequestDecoder:
    """Server side: feed received bytes, iterate complete commands (lists of bytes).

    ``frame_limit`` bounds one command's bytes (lowered until the client
    authenticates, as the MessagePack door does before ``hello``).
    """

    def __init__(
        self, max_bulk_bytes: int, max_frame_bytes: int, msgpack_port: int | None = None
    ) -> None:
        self.max_bulk_bytes = max_bulk_bytes
        #: the server's MessagePack port, named when a MessagePack client knocks here
        self.msgpack_port = msgpack_port
        self.max_frame_bytes = max_frame_bytes
        self.frame_limit = max_frame_bytes
        self._buf: bytes | bytearray = b""
        self._pos = 0  # where the command being decoded starts in _buf
        # A multibulk command being decoded, resumed where the last chunk ended (so
        # a 20 MiB MSET arriving in many chunks is parsed once, not once per chunk):
        self._args: list[bytes] = []
        self._left = 0  # arguments still to come
        self._cursor = 0  # where the next argument's header starts in _buf
        self._cost = 0  # bytes counted against frame_limit so far
        #: the shape of the last command decoded argument by argument, tried
        #: first on the next (see SHAPE_ARGS), and how many more it may compile
        self._shape: re.Pattern[bytes] | None = None
        self._compiles = SHAPES_PER_DECODER
        #: commands decoded so far
        self.frames = 0
        #: the error of the command just returned, refused for its size: the
        #: caller answers it; the rest of that command is dropped as it arrives
        self.refused: tuple[errors.TenantKVError, int] | None = None
        #: an oversized command being dropped: bytes still to drop, then how
        #: many more arguments (each header read, its body dropped), and the
        #: bytes dropped so far (what the client sent in vain)
        self._skip = 0
        self._drop_args = 0
        self.dropped = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded into commands."""
        return len(self._buf) - self._pos

    @property
    def in_frame(self) -> bool:
        return len(self._buf) > self._pos

    def release_if_idle(self) -> None:
        """Nothing to release: between commands it holds only undecoded bytes."""

    def feed(self, data: bytes | bytearray) -> None:
        if not self._buf:
            # Nothing pending (the usual case): keep the chunk as received, so each
            # argument is sliced straight out of it (one copy, not two).
            self._buf = bytes(data)
            return
        buf = self._buf
        if not isinstance(buf, bytearray):  # a command continues: grow a bytearray
            buf = bytearray(buf[self._pos :])
        elif self._pos:
            del buf[: self._pos]
        self._cursor -= self._pos
        self._pos = 0
        buf += data
        self._buf = buf

    def __iter__(self) -> Iterator[list[bytes]]:
        while (args := self.next_command()) is not None:
            yield args

    def next_command(self) -> list[bytes] | None:
        """The next complete command, or None until more is fed (iterating the
        decoder calls it; a caller that turns commands into requests calls it
        itself: a generator less per command)."""
        pos = self._pos
        while pos < len(self._buf):
            if self._skip or self._drop_args:
                pos = self._drop(pos)
                if self._skip or self._drop_args:
                    break  # (more of the oversized command is still to come)
                continue
            shape = self._shape
            if shape is not None and self._cursor <= pos:
                m = shape.match(self._buf, pos)
                if m is not None:  # (a command of the last one's shape: see _shape_of)
                    self._pos = self._cursor = m.end()
                    self.frames += 1
                    return list(m.groups())
            got = self._parse(pos)
            if got is None:
                if len(self._buf) - pos > self.frame_limit + _MAX_HEADER:
                    raise errors.FrameTooLarge(f"command larger than {self.frame_limit} bytes")
                return None
            args, end = got
            if end - pos > self.frame_limit and self.refused is None:
                raise errors.FrameTooLarge(f"command larger than {self.frame_limit} bytes")
            self._pos = self._cursor = pos = end
            self.frames += 1
            if args or self.refused is not None:  # an empty inline line is skipped
                return args
        self._buf = b""  # idle: hold no buffer
        self._pos = self._cursor = 0
        return None

    def _parse(self, pos: int) -> tuple[list[bytes], int] | None:
        """One command from ``pos``: (arguments, end) or None if incomplete.

        Hot: the state lives in locals and goes back to ``self`` only when the
        command is incomplete; a well-formed header is read by one regex match,
        and anything else by :meth:`_header`, which says what is wrong."""
        buf = self._buf
        blen = len(buf)
        if self._cursor <= pos:  # a new command
            if buf[pos] != 0x2A:  # '*'
                if self.frames == 0 and buf[pos] in _MSGPACK_HEADS:
                    raise errors.ProtocolError(self._wrong_door())
                return self._inline(pos)
            m = _number(buf, pos + 1)
            if m is not None:
                n, cur = int(m[1]), m.end()
            else:
                got = self._header(pos, "*")
                if got is None:
                    return None
                n, cur = got
            if n > MAX_ARGS:
                raise errors.ProtocolError(f"invalid multibulk length (more than {MAX_ARGS})")
            args: list[bytes] = []
            left, cost = max(n, 0), 0
        else:  # resumed where the last chunk ended
            args, left, cost, cur = self._args, self._left, self._cost, self._cursor
        max_bulk, limit = self.max_bulk_bytes, self.frame_limit
        while left:
            if cur >= blen:
                break
            if buf[cur] != 0x24:  # '$'
                raise errors.ProtocolError(f"expected '$', got {chr(buf[cur])!r}")
            m = _number(buf, cur + 1)
            if m is not None:
                size, start = int(m[1]), m.end()
            else:
                got = self._header(cur, "$")
                if got is None:
                    break
                size, start = got
            if size < 0 or size > max_bulk or cost + size + ARG_OVERHEAD > limit:
                return self._oversized(args, left, size, cost, start)
            cost += size + ARG_OVERHEAD
            if cost > MAX_CONTROL_BYTES and (not args or args[0].upper() in CONTROL_COMMANDS):
                raise errors.ProtocolError(_control_error(args))
            end = start + size
            if end + 2 > blen:
                cost -= size + ARG_OVERHEAD  # the header is read again next time: cheap
                break
            if buf[end] != 13 or buf[end + 1] != 10:
                raise errors.ProtocolError("a bulk string must end with CRLF")
            args.append(bytes(buf[start:end]))
            left -= 1
            cur = end + 2
        else:
            self._args, self._cursor = [], cur
            if len(args) <= SHAPE_ARGS and cost <= MAX_CONTROL_BYTES:
                self._shape = self._shape_of(args)
            return args, cur
        # Incomplete: keep what was decoded, resume at ``cur`` with the next chunk.
        self._args, self._left, self._cost, self._cursor = args, left, cost, cur
        return None

    def _oversized(
        self, args: list[bytes], left: int, size: int, cost: int, start: int
    ) -> tuple[list[bytes], int]:
        """An argument that breaks a bound, its ``$size`` header read (it ends at
        ``start``). Before authentication, or past :data:`MAX_DISCARD_BYTES`, a
        protocol error (the connection closes, as Redis closes it). Otherwise the
        command is returned as decoded so far with :attr:`refused` set, and the
        rest of it — this argument's body and the ``left - 1`` after it — is
        dropped as it arrives, counted, never buffered: the client (redis-py
        sends a command whole, then reads) gets one error it does not retry, and
        the connection goes on."""
        if size < 0 or size > MAX_DISCARD_BYTES or self.frame_limit < self.max_frame_bytes:
            if size > self.max_bulk_bytes or size < 0:
                raise errors.ProtocolError("invalid bulk length")
            raise errors.FrameTooLarge(f"command larger than {self.frame_limit} bytes")
        declared = cost + size + ARG_OVERHEAD
        if size > self.max_bulk_bytes:
            exc: errors.TenantKVError = errors.ValueTooLarge(
                f"argument of {size} bytes exceeds max_value_bytes={self.max_bulk_bytes}: "
                "the command was not run"
            )
        else:
            exc = errors.ValueTooLarge(
                f"command of more than {self.frame_limit} bytes: the command was not run"
            )
        self.refused = (exc, declared)
        self._skip, self._drop_args = size + 2, left - 1
        self._args, self._left, self._cost = [], 0, 0
        return args, start

    def _drop(self, pos: int) -> int:
        """Drop what has arrived of an oversized command (see :meth:`_oversized`):
        where the bytes left to decode start now."""
        buf = self._buf
        while True:
            if self._skip:
                n = min(self._skip, len(buf) - pos)
                pos += n
                self._skip -= n
                self.dropped += n
                if self._skip:
                    break
            if not self._drop_args or pos >= len(buf):
                break
            if buf[pos] != 0x24:  # '$'
                raise errors.ProtocolError(f"expected '$', got {chr(buf[pos])!r}")
            got = self._header(pos, "$")
            if got is None:
                break
            size, start = got
            if size < 0 or size > MAX_DISCARD_BYTES:
                raise errors.ProtocolError("invalid bulk length")
            self.dropped += start - pos
            self._skip, self._drop_args, pos = size + 2, self._drop_args - 1, start
        if pos >= len(buf):
            self._buf = b""  # all dropped: hold nothing
            pos = 0
        self._pos = self._cursor = pos
        return pos

    def _shape_of(self, args: list[bytes]) -> re.Pattern[bytes] | None:
        """The pattern of commands shaped as ``args`` (well-formed, within every
        bound: this one was decoded and checked), compiled if need be and
        allowed."""
        key = tuple(map(len, args))
        pattern = _shapes.get(key)
        if pattern is None and self._compiles and len(_shapes) < MAX_SHAPES:
            self._compiles -= 1
            body = b"".join(rb"\$%d\r\n(.{%d})\r\n" % (n, n) for n in key)
            pattern = _shapes[key] = re.compile(rb"\*%d\r\n" % len(key) + body, re.DOTALL)
        return pattern

    def _header(self, pos: int, kind: str) -> tuple[int, int] | None:
        """``*N\\r\\n`` / ``$N\\r\\n`` at ``pos``: (N, position after it) or None."""
        buf = self._buf
        what = "multibulk" if kind == "*" else "bulk"
        eol = buf.find(_CRLF, pos + 1, pos + _MAX_HEADER)
        if eol < 0:
            if len(buf) - pos >= _MAX_HEADER:
                raise errors.ProtocolError(
                    f"invalid {'multibulk' if kind == '*' else 'bulk'} length"
                )
            return None
        text = bytes(buf[pos + 1 : eol])
        if not text or not (text.isdigit() or (text[:1] == b"-" and text[1:].isdigit())):
            raise errors.ProtocolError(f"invalid {what} length")
        return int(text), eol + 2

    def _wrong_door(self) -> str:
        port = f" {self.msgpack_port}" if self.msgpack_port else ""
        return (
            "this is the RESP (Redis protocol) port; tenantkv-admin and tenantkv.Client "
            f"talk to the MessagePack port{port}"
        )

    def _inline(self, pos: int) -> tuple[list[bytes], int] | None:
        buf = self._buf
        eol = buf.find(b"\n", pos, pos + MAX_INLINE_BYTES + 2)
        if eol < 0:
            if len(buf) - pos > MAX_INLINE_BYTES:
                raise errors.ProtocolError("too big inline request")
            return None
        line = bytes(buf[pos:eol]).rstrip(b"\r")
        return split_inline(line), eol + 1


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command line like redis-cli: spaces separate arguments, double
    quotes group them (with ``\\n``, ``\\r``, ``\\t``, ``\\\\``, ``\\"`` and ``\\xHH``
    escapes), single quotes group them literally."""
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in b" \t":
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        quote = 0
        while i < n:
            c = line[i]
            if quote:
                if c == 0x5C and i + 1 < n:  # backslash
                    nxt = line[i + 1]
                    if quote == 0x22:  # "
                        if nxt == 0x78 and i + 3 < n:  # \xHH
                            try:
                                cur.append(int(line[i + 2 : i + 4], 16))
                                i += 4
                                continue
                            except ValueError:
                                pass
                        cur.append({0x6E: 10, 0x72: 13, 0x74: 9, 0x62: 8, 0x61: 7}.get(nxt, nxt))
                        i += 2
                        continue
                    if nxt == 0x27:  # \' in single quotes (any other backslash is itself)
                        cur.append(0x27)
                        i += 2
                        continue
                if c == quote:  # the closing quote, which must end the argument
                    quote = 0
                    i += 1
                    if i < n and line[i] not in b" \t":
                        raise errors.ProtocolError("unbalanced quotes in request")
                    break
                cur.append(c)
            elif c in b" \t":
                break
            elif c in (0x22, 0x27) and not cur:
                quote = c
            else:
                cur.append(c)
            i += 1
        if quote:
            raise errors.ProtocolError("unbalanced quotes in request")
        args.append(bytes(cur))


# -- replies ------------------------------------------------------------------------------


class Verbatim(str):
    """A RESP3 verbatim string (``=``; INFO's reply), a bulk string on RESP2."""


class Status(str):
    """A simple string (``+``) inside a nested reply: ``COMMAND DOCS`` flags, which
    redis-cli requires to be status replies."""


class Encoder:
    """Replies for one connection; ``version`` 2 or 3 (``HELLO`` may switch it)."""

    def __init__(self, version: int = 2) -> None:
        self.version = version

    def simple(self, text: str) -> bytes:
        return b"+" + text.encode() + _CRLF

    def error(self, text: str) -> bytes:
        """``-PREFIX message``; CR and LF in the message become spaces."""
        return b"-" + text.replace("\r", " ").replace("\n", " ").encode() + _CRLF

    def integer(self, n: int) -> bytes:
        return b":%d\r\n" % n

    def bulk(self, data: bytes | str) -> bytes:
        if isinstance(data, str):
            data = data.encode()
        return b"$%d\r\n%b\r\n" % (len(data), data)

    def null(self) -> bytes:
        return b"_\r\n" if self.version >= 3 else b"$-1\r\n"

    def null_array(self) -> bytes:
        return b"_\r\n" if self.version >= 3 else b"*-1\r\n"

    def boolean(self, b: bool) -> bytes:
        if self.version >= 3:
            return b"#t\r\n" if b else b"#f\r\n"
        return b":1\r\n" if b else b":0\r\n"

    def double(self, x: float) -> bytes:
        text = repr(x).encode()
        return b",%b\r\n" % text if self.version >= 3 else self.bulk(text)

    def array(self, items: Sequence[Any]) -> bytes:
        return b"*%d\r\n" % len(items) + b"".join(self.value(i) for i in items)

    def set(self, items: Sequence[Any]) -> bytes:
        """A RESP3 set (``~``), an array on RESP2."""
        head = b"~%d\r\n" if self.version >= 3 else b"*%d\r\n"
        return head % len(items) + b"".join(self.value(i) for i in items)

    def map(self, items: Mapping[Any, Any]) -> bytes:
        """A RESP3 map (``%``), a flat key-value array on RESP2."""
        n = len(items)
        head = b"%%%d\r\n" % n if self.version >= 3 else b"*%d\r\n" % (2 * n)
        return head + b"".join(self.value(k) + self.value(v) for k, v in items.items())

    def verbatim(self, text: str) -> bytes:
        if self.version >= 3:
            data = b"txt:" + text.encode()
            return b"=%d\r\n%b\r\n" % (len(data), data)
        return self.bulk(text)

    def value(self, v: Any) -> bytes:
        """Any Python value as the natural RESP type."""
        if v is None:
            return self.null()
        if isinstance(v, bool):
            return self.boolean(v)
        if isinstance(v, int):
            return self.integer(v)
        if isinstance(v, float):
            return self.double(v)
        if isinstance(v, Verbatim):
            return self.verbatim(v)
        if isinstance(v, Status):
            return self.simple(v)
        if isinstance(v, (bytes, str)):
            return self.bulk(v)
        if isinstance(v, Mapping):
            return self.map(v)
        if isinstance(v, (list, tuple)):
            return self.array(v)
        raise TypeError(f"no RESP form for {type(v).__name__}")


def _control_error(args: list[bytes]) -> str:
    if not args:
        return f"a command name longer than {MAX_CONTROL_BYTES} bytes"
    name = args[0].upper().decode(errors="replace")
    return f"{name} takes at most {MAX_CONTROL_BYTES} bytes of arguments"
