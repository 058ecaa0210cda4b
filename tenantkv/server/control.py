"""The control channel between the supervisor and a worker (``serve --workers N``).

One Unix socket pair per worker, inherited at spawn. Every message is a frozen
dataclass of :mod:`tenantkv.server.control_messages` (docs/scaling.md lists
them all), sent as its msgpack wire form. Either side may send a one-way
message, or *call*: the message carries an ``id`` and the other side answers
with the call's reply and ``reply_to``. Each side serves the channel with a
dispatch table: message class -> handler. Every message is small (a usage
report, a lease, a status document), so one ``Unpacker`` bounded by
:data:`MAX_MESSAGE_BYTES` decodes the stream; a peer that sends something
malformed is a bug and ends the channel.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import msgpack
import trio

from tenantkv.server.control_messages import Call, ControlMessage, R, Reply, Wire, decode

log = logging.getLogger("tenantkv.server")

#: Largest message: a status document of a node with many buckets fits easily.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: A call the other side does not answer within this fails (a stuck or dead peer).
CALL_TIMEOUT_SECS = 5.0

#: A handler gets its message (of the class it is registered for) and returns
#: the call's reply, or None for a one-way message.
Handler = Callable[[Any], Awaitable[Reply | None]]
Dispatch = Mapping[type[ControlMessage], Handler]


class ChannelClosed(Exception):
    """The peer went away (or the channel was closed) before answering."""


class RemoteError(ChannelClosed):
    """The peer's handler failed: to the caller, as if the peer had gone."""


class Channel:
    """Both ends use this: ``send`` one-way, ``call`` and wait, ``run`` to serve."""

    def __init__(self, stream: trio.abc.Stream, name: str) -> None:
        self._stream = stream
        self.name = name
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[Wire]]] = {}
        self.closed = False
        #: messages received, and handlers begun (see :meth:`_handle`)
        self._received = 0
        self._begun = 0
        self._turn = trio.lowlevel.ParkingLot()

    async def send(self, msg: ControlMessage) -> None:
        await self._send_wire(msg.to_wire())

    async def _send_wire(self, wire: Wire) -> None:
        data = msgpack.packb(wire)
        async with self._send_lock:
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ChannelClosed(f"{self.name}: {exc}") from None

    async def call(self, msg: Call[R], *, patient: bool = False) -> R:
        """Send ``msg`` and wait for its reply: at most CALL_TIMEOUT_SECS, or
        (``patient``) until it comes or the channel closes — a write waits for
        its commit however long the disk takes, and must never be reported as
        failed while it may still commit."""
        if self.closed:
            raise ChannelClosed(f"{self.name}: closed")
        msg_id = next(self._ids)
        done, box = trio.Event(), list[Wire]()
        self._pending[msg_id] = (done, box)
        try:
            await self._send_wire({**msg.to_wire(), "id": msg_id})
            with trio.move_on_after(math.inf if patient else CALL_TIMEOUT_SECS):
                await done.wait()
        finally:
            self._pending.pop(msg_id, None)
        if not box:
            raise ChannelClosed(f"{self.name}: no answer to {msg.TYPE!r}")
        if "error" in box[0]:
            raise RemoteError(f"{self.name}: {msg.TYPE!r} failed: {box[0]['error']}")
        return cast(R, msg.REPLY.from_wire(box[0]))

    async def run(self, dispatch: Dispatch) -> None:
        """Read messages until the peer closes: answers resolve calls; every other
        message goes to its handler in ``dispatch``, in its own task (a slow
        status never holds a lease)."""
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
                    for wire in unpacker:
                        if not isinstance(wire, dict):
                            raise ValueError(f"{self.name}: a message must be a map")
                        reply_to = wire.get("reply_to")
                        if reply_to is not None:
                            waiter = self._pending.get(reply_to)
                            if waiter is not None:
                                waiter[1].append(wire)
                                waiter[0].set()
                        else:
                            nursery.start_soon(self._handle, dispatch, wire, self._received)
                            self._received += 1
                nursery.cancel_scope.cancel()
        finally:
            self.closed = True
            for done, _ in self._pending.values():
                done.set()

    async def _handle(self, dispatch: Dispatch, wire: Wire, seq: int) -> None:
        """Handle the ``seq``-th message received. Handlers begin in arrival order:
        this task waits until the one before has begun, and nothing else runs
        before this handler's first checkpoint — so a worker's writes are
        submitted to the node's writer in the order it sent them (Trio starts a
        batch of new tasks in no set order)."""
        while self._begun != seq:
            await self._turn.park()
        self._begun += 1
        self._turn.unpark_all()
        answer: Wire | None
        try:
            msg = decode(wire)
            handler = dispatch.get(type(msg))
            if handler is None:
                raise ValueError(f"{type(msg).__name__} is not sent to this side")
            reply = await handler(msg)
            answer = None if reply is None else reply.to_wire()
        except Exception as exc:
            log.exception("%s: handling %r failed", self.name, wire.get("type"))
            answer = {"error": str(exc)}
        msg_id = wire.get("id")
        if msg_id is not None:
            with contextlib.suppress(ChannelClosed):
                await self._send_wire({**(answer or {}), "reply_to": msg_id})

    async def aclose(self) -> None:
        self.closed = True
        await self._stream.aclose()
