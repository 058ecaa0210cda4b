"""Framing and error model: round trips, malformed, truncated and oversized input."""

from __future__ import annotations

from typing import Any
from unittest import mock

import msgpack
import pytest
from hypothesis import given, settings
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


# Six requests put chunk boundaries at every place of several frames (chunks of 1
# to 50 bytes); twenty only made the nested params cost 4x the drawing time.
@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.text(min_size=1, max_size=30), params_st),
        max_size=6,
    ),
    st.integers(1, 50),
)
def test_requests_round_trip_in_any_chunking(reqs: list[Any], chunk: int) -> None:
    wire = b"".join(protocol.encode_request(m, meth, p) for m, meth, p in reqs)
    assert decode_in_chunks(protocol.RequestDecoder(), wire, chunk) == [tuple(r) for r in reqs]


def decode_in_chunks(dec: protocol.RequestDecoder, wire: bytes, chunk: int) -> list[Any]:
    """Feed ``wire`` ``chunk`` bytes at a time; every request decoded."""
    got: list[Any] = []
    for i in range(0, len(wire), chunk):
        dec.feed(wire[i : i + chunk])
        got.extend(dec)
    return got


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
    assert [method for _, method, _ in dec] == ["get"]


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
    # A bin header declaring 1 MiB is refused from the header, before its body.
    dec.feed(msgpack.packb([0, 1, "set", {}])[:-1] + b"\x81\xa5value\xc6\x00\x10\x00\x00")
    with pytest.raises(errors.FrameTooLarge, match="declares 1048576 bytes"):
        list(dec)
    # A frame that grows past the bound without declaring it (many small values).
    dec2 = protocol.RequestDecoder(max_frame_bytes=1024)
    dec2.feed(b"\x94\x00\x01\xa3set\xde\x03\xe8")  # params: a map of 1000 pairs
    assert list(dec2) == []
    with pytest.raises(errors.FrameTooLarge):
        for _ in range(10):
            dec2.feed(b"\xa0\x00" * 256)
            list(dec2)


def test_a_4gib_bin32_header_is_refused_at_once() -> None:
    dec = protocol.RequestDecoder()
    dec.feed(b"\x94\x00\x01\xa3set\x81\xa5value\xc6\xff\xff\xff\xff" + b"x" * 100)
    with pytest.raises(errors.FrameTooLarge):
        list(dec)


def test_a_frame_that_is_not_a_request_is_refused_from_its_first_byte() -> None:
    dec = protocol.RequestDecoder()
    dec.feed(b"\xdd\x00\x01\x86\xa0")  # array32 of 100,000: a frame of nested arrays
    with pytest.raises(errors.ProtocolError, match="array"):
        list(dec)


def test_hello_frame_limit_applies_before_hello() -> None:
    dec = protocol.RequestDecoder()
    dec.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
    dec.feed(protocol.encode_request(1, "hello", {"user": "u", "password": "x" * 8000})[:6000])
    with pytest.raises(errors.FrameTooLarge):
        list(dec)


@pytest.mark.parametrize("inner", [b"\x90", b"\x80", b"\x91\x90"])
def test_decoding_work_is_bounded_whatever_the_shape(inner: bytes) -> None:
    """A frame of many tiny containers (64 bytes of Python objects per wire byte
    if decoded in full) is refused after MAX_FRAME_CONTAINERS of them."""
    assert 100 < protocol.MAX_FRAME_CONTAINERS < 1000
    n = 50_000
    frame = b"\x94\x00\x01\xa3get" + b"\xdd" + n.to_bytes(4, "big") + inner * n
    dec = protocol.RequestDecoder()
    dec.feed(frame)
    with pytest.raises(errors.ProtocolError, match="decodes to too much"):
        list(dec)


U = protocol.UNCOUNTED_FRAME_BYTES
_SET_OVERHEAD = len(protocol.encode_request(1, "set", {"key": b"k", "value": b"v" * 300})) - 300


def _set_frame(msgid: int, frame_bytes: int) -> tuple[int, str, dict[str, Any]]:
    """A set request whose frame is ``frame_bytes`` long (value over 255 bytes)."""
    return (msgid, "set", {"key": b"k", "value": b"v" * (frame_bytes - _SET_OVERHEAD)})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([300, 4096, U - 1, U, U + 1, 3 * U]), max_size=6),
    st.integers(64, 3 * U),
)
def test_frames_either_side_of_the_uncounted_bound_round_trip(sizes: list[int], chunk: int) -> None:
    """Frames up to the bound are decoded uncounted, larger ones move to the
    counting unpacker mid-frame; any chunking gives the same requests, and a
    drained decoder is back on the fast unpacker."""
    reqs = [_set_frame(i, n) for i, n in enumerate(sizes)]
    wire = b"".join(protocol.encode_request(*r) for r in reqs)
    assert [len(protocol.encode_request(*r)) for r in reqs] == sizes
    dec = protocol.RequestDecoder()
    assert decode_in_chunks(dec, wire, chunk) == reqs
    assert dec.buffered == 0 and not dec._counted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([300, 4096, U - 1, U, U + 1, 3 * U]), max_size=6),
    st.integers(64, 3 * U),
)
def test_a_renewed_counting_unpacker_decodes_the_same(sizes: list[int], chunk: int) -> None:
    """The counting unpacker is replaced whenever it stops inside a frame once it
    has decoded COUNTING_RENEW_BYTES (here: at once), its partial frame moving to
    the new one: any chunking still gives the same requests."""
    reqs = [_set_frame(i, n) for i, n in enumerate(sizes)]
    wire = b"".join(protocol.encode_request(*r) for r in reqs)
    dec = protocol.RequestDecoder()
    with mock.patch.object(protocol, "COUNTING_RENEW_BYTES", 1):
        assert decode_in_chunks(dec, wire, chunk) == reqs
    assert dec.buffered == 0


def test_pipelined_large_frames_do_not_keep_the_largest_buffer() -> None:
    """After a large frame, a connection whose next frame has only begun holds that
    much in a fresh unpacker, not the buffer the large frame grew (msgpack's never
    shrinks): 20 MiB per connection pipelining large writes, uncounted."""
    big = protocol.COUNTING_RENEW_BYTES + 100_000
    frames = [protocol.encode_request(*_set_frame(i, big)) for i in range(3)]
    wire = b"".join(frames)
    dec = protocol.RequestDecoder()
    got, seen = [], set()
    for i in range(0, len(wire), 256 * 1024):
        dec.feed(wire[i : i + 256 * 1024])
        got += list(dec)
        if dec._counting is not None:
            seen.add(id(dec._counting))
            assert dec._counting.tell() < protocol.COUNTING_RENEW_BYTES + 256 * 1024
    assert [msgid for msgid, _, _ in got] == [0, 1, 2] and len(seen) >= 2


def test_a_small_frame_is_not_counted_and_a_large_one_is() -> None:
    """1,000 empty maps fit a small frame (they cannot build more than ~64 KiB);
    the same past UNCOUNTED_FRAME_BYTES are counted and refused."""
    junk = [{}] * 1000
    dec = protocol.RequestDecoder()
    dec.feed(protocol.encode_request(1, "get", {"key": junk}))
    assert [p["key"] for _, _, p in dec] == [junk]
    dec.feed(protocol.encode_request(2, "get", {"key": junk, "pad": "x" * U}))
    with pytest.raises(errors.ProtocolError, match="decodes to too much"):
        list(dec)


def test_before_hello_every_frame_is_counted() -> None:
    """An anonymous client gets no uncounted decoding: a 4 KiB hello cannot hold
    ~1,000 empty maps (~290 KiB) through authentication."""
    hello = protocol.encode_request(1, "hello", {"user": "u", "client": [{}] * 1000})
    assert len(hello) <= protocol.MAX_HELLO_FRAME_BYTES
    dec = protocol.RequestDecoder()
    dec.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
    dec.feed(hello)
    with pytest.raises(errors.ProtocolError, match="decodes to too much"):
        list(dec)
    # Once authenticated (the bound raised), the same frame is decoded uncounted.
    dec = protocol.RequestDecoder()
    dec.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
    ok = protocol.encode_request(1, "hello", {"user": "u"})
    dec.feed(ok)
    assert [m for _, m, _ in dec] == ["hello"]
    dec.frame_limit = dec.max_frame_bytes
    dec.feed(hello)
    assert [len(p["client"]) for _, _, p in dec] == [1000]


def test_before_hello_a_frame_may_be_exactly_the_hello_bound() -> None:
    for size, ok in (
        (protocol.MAX_HELLO_FRAME_BYTES, True),
        (protocol.MAX_HELLO_FRAME_BYTES + 1, False),
    ):
        dec = protocol.RequestDecoder()
        dec.frame_limit = protocol.MAX_HELLO_FRAME_BYTES
        dec.feed(protocol.encode_request(*_set_frame(1, size)))
        if ok:
            assert [m for _, m, _ in dec] == ["set"]
        else:
            with pytest.raises(errors.FrameTooLarge):
                list(dec)


def test_many_scalars_count_against_the_element_bound() -> None:
    arr = b"\xdc\xff\xff" + b"\xcd\x01\x00" * 0xFFFF  # 65,535 uint16 per array
    frame = b"\x94\x00\x01\xa3get\x94" + arr * 4
    dec = protocol.RequestDecoder()
    dec.feed(frame)
    with pytest.raises(errors.ProtocolError, match="decodes to too much"):
        list(dec)


def test_a_maximal_mget_fits_the_decode_budget() -> None:
    keys = [b"k%d" % i for i in range(protocol.MAX_CONTAINER_LEN)]
    dec = protocol.RequestDecoder()
    dec.feed(protocol.encode_request(1, "mget", {"keys": keys}))
    (req,) = list(dec)
    assert len(req[2]["keys"]) == protocol.MAX_CONTAINER_LEN


def test_an_idle_decoder_holds_no_buffer() -> None:
    wire = protocol.encode_request(1, "get", {"key": b"k"})
    dec = protocol.RequestDecoder()
    dec.feed(wire + wire[:3])
    assert [method for _, method, _ in dec] == ["get"]
    assert dec.buffered == 3 and dec.in_frame
    dec.release_if_idle()  # a partial frame: the unpacker stays
    assert dec.unpackers
    dec.feed(wire[3:])
    assert [method for _, method, _ in dec] == ["get"]
    assert dec.buffered == 0 and not dec.in_frame
    assert (dec._rest, dec._carry, dec._piece, dec._last) == (b"", b"", b"", b"")
    # Kept from request to request, dropped by the sweep once idle.
    assert dec.unpackers
    dec.release_if_idle()
    assert not dec.unpackers
    dec.feed(wire)
    assert [method for _, method, _ in dec] == ["get"] and dec.frames == 3


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


@pytest.mark.parametrize("msgid", [None, 0, 1, 127, 128, 65535, 2**32 - 1])
def test_error_responses_from_the_template_are_what_packing_gives(msgid: int | None) -> None:
    """encode_error answers a repeated rejection from a cached error map: the bytes
    must be exactly those of packing the response whole."""
    for exc in (
        errors.Throttled("bucket 'b' is over its unit allowance", retry_after_ms=40),
        errors.Throttled("bucket 'b' is over its unit allowance", retry_after_ms=41),
        errors.BadValue("no"),
    ):
        for _ in range(2):  # the second answer comes from the template
            wire = protocol.encode_error(msgid, exc)
            assert wire == msgpack.packb([1, msgid, exc.to_wire(), None], use_bin_type=True)


def test_the_error_template_cache_is_bounded() -> None:
    for n in range(protocol._ERROR_MAPS_MAX + 10):
        protocol.encode_error(1, errors.Throttled("x", retry_after_ms=n))
    assert len(protocol._ERROR_MAPS) <= protocol._ERROR_MAPS_MAX


def test_a_dropped_decoder_is_freed_without_the_garbage_collector() -> None:
    """Decoder and unpacker are no reference cycle: a closed connection's 41 KiB
    unpacker goes when its decoder does, not at some later collection."""
    import gc
    import weakref

    gc.disable()
    try:
        dec = protocol.RequestDecoder()
        dec.feed(protocol.encode_request(1, "get", {"key": b"k"}))
        assert [method for _, method, _ in dec] == ["get"]
        assert dec.unpackers
        ref = weakref.ref(dec)
        del dec
        assert ref() is None
    finally:
        gc.enable()
