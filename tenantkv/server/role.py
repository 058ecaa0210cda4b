"""Process roles: what differs between the processes that serve clients.

A :class:`~tenantkv.server.server.Server` runs one
:class:`~tenantkv.server.node.Role` (declared beside the node it serves, as
the node's other seams are). The role says
what listens, how state is loaded and the process announced, how figures are
reported and how it drains; and it is the node's seam for what a role may
keep elsewhere (the writer, the connection table, shared state). Two roles
exist:

- :class:`SingleProcess` (here): the whole server in one process, the default;
- :class:`tenantkv.server.worker.WorkerLink`: one worker of ``serve --workers
  N``, whose node-wide parts live in the supervisor.

- :class:`tenantkv.cluster.node_role.ClusterNode`: ``serve --cluster``, the whole
  server in one process that is also one node of a cluster coordinated by etcd.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import trio

from tenantkv import errors
from tenantkv.admission.connection_table import Admission
from tenantkv.admission.gate import ParameterTable
from tenantkv.config import Config
from tenantkv.server import sd_notify
from tenantkv.server.node import Announcement, Listeners, Node

if TYPE_CHECKING:
    from tenantkv.storage.group_commit import GroupCommitWriter
    from tenantkv.storage.ops import WriteOp

log = logging.getLogger("tenantkv.server")


def admission_limits(config: Config) -> dict[str, int]:
    """The connection table's limits for a new connection, from the settings."""
    return {
        "max_connections": config.max_connections,
        "per_address": config.max_connections_per_address,
        "reserved_per_address": config.admin_reserved_connections_per_address,
    }


def hello_limits(config: Config) -> dict[str, Any]:
    """The connection table's limits at hello, from the settings."""
    return {
        "max_connections": config.max_connections,
        "reserved_for_admins": min(config.admin_reserved_connections, config.max_connections - 1),
        "per_address": config.max_connections_per_address,
    }


class SingleProcess:
    """The whole server in one process: it listens, bootstraps, commits, keeps the
    connection table and serves ``/metrics`` itself."""

    shared_storage = False

    def identity(self) -> dict[str, Any]:
        return {}

    def figures(self) -> dict[str, Any]:
        return {}

    async def listen(self, config: Config) -> Listeners:
        msgpack = await trio.open_tcp_listeners(config.port, host=config.host)
        try:
            return Listeners(msgpack, await open_resp_listeners(config))
        except BaseException:
            for listener in msgpack:  # the server does not start: nothing listens
                listener.socket.close()
            raise

    async def load(self, node: Node, nursery: trio.Nursery) -> None:
        await bootstrap(node)
        nursery.start_soon(node.expiry_pager.run)

    def start_metrics(self, node: Node) -> int | None:
        if node.config.metrics_port is None:
            return None
        from tenantkv.metrics import start_metrics_server
        from tenantkv.server.status import status_document

        return start_metrics_server(
            lambda: status_document(node),
            node.config.metrics_port,
            addr=node.config.metrics_host,
            healthy=lambda: not node.shutting_down,
        )

    async def announce(self, node: Node, where: Announcement, ready_file: str | None) -> None:
        announce_listening(where)
        if ready_file:
            write_ready_file(ready_file, where, node=self.identity().get("node"))
        sd_notify.ready(f"listening on {where.host}:{where.port}")

    async def status(self, node: Node) -> dict[str, Any]:
        from tenantkv.server.status import status_document

        return status_document(node)

    async def move_slots(self, session: Any, drain: list[str], params: dict[str, Any]) -> Any:
        """A rebalance or a node's removal: cluster roles only."""
        raise errors.BadValue("this node is in no cluster")

    async def drain(self, node: Node) -> None:
        """The local writer is drained when it stops (Node.stop_writer)."""

    def writer(self, node: Node) -> GroupCommitWriter:
        from tenantkv.storage.group_commit import GroupCommitWriter

        return GroupCommitWriter(
            node.engine, node._deliver_threadsafe, taken=node._taken_threadsafe
        )

    def bind_parameters(self, table: ParameterTable) -> None:
        """Every parameter applies as set."""

    async def changed(self) -> None:
        """This process is the node: it sees the change already."""

    def sharing(self, op: WriteOp) -> AbstractAsyncContextManager[None]:
        """This process's storage is the only copy: nothing to change first."""
        return contextlib.nullcontext()

    async def admit_connection(self, node: Node, conn_id: int, addr: str) -> Admission:
        return node.connection_table.admit(
            conn_id, addr, trio.current_time(), **admission_limits(node.config)
        )

    async def connection_authenticated(
        self, node: Node, conn_id: int, *, admin: bool
    ) -> str | None:
        return node.connection_table.authenticated(
            conn_id, admin=admin, **hello_limits(node.config)
        )

    def connection_closed(self, node: Node, conn_id: int) -> None:
        node.connection_table.closed(conn_id)


async def bootstrap(node: Node) -> None:
    """First start: the admin user; at every start: roles on deleted buckets go."""
    await node.accounts.bootstrap_admin()
    await node.accounts.drop_dangling_roles(node.engine.buckets)


class ListenError(OSError):
    """A port could not be listened on; the message names which."""


async def open_resp_listeners(config: Config) -> list[trio.SocketListener]:
    """The RESP front door's listeners (none when it is off)."""
    if not config.resp_enabled:
        return []
    try:
        return await trio.open_tcp_listeners(config.resp_port, host=config.host)
    except OSError as exc:
        raise resp_listen_error(config, exc) from exc


def resp_listen_error(config: Config, exc: OSError) -> ListenError:
    """Name the door: the main port is listening, this one is not."""
    return ListenError(
        f"RESP port {config.host}:{config.resp_port}: {exc.strerror}"
        " (set resp_port, or resp_enabled = false)"
    )


def announce_listening(where: Announcement, workers: int | None = None) -> None:
    """The node's ``listening on`` lines (DESIGN.md §7: scripts wait for them)."""
    tls = " (TLS)" if where.tls else ""
    of = f" ({workers} workers)" if workers is not None else ""
    log.info("listening on %s:%d%s%s", where.host, where.port, tls, of)
    if where.resp_port is not None:
        log.info("RESP (Redis protocol) front door on %s:%d%s", where.host, where.resp_port, tls)
    if where.metrics_port:
        log.info("metrics on http://%s:%d/metrics", where.metrics_host, where.metrics_port)


def write_ready_file(path: str, where: Announcement, *, node: str | None = None) -> None:
    """The ready file (DESIGN.md §7), written whole or not at all; ``node`` is the
    node's name in its cluster (None when it is in none)."""
    data: dict[str, Any] = {
        "host": where.host,
        "port": where.port,
        "resp_port": where.resp_port,
        "metrics_port": where.metrics_port,
        "pid": os.getpid(),
        "node": node,
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
