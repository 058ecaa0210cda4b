"""RESP fuzzing against the live daemon, as ``test_fuzz.py`` does for MessagePack.

Random bytes, mutated and truncated commands, random arguments for every
command in the RESP table — before and after ``AUTH``. Throughout the process
stays alive, every reply parses as RESP and is never an internal error, and a
healthy RESP connection keeps working. Derandomized for CI (``FUZZ_RANDOM=1``
for fresh cases, ``FUZZ_EXAMPLES=N`` for more).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tenantkv.server.doors.resp import LOCAL
from tenantkv.server.redis_commands import REDIS_COMMANDS
from tests.conftest import Daemon

TIMEOUT = 10
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
USER, PASSWORD, BUCKET = "rfz", "fuzz-pw", "rfz"
AUTH = b"*3\r\n$4\r\nAUTH\r\n$3\r\nrfz\r\n$7\r\nfuzz-pw\r\n"

fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not os.environ.get("FUZZ_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAMES = sorted({*REDIS_COMMANDS, *LOCAL, "lpush", "nosuch", "flushall"})
args = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.sampled_from([b"0", b"-1", b"1", b"EX", b"PX", b"NX", b"GET", b"*", b"9" * 30]),
    ),
    max_size=6,
)


def encode(argv: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in argv)


@pytest.fixture(scope="module")
def rd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("rfuzz")
    cfg = base / "tenantkv.toml"
    cfg.write_text("max_value_bytes = 65536\nlogin_failure_limit = 0\n")
    d = Daemon(base / "data", extra_args=["--config", str(cfg)]).start()
    with d.client() as c:
        c.create_bucket(BUCKET)
        c.create_user(USER, PASSWORD, roles={BUCKET: "readwrite"})
    yield d
    d.kill()


@pytest.fixture(scope="module")
def healthy(rd: Daemon) -> Iterator[redis.Redis]:
    c = redis.Redis(host=rd.host, port=rd.resp_port, username=USER, password=PASSWORD)
    c.set("canary", "alive")
    yield c
    c.close()


def exchange(d: Daemon, payload: bytes) -> bytes:
    """Send, half-close, and read everything until the server closes."""
    with socket.create_connection((d.host, d.resp_port), timeout=TIMEOUT) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        out = b""
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            out += data
        return out


def replies(data: bytes) -> list[bytes]:
    """Split a reply stream into replies (raises if it is not RESP)."""
    out, pos = [], 0
    while pos < len(data):
        end = _skip(data, pos)
        out.append(data[pos:end])
        pos = end
    return out


def _skip(data: bytes, pos: int) -> int:
    kind = data[pos : pos + 1]
    eol = data.index(b"\r\n", pos)
    head = data[pos + 1 : eol]
    if kind in (b"+", b"-", b":", b"_", b"#", b","):
        return eol + 2
    if kind in (b"$", b"="):
        n = int(head)
        return eol + 2 if n < 0 else eol + 2 + n + 2
    if kind in (b"*", b"~", b"%"):
        n = int(head) * (2 if kind == b"%" else 1)
        pos = eol + 2
        for _ in range(max(n, 0)):
            pos = _skip(data, pos)
        return pos
    raise AssertionError(f"not RESP at {pos}: {data[pos : pos + 40]!r}")


def check(d: Daemon, healthy: redis.Redis, out: bytes) -> None:
    for reply in replies(out):
        assert b"internal error" not in reply.lower(), reply
    assert d.proc is not None and d.proc.poll() is None, d.log()[-3000:]
    assert healthy.get("canary") == b"alive"


@fuzz_settings
@given(data=st.binary(max_size=300))
def test_random_bytes(rd: Daemon, healthy: redis.Redis, data: bytes) -> None:
    check(rd, healthy, exchange(rd, data))
    check(rd, healthy, exchange(rd, AUTH + data))


@fuzz_settings
@given(name=st.sampled_from(NAMES), argv=args, cut=st.integers(min_value=0, max_value=60))
def test_every_command_with_random_arguments(
    rd: Daemon, healthy: redis.Redis, name: str, argv: list[bytes], cut: int
) -> None:
    cmd = encode([name.encode(), *argv])
    if name in ("quit", "reset", "flushdb"):
        cmd = encode([b"ping"])  # would end the connection or empty the canary's bucket
    check(rd, healthy, exchange(rd, AUTH + cmd + cmd[: len(cmd) - cut % (len(cmd) + 1)]))
    check(rd, healthy, exchange(rd, cmd))  # before AUTH: NOAUTH, never a crash


#: Bytes that mean something in a glob or an option, and some that do not.
GLOB_BYTES = b"*?[]^-\\az09:\x00\xff "
patterns = st.one_of(
    st.lists(st.sampled_from(list(GLOB_BYTES)), min_size=1, max_size=16).map(bytes),
    st.sampled_from([b"[z-a]", b"[^]", b"[", b"k[1-", b"\\", b"[]", b"[a-", b"x[", b"[\\"]),
)
pattern_args = st.lists(
    st.one_of(
        patterns,
        st.sampled_from([b"MATCH", b"COUNT", b"TYPE", b"0", b"1", b"-1", b"SETNAME", b"lib-name"]),
    ),
    max_size=6,
)
calls = st.one_of(
    st.tuples(st.sampled_from(NAMES), pattern_args),
    st.tuples(st.just("keys"), patterns.map(lambda p: [p])),
    st.tuples(st.just("scan"), patterns.map(lambda p: [b"0", b"MATCH", p, b"COUNT", b"100"])),
    st.tuples(st.just("config"), patterns.map(lambda p: [b"GET", p])),
    st.tuples(st.just("client"), patterns.map(lambda p: [b"SETNAME", p])),
)


@fuzz_settings
@given(pipeline=st.lists(calls, min_size=1, max_size=12))
@example(pipeline=[("keys", [b"[z-a]"]), ("scan", [b"0", b"MATCH", b"k[1-"])])
def test_every_command_with_glob_arguments(
    rd: Daemon, healthy: redis.Redis, pipeline: list[tuple[str, list[bytes]]]
) -> None:
    """Patterns and options as arguments to every command (``KEYS [z-a]``, ``SCAN 0
    MATCH k[1-``, ``CONFIG GET [``, ...), pipelined on one connection: each gets
    a Redis-style reply — a value or an error naming what is wrong, never an
    internal error — and nothing is logged for them."""
    payload = AUTH
    for name, argv in pipeline:
        if name in ("quit", "reset", "flushdb", "auth", "hello", "select"):
            name = "keys"  # would end, reset or move the connection (or empty the bucket)
        payload += encode([name.encode(), *argv])
    out = exchange(rd, payload)
    got = replies(out)
    assert len(got) == 1 + len(pipeline), out[-300:]
    check(rd, healthy, out)
    assert "Traceback" not in rd.log(), rd.log()[-3000:]
