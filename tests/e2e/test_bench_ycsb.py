"""``python -m bench ycsb`` end to end: a self-started daemon, workloads A and E, --json."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_bench

RUN_TIMEOUT = 90.0


def test_ycsb_quick_run_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "ycsb.json"
    proc = run_bench(
        *("ycsb", "--quick", "--workloads", "A,E", "--distributions", "zipfian"),
        *("--seconds", "0.5", "--warmup", "0.1", "--json", str(out)),
        timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "ycsb"
    assert doc["meta"]["settings"]["records"] == 1000
    assert doc["ratios"] == []
    cells = doc["cells"]
    assert [(c["server"], c["workload"], c["distribution"]) for c in cells] == [
        ("tenantkv", "A", "zipfian"),
        ("tenantkv", "E", "zipfian"),
    ]
    for c in cells:
        assert c["ops_per_s"] > 0, c
        assert c["errors"] == 0, c
        assert c["undrained"] == 0, c
        assert c["p50_us"] is not None and c["p50_us"] <= c["p99_us"] <= c["p999_us"]
    assert "ycsb:" in proc.stdout and "E  zipfian" in proc.stdout
