"""``tenantkv-admin`` against a real daemon, run as a subprocess the way operators run it.

Every run gets stdin from /dev/null (never a terminal, so nothing can prompt),
an environment without the caller's ``TENANTKV_*`` variables, and a timeout.
Each test uses its own bucket and user names: the daemon is shared by the module.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tenantkv
from admin import cli
from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 30.0


def admin(
    daemon: Daemon | None,
    *args: str,
    password: str | None = ADMIN_PASSWORD,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m admin.cli [--host H --port N] ARGS``; the admin password
    travels in $TENANTKV_PASSWORD unless ``password`` is None."""
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTKV_")}
    if password is not None:
        run_env["TENANTKV_PASSWORD"] = password
    run_env.update(env or {})
    target = [] if daemon is None else ["--host", daemon.host, "--port", str(daemon.port)]
    return subprocess.run(
        [sys.executable, "-m", "admin.cli", *target, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=run_env,
        cwd=REPO,
        timeout=RUN_TIMEOUT,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def failed(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The one stderr line of a run that failed with exit status ``code``."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    return proc.stderr.strip().splitlines()[-1]


def table_rows(text: str) -> list[list[str]]:
    """Rows of a printed table, header first, split on runs of spaces."""
    return [line.split() for line in text.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- buckets ------------------------------------------------------------------------------


def test_bucket_create_list_delete(daemon: Daemon) -> None:
    assert ok(admin(daemon, "bucket-create", "cli-orders")) == "created bucket 'cli-orders'\n"
    with daemon.client(bucket="cli-orders") as c:
        for i in range(3):
            c.set(f"k{i}", b"v")

    rows = table_rows(ok(admin(daemon, "bucket-list")))
    assert rows[0] == ["NAME", "ENTRIES"]
    assert ["cli-orders", "3"] in rows[1:]

    listed = json.loads(ok(admin(daemon, "--json", "bucket-list")))
    assert {"name": "cli-orders", "entries": 3} in listed
    # --json may also follow the subcommand
    assert json.loads(ok(admin(daemon, "bucket-list", "--json"))) == listed

    assert ok(admin(daemon, "bucket-delete", "cli-orders", "--yes")) == (
        "deleted bucket 'cli-orders'\n"
    )
    names = [b["name"] for b in json.loads(ok(admin(daemon, "--json", "bucket-list")))]
    assert "cli-orders" not in names


def test_bucket_create_and_delete_json(daemon: Daemon) -> None:
    assert json.loads(ok(admin(daemon, "--json", "bucket-create", "cli-json"))) == {
        "name": "cli-json",
        "reserved": 0,
        "hard_limit": "unlimited",
    }
    assert json.loads(ok(admin(daemon, "--json", "bucket-delete", "--yes", "cli-json"))) is True


def test_duplicate_bucket_is_bucket_exists(daemon: Daemon) -> None:
    ok(admin(daemon, "bucket-create", "cli-dup"))
    line = failed(admin(daemon, "bucket-create", "cli-dup"), 1)
    assert line == "tenantkv-admin: BucketExists: bucket 'cli-dup' already exists"


def test_delete_unknown_bucket_is_bucket_not_found(daemon: Daemon) -> None:
    line = failed(admin(daemon, "bucket-delete", "--yes", "cli-never"), 1)
    assert line == "tenantkv-admin: BucketNotFound: bucket 'cli-never' does not exist"


def test_bucket_delete_without_a_terminal_needs_yes(daemon: Daemon) -> None:
    ok(admin(daemon, "bucket-create", "cli-keep"))
    line = failed(admin(daemon, "bucket-delete", "cli-keep"), 2)
    assert "--yes" in line
    with daemon.client() as c:
        assert "cli-keep" in [b["name"] for b in c.list_buckets()]


# -- users --------------------------------------------------------------------------------


def test_user_with_roles_reaches_only_its_buckets(daemon: Daemon) -> None:
    for b in ("cli-mine", "cli-ro", "cli-other"):
        ok(admin(daemon, "bucket-create", b))
    out = admin(
        daemon,
        "user-create",
        "cli-app",
        "--role",
        "cli-mine=readwrite",
        "--role",
        "cli-ro=read",
        env={"TENANTKV_NEW_USER_PASSWORD": "app-pw"},
    )
    assert ok(out) == (
        "created user 'cli-app' (admin: no, unthrottled: no, "
        "roles: cli-mine=readwrite, cli-ro=read)\n"
    )

    with daemon.client(user="cli-app", password="app-pw", bucket="cli-mine") as c:
        c.set("k", b"v")
        assert c.get("k") == b"v"
        c.select_bucket("cli-ro")
        assert c.get("k") is None
        with pytest.raises(errors.Unauthorized):
            c.set("k", b"v")  # read role only
        with pytest.raises(errors.Unauthorized):
            c.select_bucket("cli-other")
    with pytest.raises(errors.Unauthorized):
        daemon.client(user="cli-app", password="app-pw", bucket="cli-other")
    with pytest.raises(errors.AuthenticationFailed):
        daemon.client(user="cli-app", password="wrong", bucket="cli-mine")


def test_user_list_and_delete(daemon: Daemon) -> None:
    ok(admin(daemon, "bucket-create", "cli-ul"))
    created = admin(
        daemon,
        "--json",
        "user-create",
        "cli-ops",
        "--unthrottled",
        "--role",
        "cli-ul=read",
        "--user-password",
        "ops-pw",
    )
    expected = {"name": "cli-ops", "admin": False, "unthrottled": True, "roles": {"cli-ul": "read"}}
    assert json.loads(ok(created)) == expected

    rows = table_rows(ok(admin(daemon, "user-list")))
    assert rows[0] == ["NAME", "ADMIN", "UNTHROTTLED", "ROLES"]
    assert ["admin", "yes", "no", "-"] in rows[1:]
    assert ["cli-ops", "no", "yes", "cli-ul=read"] in rows[1:]
    assert expected in json.loads(ok(admin(daemon, "--json", "user-list")))

    assert ok(admin(daemon, "user-delete", "cli-ops")) == "deleted user 'cli-ops'\n"
    names = [u["name"] for u in json.loads(ok(admin(daemon, "--json", "user-list")))]
    assert "cli-ops" not in names
    with pytest.raises(errors.AuthenticationFailed):
        daemon.client(user="cli-ops", password="ops-pw", bucket="cli-ul")
    line = failed(admin(daemon, "user-delete", "cli-ops"), 1)
    assert line.startswith("tenantkv-admin: UserNotFound: ")


# -- status and ping ------------------------------------------------------------------------


def test_status(daemon: Daemon) -> None:
    ok(admin(daemon, "bucket-create", "cli-st"))
    with daemon.client(bucket="cli-st") as c:
        c.set("a", b"1")
        c.set("b", b"2")
        c.get("a")
        text = ok(admin(daemon, "status"))
    lines = text.splitlines()
    for title in ("server", "connections", "storage", "buckets"):
        assert title in lines
    assert any(line.split()[:2] == ["version", tenantkv.__version__] for line in lines)
    assert any(line.split()[:1] == ["writer.ops_committed"] for line in lines)
    bucket_rows = table_rows(text[text.index("\nbuckets\n") :])
    assert bucket_rows[1] == ["NAME", "ENTRIES", "CONNECTIONS", "OPS", "ERRORS"]
    # entries 2, the client above connected, 3 ops, no errors
    assert ["cli-st", "2", "1", "3", "0"] in bucket_rows

    doc = json.loads(ok(admin(daemon, "--json", "status")))
    assert doc["version"] == tenantkv.__version__
    assert doc["connections"]["current"] >= 1
    assert doc["buckets"]["cli-st"]["entries"] == 2


def test_status_and_start_log_name_every_port(tmp_path: Path) -> None:
    """The MessagePack, RESP and metrics ports: in the start log and in status."""
    d = Daemon(tmp_path / "data", extra_args=["--metrics-port", "0"]).start()
    try:
        assert d.metrics_port
        log = d.log()
        assert f"listening on {d.host}:{d.port}" in log
        assert f"RESP (Redis protocol) front door on {d.host}:{d.resp_port}" in log
        assert f"metrics on http://127.0.0.1:{d.metrics_port}/metrics" in log
        doc = json.loads(ok(admin(d, "--json", "status")))
        assert doc["listening"] == f"{d.host}:{d.port}"
        assert doc["resp_listening"] == f"{d.host}:{d.resp_port}"
        assert doc["metrics_listening"] == f"127.0.0.1:{d.metrics_port}"
        server = table_rows(ok(admin(d, "status")).split("\n\n")[0])
        assert server[0] == ["server"]
        assert ["listening", f"{d.host}:{d.port}"] in server
        assert ["resp_listening", f"{d.host}:{d.resp_port}"] in server
        assert ["metrics_listening", f"127.0.0.1:{d.metrics_port}"] in server
    finally:
        d.kill()


def test_readme_names_the_sections_status_prints(daemon: Daemon) -> None:
    """README's tour lists status's sections by the titles status prints."""
    readme = (REPO / "README.md").read_text()
    m = re.search(r"tenantkv-admin status +# sections: (.*?)\n(?!\s+#)", readme, re.S)
    assert m, "README's status line lists the sections"
    named = [w for w in re.split(r"[\s,#]+", m[1]) if w]
    text = ok(admin(daemon, "status"))
    titles = [b.splitlines()[0] for b in text.split("\n\n") if b and not b[0].isspace()]
    assert named == titles


def test_ping(daemon: Daemon) -> None:
    assert ok(admin(daemon, "ping")).startswith(f"pong from {daemon.host}:{daemon.port} ")
    assert json.loads(ok(admin(daemon, "--json", "ping"))) == "pong"


def test_environment_gives_defaults_and_flags_win(daemon: Daemon) -> None:
    env = {"TENANTKV_HOST": daemon.host, "TENANTKV_PORT": str(daemon.port)}
    ok(admin(None, "ping", env={**env, "TENANTKV_USER": "admin"}))
    # --port beats a $TENANTKV_PORT where nothing listens; --password beats the env
    ok(
        admin(
            None,
            "--port",
            str(daemon.port),
            "--password",
            ADMIN_PASSWORD,
            "ping",
            password="wrong",
            env={**env, "TENANTKV_PORT": str(free_port())},
        )
    )


def test_global_options_may_follow_the_subcommand(daemon: Daemon) -> None:
    """As a newcomer types them: the connection options after the subcommand."""
    where = ["--host", daemon.host, "--port", str(daemon.port), "--user", "admin"]
    out = ok(admin(None, "ping", *where, "--password", ADMIN_PASSWORD, "--timeout", "5"))
    assert out.startswith(f"pong from {daemon.host}:{daemon.port} ")
    # from the environment for the password, --json after as well
    assert json.loads(ok(admin(None, "ping", *where, "--json"))) == "pong"
    # split around the subcommand; what follows it wins where both give one
    proc = admin(None, "--port", str(free_port()), "--host", daemon.host, "ping", "--port")
    assert proc.returncode == 2  # --port without a value is still a usage error
    ok(admin(None, "--port", str(free_port()), "ping", "--port", str(daemon.port)))
    # a value given before the subcommand is kept when none follows it
    ok(admin(None, "--port", str(daemon.port), "--password", ADMIN_PASSWORD, "ping", password=None))


def test_resp_port_is_named_as_such(daemon: Daemon) -> None:
    """tenantkv-admin pointed at the RESP port says which port to use, at once
    (not after the RESP door's hello timeout, and not as an undecodable reply)."""
    assert daemon.resp_port
    started = time.monotonic()
    line = failed(admin(None, "--port", str(daemon.resp_port), "status"), 1)
    assert line == (
        "tenantkv-admin: MalformedReply: this looks like the RESP (Redis protocol) port; "
        f"tenantkv-admin and tenantkv.Client talk to the MessagePack port {daemon.port}"
    )
    # the hello timeout is 10 s: the answer came before it (bound for a loaded machine)
    assert time.monotonic() - started < RUN_TIMEOUT
    with pytest.raises(errors.MalformedReply, match=f"MessagePack port {daemon.port}$"):
        tenantkv.Client(daemon.host, daemon.resp_port, user="admin", password=ADMIN_PASSWORD)


def test_no_unthrottled_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["user-update", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-unthrottled its requests are throttled like any user's" in text
    assert "make it not" not in text


# -- errors ---------------------------------------------------------------------------------


def test_wrong_admin_password_is_authentication_failed(daemon: Daemon) -> None:
    line = failed(admin(daemon, "bucket-list", password="not-the-password"), 1)
    assert line == "tenantkv-admin: AuthenticationFailed: unknown user or wrong password"


def test_nothing_listening_is_a_connection_error() -> None:
    port = free_port()
    proc = admin(None, "--host", "127.0.0.1", "--port", str(port), "--timeout", "5", "status")
    line = failed(proc, 1)
    assert line.startswith(f"tenantkv-admin: ConnectFailed: cannot connect to 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bucket-explode"], "invalid choice: 'bucket-explode'"),
        ([], "required: SUBCOMMAND"),
        (["user-create", "u1", "--role", "cli-x"], "expected BUCKET=read or BUCKET=readwrite"),
        (["user-create", "u1", "--role", "cli-x=write"], "got 'cli-x=write'"),
        (["user-create", "u1", "--role", "=read"], "expected BUCKET=read"),
        (["bucket-create", "b1", "--reserved", "-5"], "non-negative integer or 'unlimited'"),
        (["bucket-create", "b1", "--hard-limit", "lots"], "non-negative integer or 'unlimited'"),
        (["--port", "99999", "status"], "port must be 1-65535"),
        (["set-node-throttle", "{not json"], "not valid JSON"),
        (["user-create", "u1", "--password", "pw"], "with --user-password"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    line = failed(admin(None, *args), 2)
    assert line.startswith("tenantkv-admin")
    assert message in line


def test_missing_admin_password_without_a_terminal_exits_2(daemon: Daemon) -> None:
    line = failed(admin(daemon, "bucket-list", password=None), 2)
    assert "--password" in line
    assert "TENANTKV_PASSWORD" in line
    assert "terminal" in line


def test_missing_new_user_password_without_a_terminal_exits_2(daemon: Daemon) -> None:
    line = failed(admin(daemon, "user-create", "cli-nopw"), 2)
    assert "--user-password" in line
    assert "TENANTKV_NEW_USER_PASSWORD" in line
    with daemon.client() as c:
        assert "cli-nopw" not in [u["name"] for u in c.list_users()]


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    # In-process: main() returns the status instead of exiting.
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    for spec in cli.SUBCOMMANDS:
        assert spec.name in top
        assert cli.main([spec.name, "--help"]) == 0
        text = capsys.readouterr().out
        assert f"usage: tenantkv-admin {spec.name}" in text
        assert spec.description.split()[0] in text
        assert "examples:\n  tenantkv-admin" in text


def test_global_password_reaches_user_create_and_user_update(daemon: Daemon) -> None:
    """The global --password used to be overwritten by user-create's hidden option."""
    pw = ["--password", ADMIN_PASSWORD]
    ok(admin(daemon, *pw, "bucket-create", "gp", password=None))
    ok(
        admin(
            daemon,
            *pw,
            "user-create",
            "gp-user",
            "--role",
            "gp=read",
            "--user-password",
            "x1",
            password=None,
        )
    )
    ok(admin(daemon, *pw, "user-update", "gp-user", "--role", "gp=readwrite", password=None))
    with daemon.client(user="gp-user", password="x1", bucket="gp") as c:
        c.set("k", b"v")  # the new role applies
    ok(admin(daemon, *pw, "user-delete", "gp-user", password=None))
    ok(admin(daemon, *pw, "bucket-delete", "gp", "--yes", password=None))
