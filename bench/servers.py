"""Start and stop the servers a benchmark talks to: a tenantkv daemon and redis-server.

Both run as child processes on loopback with a throw-away directory, so a
benchmark never touches anything it did not create, and both are stopped
(SIGTERM, then SIGKILL) however the benchmark ends. Each handle knows the
server's pid, so the report can show the server's CPU use next to the
client's — on a 2-core machine that is what tells a server bottleneck from a
client one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.loadgen import BenchError, RedisCodec, RespParser, Target, resp_command

START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ServerHandle:
    """A running server: where it listens and, if we started it, its process."""

    kind: str
    host: str
    port: int
    version: str = "?"
    pid: int | None = None
    #: credentials with admin rights (tenantkv), or the AUTH password (redis)
    user: str | None = None
    password: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    log_path: str | None = None
    #: tenantkv's RESP front door (the ready file's ``resp_port``), if it has one
    resp_port: int | None = None
    #: the server process, if we started it (for :meth:`kill`)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    #: ``serve --workers N``: N > 1 means ``pid`` is a supervisor whose children
    #: serve, so its CPU is counted with theirs (:meth:`cpu_seconds`)
    workers: int = 1

    def kill(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGKILL the server we started — a crash, no shutdown — and reap it.

        Returns its exit status (``-SIGKILL``, or what it exited with if it had
        already died). The context manager that started it then finds it gone.
        """
        if self.proc is None:
            raise BenchError(f"{self.kind} at {self.host}:{self.port} was not started here")
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(timeout)

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds of the server (all threads), if local.

        With ``workers > 1`` it is the supervisor's plus every live descendant's
        (the workers): one server from outside, so one CPU figure. A worker that
        died inside a window takes its CPU with it; a benchmark window that sees
        a restart is not one to trust anyway.
        """
        if self.pid is None:
            return None
        own = _proc_cpu(self.pid)
        if own is None or self.workers <= 1:
            return own
        return own + sum(_proc_cpu(p) or 0.0 for p in descendants(self.pid))

    def process_count(self) -> int:
        """How many server processes :meth:`cpu_seconds` adds up (1 + live workers)."""
        if self.pid is None:
            return 0
        return 1 + (len(descendants(self.pid)) if self.workers > 1 else 0)

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def _proc_cpu(pid: int) -> float | None:
    """utime + stime of one process (all its threads), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid``, from every process's ppid in /proc.

    Not ``/proc/PID/task/TID/children``: that file needs CONFIG_PROC_CHILDREN,
    which not every kernel has (this machine's does not). A /proc scan costs a
    millisecond or two here, and it is taken only at a window's edges.
    """
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    found: list[int] = []
    frontier = {pid}
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        found += kids
        frontier = set(kids)
    return found


def free_port() -> int:
    """A free loopback port (for redis-server, which cannot report one it picked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pin(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that sets the child's CPU affinity before it starts any thread."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def pin_cpus(args: argparse.Namespace) -> None:
    """Resolve ``--pin`` (:func:`bench.report.pin_flag`) into ``args.server_cpus``
    and ``args.client_cpus`` (None: the OS decides)."""
    args.server_cpus, args.client_cpus = None, None
    if args.pin == "split":
        srv, cli = split_cpus()
        args.server_cpus, args.client_cpus = srv, frozenset(cli)


def split_cpus() -> tuple[set[int], set[int]]:
    """``--pin split``: the server on the first allowed CPU, the load on the others."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise BenchError("--pin split needs at least 2 CPUs")
    return {allowed[0]}, set(allowed[1:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def tenantkv_server(
    data_dir: str | None = None,
    cpus: set[int] | None = None,
    launcher: Sequence[str] | None = None,
    workers: int = 1,
) -> Iterator[ServerHandle]:
    """Run ``tenantkv serve`` with default (durable) settings on a free port.

    The admin password is generated and passed in ``TENANTKV_ADMIN_PASSWORD``
    for the first start. ``data_dir`` None uses a temporary directory that is
    removed afterwards. ``cpus`` pins the server (all its threads) to those CPUs.
    ``launcher`` replaces ``python -m tenantkv.server.cli`` in front of the
    ``serve ...`` arguments (e.g. a ``python -c`` that patches the server for
    an A/B measurement first). ``workers`` > 1 passes ``--workers N``: a
    supervisor and N worker processes (the pins, inherited, cover them all);
    1 passes nothing, the single process as before.
    """
    from tenantkv import __version__

    tmp = tempfile.mkdtemp(prefix="tenantkv-bench-")
    data = data_dir or os.path.join(tmp, "data")
    ready = os.path.join(tmp, "ready.json")
    log_path = os.path.join(tmp, "server.log")
    password = secrets.token_urlsafe(18)
    # A free RESP port (not the fixed default: benchmarks run servers side by side).
    env = {**os.environ, "TENANTKV_ADMIN_PASSWORD": password, "TENANTKV_RESP_PORT": "0"}
    prefix = list(launcher) if launcher else [sys.executable, "-m", "tenantkv.server.cli"]
    cmd = [*prefix, "serve", "--data-dir", data]
    cmd += ["--host", "127.0.0.1", "--port", "0", "--ready-file", ready]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc: subprocess.Popen[bytes] | None = None
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_pin(cpus)
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path, errors="replace") as f:
                    tail = f.read()[-2000:]
                raise BenchError(f"tenantkv did not start:\n{tail}")
            time.sleep(0.02)
        with open(ready) as f:
            info = json.load(f)
        yield ServerHandle(
            "tenantkv",
            info["host"],
            info["port"],
            version=__version__,
            pid=info["pid"],
            user="admin",
            password=password,
            settings={
                "durability": "fsync (default)",
                "data_dir": data,
                **({"workers": str(workers)} if workers > 1 else {}),
            },
            log_path=log_path,
            resp_port=info.get("resp_port"),
            proc=proc,
            workers=workers,
        )
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def floor_server(cpus: set[int] | None = None) -> Iterator[ServerHandle]:
    """Run the floor (bench/floor.py: our stack with no gates) like a tenantkv daemon."""
    with tenantkv_server(cpus=cpus, launcher=[sys.executable, "-m", "bench.floor"]) as h:
        h.kind, h.user, h.password = "floor", None, None
        h.settings = {"durability": "fsync (group commit, like tenantkv)"}
        yield h


def prepare_tenantkv(server: ServerHandle, bucket: str, *, dedicated_user: bool) -> tuple[str, str]:
    """Create ``bucket`` (if absent) and return the credentials the load should use.

    With ``dedicated_user`` (a server we started) the load runs as a plain
    ``bench`` user with the readwrite role, not as admin, so it takes the
    same path through the admission gates as an application would.
    """
    import tenantkv
    from tenantkv import errors

    assert server.user is not None and server.password is not None
    try:
        client = tenantkv.Client(
            server.host, server.port, user=server.user, password=server.password
        )
    except errors.TenantKVError as exc:
        raise BenchError(f"cannot log in to tenantkv as {server.user!r}: {exc}") from None
    with client:
        # an existing server may have the bucket already, or deny a non-admin
        with contextlib.suppress(errors.BucketExists, errors.Unauthorized):
            client.create_bucket(bucket)
        if not dedicated_user:
            return server.user, server.password
        password = secrets.token_urlsafe(18)
        client.create_user("bench", password, roles={bucket: "readwrite"})
    wait_for_login(server, "bench", password, bucket)
    return "bench", password


#: ``wait_for_login``: fresh logins that must succeed in a row, and for how long to try
LOGIN_STREAK = 8
LOGIN_TIMEOUT = 5.0


def wait_for_login(server: ServerHandle, user: str, password: str, bucket: str) -> float:
    """With ``serve --workers N``, wait until a user just created can log in on
    every worker; return the seconds it took (0 for a single process).

    A user created through one worker reaches the others by a change
    notification (docs/scaling.md), so a login in the next few milliseconds may
    land on a worker that does not know it yet and fail. Connections are spread
    by the kernel, so ``LOGIN_STREAK`` fresh connections in a row that all log
    in stand for "every worker knows it".
    """
    import tenantkv
    from tenantkv import errors

    if server.workers <= 1:
        return 0.0
    t0 = time.monotonic()
    streak = 0
    while streak < LOGIN_STREAK:
        try:
            with tenantkv.Client(
                server.host, server.port, user=user, password=password, bucket=bucket
            ):
                streak += 1
        except errors.ServerError:  # unknown user (or bucket) on that worker, so far
            streak = 0
            if time.monotonic() - t0 > LOGIN_TIMEOUT:
                raise BenchError(
                    f"user {user!r} still unknown to a worker {LOGIN_TIMEOUT:g} s after "
                    "it was created"
                ) from None
            time.sleep(0.01)
    return time.monotonic() - t0


def find_redis() -> str | None:
    return shutil.which("redis-server")


@contextlib.contextmanager
def redis_server(
    appendfsync: str = "always", cpus: set[int] | None = None
) -> Iterator[ServerHandle]:
    """Run redis-server on a free loopback port with AOF ``appendfsync``.

    ``appendonly yes`` + ``appendfsync always`` is Redis's durable mode: it
    fsyncs the AOF before replying, batching the writes of one event-loop
    iteration — the same group-commit idea as tenantkv's writer. ``save ""``
    turns off RDB snapshots so a fork never lands inside a measurement.
    """
    exe = find_redis()
    if exe is None:
        raise BenchError("redis-server is not on PATH")
    version = subprocess.run(
        [exe, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="redis-bench-")
    log_path = os.path.join(tmp, "redis.log")
    port = free_port()
    settings = {"appendonly": "yes", "appendfsync": appendfsync, "save": '""'}
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp]
    cmd += ["--save", "", "--appendonly", "yes", "--appendfsync", appendfsync]
    cmd += ["--daemonize", "no", "--logfile", log_path]
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_pin(cpus)
        )
        handle = ServerHandle(
            "redis",
            "127.0.0.1",
            port,
            version=version.split(" v=")[-1].split()[0] if " v=" in version else version,
            pid=proc.pid,
            settings=settings,
            log_path=log_path,
            proc=proc,
        )
        _wait_redis(handle, proc)
        yield handle
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_redis(handle: ServerHandle, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise BenchError(f"redis-server exited at start:\n{handle.log_tail()}")
        try:
            with socket.create_connection((handle.host, handle.port), timeout=1) as s:
                RedisCodec().handshake(s)
                return
        except (OSError, BenchError):
            if time.monotonic() > deadline:
                raise BenchError(f"redis-server did not start:\n{handle.log_tail()}") from None
            time.sleep(0.05)


def redis_info(handle: ServerHandle, section: str = "persistence") -> dict[str, str]:
    """``INFO section`` as a dict (to confirm the AOF settings in force)."""
    with socket.create_connection((handle.host, handle.port), timeout=5) as s:
        RedisCodec(handle.password).handshake(s)
        s.sendall(resp_command(b"INFO", section.encode()))
        data = b""
        parser = RespParser()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if parser.feed(chunk)[0]:
                break
    body = data.split(b"\r\n", 1)[1].decode(errors="replace")
    out = {}
    for line in body.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


# -- the servers of a comparison run ---------------------------------------------------------

#: a server a run measures: its name, its handle, and where its load goes
Measured = tuple[str, ServerHandle, Target]


def describe(handle: ServerHandle) -> dict[str, object]:
    """A server as a run's ``meta["servers"]`` records it."""
    return {
        "version": handle.version,
        "address": f"{handle.host}:{handle.port}",
        "started_by_bench": handle.pid is not None,
        "settings": handle.settings,
    }


def vs_redis(
    stack: contextlib.ExitStack, cpus: set[int] | None, meta: dict[str, Any]
) -> Measured | None:
    """``--vs-redis``: redis-server with ``appendfsync always`` (Redis's durable
    mode), recorded in ``meta["servers"]``; None when it is not on PATH."""
    if find_redis() is None:
        return None
    from bench import report

    report.log("starting redis-server (appendonly yes, appendfsync always, save '') ...")
    rd = stack.enter_context(redis_server("always", cpus))
    meta["servers"]["redis"] = {
        **describe(rd),
        "aof_enabled": redis_info(rd).get("aof_enabled"),
    }
    return ("redis", rd, Target(rd.host, rd.port, RedisCodec()))


#: what a run says when ``--vs-redis`` finds no redis-server
NO_REDIS = (
    "--vs-redis: redis-server is not on PATH; comparison skipped "
    "(Debian: apt-get install redis-server)"
)


def versions_line(meta: dict[str, Any]) -> str:
    """``tenantkv V @ commit; redis V (appendfsync always)``."""
    from bench import report

    line = report.version_line(meta)
    if "redis" in meta["servers"]:
        line += f"; redis {meta['servers']['redis']['version']} (appendfsync always)"
    return line


def pinned(args: argparse.Namespace) -> str:
    """`` (pinned: servers on CPU [..], load on [..])`` when ``--pin split``."""
    if args.server_cpus and args.client_cpus:
        return (
            f"pinned: servers on CPU {sorted(args.server_cpus)}, load on {sorted(args.client_cpus)}"
        )
    return ""


@contextlib.contextmanager
def bench_user(handle: ServerHandle, bucket: str) -> Iterator[tuple[Any, str]]:
    """An admin client of a server started here, ``bucket`` made and a plain
    ``bench`` user with the readwrite role on it: (the client, that user's password)."""
    import tenantkv

    assert handle.password is not None
    with tenantkv.Client(handle.host, handle.port, user="admin", password=handle.password) as c:
        c.create_bucket(bucket)
        password = secrets.token_urlsafe(18)
        c.create_user("bench", password, roles={bucket: "readwrite"})
        yield c, password
