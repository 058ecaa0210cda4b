"""Shared fixtures. Rules for every test here (as in trio-websocket's suite):
loopback only, port 0, no real sleeps to test time logic (use ``autojump_clock``
or ``mock_clock``), and a bounded wait around every I/O so a bug fails fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import settings

# Hypothesis fails an example slower than 200 ms: a wall-clock assert that a
# loaded machine misses (674 ms once, 7 ms on the rerun). Timings are bench's.
settings.register_profile("tenantkv", deadline=None)
settings.load_profile("tenantkv")

# The suite starts some hundreds of Python processes (daemons and their workers,
# the admin tool, bench) and each xdist worker imports every test module. Where
# the environment sets PYTHONDONTWRITEBYTECODE, each compiled its sources again:
# ~0.2 s of CPU a daemon start, ~8 s a worker's collection (pytest rewrites the
# asserts of every test module). So the suite keeps the bytecode of the checkout
# whatever the environment says: pytest's rewritten test modules from here on,
# and the sources the started processes import (pytest_configure).
sys.dont_write_bytecode = False
ROOT = Path(__file__).resolve().parents[1]

ADMIN_PASSWORD = "admin-test-password"
# Tests run with the defaults, not the developer's shell: a TENANTKV_<NAME> there
# (a metrics port, a data directory, ...) would reach every daemon a test starts.
for _name in [n for n in os.environ if n.startswith("TENANTKV_")]:
    del os.environ[_name]
# Every daemon a test starts takes a free RESP port, not the fixed default: tests
# run side by side, and next to a developer's own server (the README's tour). The
# main port is given on each command line; the metrics port is off unless asked.
os.environ["TENANTKV_RESP_PORT"] = "0"


def free_config(data_dir: Path | str, **values: Any) -> Any:  # -> tenantkv.config.Config
    """The config of an in-process server: every listener on a free port."""
    from tenantkv import config

    base = {"data_dir": str(data_dir), "port": 0, "resp_port": 0, "metrics_port": None}
    return config.Config().with_values({**base, **values})


def read_response(s: socket.socket) -> Any:
    """The first MessagePack object a raw socket receives (None on EOF)."""
    u = msgpack.Unpacker(raw=False)
    while True:
        data = s.recv(65536)
        if not data:
            return None
        u.feed(data)
        for obj in u:
            return obj


def rss_anon_mb(pid: int) -> float:
    """A process's anonymous resident memory in MiB (its heap: LMDB's file pages
    are page cache and do not count)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def wait_until(predicate: Any, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds: end-to-end tests wait on what they need to
    see, not for a guessed time. The polls start 5 ms apart and spread out to 50 ms:
    a predicate often logs in to daemons and asks their status (~3 ms of CPU), and
    polled every 5 ms through a wait of seconds (a lease expiring, a worker coming
    back) it kept a core busy for nothing."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)


def run_bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the checkout, output captured. On a timeout
    the whole process group goes, not only the bench: the daemons it started
    would otherwise run on, orphaned, and load the rest of the suite."""
    cmd = [sys.executable, "-m", "bench", *args]
    with subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the checkout's packages once, before the xdist workers start: every
    process the tests start then reads their bytecode instead of compiling them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import compileall

    for package in ("tenantkv", "admin", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker more than the cores. An end-to-end test spends part
    of its time waiting on its daemons (a start-up, an fsync, a timeout it checks),
    so one worker per core left a quarter of the cores idle; the extra worker runs
    in those gaps. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return len(os.sched_getaffinity(0)) + 1


class FakeClock:
    """A mutable clock for the sans-IO gate cores: tests move ``t`` themselves."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


#: Every daemon this test process started, in order: a failing test's report
#: shows the logs of those it could have talked to (see pytest_runtest_makereport).
_STARTED: list[Daemon] = []
#: How many had started when the current test's setup began.
_started_before_test = 0
LOG_TAIL_CHARS = 6000


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _started_before_test
    _started_before_test = len(_STARTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test's report ends with the log of each daemon it may have used (a
    module's daemon still running, or one the test started): a failure on a loaded
    machine is then read from what the server said, not guessed."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed or call.when == "teardown":
        return
    for i, d in enumerate(_STARTED):
        running = d.proc is not None and d.proc.poll() is None
        if running or i >= _started_before_test:
            tail = d.log()[-LOG_TAIL_CHARS:]
            report.sections.append((f"daemon log {d.data_dir} (tail)", tail or "(empty)"))


@dataclass
class Daemon:
    """A real ``tenantkv serve`` process on a loopback port."""

    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    resp_port: int = 0
    metrics_port: int | None = None
    log_path: Path = field(default_factory=Path)
    extra_args: list[str] = field(default_factory=list)

    def start(self, timeout: float = 60.0) -> Daemon:
        """Start it and wait for its ready file. The bound is generous: a niced suite
        on a busy machine once took over 20 s to see a second worker come up."""
        ready = self.data_dir.parent / f"ready-{self.data_dir.name}.json"
        ready.unlink(missing_ok=True)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        env = {**os.environ, "TENANTKV_ADMIN_PASSWORD": ADMIN_PASSWORD}
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tenantkv.server.cli",
                    "serve",
                    "--data-dir",
                    str(self.data_dir),
                    "--port",
                    str(self.port),
                    "--resp-port",
                    str(self.resp_port),
                    "--ready-file",
                    str(ready),
                    *self.extra_args,
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + timeout
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        while not ready.exists():
            if self.proc.poll() is not None:
                if self._port_taken(logged) and time.monotonic() < deadline:
                    # A restart on the port it had: between the two, the kernel may
                    # give that port to a connection's local end (the same range as
                    # port 0's); such a connection is short, so the start is retried.
                    time.sleep(0.5)
                    return self.start(deadline - time.monotonic())
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"daemon did not start: {self.log()}")
            time.sleep(0.02)
        if not any(d is self for d in _STARTED):  # (a restart is the same daemon)
            _STARTED.append(self)
        info = json.loads(ready.read_text())
        self.host, self.port, self.metrics_port = info["host"], info["port"], info["metrics_port"]
        self.resp_port = info["resp_port"] or 0
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def _port_taken(self, since: int) -> bool:
        """Did the start that logged from ``since`` fail on a fixed port in use?"""
        if not (self.port or self.resp_port):
            return False
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(since)
            return b"Address already in use" in f.read()
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def client(self, **kw: object):  # -> tenantkv.Client
        import tenantkv

        kw.setdefault("user", "admin")
        kw.setdefault("password", ADMIN_PASSWORD)
        kw.setdefault("timeout", 20.0)
        return tenantkv.Client(self.host, self.port, **kw)  # type: ignore[arg-type]

    def async_client(self, **kw: object):  # -> tenantkv.AsyncClient
        import tenantkv

        kw.setdefault("user", "admin")
        kw.setdefault("password", ADMIN_PASSWORD)
        kw.setdefault("timeout", 20.0)
        return tenantkv.AsyncClient(self.host, self.port, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon per test module (start-up costs ~0.5 s)."""
    d = Daemon(tmp_path_factory.mktemp("daemon") / "data").start()
    yield d
    d.kill()


@pytest.fixture
def fresh_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon of this test's own, for tests that restart or kill it."""
    d = Daemon(tmp_path / "data").start()
    yield d
    d.kill()
