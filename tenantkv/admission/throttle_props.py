"""Validation of the two throttle admin bodies (Couchbase's JSON, our errors).

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
from collections.abc import Mapping
from typing import Any, Final

from tenantkv.errors import BadValue

#: A unit limit: a non-negative int, or ``None`` for "unlimited".
Limit = int | None

#: The wire spelling of an unlimited limit.
UNLIMITED: Final = "unlimited"

#: Largest body accepted, in bytes of JSON text.
MAX_BODY_BYTES: Final = 1024
#: Largest finite limit (fits the int64 that other tools store it in).
MAX_LIMIT: Final = 2**63 - 1

NODE_KEYS: Final = ("capacity", "default_throttle_hard_limit", "default_throttle_reserved_units")
BUCKET_KEYS: Final = ("reserved", "hard_limit")


def limit_to_wire(limit: Limit) -> int | str:
    """The JSON spelling of a limit: the int, or ``"unlimited"`` for ``None``."""
    return UNLIMITED if limit is None else limit


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
    if res_key in out and hard_key in out and not _le(out[res_key], out[hard_key]):
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
    if "reserved" in out and "hard_limit" in out and not _le(out["reserved"], out["hard_limit"]):
        raise BadValue(
            "reserved can't exceed hard limit "
            f"(reserved {limit_to_wire(out['reserved'])} > "
            f"hard_limit {limit_to_wire(out['hard_limit'])})"
        )
    return out


def _le(a: Limit, b: Limit) -> bool:
    """``a <= b`` where ``None`` is infinity."""
    if b is None:
        return True
    return a is not None and a <= b


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
