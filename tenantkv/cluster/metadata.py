"""Cluster-wide metadata: buckets, users and runtime parameters held in etcd.

In a cluster, etcd is the truth for these records and each node's LMDB system
records are its copy (what it serves from, also while etcd is down). A change
made on a node (an admin command) goes through :meth:`MetadataStore.sharing`
around the node's commit: first one etcd transaction, with the op's own
condition (the bucket is absent, the user present, ...) as the transaction's
compare, so that two nodes racing for one name cannot both win; then the local
commit. etcd refusing the condition answers the op's own error; etcd
unreachable refuses the change (``NodeUnavailable``) before anything is written
anywhere.

Every node watches the records' prefix and, on each change, brings its copy
to what etcd holds (:func:`apply_state`: the difference, written with the same
ops the admin commands use, then :func:`shared_state.reload`, as after another
worker's change). The copy is compared whole rather than event by event, so a
node that missed events (etcd down, a restart) converges on the next read.

Records are stored in etcd as they are in LMDB (MessagePack): a user's record
holds the scrypt salt and hash, never the password.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import msgpack
import trio

from tenantkv import errors
from tenantkv.cluster.etcd import Compare, Etcd, EtcdError, delete_op, put_op
from tenantkv.cluster.membership import RETRY_SECS, ClusterSettings
from tenantkv.storage.ops import CreateBucketOp, DropBucketOp, PutSystemOp, WriteOp

if TYPE_CHECKING:
    from tenantkv.server.node import Node

log = logging.getLogger("tenantkv.cluster")

#: The system records that are the cluster's rather than the node's. Node
#: throttle properties (its capacity) and known-good login pairs stay per node.
SHARED_PREFIXES = (b"bucket:", b"user:", b"param:")
#: Local record: this data directory's copy has followed the cluster's once (a
#: node that never has may bring records of its own; see :func:`initial_merge`).
SYNCED_KEY = b"cluster:metadata-synced"

#: Set while a node applies what etcd holds: those writes are not published back.
_following: contextvars.ContextVar[bool] = contextvars.ContextVar("following", default=False)


def is_shared(key: bytes) -> bool:
    return key.startswith(SHARED_PREFIXES)


def local_records(node: Node) -> dict[bytes, Any]:
    """The node's copy: every shared system record, by its full key."""
    return {
        prefix + key: value
        for prefix in SHARED_PREFIXES
        for key, value in node.engine.system_items(prefix)
    }


def _present(key: bytes) -> Compare:
    return Compare(key, "VERSION", "GREATER", 0)


def _condition(etcd_key: bytes, expect: str | None) -> list[Compare]:
    if expect == "absent":
        return [Compare.absent(etcd_key)]
    if expect == "present":
        return [_present(etcd_key)]
    return []


class MetadataStore:
    """One node's side of the cluster's metadata (see the module docstring)."""

    def __init__(self, etcd: Etcd, settings: ClusterSettings, node: Node) -> None:
        self.etcd = etcd
        self.node = node
        self.root = settings.key("meta") + b"/"
        #: what etcd holds, by system key (raw MessagePack), as last read
        self.state: dict[bytes, bytes] = {}
        #: changes seen by the watch (for status and tests)
        self.changes = 0
        self.etcd_errors = 0
        #: one change at a time: a local commit is not overtaken by the watch's
        #: copy of the same change, which would find it half applied
        self._lock = trio.Lock()

    def status(self) -> dict[str, Any]:
        return {
            "records": len(self.state),
            "changes": self.changes,
            "etcd_errors": self.etcd_errors,
        }

    # -- a change made on this node -----------------------------------------------------

    @contextlib.asynccontextmanager
    async def sharing(self, op: WriteOp) -> AsyncIterator[None]:
        """Publish ``op`` to etcd, then let the node commit it (see the module doc)."""
        if _following.get():
            yield  # the node is applying etcd's own state
            return
        txn = self._txn(op)
        if txn is None:
            yield  # a record of the node's own
            return
        compare, success, refused = txn
        async with self._lock:
            try:
                result = await self.etcd.txn(compare, success)
            except EtcdError as exc:
                self.etcd_errors += 1
                # Nothing was written here. (A reply lost after etcd took the
                # change is the one case it happened after all: then every node,
                # this one too, gets it from etcd by the watch.)
                raise errors.NodeUnavailable(
                    f"cluster metadata cannot change now: {exc}; not applied on this "
                    "node, try again when etcd is reachable"
                ) from None
            if not result.succeeded:
                raise refused
            yield

    def _txn(
        self, op: WriteOp
    ) -> tuple[list[Compare], list[dict[str, Any]], errors.ServerError] | None:
        """The etcd transaction of ``op``: its compares, its writes and the error
        when the compares fail; None for an op on records of the node's own."""
        if isinstance(op, CreateBucketOp):
            key = self.root + b"bucket:" + op.name.encode()
            fail: errors.ServerError = errors.BucketExists(f"bucket {op.name!r} already exists")
            return [Compare.absent(key)], [put_op(key, msgpack.packb(op.props))], fail
        if isinstance(op, DropBucketOp):
            key = self.root + b"bucket:" + op.handle.name.encode()
            puts = [put_op(self.root + k, msgpack.packb(v)) for k, v in op.system_puts.items()]
            fail = errors.BucketNotFound(f"bucket {op.handle.name!r} does not exist")
            return [_present(key)], [delete_op(key), *puts], fail
        if isinstance(op, PutSystemOp) and is_shared(op.key):
            key = self.root + op.key
            write = delete_op(key) if op.value is None else put_op(key, msgpack.packb(op.value))
            fail_type = op.on_present if op.expect == "absent" else op.on_absent
            word = "already exists" if op.expect == "absent" else "does not exist"
            return _condition(key, op.expect), [write], fail_type(f"{op.what} {word}")
        return None

    # -- following etcd -----------------------------------------------------------------

    async def read(self) -> int:
        """Read every record from etcd into :attr:`state`; returns etcd's revision."""
        kvs, revision = await self.etcd.range(self.root, prefix=True)
        self.state = {kv.key[len(self.root) :]: kv.value for kv in kvs}
        return revision

    async def follow(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the node's copy equal to etcd's: read, apply, then watch and apply
        each change. Started once the first read is applied; etcd unreachable,
        the node keeps its copy and reads again when etcd is back."""
        started = False
        while True:
            try:
                revision = await self.read()
                if not started:
                    await initial_merge(self)
                await self.apply()
                if not started:
                    task_status.started()
                    started = True
                async with self.etcd.watch(
                    self.root, prefix=True, start_revision=revision + 1
                ) as watch:
                    async for events in watch:
                        for event in events:
                            key = event.kv.key[len(self.root) :]
                            if event.type == "PUT":
                                self.state[key] = event.kv.value
                            else:
                                self.state.pop(key, None)
                        self.changes += 1
                        await self.apply()
            except EtcdError as exc:
                self.etcd_errors += 1
                log.warning("cluster metadata watch: %s (retrying; serving on the copy held)", exc)
                await trio.sleep(RETRY_SECS)

    async def apply(self) -> None:
        """Bring the node's copy to :attr:`state`."""
        async with self._lock:
            wanted = _decoded(self.node, self.state)
            token = _following.set(True)
            try:
                changed = await apply_state(self.node, wanted)
            finally:
                _following.reset(token)
        if changed:
            from tenantkv.server import shared_state

            shared_state.reload(self.node, open_new=False)


def _decoded(node: Node, state: dict[bytes, bytes]) -> dict[bytes, Any]:
    """etcd's records as values. One that is not MessagePack (written by hand)
    is logged and the node's own copy of it kept, rather than stop following
    or take it for a deletion (which, for a bucket, would drop its data)."""
    out = {}
    for key, raw in state.items():
        try:
            out[key] = msgpack.unpackb(raw)
        except (ValueError, msgpack.ExtraData) as exc:
            log.error("cluster metadata: %s in etcd is not a record (%s); ignored", key, exc)
            local = node.engine.system_get(key)
            if local is not None:
                out[key] = local
    return out


async def apply_state(node: Node, wanted: dict[bytes, Any]) -> bool:
    """Write the difference between the node's copy and ``wanted`` (every shared
    record, by system key) with the ops the admin commands use; True if any.

    Buckets first: dropping one also revokes its roles in the users' records,
    which the users' pass then sets to what ``wanted`` says. A record this node
    cannot take (its storage full, its bucket limit reached) is logged and
    tried again at the next change: the node goes on serving what it has."""
    changed = False
    for buckets in (True, False):
        have = local_records(node)
        for key in sorted(set(have) | set(wanted)):
            old, new = have.get(key), wanted.get(key)
            if key.startswith(b"bucket:") is not buckets or old == new:
                continue
            changed = True
            try:
                if buckets:
                    await _apply_bucket(node, key[len(b"bucket:") :].decode(), old, new)
                else:
                    await node.write(PutSystemOp(key, new))
            except errors.ServerError as exc:
                log.error("cluster metadata: %s not applied here: %s", key.decode(), exc)
    return changed


async def _apply_bucket(node: Node, name: str, old: Any, new: Any) -> None:
    """Bring bucket ``name``'s record from ``old`` to ``new`` (None: absent); a
    new ``created_ms`` is a new tenant: the old one's data and grants go."""
    if old is not None and (new is None or old.get("created_ms") != new.get("created_ms")):
        log.info("bucket %r was dropped on another node", name)
        handle = node.engine.buckets.get(name)
        if handle is not None:
            await node.drop_bucket(handle)
        else:
            await node.write(PutSystemOp(b"bucket:" + name.encode(), None))
        old = None
    if new is not None and old is None:
        log.info("bucket %r was created on another node", name)
        node.bucket_added(await node.write(CreateBucketOp(name, dict(new))))
    elif new is not None:
        await node.write(PutSystemOp(b"bucket:" + name.encode(), new))


async def initial_merge(store: MetadataStore) -> None:
    """A data directory that never followed a cluster (a single node joining one)
    brings its records: each one etcd lacks is added (if still absent: etcd's
    wins a name both have). Later, etcd's state is the whole truth: a record
    the node holds and etcd does not was deleted while the node was away."""
    node = store.node
    if node.engine.system_get(SYNCED_KEY) is not None:
        return
    for key, value in local_records(node).items():
        if key in store.state:
            continue
        etcd_key = store.root + key
        raw = msgpack.packb(value)
        result = await store.etcd.txn([Compare.absent(etcd_key)], [put_op(etcd_key, raw)])
        if result.succeeded:
            store.state[key] = raw
            log.info("brought %s of this node into the cluster's metadata", key.decode())
    await node.write(PutSystemOp(SYNCED_KEY, {"prefix": store.root.decode()}))
