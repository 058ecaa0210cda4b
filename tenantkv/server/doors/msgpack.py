"""The MessagePack-RPC door: requests ``[0, msgid, method, params]`` in,
responses ``[1, msgid, error, result]`` out (``docs/protocol.md``).

A thin codec: its decoder (:class:`tenantkv.protocol.RequestDecoder`) yields
requests as the executor takes them, its replies are packed onto ``out``,
and ``hello`` — the first request, and the only one before it — logs the
connection in through the one :func:`~tenantkv.server.executor.authenticate`.
Responses carry their msgid: a write answered when durable may come after a
read sent later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tenantkv import errors, protocol
from tenantkv._version import __version__
from tenantkv.server.commands import ADMIN_METHODS, COMMANDS, Command
from tenantkv.server.executor import Executor, Request, authenticate, closing_log
from tenantkv.server.msgpack_strings import register  # Redis's string commands join COMMANDS
from tenantkv.server.node import Node

log = logging.getLogger("tenantkv.session")

_pack = protocol.pack
RESPONSE = protocol.RESPONSE
HELLO_PARAMS = frozenset(
    {"user", "password", "bucket", "client", "backpressure", "nonblocking_throttle", "timeout_ms"}
)


class MsgpackDoor:
    """The codec of one MessagePack-RPC connection."""

    protocol_name = "msgpack"
    commands = COMMANDS
    admin_methods = ADMIN_METHODS
    no_bucket_message = "select a bucket in hello or with select_bucket"

    def __init__(self) -> None:
        #: replies not yet sent (the connection sends and replaces it)
        self.out = bytearray()

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        """A connection-level refusal (before any request)."""
        return protocol.encode_error(None, exc)

    @staticmethod
    def new_decoder(node: Node, chunk_bytes: int) -> protocol.RequestDecoder:
        return protocol.RequestDecoder(
            min(protocol.MAX_FRAME_BYTES, node.config.max_value_bytes + 64 * 1024),
            chunk_bytes=chunk_bytes,
        )

    @staticmethod
    def requests(decoder: Any) -> Iterator[Request]:
        """The decoder yields requests as the executor takes them."""
        return iter(decoder)

    # -- replies -------------------------------------------------------------------

    def reply(self, cmd: Command | None, msgid: int, result: Any) -> None:
        self.out += _pack([RESPONSE, msgid, None, result])

    def reply_all(self, cmd: Command, msgids: list[int], results: Sequence[Any]) -> None:
        pairs = zip(msgids, results, strict=True)
        self.out += b"".join([_pack([RESPONSE, msgid, None, result]) for msgid, result in pairs])

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        self.out += protocol.encode_error(msgid, exc)

    def refusal_writer(self, exc: errors.TenantKVError) -> Callable[[int], None]:
        """Each refusal: the response head, the msgid packed, the error's tail
        copied (three appends: no intermediate bytes per refusal)."""
        out, head, tail = self.out, protocol.RESPONSE_HEAD, protocol.error_tail(exc)

        def refuse(msgid: int) -> None:
            nonlocal out
            out += head
            out += _pack(msgid)
            out += tail

        return refuse

    # -- hello ---------------------------------------------------------------------

    async def before_auth(self, ex: Executor, req: Request) -> bool:
        """``hello``: the only request before it succeeds; a failed one closes
        the connection."""
        ex.node.pipeline.count_exempt_request()
        msgid, method, p = req
        try:
            if method != "hello":
                raise errors.HelloRequired(
                    f"the first request must be hello, not {errors.shown(method)}"
                )
            for k in p:
                if k not in HELLO_PARAMS:
                    raise errors.BadValue(f"unknown parameter {errors.shown(k)} for hello")
            user = await authenticate(
                ex, p.get("user"), p.get("password"), p.get("bucket"), bucket_required=True
            )
            client = p.get("client") or {}
            if not isinstance(client, dict):
                raise errors.BadValue("'client' must be a map {name, version}")
        except errors.TenantKVError as exc:
            exc.command = "hello"
            closing_log.info("connection %d from %s: hello failed: %s", ex.conn_id, ex.peer, exc)
            self.reply_error(msgid, exc)
            return False
        ex.client_info = {k: str(v)[:128] for k, v in client.items() if k in ("name", "version")}
        ex.backpressure = bool(p.get("backpressure", False))
        ex.nonblocking_throttle = bool(p.get("nonblocking_throttle", False))
        log.debug(
            "connection %d from %s: user %r bucket %r client %r",
            ex.conn_id,
            ex.peer,
            user.name,
            ex.bucket,
            ex.client_info,
        )
        self.reply(
            None,
            msgid,
            {
                "server": "tenantkv",
                "version": __version__,
                "connection_id": ex.conn_id,
                "user": user.name,
                "admin": user.admin,
                "bucket": ex.bucket,
                "limits": {
                    "max_key_bytes": protocol.MAX_KEY_BYTES,
                    "max_value_bytes": ex.node.config.max_value_bytes,
                    "max_frame_bytes": protocol.MAX_FRAME_BYTES,
                    "max_inflight": ex.max_inflight,
                },
            },
        )
        return True

    async def run_local(self, ex: Executor, cmd: Command, req: Request) -> bool:
        raise AssertionError("the MessagePack door has no commands of its own")


register()  # (idempotent: Redis's string and keyspace commands, msgpack_strings)
