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
from typing import Any

from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import parse_limit
from tenantkv.server.accounts import stored_users
from tenantkv.server.node import THROTTLE_NODE_KEY, Node
from tenantkv.storage.engine import Engine

log = logging.getLogger("tenantkv.server")


def stored_buckets(engine: Engine) -> dict[str, dict[str, Any]]:
    """Every bucket's committed properties."""
    return {name.decode(): props for name, props in engine.system_items(b"bucket:")}


def apply_node_throttle(throttle: TenantThrottle, saved: dict[str, Any] | None) -> None:
    """Set the node's throttle properties from their system record."""
    saved = saved or {}
    throttle.set_node(
        capacity=parse_limit("capacity", saved.get("capacity", "unlimited")),
        default_reserved=parse_limit(
            "default_throttle_reserved_units", saved.get("default_throttle_reserved_units", 0)
        ),
        default_hard_limit=parse_limit(
            "default_throttle_hard_limit", saved.get("default_throttle_hard_limit", "unlimited")
        ),
    )


def bucket_limits(props: dict[str, Any]) -> dict[str, Any]:
    """A bucket's throttle limits from its record (reserved, hard_limit)."""
    t = props.get("throttle") or {}
    return {
        "reserved": parse_limit("reserved", t.get("reserved", 0)),
        "hard_limit": parse_limit("hard_limit", t.get("hard_limit", "unlimited")),
    }


def sync_throttle(throttle: TenantThrottle, engine: Engine) -> None:
    """Make ``throttle``'s properties those committed (the supervisor's copy, which
    the quota allocator computes the node's allowance rates from)."""
    apply_node_throttle(throttle, engine.system_get(THROTTLE_NODE_KEY))
    stored = stored_buckets(engine)
    for name in [n for n in throttle.statistics().buckets if n not in stored]:
        throttle.remove_bucket(name)
    for name, props in stored.items():
        limits = bucket_limits(props)
        if name in throttle:
            if throttle.bucket_limits(name) != (limits["reserved"], limits["hard_limit"]):
                throttle.set_bucket(name, **limits)
        else:
            throttle.add_bucket(name, **limits)


def reload(node: Node) -> None:
    """Apply every shared change committed by another worker (see the module doc)."""
    engine = node.engine
    node.accounts.reload(stored_users(engine))
    _reload_buckets(node, stored_buckets(engine))
    apply_node_throttle(node.throttle, engine.system_get(THROTTLE_NODE_KEY))
    node.parameters.reload(engine)
    node.gate.wake()


def _reload_buckets(node: Node, stored: dict[str, dict[str, Any]]) -> None:
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
            opened = engine.open_bucket(name, props)
            if opened is not None:
                node.bucket_added(opened)
                log.info("bucket %r was created by another worker", name)
        elif props != existing.props:
            existing.props = dict(props)
            limits = bucket_limits(props)
            if node.throttle.bucket_limits(name) != (limits["reserved"], limits["hard_limit"]):
                node.throttle.set_bucket(name, **limits)
            for cls, queue_props in (props.get("queues") or {}).items():
                node.queues.set_bucket(name, cls, **queue_props)
