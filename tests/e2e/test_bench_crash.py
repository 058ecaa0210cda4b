"""``python -m bench crash`` end to end: a short run of SIGKILL cycles, its JSON checked.

Runs as a subprocess the way CI and the benchmark harness run it, with a
timeout, and an environment without the caller's ``TENANTKV_*`` variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 60.0


def test_bench_crash_quick_loses_no_acknowledged_write(tmp_path: Path) -> None:
    out = tmp_path / "crash.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTKV_")}
    cmd = [sys.executable, "-m", "bench", "crash", "--quick", "--cycles", "2"]
    proc = subprocess.run(
        [*cmd, "--run-seconds", "0.5", "--json", str(out)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "target: 0 acknowledged writes lost over all crash cycles: MET" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "crash"
    assert doc["meta"]["settings"]["cycles"] == 2
    summary = doc["summary"]
    assert summary["lost"] == 0
    assert summary["corrupt"] == 0
    assert summary["acknowledged"] > 0
    assert summary["in_flight_survived"] <= summary["in_flight"]
    assert summary["restart_ms_max"] > 0
    assert summary["final_check"]["lost"] == 0
    assert summary["final_check"]["keys"] > 0
    assert len(doc["cycles"]) == 2
    for row in doc["cycles"]:
        assert row["acknowledged"] > 0
        assert row["lost"] == 0
        assert row["restart_ms"] > 0
        assert sum(row["acknowledged_by_kind"].values()) == row["acknowledged"]
    assert doc["lost_writes"] == []
