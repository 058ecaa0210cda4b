"""``python -m bench gates`` end to end: a short GET run, its JSON checked.

Runs as a subprocess the way CI runs a benchmark, with a timeout
(tests/conftest.py drops the caller's ``TENANTKV_*`` variables). Beyond "both modes
served requests without errors", the server's own counters must show that the
on runs really went through every gate (throttle enabled and charging, the
request limiter admitting every operation, the connection limiter every
connection, probing on) and that the off runs bypassed the switchable ones (all
but the execution tickets).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_bench

RUN_TIMEOUT = 60.0
CONNS = 16  # the benchmark's default --conns


def test_bench_gates_quick_get(tmp_path: Path) -> None:
    out = tmp_path / "gates.json"
    # 1.5 s windows: a loaded 2-core machine once gave the generator no turn in
    # a 0.5 s one (a cell of 0 GETs), and each cell must show its gates at work.
    args = ["gates", "--quick", "--seconds", "1.5", "--warmup", "0.2", "--ops", "get"]
    proc = run_bench(*args, "--json", str(out), timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "on/off" in proc.stdout
    assert "verified: yes" in proc.stdout
    assert "NO OFF SWITCH" in proc.stdout

    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "gates"
    assert doc["meta"]["settings"]["reps"] == 1
    assert set(doc["gates"]) == {
        "tenant_throttle",
        "ingress_request_rate_limiter",
        "ingress_connection_establishment_limiter",
        "execution_tickets",
        "ingress_admission_tickets",
        "bucket_queues",
        "write_permits",
    }
    assert set(doc["no_off_switch"]) <= set(doc["gates"])

    # one off and one on run per cell (16 x 16 and 16 x 1), all clean
    cells = doc["cells"]
    assert sorted((c["depth"], c["mode"]) for c in cells) == [
        (1, "off"),
        (1, "on"),
        (16, "off"),
        (16, "on"),
    ]
    for c in cells:
        assert c["op"] == "get"
        assert c["ops_per_s"] > 0, c
        assert c["errors"] == 0, c
        assert c["verified"], c["problems"]
        ev = c["evidence"]
        ops = ev["server"]["ops"]
        assert ops >= c["ops"] > 0
        assert ev["server_errors"] == 0
        on = c["mode"] == "on"
        assert ev["tenant_throttle"]["enabled"] == [on, on]
        assert ev["tenant_throttle"]["units_charged"] >= ops  # metering runs either way
        assert ev["tenant_throttle"]["throttled"] == 0
        assert ev["tenant_throttle"]["rejected"] == 0
        req = ev["ingress_request_rate_limiter"]
        conn = ev["ingress_connection_establishment_limiter"]
        assert req["enabled"] == [on, on]
        assert conn["enabled"] == [on, on]
        assert req["rejected"] == conn["rejected"] == 0
        if on:
            assert req["admitted"] == ops
            assert conn["admitted"] >= CONNS
            assert ev["execution_tickets"]["probing"] != "fixed"
        else:
            assert req["attempted"] == conn["attempted"] == 0
            assert ev["execution_tickets"]["probing"] == "fixed"
        # the execution tickets (no off switch) see every operation in both modes; the
        # ingress tickets and bucket queues every one when on, none when off; never a wait
        assert ev["execution_tickets"]["admitted"] >= ops
        for gate in ("execution_tickets", "ingress_admission_tickets", "bucket_queues"):
            assert ev[gate]["queued"] == 0, gate
        for gate in ("ingress_admission_tickets", "bucket_queues"):
            assert ev[gate]["enabled"] == [on, on], gate
            assert (ev[gate]["admitted"] >= ops) if on else (ev[gate]["admitted"] == 0), gate
        assert ev["write_permits"]["enabled"] == [on, on]

    (s,) = [x for x in doc["summary"] if x["depth"] == 16]
    assert s["op"] == "get"
    assert s["conns"] == CONNS
    assert s["ops_per_s_off"] > 0
    assert s["ops_per_s_on"] > 0
    assert s["errors_off"] == s["errors_on"] == 0
    assert s["ratio_on_over_off"] > 0
    assert s["server_cpu_us_per_op_on"] > 0
    assert s["verified"]

    ver = doc["verification"]
    assert ver["verified"], ver["problems"]
    assert ver["problems"] == []
    assert ver["on"]["tenant_throttle"]["enabled"] == [True]
    assert ver["off"]["tenant_throttle"]["enabled"] == [False]
    assert ver["on"]["execution_tickets"]["probing"] == ["stable"]
    assert ver["off"]["execution_tickets"]["probing"] == ["fixed"]
    assert ver["on"]["ingress_request_rate_limiter"]["admitted"] == ver["on"]["server"]["ops"]
    assert doc["machine"]["runs"] == len(cells)
