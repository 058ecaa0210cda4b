"""Under systemd's ``Type=notify`` the daemon says when it serves and when it stops."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from tests.conftest import Daemon


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_once_serving_and_stopping_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abstract: bool
) -> None:
    name = f"tenantkv-test-{os.getpid()}-{tmp_path.name}"
    address = "\0" + name if abstract else str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(20)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name if abstract else address)
        d = Daemon(tmp_path / "data").start()
        try:
            ready = sock.recv(4096).decode().split("\n")
            assert "READY=1" in ready
            assert f"MAINPID={d.proc.pid}" in ready  # type: ignore[union-attr]
            # READY came once it served: a client connects and works right away.
            with d.client() as c:
                assert c.ping() == "pong"
            d.stop(signal.SIGTERM)
            assert "STOPPING=1" in sock.recv(4096).decode().split("\n")
        finally:
            d.kill()
