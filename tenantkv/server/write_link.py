"""A worker's write link: its writes to the node's writer, off the supervisor's event loop.

With ``serve --workers N`` every write of every worker is committed by the
supervisor's one group-commit writer (:mod:`tenantkv.server.remote_writer`).
On the control channel a write message took a turn of the supervisor's
event loop on the way in (receive, a task, decode, submit) and another on
the way out (the writer thread's wake-up of the loop, the task, encode,
send): the loop was on every durable write's path, and its turns waited
for a core with everything else the loop does (leases, status, logins).

So each worker has a second socket pair for its writes alone. In the
supervisor, :class:`WriteLinkServer` serves it with a thread: it reads the
worker's ``write`` messages, decodes them and queues each on the node's
writer; the writer's thread answers each once it is durable, writing the
reply frame to the socket itself (:meth:`WriteLinkServer.answer`). The
worker's end is an ordinary :class:`~tenantkv.server.control.Channel` (it
only calls ``write``), so a write's wire form, answer and failure modes are
those of the control channel's: a write whose answer is lost (the worker or
the supervisor killed, the link closed) is reported failed, never retryable,
and one that was acknowledged was durable.

A write whose answer needs the event loop — client-side caching must push
its invalidations first, a bucket created or dropped changes the
supervisor's bucket table — is answered from the loop instead
(:meth:`tenantkv.server.supervisor.Supervisor._answer_on_loop`), through
the same :meth:`WriteLinkServer.answer`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from tenantkv.server import control_messages as m
from tenantkv.server.control import CALL_TIMEOUT_SECS, MAX_MESSAGE_BYTES

log = logging.getLogger("tenantkv.supervisor")

#: Bytes read from the socket at a time.
RECEIVE_BYTES = 256 * 1024

#: What the supervisor does with a worker's write message: its ``ops`` and the
#: function that answers it (with the reply's wire form), from any thread.
Submit = Callable[[list[Any], Callable[[dict[str, Any]], None]], None]


class WriteLinkServer:
    """The supervisor's end of one worker's write link."""

    def __init__(self, sock: socket.socket, name: str, submit: Submit) -> None:
        self.name = name
        self._submit = submit
        sock.setblocking(True)
        # Answers are written by other threads (the writer's, the loop's helper)
        # while this one's thread blocks in recv. A worker that stops reading
        # (stopped, not dead) must not hold the node's writer for longer than a
        # call may wait: sends time out (the kernel's, so recv still blocks as
        # long as the worker is quiet).
        secs = int(CALL_TIMEOUT_SECS)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", secs, 0))
        self._sock = sock
        self._send_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"{name} writes", daemon=True)
        #: messages received and answers sent (statistics, and what tests watch)
        self.received = 0
        self.answered = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """End the link (the worker is gone): the thread sees the socket close."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _serve(self) -> None:
        """Read write messages until the worker closes its end; queue each."""
        unpacker = msgpack.Unpacker(max_buffer_size=MAX_MESSAGE_BYTES, strict_map_key=False)
        try:
            while True:
                try:
                    data = self._sock.recv(RECEIVE_BYTES)
                except OSError:
                    data = b""
                if not data:
                    break
                unpacker.feed(data)
                for wire in unpacker:
                    self._one(wire)
        except Exception:  # a malformed message is a bug: the link ends, as a channel does
            log.exception("%s: write link failed", self.name)
        finally:
            self.close()
            with self._send_lock:
                self._sock.close()

    def _one(self, wire: Any) -> None:
        msg = m.decode(wire)
        msg_id = wire.get("id")
        if not isinstance(msg, m.Write) or not isinstance(msg_id, int):
            raise m.MalformedMessage(f"{type(msg).__name__} is not sent on a write link")
        if not isinstance(msg.ops, list):
            raise m.MalformedMessage("a write message needs a list of ops")
        self.received += 1

        def answer(reply: dict[str, Any]) -> None:
            self.answer(msg_id, reply)

        try:
            self._submit(msg.ops, answer)
        except Exception as exc:  # not queued: it did not run, and the worker hears so
            log.exception("%s: a write message could not be queued", self.name)
            answer({"error": str(exc)})

    def answer(self, msg_id: int, reply: dict[str, Any]) -> None:
        """Send the answer to message ``msg_id`` (any thread). A worker that is
        gone, or does not read within the call timeout, loses its link: its
        writes in flight are then reported failed (their outcome unknown)."""
        data = msgpack.packb({**reply, "reply_to": msg_id})
        with self._send_lock:
            if self._closed:
                return
            try:
                self._sock.sendall(data)
                self.answered += 1
                return
            except OSError as exc:
                failure: OSError | None = exc
        if failure is not None and not self._closed:
            log.error("%s: write answers cannot be sent (%s); closing its link", self.name, failure)
            self.close()
