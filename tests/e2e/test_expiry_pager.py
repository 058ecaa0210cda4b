"""The expiry pager reclaims a record when it falls due, not on a polling period."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Daemon, wait_until


@pytest.fixture
def slow_poll(tmp_path: Path) -> Iterator[Daemon]:
    cfg = tmp_path / "tenantkv.toml"
    # An hour between polls: only the wake-up on the next expiry can reclaim in time.
    cfg.write_text("expiry_pager_interval_secs = 3600.0\n")
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    yield d
    d.kill()


def entries(d: Daemon, bucket: str) -> int:
    with d.client() as c:
        return int(c.server_status()["buckets"][bucket]["entries"])


def test_records_are_reclaimed_when_they_expire(slow_poll: Daemon) -> None:
    d = slow_poll
    with d.client() as c:
        c.create_bucket("ttl")
        c.select_bucket("ttl")
        c.set("forever", b"x")
        c.set("later", b"x", ttl=3600)
        c.set("soon", b"x", ttl=0.3)  # an earlier expiry than any before: wakes the pager
        assert entries(d, "ttl") == 3
        wait_until(lambda: entries(d, "ttl") == 2, 10, "the expired record to be reclaimed")
        assert c.get("later") is not None and c.get("forever") is not None
        # Reclaimed, not just hidden: the pager deleted it from disk.
        c.set("again", b"x", ttl=0.2)
        wait_until(lambda: entries(d, "ttl") == 2, 10, "the second expiry to be reclaimed")
