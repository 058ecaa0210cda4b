"""The RESP codec without sockets: commands in any chunking, inline commands,
every bound refused before buffering, and replies in RESP2 and RESP3."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenantkv import errors
from tenantkv.server.doors import resp
from tenantkv.server.redis_commands import Encoder

MAX = 1024 * 1024


def encode(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


def decoder(frame: int = 2 * MAX) -> resp.RequestDecoder:
    return resp.RequestDecoder(MAX, frame)


@given(
    st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=6), max_size=10),
    st.integers(1, 30),
)
def test_commands_round_trip_in_any_chunking(cmds: list[list[bytes]], chunk: int) -> None:
    wire = b"".join(encode(*c) for c in cmds)
    dec = decoder()
    got: list[list[bytes]] = []
    for i in range(0, len(wire), chunk):
        dec.feed(wire[i : i + chunk])
        got.extend(dec)
    assert got == cmds
    assert dec.buffered == 0 and not dec.in_frame


def _runs(dec: resp.RequestDecoder) -> list[list[bytes]]:
    got: list[list[bytes]] = []
    while commands := dec.next_commands():
        got.extend(list(c) for c in commands)
    return got


@given(
    st.lists(
        st.sampled_from(
            [
                [b"GET", b"k1"],
                [b"GET", b"k2"],
                [b"SET", b"k1", b"v\r\n"],
                [b"SET", b"k2", b"\r\n\r"],
                [b"DEL", b"k3"],
                [b"MGET", b"k1", b"k2"],
                [b"PING"],
            ]
        ),
        max_size=60,
    ),
    st.integers(1, 200),
)
def test_runs_of_like_commands_decode_as_one_at_a_time(cmds: list[list[bytes]], chunk: int) -> None:
    """A run of commands of one shape decoded at once (next_commands: one
    findall) gives the commands decoded one at a time, in any chunking, with
    commands of other shapes and CRLF inside values among them."""
    wire = b"".join(encode(*c) for c in cmds)
    dec = decoder()
    got: list[list[bytes]] = []
    for i in range(0, len(wire), chunk):
        dec.feed(wire[i : i + chunk])
        got.extend(_runs(dec))
    assert got == cmds
    assert dec.buffered == 0 and dec.frames == len(cmds)


def test_a_run_is_decoded_at_once_and_a_broken_one_a_command_at_a_time() -> None:
    """Like commands in a row come as one run; a command of another shape among
    them ends the run, and the rest is decoded as before (each run found once)."""
    dec = decoder()
    dec.feed(encode(b"GET", b"a") + encode(b"GET", b"b") * 9)
    assert dec.next_commands() == ([b"GET", b"a"],)  # (its shape is learned here)
    assert dec.next_commands() == [(b"GET", b"b")] * 9
    dec.feed(encode(b"GET", b"c") * 5 + encode(b"GET", b"cd") + encode(b"GET", b"e") * 5)
    assert _runs(dec) == [[b"GET", b"c"]] * 5 + [[b"GET", b"cd"]] + [[b"GET", b"e"]] * 5
    dec.feed(encode(b"SET", b"k", b"v") * 4 + b"*3\r\n$3\r\nSET\r\n$1")
    assert _runs(dec) == [[b"SET", b"k", b"v"]] * 4 and dec.in_frame
    dec.feed(b"\r\nk\r\n$1\r\nv\r\n")
    assert _runs(dec) == [[b"SET", b"k", b"v"]] and not dec.in_frame


def test_inline_commands_split_like_redis_cli() -> None:
    dec = decoder()
    dec.feed(b"SET k \"a b\\n\\x41\" 'it\\'s'\r\nPING\n\r\n  get   k  \r\n")
    assert list(dec) == [[b"SET", b"k", b"a b\nA", b"it's"], [b"PING"], [b"get", b"k"]]


@pytest.mark.parametrize("line", [b'SET k "abc\r\n', b"SET k 'x\r\n", b'GET "k"x\r\n'])
def test_unbalanced_quotes_are_a_protocol_error(line: bytes) -> None:
    dec = decoder()
    dec.feed(line)
    with pytest.raises(errors.ProtocolError, match="unbalanced quotes"):
        list(dec)


@pytest.mark.parametrize(
    "wire, message",
    [
        (b"*1\r\n$" + str(resp.MAX_DISCARD_BYTES + 1).encode() + b"\r\n", "invalid bulk length"),
        (b"*1\r\n$-5\r\n", "invalid bulk length"),
        (b"*1\r\n$abc\r\n", "invalid bulk length"),
        (b"*200001\r\n", "invalid multibulk length"),
        (b"*x\r\n", "invalid multibulk length"),
        (b"*2\r\n*1\r\n$1\r\na\r\n", "expected '\\$'"),  # nested arrays are not commands
        (b"*1\r\n$1\r\nab\r\n", "CRLF"),
        (b"*1\r\n$" + b"9" * 40, "invalid bulk length"),  # a header that never ends
    ],
)
def test_bounds_are_checked_from_the_headers(wire: bytes, message: str) -> None:
    dec = decoder()
    dec.feed(wire)
    with pytest.raises(errors.ProtocolError, match=message):
        list(dec)


def test_a_huge_declared_bulk_is_refused_before_its_body() -> None:
    dec = decoder()
    dec.feed(b"*2\r\n$3\r\nSET\r\n$4294967295\r\n")
    with pytest.raises(errors.ProtocolError, match="invalid bulk length"):
        list(dec)


@pytest.mark.parametrize(
    "head, message",
    [
        (b"*3\r\n$6\r\nclient\r\n$7\r\nSETNAME\r\n", "CLIENT takes at most 4096 bytes"),
        (b"*2\r\n$4\r\nAUTH\r\n", "AUTH takes at most 4096 bytes"),
        (b"*1\r\n", "a command name longer"),
    ],
)
def test_a_command_that_stores_nothing_is_bounded_on_the_header_that_crosses_it(
    head: bytes, message: str
) -> None:
    """Only the ``$N`` header has arrived: the 20 MiB body is never buffered."""
    dec = decoder()
    dec.feed(head + b"$%d\r\n" % resp.MAX_CONTROL_BYTES)
    with pytest.raises(errors.ProtocolError, match=message):
        list(dec)


def test_values_and_short_control_arguments_pass() -> None:
    dec = decoder()
    name = b"n" * (resp.MAX_CONTROL_BYTES - 3 * resp.ARG_OVERHEAD - len(b"CLIENTSETNAME"))
    big = b"v" * resp.MAX_CONTROL_BYTES
    dec.feed(encode(b"CLIENT", b"SETNAME", name))
    dec.feed(encode(b"SET", b"k", big))
    assert list(dec) == [[b"CLIENT", b"SETNAME", name], [b"SET", b"k", big]]


def test_inline_line_is_bounded() -> None:
    dec = decoder()
    dec.feed(b"A" * (resp.MAX_INLINE_BYTES + 10))
    with pytest.raises(errors.ProtocolError, match="too big inline"):
        list(dec)


def test_frame_limit_counts_each_argument() -> None:
    dec = decoder(frame=4096)
    dec.feed(b"*1000\r\n" + b"$0\r\n\r\n" * 1000)  # 6 KiB of empty arguments
    got = dec.next_command()
    assert got is not None and len(got) < 1000
    assert dec.refused is not None and "command of more than 4096 bytes" in dec.refused[0].errmsg
    dec.refused = None
    dec.feed(encode(b"GET", b"k"))
    assert list(dec) == [[b"GET", b"k"]]  # the rest was dropped


def test_an_oversized_value_is_refused_in_band_and_dropped_as_it_arrives() -> None:
    """Authenticated: ``SET k <MAX + 1 bytes> EX 10`` is returned as far as it was
    decoded with ``refused`` set, the moment its header arrives; its body and
    the arguments after it are dropped as they come (never buffered), and the
    next command decodes."""
    dec = decoder()
    head = b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (MAX + 1)
    dec.feed(head)
    assert dec.next_command() == [b"SET", b"k"]
    assert dec.refused is not None
    exc, declared = dec.refused
    assert isinstance(exc, errors.ValueTooLarge) and f"max_value_bytes={MAX}" in exc.errmsg
    assert declared >= MAX + 1
    dec.refused = None
    body = b"v" * (MAX + 1) + b"\r\n$2\r\nEX\r\n$2\r\n10\r\n"
    for i in range(0, len(body), 7000):
        dec.feed(body[i : i + 7000])
        assert dec.next_command() is None and dec.buffered < 7000  # held: at most a chunk
    dec.feed(encode(b"GET", b"k"))
    assert list(dec) == [[b"GET", b"k"]] and dec.refused is None
    assert dec.dropped == len(body)


def test_before_authentication_an_oversized_value_closes() -> None:
    dec = decoder()
    dec.frame_limit = 4096  # (as before AUTH)
    dec.feed(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % (MAX + 1))
    with pytest.raises(errors.ProtocolError, match="invalid bulk length"):
        list(dec)


def test_a_big_command_in_many_chunks_is_parsed_once() -> None:
    """The decoder resumes a partial command where it stopped (no quadratic re-parse)."""
    args = [b"MSET"] + [b"k%d" % i for i in range(resp.MAX_ARGS - 1)]
    wire = encode(*args)
    dec = decoder()
    for i in range(0, len(wire), 1000):
        dec.feed(wire[i : i + 1000])
        got = list(dec)
    assert got == [args]
    assert dec._buf == bytearray()


def test_encoder_resp2_and_resp3() -> None:
    r2, r3 = Encoder(2), Encoder(3)
    assert r2.value(None) == b"$-1\r\n" and r3.value(None) == b"_\r\n"
    assert r2.value(True) == b":1\r\n" and r3.value(True) == b"#t\r\n"
    assert r2.map({"a": 1}) == b"*2\r\n$1\r\na\r\n:1\r\n"
    assert r3.map({"a": 1}) == b"%1\r\n$1\r\na\r\n:1\r\n"
    assert r3.double(1.5) == b",1.5\r\n" and r2.double(1.5) == b"$3\r\n1.5\r\n"
    assert r2.array([b"x", None, 3]) == b"*3\r\n$1\r\nx\r\n$-1\r\n:3\r\n"
    assert r2.error("ERR bad\r\nthing") == b"-ERR bad  thing\r\n"
    assert r3.verbatim("hi") == b"=6\r\ntxt:hi\r\n" and r2.verbatim("hi") == b"$2\r\nhi\r\n"
    assert r2.null_array() == b"*-1\r\n"


def test_commands_of_one_shape_decode_as_argument_by_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command shaped as the one before it (argument count and lengths) is
    decoded by one match of that shape: the same commands as decoded argument
    by argument, fed whole or a byte at a time, CRLF inside values and
    commands of other shapes among them; one larger than the frame bound is
    still refused."""

    def cmd(*argv: bytes) -> bytes:
        return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)

    commands = [
        [b"SET", b"k1", b"v\r\n"],
        [b"SET", b"k2", b"abc"],
        [b"SET", b"k3", b"\r\n\r"],
        [b"GET", b"k1"],
        [b"GET", b"k2"],
        [b"MGET", b"k1", b"k2"],
        [b"GET", b"k3"],
    ] * 3
    stream = b"".join(cmd(*c) for c in commands)

    def decoded(step: int) -> list[list[bytes]]:
        d = resp.RequestDecoder(1 << 20, 1 << 21)
        out: list[list[bytes]] = []
        for i in range(0, len(stream), step):
            d.feed(stream[i : i + step])
            out.extend(d)
        return out

    assert decoded(len(stream)) == decoded(1) == commands
    monkeypatch.setattr(resp, "SHAPE_ARGS", 0)  # (argument by argument only)
    assert decoded(len(stream)) == commands
    monkeypatch.undo()
    d = resp.RequestDecoder(1 << 20, 200)
    d.feed(cmd(b"SET", b"k", b"v") * 2 + cmd(b"SET", b"k", b"v" * 300) + cmd(b"GET", b"k"))
    got = list(d)  # (the third refused: too big for the frame, dropped)
    assert got == [[b"SET", b"k", b"v"]] * 2 + [[b"SET", b"k"], [b"GET", b"k"]]
    assert d.refused is not None


def test_requests_of_a_run_name_each_command() -> None:
    """Commands of one shape but other names (GET, TTL, DEL, lower case) in one
    run are each the request of its own command, numbered in order."""
    door = resp.RespDoor()
    dec = decoder()
    names = [b"GET", b"TTL", b"TTL", b"get", b"DEL", b"GET", b"XYZ", b"GET"]
    dec.feed(b"".join(encode(n, b"k%d" % i) for i, n in enumerate(names)))
    got = list(door.requests(dec))
    assert [r[0] for r in got] == list(range(1, len(names) + 1))
    assert [r[1] for r in got][:6] == ["get", "ttl", "ttl", "get", "del", "get"]
    assert got[6][1] == resp.REFUSED_REQUEST and got[7][1] == "get"
    assert [r[2] for r in got][:6] == [{"key": b"k%d" % i} for i in range(4)] + [
        {"keys": [b"k4"]},
        {"key": b"k5"},
    ]
