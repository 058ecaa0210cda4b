"""Test-only failpoints: make chosen commands fail or stall, to test clients' reactions.

Available only when the daemon starts with ``--enable-test-commands``; the
admin command ``configure_fail_point`` is refused otherwise. The shape
follows MongoDB's ``failCommand`` failpoint so its documentation applies::

    {"name": "failCommand",
     "mode": "off" | "alwaysOn" | {"times": N},
     "data": {"failCommands": ["get", "set"],      # required
              "errorCode": 25,                     # a tenantkv code (optional)
              "errorLabels": ["RetryableError"],   # default: the code's own labels
              "retryAfterMs": 50,                  # optional hint
              "blockTimeMS": 200}}                 # optional delay before the outcome

A failed command never runs: the failpoint answers before any gate or storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tenantkv import errors

FAIL_COMMAND = "failCommand"
#: Commands a failpoint never touches, so a test can always turn it off again.
NEVER_FAILED = frozenset({"hello", "configure_fail_point"})


@dataclass(slots=True)
class FailCommand:
    commands: frozenset[str]
    times: int | None  # None: always on
    error_code: int | None = None
    error_labels: tuple[str, ...] | None = None
    retry_after_ms: int | None = None
    block_secs: float = 0.0
    #: how many commands it has hit
    hits: int = field(default=0)

    def error(self) -> errors.TenantKVError | None:
        if self.error_code is None:
            return None
        cls = errors.error_classes()[self.error_code]
        return cls(
            "failpoint failCommand",
            labels=self.error_labels,
            retry_after_ms=self.retry_after_ms,
        )


class Failpoints:
    """The node's failpoints. ``active`` is a plain attribute the hot path checks."""

    def __init__(self) -> None:
        self.fail_command: FailCommand | None = None
        self.active = False

    def take(self, method: str) -> FailCommand | None:
        """The failpoint that applies to this command now (consuming one of its times)."""
        fp = self.fail_command
        if fp is None or method not in fp.commands:
            return None
        fp.hits += 1
        if fp.times is not None:
            fp.times -= 1
            if fp.times <= 0:
                self.fail_command, self.active = None, False
        return fp

    def configure(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if name != FAIL_COMMAND:
            raise errors.BadValue(f"unknown failpoint {name!r}; the only one is {FAIL_COMMAND!r}")
        mode = params.get("mode")
        if mode == "off":
            self.fail_command, self.active = None, False
            return {"name": name, "mode": "off"}
        if mode == "alwaysOn":
            times = None
        elif isinstance(mode, dict) and set(mode) == {"times"} and _pos_int(mode["times"]):
            times = mode["times"]
        else:
            raise errors.BadValue('\'mode\' must be "off", "alwaysOn" or {"times": N > 0}')
        data = params.get("data")
        if not isinstance(data, dict):
            raise errors.BadValue("'data' must be a map with at least 'failCommands'")
        unknown = set(data) - {
            "failCommands",
            "errorCode",
            "errorLabels",
            "retryAfterMs",
            "blockTimeMS",
        }
        if unknown:
            raise errors.BadValue(f"unknown failCommand data key {sorted(unknown)[0]!r}")
        commands = data.get("failCommands")
        if (
            not isinstance(commands, list)
            or not commands
            or not all(isinstance(c, str) for c in commands)
        ):
            raise errors.BadValue("'failCommands' must be a non-empty list of command names")
        code = data.get("errorCode")
        if code is not None and code not in errors.error_classes():
            raise errors.BadValue(f"'errorCode' {code!r} is not a tenantkv error code")
        labels = data.get("errorLabels")
        if labels is not None and (
            not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)
        ):
            raise errors.BadValue("'errorLabels' must be a list of strings")
        retry = data.get("retryAfterMs")
        if retry is not None and not (_pos_int(retry) or retry == 0):
            raise errors.BadValue("'retryAfterMs' must be a non-negative integer")
        block = data.get("blockTimeMS", 0)
        if not (_pos_int(block) or block == 0):
            raise errors.BadValue("'blockTimeMS' must be a non-negative integer")
        if code is None and not block:
            raise errors.BadValue("give 'errorCode', 'blockTimeMS' or both")
        self.fail_command = FailCommand(
            frozenset(commands) - NEVER_FAILED,
            times,
            code,
            tuple(labels) if labels is not None else None,
            retry,
            block / 1000,
        )
        self.active = True
        return {"name": name, "mode": mode, "data": data}


def _pos_int(v: Any) -> bool:
    return type(v) is int and v > 0
