"""``CLUSTER``: the cluster as Redis Cluster clients ask for it (docs/cluster.md).

``KEYSLOT``, ``MYID``, ``SLOTS``, ``SHARDS``, ``NODES`` and ``INFO`` answer from
the cluster map this node follows, with the nodes' RESP addresses, so that
``redis-cli -c``, redis-py's ``RedisCluster`` and the like find each slot's
node and follow ``-MOVED``. A node that is in no cluster answers what Redis
answers without cluster support. Node ids are 40 hex digits derived from the
node's name (stable across restarts, as Redis's are).

A session command: it reads no keys, at a read's floor like PING.
"""

from __future__ import annotations

from typing import Any

from tenantkv import errors
from tenantkv.resp import Encoder
from tenantkv.server import redis_docs
from tenantkv.server.redis_base import RedisCommand, _key, arity_error

#: The subcommands answered, with their arities (Redis's, counting CLUSTER itself).
SUBCOMMANDS = {"keyslot": 3, "myid": 2, "slots": 2, "shards": 2, "nodes": 2, "info": 2}


def _parse(args: list[bytes]) -> dict[str, Any]:
    sub = args[1].decode("latin-1").lower()
    arity = SUBCOMMANDS.get(sub)
    if arity is None:
        raise errors.BadValue(
            f"unknown subcommand '{args[1].decode(errors='replace')}'. Try CLUSTER HELP."
        )
    if len(args) != arity:
        raise arity_error(f"cluster|{sub}")
    return {"args": [sub, *(_key(a) for a in args[2:])]}


async def _cluster(s: Any, p: dict[str, Any]) -> Any:
    from tenantkv.cluster import redis_view  # cluster code only where it is asked for

    sub, *rest = p["args"]
    if sub == "keyslot":
        return redis_view.keyslot(rest[0])
    router = s.node.cluster
    if router is None:
        raise errors.BadValue("This instance has cluster support disabled")
    return redis_view.answer(sub, router.member)


def _reply(enc: Encoder, v: Any) -> bytes:
    if isinstance(v, int):
        return enc.integer(v)
    if isinstance(v, str):  # CLUSTER NODES / INFO: one bulk string of lines
        return enc.bulk(v)
    return enc.value(v)


COMMANDS = (
    RedisCommand(
        "cluster",
        -2,
        "session",
        _parse,
        _cluster,
        _reply,
        flags=("loading", "stale"),
        keys=(0, 0, 0),
        summary="Cluster mode: the key's slot, this node's id, and the map's slots and nodes.",
        group="cluster",
    ),
)

# COMMAND DOCS (redis-cli's hints): the table is redis_docs's; CLUSTER's line is ours.
redis_docs.SYNTAX["cluster"] = "subcommand:string [key:string]"
