"""The tenant throttle's statistics: immutable snapshots of its counters (trio's
``statistics()`` convention), and their JSON form, the ``throttle`` section of
``server_status`` that the metrics are read from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tenantkv.admission.throttle_props import Limit, limit_to_wire, rate_to_wire
from tenantkv.records import fields_dict, histogram_to_wire

#: Upper bounds (µs) of the wait-time histogram bins; a last bin counts the rest.
WAIT_HISTOGRAM_BOUNDS_US: Final[tuple[int, ...]] = (
    100,
    1_000,
    10_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
)


@dataclass(frozen=True, slots=True)
class BucketThrottleStatistics:
    """One bucket's throttle counters (an immutable snapshot)."""

    name: str
    reserved: Limit
    hard_limit: Limit
    weight: float
    connections: int
    #: Reservation in force now (after slow start and over-reservation scaling);
    #: ``inf`` when the node capacity or the bucket's reservation is unlimited.
    effective_reserved: float
    #: Current allowance rate in units/s (``None``: unlimited).
    allowance_rate: float | None
    #: Allowance left now (negative: debt; ``None``: unlimited).
    allowance: float | None
    hungry: bool
    ru_total: int
    wu_total: int
    #: Cost units charged in the current whole-second window / the one before.
    units_used_window: int
    units_used_previous_window: int
    throttle_count_total: int
    throttle_wait_micros_total: int
    reject_count_total: int
    #: ``(upper bound in µs, count)`` per bin; the last bound is ``inf``.
    wait_histogram: tuple[tuple[float, int], ...]
    #: Requests parked at the gate right now (the core has none: 0).
    waiting: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            # (the histogram's key keeps its place; its value is replaced below)
            **fields_dict(
                self, renamed={"wait_histogram": "wait_histogram_us"}, left_out=("name",)
            ),
            "reserved": limit_to_wire(self.reserved),
            "hard_limit": limit_to_wire(self.hard_limit),
            "effective_reserved": rate_to_wire(self.effective_reserved),
            "allowance_rate": rate_to_wire(self.allowance_rate),
            "allowance": rate_to_wire(self.allowance),
            "wait_histogram_us": histogram_to_wire(self.wait_histogram),
        }


@dataclass(frozen=True, slots=True)
class NodeThrottleStatistics:
    """The node's throttle counters (an immutable snapshot)."""

    enabled: bool
    capacity: Limit
    default_reserved: Limit
    default_hard_limit: Limit
    write_weight: int
    slice_secs: float
    max_wait_secs: float
    #: Free pool in units/s: capacity minus reservations in force (``None``: unlimited).
    free_pool_units: float | None
    #: What of it is left to share now, after capacity set aside for unthrottled use.
    free_pool_available_units: float | None
    #: Factor every reservation is scaled by because they exceed the capacity (1.0: none).
    reservation_scale: float
    #: Cost units charged beyond reservations in the current whole-second window.
    free_pool_used_window: int
    #: Unused share no hungry bucket took, usable first come first served.
    spare_units: float
    ru_total: int
    wu_total: int
    throttle_count_total: int
    reject_count_total: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "capacity": limit_to_wire(self.capacity),
            "default_throttle_reserved_units": limit_to_wire(self.default_reserved),
            "default_throttle_hard_limit": limit_to_wire(self.default_hard_limit),
            "write_weight": self.write_weight,
            "slice_ms": round(self.slice_secs * 1000),
            "throttle_max_wait_ms": round(self.max_wait_secs * 1000),
            "free_pool_units": rate_to_wire(self.free_pool_units),
            "free_pool_available_units": rate_to_wire(self.free_pool_available_units),
            "reservation_scale": round(self.reservation_scale, 6),
            "free_pool_used_window": self.free_pool_used_window,
            "spare_units": self.spare_units,
            "ru_total": self.ru_total,
            "wu_total": self.wu_total,
            "throttle_count_total": self.throttle_count_total,
            "reject_count_total": self.reject_count_total,
        }


@dataclass(frozen=True, slots=True)
class ThrottleStatistics:
    """What :meth:`TenantThrottle.statistics` returns."""

    node: NodeThrottleStatistics
    buckets: Mapping[str, BucketThrottleStatistics]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``throttle`` section of ``server_status``)."""
        return {
            "node": self.node.as_dict(),
            "buckets": {name: b.as_dict() for name, b in self.buckets.items()},
        }
