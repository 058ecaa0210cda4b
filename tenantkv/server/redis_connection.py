"""The RESP door's connection commands: AUTH, HELLO, PING, ECHO, QUIT, RESET,
TIME, SELECT, CLIENT, INFO, CONFIG GET and COMMAND.

They are the door's own (kind ``"door"``): run by :meth:`RespDoor.run_local
<tenantkv.server.doors.resp.RespDoor.run_local>` after the door admits them at
a read's floor, and answered through the door's reply slots. A handler gets
the door (:class:`DoorState`: its encoder, the connection's name, the reply
slots, the one authentication), the executor, the command's sequence number
and its arguments; it returns False when the connection must close.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tenantkv import errors
from tenantkv._version import __version__
from tenantkv.server import redis_docs, redis_info, tracking
from tenantkv.server.connection import Connection
from tenantkv.server.executor import Executor
from tenantkv.server.redis_commands import REDIS_COMMANDS, Encoder, syntax_error
from tenantkv.server.redis_scan import compiled_glob
from tenantkv.server.tracking import Tracker


class DoorState(Protocol):
    """What a connection command uses of the RESP door."""

    enc: Encoder
    #: the name CLIENT SETNAME / HELLO SETNAME gave the connection
    name: bytes | None
    #: client-side caching's state while CLIENT TRACKING is on
    tracker: Tracker | None

    def fill(self, msgid: int, data: bytes) -> None: ...

    async def authenticate(self, ex: Executor, username: bytes, password: bytes) -> None: ...


#: The longest CLIENT SETNAME / HELLO SETNAME a connection may keep; CLIENT
#: SETINFO's values are cut to as many (Redis bounds neither, but for its
#: 512 MB argument limit).
MAX_CLIENT_NAME_BYTES = 128
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


#: Client-side caching's subcommands (:mod:`tenantkv.server.tracking`).
TRACKING_SUBCOMMANDS = frozenset({b"tracking", b"trackinginfo", b"caching", b"getredir"})
TRACKING_NEEDS_RESP3 = (
    "CLIENT TRACKING needs RESP3 (HELLO 3): tenantkv sends invalidations only as "
    "pushes on the tracking connection itself (REDIRECT is not supported)"
)
REDIRECT_REFUSED = (
    "CLIENT TRACKING REDIRECT is not supported: use HELLO 3, and the invalidations come "
    "as pushes on the tracking connection itself"
)


LocalHandler = Callable[[DoorState, Executor, int, list[bytes]], Awaitable[bool]]
LOCAL: dict[str, LocalHandler] = {}


def local(*names: str) -> Callable[[LocalHandler], LocalHandler]:
    def register(fn: LocalHandler) -> LocalHandler:
        for n in names:
            LOCAL[n] = fn
        return fn

    return register


def client_name(name: bytes) -> bytes | None:
    """A name for CLIENT SETNAME / HELLO SETNAME (empty: none), as Redis checks it —
    printable ASCII only, no spaces — and at most :data:`MAX_CLIENT_NAME_BYTES`
    (Redis sets no length limit; a connection keeps its name until it closes)."""
    if len(name) > MAX_CLIENT_NAME_BYTES:
        raise errors.BadValue(f"Client names are limited to {MAX_CLIENT_NAME_BYTES} bytes")
    if any(c < 0x21 or c > 0x7E for c in name):
        raise errors.BadValue("Client names cannot contain spaces, newlines or special characters.")
    return name or None


def _arity(name: str) -> errors.BadValue:
    return errors.BadValue(f"wrong number of arguments for '{name}' command")


# -- the commands ------------------------------------------------------------------


@local("auth")
async def _auth(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) == 2:
        await d.authenticate(ex, b"default", args[1])
    elif len(args) == 3:
        await d.authenticate(ex, args[1], args[2])
    else:
        raise _arity("auth")
    d.fill(msgid, d.enc.simple("OK"))
    return True


@local("hello")
async def _hello(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
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
    if version < 3:
        _tracking_off(d, ex)  # (RESP2 has no pushes: a cache would go stale)
    d.enc.version = version
    d.fill(
        msgid,
        d.enc.map(
            {
                # As Redis names itself: clients gate features on these (redis-py's
                # client-side cache needs "redis" and 7.4); tenantkv's own follows.
                "server": "redis",
                "version": redis_info.REDIS_VERSION,
                "proto": version,
                "id": ex.conn_id,
                "mode": "standalone",
                "role": "master",
                "modules": [],
                "tenantkv_version": __version__,
            }
        ),
    )
    return True


@local("ping")
async def _ping(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) > 2:
        raise _arity("ping")
    d.fill(msgid, d.enc.bulk(args[1]) if len(args) == 2 else d.enc.simple("PONG"))
    return True


@local("echo")
async def _echo(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    if len(args) != 2:
        raise _arity("echo")
    d.fill(msgid, d.enc.bulk(args[1]))
    return True


@local("quit")
async def _quit(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    d.fill(msgid, d.enc.simple("OK"))
    await ex.wait_writes()
    return False


@local("reset")
async def _reset(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    """Back to a fresh connection's state — RESP2, no name, blocking throttling —
    except that it stays authenticated and in its bucket (tenantkv has no
    ``default`` user to fall back to)."""
    d.name = None
    ex.nonblocking_throttle = False
    _tracking_off(d, ex)
    d.enc.version = 2
    d.fill(msgid, d.enc.simple("RESET"))
    return True


@local("time")
async def _time(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    now = time.time()
    secs = int(now)
    d.fill(msgid, d.enc.array([str(secs), str(int((now - secs) * 1e6))]))
    return True


@local("select")
async def _select(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
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
    old = ex.bucket
    ex.select(name)
    if d.tracker is not None:
        ex.node.tracking.moved(d.tracker, old, name)
    d.fill(msgid, d.enc.simple("OK"))
    return True


@local("client")
async def _client(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
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
    elif sub in TRACKING_SUBCOMMANDS:
        reply = _tracking(d, ex, sub, args)
    else:
        raise errors.BadValue(
            f"unknown subcommand or wrong number of arguments for "
            f"'{args[1].decode(errors='replace')}'. Try CLIENT HELP."
        )
    d.fill(msgid, reply)
    return True


@local("info")
async def _info(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
    text = redis_info.info_text(ex, args[1:])
    d.fill(msgid, d.enc.verbatim(text) if d.enc.version >= 3 else d.enc.bulk(text))
    return True


@local("config")
async def _config(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
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


def _command_info(enc: Encoder, name: str) -> bytes:
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
async def _command(d: DoorState, ex: Executor, msgid: int, args: list[bytes]) -> bool:
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


def _command_reply(enc: Encoder, sub: bytes, asked: list[str]) -> bytes:
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


def _tracking(d: DoorState, ex: Executor, sub: bytes, args: list[bytes]) -> bytes:
    """CLIENT TRACKING / TRACKINGINFO / CACHING / GETREDIR, in Redis 7.0's words
    (``clientCommand``)."""
    enc, tracker = d.enc, d.tracker
    if sub == b"trackinginfo" and len(args) == 2:
        head = b"%3\r\n" if enc.version >= 3 else b"*6\r\n"  # (a map of three)
        flags = tracker.flags() if tracker is not None else ["off"]
        prefixes = list(tracker.prefixes) if tracker is not None else []
        return (
            head
            + enc.bulk("flags")
            + enc.set(flags)
            + enc.bulk("redirect")
            + enc.integer(-1 if tracker is None else 0)
            + enc.bulk("prefixes")
            + enc.array(prefixes)
        )
    if sub == b"getredir" and len(args) == 2:
        return enc.integer(-1 if tracker is None else 0)
    if sub == b"caching" and len(args) == 3:
        return _caching(enc, tracker, args[2].lower())
    if sub == b"tracking" and len(args) >= 3:
        mode = args[2].lower()
        if mode not in (b"on", b"off"):
            raise syntax_error()
        options = _tracking_options(args[3:])
        if mode == b"off":
            _tracking_off(d, ex)
            return enc.simple("OK")
        _tracking_on(d, ex, options)
        return enc.simple("OK")
    raise errors.BadValue(
        f"unknown subcommand or wrong number of arguments for "
        f"'{args[1].decode(errors='replace')}'. Try CLIENT HELP."
    )


def _caching(enc: Encoder, tracker: Tracker | None, opt: bytes) -> bytes:
    """CLIENT CACHING yes|no: checked here; it took effect as it was decoded
    (``RespDoor._tracking_command``), for the command after it."""
    if tracker is None or not (tracker.optin or tracker.optout):
        raise errors.BadValue(
            "CLIENT CACHING can be called only when the client is in tracking mode with "
            "OPTIN or OPTOUT mode enabled"
        )
    if opt == b"yes" and not tracker.optin:
        raise errors.BadValue(
            "CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode."
        )
    if opt == b"no" and not tracker.optout:
        raise errors.BadValue(
            "CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode."
        )
    if opt not in (b"yes", b"no"):
        raise syntax_error()
    return enc.simple("OK")


def _tracking_options(args: list[bytes]) -> dict[str, Any]:
    """CLIENT TRACKING's options, as Redis parses them (one pass, then checks)."""
    options: dict[str, Any] = {"prefixes": []}
    i = 0
    while i < len(args):
        opt = args[i].lower()
        more = i + 1 < len(args)
        if opt == b"redirect" and more:
            if "redirect" in options:
                raise errors.BadValue("A client can only redirect to a single other client")
            try:
                options["redirect"] = int(args[i + 1])
            except ValueError:
                raise errors.BadValue("value is not an integer or out of range") from None
            i += 2
        elif opt in (b"bcast", b"optin", b"optout", b"noloop"):
            options[opt.decode()] = True
            i += 1
        elif opt == b"prefix" and more:
            if len(options["prefixes"]) >= tracking.MAX_PREFIXES:
                raise errors.BadValue(f"at most {tracking.MAX_PREFIXES} prefixes per client")
            options["prefixes"].append(args[i + 1])
            i += 2
        else:
            raise syntax_error()
    return options


def _tracking_on(d: DoorState, ex: Executor, options: dict[str, Any]) -> None:
    bcast = bool(options.get("bcast"))
    prefixes: list[bytes] = options["prefixes"]
    if prefixes and not bcast:
        raise errors.BadValue("PREFIX option requires BCAST mode to be enabled")
    if d.tracker is not None and d.tracker.bcast != bcast:
        raise errors.BadValue(
            "You can't switch BCAST mode on/off before disabling tracking for this client, "
            "and then re-enabling it with a different mode."
        )
    if options.get("optin") and options.get("optout"):
        raise errors.BadValue("You can't use both OPTIN and OPTOUT")
    if (options.get("optin") or options.get("optout")) and bcast:
        raise errors.BadValue("OPTIN and OPTOUT are not compatible with BCAST")
    _check_prefixes(prefixes)
    if "redirect" in options:
        raise errors.BadValue(REDIRECT_REFUSED)
    if d.enc.version < 3:
        raise errors.BadValue(TRACKING_NEEDS_RESP3)
    conn = ex.flow
    if not isinstance(conn, Connection):
        raise errors.BadValue(TRACKING_NEEDS_RESP3)
    enc = d.enc
    table = ex.node.tracking

    def push(keys: list[bytes] | None) -> None:
        body = enc.null_array() if keys is None else enc.array(keys)
        conn.push(b">2\r\n$10\r\ninvalidate\r\n" + body)

    tracker = tracking.Tracker(
        table,
        ex.conn_id,
        lambda: ex.bucket,
        push,
        bcast=bcast,
        prefixes=prefixes,
        noloop=bool(options.get("noloop")),
        optin=bool(options.get("optin")),
        optout=bool(options.get("optout")),
    )
    conn.start_pushing()
    table.start(tracker, ex.bucket)
    d.tracker = tracker


def _check_prefixes(prefixes: list[bytes]) -> None:
    """Redis refuses prefixes of which one starts another (a key would be told twice)."""
    for i, a in enumerate(prefixes):
        for b in prefixes[i + 1 :]:
            if a.startswith(b) or b.startswith(a):
                raise errors.BadValue(
                    f"Prefix '{b.decode(errors='replace')}' overlaps with another provided "
                    f"prefix '{a.decode(errors='replace')}'. Prefixes for a single client "
                    "must not overlap."
                )


def _tracking_off(d: DoorState, ex: Executor) -> None:
    if d.tracker is not None:
        ex.node.tracking.stop(ex.conn_id)
        d.tracker = None
