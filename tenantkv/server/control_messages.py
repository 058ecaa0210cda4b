"""Every message of the control channel of ``serve --workers N``, one frozen
dataclass each (:mod:`tenantkv.server.control` carries them).

A message's wire form is a msgpack map: ``type`` (the class's :attr:`TYPE`)
and its fields by name. A *call* (a subclass of :class:`Call`) is answered by
its :attr:`Call.REPLY`, whose wire form is its fields. Field values are plain
msgpack data: what needs a richer form (a usage report, a lease, a status
document) travels in the wire form its own module defines.

A message is declared by its ``class`` line and docstring, its fields below::

    class Evict(ControlMessage, type="evict", sender=SUPERVISOR):
        \"\"\"close this connection (no hello yet) to make room for another\"\"\"

        conn: int

``type`` is its wire type, ``sender`` who sends it, the docstring what it is
for (docs/scaling.md's table); a call names its reply as ``Call[TheReply]``.
Every subclass is made a frozen dataclass, so fields are declared as in one.

:data:`MESSAGES` lists every message; docs/scaling.md has the same table
(:func:`message_table`), and a test keeps the two equal. Each side dispatches
by a table of its own (``Supervisor.HANDLERS``, ``WorkerLink.HANDLERS``) that
a test checks against :data:`MESSAGES` too.
"""

from __future__ import annotations

import dataclasses
from typing import (
    Any,
    ClassVar,
    Generic,
    Self,
    TypeVar,
    cast,
    dataclass_transform,
    get_args,
    get_origin,
)

Wire = dict[str, Any]

#: Who sends a message.
WORKER = "worker"
SUPERVISOR = "supervisor"


#: Every message, by its wire type, in the order declared (each adds itself).
MESSAGES: dict[str, type[ControlMessage]] = {}


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


@dataclass_transform(frozen_default=True)
class _Fields:
    """A base whose every subclass is a frozen dataclass, its wire form its fields."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        dataclasses.dataclass(frozen=True)(cls)

    def to_wire(self) -> Wire:
        return _fields_to_wire(self)

    @classmethod
    def from_wire(cls, wire: Wire) -> Self:
        return cast(Self, _fields_from_wire(cls, wire))


class Reply(_Fields):
    """The answer to a call; its wire form is its fields."""


class ControlMessage(_Fields):
    """A one-way message (a :class:`Call` when it is answered)."""

    TYPE: ClassVar[str]
    SENDER: ClassVar[str]
    #: what it is for, one line (docs/scaling.md's table): the class's docstring
    MEANING: ClassVar[str]

    def __init_subclass__(cls, *, type: str = "", sender: str = "", **kw: Any) -> None:
        if "TYPE" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: give its type and sender on its class line")
        if type:  # (a message, not a base such as Call)
            if not cls.__doc__ or type in MESSAGES or sender not in (WORKER, SUPERVISOR):
                raise TypeError(f"control message {type!r}: a docstring, a new type, a sender")
            cls.TYPE, cls.SENDER, cls.MEANING = type, sender, " ".join(cls.__doc__.split())
            MESSAGES[type] = cls
        super().__init_subclass__(**kw)

    def to_wire(self) -> Wire:
        return {"type": self.TYPE, **_fields_to_wire(self)}


R = TypeVar("R", bound=Reply)


class Call(ControlMessage, Generic[R]):
    """A message the other side answers with a :attr:`REPLY`: the ``R`` it is
    declared with (``class Status(Call[StatusReply], ...)``)."""

    REPLY: ClassVar[type[Reply]]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for base in cls.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Call):
                cls.REPLY = get_args(base)[0]


class Done(Reply):
    """An answer that says only "done"."""


# -- supervisor -> worker -------------------------------------------------------------


class Init(ControlMessage, type="init", sender=SUPERVISOR):
    """first message, length-prefixed, read before Trio starts: who the worker is"""

    index: int
    workers: int
    config: dict[str, Any]
    listen_fds: list[int]
    resp_fds: list[int]
    expiry_pager: bool


class Refresh(Call[Done], type="refresh", sender=SUPERVISOR):
    """shared state changed elsewhere: reload it from LMDB"""


class StatusReply(Reply):
    status: dict[str, Any]
    #: ``time.monotonic()`` when the worker read its counts: one clock for every
    #: process of the host, so the supervisor stamps the node's document with it
    at: float


class Status(Call[StatusReply], type="status", sender=SUPERVISOR):
    """the worker's status document"""


class Lease(ControlMessage, type="lease", sender=SUPERVISOR):
    """pushed: another worker's report moved this worker's quota share"""

    lease: dict[str, Any]


class Expiry(ControlMessage, type="expiry", sender=SUPERVISOR):
    """a commit wrote an expiry (ms): the expiry pager may wake earlier"""

    ms: int


class Evict(ControlMessage, type="evict", sender=SUPERVISOR):
    """close this connection (no hello yet) to make room for another"""

    conn: int


class ReloadConfig(ControlMessage, type="reload_config", sender=SUPERVISOR):
    """SIGHUP: the config file as read again"""

    config: dict[str, Any]


# -- worker -> supervisor -------------------------------------------------------------


class Ready(ControlMessage, type="ready", sender=WORKER):
    """the worker serves (the node is ready once every worker is)"""

    host: str
    port: int
    resp_port: int | None


class UsageReply(Reply):
    lease: dict[str, Any]
    #: the worker's fraction of each node-wide rate limiter
    rate_shares: dict[str, float]


class Usage(Call[UsageReply], type="usage", sender=WORKER):
    """per slice: the throttle's demand per bucket and the rate limiters' demand"""

    usage: dict[str, Any]
    #: per node-wide rate limiter: attempts per second as a fraction of its rate
    limiters: dict[str, float]


class WriteReply(Reply):
    outcomes: list[Any]


class Write(Call[WriteReply], type="write", sender=WORKER):
    """writes for the node's writer; answered once durable, one outcome each"""

    ops: list[Any]


class ConnAdmitReply(Reply):
    ok: bool
    evict: int | None = None
    reason: str = ""


class ConnAdmit(Call[ConnAdmitReply], type="conn_admit", sender=WORKER):
    """the node's connection table: may this connection stay"""

    conn: int
    addr: str
    max_connections: int
    per_address: int
    reserved_per_address: int


class ConnAuthReply(Reply):
    refused: str | None


class ConnAuth(Call[ConnAuthReply], type="conn_auth", sender=WORKER):
    """the connection said hello: may it stay (admin slots)"""

    conn: int
    admin: bool
    max_connections: int
    reserved_for_admins: int
    per_address: int | None


class ConnClosed(ControlMessage, type="conn_closed", sender=WORKER):
    """a connection closed: its place in the table is free"""

    conn: int


class LoginBeginReply(Reply):
    status: str
    retry_after: float
    reason: str
    known: bool = False


class _LoginStep(Call[R]):
    """A step of one login through the node's login limiter (its fields first)."""

    login: int
    source: str
    user: str | None


class LoginBegin(_LoginStep[LoginBeginReply], type="login_begin", sender=WORKER):
    """the node's login limiter: may this login be verified now"""

    cached: bool
    settings: list[float]


class LoginEndReply(Reply):
    hold: float
    limited: bool = False


class LoginEnd(_LoginStep[LoginEndReply], type="login_end", sender=WORKER):
    """a login's outcome; answered with how long to hold a failure"""

    ok: bool
    settings: list[float]


class LoginCancel(ControlMessage, type="login_cancel", sender=WORKER):
    """a login ended without an outcome: free its slot"""

    login: int


class Changed(Call[Done], type="changed", sender=WORKER):
    """shared state changed here; answered once every other worker reloaded it"""

    worker: int


class NodeStatusReply(Reply):
    #: the node's status document (status.node_document)
    document: dict[str, Any]


class NodeStatus(Call[NodeStatusReply], type="node_status", sender=WORKER):
    """server_status on a worker: the node's document, merged by the supervisor"""


class Tracking(ControlMessage, type="tracking", sender=WORKER):
    """client-side caching on (true) or off (false) on this worker: send it invalidate"""

    active: bool


class Invalidate(Call[Done], type="invalidate", sender=SUPERVISOR):
    """client-side caching: the keys a commit changed, [bucket, keys or nil for all];
    answered once pushed, before the write is"""

    changes: list[Any]


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
