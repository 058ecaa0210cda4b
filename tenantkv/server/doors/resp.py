"""The RESP door: unmodified Redis clients, same tenants.

A thin codec, as the MessagePack door is: the same connection
(``server/connection.py``: lifecycle, deadlines, receive-buffer cap,
shutdown) and the same chunk executor (``server/executor.py``: the same
gates, the same units, runs of reads and writes, acknowledged only when
durable). This decodes each command into a request of the executor —
``(sequence number, name, params)``, its parameters parsed by the command
table (:mod:`tenantkv.server.redis_commands`) — and encodes replies with
:mod:`tenantkv.resp`. Connection commands (AUTH, HELLO, PING, INFO, ...) are
the door's own (kind ``"door"``), answered through the same reply slots.

Order: Redis replies carry no id, so each command gets a sequence number and its
reply waits in a slot until every earlier one is out (a write answered when
durable, an error found at once, a read answered inline all come out in the
order the commands were sent).

Before authentication only ``AUTH``, ``HELLO``, ``PING`` and ``QUIT`` run, and
a command may be :data:`tenantkv.protocol.MAX_HELLO_FRAME_BYTES` at most. The
bucket: ``AUTH user@bucket password`` names it; a user with a role on one
bucket only lands in it; ``SELECT bucket`` switches.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from tenantkv import errors, protocol, resp
from tenantkv._version import __version__
from tenantkv.server import redis_docs
from tenantkv.server.commands import Command
from tenantkv.server.executor import (
    WAITING_COUNTED_BYTES,
    Executor,
    Request,
    authenticate,
    closing_log,
)
from tenantkv.server.node import Node
from tenantkv.server.redis_commands import (
    REDIS_COMMANDS,
    Reply,
    compiled_glob,
    parse_call,
    syntax_error,
)

log = logging.getLogger("tenantkv.session")

PRE_AUTH = frozenset({"auth", "hello", "ping", "quit"})
#: Connection commands that set the connection up or end it: charged a read's
#: floor like every request after AUTH, but never held to the bucket's allowance.
HANDSHAKE = frozenset({"auth", "hello", "client", "select", "quit", "reset"})
#: The most bytes of arguments such a command may carry (the frame bound before
#: authentication): one with more is refused as a request, never held as a handshake.
HANDSHAKE_ARG_BYTES = protocol.MAX_HELLO_FRAME_BYTES
#: Commands a connection may send before it authenticates, AUTH and HELLO
#: included; the next one closes it. Nothing before AUTH is metered or
#: rate-limited, so this bounds what an anonymous connection costs (the
#: MessagePack door closes one whose first request is not hello), while
#: leaving room for a client's handshake and a few tries at the password
#: (which the login limiter bounds as well).
MAX_PRE_AUTH_COMMANDS = 16
#: The longest CLIENT SETNAME / HELLO SETNAME a connection may keep; CLIENT
#: SETINFO's values are cut to as many (Redis bounds neither, but for its
#: 512 MB argument limit).
MAX_CLIENT_NAME_BYTES = 128
#: Command names as clients send them (upper or lower case) -> the lower-case name:
#: a dict lookup per command instead of a decode and a lower().
_NAMES: dict[bytes, str] = {}
#: What ``CONFIG GET`` answers (read-only): enough for tools that ask about persistence.
CONFIG_VALUES = {
    "save": "",
    "appendonly": "yes",
    "appendfsync": "always",
    "databases": "1",
    "maxmemory": "0",
    "maxmemory-policy": "noeviction",
}
#: Patterns one ``CONFIG GET`` may give (each up to MAX_PATTERN_BYTES, compiled
#: on the event loop), and the pattern cache's name for them (no bucket's name
#: starts so; the bucket's follows, as for its other patterns).
MAX_CONFIG_PATTERNS = 16
CONFIG_PATTERNS = "\0config"


def error_text(exc: errors.TenantKVError) -> str:
    """A tenantkv error in Redis's words: a stable prefix, then the message.

    Overload (labelled ``SystemOverloadedError`` / ``RetryableError``: it did not
    run) is ``TRYAGAIN <CodeName> retryAfterMs=<n> <message>`` — the prefix Redis
    clients already treat as "retry later"."""
    msg = exc.errmsg
    if isinstance(exc, errors.InRedisWords):  # cluster redirections: -MOVED, -CROSSSLOT, ...
        return exc.redis_text()
    if isinstance(exc, (errors.ProtocolError, errors.FrameTooLarge)):
        return f"ERR Protocol error: {msg}"
    if isinstance(exc, errors.TooManyLoginFailures):
        # A limited login is a failed AUTH to a Redis client (WRONGPASS), with the hint.
        return f"WRONGPASS retryAfterMs={exc.retry_after_ms or 0} {msg}"
    if errors.RETRYABLE in exc.labels or errors.SYSTEM_OVERLOADED in exc.labels:
        return f"TRYAGAIN {exc.code_name} retryAfterMs={exc.retry_after_ms or 0} {msg}"
    if isinstance(exc, errors.AuthenticationFailed):
        if exc.errmsg.startswith(AT_NAME_MESSAGE):
            return f"WRONGPASS {exc.errmsg}"
        return "WRONGPASS invalid username-password pair or user is disabled."
    if isinstance(exc, errors.Unauthorized):
        return f"NOPERM {msg}"
    if isinstance(exc, errors.HelloRequired):
        return "NOAUTH Authentication required."
    return f"ERR {msg}"


#: The answer to a user whose name holds '@' (made before the rule against it),
#: once its password is proven: it cannot log in on this door.
AT_NAME_MESSAGE = "user names containing '@' cannot log in over RESP"


LocalHandler = Callable[["RespDoor", Executor, int, list[bytes]], Awaitable[bool]]
LOCAL: dict[str, LocalHandler] = {}


def local(*names: str) -> Callable[[LocalHandler], LocalHandler]:
    def register(fn: LocalHandler) -> LocalHandler:
        for n in names:
            LOCAL[n] = fn
        return fn

    return register


#: The request a command refused before it runs becomes (malformed, unknown):
#: ``(seq, REFUSED_REQUEST, (name, error, keys named))``, answered by the door.
REFUSED_REQUEST = "\0refused"


class RespDoor:
    """The codec of one RESP connection (see the module docstring).

    Order: Redis replies carry no id, so each command gets a sequence number
    and its reply waits in a slot until every earlier one is out (a write
    answered when durable, an error found at once, a read answered inline all
    come out in the order the commands were sent)."""

    protocol_name = "resp"
    admin_methods: frozenset[str] = frozenset()
    no_bucket_message = "no bucket selected: select a bucket with SELECT, or AUTH as user@bucket"

    def __init__(self) -> None:
        #: replies not yet sent (the connection sends and replaces it)
        self.out = bytearray()
        self.commands = COMMANDS
        self.enc = resp.Encoder(2)
        #: the name CLIENT SETNAME / HELLO SETNAME gave the connection
        self.name: bytes | None = None
        self._last_id = 0
        self._next_out = 1
        #: replies ready before an earlier one, by sequence number
        self._slots: dict[int, bytes] = {}
        #: the reply of a call that differs from its command's (SET ... GET)
        self._special: dict[int, Reply] = {}
        #: commands received before authenticating (MAX_PRE_AUTH_COMMANDS)
        self._pre_auth_commands = 0

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        """A connection-level refusal (before any request)."""
        return resp.Encoder(2).error(error_text(exc))

    @staticmethod
    def new_decoder(node: Node, chunk_bytes: int) -> resp.RequestDecoder:
        cfg = node.config
        return resp.RequestDecoder(
            max_bulk_bytes=cfg.max_value_bytes,
            max_frame_bytes=min(protocol.MAX_FRAME_BYTES, cfg.max_value_bytes + 64 * 1024),
            msgpack_port=node.port,
        )

    def requests(self, decoder: Any) -> Iterator[Request]:
        """Each command decoded, as a request of the executor: a data command
        with its parsed parameters, a connection command with its arguments, or
        a command refused for what it asked (:data:`REFUSED_REQUEST`)."""
        names, table, special = _NAMES, REDIS_COMMANDS, self._special
        next_command = decoder.next_command
        while (args := next_command()) is not None:
            self._last_id = msgid = self._last_id + 1
            raw = args[0]
            name = names.get(raw) or raw.decode("latin-1").lower()
            rc = table.get(name)
            if rc is not None:
                try:
                    params, reply = parse_call(rc, args)
                except errors.TenantKVError as exc:
                    yield msgid, REFUSED_REQUEST, (name, exc, keys_named(rc.keys, len(args)))
                    continue
                if reply is not rc.reply:
                    special[msgid] = reply
                yield msgid, name, params
            elif name in LOCAL:
                yield msgid, name, args  # (its arguments: the door's)
            else:
                yield msgid, REFUSED_REQUEST, (name, _unknown(args), 1)

    # -- replies -------------------------------------------------------------------

    def reply(self, cmd: Command | None, msgid: int, result: Any) -> None:
        convert = self._special.pop(msgid, None) if self._special else None
        if convert is None:
            convert = cmd.reply if cmd is not None and cmd.reply is not None else _value
        self.fill(msgid, convert(self.enc, result))

    def reply_all(self, cmd: Command, msgids: list[int], results: Sequence[Any]) -> None:
        """A run of reads or writes answered: out at once when they are the next
        replies due, in a row (the usual run), else each through its slot."""
        first = msgids[0]
        if (
            first != self._next_out
            or self._slots
            or self._special
            or msgids[-1] - first != len(msgids) - 1
        ):
            for msgid, result in zip(msgids, results, strict=True):
                self.reply(cmd, msgid, result)
            return
        convert, enc = cmd.reply or _value, self.enc
        self.out += b"".join([convert(enc, result) for result in results])
        self._next_out = first + len(msgids)

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        data = self.enc.error(error_text(exc))
        if msgid is None:  # the connection's own end (protocol error, idle): no slot
            self.out += data
            return
        if self._special:
            self._special.pop(msgid, None)
        self.fill(msgid, data)

    def refusal_writer(self, exc: errors.TenantKVError) -> Callable[[int], None]:
        data = self.enc.error(error_text(exc))
        fill, special = self.fill, self._special

        def refuse(msgid: int) -> None:
            if special:
                special.pop(msgid, None)  # (a SET ... GET refused: no reply of its own)
            fill(msgid, data)

        return refuse

    def fill(self, msgid: int, data: bytes) -> None:
        """The reply of the ``msgid``-th command: out now if every earlier one is,
        else into its slot until they are."""
        if msgid != self._next_out:
            self._slots[msgid] = data
            return
        out = self.out
        out += data
        nxt = msgid + 1
        slots = self._slots
        while slots and nxt in slots:
            out += slots.pop(nxt)
            nxt += 1
        self._next_out = nxt

    # -- connection commands -----------------------------------------------------------

    async def before_auth(self, ex: Executor, req: Request) -> bool:
        """Before authentication only ``AUTH``, ``HELLO``, ``PING`` and ``QUIT``
        run, and at most :data:`MAX_PRE_AUTH_COMMANDS` commands in all."""
        msgid, name, _ = req
        self._pre_auth_commands += 1
        if self._pre_auth_commands > MAX_PRE_AUTH_COMMANDS:
            closing_log.info(
                "connection %d from %s: %d commands without authentication; closing",
                ex.conn_id,
                ex.peer,
                MAX_PRE_AUTH_COMMANDS,
            )
            exc = errors.HelloRequired(
                f"{MAX_PRE_AUTH_COMMANDS} commands without authentication: closing the connection"
            )
            ex.fail(msgid, name, exc)
            return False
        if name not in PRE_AUTH:
            ex.fail(msgid, name, errors.HelloRequired("authentication required"))
            return True
        return await self.run_local(ex, self.commands[name], req)

    async def run_local(self, ex: Executor, cmd: Command, req: Request) -> bool:
        """A connection command, or a command refused for what it asked."""
        msgid, name, args = req
        if name == REFUSED_REQUEST:
            asked, exc, keys = args
            return await self._refuse(ex, msgid, asked, exc, keys)
        assert isinstance(args, list)
        if name in HANDSHAKE and (size := sum(map(len, args))) > HANDSHAKE_ARG_BYTES:
            # No handshake is this big (a name is at most 128 bytes, a password
            # 1 KiB): refused as a request, at a floor per 4 KB, without keeping
            # its bytes while it waits for the allowance.
            args.clear()
            too_big = errors.BadValue(
                f"'{name}' takes at most {HANDSHAKE_ARG_BYTES} bytes of arguments"
            )
            floors = 1 + size // ex.node.config.read_unit_size
            return await self._refuse(ex, msgid, name, too_big, floors)
        return await self._local(ex, LOCAL[name], msgid, name, args)

    async def _refuse(
        self, ex: Executor, msgid: int, name: str, exc: errors.TenantKVError, keys: int
    ) -> bool:
        """Answer a command refused for what it asked (malformed, unknown, too many
        keys): it costs the read floor per key it named, and it is held to the
        bucket's allowance as a read is — a tenant in debt that keeps sending
        them waits (its connection unread) instead of having each decoded and
        answered at once."""
        tenant = ex.floor_tenant()
        if tenant is not None:
            try:
                await ex.node.gate.acquire(
                    tenant[0], unthrottled=tenant[1], nonblocking=ex.nonblocking_throttle
                )
            except errors.TenantKVError as refused:  # (non-blocking, or hard limit 0)
                ex.fail(msgid, name, refused)
                return True
        ex.fail(msgid, name, exc, keys=keys)
        return True

    async def _local(
        self, ex: Executor, handler: LocalHandler, msgid: int, name: str, args: list[bytes]
    ) -> bool:
        """A connection command: once authenticated, a request like any other, at a
        read's floor — held to the bucket's allowance (PING, ECHO, INFO, ...:
        :meth:`Executor.admit_floor`), or only charged while it sets the
        connection up or ends it (:data:`HANDSHAKE`), which a throttled client
        must still do.

        Its arguments cost a floor per read unit (4 KB) beyond that (an ECHO of
        20 MiB is not one unit's work)."""
        size = sum(map(len, args))
        extra = size // ex.node.config.read_unit_size
        try:
            if name in HANDSHAKE:
                ex.charge_floor(1 + extra)
            elif size < WAITING_COUNTED_BYTES:
                await ex.admit_floor()
            else:
                ex.hold_waiting(size)  # (its arguments are held while it waits)
                try:
                    await ex.admit_floor()
                finally:
                    ex.hold_waiting(0)
            if extra and name not in HANDSHAKE:
                ex.charge_floor(extra)
        except errors.TenantKVError as exc:
            ex.fail(msgid, name, exc)
            return True
        try:
            return await handler(self, ex, msgid, args)
        except errors.TenantKVError as exc:
            ex.fail(msgid, name, exc, charge=False)
            return True

    async def authenticate(self, ex: Executor, username: bytes, password: bytes) -> None:
        """AUTH / HELLO AUTH: the user (``name@bucket`` picks the bucket) through
        the one :func:`~tenantkv.server.executor.authenticate`; the connection
        stays open on failure."""
        node = ex.node
        full = username.decode(errors="replace")
        name, _, bucket = full.partition("@")
        text = password.decode(errors="replace")
        if "@" in full and full in node.accounts.users:
            # A user named with '@' (made before the rule): its password proven
            # (limited as any login), it is told why this door cannot take it.
            await node.accounts.authenticate(full, text, peer=ex.peer_ip)
            raise errors.AuthenticationFailed(
                f"{AT_NAME_MESSAGE} (AUTH takes user@bucket); log in on the MessagePack "
                "port, or use a user without '@'"
            )
        try:
            await authenticate(ex, name, text, bucket or None, one_role_bucket=True)
        except errors.TenantKVError as exc:
            closing_log.info("connection %d from %s: AUTH failed: %s", ex.conn_id, ex.peer, exc)
            raise
        log.debug(
            "connection %d from %s (resp): user %r bucket %r", ex.conn_id, ex.peer, name, ex.bucket
        )

    def info(self, ex: Executor, sections: list[str]) -> str:
        """INFO's text: ``server``, ``clients``, ``keyspace`` and ``tenantkv`` (the
        bucket's units, limits and throttling)."""
        node = ex.node
        want = {s.lower() for s in sections} or {"default"}
        every = bool(want & {"all", "everything", "default"})
        out: list[str] = []
        if every or "server" in want:
            out += [
                "# Server",
                "redis_version:7.2.0",
                f"tenantkv_version:{__version__}",
                "redis_mode:standalone",
                f"process_id:{os.getpid()}",
                f"tcp_port:{node.resp_port}",
                f"uptime_in_seconds:{int(time.monotonic() - node.started_monotonic)}",
                "",
            ]
        if every or "clients" in want:
            out += ["# Clients", f"connected_clients:{len(node.sessions)}", ""]
        if every or "keyspace" in want:
            out.append("# Keyspace")
            if ex.bucket is not None and ex.bucket in node.engine.buckets:
                keys = node.engine.bucket_entries(ex.bucket)
                out.append(f"db0:keys={keys},expires=0,avg_ttl=0")
            out.append("")
        if every or "tenantkv" in want:
            out += ["# Tenantkv", f"bucket:{ex.bucket or ''}"]
            if ex.bucket is not None:
                b = node.gate.statistics().buckets.get(ex.bucket)
                if b is not None:
                    for key, value in b.as_dict().items():
                        if not isinstance(value, (list, dict)):
                            out.append(f"{key}:{value}")
            out.append(f"nonblocking_throttle:{int(ex.nonblocking_throttle)}")
            out.append("")
        return "\r\n".join(out)


def _value(enc: resp.Encoder, v: Any) -> bytes:
    return enc.value(v)


def client_name(name: bytes) -> bytes | None:
    """A name for CLIENT SETNAME / HELLO SETNAME (empty: none), as Redis checks it —
    printable ASCII only, no spaces — and at most :data:`MAX_CLIENT_NAME_BYTES`
    (Redis sets no length limit; a connection keeps its name until it closes)."""
    if len(name) > MAX_CLIENT_NAME_BYTES:
        raise errors.BadValue(f"Client names are limited to {MAX_CLIENT_NAME_BYTES} bytes")
    if any(c < 0x21 or c > 0x7E for c in name):
        raise errors.BadValue("Client names cannot contain spaces, newlines or special characters.")
    return name or None


def keys_named(spec: tuple[int, int, int], argc: int) -> int:
    """How many keys a command of ``argc`` arguments names, by its COMMAND INFO key
    specification (first, last, step); at least 1 (the floor of any request)."""
    first, last, step = spec
    if first <= 0:
        return 1
    stop = argc if last < 0 else min(argc, last + 1)
    return max(1, len(range(first, stop, step)))


def _unknown(args: list[bytes]) -> errors.TenantKVError:
    """Redis 7.0's answer to a command it does not have (``processCommand``): the
    name as sent, then each argument quoted and followed by a space while fewer
    than 128 bytes of them are shown."""
    shown = ""
    for arg in args[1:]:
        if len(shown) >= 128:
            break
        shown += f"'{arg.decode(errors='replace')[: 128 - len(shown)]}' "
    name = args[0].decode(errors="replace")[:128]
    return errors.UnknownCommand(f"unknown command '{name}', with args beginning with: {shown}")


def _arity(name: str) -> errors.BadValue:
    return errors.BadValue(f"wrong number of arguments for '{name}' command")


# -- connection commands (answered by the session, through the same reply slots) ----


@local("auth")
async def _auth(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) == 2:
        await d.authenticate(ex, b"default", args[1])
    elif len(args) == 3:
        await d.authenticate(ex, args[1], args[2])
    else:
        raise _arity("auth")
    d.fill(msgid, d.enc.simple("OK"))
    return True


@local("hello")
async def _hello(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    version = d.enc.version
    i = 1
    if len(args) > 1:
        try:
            version = int(args[1])
        except ValueError:
            raise errors.BadValue("Protocol version is not an integer or out of range") from None
        if version not in (2, 3):
            d.fill(msgid, d.enc.error("NOPROTO unsupported protocol version"))
            return True
        i = 2
    name = None
    authed = False
    while i < len(args):
        opt = args[i].lower()
        if opt == b"auth" and i + 2 < len(args):
            await d.authenticate(ex, args[i + 1], args[i + 2])
            authed = True
            i += 3
        elif opt == b"setname" and i + 1 < len(args):
            name = client_name(args[i + 1])
            i += 2
        else:
            raise syntax_error()
    if ex.user is None and not authed:
        d.fill(
            msgid,
            d.enc.error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise "
                "the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the "
                "client and select the RESP protocol version at the same time"
            ),
        )
        return True
    if name is not None:
        d.name = name or None
    d.enc.version = version
    d.fill(
        msgid,
        d.enc.map(
            {
                "server": "tenantkv",
                "version": __version__,
                "proto": version,
                "id": ex.conn_id,
                "mode": "standalone",
                "role": "master",
                "modules": [],
            }
        ),
    )
    return True


@local("ping")
async def _ping(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) > 2:
        raise _arity("ping")
    d.fill(msgid, d.enc.bulk(args[1]) if len(args) == 2 else d.enc.simple("PONG"))
    return True


@local("echo")
async def _echo(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) != 2:
        raise _arity("echo")
    d.fill(msgid, d.enc.bulk(args[1]))
    return True


@local("quit")
async def _quit(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    d.fill(msgid, d.enc.simple("OK"))
    await ex.wait_writes()
    return False


@local("reset")
async def _reset(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    """Back to a fresh connection's state — RESP2, no name, blocking throttling —
    except that it stays authenticated and in its bucket (tenantkv has no
    ``default`` user to fall back to)."""
    d.name = None
    ex.nonblocking_throttle = False
    d.enc.version = 2
    d.fill(msgid, d.enc.simple("RESET"))
    return True


@local("time")
async def _time(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    now = time.time()
    secs = int(now)
    d.fill(msgid, d.enc.array([str(secs), str(int((now - secs) * 1e6))]))
    return True


@local("select")
async def _select(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) != 2:
        raise _arity("select")
    name = args[1].decode(errors="replace")
    if name not in ex.node.engine.buckets and name == "0":
        d.fill(msgid, d.enc.simple("OK"))  # clients select db 0 by habit: no change
        return True
    await ex.wait_writes()
    ex.node.bucket(name)
    user = ex.current_user()
    if not user.can_read(name):
        raise errors.Unauthorized(f"user {user.name!r} has no role on bucket {name!r}")
    ex.select(name)
    d.fill(msgid, d.enc.simple("OK"))
    return True


@local("client")
async def _client(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) < 2:
        raise _arity("client")
    sub = args[1].lower()
    enc = d.enc
    if sub == b"setname" and len(args) == 3:
        d.name = client_name(args[2])
        reply = enc.simple("OK")
    elif sub == b"getname" and len(args) == 2:
        reply = enc.null() if d.name is None else enc.bulk(d.name)
    elif sub == b"id" and len(args) == 2:
        reply = enc.integer(ex.conn_id)
    elif sub == b"setinfo" and len(args) == 4:
        attr = args[2].lower()
        if attr not in (b"lib-name", b"lib-ver"):
            raise errors.BadValue(f"Unrecognized option '{args[2].decode(errors='replace')}'")
        ex.client_info["name" if attr == b"lib-name" else "version"] = args[3][
            :MAX_CLIENT_NAME_BYTES
        ].decode(errors="replace")
        reply = enc.simple("OK")
    elif sub == b"nonblocking" and len(args) == 3 and args[2].lower() in (b"on", b"off"):
        ex.nonblocking_throttle = args[2].lower() == b"on"
        reply = enc.simple("OK")
    elif sub == b"info" and len(args) == 2:
        user = ex.user.name if ex.user else ""
        text = (
            f"id={ex.conn_id} addr={ex.peer} name={(d.name or b'').decode(errors='replace')} "
            f"db=0 bucket={ex.bucket or ''} user={user} resp={enc.version} "
            f"lib-name={ex.client_info.get('name', '')} lib-ver={ex.client_info.get('version', '')}"
            "\n"
        )
        reply = enc.verbatim(text) if enc.version >= 3 else enc.bulk(text)
    else:
        raise errors.BadValue(
            f"unknown subcommand or wrong number of arguments for "
            f"'{args[1].decode(errors='replace')}'. Try CLIENT HELP."
        )
    d.fill(msgid, reply)
    return True


@local("info")
async def _info(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    text = d.info(ex, [a.decode(errors="replace") for a in args[1:]])
    d.fill(msgid, d.enc.verbatim(text) if d.enc.version >= 3 else d.enc.bulk(text))
    return True


@local("config")
async def _config(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) < 2:
        raise _arity("config")
    if args[1].lower() != b"get":
        raise errors.BadValue(
            f"CONFIG {args[1].decode(errors='replace').upper()} is not supported: tenantkv's "
            "settings are changed with tenantkv-admin param-set"
        )
    if len(args) < 3:
        raise _arity("config|get")
    if len(args) - 2 > MAX_CONFIG_PATTERNS:
        raise errors.BadValue(f"CONFIG GET takes at most {MAX_CONFIG_PATTERNS} patterns")
    found: dict[str, str] = {}
    floors = 0
    for pattern in dict.fromkeys(a.lower() for a in args[2:]):
        # Redis's glob, case-insensitive as Redis's CONFIG GET: on lower case.
        matches, compiled = compiled_glob(CONFIG_PATTERNS + (ex.bucket or ""), pattern)
        floors += compiled
        found.update((k, v) for k, v in CONFIG_VALUES.items() if matches(k.encode()))
    if floors:
        ex.charge_floor(floors)  # (its compiling, beyond the request's own floor)
    d.fill(msgid, d.enc.map(found))
    return True


def _command_info(enc: resp.Encoder, name: str) -> bytes:
    rc = REDIS_COMMANDS.get(name)
    if rc is not None:
        arity, flags, keys = rc.arity, list(rc.flags), rc.keys
    elif name in LOCAL:
        arity, flags, keys = -1, ["fast"], (0, 0, 0)
    else:
        return enc.null_array()
    return enc.array(
        [name, arity, [enc_flag for enc_flag in flags], keys[0], keys[1], keys[2], [], [], [], []]
    )


def _command_docs(name: str) -> dict[str, Any]:
    """What ``COMMAND DOCS`` says of ``name``; redis-cli's hints come from ``arguments``."""
    rc = REDIS_COMMANDS.get(name)
    if rc is not None:
        doc: dict[str, Any] = {"summary": rc.summary, "since": "1.0.0", "group": rc.group}
    else:
        doc = {"summary": f"{name.upper()} (connection)", "since": "1.0.0", "group": "connection"}
    args = redis_docs.arguments(name)
    if args:
        doc["arguments"] = args
    return doc


#: COMMAND's replies that name no command, by (RESP version, subcommand): they never
#: change, and built anew each one cost ~0.75 ms of the event loop for a 17-byte
#: request (COMMAND DOCS: 13.6 KB of reply).
_COMMAND_REPLIES: dict[tuple[int, bytes], bytes] = {}


@local("command")
async def _command(d: RespDoor, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    sub = args[1].lower() if len(args) > 1 else b""
    if len(args) <= 2 and sub in (b"", b"count", b"list", b"info", b"docs"):
        key = (d.enc.version, sub)
        reply = _COMMAND_REPLIES.get(key)
        if reply is None:
            reply = _COMMAND_REPLIES[key] = _command_reply(d.enc, sub, [])
    else:
        # Each command named once: a reply no larger than the one naming none.
        asked = list(dict.fromkeys(a.decode(errors="replace").lower() for a in args[2:]))
        reply = _command_reply(d.enc, sub, asked)
    d.fill(msgid, reply)
    return True


def _command_reply(enc: resp.Encoder, sub: bytes, asked: list[str]) -> bytes:
    names = sorted({*REDIS_COMMANDS, *LOCAL})
    if sub == b"":
        reply = b"*%d\r\n" % len(names) + b"".join(_command_info(enc, n) for n in names)
    elif sub == b"count":
        reply = enc.integer(len(names))
    elif sub == b"list":
        reply = enc.array(names)
    elif sub == b"info":
        wanted = asked or names
        reply = b"*%d\r\n" % len(wanted) + b"".join(_command_info(enc, n) for n in wanted)
    elif sub == b"docs":
        wanted = [n for n in (asked or names) if n in REDIS_COMMANDS or n in LOCAL]
        reply = enc.map({n: _command_docs(n) for n in wanted})
    else:
        raise errors.BadValue(
            f"unknown subcommand '{sub.decode(errors='replace')}'. Try COMMAND HELP."
        )
    return reply


_NAMES.update(
    (spelling.encode(), name)
    for name in (*REDIS_COMMANDS, *LOCAL)
    for spelling in (name, name.upper())
)


def _door_command(name: str) -> Command:
    """A command the door answers itself (:meth:`RespDoor.run_local`)."""
    return Command(name, "door", frozenset(), LOCAL.get(name, _refused))


async def _refused(*args: Any) -> bool:
    raise AssertionError("answered by RespDoor.run_local")


#: The door's command table: Redis's data commands (their Command, so a GET
#: runs where a MessagePack get runs), its connection commands, and refusals.
COMMANDS: dict[str, Command] = {name: rc.command for name, rc in REDIS_COMMANDS.items()}
COMMANDS.update((name, _door_command(name)) for name in (*LOCAL, REFUSED_REQUEST))
