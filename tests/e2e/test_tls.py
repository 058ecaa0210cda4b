"""TLS on the real daemon, with certificates made at test time (``trustme``).

Two daemons: one with a server certificate only, one that also requires and
verifies client certificates (``tls_ca_file``). Plain clients, clients that
trust the wrong CA, and broken handshakes are refused cleanly — the listener
and every other connection go on.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
import trio

from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon, read_response

trustme = pytest.importorskip("trustme")

TIMEOUT = 20


@dataclass
class Pki:
    ca_file: str
    #: a CA that signed nothing the servers use
    other_ca_file: str
    server_cert: str
    server_key: str
    #: a server certificate for another name (example.org only)
    wrong_name_cert: str
    client_ca_file: str
    client_cert: str
    client_key: str
    #: a client certificate from a CA the server does not trust
    rogue_client_cert: str
    rogue_client_key: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")

    def write(blob: object, name: str) -> str:
        path = d / name
        blob.write_to_path(str(path))  # type: ignore[attr-defined]
        return str(path)

    ca, other_ca, client_ca, rogue_ca = trustme.CA(), trustme.CA(), trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    wrong = ca.issue_cert("example.org")
    client = client_ca.issue_cert("app@tenantkv.test")
    rogue = rogue_ca.issue_cert("mallory@tenantkv.test")
    return Pki(
        ca_file=write(ca.cert_pem, "ca.pem"),
        other_ca_file=write(other_ca.cert_pem, "other-ca.pem"),
        server_cert=write(server.cert_chain_pems[0], "server.pem"),
        server_key=write(server.private_key_pem, "server.key"),
        wrong_name_cert=write(wrong.private_key_and_cert_chain_pem, "wrong.pem"),
        client_ca_file=write(client_ca.cert_pem, "client-ca.pem"),
        client_cert=write(client.cert_chain_pems[0], "client.pem"),
        client_key=write(client.private_key_pem, "client.key"),
        rogue_client_cert=write(rogue.cert_chain_pems[0], "rogue.pem"),
        rogue_client_key=write(rogue.private_key_pem, "rogue.key"),
    )


def _daemon(base: Path, settings: dict[str, object]) -> Daemon:
    cfg = base / "tenantkv.toml"
    lines = ["[server]"] + [
        f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}"
        for k, v in settings.items()
    ]
    cfg.write_text("\n".join(lines) + "\n")
    return Daemon(base / "data", extra_args=["--config", str(cfg)]).start()


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Daemon]:
    d = _daemon(
        tmp_path_factory.mktemp("tls"),
        {
            "tls_cert_file": pki.server_cert,
            "tls_key_file": pki.server_key,
            "hello_timeout_secs": 1.0,
        },
    )
    yield d
    d.kill()


@pytest.fixture(scope="module")
def mtls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Daemon]:
    d = _daemon(
        tmp_path_factory.mktemp("mtls"),
        {
            "tls_cert_file": pki.server_cert,
            "tls_key_file": pki.server_key,
            "tls_ca_file": pki.client_ca_file,
        },
    )
    yield d
    d.kill()


def test_sync_client_over_tls(tls_daemon: Daemon, pki: Pki) -> None:
    with tls_daemon.client(tls=True, tls_ca_file=pki.ca_file) as c:
        c.create_bucket("t")
        c.select_bucket("t")
        c.set("k", b"over tls" * 10_000)
        assert c.get("k") == b"over tls" * 10_000
        with c.pipeline() as p:
            for i in range(200):
                p.set(f"p{i}", str(i))
        assert c.mget([f"p{i}" for i in range(200)]) == [str(i).encode() for i in range(200)]
    assert "listening on 127.0.0.1:" in tls_daemon.log() and "(TLS)" in tls_daemon.log()


async def test_async_client_over_tls(tls_daemon: Daemon, pki: Pki) -> None:
    with trio.fail_after(TIMEOUT):
        async with tls_daemon.async_client(tls=True, tls_ca_file=pki.ca_file) as c:
            async with trio.open_nursery() as n:
                for _ in range(50):
                    n.start_soon(c.command, "ping")
            assert (await c.command("whoami"))["user"] == "admin"


def test_client_with_own_ssl_context(tls_daemon: Daemon, pki: Pki) -> None:
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    with tls_daemon.client(tls=ctx) as c:
        assert c.ping() == "pong"
    with pytest.raises(ValueError, match="not both"):
        tls_daemon.client(tls=ctx, tls_ca_file=pki.ca_file)
    with pytest.raises(ValueError, match="need tls=True"):
        tls_daemon.client(tls_ca_file=pki.ca_file)


def test_workers_serve_tls_with_client_certificates(tmp_path: Path, pki: Pki) -> None:
    """``--workers 2``: each worker handshakes on its own share of the connections."""
    settings: dict[str, object] = {
        "tls_cert_file": pki.server_cert,
        "tls_key_file": pki.server_key,
        "tls_ca_file": pki.client_ca_file,
    }
    base = tmp_path / "w"
    base.mkdir()
    d = _daemon(base, settings)  # one process first: the data directory exists
    d.stop()
    d.extra_args += ["--workers", "2"]
    d.start()
    try:
        tls = {"tls": True, "tls_ca_file": pki.ca_file}
        cert = {"tls_cert_file": pki.client_cert, "tls_key_file": pki.client_key}
        seen = set()
        for i in range(40):
            with d.client(**tls, **cert) as c:
                seen.add(c.command("whoami")["worker"])
                if i == 0:
                    c.create_bucket("t")
                c.select_bucket("t")
                c.set(f"k{i}", b"v")
            if seen == {0, 1} and i >= 3:
                break
        assert seen == {0, 1}
        with pytest.raises(errors.TenantKVError):
            d.client(**tls).close()  # no client certificate: refused by either worker
        assert "(TLS) (2 workers)" in d.log()
    finally:
        d.kill()


def test_plain_client_is_refused_cleanly(tls_daemon: Daemon, pki: Pki) -> None:
    with pytest.raises(errors.ProtocolError, match="requires TLS"):
        tls_daemon.client()
    with tls_daemon.client(tls=True, tls_ca_file=pki.ca_file) as c:  # the listener lives on
        assert c.ping() == "pong"


@pytest.mark.parametrize("ca", ["other", "system"])
def test_server_verification_fails_without_the_right_ca(
    tls_daemon: Daemon, pki: Pki, ca: str
) -> None:
    kw: dict[str, object] = {"tls": True}
    if ca == "other":
        kw["tls_ca_file"] = pki.other_ca_file
    with pytest.raises(errors.ConnectionClosed, match="certificate verify failed"):
        tls_daemon.client(**kw)


def test_server_name_is_checked(tmp_path: Path, pki: Pki) -> None:
    # The right CA, but the certificate names example.org, not the address dialled.
    d = _daemon(tmp_path, {"tls_cert_file": pki.wrong_name_cert})  # key in the same PEM
    try:
        with pytest.raises(errors.ConnectionClosed, match="certificate verify failed"):
            d.client(tls=True, tls_ca_file=pki.ca_file)
        ctx = ssl.create_default_context(cafile=pki.ca_file)
        ctx.check_hostname = False  # an SSLContext of one's own is used as is
        with d.client(tls=ctx) as c:
            assert c.ping() == "pong"
    finally:
        d.kill()


async def test_async_client_verification_failure(tls_daemon: Daemon, pki: Pki) -> None:
    with trio.fail_after(TIMEOUT), pytest.raises(errors.ConnectionClosed, match="verify failed"):
        async with tls_daemon.async_client(tls=True, tls_ca_file=pki.other_ca_file):
            pass


def test_stalled_and_garbage_handshakes_close_only_that_connection(
    tls_daemon: Daemon, pki: Pki
) -> None:
    with tls_daemon.client(tls=True, tls_ca_file=pki.ca_file) as healthy:
        silent = socket.create_connection((tls_daemon.host, tls_daemon.port), timeout=TIMEOUT)
        garbage = socket.create_connection((tls_daemon.host, tls_daemon.port), timeout=TIMEOUT)
        garbage.sendall(b"\x16\x03\x01\x00\x05hello-not-tls" * 10)
        start = time.monotonic()
        _read_until_closed(garbage)  # closed, perhaps after a TLS alert
        assert silent.recv(100) == b""  # no handshake within hello_timeout_secs: closed
        assert time.monotonic() - start < 10
        silent.close()
        garbage.close()
        assert healthy.ping() == "pong"
    log = tls_daemon.log()
    assert "TLS handshake failed" in log and "no TLS handshake within" in log


def _read_until_closed(s: socket.socket) -> None:
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass


def test_tls_client_to_plain_server_fails_cleanly(daemon: Daemon, pki: Pki) -> None:
    with pytest.raises(errors.ConnectionClosed, match="TLS handshake"):
        daemon.client(tls=True, tls_ca_file=pki.ca_file)
    with daemon.client() as c:
        assert c.ping() == "pong"


def test_client_certificate_required(mtls_daemon: Daemon, pki: Pki) -> None:
    good = {
        "tls": True,
        "tls_ca_file": pki.ca_file,
        "tls_cert_file": pki.client_cert,
        "tls_key_file": pki.client_key,
    }
    with mtls_daemon.client(**good) as c:
        assert c.ping() == "pong"
    # No client certificate, or one from a CA the server does not trust: the
    # server ends the handshake (with TLS 1.3 the client sees it on its first read).
    with pytest.raises(errors.ConnectionClosed):
        mtls_daemon.client(tls=True, tls_ca_file=pki.ca_file)
    with pytest.raises(errors.ConnectionClosed):
        mtls_daemon.client(
            tls=True,
            tls_ca_file=pki.ca_file,
            tls_cert_file=pki.rogue_client_cert,
            tls_key_file=pki.rogue_client_key,
        )
    with mtls_daemon.client(**good) as c:
        assert c.ping() == "pong"
    assert "TLS handshake failed" in mtls_daemon.log()


async def test_async_client_certificate(mtls_daemon: Daemon, pki: Pki) -> None:
    with trio.fail_after(TIMEOUT):
        async with mtls_daemon.async_client(
            tls=True,
            tls_ca_file=pki.ca_file,
            tls_cert_file=pki.client_cert,
            tls_key_file=pki.client_key,
        ) as c:
            assert await c.command("ping") == "pong"


def test_raw_tls_hello_and_password_not_logged(tls_daemon: Daemon, pki: Pki) -> None:
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    with (
        socket.create_connection((tls_daemon.host, tls_daemon.port), timeout=TIMEOUT) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s,
    ):
        s.sendall(msgpack.packb([0, 1, "hello", {"user": "admin", "password": ADMIN_PASSWORD}]))
        resp = read_response(s)
        assert resp is not None and resp[2] is None and resp[3]["user"] == "admin"
    assert ADMIN_PASSWORD not in tls_daemon.log()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"tls_cert_file": "/nonexistent/server.pem"}, "cannot load tls_cert_file"),
        ({"tls_key_file": "/nonexistent/server.key"}, "tls_cert_file is not"),
    ],
)
def test_unusable_tls_settings_stop_startup(
    tmp_path: Path, settings: dict[str, str], message: str
) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("[server]\n" + "".join(f'{k} = "{v}"\n' for k, v in settings.items()))
    cmd = [sys.executable, "-m", "tenantkv.server.cli", "serve", "--config", str(cfg)]
    r = subprocess.run(
        [*cmd, "--data-dir", str(tmp_path / "data"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists()  # refused before the data directory is touched
