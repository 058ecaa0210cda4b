"""Log lines: text for people, one JSON object per line for machines; audit lines
survive any log level."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tenantkv.server import cli, log_setup


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """Capture what configure_logging's handler writes; restore logging afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("tenantkv.audit").level)
    try:
        yield io.StringIO()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("tenantkv.audit").setLevel(saved[2])


def test_json_lines_carry_time_level_logger_message_and_extras(stderr: io.StringIO) -> None:
    cli.configure_logging("info", "json", stderr)
    log = logging.getLogger("tenantkv.test")
    log.info("bucket %r created", "orders", extra={"bucket": "orders", "units": 5})
    log.debug("not shown at info")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("it failed\nover two lines")
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2  # one object per line, even with a newline and a traceback
    first, second = (json.loads(x) for x in lines)
    assert first["message"] == "bucket 'orders' created"
    assert (first["level"], first["logger"]) == ("INFO", "tenantkv.test")
    assert (first["bucket"], first["units"]) == ("orders", 5)
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_json_turns_odd_extras_into_text(stderr: io.StringIO) -> None:
    cli.configure_logging("info", "json", stderr)
    logging.getLogger("tenantkv.test").info("x", extra={"peer": ("127.0.0.1", 5), "raw": b"\xff"})
    doc = json.loads(stderr.getvalue())
    assert doc["peer"] == ["127.0.0.1", 5] and doc["raw"] == repr(b"\xff")


def test_text_lines_are_for_people(stderr: io.StringIO) -> None:
    cli.configure_logging("debug", "text", stderr)
    logging.getLogger("tenantkv.server").debug("listening on %s:%d", "127.0.0.1", 7207)
    line = stderr.getvalue().strip()
    assert line.endswith(" DEBUG tenantkv.server: listening on 127.0.0.1:7207")


def test_audit_lines_are_kept_at_any_level(stderr: io.StringIO) -> None:
    cli.configure_logging("error", "json", stderr)
    logging.getLogger("tenantkv.server").info("routine")
    logging.getLogger("tenantkv.audit").info("audit: user 'admin' created bucket 'b'")
    lines = [json.loads(x) for x in stderr.getvalue().splitlines()]
    assert [x["logger"] for x in lines] == ["tenantkv.audit"]


def test_reconfiguring_replaces_the_handler(stderr: io.StringIO) -> None:
    cli.configure_logging("info", "text", stderr)
    cli.configure_logging("info", "json", stderr)
    logging.getLogger("tenantkv.test").info("once")
    assert len(stderr.getvalue().splitlines()) == 1


def test_sparse_log_keeps_a_burst_a_second_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client reconnecting in a loop to cause a line cannot fill the log."""
    now = [100.0]
    monkeypatch.setattr(log_setup.time, "monotonic", lambda: now[0])
    sparse = log_setup.SparseLog(logging.getLogger("tenantkv.test"), burst=2)
    with caplog.at_level(logging.INFO, logger="tenantkv.test"):
        for i in range(5):
            sparse.info("closed %d", i)
        now[0] += 1.0
        sparse.info("closed %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "closed 0",
        "closed 1",
        "closed 5 (3 such lines not logged before it)",
    ]
