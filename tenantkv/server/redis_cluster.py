"""``CLUSTER``: the cluster as Redis Cluster clients ask for it (docs/cluster.md).

``KEYSLOT``, ``MYID``, ``SLOTS``, ``SHARDS``, ``NODES`` and ``INFO`` answer from
the cluster map this node follows (``COUNTKEYSINSLOT`` and ``GETKEYSINSLOT``
from the slot index, the connection's bucket only), with the nodes' RESP addresses, so that
``redis-cli -c``, redis-py's ``RedisCluster`` and the like find each slot's
node and follow ``-MOVED``. A node that is in no cluster answers what Redis
answers without cluster support. Node ids are 40 hex digits derived from the
node's name (stable across restarts, as Redis's are).

A session command, at a read's floor like PING (plus a floor per key that
COUNTKEYSINSLOT or GETKEYSINSLOT examined).
"""

from __future__ import annotations

from typing import Any

from tenantkv import errors
from tenantkv.server import redis_docs
from tenantkv.server.redis_commands import (
    Encoder,
    RedisCommand,
    _key,
    _register,
    arity_error,
    parse_int,
)

#: The subcommands answered, with their arities (Redis's, counting CLUSTER itself).
SUBCOMMANDS = {
    "keyslot": 3,
    "myid": 2,
    "slots": 2,
    "shards": 2,
    "nodes": 2,
    "info": 2,
    "countkeysinslot": 3,
    "getkeysinslot": 4,
}
#: The most keys COUNTKEYSINSLOT examines and GETKEYSINSLOT returns (KEYS's bound).
MAX_SLOT_KEYS = 10_000


def _parse(args: list[bytes]) -> dict[str, Any]:
    sub = args[1].decode("latin-1").lower()
    arity = SUBCOMMANDS.get(sub)
    if arity is None:
        raise errors.BadValue(
            f"unknown subcommand '{args[1].decode(errors='replace')}'. Try CLUSTER HELP."
        )
    if len(args) != arity:
        raise arity_error(f"cluster|{sub}")
    if sub == "countkeysinslot":
        return {"args": [sub, _slot(args[2])]}
    if sub == "getkeysinslot":
        count = parse_int(args[3])
        if not 0 <= count <= MAX_SLOT_KEYS:
            raise errors.BadValue(f"Invalid number of keys (0 to {MAX_SLOT_KEYS} here)")
        return {"args": [sub, _slot(args[2]), count]}
    return {"args": [sub, *(_key(a) for a in args[2:])]}


def _slot(arg: bytes) -> int:
    slot = parse_int(arg, "Invalid or out of range slot")
    if not 0 <= slot < 16384:
        raise errors.BadValue("Invalid or out of range slot")
    return slot


async def _cluster(s: Any, p: dict[str, Any]) -> Any:
    from tenantkv.cluster import redis_view  # cluster code only where it is asked for

    sub, *rest = p["args"]
    if sub == "keyslot":
        return redis_view.keyslot(rest[0])
    router = s.node.cluster
    if router is None:
        raise errors.BadValue("This instance has cluster support disabled")
    if sub in ("countkeysinslot", "getkeysinslot"):
        return _slot_keys(s, sub, *rest)
    return redis_view.answer(sub, router.member)


def _slot_keys(s: Any, sub: str, slot: int, count: int = MAX_SLOT_KEYS) -> Any:
    """This connection's bucket's keys in ``slot`` (the slot index: no other
    slot's keys read), read role required; charged a read's floor per key
    examined, as SCAN is."""
    b = s._data_bucket(write=False)  # the selected bucket, if its user may read it
    index = s.node.engine.slots
    limit = count if sub == "getkeysinslot" else MAX_SLOT_KEYS + 1
    keys = [] if index is None else index.keys(slot, limit=limit, bucket=b.name)
    s.charge_floor(max(1, len(keys)))
    if sub == "getkeysinslot":
        return [k for _, k in keys]
    if len(keys) > MAX_SLOT_KEYS:
        raise errors.BadValue(f"more than {MAX_SLOT_KEYS} keys in slot {slot}; use GETKEYSINSLOT")
    return len(keys)


def _reply(enc: Encoder, v: Any) -> bytes:
    if isinstance(v, int):
        return enc.integer(v)
    if isinstance(v, str):  # CLUSTER NODES / INFO: one bulk string of lines
        return enc.bulk(v)
    return enc.value(v)


async def _asking(s: Any, p: dict[str, Any]) -> Any:
    """ASKING: the connection's next command may act on a slot switching to this
    node (the router sets and spends the flag: tenantkv.cluster.routing)."""
    if s.node.cluster is None:
        raise errors.BadValue("This instance has cluster support disabled")
    return "OK"


COMMANDS = (
    RedisCommand(
        "asking",
        1,
        "session",
        lambda args: {},
        _asking,
        lambda enc, v: enc.simple(v),
        flags=("fast",),
        keys=(0, 0, 0),
        summary="Cluster mode: the next command may act on a slot being moved here (after -ASK).",
        group="cluster",
    ),
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

for _c in COMMANDS:
    _register(_c)
