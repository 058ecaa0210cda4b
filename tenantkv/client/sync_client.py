"""The blocking client: one socket, requests answered in order, a batch API for pipelining.

    with tenantkv.Client("127.0.0.1", 7207, user="app", password="...", bucket="orders") as c:
        c.set("k", b"v")
        with c.pipeline() as p:          # one round trip for many commands
            p.get("k"); p.incr("n", initial=0)
        print(p.results)

Overload errors are retried with backoff by the shared policy
(:mod:`tenantkv.client.retry`; docs/client.md). A ``Client`` is for one thread
at a time (use one per thread; they may share a ``RetryPolicy`` and its
adaptive token bucket).
"""

from __future__ import annotations

import inspect
import select
import socket
import ssl
import time
from typing import Any

from tenantkv import errors
from tenantkv.client.base import BaseClient, tls_failure
from tenantkv.client.core import Call, ClientCore, Commands
from tenantkv.client.servers import Address
from tenantkv.protocol import Response

RECV_BYTES = 256 * 1024


def _readable_now(sock: socket.socket | ssl.SSLSocket) -> bool:
    """Is anything to read on ``sock`` right now? ``poll``, where there is one:
    ``select`` takes descriptors below 1024 only, and an application holding
    many files gives its sockets higher ones."""
    if not hasattr(select, "poll"):
        return bool(select.select([sock], [], [], 0)[0])
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Connection:
    """One socket to one server, past ``hello``."""

    __slots__ = ("_abandoned", "_ready", "_sock", "address", "closed", "core", "info")

    def __init__(
        self,
        address: Address,
        hello: Call[Any],
        connect_timeout: float,
        timeout: float | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.core = ClientCore()
        self._ready: dict[int, Response] = {}
        #: msgids whose caller timed out: their late responses are dropped
        self._abandoned: set[int] = set()
        self.closed = False
        host, port = address
        try:
            self._sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as exc:
            raise errors.ConnectFailed(f"cannot connect to {host}:{port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:  # the handshake runs here, within connect_timeout
                self._sock = ssl_context.wrap_socket(self._sock, server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                self._sock.close()
                raise errors.ConnectFailed(
                    f"TLS handshake with {host}:{port} failed: {tls_failure(exc)}"
                ) from None
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            self.info: dict[str, Any] = self.roundtrip(hello, hello.params, deadline)
            self.core.heed_limits(self.info)
        except BaseException:
            self.close()
            raise

    def roundtrip(self, call: Call[Any], params: dict[str, Any], deadline: float | None) -> Any:
        msgid, data = self.core.request(call.method, params)
        self.send(data)
        return self.core.outcome(self.wait(msgid, deadline), call)

    def alive(self) -> bool:
        """False when the server closed this (idle) connection: with no request
        outstanding, anything readable is its EOF or its closing error. A cheap,
        non-blocking look, so a request is not sent into a connection already gone."""
        if self.closed:
            return False
        if self._ready or not _readable_now(self._sock):
            return True
        self.close()
        return False

    def send(self, data: bytes) -> None:
        if self.closed:
            raise errors.RequestNotSent("the connection is closed")
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise errors.RequestNotSent(f"send failed: {exc}") from None

    def wait(self, msgid: int, deadline: float | None) -> Response:
        while msgid not in self._ready:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._abandoned.add(msgid)
                    raise errors.ClientTimeout("no response within the timeout")
                self._sock.settimeout(left)
            else:
                self._sock.settimeout(None)
            try:
                data = self._sock.recv(RECV_BYTES)
            except TimeoutError:
                continue
            except OSError as exc:
                self.close()
                raise errors.PeerClosed(f"receive failed: {exc}") from None
            if not data:
                self.close()
                raise errors.PeerClosed("the server closed the connection")
            closing: Response | None = None
            for resp in self.core.receive(data):
                if resp.msgid is None and resp.error is not None:
                    closing = resp  # the server is closing this connection
                elif resp.msgid in self._abandoned:
                    self._abandoned.discard(resp.msgid)
                else:
                    self._ready[resp.msgid] = resp
            if closing is not None:
                # Keep the answers that came with it: the request waited for may
                # be among them (it ran), even though the connection is done.
                self.close()
                if msgid not in self._ready:
                    raise errors.from_wire(closing.error)
        return self._ready.pop(msgid)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()


def _try_next_server(exc: errors.TenantKVError) -> bool:
    """May the client look for its home server further down the address list?"""
    return isinstance(exc, errors.ConnectionClosed) or exc.has_label(errors.SYSTEM_OVERLOADED)


class Client(BaseClient):
    """The blocking client; the constructor arguments are :class:`BaseClient`'s."""

    #: how the retry loop waits and reads time (tests replace them)
    _sleep = staticmethod(time.sleep)
    _clock = staticmethod(time.monotonic)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conns: list[_Connection | None] = [None] * len(self.addresses)
        self._closed = False
        last: errors.TenantKVError | None = None
        for i in range(len(self.addresses)):
            try:
                conn = self._open(i)
            except errors.TenantKVError as exc:
                if not _try_next_server(exc) or i == len(self.addresses) - 1:
                    raise
                last = exc
                continue
            self._conns[i] = conn
            self._set_home(i, conn.info)
            return
        raise last or errors.ConnectionClosed("no server to connect to")  # pragma: no cover

    __init__.__doc__ = BaseClient.__doc__
    __init__.__signature__ = inspect.signature(BaseClient.__init__)  # type: ignore[attr-defined]

    # -- plumbing -----------------------------------------------------------------

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        clock = self._clock
        op = self._begin(call, op_timeout, clock())
        attempt = op.first_attempt()
        while True:
            if attempt.delay > 0:
                self._sleep(attempt.delay)
            try:
                conn = self._connection(attempt.server)
            except errors.TenantKVError as exc:
                attempt = op.after_unavailable(attempt, exc, clock())
                continue
            try:
                result = conn.roundtrip(call, op.sending(attempt, clock()), op.deadline)
            except BaseException as exc:
                attempt = op.after_failure(exc, clock())
                continue
            op.succeeded(clock())
            if self._selected_bucket(call):
                self._close_others()
            return result

    def _connection(self, index: int) -> _Connection:
        """The connection to server ``index``, reconnected (a new ``hello``, with the
        selected bucket) when the server closed it — after a restart, say."""
        if self._closed:
            raise errors.ConnectionClosed("the client is closed")
        conn = self._conns[index]
        if conn is not None and conn.alive():
            return conn
        conn = self._conns[index] = self._open(index)
        return conn

    def _open(self, index: int) -> _Connection:
        """A new connection to server ``index``, past hello (tests override this)."""
        return _Connection(
            self.addresses[index],
            self._hello_call(),
            self.connect_timeout,
            self.timeout,
            self.ssl_context,
        )

    def _home(self) -> _Connection:
        return self._connection(self._servers.home)

    def _close_others(self) -> None:
        for i, conn in enumerate(self._conns):
            if conn is not None and i != self._servers.home:
                conn.close()
                self._conns[i] = None

    def pipeline(self, *, raise_on_error: bool = True) -> Pipeline:
        """Queue commands and send them in one write; see :class:`Pipeline`."""
        return Pipeline(self, raise_on_error=raise_on_error)

    def close(self) -> None:
        self._closed = True
        for conn in self._conns:
            if conn is not None:
                conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pipeline(Commands):
    """Collects commands; ``execute()`` sends them at once and returns their results.

    As a context manager it executes on exit. With ``raise_on_error`` (default)
    the first failed command's error is raised after all responses are read;
    otherwise ``results`` holds the exception in that slot.

    A pipeline goes to the home server in one write and every command in it
    gets **one attempt**: an overload error is returned (or raised) like any
    other, never retried, so that the results keep the order and the effects
    of the batch as sent. Each command still carries the deadline
    (``timeout_ms``) and produces its monitoring events (attempt 1).
    """

    def __init__(self, client: Client, *, raise_on_error: bool = True) -> None:
        self._client = client
        self._calls: list[Call[Any]] = []
        self.raise_on_error = raise_on_error
        self.results: list[Any] = []

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> None:
        # Queued calls share the timeout given to execute().
        self._calls.append(call)

    def execute(self, timeout: float | None = None) -> list[Any]:
        c = self._client
        calls, self._calls = self._calls, []
        conn = c._home()
        clock = c._clock
        now = clock()
        ops = [c._begin(call, timeout, now, retry=False) for call in calls]
        ids, chunks = [], []
        for call, op in zip(calls, ops, strict=True):
            msgid, data = conn.core.request(call.method, op.params(now))
            ids.append(msgid)
            chunks.append(data)
        first = ops[0].first_attempt() if ops else None
        for op in ops:
            assert first is not None
            op.started(first, now)
        results: list[Any] = []
        first_error: BaseException | None = None
        try:
            conn.send(b"".join(chunks))
            for msgid, call, op in zip(ids, calls, ops, strict=True):
                try:
                    results.append(conn.core.outcome(conn.wait(msgid, op.deadline), call))
                except errors.ServerError as exc:
                    # Kept as a result, not raised here: without its traceback, which
                    # holds this frame and so ``results`` and the error again, the
                    # error is freed by reference counting, not by a collection (a
                    # throttled client gets thousands a second; a full collection
                    # stalls every thread of the process).
                    exc.__traceback__ = None
                    op.failed(exc, clock())
                    results.append(exc)
                    first_error = first_error or exc
                else:
                    op.succeeded(clock())
                    if c._selected_bucket(call):
                        c._close_others()
        except BaseException as exc:
            # The connection or the time is gone: every command still waiting fails with it.
            for op in ops[len(results) :]:
                op.failed(exc, clock())
            raise
        self.results = results
        if first_error is not None and self.raise_on_error:
            raise first_error
        return results

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None and self._calls:
            self.execute()
