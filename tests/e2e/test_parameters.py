"""Runtime server parameters: set_parameter / get_parameter and the CLI's param-set/param-get."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon


def test_get_and_set_a_runtime_parameter(daemon: Daemon) -> None:
    with daemon.client() as c:
        p = c.command("get_parameter", name="throttle_max_wait_ms")
        assert p["value"] == 5000 and p["runtime"] is True and p["default"] == 5000
        r = c.command("set_parameter", name="throttle_max_wait_ms", value=1500)
        assert (r["old"], r["new"]) == (5000, 1500)
        assert c.server_status()["throttle"]["node"]["throttle_max_wait_ms"] == 1500
        r = c.command("set_parameter", name="throttle_max_wait_ms", value=None)
        assert r["new"] == 5000
        names = {p["name"] for p in c.command("get_parameter")}
        assert {"port", "idle_timeout_secs", "log_level"} <= names


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("port", 1234, "cannot change at runtime"),
        ("no_such", 1, "unknown setting 'no_such'"),
        ("idle_timeout_secs", -1, ">= 0"),
        ("log_level", "loud", "one of"),
        ("max_connections", "many", "type int"),
    ],
)
def test_bad_parameters_are_refused(daemon: Daemon, name: str, value: object, message: str) -> None:
    with daemon.client() as c, pytest.raises(errors.BadValue, match=message):
        c.command("set_parameter", name=name, value=value)


def test_parameters_need_admin(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("params")
        c.create_user("param-user", "pw", roles={"params": "readwrite"})
    user = daemon.client(user="param-user", password="pw", bucket="params")
    with user as u, pytest.raises(errors.Unauthorized):
        u.command("get_parameter", name="log_level")


def test_parameter_persists_across_restart(fresh_daemon: Daemon) -> None:
    with fresh_daemon.client() as c:
        c.command("set_parameter", name="idle_timeout_secs", value=120)
    fresh_daemon.stop()
    # New ports: the test is about the data directory, not the port, and on a busy
    # machine another process may take the old port before the restart binds it.
    fresh_daemon.port = fresh_daemon.resp_port = 0
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        assert c.command("get_parameter", name="idle_timeout_secs")["value"] == 120.0
        c.command("set_parameter", name="idle_timeout_secs", value=None)
        assert c.command("get_parameter", name="idle_timeout_secs")["value"] == 3600.0
    assert "idle_timeout_secs=120" in fresh_daemon.log()


def test_cli_param_set_and_get(daemon: Daemon) -> None:
    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "admin.cli",
                "--port",
                str(daemon.port),
                "--password",
                ADMIN_PASSWORD,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    r = admin("param-set", "max_inflight_per_connection", "256")
    assert r.returncode == 0 and "1024 -> 256" in r.stdout, r.stderr
    r = admin("--json", "param-get", "max_inflight_per_connection")
    assert json.loads(r.stdout)["value"] == 256
    r = admin("param-get")
    assert r.returncode == 0 and "max_inflight_per_connection" in r.stdout
    assert admin("param-set", "max_inflight_per_connection", "--reset").returncode == 0
    r = admin("param-set", "port", "80")
    assert r.returncode == 1 and "cannot change at runtime" in r.stderr
    assert admin("param-set", "log_level").returncode == 2


def test_gates_can_be_switched_off_at_runtime(daemon: Daemon) -> None:
    """bucket_queue_enabled, write_permit_enabled, ingress_admission_controller_enabled:
    a gate switched off is skipped (its counters stand still) and can come back."""
    switches = (
        "bucket_queue_enabled",
        "write_permit_enabled",
        "ingress_admission_controller_enabled",
    )
    with daemon.client() as c:
        c.create_bucket("sw")
        c.select_bucket("sw")
        for name in switches:
            c.command("set_parameter", name=name, value=False)
        try:
            before = c.server_status()
            for i in range(20):
                c.set(f"k{i}", b"v")
                assert c.get(f"k{i}") == b"v"
            after = c.server_status()
            assert after["bucket_queues"]["enabled"] is False
            assert after["write_permits"]["enabled"] is False
            assert after["ingress"]["admission"]["enabled"] is False
            admitted = after["ingress"]["admission"]["new_admissions"]
            # only the status calls themselves (exempt admin work) moved it, if anything
            assert admitted - before["ingress"]["admission"]["new_admissions"] < 40
        finally:
            for name in switches:
                c.command("set_parameter", name=name, value=None)
        assert c.server_status()["bucket_queues"]["enabled"] is True
        c.set("again", b"v")
