"""deploy/tenantkv.service against the daemon: what ``systemctl reload`` runs
reloads the config, and the unit's hardening score (where systemd-analyze is)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Daemon, wait_until

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "tenantkv.service"


def unit_lines(key: str) -> list[str]:
    lines = UNIT.read_text().splitlines()
    return [x.removeprefix(f"{key}=") for x in lines if x.startswith(f"{key}=")]


def test_exec_reload_reloads_the_config(tmp_path: Path) -> None:
    """The unit's ExecReload, run as systemd runs it ($MAINPID: the ready file's pid),
    applies the config file's changed runtime settings."""
    (reload,) = unit_lines("ExecReload")
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("idle_timeout_secs = 300\n")
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        pid = json.loads((tmp_path / "ready-data.json").read_text())["pid"]
        assert d.proc is not None and pid == d.proc.pid
        cfg.write_text("idle_timeout_secs = 450\n")
        argv = shlex.split(reload.replace("$MAINPID", str(pid)))
        assert subprocess.run(argv, timeout=10).returncode == 0
        with d.client() as c:
            wait_until(
                lambda: c.command("get_parameter", name="idle_timeout_secs")["value"] == 450,
                timeout=10,
                what="the reloaded setting",
            )
        assert "SIGHUP: config reloaded" in d.log()
        assert d.proc.poll() is None  # reloaded, not stopped
    finally:
        d.kill()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_hardening_exposure_is_at_most_3() -> None:
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    if m is None:  # an older systemd-analyze (no --offline): nothing to read
        pytest.skip(f"systemd-analyze security --offline unavailable: {proc.stderr.strip()}")
    assert float(m[1]) <= 3.0, proc.stdout
