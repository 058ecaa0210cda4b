"""Logging for the daemon: text lines for people, or one JSON object per line.

(Its own module: the worker processes of ``serve --workers N`` set it up too,
without importing the command line.)
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from datetime import UTC, datetime
from typing import IO, Any

#: Attributes every LogRecord has; anything else on a record is an extra field.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, RFC 3339, ms), ``level``, ``logger``,
    ``message``, then any extra fields (``log.info(..., extra={...})``) and
    ``exception`` / ``stack`` when present."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_") and key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=repr, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(
    level: str, fmt: str = "text", stream: IO[str] | None = None, *, worker: int | None = None
) -> None:
    """Log to ``stream`` (stderr) at ``level`` in ``fmt`` (text or json). Audit lines
    (``tenantkv.audit``, INFO) are kept whatever the level. A worker of
    ``serve --workers N`` names itself in each line (``[worker 1]``, or a
    ``worker`` field in JSON)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    text = TEXT_FORMAT
    if worker is not None:
        text = TEXT_FORMAT.replace("%(name)s:", f"%(name)s[worker {worker}]:")

        def tag(record: logging.LogRecord) -> bool:
            record.worker = worker
            return True

        handler.addFilter(tag)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("tenantkv.audit").setLevel(logging.INFO)


class SparseLog:
    """Lines a client can cause at will (a connection closed for a protocol
    error, a failed AUTH): at most ``burst`` a second node-wide (one, as for a
    connection's unexpected failures), the next one logged saying how many were
    not. An operator still sees each kind of event and how often it happens, and
    a client reconnecting in a loop cannot fill the disk or spend the event loop
    on formatting lines."""

    def __init__(self, logger: logging.Logger, burst: int = 1, interval: float = 1.0) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self._window_start = -math.inf
        self._in_window = 0
        self._not_logged = 0

    def info(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now >= self._window_start + self.interval:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self._not_logged += 1
            return
        self._in_window += 1
        if self._not_logged:
            msg += " (%d such lines not logged before it)"
            args = (*args, self._not_logged)
            self._not_logged = 0
        self.logger.info(msg, *args)
