"""The Trio client: concurrent calls from many tasks pipeline on one connection.

    async with tenantkv.AsyncClient("127.0.0.1", 7207, user="app", password="...",
                                    bucket="orders") as c:
        await c.set("k", b"v")
        async with trio.open_nursery() as n:      # these share one round trip
            for i in range(100):
                n.start_soon(c.get, f"key{i}")

A background task per connection reads responses and wakes the caller waiting
for each msgid. Overload errors are retried with backoff by the policy the
blocking client uses too (:mod:`tenantkv.client.retry`); only the sleeping
(``trio.sleep``) is this module's own.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import trio

from tenantkv import errors
from tenantkv.client.base import BaseClient, tls_failure
from tenantkv.client.core import Call, ClientCore
from tenantkv.client.servers import Address
from tenantkv.protocol import Response

RECV_BYTES = 256 * 1024


class _Slot:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None


class _Connection:
    """One stream to one server and the table of callers waiting for responses."""

    def __init__(self, address: Address, stream: trio.abc.Stream) -> None:
        self.address = address
        self.stream: trio.abc.Stream | None = stream
        self.core = ClientCore()
        self.waiting: dict[int, _Slot] = {}
        self.send_lock = trio.Lock()
        #: set once the connection is unusable; raised to every later caller
        self.failure: errors.TenantKVError | None = None
        self.info: dict[str, Any] = {}

    def fail(self, exc: errors.TenantKVError) -> None:
        if self.failure is None:
            self.failure = exc
        for slot in self.waiting.values():
            slot.event.set()

    async def receive_loop(self) -> None:
        stream = self.stream
        assert stream is not None
        try:
            while True:
                data = await stream.receive_some(RECV_BYTES)
                if not data:
                    self.fail(errors.PeerClosed("the server closed the connection"))
                    return
                for resp in self.core.receive(data):
                    if resp.msgid is None and resp.error is not None:
                        self.fail(errors.from_wire(resp.error))
                        return
                    slot = self.waiting.pop(resp.msgid, None)
                    if slot is not None:  # else its caller gave up
                        slot.response = resp
                        slot.event.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.fail(errors.PeerClosed(f"connection lost: {exc!r}"))
        except errors.TenantKVError as exc:
            self.fail(exc)

    async def roundtrip(
        self, call: Call[Any], params: dict[str, Any], deadline: float | None
    ) -> Any:
        """Send one request and wait for its result until ``deadline`` (trio time)."""
        if self.failure is not None:  # it broke before this request went out
            raise errors.RequestNotSent(f"the connection is gone: {self.failure.errmsg}")
        stream = self.stream
        if stream is None:
            raise errors.RequestNotSent("the client is not connected")
        msgid, data = self.core.request(call.method, params)
        slot = _Slot()
        self.waiting[msgid] = slot
        try:
            with trio.move_on_at(math.inf if deadline is None else deadline) as scope:
                async with self.send_lock:
                    await stream.send_all(data)
                await slot.event.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise errors.RequestNotSent(f"send failed: {exc!r}") from None
        finally:
            self.waiting.pop(msgid, None)
        if scope.cancelled_caught:
            raise errors.ClientTimeout(
                f"no response to {call.method} within the timeout", command=call.method
            )
        if slot.response is None:
            assert self.failure is not None
            raise self.failure
        return self.core.outcome(slot.response, call)

    async def aclose(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            self.fail(errors.ConnectionClosed("the client is closed"))
            with trio.CancelScope(shield=True):
                await stream.aclose()


class AsyncClient(BaseClient):
    """The Trio client; the constructor arguments are :class:`BaseClient`'s.

    Use it as ``async with``: entering connects to the home server.
    """

    #: how the retry loop waits and reads time (trio's, so MockClock applies)
    _sleep = staticmethod(trio.sleep)
    _clock = staticmethod(trio.current_time)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conns: list[_Connection | None] = [None] * len(self.addresses)
        self._opening: list[trio.Lock] = [trio.Lock() for _ in self.addresses]
        self._nursery_cm: Any = None
        self._nursery: trio.Nursery | None = None

    __init__.__doc__ = BaseClient.__doc__
    __init__.__signature__ = inspect.signature(BaseClient.__init__)  # type: ignore[attr-defined]

    async def _open_stream(self, address: Address) -> trio.abc.Stream:
        """A connected stream to ``address`` (tests override this to skip the network)."""
        host, port = address
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise errors.ConnectFailed(f"cannot connect to {host}:{port}: {exc!r}") from None
        if self.ssl_context is None:
            return stream
        tls = trio.SSLStream(stream, self.ssl_context, server_hostname=host, https_compatible=True)
        try:
            with trio.fail_after(self.connect_timeout):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as exc:
            await stream.aclose()
            raise errors.ConnectFailed(
                f"TLS handshake with {host}:{port} failed: {tls_failure(exc.__cause__ or exc)}"
            ) from None
        return tls

    async def _open(self, index: int) -> _Connection:
        assert self._nursery is not None
        address = self.addresses[index]
        conn = _Connection(address, await self._open_stream(address))
        self._nursery.start_soon(conn.receive_loop)
        hello = self._hello_call()
        deadline = None if self.timeout is None else trio.current_time() + self.timeout
        try:
            conn.info = await conn.roundtrip(hello, hello.params, deadline)
            conn.core.heed_limits(conn.info)
        except BaseException:
            await conn.aclose()
            raise
        return conn

    async def __aenter__(self) -> AsyncClient:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            for i in range(len(self.addresses)):
                try:
                    conn = await self._open(i)
                except errors.TenantKVError as exc:
                    last = i == len(self.addresses) - 1
                    if last or not (
                        isinstance(exc, errors.ConnectionClosed)
                        or exc.has_label(errors.SYSTEM_OVERLOADED)
                    ):
                        raise
                    continue
                self._conns[i] = conn
                self._set_home(i, conn.info)
                break
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in self._conns:
            if conn is not None:
                await conn.aclose()
        if self._nursery_cm is not None:
            cm, self._nursery_cm = self._nursery_cm, None
            self._nursery = None
            await cm.__aexit__(None, None, None)

    async def _connection(self, index: int) -> _Connection:
        """The connection to server ``index``, reconnected (a new ``hello``, with the
        selected bucket) when the server closed it — after a restart, say."""
        conn = self._conns[index]
        if conn is not None and conn.failure is None:
            return conn
        if self._nursery is None:
            raise errors.ConnectionClosed("the client is not connected")
        async with self._opening[index]:
            conn = self._conns[index]
            if conn is None or conn.failure is not None:
                if conn is not None:
                    await conn.aclose()
                conn = self._conns[index] = await self._open(index)
        return conn

    async def _close_others(self) -> None:
        for i, conn in enumerate(self._conns):
            if conn is not None and i != self._servers.home:
                self._conns[i] = None
                await conn.aclose()

    async def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        clock = self._clock
        op = self._begin(call, op_timeout, clock())
        attempt = op.first_attempt()
        while True:
            if attempt.delay > 0:
                await self._sleep(attempt.delay)
            try:
                conn = await self._connection(attempt.server)
            except errors.TenantKVError as exc:
                attempt = op.after_unavailable(attempt, exc, clock())
                continue
            try:
                result = await conn.roundtrip(call, op.sending(attempt, clock()), op.deadline)
            except BaseException as exc:
                attempt = op.after_failure(exc, clock())
                continue
            op.succeeded(clock())
            if self._selected_bucket(call):
                await self._close_others()
            return result
