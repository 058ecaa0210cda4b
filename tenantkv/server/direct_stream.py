"""A plain TCP connection's stream, read and written on its socket directly.

Trio's ``SocketStream`` makes every ``receive_some`` and ``send_all`` a
checkpoint: after a system call that did not have to wait, it still yields
to the scheduler. An unpipelined request then costs up to three passes through
the scheduler (the wait for it, and one after each of the receive and the
send), each resuming the session's whole stack of coroutines.
:class:`DirectSocketStream` makes one system call per receive and per send,
and yields once per request:

* a **send** yields after writing while that pays: when the connection reads
  again, its next request is already there (the other connections ran
  meanwhile; a busy server serves its connections round-robin, and nobody
  waits in ``epoll``). When the request was not there anyway (a lone client
  waiting for each answer), the next sends do not yield — the wait for the
  next request is the yield — except every :data:`PROBE_SENDS`-th, which
  tries again;
* a **receive** reads at once; only when nothing has arrived does it wait
  for the socket (that wait is the yield, and where a cancel lands). When the
  bytes were there and no send yielded just before, it yields once after
  reading, shielded from cancellation as ``SocketStream`` does, so the bytes
  read are never lost to a cancel (the session checks its own cancel flag
  after every receive).

So no connection reads twice without yielding in between. The server wraps
each plain TCP connection in one (TLS connections keep ``SSLStream``); the
session sees an ordinary :class:`trio.abc.Stream`.
"""

from __future__ import annotations

import errno
import os

import trio

#: What ``receive_some()`` reads without a size (the session always passes one).
DEFAULT_RECEIVE_BYTES = 64 * 1024
#: While sends do not yield, every this many sends one does, to see whether
#: yielding finds the next request waiting again.
PROBE_SENDS = 8


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
        #: sends yield (see the module doc): while that finds the next request
        #: there when the connection reads again
        self._yield_sends = True
        self._sends = 0
        #: the last send yielded, and nothing was received since
        self._send_yielded = False

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
            if self._send_yielded:
                # The send yielded: keep doing so while that finds the next
                # request here (others ran meanwhile, no wait was needed).
                self._send_yielded = False
                self._yield_sends = not waited
            elif not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the connection was closed")
        try:
            sent = os.write(self._fd, data)  # usually all of it: no view needed
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise _stream_error(exc) from exc
        if sent < len(data):
            await self._send_rest(data, sent)
        self._sends += 1
        if self._yield_sends or self._sends % PROBE_SENDS == 0:
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._send_yielded = True

    async def _send_rest(self, data: bytes | bytearray | memoryview, sent: int) -> None:
        """What the socket did not take at once, as it takes it."""
        with memoryview(data) as view:
            total = len(view)
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
