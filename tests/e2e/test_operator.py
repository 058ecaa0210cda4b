"""The operator's tools against a real daemon: metrics and their docs, the Grafana
dashboard, ``tenantkv-admin top`` and ``status``, audit logs without secrets,
backup and restore. CLI tools run as subprocesses, the way operators run them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenantkv import errors
from tenantkv.server.commands import COMMANDS
from tests.conftest import ADMIN_PASSWORD, Daemon

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 30.0
APP_PASSWORD = "app-Secret-4471"


def run_cli(
    module: str, *args: str, daemon: Daemon | None = None, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE [--host H --port N] ARGS`` with the admin password in the
    environment, stdin from /dev/null."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTKV_")}
    env["TENANTKV_PASSWORD"] = ADMIN_PASSWORD
    target = [] if daemon is None else ["--host", daemon.host, "--port", str(daemon.port)]
    return subprocess.run(
        [sys.executable, "-m", module, *target, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def admin(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("admin.cli", *args, daemon=daemon)


def tenantkv_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("tenantkv.server.cli", *args)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc.stdout


@contextlib.contextmanager
def load(daemon: Daemon, bucket: str, *, password: str = APP_PASSWORD) -> Iterator[list[Any]]:
    """Sets and gets on ``bucket`` from a thread until the block ends; yields
    [operations done, errors seen]."""
    stop = threading.Event()
    stats: list[Any] = [0, []]

    def work() -> None:
        with daemon.client(user="app", password=password, bucket=bucket) as c:
            i = 0
            while not stop.is_set():
                try:
                    c.set(f"load:{i % 50}", b"v" * 300)
                    c.get(f"load:{i % 50}")
                    stats[0] += 2
                except errors.TenantKVError as exc:
                    stats[1].append(exc)
                i += 1

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while stats[0] < 20 and t.is_alive():  # under way before the block starts
            time.sleep(0.01)
        yield stats
    finally:
        stop.set()
        t.join(20)


@pytest.fixture(scope="module")
def mdaemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with metrics, a bucket with limits, a user and some traffic."""
    d = Daemon(
        tmp_path_factory.mktemp("operator") / "data", extra_args=["--metrics-port", "0"]
    ).start()
    with d.client() as c:
        c.create_bucket("op-a", reserved=500, hard_limit=100000)
        c.create_bucket("op-b")
        c.create_user("app", APP_PASSWORD, roles={"op-a": "readwrite", "op-b": "readwrite"})
        c.select_bucket("op-a")
        for i in range(20):
            c.set(f"k{i}", b"x" * 100)
            c.get(f"k{i}")
        with contextlib.suppress(errors.KeyExists):
            c.set("k0", b"again", mode="add")  # an error, so op_errors has a series
    yield d
    d.kill()


def scrape(d: Daemon) -> str:
    assert d.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def families(text: str) -> dict[str, str]:
    """Metric family name -> type, from the ``# TYPE`` lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def series_names(text: str) -> set[str]:
    """Every name a query may use: sample names, and each family's own series."""
    names = {m for m in re.findall(r"^([a-zA-Z_:][\w:]*)", text, re.M)}
    for name, typ in families(text).items():
        names.add(name)
        if typ == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


# -- metrics ------------------------------------------------------------------------------


def test_a_live_scrape_exports_exactly_what_is_declared(mdaemon: Daemon) -> None:
    from tenantkv.metric_catalog import METRICS

    text = scrape(mdaemon)
    fams = families(text)
    ours = {n for n in fams if n.startswith("tenantkv_")}
    base = {n.removesuffix("_total") if fams[n] == "counter" else n for n in ours}
    assert base == {m.name for m in METRICS}
    # the standard process collector rides along
    standard = {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"}
    assert standard <= set(fams)
    samples = [x.rsplit(" ", 1)[0] for x in text.splitlines() if x and not x.startswith("#")]
    assert not [s for s, n in Counter(samples).items() if n > 1], "duplicate series"
    doc = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(tenantkv_\w+)` \|", doc, re.M))
    assert {
        b + "_total" if b + "_total" in ours or fams.get(b) == "counter" else b for b in base
    } == (documented)
    assert 'tenantkv_build_info{lmdb="' in text
    assert not [x for x in text.splitlines() if x.endswith(" -1.0")]  # no -1 for unlimited
    # per-bucket series exist for the bucket made above
    assert 'tenantkv_ops_total{bucket="op-a",operation="set"} 20.0' in text
    assert 'tenantkv_op_errors_total{bucket="op-a",code_name="KeyExists"} 1.0' in text


def test_healthz(mdaemon: Daemon) -> None:
    url = f"http://127.0.0.1:{mdaemon.metrics_port}/healthz"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200 and r.read() == b"ok\n"


def test_dashboard_queries_only_exported_metrics(mdaemon: Daemon) -> None:
    dash = json.loads((REPO / "deploy" / "grafana" / "tenantkv.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", []) if t.get("expr")]
    assert len(exprs) > 30
    queried = {n for e in exprs for n in re.findall(r"\btenantkv_\w+", e)}
    exported = series_names(scrape(mdaemon))
    assert not sorted(queried - exported), "the dashboard queries metrics nobody exports"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for topic in ("reservation", "gate", "ticket", "probing", "lag", "permits", "latency"):
        assert topic in titles, topic
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance", "bucket"} <= variables


# -- top and status ---------------------------------------------------------------------------


def test_top_once_json_under_load(mdaemon: Daemon) -> None:
    with load(mdaemon, "op-b") as stats:
        proc = admin(mdaemon, "top", "--once", "--json", "--interval", "0.5")
    frame = json.loads(ok(proc))
    assert not stats[1], stats[1][:3]
    assert 0.3 < frame["interval_secs"] < 5
    rows = {r["bucket"]: r for r in frame["buckets"]}
    assert set(rows) >= {"op-a", "op-b"}
    b = rows["op-b"]
    assert b["ops_per_sec"] > 10 and b["units_per_sec"] > 0
    assert (rows["op-a"]["reserved"], rows["op-a"]["hard_limit"]) == (500, 100000)
    assert b["throttled_per_sec"] == 0 and b["rejected_per_sec"] == 0
    assert frame["node"]["commits_per_sec"] > 0
    with mdaemon.client() as c:
        wired = "latency" in c.server_status()
    if wired:  # session.py records op latency: p99 over the interval
        assert b["p99_ms"] is not None and 0 < b["p99_ms"] < 5000
    else:
        assert b["p99_ms"] is None
    assert frame["buckets"][0]["bucket"] == "op-b"  # busiest first


def test_top_on_a_terminal_redraws_and_quits_on_q(mdaemon: Daemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENANTKV_")}
    env.update(TENANTKV_PASSWORD=ADMIN_PASSWORD, COLUMNS="160", LINES="40")
    master, slave = pty.openpty()
    argv = ["-m", "admin.cli", "--port", str(mdaemon.port), "top", "--interval", "0.2"]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=REPO,
    )
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 20
        while b"UNITS/S" not in out and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                out += os.read(master, 65536)
        assert b"UNITS/S" in out and b"q quits" in out, out[-2000:]
        os.write(master, b"q")
        assert proc.wait(10) == 0
        with contextlib.suppress(OSError):
            while select.select([master], [], [], 0.2)[0]:
                out += os.read(master, 65536)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert b"\x1b[?1049h" in out and b"\x1b[?1049l" in out  # alternate screen, restored


def test_status_is_readable_with_every_section(mdaemon: Daemon) -> None:
    admin(mdaemon, "bucket-queue-set", "op-a", "write", "--concurrency", "16")
    text = ok(admin(mdaemon, "status"))
    for title in ("throttle", "ingress", "bucket_queues", "write_permits", "execution"):
        assert f"\n{title}\n" in text, title
    lines = text.splitlines()
    assert any(re.match(r"\s+BUCKET\s+CLASS\s+CONCURRENCY", x) for x in lines)
    assert any(re.match(r"\s+op-a\s+write\s+16\*", x) for x in lines)
    assert any(re.match(r"\s+BUCKET\s+CAPACITY\s+IN_USE", x) for x in lines)
    assert any("READ TICKETS" in x and "WRITE TICKETS" in x for x in lines)
    assert not [x for x in lines if "buckets.op-a." in x]  # no dotted per-bucket dumps
    assert max(len(x) for x in lines) < 200


# -- logs -----------------------------------------------------------------------------------

#: Admin commands that change nothing; every other admin command must write an audit line.
READ_ONLY_ADMIN = {
    "list_buckets",
    "list_users",
    "server_status",
    "GetNodeThrottleProperties",
    "GetBucketThrottleProperties",
    "get_parameter",
    "watch_events",
}


def test_admin_changes_are_audited_and_no_secret_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENANTKV_LOG_FORMAT", "json")  # a setting from the environment
    d = Daemon(
        tmp_path / "data", extra_args=["--log-level", "debug", "--enable-test-commands"]
    ).start()
    try:
        secret = "New-User-Pw-9931"
        secret2 = "Changed-User-Pw-4417"
        done: set[str] = set()
        with d.client() as c:
            c.create_bucket("aud")
            done.add("create_bucket")
            ok(admin(d, "user-create", "auditee", "--role", "aud=read", "--user-password", secret))
            done.add("create_user")
            with pytest.raises(errors.AuthenticationFailed):
                d.client(user="auditee", password="Wrong-Guess-123", bucket="aud").ping()
            with d.client(user="auditee", password=secret, bucket="aud") as u:
                u.ping()
            c.command("update_user", name="auditee", roles={"aud": "readwrite"}, password=secret2)
            done.add("update_user")
            c.set_node_throttle({"capacity": 50000})
            done.add("SetNodeThrottleProperties")
            c.set_bucket_throttle("aud", {"reserved": 10})
            done.add("SetBucketThrottleProperties")
            c.command("set_parameter", name="throttle_max_wait_ms", value=4000)
            done.add("set_parameter")
            c.command("set_bucket_queue", bucket="aud", **{"class": "read"}, concurrency=8)
            done.add("set_bucket_queue")
            c.command("configure_fail_point", name="failCommand", mode="off")
            done.add("configure_fail_point")
            c.command("backup", path=str(tmp_path / "bk"))
            done.add("backup")
            c.delete_user("auditee")
            done.add("delete_user")
            c.delete_bucket("aud")
            done.add("delete_bucket")
            for name, params in (
                ("cluster_rebalance", {}),
                ("cluster_node_remove", {"name": "n2"}),
            ):
                with pytest.raises(errors.BadValue, match="in no cluster"):
                    c.command(name, **params)  # (audited, then refused: a single node)
                done.add(name)
    finally:
        d.stop()
    changing = {n for n, cmd in COMMANDS.items() if cmd.kind == "admin"} - READ_ONLY_ADMIN
    assert changing == done, f"audit (and test) these admin commands: {changing - done}"

    text = d.log()
    for word in (secret, secret2, "Wrong-Guess-123", ADMIN_PASSWORD):
        assert word not in text
    records = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any(r["level"] == "DEBUG" for r in records)
    audit = [r["message"] for r in records if r["logger"] == "tenantkv.audit"]
    who = re.compile(r"user 'admin' from 127\.0\.0\.1:\d+")
    expected = {
        "create_bucket": "created bucket 'aud'",
        "create_user": "created user {'name': 'auditee'",
        "SetNodeThrottleProperties": "SetNodeThrottleProperties {",
        "SetBucketThrottleProperties": "SetBucketThrottleProperties 'aud'",
        "set_parameter": "set_parameter throttle_max_wait_ms: 5000 -> 4000",
        "set_bucket_queue": "set_bucket_queue {'bucket': 'aud'",
        "configure_fail_point": "configure_fail_point",
        "backup": "backup to ",
        "update_user": "updated user 'auditee' (roles, password)",
        "delete_user": "deleted user 'auditee'",
        "delete_bucket": "deleted bucket 'aud'",
        "cluster_rebalance": "asked for a rebalance",
        "cluster_node_remove": "asked to remove node 'n2'",
    }
    assert set(expected) == done
    for command, what in expected.items():
        lines = [m for m in audit if what in m]
        assert lines, f"no audit line for {command}: {audit}"
        assert all(who.search(m) for m in lines), lines
    assert any(" -> " in m for m in audit if "SetNodeThrottleProperties" in m)  # old -> new


# -- backup and restore ----------------------------------------------------------------------


def test_backup_refuses_bad_destinations(mdaemon: Daemon, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("x")
    with mdaemon.client() as c:
        for path, message in (
            ("relative/dir", "must be absolute"),
            (str(full), "is not empty"),
            (str(full / "something"), "not a directory"),
            (str(tmp_path / "no" / "parent"), "cannot create"),
        ):
            with pytest.raises(errors.BadValue, match=message):
                c.command("backup", path=path)
    assert (full / "something").read_text() == "x"
    assert not (tmp_path / "no").exists()


def test_backup_under_load_then_restore_into_a_new_server(tmp_path: Path) -> None:
    src = Daemon(tmp_path / "src").start()
    try:
        with src.client() as c:
            c.create_bucket("orders", reserved=300, hard_limit=9000)
            c.create_user("app", APP_PASSWORD, roles={"orders": "readwrite"})
            c.set_node_throttle({"capacity": 40000, "default_throttle_reserved_units": 7})
            c.command("set_parameter", name="throttle_max_wait_ms", value=2500)
            c.select_bucket("orders")
            with c.pipeline() as p:
                for i in range(500):
                    p.set(f"before:{i}", f"value {i}".encode())
        backup_dir = tmp_path / "backups" / "one"
        (tmp_path / "backups").mkdir()
        with load(src, "orders") as stats:
            out = ok(admin(src, "--json", "backup", str(backup_dir)))
            during = stats[0]
        result = json.loads(out)
        assert not stats[1], stats[1][:3]  # traffic went on, unharmed
        assert stats[0] > during or during > 0
        assert result["path"] == str(backup_dir) and result["bytes"] > 0
        assert result["duration_secs"] >= 0
        assert (backup_dir / "data.mdb").stat().st_size == result["bytes"]
        manifest = json.loads((backup_dir / "tenantkv-backup.json").read_text())
        assert manifest["bytes"] == result["bytes"]
        # the destination is now taken
        again = admin(src, "backup", str(backup_dir))
        assert again.returncode == 1 and "BadValue" in again.stderr and "not empty" in again.stderr
    finally:
        src.stop()

    restored = tmp_path / "restored"
    out = ok(tenantkv_cmd("restore", str(backup_dir), "--data-dir", str(restored)))
    assert f"into {restored}" in out and "1 buckets" in out and "2 users" in out
    refused = tenantkv_cmd("restore", str(backup_dir), "--data-dir", str(restored))
    assert refused.returncode == 1 and "not empty" in refused.stderr and "--force" in refused.stderr
    ok(tenantkv_cmd("restore", str(backup_dir), "--data-dir", str(restored), "--force"))

    dst = Daemon(restored).start()
    try:
        with dst.client(user="app", password=APP_PASSWORD, bucket="orders") as app:
            assert app.get("before:0") == b"value 0"
            assert app.get("before:499") == b"value 499"
        with dst.client() as c:
            assert c.get_bucket_throttle("orders") == {"reserved": 300, "hard_limit": 9000}
            node = c.get_node_throttle()
            assert (node["capacity"], node["default_throttle_reserved_units"]) == (40000, 7)
            assert c.command("get_parameter", name="throttle_max_wait_ms")["value"] == 2500
            assert {u["name"] for u in c.list_users()} == {"admin", "app"}
            # a server holds the directory: restoring over it is refused, even with --force
            busy = tenantkv_cmd("restore", str(backup_dir), "--data-dir", str(restored), "--force")
            assert busy.returncode == 1 and "stop it" in busy.stderr
    finally:
        dst.kill()


def test_restore_refuses_what_is_not_a_backup(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    p = tenantkv_cmd("restore", str(empty), "--data-dir", str(tmp_path / "d1"))
    assert p.returncode == 1 and "not a tenantkv backup" in p.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(os.urandom(8192))
    p = tenantkv_cmd("restore", str(junk), "--data-dir", str(tmp_path / "d2"))
    assert p.returncode == 1 and "LMDB" in p.stderr
    assert not (tmp_path / "d2" / "data.mdb").exists()
    p = tenantkv_cmd("restore", str(junk))
    assert p.returncode == 2 and "--data-dir" in p.stderr
