"""What both clients share apart from I/O: settings, servers, retry policy, monitoring.

:class:`BaseClient` holds everything :class:`tenantkv.Client` and
:class:`tenantkv.AsyncClient` have in common and takes the one constructor
signature both expose; the drivers add only sockets, sleeping and the loop
that follows the retry state machine's decisions (:mod:`tenantkv.client.retry`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import count
from typing import Any

from tenantkv._version import __version__
from tenantkv.client.core import CLIENT_NAME, Call, Commands, hello_call
from tenantkv.client.monitoring import CommandListener, EventPublisher
from tenantkv.client.retry import (
    DEFAULT_BASE_BACKOFF,
    DEFAULT_MAX_BACKOFF,
    DEFAULT_MAX_OVERLOAD_RETRIES,
    RetryPolicy,
    RetryState,
    policy_from_settings,
)
from tenantkv.client.servers import Address, ServerSet, resolve_addresses


class BaseClient(Commands):
    """Settings and state shared by the blocking and the Trio client (no I/O here).

    Arguments (all but ``host``/``port`` keyword-only):

    ``host``, ``port``
        One server (default ``127.0.0.1:7207``). Or, instead of them:
    ``addresses``
        Several servers: ``"h1:p1,h2:p2"`` or a list of ``(host, port)`` tuples
        or ``"host:port"`` strings. The client connects to the first that
        accepts it (its home server); retries of overloaded data commands may
        go to the others, whose connections open on first use.
    ``user``, ``password``, ``bucket``
        Credentials and the bucket to select (admins may omit it).
    ``timeout``
        Default per-operation timeout in seconds (30; None = none), covering
        every attempt and backoff; sent to the server as the request's deadline
        (``timeout_ms``). ``with_timeout(s)`` overrides it per operation.
    ``connect_timeout``
        Seconds to open a TCP connection (10).
    ``retry_reads``, ``retry_writes``, ``max_overload_retries``, ``base_backoff``,
    ``max_backoff``, ``adaptive_retries``
        The overload retry policy (True, True, 5, 0.1 s, 10 s, False); see
        :class:`tenantkv.client.retry.RetryPolicy` and docs/client.md.
    ``retry_policy``
        A :class:`RetryPolicy` to use instead of the six settings above (share
        one between clients to share its adaptive token bucket).
    ``event_listeners``
        :class:`~tenantkv.client.monitoring.CommandListener` objects that get an
        event for every attempt.
    ``client_name``, ``nonblocking_throttle``
        Sent in ``hello``: the client's name, and whether the server should
        reject at once with ``Throttled`` instead of making requests wait.
    """

    def __init__(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        user: str,
        password: str,
        bucket: str | None = None,
        addresses: str | Sequence[str | Address] | None = None,
        timeout: float | None = 30.0,
        connect_timeout: float = 10.0,
        client_name: str = CLIENT_NAME,
        nonblocking_throttle: bool = False,
        retry_reads: bool = True,
        retry_writes: bool = True,
        max_overload_retries: int = DEFAULT_MAX_OVERLOAD_RETRIES,
        base_backoff: float = DEFAULT_BASE_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        adaptive_retries: bool = False,
        retry_policy: RetryPolicy | None = None,
        event_listeners: Iterable[CommandListener] = (),
    ) -> None:
        #: every server this client may use, in order
        self.addresses: list[Address] = resolve_addresses(host, port, addresses)
        #: the home server (the one connected at start)
        self.host, self.port = self.addresses[0]
        #: default per-operation timeout in seconds (None = wait forever)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        #: the overload retry policy in force
        self.retry_policy: RetryPolicy = policy_from_settings(
            retry_policy,
            retry_reads=retry_reads,
            retry_writes=retry_writes,
            max_overload_retries=max_overload_retries,
            base_backoff=base_backoff,
            max_backoff=max_backoff,
            adaptive_retries=adaptive_retries,
        )
        self._monitor = EventPublisher(event_listeners)
        self._servers = ServerSet(self.addresses)
        self._op_ids = count(1)
        self._user, self._password = user, password
        #: the bucket the connections have selected (hello, then select_bucket)
        self._bucket = bucket
        self._client_name = client_name
        self._nonblocking_throttle = nonblocking_throttle
        #: the home server's hello result
        self.server_info: dict[str, Any] = {}

    @property
    def event_listeners(self) -> tuple[CommandListener, ...]:
        return self._monitor.listeners

    def _hello_call(self) -> Call[dict[str, Any]]:
        return hello_call(
            self._user,
            self._password,
            self._bucket,
            self._client_name,
            __version__,
            self._nonblocking_throttle,
        )

    def _set_home(self, index: int, info: dict[str, Any]) -> None:
        self._servers.home = index
        self.host, self.port = self.addresses[index]
        self.server_info = info

    def _begin(
        self, call: Call[Any], op_timeout: float | None, now: float, *, retry: bool = True
    ) -> RetryState:
        return self.retry_policy.begin(
            call,
            now=now,
            timeout=self.timeout if op_timeout is None else op_timeout,
            servers=self._servers,
            monitor=self._monitor,
            operation_id=next(self._op_ids),
            retry=retry,
        )

    def _selected_bucket(self, call: Call[Any]) -> bool:
        """After a successful command: True if it selected another bucket on the home
        server (then the other servers' connections, opened with the old one, must go)."""
        if call.method != "select_bucket":
            return False
        bucket = call.params.get("bucket")
        changed = bucket != self._bucket
        self._bucket = bucket
        return changed
