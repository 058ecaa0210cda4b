"""``serve --workers N``: one server from outside, made of N worker processes.

Every test talks to a real supervisor and real workers on a loopback port. A
connection lands on whatever worker the kernel picks, so tests that must reach
every worker open connections until ``whoami`` has named each one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

import tenantkv
from tenantkv.errors import TenantKVError
from tests.conftest import Daemon, wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _worker_pids(d: Daemon) -> list[int]:
    with d.client() as c:
        return [w["pid"] for w in c.command("server_status")["workers"]]


def _clients_on_every_worker(d: Daemon, n: int, **kw: Any) -> dict[int, Any]:
    """A client connected to each of the ``n`` workers (``whoami`` says which)."""
    found: dict[int, Any] = {}
    spare = []
    for _ in range(200):
        c = d.client(**kw)
        w = c.command("whoami").get("worker", 0)
        if w in found:
            spare.append(c)
        else:
            found[w] = c
        if len(found) == n:
            break
    for c in spare:
        c.close()
    assert len(found) == n, f"connections reached workers {sorted(found)} only"
    return found


@pytest.fixture(scope="module")
def workers2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("workers") / "data", extra_args=["--workers", "2"]).start()
    yield d
    d.kill()


@pytest.mark.parametrize("n", [1, 2])
def test_one_port_one_state_whatever_worker_a_connection_lands_on(tmp_path: Path, n: int) -> None:
    d = Daemon(tmp_path / "data", extra_args=["--workers", str(n)]).start()
    try:
        with d.client() as admin:
            admin.command("create_bucket", name="shop")
            admin.command("create_user", name="app", password="app-pw", roles={"shop": "readwrite"})
            status = admin.command("server_status")
        if n > 1:
            assert [w["worker"] for w in status["workers"]] == list(range(n))
            assert status["pid"] == d.proc.pid  # the supervisor: the process to signal
        else:
            assert "workers" not in status
        # Writes through any worker are read back through every other.
        clients = _clients_on_every_worker(d, n, user="app", password="app-pw", bucket="shop")
        for w, c in clients.items():
            c.set(f"k{w}".encode(), f"from worker {w}".encode())
        for c in clients.values():
            for w in clients:
                assert c.get(f"k{w}".encode()) == f"from worker {w}".encode()
        cas = {c.set(b"same", b"x") for c in clients.values() for _ in range(20)}
        assert len(cas) == 20 * n, "CAS values are unique across workers"
        for c in clients.values():
            c.close()
        assert d.stop() == 0
        assert "stopped" in d.log()
    finally:
        d.kill()


def test_a_change_on_one_worker_is_seen_by_the_others_at_once(workers2: Daemon) -> None:
    """A command that changes shared state answers once every worker has it: read
    your writes on any connection, no waiting."""
    admin = _clients_on_every_worker(workers2, 2)
    try:
        admin[0].command("create_bucket", name="fresh")
        admin[0].command("create_user", name="u", password="pw1", roles={"fresh": "read"})
        assert "u" in {u["name"] for u in admin[1].command("list_users")}
        assert "fresh" in {b["name"] for b in admin[1].command("list_buckets")}
        with workers2.client(user="u", password="pw1", bucket="fresh") as c:
            assert c.get(b"k") is None
        admin[1].command("SetBucketThrottleProperties", bucket="fresh", json='{"hard_limit": 777}')
        assert admin[0].command("GetBucketThrottleProperties", bucket="fresh")["hard_limit"] == 777
        admin[1].command("set_parameter", name="idle_timeout_secs", value=1234)
        assert admin[0].command("get_parameter", name="idle_timeout_secs")["value"] == 1234
        # A password changed on one worker: the old one fails on every worker.
        admin[1].command("update_user", name="u", password="pw2")
        assert _login_fails(workers2, "u", "pw1", "fresh")
        # Dropped and re-created: a new tenant; the old user has no role on it anywhere.
        admin[0].command("delete_bucket", name="fresh")
        admin[0].command("create_bucket", name="fresh")
        for _ in range(8):
            with (
                pytest.raises(TenantKVError),
                workers2.client(user="u", password="pw2", bucket="fresh") as c,
            ):
                c.get(b"k")
    finally:
        for c in admin.values():
            c.close()


def _login_fails(d: Daemon, user: str, password: str, bucket: str) -> bool:
    for _ in range(6):
        try:
            with d.client(user=user, password=password, bucket=bucket):
                return False
        except TenantKVError:
            pass
    return True


@dataclass
class Load:
    """What a closed-loop GET load through every worker got: admitted per second,
    the workers it reached, the refusals (each checked by ``refused``)."""

    rate: float
    workers: set[int]
    refusals: list[TenantKVError]


def _get_load(
    d: Daemon,
    conns: int,
    secs: float,
    refused: Callable[[TenantKVError], bool],
    workers: int = 2,
    **client: Any,
) -> Load:
    """``conns`` connections GET as fast as they are let for ``secs``; a refusal
    ``refused`` accepts is counted and retried after a short pause (any other
    fails the test), ``whoami`` included. The kernel spreads connections over
    the workers at random, so more are opened (up to 64) until one reaches each
    of the ``workers``: all of ``conns`` on one worker is a 1-in-128 chance."""
    admitted = 0
    seen: set[int] = set()
    refusals: list[TenantKVError] = []

    async def call(c: Any, name: str) -> Any:
        while True:
            try:
                return await (c.command("whoami") if name == "whoami" else c.get(b"k"))
            except TenantKVError as exc:
                assert refused(exc), exc
                refusals.append(exc)
                await trio.sleep(0.005)

    async def hammer(c: Any, deadline: float) -> None:
        nonlocal admitted
        while trio.current_time() < deadline:
            await call(c, "get")
            admitted += 1

    async def main() -> float:
        async with contextlib.AsyncExitStack() as stack:
            clients: list[Any] = []
            for _ in range(conns + 64):
                if len(clients) >= conns and len(seen) >= workers:
                    break
                c = await stack.enter_async_context(
                    d.async_client(max_overload_retries=0, **client)
                )
                worker = (await call(c, "whoami")).get("worker", 0)
                if len(clients) < conns or worker not in seen:
                    clients.append(c)
                    seen.add(worker)
            start = trio.current_time()
            async with trio.open_nursery() as n:
                for c in clients:
                    n.start_soon(hammer, c, start + secs)
            return trio.current_time() - start

    took = trio.run(main)
    return Load(admitted / took, seen, refusals)


def test_hard_limit_holds_for_the_node_across_workers(workers2: Daemon) -> None:
    with workers2.client() as admin:
        # 100/s, not 1,000: twelve clients on a loaded 2-core machine were seen
        # driving only 205 requests/s, too few to reach a limit of 1,000.
        admin.command("create_bucket", name="capped", hard_limit=100)
        admin.command("create_user", name="cap", password="cap-pw", roles={"capped": "read"})

    def throttled(exc: TenantKVError) -> bool:
        # A non-blocking refusal with its hint, whichever worker said it.
        hint = exc.retry_after_ms
        return exc.code_name == "Throttled" and hint is not None and 0 < hint <= 1000

    load = _get_load(
        workers2,
        12,
        3.0,
        throttled,
        user="cap",
        password="cap-pw",
        bucket="capped",
        nonblocking_throttle=True,
    )
    assert load.workers == {0, 1}, "the load reached both workers"
    # One slice of burst per worker plus the provisional share at the start. Only
    # the ceiling is asserted: a loaded machine drives fewer requests, never more
    # (a floor failed at 683/s run after a benchmark); the precise figure (±3 %)
    # is the benchmark's (python -m bench throttle --workers 2).
    assert load.rate <= 125, load.rate
    assert load.refusals, "the limit was reached: some requests were refused"


def test_connection_limits_are_the_nodes(workers2: Daemon) -> None:
    with workers2.client() as admin:
        admin.command("set_parameter", name="max_connections", value=8)
        admin.command("set_parameter", name="admin_reserved_connections", value=0)
        try:
            # Connections of earlier tests leave the node's table once their
            # workers have told the supervisor (a one-way message each).
            wait_until(
                lambda: admin.command("server_status")["connections"]["table"]["current"] == 1,
                timeout=5,
                what="only this connection in the table",
            )
            held = []
            refused = 0
            for _ in range(20):
                try:
                    held.append(workers2.client())
                except TenantKVError as exc:
                    assert exc.code_name == "TooManyConnections"
                    refused += 1
            assert len(held) == 7, "8 node-wide, this admin connection included"
            assert refused == 13
            status = admin.command("server_status")
            assert status["connections"]["table"]["current"] == 8
            assert status["connections"]["table"]["refused_node_full"] >= 13
            for c in held:
                c.close()
        finally:
            admin.command("set_parameter", name="max_connections", value=None)
            admin.command("set_parameter", name="admin_reserved_connections", value=None)


def test_the_ingress_request_rate_is_the_nodes(workers2: Daemon) -> None:
    """Each worker runs a share of the node's request rate; the shares add up to
    the rate, so both workers together admit what one process would."""
    with workers2.client() as admin:
        admin.command("create_bucket", name="rated")
        admin.command("create_user", name="r", password="r-pw", roles={"rated": "read"})
        admin.command("set_parameter", name="ingress_request_admission_rate_per_sec", value=300)
        admin.command(
            "set_parameter", name="ingress_request_admission_burst_capacity_secs", value=0.1
        )
        admin.command("set_parameter", name="ingress_request_rate_limiter_enabled", value=True)
    try:
        load = _get_load(
            workers2,
            8,
            3.0,
            lambda exc: exc.code_name == "IngressRequestRateLimitExceeded",
            user="r",
            password="r-pw",
            bucket="rated",
        )
    finally:
        with workers2.client() as admin:
            for name in (
                "ingress_request_rate_limiter_enabled",
                "ingress_request_admission_rate_per_sec",
                "ingress_request_admission_burst_capacity_secs",
            ):
                admin.command("set_parameter", name=name, value=None)
    assert load.workers == {0, 1}, "the load reached both workers"
    # One process would admit 300/s plus a 30-request burst; a worker's idle
    # floor and one slice of lag on the shares allow a little more, never twice.
    # Only the ceiling is asserted: a loaded machine drives fewer requests, never
    # more; the refusals show the node's limit was reached.
    assert load.rate <= 400, load.rate
    assert load.refusals, "the limit was reached: some requests were refused"


def test_login_failures_are_counted_for_the_node(tmp_path: Path) -> None:
    """The supervisor holds the node's login limiter: the delay a failure earns
    grows over both workers together, and each failure is counted once."""
    cfg = tmp_path / "t.toml"
    cfg.write_text("login_delay_ms = 20\nlogin_delay_max_ms = 2000\n")
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2", "--config", str(cfg)]).start()
    try:
        with d.client() as admin:
            admin.command("create_user", name="victim", password="right", roles={})
        outcomes, held = [], []
        for _ in range(8):
            t0 = time.monotonic()
            try:
                tenantkv.Client(d.host, d.port, user="victim", password="wrong").close()
            except TenantKVError as exc:
                outcomes.append(exc.code_name)
            held.append(time.monotonic() - t0)
        # A client that waits its answers is never refused; the holds double
        # (20, 40, ... 2560 -> 2000 ms) whichever worker took the connection.
        # Only lower bounds: a loaded machine adds to a hold, never takes from it
        # (a run held the 6th failure 2.6 s against its 0.64). Counted per worker,
        # the 8th hold would be at most 160 ms; counted twice, the failures below
        # would not be 8.
        assert outcomes == ["AuthenticationFailed"] * 8
        assert held[-1] >= 2.0 and held[-3] >= 0.64
        with d.client() as admin:
            auth = admin.command("server_status")["authentication"]
        assert auth["failures"] == 8, "each failure counted once for the node"
        assert 8 < auth["hashes"] <= 8 + 2  # and the admin's logins (one may be cached)
    finally:
        d.kill()


def test_a_crashed_worker_is_restarted_while_the_others_serve(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2"]).start()
    try:
        before = _worker_pids(d)
        os.kill(before[1], signal.SIGKILL)
        # Served meanwhile: by worker 0, or by 1 once back (a connection hashed to
        # worker 1's socket waits in its backlog, which the supervisor holds, until
        # the new worker takes it: 19 s at load 27, hence the generous timeouts).
        with d.client(timeout=90.0) as c:
            c.command("create_bucket", name="b")
        wait_until(
            lambda: (p := _worker_pids(d)) and len(p) == 2 and p[1] != before[1],
            timeout=90,
            what="worker 1 restarted",
        )
        assert _worker_pids(d)[0] == before[0]
        assert "worker 1 exited with signal SIGKILL; restarting it" in d.log()
        assert d.stop() == 0
        assert not any(_alive(p) for p in _worker_pids_gone(before))
    finally:
        d.kill()


def _worker_pids_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return pids


def test_acknowledged_writes_survive_kill_9_of_a_worker_and_of_the_supervisor(
    tmp_path: Path,
) -> None:
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2"]).start()
    try:
        with d.client() as admin:
            admin.command("create_bucket", name="durable")
        clients = _clients_on_every_worker(d, 2, bucket="durable")
        for w, c in clients.items():
            for i in range(100):
                c.set(f"w{w}-{i}".encode(), b"v")
        pids = _worker_pids(d)
        os.kill(pids[0], signal.SIGKILL)
        for c in clients.values():
            c.close()
        assert d.proc is not None
        d.proc.kill()  # the supervisor, without a word
        d.proc.wait(10)
        # The workers notice their supervisor is gone and stop; then the data
        # directory's lock is free for the next server.
        _worker_pids_gone(pids)
        assert not any(_alive(p) for p in pids)
        d.start()
        with d.client(bucket="durable") as c:
            for w in (0, 1):
                for i in range(100):
                    assert c.get(f"w{w}-{i}".encode()) == b"v"
    finally:
        d.kill()


def test_pipelined_runs_answer_each_write_in_its_place_and_survive_kill_9(
    tmp_path: Path,
) -> None:
    """A pipeline's writes reach the node's writer as runs (one item, by field):
    each write gets its own result or error, in order, and each acknowledged one
    is durable across kill -9 of the supervisor."""
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2"]).start()
    try:
        with d.client() as admin:
            admin.command("create_bucket", name="runs")
        clients = _clients_on_every_worker(d, 2, bucket="runs")
        for w, c in clients.items():
            c.set(f"w{w}-taken".encode(), b"first")
            p = c.pipeline(raise_on_error=False)
            for i in range(300):
                if i % 100 == 50:
                    p.add(f"w{w}-taken".encode(), b"again")  # fails: exists
                else:
                    p.set(f"w{w}-{i}".encode(), f"v{i}".encode(), flags=i)
            results = p.execute()
            failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
            assert failed == [50, 150, 250]
            assert all(isinstance(results[i], tenantkv.errors.KeyExists) for i in failed)
            cas = [r for r in results if not isinstance(r, BaseException)]
            assert cas == sorted(cas) and len(set(cas)) == 297  # applied in order
        for c in clients.values():
            c.close()
        pids = _worker_pids(d)
        assert d.proc is not None
        d.proc.kill()  # the supervisor, without a word
        d.proc.wait(10)
        assert not any(_alive(p) for p in _worker_pids_gone(pids))
        d.start()
        with d.client(bucket="runs") as c:
            for w in (0, 1):
                assert c.get(f"w{w}-taken".encode()) == b"first"
                for i in range(300):
                    if i % 100 != 50:
                        record = c.get_record(f"w{w}-{i}".encode())
                        assert (record.value, record.flags) == (f"v{i}".encode(), i)
    finally:
        d.kill()


def test_the_data_directory_stays_locked_against_a_second_server(workers2: Daemon) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tenantkv.server.cli",
            "serve",
            "--data-dir",
            str(workers2.data_dir),
            "--port",
            "0",
            "--resp-port",
            "0",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert "another process" in out.stderr


@pytest.mark.parametrize("n", [1, 2])
def test_sighup_reloads_the_config_file_in_every_worker(tmp_path: Path, n: int) -> None:
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("idle_timeout_secs = 300\n")
    d = Daemon(tmp_path / "data", extra_args=["--workers", str(n), "--config", str(cfg)]).start()
    try:
        with d.client() as admin:  # a setting set at runtime outlives the reload
            admin.command("set_parameter", name="frame_timeout_secs", value=7)
        cfg.write_text("idle_timeout_secs = 450\nframe_timeout_secs = 9\nbad = 1\n")
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)  # an unknown key: refused, nothing changes
        wait_until(lambda: "config not reloaded" in d.log(), timeout=5, what="refusal")
        cfg.write_text("idle_timeout_secs = 450\nframe_timeout_secs = 9\n")
        d.proc.send_signal(signal.SIGHUP)
        clients = _clients_on_every_worker(d, n)
        for c in clients.values():
            wait_until(
                lambda c=c: c.command("get_parameter", name="idle_timeout_secs")["value"] == 450,
                timeout=5,
                what="reloaded setting",
            )
            assert c.command("get_parameter", name="frame_timeout_secs")["value"] == 7
            c.close()
        assert "SIGHUP: config reloaded" in d.log()
    finally:
        d.kill()


def test_metrics_are_the_nodes_totals(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2", "--metrics-port", "0"]).start()
    try:
        with d.client() as admin:
            admin.command("create_bucket", name="m")
        clients = _clients_on_every_worker(d, 2, bucket="m")
        for c in clients.values():
            for i in range(25):
                c.set(b"k%d" % i, b"v")
        for c in clients.values():
            c.close()
        text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics").read()
        lines = text.decode().splitlines()
        ops = [ln for ln in lines if ln.startswith('tenantkv_ops_total{bucket="m"')]
        total = sum(float(ln.rsplit(" ", 1)[1]) for ln in ops if 'operation="set"' in ln)
        assert total == 50, ops
        with d.client() as admin:
            status = admin.command("server_status")
        assert sum(w["ops"] for w in status["workers"]) >= 50
        assert json.dumps(status)  # one plain document
    finally:
        d.kill()


def _sets(status: dict[str, Any], bucket: str) -> int:
    return int(status["buckets"][bucket]["ops"].get("set", 0))


def _status(d: Daemon) -> dict[str, Any]:
    with d.client() as admin:
        return dict(admin.command("server_status"))


def test_node_counters_keep_a_killed_workers_counts(tmp_path: Path) -> None:
    """A worker killed and restarted from zero takes nothing off the node's
    counters: the supervisor keeps its last counts. Each worker dies after its
    clients' writes were acknowledged and counted (a kill under load loses at
    most what the worker counted since the supervisor last read it: node_figures),
    so the node's SET count equals the acknowledged SETs exactly."""
    d = Daemon(tmp_path / "data", extra_args=["--workers", "2", "--metrics-port", "0"]).start()
    try:
        with d.client() as admin:
            admin.command("create_bucket", name="kept")
        acked, wu = 0, 0
        for kill in range(4):
            clients = _clients_on_every_worker(d, 2, bucket="kept")
            for w, c in clients.items():
                for i in range(10):  # (each a durable write the node's count must keep)
                    c.set(f"{kill}-{w}-{i}".encode(), b"v" * 100)
                    acked += 1
            for c in clients.values():
                c.close()
            before = _status(d)
            assert _sets(before, "kept") == acked
            assert before["throttle"]["node"]["wu_total"] >= wu
            wu = before["throttle"]["node"]["wu_total"]
            dead = _worker_pids(d)[kill % 2]
            os.kill(dead, signal.SIGKILL)
            wait_until(
                lambda dead=dead: (p := _worker_pids(d)) and len(p) == 2 and dead not in p,
                timeout=20,
                what=f"worker {kill % 2} restarted",
            )
            after = _status(d)
            assert _sets(after, "kept") == acked, f"after kill {kill + 1}"
            assert after["throttle"]["node"]["wu_total"] == wu
            latency = after["latency"]["buckets"]["kept"]["set"]
            assert latency["count"] == acked  # the dead workers' histograms kept too
            assert latency["p50_micros"] <= latency["p99_micros"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics").read()
        line = 'tenantkv_ops_total{bucket="kept",operation="set"}'
        scraped = [ln for ln in text.decode().splitlines() if ln.startswith(line)]
        assert [float(ln.rsplit(" ", 1)[1]) for ln in scraped] == [acked]
    finally:
        d.kill()


def _throttled_node(d: Daemon) -> dict[str, Any]:
    with d.client() as admin:
        admin.set_node_throttle({"capacity": 3000})
        admin.command("create_bucket", name="capped", reserved=1000, hard_limit=1000)
        admin.command("create_bucket", name="other", reserved=500)
    clients = [d.client(bucket="capped") for _ in range(8)]
    try:
        for c in clients:
            for i in range(20):
                c.set(b"k%d" % i, b"v" * 4000)
        # One status after the allocation has seen the connections (a slice).
        wait_until(
            lambda: _status(d)["throttle"]["buckets"]["capped"]["connections"] == 8,
            timeout=10,
            what="the throttle counting the connections",
        )
        return _status(d)["throttle"]
    finally:
        for c in clients:
            c.close()


def test_node_throttle_figures_are_the_allocators_as_one_process_shows_them(
    tmp_path: Path,
) -> None:
    one = Daemon(tmp_path / "one").start()
    two = Daemon(tmp_path / "two", extra_args=["--workers", "2"]).start()
    try:
        single, node = _throttled_node(one), _throttled_node(two)
    finally:
        one.kill()
        two.kill()
    assert node["node"]["capacity"] == single["node"]["capacity"] == 3000
    assert node["node"]["free_pool_units"] == single["node"]["free_pool_units"]
    for name in ("capped", "other"):
        mine, theirs = node["buckets"][name], single["buckets"][name]
        assert mine["effective_reserved"] == theirs["effective_reserved"], name
        assert mine["reserved"] == theirs["reserved"]
    assert node["buckets"]["capped"]["allowance_rate"] <= 1000  # never above its hard limit


def test_every_figure_of_the_node_document_declares_how_it_combines(workers2: Daemon) -> None:
    from tenantkv.server.status import undeclared

    with workers2.client() as admin:
        admin.command("create_bucket", name="declared", reserved=10, hard_limit=100000)
    for c in _clients_on_every_worker(workers2, 2, bucket="declared").values():
        with c:
            c.set(b"k", b"v")
            c.get(b"k")
    doc = _status(workers2)
    doc.pop("workers")
    assert undeclared(doc) == []


def test_the_node_document_is_stamped_when_its_counts_were_read(workers2: Daemon) -> None:
    """A rate between two status documents (``tenantkv-admin top``, the bench)
    divides counts by the difference of their ``uptime_secs``, so a node's
    document is stamped with the instant the workers read their counts (their
    mean), not when the slowest worker's answer reached the supervisor: a worker
    held up for ``HOLD`` seconds moves the stamp by about half of that, and a
    rate over a short window stays true on a loaded machine."""
    hold = 2.0
    clients = _clients_on_every_worker(workers2, 2)
    try:
        first = clients[0].command("server_status")
        t1 = time.monotonic()
        (pid,) = [w["pid"] for w in first["workers"] if w["worker"] == 1]
        os.kill(pid, signal.SIGSTOP)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pending = pool.submit(clients[0].command, "server_status")
                time.sleep(hold)  # the hold is this test's input, not a wait for a state
                t3 = time.monotonic()
                os.kill(pid, signal.SIGCONT)
                second = pending.result(timeout=30)
        finally:
            os.kill(pid, signal.SIGCONT)
    finally:
        for c in clients.values():
            c.close()
    assert len(second["workers"]) == 2  # both answered: the stamp covers both reads
    # Stamped at the slow answer: >= t3 - t1. At the mean of the two reads: about
    # t3 - t1 - hold / 2; worker 0 has most of the hold to answer on a loaded machine.
    assert second["uptime_secs"] - first["uptime_secs"] <= (t3 - t1) - hold / 4
