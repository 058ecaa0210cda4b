"""Protocol fuzzing against the live daemon (hypothesis, bounded for CI).

Random bytes, random MessagePack, truncated and corrupted frames, huge declared
lengths, deep nesting, wrong envelope shapes, and wrong parameters for every
command in ``COMMANDS`` — before and after ``hello``. Throughout:

- the process stays alive, and every answer is a well-formed response whose
  error is a known code and never ``InternalError``;
- a healthy session on its own connection keeps working;
- the server's resident memory stays bounded (``/proc/PID/status`` VmRSS).

The examples are derandomized so CI runs the same cases every time; set
``FUZZ_RANDOM=1`` for fresh ones and ``FUZZ_EXAMPLES=N`` for more (long
campaigns on the decoder alone: ``fuzz/decoder_fuzz.py``).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenantkv import config as config_mod
from tenantkv import errors, protocol
from tenantkv.server.commands import COMMANDS
from tests.conftest import ADMIN_PASSWORD, Daemon

TIMEOUT = 10
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
BUCKET, USER, PASSWORD = "fz", "fuzzer", "fuzz-pw"
USER_HELLO = {"user": USER, "password": PASSWORD, "bucket": BUCKET}
ADMIN_HELLO = {"user": "admin", "password": ADMIN_PASSWORD}
#: frame bound of the fuzz daemon: max_value_bytes (64 KiB) + 64 KiB
FRAME_BOUND = 128 * 1024
KNOWN_CODES = set(errors.error_classes())
#: Generous: the daemon idles at ~60 MB; each connection may buffer up to one frame.
RSS_GROWTH_LIMIT_KB = 150 * 1024

fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not os.environ.get("FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)
#: top-level parameter values that are never strings: admin commands then fail on
#: their checks instead of creating buckets, users or files with fuzzed names
not_str = values.filter(lambda v: not isinstance(v, str))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def fz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("fuzz")
    cfg = base / "tenantkv.toml"
    # No login limiting here: the fuzzer fails hello on purpose, from one address.
    cfg.write_text(
        "[server]\nmax_value_bytes = 65536\nlogin_failure_limit = 0\nhello_timeout_secs = 5.0\n"
    )
    d = Daemon(base / "data", extra_args=["--config", str(cfg)]).start()
    with d.client() as c:
        c.create_bucket(BUCKET)
        c.create_user(USER, PASSWORD, roles={BUCKET: "readwrite"})
    yield d
    d.kill()


@pytest.fixture(scope="module")
def baseline(fz: Daemon) -> dict[str, int]:
    assert fz.proc is not None
    return {"rss_kb": rss_kb(fz.proc.pid)}


@pytest.fixture(scope="module")
def healthy(fz: Daemon, baseline: dict[str, int]) -> Iterator[Any]:
    with fz.client(user=USER, password=PASSWORD, bucket=BUCKET, timeout=TIMEOUT) as c:
        c.set("canary", b"alive")
        yield c


def still_fine(d: Daemon, healthy: Any) -> None:
    assert d.proc is not None and d.proc.poll() is None, d.log()[-3000:]
    assert healthy.get("canary") == b"alive"


def exchange(d: Daemon, payload: bytes, hello: dict[str, Any] | None = None) -> list[Any]:
    """Send ``payload`` (after a hello, if given), half-close, and return every
    response the server sends before it closes."""
    with socket.create_connection((d.host, d.port), timeout=TIMEOUT) as s:
        try:
            if hello is not None:
                s.sendall(msgpack.packb([0, 0, "hello", hello]))
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError as exc:
            # The server already closed (a fatal error before we were done): EPIPE,
            # ECONNRESET, or ENOTCONN from shutdown() once the peer reset. What
            # matters is what it answered before closing, read below.
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        u = msgpack.Unpacker(raw=False, strict_map_key=False)
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            u.feed(data)
        return list(u)


def check(responses: list[Any], *, hello: bool = False) -> list[Any]:
    """Every response is well formed, with a known error code and no InternalError.
    Returns the responses after the hello's."""
    for r in responses:
        assert isinstance(r, list) and len(r) == 4 and r[0] == 1, r
        assert r[1] is None or isinstance(r[1], int)
        err = r[2]
        if err is not None:
            assert err["code"] in KNOWN_CODES, err
            assert err["codeName"] != "InternalError", err
    if hello:
        assert responses and responses[0][1] == 0 and responses[0][2] is None, responses[:1]
        return responses[1:]
    return responses


# -- bytes and frames ----------------------------------------------------------------


@fuzz_settings
@given(payload=st.binary(max_size=3000), after_hello=st.booleans())
def test_random_bytes(fz: Daemon, healthy: Any, payload: bytes, after_hello: bool) -> None:
    check(exchange(fz, payload, USER_HELLO if after_hello else None), hello=after_hello)
    still_fine(fz, healthy)


@fuzz_settings
@given(objs=st.lists(values, min_size=1, max_size=4), after_hello=st.booleans())
def test_random_msgpack(fz: Daemon, healthy: Any, objs: list[Any], after_hello: bool) -> None:
    payload = b"".join(msgpack.packb(o) for o in objs)
    check(exchange(fz, payload, USER_HELLO if after_hello else None), hello=after_hello)
    still_fine(fz, healthy)


@fuzz_settings
@given(envelope=st.lists(values, max_size=6))
def test_wrong_envelopes(fz: Daemon, healthy: Any, envelope: list[Any]) -> None:
    """Arrays of every arity and element type where ``[0, msgid, method, params]`` goes."""
    responses = check(exchange(fz, msgpack.packb(envelope), USER_HELLO), hello=True)
    valid = (
        len(envelope) == 4
        and envelope[0] == 0
        and type(envelope[0]) is int
        and type(envelope[1]) is int
        and 0 <= envelope[1] < 2**32
        and isinstance(envelope[2], str)
        and (envelope[3] is None or isinstance(envelope[3], dict))
    )
    if not valid:
        assert [r[2]["codeName"] for r in responses] == ["ProtocolError"], responses
    still_fine(fz, healthy)


request_strategy = st.builds(
    lambda msgid, method, params: msgpack.packb([0, msgid, method, params]),
    st.integers(0, 2**32 - 1),
    st.sampled_from(sorted(COMMANDS)),
    st.dictionaries(st.sampled_from(["key", "value", "keys", "ttl"]), values, max_size=3),
)


@fuzz_settings
@given(
    frames=st.lists(request_strategy, min_size=1, max_size=5),
    cut=st.integers(0, 10_000),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_truncated_and_corrupted_frames(
    fz: Daemon, healthy: Any, frames: list[bytes], cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(b"".join(frames))
    for pos, byte in flips:
        if data:
            data[pos % len(data)] = byte
    del data[cut % (len(data) + 1) :]
    check(exchange(fz, bytes(data), USER_HELLO), hello=True)
    still_fine(fz, healthy)


def _huge_headers() -> list[bytes]:
    big32, big16 = struct.pack(">I", 0xFFFFFFFF), struct.pack(">H", 0xFFFF)
    mid32 = struct.pack(">I", FRAME_BOUND + 1)
    return [
        b"\xc4\xff",  # bin8, 255 bytes promised
        b"\xc5" + big16,
        b"\xc6" + big32,
        b"\xc6" + mid32,
        b"\xd9\xff",
        b"\xda" + big16,
        b"\xdb" + big32,
        b"\xdc" + big16,  # array16
        b"\xdd" + big32,  # array32: 4 billion elements
        b"\xde" + big16,
        b"\xdf" + big32,  # map32
        b"\xc7\xff\x01",  # ext8
        b"\xc8" + big16 + b"\x01",
        b"\xc9" + big32 + b"\x01",
        b"\xd4\x01\x00",  # fixext1
        b"\xd8\x01" + b"\x00" * 16,  # fixext16
    ]


@pytest.mark.parametrize("header", _huge_headers(), ids=lambda h: h[:1].hex())
@pytest.mark.parametrize("where", ["whole", "in-params", "before-hello"])
def test_huge_declared_lengths(fz: Daemon, healthy: Any, header: bytes, where: str) -> None:
    tail = b"\x00" * 4096
    if where == "whole":
        payload, hello = header + tail, USER_HELLO
    elif where == "in-params":  # [0, 1, "set", {"key": <header...>}]
        payload, hello = b"\x94\x00\x01\xa3set\x81\xa3key" + header + tail, USER_HELLO
    else:
        payload, hello = header + tail, None
    responses = check(exchange(fz, payload, hello), hello=hello is not None)
    assert all(r[2] is not None for r in responses), responses
    still_fine(fz, healthy)


@pytest.mark.parametrize("depth", [64, 1000, 5000, 200_000])
@pytest.mark.parametrize("kind", ["array", "map"])
def test_deep_nesting(fz: Daemon, healthy: Any, depth: int, kind: str) -> None:
    opener = b"\x91" if kind == "array" else b"\x81\xa1k"
    nested = opener * depth + b"\xc0"
    # as a whole frame, and as a parameter value of a real command
    for payload in (nested, b"\x94\x00\x07\xa3get\x81\xa3key" + nested):
        responses = check(exchange(fz, payload, USER_HELLO), hello=True)
        assert len(responses) == 1 and responses[0][2] is not None, responses
    still_fine(fz, healthy)


def test_deeply_nested_value_for_every_parameter(fz: Daemon, healthy: Any) -> None:
    """As deep as a frame may nest: every command answers with an error of its own."""
    nested: Any = 0
    for _ in range(protocol.MAX_FRAME_CONTAINERS - 2):
        nested = [nested]
    for hello in (USER_HELLO, {**ADMIN_HELLO, "bucket": BUCKET}):
        requests = [
            [0, i, name, {param: nested, **({} if param == "timeout_ms" else {"timeout_ms": 5})}]
            for i, (name, param) in enumerate(
                (name, param)
                for name in sorted(COMMANDS)
                for param in sorted(COMMANDS[name].params)
            )
        ]
        payload = b"".join(msgpack.packb(r) for r in requests)
        responses = check(exchange(fz, payload, hello), hello=True)
        assert len(responses) == len(requests)
        assert all(r[2] is not None for r in responses)
    still_fine(fz, healthy)


def test_deep_nesting_is_answered_or_stopped_at_the_frame_bound(fz: Daemon, healthy: Any) -> None:
    """~1000 levels in a small frame decode (such a frame cannot build much) and get
    the parameter's own error; in a frame over UNCOUNTED_FRAME_BYTES the decoder
    stops at the container bound and closes only that connection."""
    nested: Any = 0
    for _ in range(1010):
        nested = [nested]
    small = msgpack.packb([0, 1, "get", {"key": nested}])
    assert len(small) < protocol.UNCOUNTED_FRAME_BYTES
    with socket.create_connection((fz.host, fz.port), timeout=TIMEOUT) as s:
        # After hello's answer: what arrives with the hello is counted like it.
        u = msgpack.Unpacker(raw=False, strict_map_key=False)
        for frame in (msgpack.packb([0, 0, "hello", USER_HELLO]), small):
            s.sendall(frame)
            while (r := next(u, None)) is None:
                u.feed(s.recv(65536))
            assert frame is not small or r[2]["codeName"] == "BadValue", r
    big = msgpack.packb([0, 1, "get", {"key": nested, "pad": "x" * protocol.UNCOUNTED_FRAME_BYTES}])
    responses = check(exchange(fz, big, USER_HELLO), hello=True)
    assert [r[2]["codeName"] for r in responses] == ["ProtocolError"]
    still_fine(fz, healthy)


def test_frame_over_the_bound_is_refused_unbuffered(fz: Daemon, healthy: Any) -> None:
    value = b"v" * (FRAME_BOUND + 10)
    payload = msgpack.packb([0, 1, "set", {"key": b"big", "value": value}])
    responses = check(exchange(fz, payload, USER_HELLO), hello=True)
    assert [r[2]["codeName"] for r in responses] == ["FrameTooLarge"]
    assert healthy.get("big") is None
    still_fine(fz, healthy)


# -- commands --------------------------------------------------------------------------


def _params(cmd_name: str, anything: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    cmd = COMMANDS[cmd_name]
    names = sorted(cmd.params - {"timeout_ms"})
    known = (
        st.dictionaries(st.sampled_from(names), anything, max_size=len(names))
        if names
        else st.just({})
    )
    extra = st.dictionaries(st.text(max_size=6), anything, max_size=1)
    # A small timeout_ms (or a wrong type) bounds the commands that wait (watch_events).
    timeout = st.one_of(st.integers(-5, 30), not_str)
    if cmd_name == "watch_events":
        timeout = st.integers(0, 30)
    return st.builds(
        lambda a, b, t, with_t: {**a, **b, **({"timeout_ms": t} if with_t else {})},
        known,
        extra,
        timeout,
        st.just(True) if cmd_name == "watch_events" else st.booleans(),
    )


@st.composite
def command_batch(draw: st.DrawFn, anything: st.SearchStrategy[Any]) -> list[tuple[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(sorted(COMMANDS)))
        out.append((name, draw(_params(name, anything))))
    return out


def _run_batch(d: Daemon, hello: dict[str, Any], batch: list[tuple[str, Any]]) -> None:
    payload = b"".join(
        msgpack.packb([0, i + 1, name, params]) for i, (name, params) in enumerate(batch)
    )
    payload += msgpack.packb([0, 99, "ping", {}])
    responses = check(exchange(d, payload, hello), hello=True)
    # Wrong parameters are never fatal: every request is answered, then the ping.
    assert [r[1] for r in responses] == [*range(1, len(batch) + 1), 99], responses
    assert responses[-1][2] is None and responses[-1][3] == "pong"


@fuzz_settings
@given(batch=command_batch(values))
def test_every_command_with_fuzzed_params_as_a_user(
    fz: Daemon, healthy: Any, batch: list[tuple[str, Any]]
) -> None:
    _run_batch(fz, USER_HELLO, batch)
    still_fine(fz, healthy)


@fuzz_settings
@given(batch=command_batch(not_str))
def test_every_command_with_wrong_param_types_as_admin(
    fz: Daemon, healthy: Any, batch: list[tuple[str, Any]]
) -> None:
    _run_batch(fz, {**ADMIN_HELLO, "bucket": BUCKET}, batch)
    still_fine(fz, healthy)


def test_every_runtime_setting_refuses_a_wrong_type(fz: Daemon, healthy: Any) -> None:
    wrong = {int: "12", float: "0.5", str: 12, bool: "yes"}
    with fz.client() as c:
        before = {p["name"]: p["value"] for p in c.command("get_parameter")}
        for s in config_mod.SETTINGS:
            if not s.runtime:
                continue
            for value in (wrong[s.type], [1], {"a": 1}, b"\x00"):
                with pytest.raises(errors.BadValue):
                    c.command("set_parameter", name=s.name, value=value)
        after = {p["name"]: p["value"] for p in c.command("get_parameter")}
    assert after == before
    still_fine(fz, healthy)


def test_memory_stayed_bounded(fz: Daemon, healthy: Any, baseline: dict[str, int]) -> None:
    """Run last in this module: after all of the above, RSS grew by a bounded amount."""
    assert fz.proc is not None
    grown = rss_kb(fz.proc.pid) - baseline["rss_kb"]
    print(f"fuzz: daemon RSS grew by {grown} KiB")
    assert grown < RSS_GROWTH_LIMIT_KB
    still_fine(fz, healthy)
