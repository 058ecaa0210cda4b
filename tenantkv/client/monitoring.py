"""Command monitoring: an event for every attempt the client makes, to listeners you register.

    class Counter(tenantkv.CommandListener):
        def started(self, event): ...
        def succeeded(self, event): ...
        def failed(self, event): ...

    tenantkv.Client(..., event_listeners=[Counter()])

Each attempt of an operation — the first one and every retry — produces one
:class:`CommandStartedEvent` when its request is sent and exactly one
:class:`CommandSucceededEvent` or :class:`CommandFailedEvent` when it ends
(also when it ends by a client timeout, a lost connection or cancellation).
The events of one operation share ``operation_id``; ``attempt`` counts from 1.

Listeners run synchronously in the task or thread that runs the command, so
keep them quick. An exception a listener raises is logged on the
``tenantkv.client`` logger and otherwise ignored: monitoring never changes an
operation's outcome.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tenantkv import errors

log = logging.getLogger("tenantkv.client")

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class CommandStartedEvent:
    """An attempt's request is being sent."""

    command: str
    #: the same for every attempt of one operation (unique per client)
    operation_id: int
    #: 1 for the first attempt, 2 for the first retry, ...
    attempt: int
    #: the server the attempt goes to
    address: Address


@dataclass(frozen=True, slots=True)
class CommandSucceededEvent:
    """An attempt got its result."""

    command: str
    operation_id: int
    attempt: int
    address: Address
    #: seconds from the started event
    duration: float


@dataclass(frozen=True, slots=True)
class CommandFailedEvent:
    """An attempt ended with an error (from the server or on the client side)."""

    command: str
    operation_id: int
    attempt: int
    address: Address
    duration: float
    #: the exception; for a server error also in ``code``/``code_name``/``labels``
    error: BaseException
    #: the server's code (0 for errors raised by the client library)
    code: int
    #: ``Throttled``, ``ClientTimeout``, ... (the exception's type name if not a tenantkv error)
    code_name: str
    labels: tuple[str, ...]
    retry_after_ms: int | None
    #: True when the client will retry the operation (another event pair follows)
    will_retry: bool


class CommandListener:
    """Base class for listeners: override the methods you need (the defaults do nothing)."""

    def started(self, event: CommandStartedEvent) -> None:
        """An attempt starts."""

    def succeeded(self, event: CommandSucceededEvent) -> None:
        """An attempt succeeded."""

    def failed(self, event: CommandFailedEvent) -> None:
        """An attempt failed."""


#: Events a :class:`CommandEventLog` keeps by default (the oldest go first).
DEFAULT_MAX_EVENTS = 10_000


class CommandEventLog(CommandListener):
    """A listener that keeps the latest events (for tests, debugging and benchmarks).

    A ring buffer of ``max_events`` light records: a failed event keeps a copy of
    its exception without traceback, cause or context, so a long-running client
    holds no frames and no reference cycles (at ~10^5 kept exceptions the garbage
    collector paused a client for seconds). Safe to share between threads and tasks.
    """

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self._lock = threading.Lock()
        self._events: deque[CommandStartedEvent | CommandSucceededEvent | CommandFailedEvent] = (
            deque(maxlen=max_events)
        )

    @property
    def events(self) -> list[CommandStartedEvent | CommandSucceededEvent | CommandFailedEvent]:
        """The kept events, oldest first (a copy)."""
        with self._lock:
            return list(self._events)

    def started(self, event: CommandStartedEvent) -> None:
        with self._lock:
            self._events.append(event)

    def succeeded(self, event: CommandSucceededEvent) -> None:
        with self._lock:
            self._events.append(event)

    def failed(self, event: CommandFailedEvent) -> None:
        light = dataclasses.replace(event, error=_light(event.error))
        with self._lock:
            self._events.append(light)

    def of(self, kind: type[Any], command: str | None = None) -> list[Any]:
        """The events of one kind (e.g. ``CommandStartedEvent``), optionally for one command."""
        with self._lock:
            return [
                e
                for e in self._events
                if isinstance(e, kind) and (command is None or e.command == command)
            ]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()


def _light(exc: BaseException) -> BaseException:
    """A copy of ``exc`` that holds no traceback (no frames), cause or context."""
    try:
        out = copy.copy(exc)
    except Exception:  # an exception type that cannot be copied: keep its text
        out = Exception(f"{type(exc).__name__}: {exc}")
    out.__traceback__ = None
    out.__cause__ = out.__context__ = None
    return out


class EventPublisher:
    """Builds the events and hands them to the listeners (used by the retry state machine)."""

    __slots__ = ("enabled", "listeners")

    def __init__(self, listeners: Iterable[CommandListener] = ()) -> None:
        self.listeners: tuple[CommandListener, ...] = tuple(listeners)
        #: False when nobody listens: no event objects are built at all
        self.enabled = bool(self.listeners)

    def _publish(self, event: object, notify: Callable[[CommandListener], None]) -> None:
        """Hand ``event`` to each listener (``notify(listener)``): one that raises is
        logged, and the others still hear of it."""
        for listener in self.listeners:
            try:
                notify(listener)
            except Exception:
                log.exception("command listener %r failed on %r", listener, event)

    def started(self, command: str, operation_id: int, attempt: int, address: Address) -> None:
        event = CommandStartedEvent(command, operation_id, attempt, address)
        self._publish(event, lambda listener: listener.started(event))

    def succeeded(
        self, command: str, operation_id: int, attempt: int, address: Address, duration: float
    ) -> None:
        event = CommandSucceededEvent(command, operation_id, attempt, address, duration)
        self._publish(event, lambda listener: listener.succeeded(event))

    def failed(
        self,
        command: str,
        operation_id: int,
        attempt: int,
        address: Address,
        duration: float,
        error: BaseException,
        will_retry: bool,
    ) -> None:
        if isinstance(error, errors.TenantKVError):
            code, name = error.code, error.code_name
            labels, retry_after = error.labels, error.retry_after_ms
        else:
            code, name, labels, retry_after = 0, type(error).__name__, (), None
        event = CommandFailedEvent(
            command,
            operation_id,
            attempt,
            address,
            duration,
            error,
            code,
            name,
            labels,
            retry_after,
            will_retry,
        )
        self._publish(event, lambda listener: listener.failed(event))
