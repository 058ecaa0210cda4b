"""The supervisor's side of the node's figures (``serve --workers N``).

Each worker counts what it serves; the node's document merges the workers'
documents as the metric catalog declares (:func:`status.node_document`). Here
is what only the supervisor can add:

- **Counts that outlive a worker.** It keeps each worker's latest document
  (every status read refreshes it, and it reads them at least every
  :data:`POLL_SECS`); when a worker dies, that document's counts (the figures
  declared ``total`` and ``histogram``) are *retired*: kept and added to the
  node's from then on, so node counters never go back when a worker restarts
  from zero. What a worker counted after its last read and before a
  ``kill -9`` is lost with it: at most :data:`POLL_SECS` of its work, nothing
  when it died idle.
- **Node-level throttle figures** from the allocator, which sees the whole
  node as one process would (its free pool, each bucket's reservation in force
  and allowance rate), instead of adding up per-worker shares.
"""

from __future__ import annotations

import math
from typing import Any

from tenantkv.admission.quota_lease import QuotaAllocator
from tenantkv.admission.throttle_props import rate_to_wire
from tenantkv.server.status import node_document, retire

#: The supervisor reads every worker's document at least this often.
POLL_SECS = 1.0


class WorkerFigures:
    """The workers' latest documents and the counts of those that died."""

    def __init__(self) -> None:
        self._latest: dict[int, dict[str, Any]] = {}
        self.retired: dict[str, Any] = {}
        #: workers whose counts were retired (deaths seen)
        self.retirements = 0

    def seen(self, index: int, doc: dict[str, Any]) -> None:
        """Worker ``index`` (alive) answered with ``doc``."""
        self._latest[index] = doc

    def died(self, index: int) -> None:
        """Worker ``index`` is gone: its last counts become the node's for good."""
        doc = self._latest.pop(index, None)
        if doc is not None:
            self.retired = retire(self.retired, doc)
            self.retirements += 1

    def document(self, docs: list[dict[str, Any]], parts: dict[str, Any]) -> dict[str, Any]:
        """The node's document from the live workers' ``docs`` and the
        supervisor's ``parts`` (figures declared ``node``)."""
        return node_document(docs, parts, self.retired)


def throttle_figures(allocator: QuotaAllocator) -> dict[str, Any]:
    """The ``throttle`` figures declared ``node``, as one process would show them:
    from the allocator's latest allocation (nothing before the first)."""
    st = allocator.statistics()
    if not st["buckets"]:
        return {}
    capacity = allocator.props.node.capacity
    props = allocator.props.buckets
    buckets: dict[str, Any] = {}
    reserved_sum = 0.0
    for name, b in st["buckets"].items():
        res = b["reserved_rate"]
        if isinstance(res, int | float):
            reserved_sum += res
        configured = props[name].reserved if name in props else None
        rate, hard = _rate(b["node_rate"]), _rate(b["hard_rate"])
        buckets[name] = {
            "effective_reserved": (
                float(configured or 0) if capacity is None else rate_to_wire(_rate(res))
            ),
            "allowance_rate": rate_to_wire(min(rate, hard)),
        }
    node = {
        "free_pool_units": ("unlimited" if capacity is None else max(0.0, capacity - reserved_sum)),
        "free_pool_available_units": "unlimited" if capacity is None else st["free_rate"],
    }
    return {"node": node, "buckets": buckets}


def _rate(value: float | str) -> float:
    return math.inf if isinstance(value, str) else float(value)
