"""A client survives its server's restart: it reconnects (a new hello, with its
bucket) on the next operation and retries what provably did not run."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

import tenantkv
from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon

TIMEOUT = 20


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "data").start()  # port 0 picked a port; restarts reuse it
    with d.client() as c:
        c.create_bucket("r")
        c.create_user("ru", "pw", roles={"r": "readwrite"})
    yield d
    d.kill()


def _restart(d: Daemon, sig: int) -> None:
    assert d.proc is not None
    d.proc.send_signal(sig)
    d.proc.wait(TIMEOUT)
    d.start()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_sync_client_keeps_working_across_a_restart(restartable: Daemon, sig: int) -> None:
    d = restartable
    with tenantkv.Client(
        d.host, d.port, user="ru", password="pw", bucket="r", timeout=TIMEOUT
    ) as c:
        c.set("k", b"before")
        _restart(d, sig)
        assert c.get("k") == b"before"  # reconnected, same bucket
        c.set("k", b"after")  # a write on a fresh connection
        assert c.get("k") == b"after"


def test_sync_client_reports_a_server_that_stays_down(restartable: Daemon) -> None:
    d = restartable
    with tenantkv.Client(d.host, d.port, user="admin", password=ADMIN_PASSWORD, timeout=1.0) as c:
        assert c.ping() == "pong"
        d.kill()
        start = time.monotonic()
        with pytest.raises(errors.ConnectFailed):
            c.ping()
        assert time.monotonic() - start < 5  # retried within its deadline, then gave up


async def test_async_client_keeps_working_across_a_restart(restartable: Daemon) -> None:
    d = restartable
    async with tenantkv.AsyncClient(
        d.host, d.port, user="ru", password="pw", bucket="r", timeout=TIMEOUT
    ) as c:
        await c.set("k", b"before")
        await trio.to_thread.run_sync(_restart, d, signal.SIGKILL)
        assert await c.get("k") == b"before"
        await c.set("k", b"after")
        assert await c.get("k") == b"after"


def test_sync_client_works_when_its_socket_descriptor_is_above_1023(
    restartable: Daemon,
) -> None:
    """An application holding many files gives the client descriptors above
    select()'s bound (FD_SETSIZE, 1024): checking an idle connection before a
    request must not fail there (it raised "filedescriptor out of range")."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.dup(0))
        d = restartable
        with tenantkv.Client(
            d.host, d.port, user="ru", password="pw", bucket="r", timeout=TIMEOUT
        ) as c:
            c.set("k", b"v")  # the idle connection is checked before each request
            assert c.get("k") == b"v"
            _restart(d, signal.SIGKILL)
            assert c.get("k") == b"v"  # the check saw the closed connection
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
