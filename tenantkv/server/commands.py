"""The command table: name, class (read / write / admin / session), parameters, handler.

Read handlers run inline and return the result. Write handlers only validate
and build a :class:`~tenantkv.storage.ops.WriteOp`; the session queues it on
the group-commit writer and answers when the batch is durable, so pipelined
writes share one commit. Admin and session handlers are coroutines.

Parameter checking is strict — an unknown parameter or a wrong type is a
``BadValue`` naming it — because a typo that silently does nothing (``tll``
for ``ttl``) loses data later.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import trio

from tenantkv import errors, protocol
from tenantkv.admission.throttle_props import limit_to_wire, parse_bucket_props, parse_node_props
from tenantkv.server import auth, transaction
from tenantkv.server.node import THROTTLE_NODE_KEY, Node
from tenantkv.storage import backup as backup_mod
from tenantkv.storage.engine import BucketHandle, KeyRange, validate_bucket_name
from tenantkv.storage.ops import (
    CounterOp,
    CreateBucketOp,
    DeleteOp,
    PutSystemOp,
    SetOp,
    TouchOp,
    WriteOp,
)
from tenantkv.storage.records import HEADER_BYTES, Record, unpack_header

#: (the hot handlers' key check, a global read instead of an attribute too)
MAX_KEY_BYTES = protocol.MAX_KEY_BYTES

log = logging.getLogger("tenantkv.audit")


class Session(Protocol):
    """What a command handler may use of the connection it runs on: a narrow
    interface, so commands do not import the session (the session imports them)."""

    node: Node
    conn_id: int
    user: auth.User | None
    bucket: str | None
    #: per-record byte counts a read handler read (for metering), and how many keys
    #: it looked up (a multi-key read sets it: the throttle's floor is per key)
    read_sizes: list[int]
    read_keys: int
    #: the chunk's read transaction once open, else None (then call read_txn)
    rtxn: Any

    def read_txn(self) -> Any: ...

    def current_user(self) -> auth.User: ...

    def select(self, bucket: str | None) -> None: ...

    def watch(self, bucket: str | None) -> Any: ...

    def who(self) -> str: ...


#: what a command is: a data command (read, write: through the admission
#: pipeline), an admin or a session command, a door's own (a RESP connection
#: command: the door answers it), or a cluster node's to another
#: (tenantkv.cluster.peer: only the node login may run it)
Kind = Literal["read", "write", "admin", "session", "door", "internal"]

#: Parameters any command accepts.
COMMON_PARAMS = frozenset({"timeout_ms"})
MAX_SCAN_LIMIT = 1000
#: The most keys one command may name, on either door (MessagePack ``mget``;
#: RESP ``MGET``, ``DEL``, ``EXISTS``, ``MSET``...): one asking for more is
#: refused before it runs and costs the read floor per key it named.
MAX_KEYS_PER_COMMAND = 1000


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    kind: Kind
    params: frozenset[str]
    handler: Callable[..., Any]
    #: what the command's result is, for docs
    doc: str = ""
    #: how a door that encodes replies per command turns the result into its
    #: reply (RESP: ``(encoder, result) -> bytes``); None: the door's default
    reply: Callable[[Any, Any], bytes] | None = None
    #: the parameters that need no check beyond their name (all but
    #: ``timeout_ms``): a request with only these passes with one set operation
    inline_params: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inline_params", self.params - {"timeout_ms"})


COMMANDS: dict[str, Command] = {}


def command(name: str, kind: Kind, *params: str) -> Callable[[Callable[..., Any]], Any]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        COMMANDS[name] = Command(
            name, kind, frozenset(params) | COMMON_PARAMS, fn, fn.__doc__ or ""
        )
        return fn

    return register


def check_params(cmd: Command, params: dict[str, Any]) -> None:
    for p in params:
        if p not in cmd.params:
            raise errors.BadValue(f"unknown parameter {errors.shown(p)} for {cmd.name}")
    if "timeout_ms" in params:
        t = params["timeout_ms"]
        if type(t) is not int or t < 0:
            raise errors.BadValue("'timeout_ms' must be a non-negative integer (milliseconds)")


# -- parameter helpers ------------------------------------------------------------


def key_param(p: dict[str, Any], name: str = "key") -> bytes:
    k = p.get(name)
    if isinstance(k, str):
        k = k.encode()
    if not isinstance(k, bytes):
        raise errors.BadValue(f"{name!r} must be bytes or a string")
    if not 0 < len(k) <= protocol.MAX_KEY_BYTES:
        raise errors.KeyTooLong(f"{name!r} must be 1-{protocol.MAX_KEY_BYTES} bytes, got {len(k)}")
    return k


def opt_key(p: dict[str, Any], name: str) -> bytes | None:
    if p.get(name) is None:
        return None
    k = p[name]
    if isinstance(k, str):
        k = k.encode()
    if not isinstance(k, bytes) or len(k) > protocol.MAX_KEY_BYTES:
        raise errors.BadValue(f"{name!r} must be bytes of at most {protocol.MAX_KEY_BYTES}")
    return k


def int_param(p: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = p.get(name, default)
    if v is None:
        return default
    if type(v) is not int or not lo <= v <= hi:
        raise errors.BadValue(f"{name!r} must be an integer in [{lo}, {hi}], got {errors.shown(v)}")
    return v


def ttl_param(p: dict[str, Any]) -> float:
    v = p.get("ttl", 0)
    if v is None:
        return 0
    if type(v) not in (int, float) or not 0 <= v <= 10 * 365 * 86400:
        raise errors.BadValue(
            f"'ttl' must be seconds >= 0 (0 = never expires), got {errors.shown(v)}"
        )
    return v


def bool_param(p: dict[str, Any], name: str, default: bool = False) -> bool:
    v = p.get(name, default)
    if type(v) is not bool:
        raise errors.BadValue(f"{name!r} must be true or false, got {errors.shown(v)}")
    return v


def str_param(p: dict[str, Any], name: str) -> str:
    v = p.get(name)
    if not isinstance(v, str):
        raise errors.BadValue(f"{name!r} must be a string")
    return v


def record_out(rec: Record) -> dict[str, Any]:
    return {"value": rec.value, "cas": rec.cas, "flags": rec.flags, "expiry_ms": rec.expiry_ms}


# -- data: reads --------------------------------------------------------------------


@command("get", "read", "key")
def get(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """{value, cas, flags, expiry_ms} or nil when the key does not exist."""
    key = p.get("key")
    if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
        key = key_param(p)  # a str key, or the precise error
    # Engine.get_in and records.decode without a Record: the hottest handler, once
    # per pipelined GET (one header unpack, one slice; a call less per read).
    raw = (s.rtxn or s.read_txn()).get(key, None, b.db)  # positional: db= costs ~60 ns
    if raw is None:
        return None
    cas, expiry_ms, flags = unpack_header(raw)
    if expiry_ms and expiry_ms <= s.node.engine.now_ms():
        return None
    s.read_sizes.append(len(key) + len(raw))
    return {"value": raw[HEADER_BYTES:], "cas": cas, "flags": flags, "expiry_ms": expiry_ms}


@command("exists", "read", "key")
def exists(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """true or false."""
    key = key_param(p)
    rec = s.node.engine.get_in(s.read_txn(), b, key)
    if rec is None:
        return False
    s.read_sizes.append(len(key) + rec.stored_bytes)
    return True


@command("mget", "read", "keys")
def mget(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """A list, one entry per key: {value, cas, flags, expiry_ms} or nil."""
    keys = p.get("keys")
    if not isinstance(keys, list) or not 0 < len(keys) <= MAX_KEYS_PER_COMMAND:
        if isinstance(keys, list):
            s.read_keys = len(keys)  # a floor per key named (see _read_failed)
        raise errors.BadValue(f"'keys' must be a list of 1-{MAX_KEYS_PER_COMMAND} keys")
    ks = [key_param({"key": k}) for k in keys]
    s.read_keys = len(ks)
    out: list[dict[str, Any] | None] = []
    for k, rec in zip(ks, s.node.engine.mget(b, ks), strict=True):
        if rec is None:
            out.append(None)
        else:
            s.read_sizes.append(len(k) + rec.stored_bytes)
            out.append(record_out(rec))
    return out


@command("scan", "read", "prefix", "start", "end", "after", "limit")
def scan(s: Session, b: BucketHandle, p: dict[str, Any]) -> Any:
    """{items: [[key, value, cas, flags, expiry_ms], ...], cursor: last key or nil}."""
    prefix = opt_key(p, "prefix")
    start = opt_key(p, "start") or b""
    end = opt_key(p, "end")
    if prefix is not None:
        if p.get("start") is not None or p.get("end") is not None:
            raise errors.BadValue("give either 'prefix' or 'start'/'end', not both")
        start, end = prefix, prefix_end(prefix)
    limit = int_param(p, "limit", 100, 1, MAX_SCAN_LIMIT)
    items, more = s.node.engine.scan(b, KeyRange(start, end, opt_key(p, "after")), limit=limit)
    out = []
    for k, rec in items:
        s.read_sizes.append(len(k) + rec.stored_bytes)
        out.append([k, rec.value, rec.cas, rec.flags, rec.expiry_ms])
    return {"items": out, "cursor": items[-1][0] if more and items else None}


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix``."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


# -- data: writes -------------------------------------------------------------------


@command("set", "write", "key", "value", "ttl", "flags", "cas", "mode")
def set_(s: Session, b: BucketHandle, p: dict[str, Any]) -> WriteOp:
    """{cas}. mode: upsert (default), add (KeyExists if present), replace (KeyNotFound if
    absent). cas: only if the record's CAS matches (CasMismatch otherwise)."""
    key = p.get("key")
    if type(key) is not bytes or not key or len(key) > MAX_KEY_BYTES:
        key = key_param(p)  # a str key, or the precise error
    value = p.get("value")
    if type(value) is not bytes:
        if not isinstance(value, (str, bytes)):
            raise errors.BadValue("'value' must be bytes or a string")
        value = value.encode() if isinstance(value, str) else bytes(value)
    if len(value) > s.node.config.max_value_bytes:
        raise errors.ValueTooLarge(
            f"value of {len(value)} bytes exceeds max_value_bytes={s.node.config.max_value_bytes}"
        )
    if len(p) == 2:  # key and value only (the hot case): every option's default
        return SetOp(b, key, value)
    mode = p.get("mode", "upsert")
    if mode not in ("upsert", "add", "replace"):
        raise errors.BadValue(f"'mode' must be upsert, add or replace, got {errors.shown(mode)}")
    return SetOp(
        b,
        key,
        value,
        ttl_param(p),
        int_param(p, "flags", 0, 0, 2**32 - 1),
        int_param(p, "cas", 0, 0, 2**64 - 1),
        mode,
    )


@command("delete", "write", "key", "cas")
def delete(s: Session, b: BucketHandle, p: dict[str, Any]) -> WriteOp:
    """true if a record was deleted, false if there was none."""
    return DeleteOp(b, key_param(p), int_param(p, "cas", 0, 0, 2**64 - 1))


@command("touch", "write", "key", "ttl")
def touch(s: Session, b: BucketHandle, p: dict[str, Any]) -> WriteOp:
    """{cas}; sets a new ttl (0 = never expires). KeyNotFound if absent."""
    return TouchOp(b, key_param(p), ttl_param(p))


def _counter(p: dict[str, Any], sign: int, b: BucketHandle) -> WriteOp:
    delta = int_param(p, "delta", 1, 0, 2**63 - 1)
    initial = p.get("initial")
    if initial is not None and (type(initial) is not int or not -(2**63) <= initial < 2**63):
        raise errors.BadValue("'initial' must be a signed 64-bit integer")
    return CounterOp(b, key_param(p), sign * delta, initial, ttl_param(p))


@command("incr", "write", "key", "delta", "initial", "ttl")
def incr(s: Session, b: BucketHandle, p: dict[str, Any]) -> WriteOp:
    """{value, cas}. Adds delta (default 1); a missing key is set to initial if given."""
    return _counter(p, 1, b)


@command("decr", "write", "key", "delta", "initial", "ttl")
def decr(s: Session, b: BucketHandle, p: dict[str, Any]) -> WriteOp:
    """{value, cas}. Subtracts delta (default 1); a missing key is set to initial if given."""
    return _counter(p, -1, b)


# -- session --------------------------------------------------------------------------


@command("ping", "session")
async def ping(s: Session, p: dict[str, Any]) -> Any:
    """ "pong"."""
    return "pong"


@command("select_bucket", "session", "bucket")
async def select_bucket(s: Session, p: dict[str, Any]) -> Any:
    """{bucket}; later data commands act on it."""
    name = str_param(p, "bucket")
    s.node.bucket(name)
    user = s.current_user()
    if not user.can_read(name):
        raise errors.Unauthorized(f"user {user.name!r} has no role on bucket {name!r}")
    s.select(name)
    return {"bucket": name}


@command("whoami", "session")
async def whoami(s: Session, p: dict[str, Any]) -> Any:
    """{user, bucket, admin, roles, connection_id}, and ``worker`` (its index) when
    the node runs ``serve --workers N``."""
    assert s.user is not None
    return {
        **s.user.public(),
        "user": s.user.name,
        "bucket": s.bucket,
        "connection_id": s.conn_id,
        **s.node.role.identity(),
    }


@command("cluster_map", "session")
async def cluster_map(s: Session, p: dict[str, Any]) -> Any:
    """The cluster map this node follows (docs/cluster.md): {enabled, version, node,
    ranges: [[start, end, node]], nodes: {name: {host, port, resp_port, up}}};
    {enabled: false} on a node in no cluster. Clients route each key's slot by it."""
    router = s.node.cluster
    return {"enabled": False} if router is None else router.map_document()


# -- admin ----------------------------------------------------------------------------


@command("cluster_rebalance", "admin", "batch_slots")
async def cluster_rebalance(s: Session, p: dict[str, Any]) -> Any:
    """{moved, total, drain, moving}: even the slots out over the nodes that are up
    (docs/cluster.md, "Rebalance"); a node in no cluster answers BadValue."""
    log.info("audit: %s asked for a rebalance %s", s.who(), p)
    return await s.node.role.move_slots(s, [], p)


@command("cluster_node_remove", "admin", "name", "batch_slots")
async def cluster_node_remove(s: Session, p: dict[str, Any]) -> Any:
    """{moved, total, drain, moving}: move every slot off node ``name``, then take
    it out of the map."""
    name = p.get("name")
    if not isinstance(name, str) or not name:
        raise errors.BadValue("'name' must be a node name")
    log.info("audit: %s asked to remove node %r %s", s.who(), name, p)
    return await s.node.role.move_slots(s, [name], p)


@command("create_bucket", "admin", "name", "reserved", "hard_limit")
async def create_bucket(s: Session, p: dict[str, Any]) -> Any:
    """{name, reserved, hard_limit}. Throttle limits default to the node defaults."""
    name = validate_bucket_name(p.get("name"))
    limits = s.node.bucket_throttle_defaults()
    for key in ("reserved", "hard_limit"):
        if p.get(key) is not None:
            limits[key] = p[key]
    parsed = parse_bucket_props(limits)  # validates both, and reserved <= hard limit
    throttle = {k: limit_to_wire(v) for k, v in parsed.items()}
    props = {"created_ms": int(time.time() * 1000), "throttle": throttle}
    handle = await s.node.write(CreateBucketOp(name, props))
    s.node.bucket_added(handle)
    log.info("audit: %s created bucket %r %s", s.who(), name, throttle)
    return {"name": name, **throttle}


@command("delete_bucket", "admin", "name")
async def delete_bucket(s: Session, p: dict[str, Any]) -> Any:
    """true. Drops the bucket, all its data and every user's role on it."""
    name = str_param(p, "name")
    await s.node.drop_bucket(s.node.bucket(name))
    log.info("audit: %s deleted bucket %r", s.who(), name)
    return True


@command("list_buckets", "admin")
async def list_buckets(s: Session, p: dict[str, Any]) -> Any:
    """[{name, entries}, ...] sorted by name."""
    eng = s.node.engine
    return [{"name": n, "entries": eng.bucket_entries(n)} for n in sorted(eng.buckets)]


@command("create_user", "admin", "name", "password", "roles", "admin", "unthrottled")
async def create_user(s: Session, p: dict[str, Any]) -> Any:
    """{name, admin, unthrottled, roles}. roles: {bucket: "read" | "readwrite"}."""
    name = auth.validate_user_name(p.get("name"))
    password = auth.validate_password(p.get("password"))
    roles = auth.validate_roles(p.get("roles"))
    for bucket in roles:
        s.node.bucket(bucket)
    if name in s.node.accounts.users:
        raise errors.UserExists(f"user {name!r} already exists")
    admin, unthrottled = bool_param(p, "admin"), bool_param(p, "unthrottled")
    user = await trio.to_thread.run_sync(
        lambda: auth.new_user(name, password, admin=admin, unthrottled=unthrottled, roles=roles)
    )
    await s.node.accounts.save_user(user, expect="absent")
    log.info("audit: %s created user %s", s.who(), user.public())
    return user.public()


@command("update_user", "admin", "name", "password", "roles", "admin", "unthrottled")
async def update_user(s: Session, p: dict[str, Any]) -> Any:
    """{name, admin, unthrottled, roles}: the user after the change. Only what is
    given changes; ``roles`` replaces every role. Applies at once, on open
    connections too: their requests that have not run yet are checked again."""
    name = str_param(p, "name")
    old = s.node.accounts.users.get(name)
    if old is None:
        raise errors.UserNotFound(f"user {name!r} does not exist")
    changes: dict[str, Any] = {}
    if p.get("roles") is not None:
        roles = auth.validate_roles(p["roles"])
        for bucket in roles:
            s.node.bucket(bucket)
        changes["roles"] = roles
    for flag in ("admin", "unthrottled"):
        if p.get(flag) is not None:
            changes[flag] = bool_param(p, flag)
    if p.get("password") is not None:
        password = auth.validate_password(p["password"])
        fresh = await trio.to_thread.run_sync(lambda: auth.new_user(name, password))
        changes["salt"], changes["hash"] = fresh.salt, fresh.hash
    if not changes:
        raise errors.BadValue("give at least one of password, roles, admin, unthrottled")
    if name == s.current_user().name and changes.get("admin") is False:
        raise errors.BadValue("an admin cannot take away its own admin privilege")
    user = dataclasses.replace(old, **changes)
    await s.node.accounts.save_user(user, expect="present")
    what = sorted(changes.keys() - {"salt", "hash"}) + (["password"] if "hash" in changes else [])
    log.info("audit: %s updated user %r (%s): %s", s.who(), name, ", ".join(what), user.public())
    return user.public()


@command("delete_user", "admin", "name")
async def delete_user(s: Session, p: dict[str, Any]) -> Any:
    """true."""
    name = str_param(p, "name")
    assert s.user is not None
    if name == s.user.name:
        raise errors.BadValue("a user cannot delete itself")
    await s.node.accounts.drop_user(name)
    log.info("audit: %s deleted user %r", s.who(), name)
    return True


@command("list_users", "admin")
async def list_users(s: Session, p: dict[str, Any]) -> Any:
    """[{name, admin, unthrottled, roles}, ...] sorted by name."""
    return [s.node.accounts.users[n].public() for n in sorted(s.node.accounts.users)]


@command("server_status", "admin")
async def server_status(s: Session, p: dict[str, Any]) -> Any:
    """The status document: version, uptime, connections, storage, buckets, and a
    section per admission gate. With ``serve --workers N``: node totals, and
    ``workers``, a line per worker."""
    return await s.node.role.status(s.node)


# -- throttle properties (Couchbase's names; bodies are JSON) -----------------------------


def _json_body(p: dict[str, Any]) -> Any:
    body = p.get("json")
    if not isinstance(body, (str, bytes, dict)):
        raise errors.BadValue("'json' must be a JSON object (as a string of at most 1024 bytes)")
    return body


@command("SetNodeThrottleProperties", "admin", "json")
async def set_node_throttle(s: Session, p: dict[str, Any]) -> Any:
    """The node's throttle properties after the change. json: {capacity,
    default_throttle_hard_limit, default_throttle_reserved_units}, any subset."""
    given = parse_node_props(_json_body(p))
    node = s.node
    before = _node_props(node)
    merged = parse_node_props({**before, **{k: limit_to_wire(v) for k, v in given.items()}})
    after = {k: limit_to_wire(v) for k, v in merged.items()}
    await node.write(PutSystemOp(THROTTLE_NODE_KEY, after))
    node.throttle.set_node(
        capacity=merged["capacity"],
        default_reserved=merged["default_throttle_reserved_units"],
        default_hard_limit=merged["default_throttle_hard_limit"],
    )
    node.gate.wake()
    log.info("audit: %s SetNodeThrottleProperties %s -> %s", s.who(), before, after)
    return after


@command("GetNodeThrottleProperties", "admin")
async def get_node_throttle(s: Session, p: dict[str, Any]) -> Any:
    """{capacity, default_throttle_hard_limit, default_throttle_reserved_units}."""
    return _node_props(s.node)


def _node_props(node: Node) -> dict[str, Any]:
    cap, res, hard = node.throttle.node_limits()
    return {
        "capacity": limit_to_wire(cap),
        "default_throttle_hard_limit": limit_to_wire(hard),
        "default_throttle_reserved_units": limit_to_wire(res),
    }


@command("SetBucketThrottleProperties", "admin", "bucket", "json")
async def set_bucket_throttle(s: Session, p: dict[str, Any]) -> Any:
    """The bucket's throttle properties after the change. json: {reserved, hard_limit}."""
    name = str_param(p, "bucket")
    given = parse_bucket_props(_json_body(p))
    node = s.node
    handle = node.bucket(name)
    before = _bucket_props(node, name)
    merged = parse_bucket_props({**before, **{k: limit_to_wire(v) for k, v in given.items()}})
    after = {k: limit_to_wire(v) for k, v in merged.items()}
    await _save_bucket_props(node, handle, "throttle", after)
    node.throttle.set_bucket(name, reserved=merged["reserved"], hard_limit=merged["hard_limit"])
    node.gate.wake(name)
    log.info("audit: %s SetBucketThrottleProperties %r %s -> %s", s.who(), name, before, after)
    return after


async def _save_bucket_props(node: Node, handle: BucketHandle, key: str, value: Any) -> None:
    """Persist one part of a bucket's record (its throttle or queue settings)."""
    props = {**handle.props, key: value}
    await node.write(
        PutSystemOp(
            b"bucket:" + handle.name.encode(),
            props,
            expect="present",
            on_absent=errors.BucketNotFound,
            what=f"bucket {handle.name!r}",
        )
    )
    handle.props = props


@command("GetBucketThrottleProperties", "admin", "bucket")
async def get_bucket_throttle(s: Session, p: dict[str, Any]) -> Any:
    """{reserved, hard_limit}."""
    name = str_param(p, "bucket")
    s.node.bucket(name)
    return _bucket_props(s.node, name)


def _bucket_props(node: Node, name: str) -> dict[str, Any]:
    reserved, hard = node.throttle.bucket_limits(name)
    return {"reserved": limit_to_wire(reserved), "hard_limit": limit_to_wire(hard)}


@command("set_parameter", "admin", "name", "value")
async def set_parameter(s: Session, p: dict[str, Any]) -> Any:
    """{name, old, new}. Changes a runtime setting (value nil: back to the configured
    value); persisted. Settings that are not runtime are refused with BadValue."""
    name = str_param(p, "name")
    if "value" not in p:
        raise errors.BadValue("'value' is required (nil resets the parameter)")
    old, new = await s.node.parameters.set(name, p["value"])
    log.info("audit: %s set_parameter %s: %r -> %r", s.who(), name, old, new)
    return {"name": name, "old": old, "new": new}


@command("get_parameter", "admin", "name")
async def get_parameter(s: Session, p: dict[str, Any]) -> Any:
    """{name, value, default, runtime, help}; without name, a list of every setting."""
    if p.get("name") is None:
        return s.node.parameters.describe_all()
    return s.node.parameters.describe(str_param(p, "name"))


@command("watch_events", "admin", "bucket", "max_events", "wait_ms")
async def watch_events(s: Session, p: dict[str, Any]) -> Any:
    """{events: [{event, time, bucket, class, operation, key_len, running, queued,
    outcome}, ...]}: bucket-queue events (request_throttled, request_handled) since the
    last call on this connection, waiting up to wait_ms (default 1000) for the first —
    and answering before the request's own timeout_ms runs out.
    The first call subscribes this connection (for one bucket, or all)."""
    bucket = p.get("bucket")
    if bucket is not None:
        s.node.bucket(str_param(p, "bucket"))
    limit = int_param(p, "max_events", 1000, 1, 100_000)
    timeout = int_param(p, "wait_ms", 1000, 0, 600_000) / 1000
    if p.get("timeout_ms") is not None:  # reply while the client still listens
        timeout = min(timeout, 0.8 * p["timeout_ms"] / 1000)
    rx = s.watch(bucket)
    events = []
    with trio.move_on_after(timeout):
        events.append(await rx.receive())
    while len(events) < limit:
        try:
            events.append(rx.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break
    return {"events": [e.as_dict() for e in events]}


@command("set_bucket_queue", "admin", "bucket", "class", "concurrency", "queue_tolerance")
async def set_bucket_queue(s: Session, p: dict[str, Any]) -> Any:
    """{bucket, class, concurrency, queue_tolerance}: a bucket's own queue limits for one
    class (read or write); nil for a value returns it to the node default. Persisted."""
    name = str_param(p, "bucket")
    cls = p.get("class")
    if cls not in ("read", "write"):
        raise errors.BadValue("'class' must be 'read' or 'write'")
    node = s.node
    handle = node.bucket(name)
    queues = dict(handle.props.get("queues") or {})
    current = dict(queues.get(cls) or {})
    for key in ("concurrency", "queue_tolerance"):
        if key in p:
            current[key] = p[key]
    # Validate by applying to the live gate first (all or nothing), then persist.
    node.queues.set_bucket(name, cls, **current)
    queues[cls] = {k: v for k, v in current.items() if v is not None}
    await _save_bucket_props(node, handle, "queues", queues)
    stats = node.queues.statistics().as_dict()["buckets"][name][cls]
    result = {
        "bucket": name,
        "class": cls,
        "concurrency": stats["concurrency"],
        "queue_tolerance": stats["queue_tolerance"],
    }
    log.info("audit: %s set_bucket_queue %s", s.who(), result)
    return result


@command("backup", "admin", "path")
async def backup(s: Session, p: dict[str, Any]) -> Any:
    """{path, bytes, duration_secs, started_utc}: a consistent, compacted copy of the
    data directory written to path (absolute, on the server's machine; a new or empty
    directory) while the server goes on serving. Restore it offline with
    ``tenantkv restore``."""
    path = p.get("path")
    log.info("audit: %s backup to %r started", s.who(), path)
    try:
        result = await backup_mod.backup(s.node.engine, path)
    except errors.TenantKVError as exc:
        log.info("audit: %s backup to %r failed: %s", s.who(), path, exc.errmsg)
        raise
    log.info(
        "audit: %s backup to %r done: %d bytes in %.3f s",
        s.who(),
        result["path"],
        result["bytes"],
        result["duration_secs"],
    )
    return result


@command("configure_fail_point", "admin", "name", "mode", "data")
async def configure_fail_point(s: Session, p: dict[str, Any]) -> Any:
    """Test only (--enable-test-commands): make commands fail or stall; see
    tenantkv/server/failpoints.py."""
    if not s.node.config.enable_test_commands:
        raise errors.UnknownCommand(
            "configure_fail_point is a test command; start the server with "
            "--enable-test-commands to use it"
        )
    result = s.node.failpoints.configure(p)
    log.info("audit: %s configure_fail_point %s", s.who(), result)
    return result


# -- transactions (server/transaction.py: the state, the queue, EXEC) ---------------


@command("multi", "session")
async def multi(s: Session, p: dict[str, Any]) -> Any:
    """true. Later data commands are checked and answered "QUEUED" until exec or discard."""
    transaction.multi(s)
    return True


@command("exec", "session")
async def exec_(s: Session, p: dict[str, Any]) -> Any:
    """The queued commands' outcomes, one per command: {result} or {error}; nil when
    a watched key changed (nothing ran). BadValue EXECABORT after a queue-time error."""
    return transaction.exec_result(await transaction.execute(s))


@command("discard", "session")
async def discard(s: Session, p: dict[str, Any]) -> Any:
    """true. Forgets the queued commands and the watched keys."""
    transaction.discard(s)
    return True


@command("watch", "session", "keys")
async def watch(s: Session, p: dict[str, Any]) -> Any:
    """true. exec applies nothing (answers nil) if one of keys changes before it."""
    keys = p.get("keys")
    if not isinstance(keys, list) or not 0 < len(keys) <= MAX_KEYS_PER_COMMAND:
        raise errors.BadValue(f"'keys' must be a list of 1-{MAX_KEYS_PER_COMMAND} keys")
    await transaction.watch(s, [key_param({"key": k}) for k in keys])
    return True


@command("unwatch", "session")
async def unwatch(s: Session, p: dict[str, Any]) -> Any:
    """true. Forgets the watched keys."""
    transaction.unwatch(s)
    return True


@command("transaction", "session", "ops", "watch")
async def transaction_(s: Session, p: dict[str, Any]) -> Any:
    """One request, atomic: ops [[method, params], ...] (data commands), each checked
    first — one that fails its check fails the request, nothing ran — then run as
    exec runs a queue: a list of {result} or {error}, one per op. watch [[key, cas],
    ...]: nil, nothing ran, unless each key's CAS is the one given (0: no key)."""
    ops, watched = p.get("ops"), p.get("watch") or []
    if not isinstance(ops, list) or not ops:
        raise errors.BadValue("'ops' must be a non-empty list of [method, params]")
    if not isinstance(watched, list):
        raise errors.BadValue("'watch' must be a list of [key, cas]")
    calls = []
    for i, item in enumerate(ops):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], dict)):
            raise errors.BadValue(f"ops[{i}] must be [method, params]")
        calls.append((COMMANDS.get(item[0]) if isinstance(item[0], str) else None, item[1]))
    watch_cas = []
    for item in watched:
        if not isinstance(item, list) or len(item) != 2:
            raise errors.BadValue("each 'watch' entry must be [key, cas]")
        cas = int_param({"cas": item[1]}, "cas", 0, 0, 2**64 - 1)
        watch_cas.append((key_param({"key": item[0]}), cas))
    return await transaction.run_ops(s, calls, watch_cas)


AdminHandler = Callable[["Session", dict[str, Any]], Awaitable[Any]]

#: The admin commands' names: those the request rate limiter lets pass.
ADMIN_METHODS = frozenset(name for name, cmd in COMMANDS.items() if cmd.kind == "admin")
