"""``python -m bench attack-resp``, end to end on a real daemon, in small: this
guards the harness (the tenants' set-up, the raw-socket attacker, the JSON
shape) and the figures that do not depend on the machine's speed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_bench


def test_attack_resp_runs_and_gets_no_internal_error(tmp_path: Path) -> None:
    out = tmp_path / "attack-resp.json"
    r = run_bench(
        "attack-resp",
        "--parts",
        "keys-range,del",
        "--seconds",
        "1.5",
        "--attackers",
        "1",
        "--json",
        str(out),
        timeout=90,
    )
    assert "attack-resp: del" in r.stderr + r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    for part in ("keys-range", "del"):
        fig = doc[part]
        assert fig["attack_requests"] > 0, fig
        assert fig["internal_error_replies"] == 0, fig
        assert fig["rss_growth_mib"] <= 256, fig
