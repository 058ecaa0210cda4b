"""The front-door gates on the real daemon: request and connection rate limiters,
bucket queues, lag-driven write permits, events — and that a rejection has no effect."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tenantkv import errors
from tests.conftest import ADMIN_PASSWORD, Daemon

TIMEOUT = 30


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("door") / "data").start()
    with d.client() as c:
        c.create_bucket("fd")
    yield d
    d.kill()


def setp(d: Daemon, **values: Any) -> None:
    with d.client() as c:
        for name, value in values.items():
            c.command("set_parameter", name=name, value=value)


def status(d: Daemon) -> dict[str, Any]:
    with d.client() as c:
        return c.server_status()


def test_request_rate_limit_rejects_with_462_and_has_no_effect(door: Daemon) -> None:
    setp(
        door, ingress_request_rate_limiter_enabled=True, ingress_request_admission_rate_per_sec=5.0
    )
    try:
        with door.client(bucket="fd", max_overload_retries=0) as c:
            p = c.pipeline(raise_on_error=False)
            for i in range(40):
                p.set(f"rl{i}", b"v")
            results = p.execute()
            rejected = [r for r in results if isinstance(r, errors.TenantKVError)]
            assert rejected, "nothing was rate limited"
            exc = rejected[0]
            assert isinstance(exc, errors.IngressRequestRateLimitExceeded) and exc.code == 462
            assert exc.labels == ("SystemOverloadedError", "RetryableError")
            assert exc.retry_after_ms is not None and exc.retry_after_ms > 0
            assert c.server_status()["ingress"]["request_rate_limiter"]["rejected"] > 0
        setp(door, ingress_request_rate_limiter_enabled=False)
        with door.client(bucket="fd") as c:
            stored = c.mget([f"rl{i}" for i in range(40)])
        # exactly the admitted writes exist; the rejected ones never ran
        for r, v in zip(results, stored, strict=True):
            assert (v is None) == isinstance(r, errors.TenantKVError)
    finally:
        setp(
            door,
            ingress_request_rate_limiter_enabled=False,
            ingress_request_admission_rate_per_sec=None,
        )


def test_cidr_exemption_and_admin_commands_pass(door: Daemon) -> None:
    setp(
        door,
        ingress_request_rate_limiter_enabled=True,
        ingress_request_admission_rate_per_sec=1.0,
        ingress_request_rate_limiter_exemptions="127.0.0.0/8, ::1",
    )
    try:
        with door.client(bucket="fd", max_overload_retries=0) as c:
            for _ in range(30):
                c.get("k")
        with pytest.raises(errors.BadValue, match="host bits"):
            setp(door, ingress_request_rate_limiter_exemptions="127.0.0.1/8")
        setp(door, ingress_request_rate_limiter_exemptions=None)
        with door.client() as c:  # admin commands are exempt even without the CIDR
            for _ in range(10):
                c.server_status()
            assert c.server_status()["ingress"]["request_rate_limiter"]["exempted"] >= 30
    finally:
        setp(
            door,
            ingress_request_rate_limiter_enabled=False,
            ingress_request_admission_rate_per_sec=None,
            ingress_request_rate_limiter_exemptions=None,
        )


def test_connection_storm_queues_then_refuses_and_bypass(door: Daemon) -> None:
    setp(
        door,
        ingress_connection_establishment_rate_limiter_enabled=True,
        ingress_connection_establishment_rate_per_sec=2.0,
        ingress_connection_establishment_burst_capacity_secs=0.5,
        ingress_connection_establishment_max_queue_depth=1,
    )
    outcomes: list[str] = []
    lock = threading.Lock()

    def connect() -> None:
        try:
            with door.client(max_overload_retries=0, timeout=10) as c:
                c.ping()
            res = "ok"
        except errors.TooManyConnections:
            res = "refused"
        except errors.TenantKVError as exc:
            res = repr(exc)
        with lock:
            outcomes.append(res)

    try:
        threads = [threading.Thread(target=connect) for _ in range(6)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert outcomes.count("refused") >= 3, outcomes
        assert outcomes.count("ok") >= 2, outcomes
        assert time.monotonic() - start < 10
        st = status(door)["ingress"]["connection_establishment"]
        assert st["rejected"] >= 3 and st["added_to_queue"] >= 1
        setp(door, ingress_connection_establishment_rate_limiter_bypass="127.0.0.0/8")
        outcomes.clear()
        threads = [threading.Thread(target=connect) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert outcomes == ["ok"] * 6
    finally:
        setp(
            door,
            ingress_connection_establishment_rate_limiter_enabled=False,
            ingress_connection_establishment_rate_limiter_bypass=None,
            ingress_connection_establishment_rate_per_sec=None,
            ingress_connection_establishment_burst_capacity_secs=None,
            ingress_connection_establishment_max_queue_depth=None,
        )


def test_bucket_queue_tolerance_rejects_at_once_and_stores_nothing(door: Daemon) -> None:
    with door.client() as admin:
        r = admin.command(
            "set_bucket_queue", bucket="fd", **{"class": "write"}, concurrency=1, queue_tolerance=0
        )
        assert (r["concurrency"], r["queue_tolerance"]) == (1, 0)
    try:
        with door.client(bucket="fd", max_overload_retries=0) as c:
            p = c.pipeline(raise_on_error=False)
            for i in range(200):
                p.set(f"q{i}", b"v")
            results = p.execute()
        overflow = [r for r in results if isinstance(r, errors.AdmissionQueueOverflow)]
        assert overflow, "no queue overflow"
        assert overflow[0].labels == errors.OVERLOAD_LABELS
        with door.client(bucket="fd") as c:
            stored = c.mget([f"q{i}" for i in range(200)])
        for r, v in zip(results, stored, strict=True):
            assert (v is None) == isinstance(r, errors.TenantKVError)
        st = status(door)["bucket_queues"]["buckets"]["fd"]["write"]
        assert st["rejected_overflow"] >= len(overflow)
    finally:
        with door.client() as admin:
            admin.command(
                "set_bucket_queue",
                bucket="fd",
                **{"class": "write"},
                concurrency=None,
                queue_tolerance=None,
            )


def test_bucket_queue_pending_timeout(door: Daemon) -> None:
    with door.client() as admin:
        admin.command(
            "set_bucket_queue",
            bucket="fd",
            **{"class": "write"},
            concurrency=1,
            queue_tolerance=100000,
        )
    setp(door, bucket_queue_pending_timeout_ms=1)
    try:
        errs: list[BaseException] = []

        def writer(n: int) -> None:
            with door.client(bucket="fd", max_overload_retries=0) as c:
                p = c.pipeline(raise_on_error=False)
                for i in range(300):
                    p.set(f"t{n}-{i}", b"v" * 1000)
                errs.extend(r for r in p.execute() if isinstance(r, Exception))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        st = status(door)["bucket_queues"]["buckets"]["fd"]["write"]
        assert st["rejected_timeout"] > 0
        assert any(isinstance(e, errors.AdmissionQueueOverflow) for e in errs)
    finally:
        setp(door, bucket_queue_pending_timeout_ms=None)
        with door.client() as admin:
            admin.command(
                "set_bucket_queue",
                bucket="fd",
                **{"class": "write"},
                concurrency=None,
                queue_tolerance=None,
            )


def test_write_permits_follow_the_lag(door: Daemon) -> None:
    setp(
        door,
        write_permit_target_lag=0,
        write_permit_critical_lag=2,
        write_permit_min_capacity=1,
        write_permit_max_capacity=8,
        write_permit_adjustment_interval_ms=1,
    )
    try:

        def writer(n: int) -> None:
            with door.client(bucket="fd") as c, c.pipeline() as p:
                for i in range(2000):
                    p.set(f"w{n}-{i}", b"v")

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        deadline = time.monotonic() + 10
        while True:  # once the backlog is gone, capacity returns to max
            st = status(door)["write_permits"]
            if st["node"]["capacity"] == 8 or time.monotonic() > deadline:
                break
        assert st["node"]["adjustments"] >= 2  # lowered under lag, raised after
        assert st["node"]["capacity"] == 8
        assert "write permit capacity" in door.log()
    finally:
        setp(
            door,
            write_permit_critical_lag=None,
            write_permit_target_lag=None,
            write_permit_min_capacity=None,
            write_permit_max_capacity=None,
            write_permit_adjustment_interval_ms=None,
        )


def test_runtime_cross_checks_refuse_bad_combinations(door: Daemon) -> None:
    with pytest.raises(errors.BadValue, match="critical_lag"):
        setp(door, write_permit_critical_lag=10)  # below the target lag of 1024
    assert status(door)["write_permits"]["node"]["write_permit_target_lag"] == 1024


def test_watch_streams_events(door: Daemon) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "admin.cli",
            "--port",
            str(door.port),
            "--password",
            ADMIN_PASSWORD,
            "--json",
            "watch",
            "--bucket",
            "fd",
            "--count",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with door.client(bucket="fd") as c:
            deadline = time.monotonic() + TIMEOUT
            while proc.poll() is None and time.monotonic() < deadline:
                c.get("k")
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(events) == 3
    assert all(e["bucket"] == "fd" and e["event"] == "request_handled" for e in events)
