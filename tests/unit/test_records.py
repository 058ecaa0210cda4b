"""Statistics records as status dicts: fields by name, in declaration order."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tenantkv.admission.write_permits import BucketPermitStatistics
from tenantkv.records import fields_dict, histogram_to_wire


@dataclass(frozen=True)
class _Record:
    name: str
    kind: str
    count: int
    ratio: float


def test_fields_in_order_renamed_and_left_out() -> None:
    r = _Record("b", "get", 3, 0.123456)
    assert list(fields_dict(r).items()) == [
        ("name", "b"),
        ("kind", "get"),
        ("count", 3),
        ("ratio", 0.123456),
    ]
    d = fields_dict(r, renamed={"kind": "event"}, left_out=("name",))
    assert list(d) == ["event", "count", "ratio"]
    # A value given a new form by key keeps its place.
    reformed = {**d, "event": "GET"}
    assert list(reformed.items()) == [("event", "GET"), ("count", 3), ("ratio", 0.123456)]


def test_histogram_bins_end_with_plus_inf() -> None:
    assert histogram_to_wire(((10.0, 1), (250.5, 2), (math.inf, 3))) == [
        [10, 1],
        [250, 2],
        ["+Inf", 3],
    ]


def test_a_permit_record_as_the_status_shows_it() -> None:
    s = BucketPermitStatistics("b", 8, 2, 1, 40, 5, 900, 1, ((100.0, 4), (math.inf, 1)))
    assert s.as_dict() == {
        "capacity": 8,
        "in_use": 2,
        "waiting": 1,
        "granted": 40,
        "waited": 5,
        "wait_micros_total": 900,
        "interrupted": 1,
        "wait_histogram_us": [[100, 4], ["+Inf", 1]],
    }
