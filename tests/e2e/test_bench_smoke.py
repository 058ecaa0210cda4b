"""The benchmark harness as CI's regression guard.

``python -m bench smoke`` runs the smoke scenarios for a second or two each
against real daemons and checks their results are sane (bench/sanity.py);
the report must render from those results; and the committed
docs/benchmarks.md must be what the committed results give.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import goals, harness, publish
from tests.conftest import run_bench

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return run_bench(*args, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``bench smoke`` run for the module: its results folder. (The crash
    scenario's checks read the smoke's crash run rather than run it again.)"""
    out = tmp_path_factory.mktemp("smoke") / "results"
    r = bench("smoke", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "results are sane" in r.stdout
    return out


@pytest.mark.slow
def test_smoke_runs_and_report_renders(smoke_out: Path, tmp_path: Path) -> None:
    out = smoke_out
    smoke = {s.name for s in harness.SCENARIOS if s.smoke is not None}
    written = {p.stem for p in out.glob("*.json")}
    assert written == smoke
    env = json.loads((out / "crash.json").read_text())
    assert env["mode"] == "smoke"
    assert env["command"].startswith("python -m bench crash")
    assert env["versions"]["tenantkv"]
    assert env["result"]["summary"]["lost"] == 0

    doc = tmp_path / "benchmarks.md"
    r = bench("report", "--results", str(out), "--out", str(doc), "--plots", str(tmp_path))
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "## Targets" in text
    assert "0 acknowledged writes lost" in text
    # a smoke figure is labelled as such, never passed off as a published one
    assert "(smoke run)" in text
    assert "Not run yet: `python -m bench run soak --publish`" in text


@pytest.mark.slow
def test_smoke_crash_cycles_lose_no_acknowledged_write(smoke_out: Path) -> None:
    """``bench crash --quick --cycles 2 --run-seconds 0.5`` (the smoke's flags):
    its printed verdict and its JSON, cycle by cycle."""
    env = json.loads((smoke_out / "crash.json").read_text())
    assert env["command"].endswith("crash --quick --cycles 2 --run-seconds 0.5")
    assert env["exit_code"] == 0
    assert "target: 0 acknowledged writes lost over all crash cycles: MET" in env["printed"]
    doc = env["result"]
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


def test_list_names_every_scenario() -> None:
    r = bench("list")
    assert r.returncode == 0, r.stderr
    for s in harness.SCENARIOS:
        assert s.name in r.stdout


def test_unknown_scenario_is_a_usage_error() -> None:
    r = bench("run", "no-such-scenario")
    assert r.returncode == 2
    assert "unknown scenario 'no-such-scenario'" in r.stderr


def test_every_goal_is_measured_by_a_known_scenario() -> None:
    for g in goals.GOALS:
        if g.scenario is None:
            assert g.tests, g.anchor
        else:
            assert g.scenario in harness.BY_NAME, g.anchor
            assert g.measure is not None


def test_benchmarking_doc_lists_every_scenario() -> None:
    text = (ROOT / "docs" / "benchmarking.md").read_text()
    for s in harness.SCENARIOS:
        assert f"| `{s.name}` |" in text, s.name


def test_published_page_matches_committed_results() -> None:
    if not publish.load_results(harness.RESULTS_DIR):
        pytest.skip("no published results committed yet")
    r = bench("report", "--check")
    assert r.returncode == 0, r.stdout + r.stderr


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = heading.strip().lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in " -_").replace(" ", "-")


def test_readme_claims_point_at_rows_that_exist() -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    if not doc.exists():
        pytest.skip("docs/benchmarks.md not generated yet")
    text = doc.read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    anchors |= {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    links = re.findall(r"docs/benchmarks\.md#([\w-]+)", (ROOT / "README.md").read_text())
    assert links, "the README's performance claims link to docs/benchmarks.md"
    missing = [a for a in links if a not in anchors]
    assert not missing, f"README links to anchors docs/benchmarks.md lacks: {missing}"
