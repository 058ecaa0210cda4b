"""A plain TCP connection's stream, read and written on its socket directly.

Trio's ``SocketStream`` makes every ``receive_some`` and ``send_all`` a
checkpoint: after a system call that did not have to wait, it still yields
to the scheduler. An unpipelined request then costs three passes through the
scheduler (the wait for it, and one after each of the receive and the send),
each resuming the session's whole stack of coroutines.
:class:`DirectSocketStream` yields once per request instead:

* ``receive_some`` reads at once; only when nothing has arrived does it wait
  for the socket (that wait is the yield, and where a cancel lands), and when
  something had arrived it yields once after reading, shielded from
  cancellation as ``SocketStream`` does, so the bytes read are never lost to
  a cancel (the session checks its own cancel flag after every receive);
* ``send_all`` writes at once and waits only while the socket's buffer is
  full. A send that did not wait is not a checkpoint: the connection's next
  receive is, and a session never sends twice without receiving or pausing
  in between (its pauses checkpoint).

The server wraps each plain TCP connection in one (TLS connections keep
``SSLStream``); the session sees an ordinary :class:`trio.abc.Stream`.
"""

from __future__ import annotations

import errno
import os

import trio

#: What ``receive_some()`` reads without a size (the session always passes one).
DEFAULT_RECEIVE_BYTES = 64 * 1024


def _stream_error(exc: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    if exc.errno == errno.EBADF:
        return trio.ClosedResourceError("the connection was closed")
    return trio.BrokenResourceError(f"the connection broke: {exc}")


class DirectSocketStream(trio.abc.Stream):
    """``stream``'s socket, read and written with one system call each (see the
    module doc); closing closes ``stream``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._fd = stream.socket.fileno()
        self._closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the connection was closed")
        n = DEFAULT_RECEIVE_BYTES if max_bytes is None else max_bytes
        waited = False
        while True:
            try:
                data = os.read(self._fd, n)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.socket)
                waited = True
                if self._closed:
                    raise trio.ClosedResourceError("the connection was closed") from None
                continue
            except OSError as exc:
                raise _stream_error(exc) from exc
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the connection was closed")
        with memoryview(data) as view:
            sent, total = 0, len(view)
            while sent < total:
                try:
                    sent += os.write(self._fd, view[sent:])
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self.socket)
                    if self._closed:
                        raise trio.ClosedResourceError("the connection was closed") from None
                except OSError as exc:
                    raise _stream_error(exc) from exc

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self._closed = True
        await self.stream.aclose()
