"""A worker process of ``serve --workers N``: a whole server minus what is node-wide.

The supervisor (:mod:`tenantkv.server.supervisor`) starts each worker as
``python -m tenantkv.server.worker_main FD``, where ``FD`` is the worker's end of
its control channel (:mod:`tenantkv.server.control`). The first message on it
(length-prefixed, read before Trio starts) says which worker this is, the
configuration in force and which inherited descriptors are the listening
sockets. The worker then runs the ordinary :class:`~tenantkv.server.server.Server`
with a :class:`WorkerLink`, which is where a worker differs from a single
process:

- it accepts on the shared listening sockets (the kernel spreads connections);
- it opens the shared LMDB environment without the data directory's lock (the
  supervisor holds it, and this process inherited it);
- after every change to shared state (users, buckets, throttle properties,
  parameters) it tells the supervisor, which tells the other workers to reload
  that state from LMDB (:mod:`tenantkv.server.shared_state`);
- its tenant throttle runs on leases: every slice it reports what its clients
  asked of each bucket and applies the allowance rates the supervisor grants
  it (:mod:`tenantkv.admission.quota_lease`);
- ``server_status`` answers for the node (every worker's document, merged);
- only worker 0 runs the expiry pager and creates the first admin user.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import trio

from tenantkv.admission.quota_lease import lease_from_wire, usage_to_wire
from tenantkv.config import Config
from tenantkv.server.control import Channel, ChannelClosed, Message

if TYPE_CHECKING:
    from tenantkv.server.node import Node

log = logging.getLogger("tenantkv.server")

#: The init message is length-prefixed (4 bytes, big-endian): it is read with a
#: blocking socket before Trio starts, and nothing after it may be consumed.
INIT_HEADER = struct.Struct(">I")


class WorkerLink:
    """A worker's side of the control channel, and what it was told at start."""

    def __init__(self, init: Message, sock: socket.socket) -> None:
        self.index: int = init["index"]
        self.listen_fds: list[int] = list(init["listen_fds"])
        self.resp_fds: list[int] = list(init["resp_fds"])
        self.expiry_pager: bool = bool(init["expiry_pager"])
        self.workers: int = init["workers"]
        self._sock = sock
        self._channel: Channel | None = None
        self._report_soon = trio.Event()
        #: leases applied and calls that failed (the status document reads them)
        self.leases_applied = 0
        self.lease_failures = 0

    @property
    def channel(self) -> Channel:
        """Made on first use, in Trio (the bootstrap may write before ``run``)."""
        if self._channel is None:
            self._sock.setblocking(False)
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(self._sock))
            self._channel = Channel(stream, f"worker {self.index}")
        return self._channel

    @property
    def bootstraps(self) -> bool:
        """Worker 0 creates the first admin user and drops dangling roles: once."""
        return self.index == 0

    def listeners(self, fds: Sequence[int]) -> list[trio.SocketListener]:
        return [
            trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
            for fd in fds
        ]

    async def run(self, node: Node, task_status: trio.TaskStatus[None]) -> None:
        """Serve the channel and keep the throttle's lease fresh, until the
        supervisor goes away — then stop the server: a worker never outlives it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._lease_loop, node)
            task_status.started()
            await self.channel.run(lambda msg: self._handle(node, msg))
            log.warning("worker %d: the supervisor went away; stopping", self.index)
            nursery.cancel_scope.cancel()
        node.request_stop()

    async def ready(self, host: str, port: int, resp_port: int | None) -> None:
        await self.channel.send(
            {"type": "ready", "host": host, "port": port, "resp_port": resp_port}
        )

    async def changed(self) -> None:
        """Shared state changed here (and is committed): the others must reload it."""
        with contextlib.suppress(ChannelClosed):
            await self.channel.send({"type": "changed", "worker": self.index})

    async def node_documents(self) -> list[dict[str, Any]]:
        """Every worker's status document (this one's included), from the supervisor."""
        answer = await self.channel.call({"type": "node_status"})
        return list(answer.get("workers") or [])

    def report_soon(self) -> None:
        """The throttle saw a demand event (a first connection, a newly hungry
        bucket): report now instead of at the end of the slice."""
        self._report_soon.set()

    async def _lease_loop(self, node: Node) -> None:
        throttle = node.throttle
        throttle.on_demand_event = self.report_soon
        while True:
            with trio.move_on_after(throttle.slice_secs):
                await self._report_soon.wait()
            self._report_soon = trio.Event()
            try:
                answer = await self.channel.call(
                    {"type": "usage", "usage": usage_to_wire(throttle.usage())}
                )
                lease = lease_from_wire(answer["lease"])
            except (ChannelClosed, KeyError, ValueError) as exc:
                # Keep the last lease: it still sums to no more than the node's limits.
                self.lease_failures += 1
                log.warning("worker %d: no lease this slice: %s", self.index, exc)
                continue
            throttle.apply_lease(lease)
            self.leases_applied += 1
            node.gate.wake()

    async def _handle(self, node: Node, msg: Message) -> Message | None:
        from tenantkv.server import shared_state
        from tenantkv.server.status import status_document

        kind = msg.get("type")
        if kind == "refresh":
            await shared_state.reload(node)
            return None
        if kind == "status":
            return {"status": status_document(node)}
        if kind == "reload_config":
            node.reload_config(Config().with_values(msg["config"], source="the config file"))
            return None
        log.warning("worker %d: unknown control message %r", self.index, kind)
        return None


def read_init(sock: socket.socket) -> Message:
    """The supervisor's first message (blocking, before Trio runs)."""

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise SystemExit("tenantkv worker: the supervisor closed the channel at start")
            buf += chunk
        return buf

    (size,) = INIT_HEADER.unpack(exactly(INIT_HEADER.size))
    init = msgpack.unpackb(exactly(size), strict_map_key=False)
    if not isinstance(init, dict) or init.get("type") != "init":
        raise SystemExit("tenantkv worker: the first control message must be init")
    return init
