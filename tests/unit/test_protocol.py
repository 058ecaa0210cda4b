"""Framing and error model: round trips, malformed, truncated and oversized input."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenantkv import errors, protocol

params_st = st.dictionaries(
    st.text(max_size=20),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.binary(max_size=64)
        | st.text(max_size=64),
        lambda inner: (
            st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
        ),
        max_leaves=20,
    ),
    max_size=6,
)


@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.text(min_size=1, max_size=30), params_st),
        max_size=20,
    ),
    st.integers(1, 50),
)
def test_requests_round_trip_in_any_chunking(reqs: list[Any], chunk: int) -> None:
    wire = b"".join(protocol.encode_request(m, meth, p) for m, meth, p in reqs)
    dec = protocol.RequestDecoder()
    got = []
    for i in range(0, len(wire), chunk):
        dec.feed(wire[i : i + chunk])
        got.extend(dec)
    assert [(r.msgid, r.method, r.params) for r in got] == reqs


@given(st.integers(0, 2**32 - 1), params_st | st.none())
def test_responses_round_trip(msgid: int, result: Any) -> None:
    dec = protocol.ResponseDecoder()
    dec.feed(protocol.encode_result(msgid, result))
    (resp,) = list(dec)
    assert (resp.msgid, resp.error, resp.result) == (msgid, None, result)


def test_error_round_trip_keeps_code_labels_and_hint() -> None:
    exc = errors.Throttled("slow down", retry_after_ms=120)
    dec = protocol.ResponseDecoder()
    dec.feed(protocol.encode_error(7, exc))
    (resp,) = list(dec)
    assert resp.error == {
        "code": 25,
        "codeName": "Throttled",
        "errmsg": "slow down",
        "errorLabels": ["SystemOverloadedError", "RetryableError"],
        "retryAfterMs": 120,
    }
    back = errors.from_wire(resp.error, command="get")
    assert isinstance(back, errors.Throttled)
    assert back.labels == errors.OVERLOAD_LABELS and back.retry_after_ms == 120
    assert back.command == "get"


def test_unknown_error_code_from_a_newer_server_is_kept() -> None:
    back = errors.from_wire({"code": 9999, "codeName": "Future", "errmsg": "x"})
    assert type(back) is errors.ServerError
    assert (back.code, back.code_name) == (9999, "Future")


def test_truncated_frame_waits_for_the_rest() -> None:
    wire = protocol.encode_request(1, "get", {"key": b"k"})
    dec = protocol.RequestDecoder()
    dec.feed(wire[:-1])
    assert list(dec) == []
    dec.feed(wire[-1:])
    assert [r.method for r in dec] == ["get"]


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"a": 1}, "array"),
        ([0, 1, "get"], "array"),
        ([1, 1, "get", {}], "type 0"),
        ([0, -1, "get", {}], "msgid"),
        ([0, "x", "get", {}], "msgid"),
        ([0, 1, 5, {}], "method"),
        ([0, 1, "get", [1]], "params"),
    ],
)
def test_wrong_shapes_are_protocol_errors(obj: Any, message: str) -> None:
    dec = protocol.RequestDecoder()
    dec.feed(msgpack.packb(obj))
    with pytest.raises(errors.ProtocolError, match=message):
        list(dec)


def test_garbage_bytes_are_a_protocol_error() -> None:
    dec = protocol.RequestDecoder()
    dec.feed(b"\xc1" * 10)  # 0xc1 is never valid MessagePack
    with pytest.raises(errors.ProtocolError):
        list(dec)


def test_oversized_frame_is_rejected_without_buffering_it() -> None:
    dec = protocol.RequestDecoder(max_frame_bytes=1024)
    # A bin header declaring 1 MiB: the decoder waits for the body but never
    # buffers more than its bound.
    dec.feed(msgpack.packb([0, 1, "set", {}])[:-1] + b"\x81\xa5value\xc6\x00\x10\x00\x00")
    assert list(dec) == []
    with pytest.raises(errors.FrameTooLarge):
        for _ in range(10):
            dec.feed(b"\x00" * 512)
            list(dec)
    dec2 = protocol.RequestDecoder(max_frame_bytes=1024)
    with pytest.raises(errors.FrameTooLarge):
        dec2.feed(b"\x00" * 2048)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    dec = protocol.RequestDecoder()
    dec.feed(b"\x91" * 100_000)
    with pytest.raises(errors.ProtocolError):
        list(dec)


def test_every_error_code_is_unique_and_documented() -> None:
    from pathlib import Path

    table = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    for code, cls in errors.error_classes().items():
        assert f"| {code} | `{cls.code_name}` |" in table, cls.code_name
