"""Test failpoints (configure_fail_point), only with --enable-test-commands."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenantkv import errors
from tests.conftest import Daemon


@pytest.fixture(scope="module")
def testing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("fp") / "data", extra_args=["--enable-test-commands"])
    d.start()
    with d.client() as c:
        c.create_bucket("fp")
    yield d
    d.kill()


def test_fail_command_times_then_recovers(testing: Daemon) -> None:
    with testing.client(bucket="fp", max_overload_retries=0) as c:
        c.set("k", b"v")
        c.command(
            "configure_fail_point",
            name="failCommand",
            mode={"times": 2},
            data={"failCommands": ["get"], "errorCode": 25, "retryAfterMs": 7},
        )
        for _ in range(2):
            with pytest.raises(errors.Throttled) as info:
                c.get("k")
            assert info.value.retry_after_ms == 7
            assert info.value.labels == errors.OVERLOAD_LABELS
        assert c.get("k") == b"v"


def test_fail_command_with_custom_labels_and_off(testing: Daemon) -> None:
    with testing.client(bucket="fp") as c:
        c.command(
            "configure_fail_point",
            name="failCommand",
            mode="alwaysOn",
            data={"failCommands": ["set"], "errorCode": 1, "errorLabels": ["Custom"]},
        )
        with pytest.raises(errors.InternalError) as info:
            c.set("x", b"v")
        assert info.value.labels == ("Custom",)
        assert c.get("x") is None  # the failed set never ran
        c.command("configure_fail_point", name="failCommand", mode="off")
        c.set("x", b"v")


def test_block_time_delays_the_command(testing: Daemon) -> None:
    with testing.client(bucket="fp") as c:
        c.command(
            "configure_fail_point",
            name="failCommand",
            mode={"times": 1},
            data={"failCommands": ["ping"], "blockTimeMS": 300},
        )
        start = time.monotonic()
        assert c.ping() == "pong"
        assert time.monotonic() - start >= 0.25


@pytest.mark.parametrize(
    "args, message",
    [
        ({"name": "other", "mode": "off"}, "unknown failpoint"),
        ({"name": "failCommand", "mode": {"times": 0}, "data": {"failCommands": ["get"]}}, "mode"),
        ({"name": "failCommand", "mode": "alwaysOn", "data": {"failCommands": []}}, "failCommands"),
        (
            {
                "name": "failCommand",
                "mode": "alwaysOn",
                "data": {"failCommands": ["get"], "errorCode": 999},
            },
            "errorCode",
        ),
        (
            {"name": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["get"]}},
            "errorCode",
        ),
    ],
)
def test_bad_failpoint_configuration(testing: Daemon, args: dict, message: str) -> None:
    with testing.client() as c, pytest.raises(errors.BadValue, match=message):
        c.command("configure_fail_point", **args)


def test_refused_without_the_flag(daemon: Daemon) -> None:
    refused = pytest.raises(errors.UnknownCommand, match="--enable-test-commands")
    with daemon.client() as c, refused:
        c.command("configure_fail_point", name="failCommand", mode="off")


def test_test_commands_flag_in_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("enable_test_commands = true\n")
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        with d.client() as c:
            assert c.command("configure_fail_point", name="failCommand", mode="off")
    finally:
        d.kill()
