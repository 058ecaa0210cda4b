"""``python -m bench crash`` end to end: a short run of SIGKILL cycles, its JSON checked.

Runs as a subprocess the way CI and the benchmark harness run it, with a
timeout (tests/conftest.py drops the caller's ``TENANTKV_*`` variables).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_bench

RUN_TIMEOUT = 60.0


def test_bench_crash_quick_loses_no_acknowledged_write(tmp_path: Path) -> None:
    out = tmp_path / "crash.json"
    args = ["crash", "--quick", "--cycles", "2", "--run-seconds", "0.5", "--json", str(out)]
    proc = run_bench(*args, timeout=RUN_TIMEOUT)
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
