"""The blocking client: one socket, requests answered in order, a batch API for pipelining.

    with tenantkv.Client("127.0.0.1", 7207, user="app", password="...", bucket="orders") as c:
        c.set("k", b"v")
        with c.pipeline() as p:          # one round trip for many commands
            p.get("k"); p.incr("n", initial=0)
        print(p.results)

A ``Client`` is for one thread at a time (use one per thread).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from tenantkv import errors
from tenantkv._version import __version__
from tenantkv.client.core import CLIENT_NAME, Call, ClientCore, Commands, hello_call
from tenantkv.config import DEFAULT_PORT
from tenantkv.protocol import Response

RECV_BYTES = 256 * 1024


class Client(Commands):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        user: str,
        password: str,
        bucket: str | None = None,
        timeout: float | None = 30.0,
        connect_timeout: float = 10.0,
        client_name: str = CLIENT_NAME,
        nonblocking_throttle: bool = False,
    ) -> None:
        self.host, self.port = host, port
        #: default per-operation timeout in seconds (None = wait forever)
        self.timeout = timeout
        self._core = ClientCore()
        self._ready: dict[int, Response] = {}
        #: msgids whose caller timed out: their late responses are dropped
        self._abandoned: set[int] = set()
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise errors.ConnectionClosed(f"cannot connect to {host}:{port}: {exc}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._closed = False
        try:
            self.server_info: dict[str, Any] = self._execute(
                hello_call(user, password, bucket, client_name, __version__, nonblocking_throttle)
            )
        except BaseException:
            self.close()
            raise

    # -- plumbing -----------------------------------------------------------------

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        msgid, data = self._core.request(call.method, call.params)
        self._send(data)
        return self._core.outcome(self._wait(msgid, self._deadline(op_timeout)), call)

    def _deadline(self, timeout: float | None) -> float | None:
        t = self.timeout if timeout is None else timeout
        return None if t is None else time.monotonic() + t

    def _send(self, data: bytes) -> None:
        if self._closed:
            raise errors.ConnectionClosed("the client is closed")
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise errors.ConnectionClosed(f"send failed: {exc}") from None

    def _wait(self, msgid: int, deadline: float | None) -> Response:
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
                raise errors.ConnectionClosed(f"receive failed: {exc}") from None
            if not data:
                self.close()
                raise errors.ConnectionClosed("the server closed the connection")
            for resp in self._core.receive(data):
                if resp.msgid is None and resp.error is not None:
                    # A connection-level error (the server is closing this connection).
                    self.close()
                    raise errors.from_wire(resp.error)
                if resp.msgid in self._abandoned:
                    self._abandoned.discard(resp.msgid)
                else:
                    self._ready[resp.msgid] = resp
        return self._ready.pop(msgid)

    def pipeline(self, *, raise_on_error: bool = True) -> Pipeline:
        """Queue commands and send them in one write; see :class:`Pipeline`."""
        return Pipeline(self, raise_on_error=raise_on_error)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Pipeline(Commands):
    """Collects commands; ``execute()`` sends them at once and returns their results.

    As a context manager it executes on exit. With ``raise_on_error`` (default)
    the first failed command's error is raised after all responses are read;
    otherwise ``results`` holds the exception in that slot.
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
        ids, chunks = [], []
        for call in calls:
            msgid, data = c._core.request(call.method, call.params)
            ids.append(msgid)
            chunks.append(data)
        c._send(b"".join(chunks))
        deadline = c._deadline(timeout)
        results: list[Any] = []
        first_error: BaseException | None = None
        for msgid, call in zip(ids, calls, strict=True):
            try:
                results.append(c._core.outcome(c._wait(msgid, deadline), call))
            except errors.ServerError as exc:
                results.append(exc)
                first_error = first_error or exc
        self.results = results
        if first_error is not None and self.raise_on_error:
            raise first_error
        return results

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None and self._calls:
            self.execute()
