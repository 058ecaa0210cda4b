"""``python -m bench workers`` and ``python -m bench throttle --workers 2``, end to end.

The workers benchmark drives the RESP port with ``redis-benchmark`` (Debian's
``redis-tools``); CI machines may not have it, so that test skips without it.
Windows are tiny: this guards the harness (a supervisor and its workers
started and stopped, CPU summed over every server process, ops per commit and
the per-worker split read from the node's status, the ratios and the JSON
shape), not the speed — 2 workers on a busy CI machine prove nothing about
scaling.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_bench


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=timeout)


def test_workers_quick_compares_one_and_two_workers(tmp_path: Path) -> None:
    if shutil.which("redis-benchmark") is None:
        pytest.skip("redis-benchmark is not installed (Debian: apt-get install redis-tools)")
    out = tmp_path / "workers.json"
    # bench()'s timeout bounds the quick run (a loaded machine makes it slower)
    # 1 s windows: on a loaded machine a 0.3 s one once saw no request completed
    # (the generator's processes were not run in it).
    r = bench("workers", "--quick", "--seconds", "1", "--keys", "500", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "workers"
    assert [(c["door"], c["op"], c["conns"], c["depth"]) for c in doc["cells"]] == [
        ("resp", "get", 16, 64),
        ("resp", "set", 16, 64),
        ("msgpack", "get", 16, 64),
        ("msgpack", "set", 16, 64),
    ]
    for c in doc["cells"]:
        # The MessagePack load counts what completes inside its window; a durable SET
        # waits for its commit's fsync, and on a disk that other test suites kept busy
        # one commit outlasted a 1 s window (0 ops/s, no error): such a cell has no
        # rate, commit size, split or ratio to check.
        stalled = c["door"] == "msgpack" and any(
            c["workers"][n]["ops_per_s"] == 0 for n in ("1", "2")
        )
        if stalled:
            assert c["op"] == "set", c  # (only a write waits for the disk)
        for n, procs in (("1", 1), ("2", 3)):  # 2 workers: the supervisor and two workers
            s = c["workers"][n]
            assert s["errors"] == 0, (c["door"], c["op"], n, s["error_sample"])
            assert [r["processes"] for r in s["rounds"]] == [procs]
            if stalled:
                continue
            # The CPU figure is reported; its size is the bench's to judge: a loaded run
            # once read 0.0 over a quick window (whole clock ticks of /proc).
            assert s["ops_per_s"] > 0 and s["server_us_per_op"] is not None
            assert (s["ops_per_commit"] is not None) == (c["op"] == "set")
            if n == "2":
                # both workers' shares are read from the node's status and add up
                assert len(s["worker_share_pct"]) == 2
                assert abs(sum(s["worker_share_pct"]) - 100) < 1
        if stalled:
            continue
        assert c["ratios"]["2"]["ops_per_s"] > 0
        assert c["ratios"]["2"]["server_us_per_op"] > 0
        assert (c["ratios"]["2"]["ops_per_commit"] is not None) == (c["op"] == "set")
        if c["door"] == "msgpack":
            assert c["workers"]["1"]["client_cpu_pct"] > 0  # the generator's CPU is reported
    assert [ch["figure"] for ch in doc["checks"]] == [
        "GET 16x64: ops/s 2 ÷ 1 workers",
        "GET 16x64: CPU/op 2 ÷ 1 workers",
        "SET 16x64: ops/s 2 ÷ 1 workers",
        "SET 16x64: ops/commit 2 ÷ 1 workers",
        "MessagePack SET 16x64: ops/s 2 ÷ 1 workers",
        "MessagePack SET 16x64: CPU/op 2 ÷ 1 workers",
    ]
    assert "| RESP GET | 16x64 | 2 |" in r.stdout
    assert "ops/s ÷ 1 worker" in r.stdout
    assert "targets (issue 19)" in r.stdout


def test_workers_list_must_start_with_the_single_process() -> None:
    r = bench("workers", "--workers-list", "2,1")
    assert r.returncode == 2
    assert "1 first" in r.stderr


def test_throttle_hard_limit_holds_with_two_workers(tmp_path: Path) -> None:
    out = tmp_path / "hl.json"
    args = ["throttle", "--scenario", "hard-limit", "--workers", "2", "--quick"]
    r = bench(*args, "--seconds", "2", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["settings"]["workers"] == 2
    (s,) = doc["scenarios"]
    assert s["client"]["errors"] == 0, s["client"]["error_sample"]
    # A 2 s window on a shared CI machine: sane, not the ±3 % of the published run.
    # Above the limit is what the limit promises never to let through. Below it
    # is lost throughput, and a loaded machine causes some: a worker not
    # scheduled for a few hundred ms leaves its share of the limit unused (its
    # counter refills at most a slice's worth), and the other worker may not
    # spend it (a loaded run read 1,756, -12 %). The lower bound still catches a
    # split that strands a worker's share (1,000: half the limit).
    achieved, limit = s["server"]["units_per_s"], s["settings"]["hard_limit"]
    assert 0.7 * limit <= achieved <= 1.1 * limit, s
    assert "serve --workers 2" in r.stdout
