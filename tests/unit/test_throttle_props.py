"""The throttle admin bodies: every rule, and the exact messages operators see."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from tenantkv.admission.tenant_throttle import TenantThrottle
from tenantkv.admission.throttle_props import (
    MAX_BODY_BYTES,
    BucketProps,
    NodeProps,
    bucket_props_from_record,
    limit_to_wire,
    node_props_from_record,
    parse_bucket_props,
    parse_limit,
    parse_node_props,
    rate_to_wire,
)
from tenantkv.errors import BadValue
from tests.conftest import FakeClock


def test_limit_to_wire() -> None:
    assert limit_to_wire(None) == "unlimited"
    assert limit_to_wire(0) == 0
    assert limit_to_wire(5000) == 5000


NODE_BODY = {
    "capacity": 10000,
    "default_throttle_hard_limit": "unlimited",
    "default_throttle_reserved_units": 1666,
}


@pytest.mark.parametrize("body", [json.dumps(NODE_BODY), json.dumps(NODE_BODY).encode(), NODE_BODY])
def test_node_props_all_keys(body: str | bytes | dict[str, object]) -> None:
    assert parse_node_props(body) == {
        "capacity": 10000,
        "default_throttle_hard_limit": None,
        "default_throttle_reserved_units": 1666,
    }


def test_props_return_only_given_keys() -> None:
    assert parse_node_props('{"capacity": "unlimited"}') == {"capacity": None}
    assert parse_node_props("{}") == {}
    assert parse_bucket_props('{"hard_limit": 0}') == {"hard_limit": 0}
    assert parse_bucket_props(b'{"reserved": 7}') == {"reserved": 7}


def test_bucket_props_both() -> None:
    assert parse_bucket_props('{"reserved": 2000, "hard_limit": 8000}') == {
        "reserved": 2000,
        "hard_limit": 8000,
    }
    assert parse_bucket_props({"reserved": 5, "hard_limit": 5}) == {"reserved": 5, "hard_limit": 5}
    assert parse_bucket_props({"reserved": 5, "hard_limit": "unlimited"}) == {
        "reserved": 5,
        "hard_limit": None,
    }


@pytest.mark.parametrize(
    "value",
    [True, False, -1, 1.5, 2.0, "10000", "Unlimited", "unlimited ", None, [], {}],
)
def test_bad_values_rejected_naming_key(value: object) -> None:
    with pytest.raises(BadValue) as info:
        parse_bucket_props({"hard_limit": value})
    assert "hard_limit" in info.value.errmsg
    assert 'non-negative integer or "unlimited"' in info.value.errmsg


def test_bool_is_not_an_int_in_json_text() -> None:
    with pytest.raises(BadValue, match="capacity must be a non-negative integer"):
        parse_node_props('{"capacity": true}')


def test_value_out_of_range() -> None:
    with pytest.raises(BadValue, match="out of range"):
        parse_limit("capacity", 2**64)


def test_reserved_over_hard_limit() -> None:
    with pytest.raises(BadValue) as info:
        parse_bucket_props('{"reserved": 9000, "hard_limit": 8000}')
    assert "reserved can't exceed hard limit" in info.value.errmsg
    with pytest.raises(BadValue, match="a reservation is finite"):
        parse_bucket_props({"reserved": "unlimited", "hard_limit": 8000})


@pytest.mark.parametrize(
    "parse, body",
    [
        (parse_bucket_props, {"reserved": "unlimited"}),
        (parse_bucket_props, '{"reserved": "unlimited", "hard_limit": "unlimited"}'),
        (parse_node_props, {"default_throttle_reserved_units": "unlimited"}),
    ],
)
def test_reservations_are_finite(parse: Any, body: Any) -> None:
    """An unlimited reservation exempted a bucket from node capacity (17,045 units/s
    on a capacity-1000 node)."""
    with pytest.raises(BadValue, match="a reservation is finite"):
        parse(body)


def test_node_defaults_hard_at_least_reserved() -> None:
    with pytest.raises(BadValue, match="reserved can't exceed hard limit"):
        parse_node_props(
            '{"default_throttle_reserved_units": 10, "default_throttle_hard_limit": 9}'
        )
    # One default alone cannot be checked here; TenantThrottle.set_node does it.
    assert parse_node_props('{"default_throttle_reserved_units": 10}') == {
        "default_throttle_reserved_units": 10
    }


def test_unknown_key_named() -> None:
    with pytest.raises(BadValue) as info:
        parse_bucket_props('{"reserved": 1, "hardlimit": 2}')
    assert "'hardlimit'" in info.value.errmsg
    with pytest.raises(BadValue, match="unknown key 'reserved'"):
        parse_node_props({"reserved": 1})
    with pytest.raises(BadValue, match="unknown key 'capacity'"):
        parse_bucket_props({"capacity": 1})


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("", "invalid JSON"),
        ("{", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('"unlimited"', "expected a JSON object, got str"),
        ('{"capacity": NaN}', "NaN is not a valid JSON number"),
        ('{"capacity": 1, "capacity": 2}', "duplicate key 'capacity'"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_bodies(body: str | bytes, fragment: str) -> None:
    with pytest.raises(BadValue) as info:
        parse_node_props(body)
    assert fragment in info.value.errmsg


def test_body_size_limit() -> None:
    pad = " " * (MAX_BODY_BYTES - len('{"capacity": 1}'))
    ok = '{"capacity": 1}' + pad
    assert len(ok.encode()) == MAX_BODY_BYTES
    assert parse_node_props(ok) == {"capacity": 1}
    with pytest.raises(BadValue, match="body too large"):
        parse_node_props(ok + " ")
    with pytest.raises(BadValue, match="body too large"):
        parse_bucket_props((ok + " ").encode())
    # Counted in bytes, not characters.
    with pytest.raises(BadValue, match="body too large"):
        parse_node_props('{"capacity": 1}' + "é" * 600)


def test_wrong_body_type() -> None:
    with pytest.raises(BadValue, match="expected a JSON object"):
        parse_node_props(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- records


def test_stored_records_read_with_their_defaults() -> None:
    assert node_props_from_record(None) == NodeProps(None, 0, None)
    assert node_props_from_record(
        {"capacity": 9000, "default_throttle_reserved_units": 5, "default_throttle_hard_limit": 50}
    ) == NodeProps(9000, 5, 50)
    assert bucket_props_from_record({"created_ms": 1}) == BucketProps(0, None, 1.0)
    assert bucket_props_from_record(
        {"throttle": {"reserved": 7, "hard_limit": "unlimited"}}
    ) == BucketProps(7, None)
    with pytest.raises(BadValue, match="hard_limit must be"):
        bucket_props_from_record({"throttle": {"hard_limit": -1}})


def test_rate_to_wire_spells_infinity() -> None:
    assert rate_to_wire(math.inf) == "unlimited"
    assert rate_to_wire(None) == "unlimited"
    assert rate_to_wire(12.5) == 12.5


def test_a_throttle_gives_its_properties_as_a_frozen_record() -> None:
    th = TenantThrottle(FakeClock(), capacity=1000, default_reserved=10, slice_secs=0.05)
    th.add_bucket("b")
    th.add_bucket("a", reserved=100, hard_limit=500, weight=2.0)
    props = th.props()
    assert props.node == NodeProps(1000, 10, None)
    assert list(props.buckets.items()) == [
        ("b", BucketProps(10, None, 1.0)),
        ("a", BucketProps(100, 500, 2.0)),
    ]
    assert props.slice_secs == 0.05
    with pytest.raises(TypeError):
        props.buckets["c"] = BucketProps()  # type: ignore[index]


class _Engine:
    """The two reads :func:`stored_throttle_props` makes of the storage engine."""

    def __init__(self, node: dict[str, Any] | None, buckets: dict[str, dict[str, Any]]) -> None:
        self.node, self.buckets = node, buckets

    def system_get(self, key: bytes) -> Any:
        assert key == b"throttle:node"
        return self.node

    def system_items(self, prefix: bytes) -> list[tuple[bytes, Any]]:
        assert prefix == b"bucket:"
        return [(name.encode(), props) for name, props in sorted(self.buckets.items())]


def test_stored_properties_keep_the_order_buckets_came_in() -> None:
    from tenantkv.server.shared_state import stored_throttle_props

    engine = _Engine({"capacity": 100}, {"b": {}, "c": {"throttle": {"reserved": 5}}})
    first = stored_throttle_props(engine)  # type: ignore[arg-type]
    assert first.node == NodeProps(100, 0, None)
    assert list(first.buckets) == ["b", "c"]
    engine.buckets = {"a": {}, "c": {"throttle": {"reserved": 6}}, "d": {}}
    after = stored_throttle_props(engine, first)  # type: ignore[arg-type]
    # "c" keeps its place, as it would in a throttle; "a" and "d" came after it.
    assert list(after.buckets.items()) == [
        ("c", BucketProps(6)),
        ("a", BucketProps()),
        ("d", BucketProps()),
    ]
