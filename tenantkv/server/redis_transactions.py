"""MULTI, EXEC, DISCARD, WATCH and UNWATCH on the RESP door, as Redis 7.0 answers
them: the connection's transaction state and its execution are the executor's,
shared with the MessagePack door (:mod:`tenantkv.server.transaction`); this
parses the arguments and encodes EXEC's array — each queued command answered
as it would be alone, an error in place where one failed, a null array when a
watched key changed, ``EXECABORT`` after a queue-time error.
"""

from __future__ import annotations

from typing import Any

from tenantkv.server import transaction
from tenantkv.server.commands import Session
from tenantkv.server.redis_commands import Encoder, RedisCommand, _keys, _ok, _register


async def _multi(s: Session, p: dict[str, Any]) -> Any:
    transaction.multi(s)
    return True


async def _exec(s: Session, p: dict[str, Any]) -> Any:
    done = await transaction.execute(s)
    if isinstance(done, list):
        # Each error in the door's words now (the reply encoder has no door).
        refusal = s.door.refusal  # type: ignore[attr-defined]
        return [(q, r, None if e is None else refusal(e)) for q, r, e in done]
    return done


async def _discard(s: Session, p: dict[str, Any]) -> Any:
    transaction.discard(s)
    return True


async def _watch(s: Session, p: dict[str, Any]) -> Any:
    await transaction.watch(s, p["keys"])
    return True


async def _unwatch(s: Session, p: dict[str, Any]) -> Any:
    transaction.unwatch(s)
    return True


def _exec_reply(enc: Encoder, done: Any) -> bytes:
    """EXEC's reply: each queued command's, in order (see the module docstring)."""
    if isinstance(done, transaction.ExecAborted):
        return enc.error(transaction.EXECABORT)
    if done is None:
        return enc.null_array()
    parts = [b"*%d\r\n" % len(done)]
    for q, result, error in done:
        if error is not None:
            parts.append(error)
            continue
        reply = q.reply or q.cmd.reply
        parts.append(enc.value(result) if reply is None else reply(enc, result))
    return b"".join(parts)


def _no_args(args: list[bytes]) -> dict[str, Any]:
    return {}


def _watch_keys(args: list[bytes]) -> dict[str, Any]:
    return {"keys": _keys(args[1:])}


def _entry(name: str, arity: int, parse: Any, handler: Any, reply: Any, summary: str) -> Any:
    keys = (1, -1, 1) if name == "watch" else (0, 0, 0)
    flags = ("noscript", "loading", "stale", "fast", "allow_busy")
    return RedisCommand(
        name, arity, "session", parse, handler, reply, flags, keys, summary, "transactions"
    )


COMMANDS = (
    _entry("multi", 1, _no_args, _multi, _ok, "Start a transaction."),
    _entry("exec", 1, _no_args, _exec, _exec_reply, "Execute all commands issued after MULTI."),
    _entry("discard", 1, _no_args, _discard, _ok, "Discard all commands issued after MULTI."),
    _entry("watch", -2, _watch_keys, _watch, _ok, "Watch keys to make EXEC conditional."),
    _entry("unwatch", 1, _no_args, _unwatch, _ok, "Forget about all watched keys."),
)

for _c in COMMANDS:
    _register(_c)
