"""What both clients share apart from I/O: settings, servers, retry policy, monitoring.

:class:`BaseClient` holds everything :class:`tenantkv.Client` and
:class:`tenantkv.AsyncClient` have in common and takes the one constructor
signature both expose; the drivers add only sockets, sleeping and the loop
that follows the retry state machine's decisions (:mod:`tenantkv.client.retry`).
"""

from __future__ import annotations

import ssl
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
    ``tls``
        False (default): plain TCP. True: TLS, verifying the server's
        certificate against ``tls_ca_file`` (or the system's CAs) and its name
        against the address connected to (a host name or an IP address). Or
        an ``ssl.SSLContext`` of your own, used as is.
    ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``
        With ``tls=True``: the CA bundle (PEM) that signed the server's
        certificate, and a client certificate and its key (PEM) for servers
        that require one (``tls_ca_file`` set on the server).
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
        tls: bool | ssl.SSLContext = False,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
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
        #: the TLS context connections use (None: plain TCP)
        self.ssl_context: ssl.SSLContext | None = client_ssl_context(
            tls, tls_ca_file, tls_cert_file, tls_key_file
        )

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


def client_ssl_context(
    tls: bool | ssl.SSLContext,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext | None:
    """The clients' TLS context: None for plain TCP; the context given; or a new one
    that verifies the server (certificate and host name) and may carry a client
    certificate. Raises ValueError for options that contradict each other or files
    that cannot be loaded."""
    files = {"tls_ca_file": ca_file, "tls_cert_file": cert_file, "tls_key_file": key_file}
    given = [name for name, value in files.items() if value is not None]
    if isinstance(tls, ssl.SSLContext):
        if given:
            raise ValueError(f"give an SSLContext or {', '.join(given)}, not both")
        return tls
    if not tls:
        if given:
            raise ValueError(f"{', '.join(given)} need tls=True")
        return None
    if key_file is not None and cert_file is None:
        raise ValueError("tls_key_file needs tls_cert_file")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load tls_ca_file {ca_file}: {exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load tls_cert_file {cert_file}: {exc}") from None
    return ctx


def tls_failure(exc: BaseException) -> str:
    """A readable reason for a failed TLS handshake."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).replace("_", " ").lower()
    return str(exc) or repr(exc)
