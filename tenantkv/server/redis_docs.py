"""The arguments of each RESP command, as ``COMMAND DOCS`` reports them.

redis-cli builds its inline hints (``SET key value [NX|XX] [GET] …``) and its
``HELP`` pages from ``COMMAND DOCS``: without the ``arguments`` entry it shows
no hint at all. Each command's syntax is written once below, in Redis's own
notation with every argument's type spelled out (``name:type``), and
:func:`arguments` turns it into the nested maps Redis sends:

    key:key value:string [NX|XX] [EX seconds:integer|KEEPTTL] [key:key ...]

- ``name:type`` — an argument (types as Redis names them: ``key``, ``string``,
  ``integer``, ``pattern``, ``unix-time``);
- ``TOKEN name:type`` — an argument introduced by a token (``EX seconds``);
- ``TOKEN`` alone — a ``pure-token``;
- ``[ … ]`` — optional; ``( … )`` — a group that is not; ``a|b`` — one of;
  several items in one alternative — a ``block``; ``...`` after an item — it
  repeats (``multiple``).
"""

from __future__ import annotations

import re
from typing import Any

from tenantkv.server.redis_commands import Status

#: Each command's arguments (commands without an entry take none).
SYNTAX: dict[str, str] = {
    "get": "key:key",
    "getdel": "key:key",
    "getex": (
        "key:key [EX seconds:integer|PX milliseconds:integer|EXAT unix-time-seconds:unix-time"
        "|PXAT unix-time-milliseconds:unix-time|PERSIST]"
    ),
    "getset": "key:key value:string",
    "set": (
        "key:key value:string [NX|XX] [GET] [EX seconds:integer|PX milliseconds:integer"
        "|EXAT unix-time-seconds:unix-time|PXAT unix-time-milliseconds:unix-time|KEEPTTL]"
    ),
    "setnx": "key:key value:string",
    "setex": "key:key seconds:integer value:string",
    "psetex": "key:key milliseconds:integer value:string",
    "mget": "key:key ...",
    "mset": "(key:key value:string) ...",
    "msetnx": "(key:key value:string) ...",
    "append": "key:key value:string",
    "strlen": "key:key",
    "incr": "key:key",
    "decr": "key:key",
    "incrby": "key:key increment:integer",
    "decrby": "key:key decrement:integer",
    "del": "key:key ...",
    "unlink": "key:key ...",
    "exists": "key:key ...",
    "type": "key:key",
    "ttl": "key:key",
    "pttl": "key:key",
    "persist": "key:key",
    "expire": "key:key seconds:integer [NX|XX|GT|LT]",
    "pexpire": "key:key milliseconds:integer [NX|XX|GT|LT]",
    "expireat": "key:key unix-time-seconds:unix-time [NX|XX|GT|LT]",
    "pexpireat": "key:key unix-time-milliseconds:unix-time [NX|XX|GT|LT]",
    "scan": "cursor:integer [MATCH pattern:pattern] [COUNT count:integer] [TYPE type:string]",
    "keys": "pattern:pattern",
    "flushdb": "[ASYNC|SYNC]",
    "getrange": "key:key start:integer end:integer",
    "substr": "key:key start:integer end:integer",
    "setrange": "key:key offset:integer value:string",
    "incrbyfloat": "key:key increment:double",
    "lcs": "key1:key key2:key [LEN] [IDX] [MINMATCHLEN min-match-len:integer] [WITHMATCHLEN]",
    "getbit": "key:key offset:integer",
    "setbit": "key:key offset:integer value:integer",
    "bitcount": "key:key [start:integer end:integer [BYTE|BIT]]",
    "bitpos": "key:key bit:integer [start:integer [end:integer [BYTE|BIT]]]",
    "bitop": "operation:string destkey:key key:key ...",
    "bitfield": (
        "key:key [GET encoding:string offset:integer"
        "|SET encoding:string offset:integer value:integer"
        "|INCRBY encoding:string offset:integer increment:integer"
        "|OVERFLOW WRAP|OVERFLOW SAT|OVERFLOW FAIL ...]"
    ),
    "bitfield_ro": "key:key [GET encoding:string offset:integer ...]",
    "copy": "source:key destination:key [DB destination-db:integer] [REPLACE]",
    "rename": "key:key newkey:key",
    "renamenx": "key:key newkey:key",
    "touch": "key:key ...",
    "expiretime": "key:key",
    "pexpiretime": "key:key",
    "object": "subcommand:string [key:key]",
    "memory": "USAGE key:key [SAMPLES count:integer]",
    "auth": "[username:string] password:string",
    "hello": (
        "[protover:integer [AUTH username:string password:string] [SETNAME clientname:string]]"
    ),
    "ping": "[message:string]",
    "echo": "message:string",
    "select": "index:string",
    "client": "subcommand:string [arg:string ...]",
    "info": "[section:string ...]",
    "config": "subcommand:string [parameter:pattern ...]",
    "command": "[subcommand:string [command-name:string ...]]",
    "watch": "key:key ...",
}

_TOKENS = re.compile(r"[][()|]|\.\.\.|[^\s\[\]()|]+")
_CLOSE = {"[": "]", "(": ")"}


def arguments(name: str) -> list[dict[str, Any]]:
    """``COMMAND DOCS``'s ``arguments`` of command ``name`` (empty when it takes none)."""
    syntax = SYNTAX.get(name)
    if not syntax:
        return []
    tokens = _TOKENS.findall(syntax)
    args, pos = _sequence(tokens, 0, name)
    if pos != len(tokens):
        raise ValueError(f"{name}: unexpected {tokens[pos]!r} in {syntax!r}")
    return args


def _sequence(tokens: list[str], pos: int, name: str) -> tuple[list[dict[str, Any]], int]:
    """Items up to a closing ``]`` or ``)``, a ``|`` or the end."""
    out: list[dict[str, Any]] = []
    while pos < len(tokens) and tokens[pos] not in ("]", ")", "|"):
        tok = tokens[pos]
        if tok in _CLOSE:
            arg, pos = _alternatives(tokens, pos + 1, name)
            if pos >= len(tokens) or tokens[pos] != _CLOSE[tok]:
                raise ValueError(f"{name}: unclosed {tok!r}")
            pos += 1
            if tok == "[":
                arg["flags"] = [*arg.get("flags", []), Status("optional")]
        elif tok == "...":
            if not out:
                raise ValueError(f"{name}: '...' follows nothing")
            out[-1]["flags"] = [*out[-1].get("flags", []), Status("multiple")]
            pos += 1
            continue
        elif tok.isupper():
            arg, pos = {"name": tok.lower(), "type": "pure-token", "token": tok}, pos + 1
            nxt = tokens[pos] if pos < len(tokens) else ""
            if ":" in nxt:  # TOKEN name:type
                arg = {**_typed(nxt), "token": tok}
                pos += 1
        else:
            arg, pos = _typed(tok), pos + 1
        out.append(arg)
    return out, pos


def _alternatives(tokens: list[str], pos: int, name: str) -> tuple[dict[str, Any], int]:
    """One item, a ``block`` of several, or a ``oneof`` of ``|``-separated ones."""
    choices: list[dict[str, Any]] = []
    while True:
        seq, pos = _sequence(tokens, pos, name)
        if not seq:
            raise ValueError(f"{name}: empty alternative")
        choices.append(seq[0] if len(seq) == 1 else _group("block", seq))
        if pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            continue
        break
    if len(choices) == 1:
        return choices[0], pos
    return _group("oneof", choices), pos


def _group(kind: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    label = "-".join(str(m.get("token") or m["name"]).lower() for m in members[:2])
    return {"name": label, "type": kind, "arguments": members}


def _typed(tok: str) -> dict[str, Any]:
    name, _, kind = tok.partition(":")
    arg: dict[str, Any] = {"name": name, "type": kind}
    if kind == "key":
        arg["key_spec_index"] = 0
    return arg


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: Redis's command families tenantkv does not run, each with why (docs/redis.md,
#: "Not supported", lists the same). One rule answers them all: Redis's own
#: ``ERR unknown command '<name>', with args beginning with: ...`` — what a Redis
#: server without that command (renamed away, its module not loaded) answers,
#: so clients and tools treat them as they already treat a missing command.
NOT_SUPPORTED: dict[str, tuple[str, frozenset[str]]] = {
    family: (why, _words(names))
    for family, why, names in (
        (
            "lists, hashes, sets, sorted sets, streams, HyperLogLog, geo",
            "tenantkv stores strings only",
            """
            lpush rpush lpushx rpushx lpop rpop llen lrange lindex lset lrem ltrim linsert
            lpos lmove blpop brpop brpoplpush blmove rpoplpush lmpop blmpop
            hset hget hmset hmget hgetall hdel hlen hexists hkeys hvals hincrby
            hincrbyfloat hsetnx hstrlen hscan hrandfield
            sadd srem smembers sismember smismember scard spop srandmember smove sinter
            sunion sdiff sinterstore sunionstore sdiffstore sscan sintercard
            zadd zrem zrange zrangebyscore zrevrange zrevrangebyscore zscore zincrby zcard
            zcount zrank zrevrank zpopmin zpopmax bzpopmin bzpopmax zscan zrangestore
            zunionstore zinterstore zunion zinter zdiff zdiffstore zintercard zmscore
            zlexcount zrangebylex zrevrangebylex zremrangebyrank zremrangebyscore
            zremrangebylex zrandmember zmpop bzmpop
            xadd xrange xrevrange xlen xread xreadgroup xgroup xack xdel xtrim xinfo
            xclaim xautoclaim xpending xsetid
            pfadd pfcount pfmerge pfdebug pfselftest
            geoadd geodist geohash geopos georadius georadius_ro georadiusbymember
            georadiusbymember_ro geosearch geosearchstore
            sort sort_ro
            """,
        ),
        (
            "scripting and functions",
            "a script would run tenant code on the event loop, outside the admission path",
            "eval evalsha eval_ro evalsha_ro script function fcall fcall_ro",
        ),
        (
            "modules",
            "no modules are loaded",
            "module",
        ),
        (
            "DUMP and RESTORE",
            "Redis's serialization format is not tenantkv's record",
            "dump restore restore-asking migrate",
        ),
        (
            "server, replication and cluster administration",
            "they act beyond one tenant's bucket; `tenantkv-admin` and `status` do this",
            """
            flushall shutdown debug save bgsave bgrewriteaof lastsave replicaof slaveof sync
            psync monitor move swapdb acl latency slowlog failover readonly
            readwrite wait waitaof
            """,
        ),
        (
            "pub/sub",
            "no channels: tenantkv is a store, not a broker",
            "subscribe psubscribe ssubscribe unsubscribe punsubscribe sunsubscribe publish "
            "spublish pubsub",
        ),
    )
}
