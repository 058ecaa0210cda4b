"""Every message of the control channel of ``serve --workers N``, one frozen
dataclass each (:mod:`tenantkv.server.control` carries them).

A message's wire form is a msgpack map: ``type`` (the class's :attr:`TYPE`)
and its fields by name. A *call* (a subclass of :class:`Call`) is answered by
its :attr:`Call.REPLY`, whose wire form is its fields. Field values are plain
msgpack data: what needs a richer form (a usage report, a lease, a status
document) travels in the wire form its own module defines.

:data:`MESSAGES` lists every message; docs/scaling.md has the same table
(:func:`message_table`), and a test keeps the two equal. Each side dispatches
by a table of its own (``Supervisor.HANDLERS``, ``WorkerLink.HANDLERS``) that
a test checks against :data:`MESSAGES` too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

Wire = dict[str, Any]

#: Who sends a message.
WORKER = "worker"
SUPERVISOR = "supervisor"


class MalformedMessage(ValueError):
    """A message (or answer) without the fields of its type: a bug in the peer."""


def _fields_to_wire(obj: Any) -> Wire:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _fields_from_wire(cls: type[Any], wire: Wire) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    try:
        return cls(**{n: wire[n] for n in names if n in wire})
    except TypeError as exc:
        raise MalformedMessage(f"{cls.__name__}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Reply:
    """The answer to a call; its wire form is its fields."""

    def to_wire(self) -> Wire:
        return _fields_to_wire(self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Self:
        return cast(Self, _fields_from_wire(cls, wire))


@dataclasses.dataclass(frozen=True)
class ControlMessage:
    """A one-way message (a :class:`Call` when it is answered)."""

    TYPE: ClassVar[str]
    SENDER: ClassVar[str]
    #: what it is for, one line (docs/scaling.md's table)
    MEANING: ClassVar[str]

    def to_wire(self) -> Wire:
        return {"type": self.TYPE, **_fields_to_wire(self)}

    @classmethod
    def from_wire(cls, wire: Wire) -> Self:
        return cast(Self, _fields_from_wire(cls, wire))


R = TypeVar("R", bound=Reply)


@dataclasses.dataclass(frozen=True)
class Call(ControlMessage, Generic[R]):
    """A message the other side answers with a :attr:`REPLY`."""

    REPLY: ClassVar[type[Reply]]


@dataclasses.dataclass(frozen=True)
class Done(Reply):
    """An answer that says only "done"."""


# -- supervisor -> worker -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Init(ControlMessage):
    TYPE = "init"
    SENDER = SUPERVISOR
    MEANING = "first message, length-prefixed, read before Trio starts: who the worker is"
    index: int
    workers: int
    config: dict[str, Any]
    listen_fds: list[int]
    resp_fds: list[int]
    expiry_pager: bool


@dataclasses.dataclass(frozen=True)
class Refresh(Call[Done]):
    TYPE = "refresh"
    SENDER = SUPERVISOR
    MEANING = "shared state changed elsewhere: reload it from LMDB"
    REPLY = Done


@dataclasses.dataclass(frozen=True)
class StatusReply(Reply):
    status: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Status(Call[StatusReply]):
    TYPE = "status"
    SENDER = SUPERVISOR
    MEANING = "the worker's status document"
    REPLY = StatusReply


@dataclasses.dataclass(frozen=True)
class Lease(ControlMessage):
    TYPE = "lease"
    SENDER = SUPERVISOR
    MEANING = "pushed: another worker's report moved this worker's quota share"
    lease: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Expiry(ControlMessage):
    TYPE = "expiry"
    SENDER = SUPERVISOR
    MEANING = "a commit wrote an expiry (ms): the expiry pager may wake earlier"
    ms: int


@dataclasses.dataclass(frozen=True)
class Evict(ControlMessage):
    TYPE = "evict"
    SENDER = SUPERVISOR
    MEANING = "close this connection (no hello yet) to make room for another"
    conn: int


@dataclasses.dataclass(frozen=True)
class ReloadConfig(ControlMessage):
    TYPE = "reload_config"
    SENDER = SUPERVISOR
    MEANING = "SIGHUP: the config file as read again"
    config: dict[str, Any]


# -- worker -> supervisor -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Ready(ControlMessage):
    TYPE = "ready"
    SENDER = WORKER
    MEANING = "the worker serves (the node is ready once every worker is)"
    host: str
    port: int
    resp_port: int | None


@dataclasses.dataclass(frozen=True)
class UsageReply(Reply):
    lease: dict[str, Any]
    #: the worker's fraction of each node-wide rate limiter
    rate_shares: dict[str, float]


@dataclasses.dataclass(frozen=True)
class Usage(Call[UsageReply]):
    TYPE = "usage"
    SENDER = WORKER
    MEANING = "per slice: the throttle's demand per bucket and the rate limiters' demand"
    REPLY = UsageReply
    usage: dict[str, Any]
    #: per node-wide rate limiter: attempts per second as a fraction of its rate
    limiters: dict[str, float]


@dataclasses.dataclass(frozen=True)
class WriteReply(Reply):
    outcomes: list[Any]


@dataclasses.dataclass(frozen=True)
class Write(Call[WriteReply]):
    TYPE = "write"
    SENDER = WORKER
    MEANING = "writes for the node's writer; answered once durable, one outcome each"
    REPLY = WriteReply
    ops: list[Any]


@dataclasses.dataclass(frozen=True)
class ConnAdmitReply(Reply):
    ok: bool
    evict: int | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class ConnAdmit(Call[ConnAdmitReply]):
    TYPE = "conn_admit"
    SENDER = WORKER
    MEANING = "the node's connection table: may this connection stay"
    REPLY = ConnAdmitReply
    conn: int
    addr: str
    max_connections: int
    per_address: int
    reserved_per_address: int


@dataclasses.dataclass(frozen=True)
class ConnAuthReply(Reply):
    refused: str | None


@dataclasses.dataclass(frozen=True)
class ConnAuth(Call[ConnAuthReply]):
    TYPE = "conn_auth"
    SENDER = WORKER
    MEANING = "the connection said hello: may it stay (admin slots)"
    REPLY = ConnAuthReply
    conn: int
    admin: bool
    max_connections: int
    reserved_for_admins: int
    per_address: int | None


@dataclasses.dataclass(frozen=True)
class ConnClosed(ControlMessage):
    TYPE = "conn_closed"
    SENDER = WORKER
    MEANING = "a connection closed: its place in the table is free"
    conn: int


@dataclasses.dataclass(frozen=True)
class LoginBeginReply(Reply):
    status: str
    retry_after: float
    reason: str
    known: bool = False


@dataclasses.dataclass(frozen=True)
class LoginBegin(Call[LoginBeginReply]):
    TYPE = "login_begin"
    SENDER = WORKER
    MEANING = "the node's login limiter: may this login be verified now"
    REPLY = LoginBeginReply
    login: int
    source: str
    user: str | None
    cached: bool
    settings: list[float]


@dataclasses.dataclass(frozen=True)
class LoginEndReply(Reply):
    hold: float
    limited: bool = False


@dataclasses.dataclass(frozen=True)
class LoginEnd(Call[LoginEndReply]):
    TYPE = "login_end"
    SENDER = WORKER
    MEANING = "a login's outcome; answered with how long to hold a failure"
    REPLY = LoginEndReply
    login: int
    source: str
    user: str | None
    ok: bool
    settings: list[float]


@dataclasses.dataclass(frozen=True)
class LoginCancel(ControlMessage):
    TYPE = "login_cancel"
    SENDER = WORKER
    MEANING = "a login ended without an outcome: free its slot"
    login: int


@dataclasses.dataclass(frozen=True)
class Changed(Call[Done]):
    TYPE = "changed"
    SENDER = WORKER
    MEANING = "shared state changed here; answered once every other worker reloaded it"
    REPLY = Done
    worker: int


@dataclasses.dataclass(frozen=True)
class NodeStatusReply(Reply):
    #: the node's status document (status.node_document)
    document: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class NodeStatus(Call[NodeStatusReply]):
    TYPE = "node_status"
    SENDER = WORKER
    MEANING = "server_status on a worker: the node's document, merged by the supervisor"
    REPLY = NodeStatusReply


@dataclasses.dataclass(frozen=True)
class Tracking(ControlMessage):
    TYPE = "tracking"
    SENDER = WORKER
    MEANING = "client-side caching on (true) or off (false) on this worker: send it invalidate"
    active: bool


@dataclasses.dataclass(frozen=True)
class Invalidate(Call[Done]):
    TYPE = "invalidate"
    SENDER = SUPERVISOR
    MEANING = (
        "client-side caching: the keys a commit changed, [bucket, keys or nil for all]; "
        "answered once pushed, before the write is"
    )
    REPLY = Done
    changes: list[Any]


#: Every message, by its wire type.
MESSAGES: dict[str, type[ControlMessage]] = {
    cls.TYPE: cls
    for cls in (
        Init,
        Refresh,
        Status,
        Lease,
        Expiry,
        Evict,
        ReloadConfig,
        Ready,
        Usage,
        Write,
        ConnAdmit,
        ConnAuth,
        ConnClosed,
        LoginBegin,
        LoginEnd,
        LoginCancel,
        Changed,
        NodeStatus,
        Tracking,
        Invalidate,
    )
}


def sent_by(sender: str) -> set[type[ControlMessage]]:
    """The messages ``sender`` sends on the channel (``init`` goes before it)."""
    return {cls for cls in MESSAGES.values() if sender == cls.SENDER and cls is not Init}


def decode(wire: Any) -> ControlMessage:
    """A message from its wire form; :class:`MalformedMessage` if it is none."""
    if not isinstance(wire, dict):
        raise MalformedMessage("a message must be a map")
    cls = MESSAGES.get(wire.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise MalformedMessage(f"unknown message type {wire.get('type')!r}")
    return cls.from_wire(wire)


def _names(cls: type[Any]) -> str:
    return ", ".join(f"`{f.name}`" for f in dataclasses.fields(cls)) or "—"


def message_table() -> list[list[str]]:
    """docs/scaling.md's table of control messages, row by row."""
    rows = []
    for cls in MESSAGES.values():
        answer = _names(cls.REPLY) if issubclass(cls, Call) else "(one-way)"
        if issubclass(cls, Call) and cls.REPLY is Done:
            answer = "done"
        sender = "supervisor → worker" if cls.SENDER == SUPERVISOR else "worker → supervisor"
        rows.append([f"`{cls.TYPE}`", sender, _names(cls), answer, cls.MEANING])
    return rows
