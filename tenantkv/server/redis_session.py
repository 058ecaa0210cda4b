"""A connection on the RESP front door: unmodified Redis clients, same tenants.

The framing differs from the MessagePack door and nothing else does: the
same lifecycle, deadlines, receive-buffer cap and shutdown as
:class:`~tenantkv.server.session.Session` (this class extends it), and every
data command runs the same execution path — the same gates, the same units,
acknowledged only when durable (:mod:`tenantkv.server.execution`). The command
table is :mod:`tenantkv.server.redis_commands`; the codec is :mod:`tenantkv.resp`.

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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import trio

from tenantkv import errors, protocol, resp
from tenantkv._version import __version__
from tenantkv.server import redis_docs
from tenantkv.server.execution import WAITING_COUNTED_BYTES, Execution
from tenantkv.server.redis_commands import (
    OTHER_TYPES,
    REDIS_COMMANDS,
    REFUSED,
    UNSUPPORTED_STRING,
    Reply,
    compiled_glob,
    parse_call,
    syntax_error,
)
from tenantkv.server.session import Session, closing_log

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


LocalHandler = Callable[["RedisSession", int, list[bytes]], Awaitable[bool]]
LOCAL: dict[str, LocalHandler] = {}


def local(*names: str) -> Callable[[LocalHandler], LocalHandler]:
    def register(fn: LocalHandler) -> LocalHandler:
        for n in names:
            LOCAL[n] = fn
        return fn

    return register


class RedisSession(Session):
    """One RESP connection (see the module docstring)."""

    protocol_name = "resp"

    def __init__(self, node: Any, stream: trio.abc.Stream, peer: str, conn_id: int) -> None:
        super().__init__(node, stream, peer, conn_id)
        self.enc = resp.Encoder(2)
        self.name: bytes | None = None
        self._last_id = 0
        self._next_out = 1
        #: replies ready before an earlier one, by sequence number
        self._slots: dict[int, bytes] = {}
        #: how to turn each pending data command's result into its reply
        self._convert: dict[int, Reply] = {}
        #: commands received before authenticating (MAX_PRE_AUTH_COMMANDS)
        self._pre_auth_commands = 0

    # -- framing hooks ------------------------------------------------------------

    @staticmethod
    def refusal(exc: errors.TenantKVError) -> bytes:
        return resp.Encoder(2).error(error_text(exc))

    def _new_decoder(self) -> Any:
        cfg = self.node.config
        return resp.RequestDecoder(
            max_bulk_bytes=cfg.max_value_bytes,
            max_frame_bytes=min(protocol.MAX_FRAME_BYTES, cfg.max_value_bytes + 64 * 1024),
            msgpack_port=self.node.port,
        )

    def _reply(self, msgid: int, result: Any) -> None:
        convert = self._convert.pop(msgid, None)
        self._fill(msgid, convert(self.enc, result) if convert else self.enc.value(result))

    #: each answer through this door's _reply (Session's encodes MessagePack)
    _reply_all = Execution._reply_all

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        data = self.enc.error(error_text(exc))
        if msgid is None:  # the connection's own end (protocol error, idle): no slot
            self._out += data
            return
        self._convert.pop(msgid, None)
        self._fill(msgid, data)

    def _fill(self, msgid: int, data: bytes) -> None:
        if msgid != self._next_out:
            self._slots[msgid] = data
            return
        out = self._out
        out += data
        nxt = msgid + 1
        slots = self._slots
        while slots and nxt in slots:
            out += slots.pop(nxt)
            nxt += 1
        self._next_out = nxt

    def _refuse_shutting_down(self, req: Any) -> None:
        self._reply_error(
            self._new_id(), errors.ShuttingDown("the server is stopping; the command did not run")
        )

    def _new_id(self) -> int:
        self._last_id += 1
        return self._last_id

    async def _handle_chunk(self, decoder: Any) -> bool:
        """Every complete command received, in order; False when the connection closes."""
        node = self.node
        try:
            for handled, args in enumerate(decoder, 1):
                if not self._reading:
                    if not node.shutting_down:
                        return False
                    self._refuse_shutting_down(args)
                else:
                    waiting = self._command(args)
                    if waiting is not None and not await waiting:
                        return False
                if self._should_pause(handled):
                    await self._pause()
        finally:
            self._settle_chunk()
        return True

    def _command(self, args: list[bytes]) -> Coroutine[Any, Any, bool] | None:
        """Run one command: None when it was handled without awaiting (a data command
        run inline, a refusal, an error), else the coroutine to await — a command
        that waits at a gate, or a local one (AUTH, INFO, ...) — which answers False
        when the connection must close. No coroutine per command on the fast path."""
        self._last_id = msgid = self._last_id + 1
        raw = args[0]
        name = _NAMES.get(raw) or raw.decode("latin-1").lower()
        if self.user is None:
            self._pre_auth_commands += 1
            if self._pre_auth_commands > MAX_PRE_AUTH_COMMANDS:
                return self._close_unauthenticated(msgid, name)
            if name not in PRE_AUTH:
                self._fail(msgid, name, errors.HelloRequired("authentication required"))
                return None
        pipeline = self.node.pipeline
        if (
            self.user is not None
            and pipeline.request_rate_enabled
            and self._refused_by_rate(msgid, name, admin=False)
        ):
            return None
        rc = REDIS_COMMANDS.get(name)
        if rc is not None:
            try:
                params, reply = parse_call(rc, args)
            except errors.TenantKVError as exc:
                return self._refuse(msgid, name, exc, keys_named(rc.keys, len(args)))
            self._convert[msgid] = reply
            req = (msgid, rc.command.name, params)
            if self._run_inline(rc.command, req):
                return None
            self._settle_chunk()
            return self._run(rc.command, req)
        handler = LOCAL.get(name)
        if handler is None:
            return self._refuse(msgid, name, _unknown(name, args))
        if name in HANDSHAKE and (size := sum(map(len, args))) > HANDSHAKE_ARG_BYTES:
            # No handshake is this big (a name is at most 128 bytes, a password
            # 1 KiB): refused as a request, at a floor per 4 KB, without keeping
            # its bytes while it waits for the allowance (the caller holds the list).
            args.clear()
            too_big = errors.BadValue(
                f"'{name}' takes at most {HANDSHAKE_ARG_BYTES} bytes of arguments"
            )
            return self._refuse(msgid, name, too_big, 1 + size // self.node.config.read_unit_size)
        self._settle_chunk()  # INFO and SELECT see the reads before them
        return self._local(handler, msgid, name, args)

    def _refuse(
        self, msgid: int, name: str, exc: errors.TenantKVError, keys: int = 1
    ) -> Coroutine[Any, Any, bool] | None:
        """Answer a command refused for what it asked (malformed, unknown, too many
        keys): it costs the read floor per key it named, and it is held to the
        bucket's allowance as a read is — a tenant in debt that keeps sending
        them waits (its connection unread) instead of having each decoded and
        answered at once. None when answered now, else the coroutine to await."""
        tenant = self._floor_tenant()
        if tenant is not None:
            try:
                admitted = self.node.gate.try_acquire(
                    tenant[0], unthrottled=tenant[1], nonblocking=self.nonblocking_throttle
                )
            except errors.TenantKVError as refused:  # (non-blocking, or hard limit 0)
                self._fail(msgid, name, refused)
                return None
            if admitted is None:
                self._settle_chunk()
                return self._refuse_when_admitted(msgid, name, exc, keys)
        self._fail(msgid, name, exc, keys=keys)
        return None

    async def _refuse_when_admitted(
        self, msgid: int, name: str, exc: errors.TenantKVError, keys: int
    ) -> bool:
        tenant = self._floor_tenant()
        if tenant is not None:
            try:
                await self.node.gate.acquire(
                    tenant[0], unthrottled=tenant[1], nonblocking=self.nonblocking_throttle
                )
            except errors.TenantKVError as refused:
                self._fail(msgid, name, refused)
                return True
        self._fail(msgid, name, exc, keys=keys)
        return True

    async def _close_unauthenticated(self, msgid: int, name: str) -> bool:
        """Past :data:`MAX_PRE_AUTH_COMMANDS` without authenticating: answer, then close."""
        closing_log.info(
            "connection %d from %s: %d commands without authentication; closing",
            self.conn_id,
            self.peer,
            MAX_PRE_AUTH_COMMANDS,
        )
        exc = errors.HelloRequired(
            f"{MAX_PRE_AUTH_COMMANDS} commands without authentication: closing the connection"
        )
        self._fail(msgid, name, exc)
        return False

    async def _local(self, handler: LocalHandler, msgid: int, name: str, args: list[bytes]) -> bool:
        """A connection command: once authenticated, a request like any other, at a
        read's floor — held to the bucket's allowance (PING, ECHO, INFO, ...:
        :meth:`_admit_floor`), or only charged while it sets the connection up or
        ends it (:data:`HANDSHAKE`), which a throttled client must still do.

        Its arguments cost a floor per read unit (4 KB) beyond that (an ECHO of
        20 MiB is not one unit's work)."""
        size = sum(map(len, args))
        extra = size // self.node.config.read_unit_size
        try:
            if name in HANDSHAKE:
                self._charge_floor(1 + extra)
            elif size < WAITING_COUNTED_BYTES:
                await self._admit_floor()
            else:
                self._hold_waiting(size)  # (its arguments are held while it waits)
                try:
                    await self._admit_floor()
                finally:
                    self._hold_waiting(0)
            if extra and name not in HANDSHAKE:
                self._charge_floor(extra)
        except errors.TenantKVError as exc:
            self._fail(msgid, name, exc)
            return True
        try:
            return await handler(self, msgid, args)
        except errors.TenantKVError as exc:
            self._fail(msgid, name, exc, charge=False)
            return True

    # -- authentication -------------------------------------------------------------

    async def authenticate(self, username: bytes, password: bytes) -> None:
        """AUTH / HELLO AUTH: the user (``name@bucket`` picks the bucket), limited
        and audited like the MessagePack hello; the connection stays open on failure."""
        node = self.node
        full = username.decode(errors="replace")
        name, _, bucket_part = full.partition("@")
        epoch = node.accounts.epoch  # (as Session._hello: a change meanwhile is seen)
        if "@" in full and full in node.accounts.users:
            # A user named with '@' (made before the rule): its password proven
            # (limited as any login), it is told why this door cannot take it.
            await node.accounts.authenticate(
                full, password.decode(errors="replace"), peer=self.peer_ip
            )
            raise errors.AuthenticationFailed(
                f"{AT_NAME_MESSAGE} (AUTH takes user@bucket); log in on the MessagePack "
                "port, or use a user without '@'"
            )
        try:
            user = await node.accounts.authenticate(
                name, password.decode(errors="replace"), peer=self.peer_ip
            )
        except errors.TenantKVError as exc:
            closing_log.info("connection %d from %s: AUTH failed: %s", self.conn_id, self.peer, exc)
            raise
        bucket: str | None = bucket_part or None
        if bucket is not None:
            node.bucket(bucket)
            if not user.can_read(bucket):
                raise errors.Unauthorized(f"user {user.name!r} has no role on bucket {bucket!r}")
        elif len(user.roles) == 1:
            bucket = next(iter(user.roles))
        if self.user is None:
            await self._take_authenticated_slot(user)
        self.user = user
        self._auth_epoch = epoch
        if self._decoder is not None:
            self._decoder.frame_limit = self._decoder.max_frame_bytes
        self.select(bucket)
        log.debug(
            "connection %d from %s (resp): user %r bucket %r", self.conn_id, self.peer, name, bucket
        )

    def info(self, sections: list[str]) -> str:
        """INFO's text: ``server``, ``clients``, ``keyspace`` and ``tenantkv`` (the
        bucket's units, limits and throttling)."""
        node = self.node
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
            if self.bucket is not None and self.bucket in node.engine.buckets:
                keys = node.engine.bucket_entries(self.bucket)
                out.append(f"db0:keys={keys},expires=0,avg_ttl=0")
            out.append("")
        if every or "tenantkv" in want:
            out += ["# Tenantkv", f"bucket:{self.bucket or ''}"]
            if self.bucket is not None:
                b = node.gate.statistics().buckets.get(self.bucket)
                if b is not None:
                    for key, value in b.as_dict().items():
                        if not isinstance(value, (list, dict)):
                            out.append(f"{key}:{value}")
            out.append(f"nonblocking_throttle:{int(self.nonblocking_throttle)}")
            out.append("")
        return "\r\n".join(out)


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


def _unknown(name: str, args: list[bytes]) -> errors.TenantKVError:
    if name in OTHER_TYPES:
        return errors.UnknownCommand(
            f"'{name}' is not supported: tenantkv stores strings only "
            "(GET, SET and the other string and key commands)"
        )
    if name in UNSUPPORTED_STRING:
        return errors.UnknownCommand(
            f"'{name}' is not supported by tenantkv's RESP front door (see docs/redis.md)"
        )
    if name in REFUSED:
        return errors.UnknownCommand(f"'{name}' is not available on tenantkv's RESP front door")
    shown = " ".join(f"'{a.decode(errors='replace')[:64]}'" for a in args[1:4])
    return errors.UnknownCommand(
        f"unknown command '{name[:64]}', with args beginning with: {shown}"
    )


def _arity(name: str) -> errors.BadValue:
    return errors.BadValue(f"wrong number of arguments for '{name}' command")


# -- connection commands (answered by the session, through the same reply slots) ----


@local("auth")
async def _auth(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    if len(args) == 2:
        await s.authenticate(b"default", args[1])
    elif len(args) == 3:
        await s.authenticate(args[1], args[2])
    else:
        raise _arity("auth")
    s._fill(msgid, s.enc.simple("OK"))
    return True


@local("hello")
async def _hello(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    version = s.enc.version
    i = 1
    if len(args) > 1:
        try:
            version = int(args[1])
        except ValueError:
            raise errors.BadValue("Protocol version is not an integer or out of range") from None
        if version not in (2, 3):
            s._fill(msgid, s.enc.error("NOPROTO unsupported protocol version"))
            return True
        i = 2
    name = None
    authed = False
    while i < len(args):
        opt = args[i].lower()
        if opt == b"auth" and i + 2 < len(args):
            await s.authenticate(args[i + 1], args[i + 2])
            authed = True
            i += 3
        elif opt == b"setname" and i + 1 < len(args):
            name = client_name(args[i + 1])
            i += 2
        else:
            raise syntax_error()
    if s.user is None and not authed:
        s._fill(
            msgid,
            s.enc.error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise "
                "the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the "
                "client and select the RESP protocol version at the same time"
            ),
        )
        return True
    if name is not None:
        s.name = name or None
    s.enc.version = version
    s._fill(
        msgid,
        s.enc.map(
            {
                "server": "tenantkv",
                "version": __version__,
                "proto": version,
                "id": s.conn_id,
                "mode": "standalone",
                "role": "master",
                "modules": [],
            }
        ),
    )
    return True


@local("ping")
async def _ping(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    if len(args) > 2:
        raise _arity("ping")
    s._fill(msgid, s.enc.bulk(args[1]) if len(args) == 2 else s.enc.simple("PONG"))
    return True


@local("echo")
async def _echo(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    if len(args) != 2:
        raise _arity("echo")
    s._fill(msgid, s.enc.bulk(args[1]))
    return True


@local("quit")
async def _quit(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    s._fill(msgid, s.enc.simple("OK"))
    await s._wait_writes()
    return False


@local("reset")
async def _reset(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    """Back to a fresh connection's state — RESP2, no name, blocking throttling —
    except that it stays authenticated and in its bucket (tenantkv has no
    ``default`` user to fall back to)."""
    s.name = None
    s.nonblocking_throttle = False
    s.enc.version = 2
    s._fill(msgid, s.enc.simple("RESET"))
    return True


@local("time")
async def _time(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    now = time.time()
    secs = int(now)
    s._fill(msgid, s.enc.array([str(secs), str(int((now - secs) * 1e6))]))
    return True


@local("select")
async def _select(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    if len(args) != 2:
        raise _arity("select")
    name = args[1].decode(errors="replace")
    if name not in s.node.engine.buckets and name == "0":
        s._fill(msgid, s.enc.simple("OK"))  # clients select db 0 by habit: no change
        return True
    await s._wait_writes()
    s.node.bucket(name)
    user = s.current_user()
    if not user.can_read(name):
        raise errors.Unauthorized(f"user {user.name!r} has no role on bucket {name!r}")
    s.select(name)
    s._fill(msgid, s.enc.simple("OK"))
    return True


@local("client")
async def _client(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    if len(args) < 2:
        raise _arity("client")
    sub = args[1].lower()
    enc = s.enc
    if sub == b"setname" and len(args) == 3:
        s.name = client_name(args[2])
        reply = enc.simple("OK")
    elif sub == b"getname" and len(args) == 2:
        reply = enc.null() if s.name is None else enc.bulk(s.name)
    elif sub == b"id" and len(args) == 2:
        reply = enc.integer(s.conn_id)
    elif sub == b"setinfo" and len(args) == 4:
        attr = args[2].lower()
        if attr not in (b"lib-name", b"lib-ver"):
            raise errors.BadValue(f"Unrecognized option '{args[2].decode(errors='replace')}'")
        s.client_info["name" if attr == b"lib-name" else "version"] = args[3][
            :MAX_CLIENT_NAME_BYTES
        ].decode(errors="replace")
        reply = enc.simple("OK")
    elif sub == b"nonblocking" and len(args) == 3 and args[2].lower() in (b"on", b"off"):
        s.nonblocking_throttle = args[2].lower() == b"on"
        reply = enc.simple("OK")
    elif sub == b"info" and len(args) == 2:
        user = s.user.name if s.user else ""
        text = (
            f"id={s.conn_id} addr={s.peer} name={(s.name or b'').decode(errors='replace')} "
            f"db=0 bucket={s.bucket or ''} user={user} resp={enc.version} "
            f"lib-name={s.client_info.get('name', '')} lib-ver={s.client_info.get('version', '')}"
            "\n"
        )
        reply = enc.verbatim(text) if enc.version >= 3 else enc.bulk(text)
    else:
        raise errors.BadValue(
            f"unknown subcommand or wrong number of arguments for "
            f"'{args[1].decode(errors='replace')}'. Try CLIENT HELP."
        )
    s._fill(msgid, reply)
    return True


@local("info")
async def _info(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    text = s.info([a.decode(errors="replace") for a in args[1:]])
    s._fill(msgid, s.enc.verbatim(text) if s.enc.version >= 3 else s.enc.bulk(text))
    return True


@local("config")
async def _config(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
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
        matches, compiled = compiled_glob(CONFIG_PATTERNS + (s.bucket or ""), pattern)
        floors += compiled
        found.update((k, v) for k, v in CONFIG_VALUES.items() if matches(k.encode()))
    if floors:
        s._charge_floor(floors)  # (its compiling, beyond the request's own floor)
    s._fill(msgid, s.enc.map(found))
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
async def _command(s: RedisSession, msgid: int, args: list[bytes]) -> bool:
    sub = args[1].lower() if len(args) > 1 else b""
    if len(args) <= 2 and sub in (b"", b"count", b"list", b"info", b"docs"):
        key = (s.enc.version, sub)
        reply = _COMMAND_REPLIES.get(key)
        if reply is None:
            reply = _COMMAND_REPLIES[key] = _command_reply(s.enc, sub, [])
    else:
        # Each command named once: a reply no larger than the one naming none.
        asked = list(dict.fromkeys(a.decode(errors="replace").lower() for a in args[2:]))
        reply = _command_reply(s.enc, sub, asked)
    s._fill(msgid, reply)
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
