"""The Trio client: concurrent calls from many tasks pipeline on one connection.

    async with tenantkv.AsyncClient("127.0.0.1", 7207, user="app", password="...",
                                    bucket="orders") as c:
        await c.set("k", b"v")
        async with trio.open_nursery() as n:      # these share one round trip
            for i in range(100):
                n.start_soon(c.get, f"key{i}")

A background task reads responses and wakes the caller waiting for each msgid.
"""

from __future__ import annotations

import math
from typing import Any

import trio

from tenantkv import errors
from tenantkv._version import __version__
from tenantkv.client.core import CLIENT_NAME, Call, ClientCore, Commands, hello_call
from tenantkv.config import DEFAULT_PORT
from tenantkv.protocol import Response

RECV_BYTES = 256 * 1024


class _Slot:
    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: Response | None = None


class AsyncClient(Commands):
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
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        self._hello = hello_call(
            user, password, bucket, client_name, __version__, nonblocking_throttle
        )
        self._core = ClientCore()
        self._waiting: dict[int, _Slot] = {}
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._nursery_cm: Any = None
        self._failure: errors.TenantKVError | None = None
        self.server_info: dict[str, Any] = {}

    async def __aenter__(self) -> AsyncClient:
        try:
            with trio.fail_after(self._connect_timeout):
                self._stream = await trio.open_tcp_stream(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise errors.ConnectionClosed(
                f"cannot connect to {self.host}:{self.port}: {exc!r}"
            ) from None
        self._nursery_cm = trio.open_nursery()
        nursery = await self._nursery_cm.__aenter__()
        nursery.start_soon(self._receive_loop)
        try:
            self.server_info = await self._execute(self._hello)
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self._fail(errors.ConnectionClosed("the client is closed"))
            with trio.CancelScope(shield=True):
                await stream.aclose()
        if self._nursery_cm is not None:
            cm, self._nursery_cm = self._nursery_cm, None
            await cm.__aexit__(None, None, None)

    def _fail(self, exc: errors.TenantKVError) -> None:
        if self._failure is None:
            self._failure = exc
        for slot in self._waiting.values():
            slot.event.set()

    async def _receive_loop(self) -> None:
        stream = self._stream
        assert stream is not None
        try:
            while True:
                data = await stream.receive_some(RECV_BYTES)
                if not data:
                    self._fail(errors.ConnectionClosed("the server closed the connection"))
                    return
                for resp in self._core.receive(data):
                    if resp.msgid is None and resp.error is not None:
                        self._fail(errors.from_wire(resp.error))
                        return
                    slot = self._waiting.pop(resp.msgid, None)
                    if slot is not None:  # else its caller gave up
                        slot.response = resp
                        slot.event.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._fail(errors.ConnectionClosed(f"connection lost: {exc!r}"))
        except errors.TenantKVError as exc:
            self._fail(exc)

    async def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        if self._failure is not None:
            raise self._failure
        stream = self._stream
        if stream is None:
            raise errors.ConnectionClosed("the client is not connected")
        t = self.timeout if op_timeout is None else op_timeout
        msgid, data = self._core.request(call.method, call.params)
        slot = _Slot()
        self._waiting[msgid] = slot
        try:
            with trio.move_on_after(math.inf if t is None else t) as scope:
                async with self._send_lock:
                    await stream.send_all(data)
                await slot.event.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise errors.ConnectionClosed(f"send failed: {exc!r}") from None
        finally:
            self._waiting.pop(msgid, None)
        if scope.cancelled_caught:
            raise errors.ClientTimeout(
                f"no response to {call.method} within {t} s", command=call.method
            )
        if slot.response is None:
            assert self._failure is not None
            raise self._failure
        return self._core.outcome(slot.response, call)
