"""Shared state across the worker processes of ``serve --workers N``.

Users, buckets, throttle properties and runtime parameters live in LMDB's
system database, the one copy every worker reads. A worker that changes one
commits it first (as a single process does), then tells the supervisor, which
tells every other worker to :func:`reload`: each compares what it holds in
memory with what is committed and applies the difference through the same
calls the admin commands use. One round trip of a local socket, so a change is
seen everywhere within milliseconds (the bound we promise is 100 ms).

Why reload everything rather than ship the change: the committed state is the
truth, a reload is idempotent and cheap (a few system records), and a worker
that missed a message — restarted, or busy — still converges on the next one.
"""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any

from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import (
    BucketProps,
    NodeProps,
    ThrottleProps,
    bucket_props_from_record,
    node_props_from_record,
)
from tenantkv.server.accounts import stored_users
from tenantkv.server.node import THROTTLE_NODE_KEY, Node
from tenantkv.storage.engine import Engine

log = logging.getLogger("tenantkv.server")


def stored_buckets(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every bucket's committed properties."""
    return {name.decode(): props for name, props in engine.system_items(b"bucket:")}


def stored_node_props(engine: Engine) -> NodeProps:
    """The node's committed throttle properties."""
    return node_props_from_record(engine.system_get(THROTTLE_NODE_KEY))


def stored_throttle_props(engine: Engine, previous: ThrottleProps | None = None) -> ThrottleProps:
    """The committed throttle properties of the node and every bucket: what the
    supervisor's quota allocator computes the node's allowance rates from.

    Buckets keep their order in ``previous`` and new ones follow, as in a
    throttle that added and removed them as they came (the allocation shares
    exact ties in that order)."""
    stored = {name: bucket_props_from_record(p) for name, p in stored_buckets(engine).items()}
    order = {name: None for name in (previous.buckets if previous else ()) if name in stored}
    order.update(dict.fromkeys(stored))
    buckets = MappingProxyType({name: stored[name] for name in order})
    return ThrottleProps(stored_node_props(engine), buckets)


def apply_node_props(throttle: TenantThrottle, props: NodeProps) -> None:
    """Give ``throttle`` the node's properties ``props``."""
    throttle.set_node(
        capacity=props.capacity,
        default_reserved=props.default_reserved,
        default_hard_limit=props.default_hard_limit,
    )


def apply_bucket_props(throttle: TenantThrottle, name: str, props: BucketProps) -> None:
    """Give bucket ``name`` the limits ``props`` unless it has them already."""
    if throttle.bucket_limits(name) != (props.reserved, props.hard_limit):
        throttle.set_bucket(name, reserved=props.reserved, hard_limit=props.hard_limit)


def reload(node: Node, *, open_new: bool = True) -> None:
    """Apply every shared change committed by another worker (see the module doc).

    ``open_new`` False: a committed bucket this process has not opened is left
    alone. A cluster node (tenantkv.cluster.metadata) opens the buckets other
    nodes create itself, so one it has not opened is its own admin command's,
    committed and about to be added by that command."""
    engine = node.engine
    node.accounts.reload(stored_users(engine))
    _reload_buckets(node, stored_buckets(engine), open_new=open_new)
    apply_node_props(node.throttle, stored_node_props(engine))
    node.parameters.reload(engine)
    node.gate.wake()


def _reload_buckets(node: Node, stored: dict[str, dict[str, Any]], *, open_new: bool) -> None:
    engine = node.engine
    for name, handle in list(engine.buckets.items()):
        props = stored.get(name)
        if props is None or props.get("created_ms") != handle.props.get("created_ms"):
            # Dropped (and maybe created anew: a new tenant, sessions lose it).
            node.bucket_removed(handle)
            node.deselect(name)
            log.info("bucket %r was dropped by another worker", name)
    for name, props in stored.items():
        existing = engine.buckets.get(name)
        if existing is None:
            if not open_new:
                continue
            opened = engine.open_bucket(name, props)
            if opened is not None:
                node.bucket_added(opened)
                log.info("bucket %r was created by another worker", name)
        elif props != existing.props:
            existing.props = dict(props)
            apply_bucket_props(node.throttle, name, bucket_props_from_record(props))
            for cls, queue_props in (props.get("queues") or {}).items():
                node.queues.set_bucket(name, cls, **queue_props)
