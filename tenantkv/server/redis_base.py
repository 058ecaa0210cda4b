"""What every Redis command table entry is built from: the entry's type, the
registry, and the argument parsers, replies and header reads the command
modules share (``redis_commands``, ``redis_strings``, ``redis_keyspace``).

A module of its own so that the command modules can share these without
importing each other; ``redis_commands`` gathers them all in
:data:`REDIS_COMMANDS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tenantkv import errors, protocol
from tenantkv.resp import Encoder
from tenantkv.server.commands import MAX_KEYS_PER_COMMAND, Command, Session
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.records import HEADER_BYTES
from tenantkv.storage.string_ops import NOT_AN_INTEGER

#: The most keys one multi-key command may name: the MessagePack mget's bound.
MAX_MULTI_KEYS = MAX_KEYS_PER_COMMAND

Reply = Callable[[Encoder, Any], bytes]


@dataclass(frozen=True, slots=True)
class RedisCommand:
    """One Redis command: its Redis arity (negative: at least), how its arguments
    become ``(Command, params)``, how the result becomes a reply, and what
    ``COMMAND INFO`` says of it."""

    name: str
    arity: int
    kind: Literal["read", "write", "session"]
    parse: Callable[[list[bytes]], dict[str, Any]]
    handler: Callable[..., Any]
    reply: Reply
    flags: tuple[str, ...] = ()
    keys: tuple[int, int, int] = (1, 1, 1)
    summary: str = ""
    group: str = "string"
    command: Command = field(init=False)

    def __post_init__(self) -> None:
        # The execution path checks parameter names against the Command's: the
        # parser's output is the contract, so declare every name it may produce.
        object.__setattr__(
            self,
            "command",
            Command(self.name, self.kind, PARAM_NAMES, self.handler, self.summary, self.reply),
        )


def read_command(
    name: str,
    arity: int,
    parse: Callable[[list[bytes]], dict[str, Any]],
    handler: Callable[..., Any],
    reply: Reply,
    keys: tuple[int, int, int],
    summary: str,
    group: str,
) -> RedisCommand:
    """A read command's entry (kind ``read``, flag ``readonly``), for the tables of
    read commands."""
    return RedisCommand(
        name, arity, "read", parse, handler, reply, ("readonly",), keys, summary, group
    )


PARAM_NAMES = frozenset(
    {"key", "keys", "value", "pairs", "expiry", "only", "get", "delta", "cursor", "match", "count"}
    | {"args", "start", "end", "offset", "dest", "replace"}
)
REDIS_COMMANDS: dict[str, RedisCommand] = {}


def _register(c: RedisCommand) -> None:
    REDIS_COMMANDS[c.name] = c


def arity_error(name: str) -> errors.BadValue:
    return errors.BadValue(f"wrong number of arguments for '{name}' command")


def syntax_error() -> errors.BadValue:
    return errors.BadValue("syntax error")


def parse_int(arg: bytes, message: str = NOT_AN_INTEGER) -> int:
    """An integer argument as Redis reads it (no spaces, no plus sign)."""
    if not re.fullmatch(rb"-?(0|[1-9][0-9]*)", arg) or not -(2**63) <= int(arg) < 2**63:
        raise errors.BadValue(message)
    return int(arg)


def _key(arg: bytes) -> bytes:
    if not 0 < len(arg) <= protocol.MAX_KEY_BYTES:
        raise errors.KeyTooLong(f"keys must be 1-{protocol.MAX_KEY_BYTES} bytes, got {len(arg)}")
    return arg


def _keys(args: list[bytes]) -> list[bytes]:
    if len(args) > MAX_MULTI_KEYS:
        raise errors.BadValue(f"at most {MAX_MULTI_KEYS} keys per command")
    return [_key(a) for a in args]


def _check_value(s: Session, value: bytes) -> bytes:
    limit = s.node.config.max_value_bytes
    if len(value) > limit:
        raise errors.ValueTooLarge(f"value of {len(value)} bytes exceeds max_value_bytes={limit}")
    return value


# -- replies ----------------------------------------------------------------------------


#: The reply a write answers most (a pipelined SET: one per request).
OK = b"+OK\r\n"


def _bulk_or_null(enc: Encoder, v: Any) -> bytes:
    if type(v) is bytes:  # (a hit: Encoder.bulk without its calls)
        return b"$%d\r\n%b\r\n" % (len(v), v)
    return enc.null() if v is None else enc.bulk(v)


def _integer(enc: Encoder, v: Any) -> bytes:
    return enc.integer(int(v))


def _ok(enc: Encoder, v: Any) -> bytes:
    return OK


def _array_of_bulks(enc: Encoder, v: Any) -> bytes:
    return b"*%d\r\n" % len(v) + b"".join(_bulk_or_null(enc, x) for x in v)


def _simple(enc: Encoder, v: Any) -> bytes:
    return enc.simple(str(v))


def _one_key(args: list[bytes]) -> dict[str, Any]:
    return {"key": _key(args[1])}


def _many_keys(args: list[bytes]) -> dict[str, Any]:
    return {"keys": _keys(args[1:])}


def _headers(s: Session, b: BucketHandle, keys: list[bytes]) -> list[tuple[int, int] | None]:
    """The live records' (stored size, expiry) on views of them, no value copied;
    metered as the records read (what a read of each costs, whatever is copied)."""
    found = s.node.engine.headers(b, keys)
    s.read_sizes += [len(k) + h[0] for k, h in zip(keys, found, strict=True) if h is not None]
    return found


def _stored_value_bytes(s: Session, b: BucketHandle, key: bytes) -> int:
    """The size of ``key``'s value now, read on a view of its record: what a write
    that answers with the value it finds will hold and read (``WriteOp.reply_hint``).
    A pipeline of GETEX on a 10 MiB key held 600 MB of answers uncounted."""
    found = s.node.engine.headers(b, [key])[0]
    return 0 if found is None else max(0, found[0] - HEADER_BYTES)
