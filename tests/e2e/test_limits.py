"""Connection limits and start-up checks of the real daemon (config file driven)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import trio

from tenantkv import errors
from tests.conftest import Daemon, read_response

TIMEOUT = 20


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    base = tmp_path_factory.mktemp("strict")
    cfg = base / "tenantkv.toml"
    cfg.write_text(
        "[server]\nhello_timeout_secs = 0.3\nidle_timeout_secs = 0.6\nmax_connections = 3\n"
        "max_value_bytes = 1024\n"
    )
    d = Daemon(base / "data", extra_args=["--config", str(cfg)]).start()
    yield d
    d.kill()


def test_silent_connection_is_closed_after_the_hello_deadline(strict: Daemon) -> None:
    with socket.create_connection((strict.host, strict.port), timeout=TIMEOUT) as s:
        start = time.monotonic()
        resp = read_response(s)
        assert resp is not None and resp[2]["codeName"] == "IdleTimeout"
        assert s.recv(10) == b""
        assert time.monotonic() - start < 5  # the deadline is 0.3 s; no deadline hangs


def test_idle_authenticated_connection_is_closed(strict: Daemon) -> None:
    from tests.conftest import ADMIN_PASSWORD

    # Timed from before the connection exists: the server's idle timer cannot
    # start earlier, however long this process waits for a core in between (a
    # loaded run read hello's answer 0.36 s after the server sent it).
    start = time.monotonic()
    with socket.create_connection((strict.host, strict.port), timeout=TIMEOUT) as s:
        hello = {"user": "admin", "password": ADMIN_PASSWORD}
        s.sendall(msgpack.packb([0, 1, "hello", hello]))
        assert read_response(s)[2] is None  # type: ignore[index]
        resp = read_response(s)  # nothing sent: the server's idle timer fires
        assert resp is not None and resp[1] is None and resp[2]["codeName"] == "IdleTimeout"
        assert 0.55 < time.monotonic() - start < 5  # idle_timeout_secs 0.6; none hangs


def test_value_limit_from_config(strict: Daemon) -> None:
    with strict.client() as c:
        c.create_bucket("v")
        c.select_bucket("v")
        with pytest.raises(errors.ValueTooLarge, match="max_value_bytes=1024"):
            c.set("k", b"x" * 1025)
        c.set("k", b"x" * 1024)


def test_a_value_far_over_the_limit_is_refused_before_it_is_sent(strict: Daemon) -> None:
    """A value past the server's frame bound (max_value_bytes + 64 KiB) would make
    the server close the connection mid-send; the client knows the limit from
    hello and refuses it first with the server's error, and the connection
    stays usable."""
    with strict.client() as c:
        c.create_bucket("far")
        c.select_bucket("far")
        with pytest.raises(errors.ValueTooLarge, match="max_value_bytes=1024"):
            c.set("k", b"x" * (512 * 1024))
        with pytest.raises(errors.ValueTooLarge, match="max_value_bytes=1024"):
            c.set("k", "é" * 600)  # 1,200 bytes as UTF-8
        c.set("k", b"x" * 1024)
        assert c.get("k") == b"x" * 1024

    async def main() -> None:
        async with strict.async_client(bucket="far") as ac:
            with pytest.raises(errors.ValueTooLarge):
                await ac.set("k", b"x" * (512 * 1024))
            assert await ac.get("k") == b"x" * 1024

    trio.run(main)


def test_max_connections_refuses_the_extra_one(strict: Daemon) -> None:
    clients = [strict.client() for _ in range(3)]
    try:
        with pytest.raises(errors.TooManyConnections):
            strict.client()
    finally:
        for c in clients:
            c.close()
    deadline = time.monotonic() + TIMEOUT
    while True:  # room again once the server has seen them leave
        try:
            with strict.client() as c:
                assert c.ping() == "pong"
            break
        except errors.TooManyConnections:
            assert time.monotonic() < deadline


@pytest.mark.parametrize(
    "body, message",
    [("prot = 1\n", "unknown setting 'prot'"), ('durability = "maybe"\n', "'durability'")],
)
def test_bad_config_stops_startup_naming_the_key(tmp_path: Path, body: str, message: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tenantkv.server.cli",
            "serve",
            "--config",
            str(cfg),
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2 and message in r.stderr


def test_generated_admin_password_is_saved_private(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TENANTKV_ADMIN_PASSWORD"}
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenantkv.server.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ready.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        pw_file = tmp_path / "d" / "admin-password"
        assert oct(pw_file.stat().st_mode & 0o777) == "0o600"
        password = pw_file.read_text().strip()
        import json

        import tenantkv

        info = json.loads(ready.read_text())
        with tenantkv.Client(info["host"], info["port"], user="admin", password=password) as c:
            assert c.ping() == "pong"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=TIMEOUT)
    assert str(pw_file) in err and password not in err
