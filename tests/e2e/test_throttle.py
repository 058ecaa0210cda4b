"""Tenant throttling end to end: the real daemon, real clients, real time.

These measure wall-clock behaviour on purpose (the decision logic itself is
tested under a mock clock in tests/unit/test_tenant_throttle.py), so the
bounds are loose enough for a loaded 2-core CI machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon

TIMEOUT = 60
#: test a's buckets' hard limit, RU/s
RATE = 128


def _throttle(daemon: Daemon, bucket: str) -> dict:
    with daemon.client() as c:
        return c.server_status()["throttle"]["buckets"][bucket]


async def test_a_five_capped_buckets_are_held_to_their_rate(daemon: Daemon) -> None:
    # Limits low enough that one client process outpaces them even on a loaded
    # machine (at 1024 RU/s a bucket there was never throttled).
    names = [f"cap{i}" for i in range(5)]
    with daemon.client() as c:
        for n in names:
            c.create_bucket(n, reserved=RATE, hard_limit=RATE)
            c.select_bucket(n)
            c.set("k", b"small")  # 1 WU = cost 2

    async def hammer(bucket: str) -> None:
        async with daemon.async_client(bucket=bucket) as c:

            async def worker() -> None:
                for _ in range(4 * RATE // 8):
                    assert await c.get("k") == b"small"

            async with trio.open_nursery() as n:
                for _ in range(8):
                    n.start_soon(worker)

    start = time.monotonic()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as n:
            for b in names:
                n.start_soon(hammer, b)
    elapsed = time.monotonic() - start
    # 4 s of RU at the limit: ~4 s less one slice of burst; never under 2 s (a
    # floor, which load only lengthens).
    assert elapsed > 2.0, elapsed
    for b in names:
        t = _throttle(daemon, b)
        assert t["ru_total"] == 4 * RATE
        assert t["throttle_count_total"] > 0
        assert t["throttle_wait_micros_total"] > 0


def test_b_light_load_under_reservation_is_never_throttled(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("light", reserved=5000, hard_limit=5000)
    with daemon.client(bucket="light") as c:
        c.set("k", b"v")
        for _ in range(200):
            c.get("k")
    t = _throttle(daemon, "light")
    assert t["throttle_count_total"] == 0 and t["reject_count_total"] == 0
    assert t["ru_total"] == 200 and t["wu_total"] == 1


def test_c_nonblocking_mode_rejects_at_once_with_a_hint(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("nb", reserved=0, hard_limit=20)
    with daemon.client(bucket="nb", nonblocking_throttle=True, max_overload_retries=0) as c:
        c.set("k", b"v")
        start = time.monotonic()
        with pytest.raises(errors.Throttled) as info:
            for _ in range(1000):
                c.get("k")
        assert time.monotonic() - start < 5  # blocking, 1000 GETs would take ~100 s
        exc = info.value
        assert exc.labels == ("SystemOverloadedError", "RetryableError")
        assert exc.retry_after_ms is not None and 0 < exc.retry_after_ms <= 1000
        assert c.ping() == "pong"  # the connection goes on
    assert _throttle(daemon, "nb")["reject_count_total"] >= 1


def test_blocking_wait_is_bounded_by_the_request_deadline(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("slow", reserved=0, hard_limit=2)
    with daemon.client(bucket="slow", max_overload_retries=0) as c:
        c.set("k", b"v" * 10_000)  # 3 WU x 2 = 6 units: three seconds of the hard limit
        start = time.monotonic()
        with pytest.raises(errors.Throttled) as info:
            c.command("get", key=b"k", timeout_ms=300)
        assert time.monotonic() - start < 5  # not parked for the 3 s wait and more
        assert "exceeds the request's deadline" in info.value.errmsg
        assert (info.value.retry_after_ms or 0) >= 1000  # the real wait, not the deadline


def test_hard_limit_zero_is_not_retry_later(daemon: Daemon) -> None:
    """It answered Throttled/RetryableError with 5000 ms, and the client spent ~25 s of
    its 30 s deadline retrying something no retry could pass."""
    with daemon.client() as c:
        c.create_bucket("zero", reserved=0, hard_limit=0)
    with daemon.client(bucket="zero") as c:
        start = time.monotonic()
        with pytest.raises(errors.HardLimitZero, match="hard_limit 0") as info:
            c.get("k")
        # At once, not after the ~25 s of retries a retryable answer caused.
        assert time.monotonic() - start < 10 and info.value.labels == ()


def test_d_deleting_a_bucket_frees_its_throttled_requests(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("doomed", reserved=0, hard_limit=1)
        c.select_bucket("doomed")
        c.set("k", b"v" * 5000)  # 2 WU: far beyond a slice of 1 unit/s
    outcome: list[BaseException] = []

    def reader() -> None:
        with daemon.client(bucket="doomed") as r:
            try:
                for _ in range(50):
                    r.get("k")
            except errors.TenantKVError as exc:
                outcome.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    deadline = time.monotonic() + 10
    while _throttle(daemon, "doomed")["waiting"] == 0:
        assert time.monotonic() < deadline, "the reader was never throttled"
        time.sleep(0.05)
    with daemon.client() as c:
        c.delete_bucket("doomed")
    t.join(10)
    assert not t.is_alive(), "a throttled request hung after its bucket was deleted"
    assert outcome and isinstance(outcome[0], (errors.BucketNotFound, errors.NoBucketSelected))


def test_e_node_defaults_apply_to_new_buckets(daemon: Daemon) -> None:
    with daemon.client() as c:
        before = c.get_node_throttle()
        after = c.set_node_throttle(
            {"default_throttle_reserved_units": 300, "default_throttle_hard_limit": 900}
        )
        assert after["default_throttle_reserved_units"] == 300
        assert after["capacity"] == before["capacity"] == "unlimited"
        c.create_bucket("defaulted")
        assert c.get_bucket_throttle("defaulted") == {"reserved": 300, "hard_limit": 900}
        c.set_node_throttle(
            {"default_throttle_reserved_units": 0, "default_throttle_hard_limit": "unlimited"}
        )
        assert c.get_bucket_throttle("defaulted") == {"reserved": 300, "hard_limit": 900}


@pytest.mark.parametrize(
    "body, error, message",
    [
        ('{"reserved": 10, "hard_limit": 5}', errors.BadValue, "reserved can't exceed hard limit"),
        ('{"reserved": -1}', errors.BadValue, "reserved"),
        ('{"reserved": 1.5}', errors.BadValue, "reserved"),
        ('{"reserved": "lots"}', errors.BadValue, "reserved"),
        ('{"reservd": 1}', errors.BadValue, "reservd"),
        ("{not json", errors.BadValue, "JSON"),
        ('{"hard_limit": 1}' + " " * 1100, errors.BadValue, "1024"),
    ],
)
def test_bucket_properties_are_validated_and_nothing_changes(
    daemon: Daemon, body: str, error: type, message: str
) -> None:
    with daemon.client() as c:
        if "valid" not in [b["name"] for b in c.list_buckets()]:
            c.create_bucket("valid", reserved=10, hard_limit=100)
        with pytest.raises(error, match=message):
            c.set_bucket_throttle("valid", body)
        assert c.get_bucket_throttle("valid") == {"reserved": 10, "hard_limit": 100}


def test_throttle_commands_need_admin_and_a_real_bucket(daemon: Daemon) -> None:
    with daemon.client() as c:
        with pytest.raises(errors.BucketNotFound):
            c.set_bucket_throttle("no-such", {"reserved": 1})
        with pytest.raises(errors.BadValue, match="unknown"):
            c.set_node_throttle({"capacity": 10, "speed": 1})
        with pytest.raises(errors.BadValue, match="reserved can't exceed hard limit"):
            c.set_node_throttle(
                {"default_throttle_reserved_units": 5, "default_throttle_hard_limit": 1}
            )
        with pytest.raises(errors.BadValue, match="reserved can't exceed hard limit"):
            c.create_bucket("inverted", reserved=10, hard_limit=5)
        c.create_bucket("mine")
        c.create_user("tenant", "pw", roles={"mine": "readwrite"})
    with daemon.client(user="tenant", password="pw", bucket="mine") as t:
        with pytest.raises(errors.Unauthorized):
            t.set_bucket_throttle("mine", {"hard_limit": "unlimited"})
        with pytest.raises(errors.Unauthorized):
            t.get_node_throttle()


def test_unthrottled_user_is_charged_but_never_delayed(daemon: Daemon) -> None:
    with daemon.client() as c:
        c.create_bucket("vip", reserved=0, hard_limit=0)
        c.create_user("vip-user", "pw", roles={"vip": "readwrite"}, unthrottled=True)
    with daemon.client(user="vip-user", password="pw", bucket="vip") as c:
        start = time.monotonic()
        c.set("k", b"v")
        for _ in range(100):
            assert c.get("k") == b"v"
        assert time.monotonic() - start < 5  # a delay would be endless: hard_limit 0
    t = _throttle(daemon, "vip")
    assert t["ru_total"] == 100 and t["wu_total"] == 1 and t["throttle_count_total"] == 0


def test_cli_throttle_commands(daemon: Daemon) -> None:
    def admin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "admin.cli",
                "--port",
                str(daemon.port),
                "--password",
                ADMIN_PASSWORD,
                "--json",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=subprocess.DEVNULL,
        )

    r = admin("bucket-create", "clib", "--reserved", "100", "--hard-limit", "unlimited")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reserved"] == 100
    r = admin("set-bucket-throttle", "clib", '{"hard_limit": 500}')
    assert r.returncode == 0, r.stderr
    assert json.loads(admin("get-bucket-throttle", "clib").stdout) == {
        "reserved": 100,
        "hard_limit": 500,
    }
    r = admin("set-bucket-throttle", "clib", '{"reserved": 600}')
    assert r.returncode == 1 and "reserved can't exceed hard limit" in r.stderr
    r = admin("set-node-throttle", '{"capacity": "lots"}')
    assert r.returncode in (1, 2) and "capacity" in r.stderr
    assert json.loads(admin("get-node-throttle").stdout)["capacity"] == "unlimited"


def test_f_properties_survive_a_restart(fresh_daemon: Daemon) -> None:
    with fresh_daemon.client() as c:
        c.create_bucket("p", reserved=100, hard_limit=200)
        c.set_bucket_throttle("p", {"hard_limit": 250})
        c.set_node_throttle({"capacity": 10000, "default_throttle_reserved_units": 7})
    fresh_daemon.stop()
    fresh_daemon.start()
    with fresh_daemon.client() as c:
        assert c.get_bucket_throttle("p") == {"reserved": 100, "hard_limit": 250}
        node = c.get_node_throttle()
        assert node["capacity"] == 10000 and node["default_throttle_reserved_units"] == 7
        assert c.server_status()["throttle"]["node"]["enabled"] is True


def test_metrics_endpoint_shows_throttle_and_node_metrics(tmp_path: Path) -> None:
    import urllib.request

    d = Daemon(tmp_path / "data", extra_args=["--metrics-port", "0"]).start()
    try:
        with d.client() as c:
            c.create_bucket("m", reserved=10, hard_limit=20)
            c.select_bucket("m")
            c.set("k", b"v")
            c.get("k")
        assert d.metrics_port
        url = f"http://127.0.0.1:{d.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        d.kill()
    for line in (
        'tenantkv_throttle_bucket_hard_limit{bucket="m"} 20.0',
        'tenantkv_throttle_bucket_ru_total{bucket="m"} 1.0',
        'tenantkv_throttle_bucket_wu_total{bucket="m"} 1.0',
        'tenantkv_ops_total{bucket="m",operation="get"} 1.0',
        "tenantkv_connections ",
        "tenantkv_execution_read_total_tickets ",
        "tenantkv_execution_write_finished_processing_total ",
        "tenantkv_execution_probing_times_probed_stable_total ",
        'tenantkv_bucket_queues_read_running{bucket="m"} 0.0',
        'tenantkv_write_permits_capacity{bucket="m"} ',
        'tenantkv_write_permits_wait_seconds_bucket{bucket="m",le="+Inf"} ',
        "tenantkv_ingress_request_rate_limiter_rejected_total ",
        "tenantkv_ingress_admission_total_tickets 1e+06",
        'tenantkv_throttle_wait_seconds_bucket{bucket="m",le="+Inf"} ',
    ):
        assert line in text, line


@pytest.mark.parametrize("kind", ["get miss", "exists miss", "failed add", "cas mismatch"])
def test_every_executed_operation_costs_at_least_min_op_units(daemon: Daemon, kind: str) -> None:
    """Misses and failed writes used to cost 0 units and escape every limit.

    The 300 operations go as one pipeline: the server has them at once and
    answers them in far less than the second its allowance takes to refill,
    however slowly a loaded machine runs the test itself (one at a time they
    take seconds there, and the allowance refills meanwhile)."""
    bucket = "miss-" + kind.replace(" ", "-")
    with daemon.client() as c:
        c.create_bucket(bucket, reserved=0, hard_limit=20)
    with daemon.client(bucket=bucket, nonblocking_throttle=True, max_overload_retries=0) as c:
        if kind in ("failed add", "cas mismatch"):
            c.set("there", b"v")
        p = c.pipeline(raise_on_error=False)
        for _ in range(300):
            if kind == "get miss":
                p.get("absent")
            elif kind == "exists miss":
                p.exists("absent")
            elif kind == "failed add":
                p.set("there", b"w", mode="add")
            else:
                p.set("there", b"w", cas=12345)
        results = p.execute()
        throttled = sum(isinstance(r, errors.Throttled) for r in results)
        ran = [r for r in results if not isinstance(r, errors.Throttled)]
        if kind == "get miss":
            assert all(r is None for r in ran), ran
        elif kind == "exists miss":
            assert all(r is False for r in ran), ran
        else:
            expected = errors.KeyExists if kind == "failed add" else errors.CasMismatch
            assert all(isinstance(r, expected) for r in ran), ran
        assert throttled > 150, throttled  # held to ~20 units/s, like hits
    st = _throttle(daemon, bucket)
    assert st["reject_count_total"] >= 150


def test_capacity_below_the_reservations_warns_and_shows_the_scaling(daemon: Daemon) -> None:
    import subprocess
    import sys

    with daemon.client() as c:
        c.create_bucket("big-r", reserved=3000, hard_limit=5000)
    env = {"TENANTKV_PASSWORD": ADMIN_PASSWORD}
    cmd = [sys.executable, "-m", "admin.cli", "--host", daemon.host, "--port", str(daemon.port)]
    try:
        r = subprocess.run(
            [*cmd, "set-node-throttle", '{"capacity": 1000}'],
            capture_output=True,
            text=True,
            env={**env, "PATH": "/usr/bin:/bin"},
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        assert "warning: capacity 1000 is below the buckets' reservations" in r.stderr
        with daemon.client() as c:
            node = c.server_status()["throttle"]["node"]
        assert node["reservation_scale"] < 1.0
    finally:
        with daemon.client() as c:
            c.set_node_throttle({"capacity": "unlimited"})
            c.delete_bucket("big-r")
