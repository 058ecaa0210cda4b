"""Error codes, code names, labels and the exception types shared by server and client.

What to catch::

    TenantKVError                      every error tenantkv raises
    ├── ClientError                    raised on the client side, never sent by a server
    │   ├── ConnectionClosed           the socket closed or could not be opened:
    │   │   ├── ConnectFailed          no connection could be made (nothing sent)
    │   │   ├── RequestNotSent         it broke before the request went out (did not run)
    │   │   ├── PeerClosed             the server closed after the request went out
    │   │   └── MalformedReply         the reply could not be decoded
    │   └── ClientTimeout              the per-operation timeout passed
    └── ServerError                    an error map the server sent (one subclass per code)
        ├── BadValue, UnknownCommand, ProtocolError, FrameTooLarge, HelloRequired
        ├── AuthenticationFailed, Unauthorized, NoBucketSelected
        ├── BucketNotFound, BucketExists, UserNotFound, UserExists
        ├── KeyNotFound, KeyExists, CasMismatch, KeyTooLong, ValueTooLarge, NotANumber
        ├── StorageFull, DeadlineExceeded, IdleTimeout, ShuttingDown, InternalError
        └── Throttled, AdmissionQueueOverflow, IngressRequestRateLimitExceeded, ...
            (overload errors: labels SystemOverloadedError + RetryableError)

Every code has exactly one meaning; ``docs/protocol.md`` lists the same table.
An error is declared by its ``class`` line (``class KeyExists(ServerError,
code=15):``): its code name is its class name, and its labels and whether it
closes the connection are given there too (:meth:`TenantKVError.__init_subclass__`).
The server raises these exceptions internally and turns them into the wire error
map (:meth:`TenantKVError.to_wire`); the client turns a received map back into
the matching subclass (:func:`from_wire`), so both sides share one vocabulary.
"""

from __future__ import annotations

import reprlib
from typing import Any, ClassVar

SYSTEM_OVERLOADED = "SystemOverloadedError"
RETRYABLE = "RetryableError"
OVERLOAD_LABELS: tuple[str, ...] = (SYSTEM_OVERLOADED, RETRYABLE)


#: Longest error message kept: messages quote what a client sent, and one
#: quoting a megabyte would cost that much in every reply, log line and cached
#: error template (see :func:`shown`, which bounds a quote where it is made).
MAX_ERRMSG_CHARS = 1024


class _Shown(reprlib.Repr):
    """reprlib's bounded repr, bytes included (reprlib would repr them whole first)."""

    def repr_bytes(self, x: bytes, level: int) -> str:
        if len(x) <= self.maxstring:
            return repr(x)
        return repr(x[: self.maxstring]) + f"...({len(x)} bytes)"

    repr_bytearray = repr_bytes


_SHOWN = _Shown()
_SHOWN.maxstring = _SHOWN.maxother = 60


def shown(value: Any) -> str:
    """A value a client sent, quoted in an error message: its repr, bounded (a long
    string or bytes cut, a container's first elements), without building the
    whole repr first."""
    return _SHOWN.repr(value)


class TenantKVError(Exception):
    """Base of every tenantkv error.

    ``code``/``code_name`` identify the error, ``labels`` say how a client may
    react (``RetryableError`` guarantees the operation had no effect),
    ``retry_after_ms`` is the server's hint, ``command`` the failed command.
    """

    code: ClassVar[int] = 0
    code_name: ClassVar[str] = "TenantKVError"
    default_labels: ClassVar[tuple[str, ...]] = ()
    #: Errors after which the server closes the connection.
    fatal: ClassVar[bool] = False

    def __init_subclass__(
        cls,
        *,
        code: int | None = None,
        labels: tuple[str, ...] | None = None,
        fatal: bool | None = None,
        **kw: Any,
    ) -> None:
        """An error is declared by its ``class`` line: its code name is its class
        name (unless its body sets ``code_name``), and ``code``, ``labels`` and
        ``fatal`` not given there are its base's."""
        super().__init_subclass__(**kw)
        if "code_name" not in cls.__dict__:
            cls.code_name = cls.__name__
        if code is not None:
            cls.code = code
        if labels is not None:
            cls.default_labels = labels
        if fatal is not None:
            cls.fatal = fatal

    def __init__(
        self,
        errmsg: str = "",
        *,
        labels: tuple[str, ...] | list[str] | None = None,
        retry_after_ms: int | None = None,
        command: str | None = None,
    ) -> None:
        if len(errmsg) > MAX_ERRMSG_CHARS:
            errmsg = errmsg[:MAX_ERRMSG_CHARS] + "..."
        super().__init__(errmsg or self.code_name)
        self.errmsg = errmsg or self.code_name
        self.labels: tuple[str, ...] = tuple(labels) if labels is not None else self.default_labels
        self.retry_after_ms = retry_after_ms
        self.command = command

    def has_label(self, label: str) -> bool:
        return label in self.labels

    def to_wire(self) -> dict[str, Any]:
        """The error map of DESIGN.md §4."""
        out: dict[str, Any] = {"code": self.code, "codeName": self.code_name, "errmsg": self.errmsg}
        if self.labels:
            out["errorLabels"] = list(self.labels)
        if self.retry_after_ms is not None:
            out["retryAfterMs"] = self.retry_after_ms
        return out

    def __str__(self) -> str:
        where = f" (command {self.command!r})" if self.command else ""
        return f"{self.code_name}: {self.errmsg}{where}"


class ClientError(TenantKVError):
    """Raised by the client library itself, never received from a server."""


class ConnectionClosed(ClientError):
    """The connection is gone or could not be made; the subclasses say how."""


class ConnectFailed(ConnectionClosed):
    """No connection could be opened (refused, unreachable, TLS failed): nothing was sent."""


class RequestNotSent(ConnectionClosed):
    """The connection broke before the request was sent: it provably did not run."""


class PeerClosed(ConnectionClosed):
    """The server closed the connection after the request was sent: whether it ran is
    unknown (a read is retried; a write is not, and this error says so)."""


class MalformedReply(ConnectionClosed):
    """The server's reply could not be decoded; the connection is dropped."""


class ClientTimeout(ClientError):
    """The per-operation timeout passed."""


class ServerError(TenantKVError):
    """An error reported by the server; look at ``code``/``code_name``."""


class InternalError(ServerError, code=1):
    """An unexpected server fault; the connection survives."""


class BadValue(ServerError, code=2):
    """A parameter is missing, of the wrong type or out of range."""


class UnknownCommand(ServerError, code=3):
    """No command of that name exists."""


class ProtocolError(ServerError, code=4, fatal=True):
    """The bytes are not a valid MessagePack-RPC request."""


class FrameTooLarge(ServerError, code=5, fatal=True):
    """A request exceeds the frame bound (max_frame_bytes)."""


class HelloRequired(ServerError, code=6, fatal=True):
    """The first request must be hello."""


class AuthenticationFailed(ServerError, code=7, fatal=True):
    """Unknown user or wrong password."""


class Unauthorized(ServerError, code=8):
    """The user lacks the role this command needs."""


class NoBucketSelected(ServerError, code=9):
    """A data command ran with no bucket selected."""


class BucketNotFound(ServerError, code=10):
    """No bucket of that name exists."""


class BucketExists(ServerError, code=11):
    """A bucket of that name already exists."""


class UserNotFound(ServerError, code=12):
    """No user of that name exists."""


class UserExists(ServerError, code=13):
    """A user of that name already exists."""


class KeyNotFound(ServerError, code=14):
    """The key does not exist (replace, touch, cas, incr)."""


class KeyExists(ServerError, code=15):
    """The key already exists (set with mode=add)."""


class CasMismatch(ServerError, code=16):
    """The record's CAS differs from the one given."""


class KeyTooLong(ServerError, code=17):
    """The key is empty or longer than max_key_bytes."""


class ValueTooLarge(ServerError, code=18):
    """The value is longer than max_value_bytes."""


class NotANumber(ServerError, code=19):
    """incr/decr on a value that is not a decimal integer."""


class StorageFull(ServerError, code=20):
    """The disk or the map limit is full; nothing was written."""


class DeadlineExceeded(ServerError, code=21):
    """The request's deadline passed before it ran; it had no effect."""


class IdleTimeout(ServerError, code=22, fatal=True):
    """The connection was idle too long."""


class ShuttingDown(ServerError, code=23, labels=(RETRYABLE,)):
    """The server is stopping; the request had no effect."""


class Throttled(ServerError, code=25, labels=OVERLOAD_LABELS):
    """The bucket is over its unit allowance; retry after retryAfterMs."""


class AdmissionQueueOverflow(ServerError, code=26, labels=OVERLOAD_LABELS):
    """An admission queue is full; the request was rejected before it ran."""


class TooManyConnections(ServerError, code=27, labels=OVERLOAD_LABELS, fatal=True):
    """The node is at max_connections; the connection is closed."""


class TooManyLoginFailures(ServerError, code=28, fatal=True):
    """A login refused before its password was checked: its (user, address) pair
    failed recently, or (labelled retryable) the password-hashing pool is full;
    wait retryAfterMs before trying again."""


class RequestTooCostly(ServerError, code=29):
    """One request would cost more units than its bucket may spend in
    throttle_max_request_secs of its hard limit; it was refused before it ran.
    (No longer sent for writes: a costlier write runs once its bucket owes
    nothing, docs/throttling.md. The code stays reserved.)"""


class HardLimitZero(ServerError, code=30):
    """The bucket's hard limit is 0: nothing runs on it until an admin raises the
    limit; not retryable."""


class IngressRequestRateLimitExceeded(ServerError, code=462, labels=OVERLOAD_LABELS):
    """The node's request rate limit is exceeded."""


class InRedisWords:
    """An error that Redis clients know by a word of its own (cluster redirections):
    the RESP door answers :meth:`redis_text` as it is."""

    def redis_text(self) -> str:
        raise NotImplementedError


class NotMyPartition(ServerError, InRedisWords, code=70, labels=(RETRYABLE,)):
    """The key's slot is served by another node of the cluster (the message names
    the slot, the node's address and the map version): the request did not run;
    fetch the cluster map (``cluster_map``) and send it there. RESP: ``MOVED``."""

    def __init__(
        self,
        errmsg: str = "",
        *,
        slot: int = 0,
        owner: str = "",
        map_version: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(errmsg, **kw)
        self.slot, self.owner, self.map_version = slot, owner, map_version

    def to_wire(self) -> dict[str, Any]:
        return {
            **super().to_wire(),
            "slot": self.slot,
            "owner": self.owner,
            "mapVersion": self.map_version,
        }

    def redis_text(self) -> str:
        return f"MOVED {self.slot} {self.owner}"


class CrossSlot(ServerError, InRedisWords, code=71):
    """A multi-key command on the RESP door named keys of different slots (Redis
    Cluster's rule: use a ``{hashtag}`` to keep them in one)."""

    def redis_text(self) -> str:
        return "CROSSSLOT Keys in request don't hash to the same slot"


class NodeUnavailable(ServerError, InRedisWords, code=72, labels=(RETRYABLE,)):
    """The key's slot has no node that can serve it now (its node is down, the slot
    is not assigned yet, or this node cannot prove it owns it: its cluster lease
    lapsed); the request did not run. RESP: ``CLUSTERDOWN``."""

    def redis_text(self) -> str:
        return f"CLUSTERDOWN {self.errmsg}"


class SlotMoving(ServerError, InRedisWords):
    """The key's slot is switching to another node (a rebalance): for well under a
    second this node takes no write of it; the request did not run. Retry after
    ``retryAfterMs`` (the map then names the new owner). RESP: ``TRYAGAIN``."""

    code = 73
    code_name = "SlotMoving"
    default_labels = (RETRYABLE,)

    def redis_text(self) -> str:
        return f"TRYAGAIN {self.errmsg}"


#: code -> class: every ServerError subclass written out above, each with its own code.
_BY_CODE: dict[int, type[ServerError]] = {c.code: c for c in ServerError.__subclasses__()}
assert len(_BY_CODE) == len(ServerError.__subclasses__()), "two error classes share a code"


def error_classes() -> dict[int, type[ServerError]]:
    """Every server error class by code (for docs and tests)."""
    return dict(_BY_CODE)


def from_wire(err: Any, *, command: str | None = None) -> TenantKVError:
    """Turn a received error map into the matching exception instance."""
    if not isinstance(err, dict):
        return ServerError(f"malformed error from server: {err!r}", command=command)
    code = err.get("code")
    cls: type[ServerError] = (
        _BY_CODE.get(code, ServerError) if isinstance(code, int) else ServerError
    )
    labels = err.get("errorLabels")
    retry = err.get("retryAfterMs")
    exc = cls(
        str(err.get("errmsg", "")),
        labels=tuple(labels) if isinstance(labels, list) else None,
        retry_after_ms=retry if isinstance(retry, int) else None,
        command=command,
    )
    if cls is ServerError:
        # Unknown code from a newer server: keep what it said.
        exc.code = code if isinstance(code, int) else 0  # type: ignore[misc]
        exc.code_name = str(err.get("codeName", "ServerError"))  # type: ignore[misc]
    return exc
