"""The RESP door: unmodified Redis clients, same tenants.

A thin codec, as the MessagePack door is: the same connection
(``server/connection.py``: lifecycle, deadlines, receive-buffer cap,
shutdown) and the same chunk executor (``server/executor.py``: the same
gates, the same units, runs of reads and writes, acknowledged only when
durable). Its decoder (:class:`RequestDecoder`: RESP2/RESP3 commands and
inline lines, every bound checked as the bytes arrive) yields commands; the
door turns each into a request of the executor — ``(sequence number, name,
params)``, its parameters parsed by the command table
(:mod:`tenantkv.server.redis_commands`, which also holds the reply
:class:`~tenantkv.server.redis_commands.Encoder`) — and puts the replies in
order. Connection commands (AUTH, HELLO, PING, INFO, ...:
:mod:`tenantkv.server.redis_connection`) are the door's own (kind
``"door"``), answered through the same reply slots.

A GET from bytes to reply: ``connection.py`` (receive) → this module (decode,
request) → ``redis_commands.py`` (parse, the GET entry) → ``executor.py`` and
``read_run.py`` (admit, run, charge) → ``commands.py`` (the get both doors
run) → ``redis_commands.py`` (the reply) → this module (in order) →
``connection.py`` (send).

Order: Redis replies carry no id, so each command gets a sequence number and its
reply waits in a slot until every earlier one is out (a write answered when
durable, an error found at once, a read answered inline all come out in the
order the commands were sent).

Before authentication only ``AUTH``, ``HELLO``, ``QUIT`` and ``RESET`` run
(Redis 7.0's ``no-auth`` commands; every other known command, ``PING`` and
``ECHO`` included, is answered ``-NOAUTH``), and a command may be
:data:`tenantkv.protocol.MAX_HELLO_FRAME_BYTES` at most. The bucket:
``AUTH user@bucket password`` names it; a user with a role on one bucket only
lands in it; ``SELECT bucket`` switches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tenantkv import errors, protocol
from tenantkv.server import (
    redis_cluster,
    redis_keyspace,
    redis_scan,
    redis_strings,
    redis_transactions,
)
from tenantkv.server.commands import Command
from tenantkv.server.executor import (
    WAITING_COUNTED_BYTES,
    Executor,
    Request,
    authenticate,
    closing_log,
)
from tenantkv.server.node import Node
from tenantkv.server.redis_commands import REDIS_COMMANDS, Encoder, Reply, parse_call
from tenantkv.server.redis_connection import LOCAL, LocalHandler
from tenantkv.server.tracking import Tracker

# -- the codec: bytes in, commands out -----------------------------------------------

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
#: the next commands: one regular expression of exactly that shape decodes a
#: pipeline of like commands (GET of one key length, SET of one value length)
#: in C (:meth:`RequestDecoder._shape_of`), where a header at a time took
#: three matches, a loop and a copy per argument in Python. A shape is of one
#: length, so the run of like commands at the front of the buffer is decoded
#: by one ``findall`` over as many whole shapes as the bytes hold
#: (:meth:`RequestDecoder.next_commands`): as many matches as shapes means they
#: tile the bytes, every one a command in a row.
SHAPE_ARGS = 8
#: Shapes compiled, node-wide (no more are made once it is full: the decoder
#: then parses as before), and the most a decoder may compile (~50 us each): a
#: client cycling through shapes cannot make each command cost a compile.
MAX_SHAPES = 1024
SHAPES_PER_DECODER = 8
#: Fewest like commands decoded as a run (below it, a match each is as cheap).
MIN_RUN = 3
_shapes: dict[tuple[int, ...], tuple[re.Pattern[bytes], int]] = {}


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
        self._shape_bytes = 0  # (the length of every command of that shape)
        self._compiles = SHAPES_PER_DECODER
        #: the bytes before which a run was found broken (a command of another
        #: shape among them): decoded a command at a time up to there, so a
        #: broken run is looked for once, not once per command
        self._no_run_before = 0
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
            self._no_run_before = 0
            return
        buf = self._buf
        if not isinstance(buf, bytearray):  # a command continues: grow a bytearray
            buf = bytearray(buf[self._pos :])
        elif self._pos:
            del buf[: self._pos]
        self._cursor -= self._pos
        self._no_run_before = max(0, self._no_run_before - self._pos)
        self._pos = 0
        buf += data
        self._buf = buf

    def __iter__(self) -> Iterator[list[bytes]]:
        while (args := self.next_command()) is not None:
            yield args

    def next_commands(self) -> Sequence[Sequence[bytes]]:
        """The next complete commands: every command in a row at the front of
        the buffer shaped as the last one decoded argument by argument (one
        ``findall`` for the run: see SHAPE_ARGS), else the next command alone;
        none until more is fed. (What a door that turns commands into requests
        calls: per command, a tuple of its arguments instead of a call, a match
        and a list.)"""
        shape, pos = self._shape, self._pos
        if shape is not None and pos >= self._no_run_before and self._cursor <= pos:
            size = self._shape_bytes
            buf = self._buf
            count = (len(buf) - pos) // size
            # (findall gives a tuple of groups per match when there are several)
            if count >= MIN_RUN and shape.groups > 1 and not (self._skip or self._drop_args):
                end = pos + count * size
                run = shape.findall(buf, pos, end)
                if len(run) == count:  # (as many as fit: they tile the bytes)
                    self.frames += count
                    if end == len(buf):
                        self._buf = b""  # idle: hold no buffer
                        end = 0
                    self._pos = self._cursor = end
                    return run
                self._no_run_before = end
        one = self.next_command()
        return () if one is None else (one,)

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
        known = _shapes.get(key)
        if known is None and self._compiles and len(_shapes) < MAX_SHAPES:
            self._compiles -= 1
            body = b"".join(rb"\$%d\r\n(.{%d})\r\n" % (n, n) for n in key)
            pattern = re.compile(rb"\*%d\r\n" % len(key) + body, re.DOTALL)
            size = len(b"*%d\r\n" % len(key)) + sum(len(b"$%d\r\n\r\n" % n) + n for n in key)
            known = _shapes[key] = (pattern, size)
        if known is None:
            return None
        self._shape_bytes = known[1]
        return known[0]

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


def _control_error(args: list[bytes]) -> str:
    if not args:
        return f"a command name longer than {MAX_CONTROL_BYTES} bytes"
    name = args[0].upper().decode(errors="replace")
    return f"{name} takes at most {MAX_CONTROL_BYTES} bytes of arguments"


# -- the door ------------------------------------------------------------------------

log = logging.getLogger("tenantkv.session")

#: The command modules that add theirs to REDIS_COMMANDS as they are imported
#: (beside ``redis_commands``' own): imported here, so the door's table is whole.
TABLE_MODULES = (redis_cluster, redis_keyspace, redis_scan, redis_strings, redis_transactions)

#: Redis 7.0's ``no-auth`` commands: the only ones that run before AUTH.
PRE_AUTH = frozenset({"auth", "hello", "quit", "reset"})
#: Connection commands that set the connection up or end it: charged a read's
#: floor like every request after AUTH, but never held to the bucket's allowance.
HANDSHAKE = frozenset({"auth", "hello", "client", "select", "quit", "reset"})
#: The most bytes of arguments such a command may carry (the frame bound before
#: authentication): one with more is refused as a request, never held as a handshake.
HANDSHAKE_ARG_BYTES = protocol.MAX_HELLO_FRAME_BYTES
#: Commands a connection may send before it authenticates, AUTH and HELLO
#: included; the next one closes it. Nothing before AUTH is metered or
#: rate-limited, so this bounds what an anonymous connection costs (the
#: MessagePack door closes one whose first request is not hello), while
#: leaving room for a client's handshake and a few tries at the password
#: (which the login limiter bounds as well).
MAX_PRE_AUTH_COMMANDS = 16
#: Command names as clients send them (upper or lower case) -> the lower-case name:
#: a dict lookup per command instead of a decode and a lower().
_NAMES: dict[bytes, str] = {}


def error_text(exc: errors.TenantKVError) -> str:
    """A tenantkv error in Redis's words: a stable prefix, then the message.

    Overload (labelled ``SystemOverloadedError`` / ``RetryableError``: it did not
    run) is ``TRYAGAIN <CodeName> retryAfterMs=<n> <message>`` — the prefix Redis
    clients already treat as "retry later"."""
    msg = exc.errmsg
    if isinstance(exc, errors.InRedisWords):  # cluster redirections: -MOVED, -CROSSSLOT, ...
        return exc.redis_text()
    if isinstance(exc, (errors.ProtocolError, errors.FrameTooLarge)):
        return f"ERR Protocol error: {msg}"
    if isinstance(exc, errors.TooManyLoginFailures):
        # A limited login is a failed AUTH to a Redis client (WRONGPASS), with the hint.
        return f"WRONGPASS retryAfterMs={exc.retry_after_ms or 0} {msg}"
    if errors.RETRYABLE in exc.labels or errors.SYSTEM_OVERLOADED in exc.labels:
        return f"TRYAGAIN {exc.code_name} retryAfterMs={exc.retry_after_ms or 0} {msg}"
    if isinstance(exc, errors.AuthenticationFailed):
        if exc.errmsg.startswith(AT_NAME_MESSAGE):
            return f"WRONGPASS {exc.errmsg}"
        return "WRONGPASS invalid username-password pair or user is disabled."
    if isinstance(exc, errors.Unauthorized):
        return f"NOPERM {msg}"
    if isinstance(exc, errors.HelloRequired):
        return "NOAUTH Authentication required."
    return f"ERR {msg}"


#: The answer to a user whose name holds '@' (made before the rule against it),
#: once its password is proven: it cannot log in on this door.
AT_NAME_MESSAGE = "user names containing '@' cannot log in over RESP"


#: The request a command refused before it runs becomes (malformed, unknown,
#: oversized): ``(seq, REFUSED_REQUEST, (name, error, keys named, bytes
#: declared))``, answered by the door.
REFUSED_REQUEST = "\0refused"


class RespDoor:
    """The codec of one RESP connection (see the module docstring).

    Order: Redis replies carry no id, so each command gets a sequence number
    and its reply waits in a slot until every earlier one is out (a write
    answered when durable, an error found at once, a read answered inline all
    come out in the order the commands were sent)."""

    protocol_name = "resp"
    admin_methods: frozenset[str] = frozenset()
    no_bucket_message = "no bucket selected: select a bucket with SELECT, or AUTH as user@bucket"

    def __init__(self) -> None:
        #: replies not yet sent (the connection sends and replaces it)
        self.out = bytearray()
        self.commands = COMMANDS
        self.enc = Encoder(2)
        #: the name CLIENT SETNAME / HELLO SETNAME gave the connection
        self.name: bytes | None = None
        self._last_id = 0
        self._next_out = 1
        #: replies ready before an earlier one, by sequence number
        self._slots: dict[int, bytes] = {}
        #: the reply of a call that differs from its command's (SET ... GET)
        self._special: dict[int, Reply] = {}
        #: commands received before authenticating (MAX_PRE_AUTH_COMMANDS)
        self._pre_auth_commands = 0
        #: client-side caching, while CLIENT TRACKING is on: told each command
        #: as decoded (in the order sent), it remembers the keys read
        self.tracker: Tracker | None = None

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        """A connection-level refusal (before any request)."""
        return Encoder(2).error(error_text(exc))

    @staticmethod
    def new_decoder(node: Node, chunk_bytes: int) -> RequestDecoder:
        cfg = node.config
        return RequestDecoder(
            max_bulk_bytes=cfg.max_value_bytes,
            max_frame_bytes=min(protocol.MAX_FRAME_BYTES, cfg.max_value_bytes + 64 * 1024),
            msgpack_port=node.port,
        )

    def requests(self, decoder: Any) -> Iterator[Request]:
        """Each command decoded, as a request of the executor: a data command
        with its parsed parameters, a connection command with its arguments, or
        a command refused for what it asked (:data:`REFUSED_REQUEST`). A run of
        like commands comes from the decoder at once, and a name like the one
        before it is not looked up again."""
        names, table, special = _NAMES, REDIS_COMMANDS, self._special
        next_commands = decoder.next_commands
        raw: bytes | None = None  # the last command's name as sent, and what it names
        name, rc = "", None
        while commands := next_commands():
            for decoded in commands:
                args = list(decoded)
                self._last_id = msgid = self._last_id + 1
                if decoder.refused is not None:
                    raw = None
                    yield msgid, REFUSED_REQUEST, self._oversized(decoder, args)
                    continue
                if args[0] != raw:
                    raw = args[0]
                    name = names.get(raw) or raw.decode("latin-1").lower()
                    rc = table.get(name)
                if rc is not None:
                    try:
                        params, reply = parse_call(rc, args)
                    except errors.TenantKVError as exc:
                        keys = keys_named(rc.keys, len(args))
                        yield msgid, REFUSED_REQUEST, (name, exc, keys, 0)
                        continue
                    if reply is not rc.reply:
                        special[msgid] = reply
                    if self.tracker is not None:
                        self.tracker.command(args, rc.keys if rc.kind == "read" else None)
                    yield msgid, name, params
                elif name in LOCAL:
                    if self.tracker is not None:
                        self._tracking_command(name, args)
                    yield msgid, name, args  # (its arguments: the door's)
                else:
                    yield msgid, REFUSED_REQUEST, (name, _unknown(args), 1, 0)

    def _tracking_command(self, name: str, args: list[bytes]) -> None:
        """A connection command, tracking on: CLIENT CACHING yes|no is for the
        command after it, so it takes effect here, in the order sent (its reply,
        and its errors, come when it runs)."""
        tracker = self.tracker
        assert tracker is not None
        if name == "client" and len(args) == 3 and args[1].lower() == b"caching":
            caching = args[2].lower()
            if (caching == b"yes" and tracker.optin) or (caching == b"no" and tracker.optout):
                tracker.caching = caching == b"yes"
                return
        tracker.command(args, None)

    @staticmethod
    def _oversized(decoder: RequestDecoder, args: list[bytes]) -> Any:
        """A command refused for its size (:attr:`RequestDecoder.refused`):
        answered in-band, its rest dropped as it arrives. It costs a read's floor
        per read unit it declared besides (:meth:`run_local`), as reading that
        many bytes would: the node takes them, so the tenant pays for them."""
        exc, declared = decoder.refused or (None, 0)
        decoder.refused = None
        name = args[0].decode("latin-1").lower()[:128] if args else ""
        return (name, exc, 1, declared)

    # -- replies -------------------------------------------------------------------

    def reply(self, cmd: Command | None, msgid: int, result: Any) -> None:
        convert = self._special.pop(msgid, None) if self._special else None
        if convert is None:
            convert = cmd.reply if cmd is not None and cmd.reply is not None else _value
        self.fill(msgid, convert(self.enc, result))

    def reply_all(self, cmd: Command, msgids: list[int], results: Sequence[Any]) -> None:
        """A run of reads or writes answered: out at once when they are the next
        replies due, in a row (the usual run), else each through its slot."""
        first = msgids[0]
        if (
            first != self._next_out
            or self._slots
            or self._special
            or msgids[-1] - first != len(msgids) - 1
        ):
            for msgid, result in zip(msgids, results, strict=True):
                self.reply(cmd, msgid, result)
            return
        convert, enc = cmd.reply or _value, self.enc
        self.out += b"".join([convert(enc, result) for result in results])
        self._next_out = first + len(msgids)

    def take_special(self, msgid: int) -> Reply | None:
        """The reply of a call that differs from its command's (SET ... GET), taken:
        a transaction answers the call QUEUED now, and with this at EXEC."""
        return self._special.pop(msgid, None) if self._special else None

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        data = self.enc.error(error_text(exc))
        if msgid is None:  # the connection's own end (protocol error, idle): no slot
            self.out += data
            return
        if self._special:
            self._special.pop(msgid, None)
        self.fill(msgid, data)

    def refusal_writer(self, exc: errors.TenantKVError) -> Callable[[int], None]:
        data = self.enc.error(error_text(exc))
        fill, special = self.fill, self._special

        def refuse(msgid: int) -> None:
            if special:
                special.pop(msgid, None)  # (a SET ... GET refused: no reply of its own)
            fill(msgid, data)

        return refuse

    def fill(self, msgid: int, data: bytes) -> None:
        """The reply of the ``msgid``-th command: out now if every earlier one is,
        else into its slot until they are."""
        if msgid != self._next_out:
            self._slots[msgid] = data
            return
        out = self.out
        out += data
        nxt = msgid + 1
        slots = self._slots
        while slots and nxt in slots:
            out += slots.pop(nxt)
            nxt += 1
        self._next_out = nxt

    # -- connection commands -----------------------------------------------------------

    async def before_auth(self, ex: Executor, req: Request) -> bool:
        """Before authentication only :data:`PRE_AUTH` commands run, and at most
        :data:`MAX_PRE_AUTH_COMMANDS` commands in all; the rest are answered as
        Redis 7.0's ``processCommand`` answers them: an unknown command or a wrong
        argument count by its own error (checked before authentication there
        too), anything else ``-NOAUTH``. Each is one counted error, never a log
        line: the one line is the close."""
        msgid, name, _ = req
        self._pre_auth_commands += 1
        if self._pre_auth_commands > MAX_PRE_AUTH_COMMANDS:
            closing_log.info(
                "connection %d from %s: %d commands without authentication; closing",
                ex.conn_id,
                ex.peer,
                MAX_PRE_AUTH_COMMANDS,
            )
            exc = errors.HelloRequired(
                f"{MAX_PRE_AUTH_COMMANDS} commands without authentication: closing the connection"
            )
            ex.fail(msgid, name, exc)
            return False
        if name == REFUSED_REQUEST and _answered_before_auth(req[2][1]):
            ex.fail(msgid, req[2][0], req[2][1])
            return True
        if name not in PRE_AUTH:
            ex.fail(msgid, name, errors.HelloRequired("authentication required"))
            return True
        return await self.run_local(ex, self.commands[name], req)

    async def run_local(self, ex: Executor, cmd: Command, req: Request) -> bool:
        """A connection command, or a command refused for what it asked."""
        msgid, name, args = req
        if name == REFUSED_REQUEST:
            asked, exc, keys, nbytes = args
            keys += nbytes // ex.node.config.read_unit_size
            return await self._refuse(ex, msgid, asked, exc, keys)
        assert isinstance(args, list)
        if name in HANDSHAKE and (size := sum(map(len, args))) > HANDSHAKE_ARG_BYTES:
            # No handshake is this big (a name is at most 128 bytes, a password
            # 1 KiB): refused as a request, at a floor per 4 KB, without keeping
            # its bytes while it waits for the allowance.
            args.clear()
            too_big = errors.BadValue(
                f"'{name}' takes at most {HANDSHAKE_ARG_BYTES} bytes of arguments"
            )
            floors = 1 + size // ex.node.config.read_unit_size
            return await self._refuse(ex, msgid, name, too_big, floors)
        return await self._local(ex, LOCAL[name], msgid, name, args)

    async def _refuse(
        self, ex: Executor, msgid: int, name: str, exc: errors.TenantKVError, keys: int
    ) -> bool:
        """Answer a command refused for what it asked (malformed, unknown, too many
        keys): it costs the read floor per key it named, and it is held to the
        bucket's allowance as a read is — a tenant in debt that keeps sending
        them waits (its connection unread) instead of having each decoded and
        answered at once."""
        tenant = ex.floor_tenant()
        if tenant is not None:
            try:
                await ex.node.gate.acquire(
                    tenant[0], unthrottled=tenant[1], nonblocking=ex.nonblocking_throttle
                )
            except errors.TenantKVError as refused:  # (non-blocking, or hard limit 0)
                ex.fail(msgid, name, refused)
                return True
        ex.fail(msgid, name, exc, keys=keys)
        return True

    async def _local(
        self, ex: Executor, handler: LocalHandler, msgid: int, name: str, args: list[bytes]
    ) -> bool:
        """A connection command: once authenticated, a request like any other, at a
        read's floor — held to the bucket's allowance (PING, ECHO, INFO, ...:
        :meth:`Executor.admit_floor`), or only charged while it sets the
        connection up or ends it (:data:`HANDSHAKE`), which a throttled client
        must still do.

        Its arguments cost a floor per read unit (4 KB) beyond that (an ECHO of
        20 MiB is not one unit's work)."""
        size = sum(map(len, args))
        extra = size // ex.node.config.read_unit_size
        try:
            if name in HANDSHAKE:
                ex.charge_floor(1 + extra)
            elif size < WAITING_COUNTED_BYTES:
                await ex.admit_floor()
            else:
                ex.hold_waiting(size)  # (its arguments are held while it waits)
                try:
                    await ex.admit_floor()
                finally:
                    ex.hold_waiting(0)
            if extra and name not in HANDSHAKE:
                ex.charge_floor(extra)
        except errors.TenantKVError as exc:
            ex.fail(msgid, name, exc)
            return True
        try:
            return await handler(self, ex, msgid, args)
        except errors.TenantKVError as exc:
            ex.fail(msgid, name, exc, charge=False)
            return True

    async def authenticate(self, ex: Executor, username: bytes, password: bytes) -> None:
        """AUTH / HELLO AUTH: the user (``name@bucket`` picks the bucket) through
        the one :func:`~tenantkv.server.executor.authenticate`; the connection
        stays open on failure."""
        node = ex.node
        full = username.decode(errors="replace")
        name, _, bucket = full.partition("@")
        text = password.decode(errors="replace")
        if "@" in full and full in node.accounts.users:
            # A user named with '@' (made before the rule): its password proven
            # (limited as any login), it is told why this door cannot take it.
            await node.accounts.authenticate(full, text, peer=ex.peer_ip)
            raise errors.AuthenticationFailed(
                f"{AT_NAME_MESSAGE} (AUTH takes user@bucket); log in on the MessagePack "
                "port, or use a user without '@'"
            )
        try:
            await authenticate(ex, name, text, bucket or None, one_role_bucket=True)
        except errors.TenantKVError as exc:
            closing_log.info("connection %d from %s: AUTH failed: %s", ex.conn_id, ex.peer, exc)
            raise
        log.debug(
            "connection %d from %s (resp): user %r bucket %r", ex.conn_id, ex.peer, name, ex.bucket
        )


def _value(enc: Encoder, v: Any) -> bytes:
    return enc.value(v)


def keys_named(spec: tuple[int, int, int], argc: int) -> int:
    """How many keys a command of ``argc`` arguments names, by its COMMAND INFO key
    specification (first, last, step); at least 1 (the floor of any request)."""
    first, last, step = spec
    if first <= 0:
        return 1
    stop = argc if last < 0 else min(argc, last + 1)
    return max(1, len(range(first, stop, step)))


def _unknown(args: list[bytes]) -> errors.TenantKVError:
    """Redis 7.0's answer to a command it does not have (``processCommand``): the
    name as sent, then each argument quoted and followed by a space while fewer
    than 128 bytes of them are shown."""
    shown = ""
    for arg in args[1:]:
        if len(shown) >= 128:
            break
        shown += f"'{arg.decode(errors='replace')[: 128 - len(shown)]}' "
    name = args[0].decode(errors="replace")[:128]
    return errors.UnknownCommand(f"unknown command '{name}', with args beginning with: {shown}")


def _answered_before_auth(exc: errors.TenantKVError) -> bool:
    """A refusal Redis gives before it checks authentication: an unknown command
    or a wrong argument count (``commandCheckExistence``, ``commandCheckArity``)."""
    return isinstance(exc, errors.UnknownCommand) or exc.errmsg.startswith(
        "wrong number of arguments for "
    )


_NAMES.update(
    (spelling.encode(), name)
    for name in (*REDIS_COMMANDS, *LOCAL)
    for spelling in (name, name.upper())
)


def _door_command(name: str) -> Command:
    """A command the door answers itself (:meth:`RespDoor.run_local`)."""
    return Command(name, "door", frozenset(), LOCAL.get(name, _refused))


async def _refused(*args: Any) -> bool:
    raise AssertionError("answered by RespDoor.run_local")


#: The door's command table: Redis's data commands (their Command, so a GET
#: runs where a MessagePack get runs), its connection commands, and refusals.
COMMANDS: dict[str, Command] = {name: rc.command for name, rc in REDIS_COMMANDS.items()}
COMMANDS.update((name, _door_command(name)) for name in (*LOCAL, REFUSED_REQUEST))
