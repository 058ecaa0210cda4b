"""The control channel between the supervisor and a worker (``serve --workers N``).

One Unix socket pair per worker, inherited at spawn; messages are msgpack maps
with a ``type``. Either side may send a one-way message, or *call*: the message
carries an ``id`` and the other side answers with ``{"reply_to": id, ...}``.
Every message is small (a usage report, a lease, a status document), so one
``Unpacker`` bounded by :data:`MAX_MESSAGE_BYTES` decodes the stream; a peer
that sends something malformed is a bug and ends the channel.

Messages (the payload fields; docs/scaling.md lists them with their meaning):

========================  =================  =====================================
type                      direction          fields / answer
========================  =================  =====================================
``init``                  supervisor→worker  ``index``, ``config``, ``listen_fds``,
                                             ``resp_fds``, ``expiry_pager``
``ready``                 worker→supervisor  ``host``, ``port``, ``resp_port``
``usage`` (call)          worker→supervisor  ``usage`` → ``lease``
``changed``               worker→supervisor  (shared state changed: tell the others)
``refresh``               supervisor→worker  (reload shared state from LMDB)
``reload_config``         supervisor→worker  ``config`` (SIGHUP)
``status`` (call)         supervisor→worker  → ``status`` (the worker's document)
``node_status`` (call)    worker→supervisor  → ``workers`` (every worker's document)
========================  =================  =====================================
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import trio

log = logging.getLogger("tenantkv.server")

#: Largest message: a status document of a node with many buckets fits easily.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: A call the other side does not answer within this fails (a stuck or dead peer).
CALL_TIMEOUT_SECS = 5.0

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[Message | None]]


class ChannelClosed(Exception):
    """The peer went away (or the channel was closed) before answering."""


class Channel:
    """Both ends use this: ``send`` one-way, ``call`` and wait, ``run`` to serve."""

    def __init__(self, stream: trio.abc.Stream, name: str) -> None:
        self._stream = stream
        self.name = name
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[Message]]] = {}
        self.closed = False

    async def send(self, msg: Message) -> None:
        data = msgpack.packb(msg)
        async with self._send_lock:
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(f"{self.name}: {exc}") from None

    async def call(self, msg: Message, *, patient: bool = False) -> Message:
        """Send ``msg`` and wait for its answer: at most CALL_TIMEOUT_SECS, or
        (``patient``) until it comes or the channel closes — a write waits for
        its commit however long the disk takes, and must never be reported as
        failed while it may still commit."""
        if self.closed:
            raise ChannelClosed(f"{self.name}: closed")
        msg_id = next(self._ids)
        done, box = trio.Event(), list[Message]()
        self._pending[msg_id] = (done, box)
        try:
            await self.send({**msg, "id": msg_id})
            with trio.move_on_after(math.inf if patient else CALL_TIMEOUT_SECS):
                await done.wait()
        finally:
            self._pending.pop(msg_id, None)
        if not box:
            raise ChannelClosed(f"{self.name}: no answer to {msg.get('type')!r}")
        return box[0]

    async def run(self, handler: Handler) -> None:
        """Read messages until the peer closes: answers resolve calls; every other
        message is handled in its own task (a slow status never holds a lease)."""
        unpacker = msgpack.Unpacker(max_buffer_size=MAX_MESSAGE_BYTES, strict_map_key=False)
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        data = await self._stream.receive_some(65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        break
                    unpacker.feed(data)
                    for msg in unpacker:
                        if not isinstance(msg, dict):
                            raise ValueError(f"{self.name}: a message must be a map")
                        reply_to = msg.get("reply_to")
                        if reply_to is not None:
                            waiter = self._pending.get(reply_to)
                            if waiter is not None:
                                waiter[1].append(msg)
                                waiter[0].set()
                        else:
                            nursery.start_soon(self._handle, handler, msg)
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            for done, _ in self._pending.values():
                done.set()

    async def _handle(self, handler: Handler, msg: Message) -> None:
        try:
            answer = await handler(msg)
        except Exception as exc:
            log.exception("%s: handling %r failed", self.name, msg.get("type"))
            answer = {"error": str(exc)}
        msg_id = msg.get("id")
        if msg_id is not None:
            with contextlib.suppress(ChannelClosed):
                await self.send({**(answer or {}), "reply_to": msg_id})

    async def aclose(self) -> None:
        self.closed = True
        await self._stream.aclose()
