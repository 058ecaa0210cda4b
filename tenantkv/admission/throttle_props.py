"""The tenant throttle's properties: their records, the validation of the two
admin bodies (Couchbase's JSON, our errors), and the reading of stored ones.

The records (:class:`NodeProps`, :class:`BucketProps`, :class:`ThrottleProps`)
are what the allocation of rates needs to know of a node, frozen so the
supervisor's allocator carries a value, not a throttle. The stored forms (the
node's system record, a bucket record's ``"throttle"`` part) are read by
:func:`node_props_from_record` and :func:`bucket_props_from_record` alone.

``SetNodeThrottleProperties`` takes ``{"capacity", "default_throttle_hard_limit",
"default_throttle_reserved_units"}`` and ``SetBucketThrottleProperties`` takes
``{"reserved", "hard_limit"}``; every key is optional, any other key is an
error. A value is a non-negative integer (units per second) or the exact
string ``"unlimited"``; ``0`` means "fully throttled". Parsed values use the
gate's :data:`Limit` (``None`` = unlimited).

Why so strict: these bodies come from operators and scripts; a typo such as
``"hardlimit"`` or ``"10000"`` silently ignored would leave a tenant unprotected.
So every failure raises :class:`~tenantkv.errors.BadValue` naming the key and the
rule. Checks that need the stored values too (a new ``reserved`` against the
bucket's existing hard limit) are done again by
:meth:`~tenantkv.admission.tenant_throttle.TenantThrottle.set_bucket`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from tenantkv.errors import BadValue

#: A unit limit: a non-negative int, or ``None`` for "unlimited".
Limit = int | None

#: The wire spelling of an unlimited limit.
UNLIMITED: Final = "unlimited"

#: Length of the throttle's refill slice, in seconds.
DEFAULT_SLICE_SECS: Final = 0.1

#: Largest body accepted, in bytes of JSON text.
MAX_BODY_BYTES: Final = 1024
#: Largest finite limit (fits the int64 that other tools store it in).
MAX_LIMIT: Final = 2**63 - 1

NODE_KEYS: Final = ("capacity", "default_throttle_hard_limit", "default_throttle_reserved_units")
BUCKET_KEYS: Final = ("reserved", "hard_limit")


def limit_to_wire(limit: Limit) -> int | str:
    """The JSON spelling of a limit: the int, or ``"unlimited"`` for ``None``."""
    return UNLIMITED if limit is None else limit


def rate_to_wire(value: float | None) -> float | str:
    """The JSON spelling of a rate: JSON has no infinity, so infinity (and ``None``)
    is ``"unlimited"``."""
    return UNLIMITED if value is None or math.isinf(value) else value


def limit_rate(limit: Limit) -> float:
    """A limit as a rate: ``None`` (unlimited) is infinity."""
    return math.inf if limit is None else float(limit)


def limit_le(a: Limit, b: Limit) -> bool:
    """``a <= b`` where ``None`` is infinity."""
    if b is None:
        return True
    return a is not None and a <= b


def check_limit(name: str, value: object) -> Limit:
    """Validate a :data:`Limit` given through the Python API."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadValue(f"{name} must be a non-negative integer or unlimited, got {value!r}")
    return value


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class NodeProps:
    """The node's throttle properties (units/s; ``None``: unlimited). The defaults
    are what a bucket created without its own limits gets."""

    capacity: Limit = None
    default_reserved: Limit = 0
    default_hard_limit: Limit = None


@dataclass(frozen=True, slots=True)
class BucketProps:
    """One bucket's throttle properties (units/s; ``None``: unlimited)."""

    reserved: Limit = 0
    hard_limit: Limit = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ThrottleProps:
    """Everything the allocation of allowance rates knows of a node besides its
    use: the node's properties, every bucket's (in the throttle's order: the
    order decides how exact ties are shared) and the refill slice."""

    node: NodeProps = NodeProps()
    buckets: Mapping[str, BucketProps] = field(default_factory=lambda: MappingProxyType({}))
    slice_secs: float = DEFAULT_SLICE_SECS


def node_props_from_record(saved: Mapping[str, Any] | None) -> NodeProps:
    """The node's properties from their system record (absent: the defaults)."""
    saved = saved or {}
    return NodeProps(
        capacity=parse_limit("capacity", saved.get("capacity", UNLIMITED)),
        default_reserved=parse_limit(
            "default_throttle_reserved_units", saved.get("default_throttle_reserved_units", 0)
        ),
        default_hard_limit=parse_limit(
            "default_throttle_hard_limit", saved.get("default_throttle_hard_limit", UNLIMITED)
        ),
    )


def bucket_props_from_record(record: Mapping[str, Any]) -> BucketProps:
    """A bucket's properties from its system record (its ``"throttle"`` part)."""
    saved = record.get("throttle") or {}
    return BucketProps(
        reserved=parse_limit("reserved", saved.get("reserved", 0)),
        hard_limit=parse_limit("hard_limit", saved.get("hard_limit", UNLIMITED)),
    )


# --------------------------------------------------------------------------- admin bodies


def parse_limit(key: str, value: Any) -> Limit:
    """One value: a non-negative int or ``"unlimited"`` (``True`` is not an int)."""
    if value == UNLIMITED and isinstance(value, str):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadValue(f'{key} must be a non-negative integer or "unlimited", got {_show(value)}')
    if value < 0:
        raise BadValue(f'{key} must be a non-negative integer or "unlimited", got {value}')
    if value > MAX_LIMIT:
        raise BadValue(f"{key} is out of range (at most {MAX_LIMIT}), got {value}")
    return value


def parse_node_props(body: str | bytes | Mapping[str, Any]) -> dict[str, Limit]:
    """Validate a ``SetNodeThrottleProperties`` body; return only the keys given.

    When both defaults are given, the hard limit must not be below the reservation.
    """
    obj = _load(body, "node throttle properties")
    out = _parse_keys(obj, NODE_KEYS, "node throttle properties")
    res_key, hard_key = "default_throttle_reserved_units", "default_throttle_hard_limit"
    if res_key in out and hard_key in out and not limit_le(out[res_key], out[hard_key]):
        raise BadValue(
            f"{res_key}: reserved can't exceed hard limit "
            f"({res_key} {limit_to_wire(out[res_key])} > "
            f"{hard_key} {limit_to_wire(out[hard_key])})"
        )
    return out


def parse_bucket_props(body: str | bytes | Mapping[str, Any]) -> dict[str, Limit]:
    """Validate a ``SetBucketThrottleProperties`` body; return only the keys given."""
    obj = _load(body, "bucket throttle properties")
    out = _parse_keys(obj, BUCKET_KEYS, "bucket throttle properties")
    if (
        "reserved" in out
        and "hard_limit" in out
        and not limit_le(out["reserved"], out["hard_limit"])
    ):
        raise BadValue(
            "reserved can't exceed hard limit "
            f"(reserved {limit_to_wire(out['reserved'])} > "
            f"hard_limit {limit_to_wire(out['hard_limit'])})"
        )
    return out


def _show(value: Any) -> str:
    """A value as the operator wrote it (JSON), else its repr."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _reject_constant(name: str) -> Any:
    raise BadValue(f"{name} is not a valid JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BadValue(f"duplicate key {key!r}")
        out[key] = value
    return out


def _load(body: str | bytes | Mapping[str, Any], what: str) -> Mapping[str, Any]:
    if isinstance(body, Mapping):
        obj: Any = body
    elif isinstance(body, str | bytes | bytearray):
        size = len(body.encode("utf-8")) if isinstance(body, str) else len(body)
        if size > MAX_BODY_BYTES:
            raise BadValue(f"{what}: body too large ({size} bytes, at most {MAX_BODY_BYTES})")
        try:
            text = body if isinstance(body, str) else bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadValue(f"{what}: body is not UTF-8 ({exc.reason})") from None
        try:
            obj = json.loads(
                text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
            )
        except json.JSONDecodeError as exc:
            raise BadValue(f"{what}: invalid JSON ({exc.msg} at position {exc.pos})") from None
    else:
        raise BadValue(f"{what}: expected a JSON object, got {type(body).__name__}")
    if not isinstance(obj, Mapping):
        raise BadValue(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


#: Keys that hold a reservation: finite by rule (Couchbase's schema has numbers
#: there). An "unlimited" reservation would exempt a bucket from node capacity
#: (one served 17,045 units/s on a capacity-1000 node), so capacity must bound
#: every throttled tenant.
RESERVATION_KEYS: Final = ("reserved", "default_throttle_reserved_units")


def _parse_keys(obj: Mapping[str, Any], keys: tuple[str, ...], what: str) -> dict[str, Limit]:
    for key in obj:
        if key not in keys:
            allowed = ", ".join(keys)
            raise BadValue(f"{what}: unknown key {key!r} (allowed: {allowed})")
    out = {key: parse_limit(key, obj[key]) for key in keys if key in obj}
    for key in RESERVATION_KEYS:
        if key in out and out[key] is None:
            raise BadValue(
                f'{key} must be a non-negative integer: a reservation is finite, "unlimited" '
                "is only for capacity and hard limits (node capacity bounds every tenant)"
            )
    return out
