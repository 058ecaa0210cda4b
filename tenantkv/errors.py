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
The server raises these exceptions internally and turns them into the wire error
map (:meth:`TenantKVError.to_wire`); the client turns a received map back into
the matching subclass (:func:`from_wire`), so both sides share one vocabulary.
"""

from __future__ import annotations

from typing import Any, ClassVar

SYSTEM_OVERLOADED = "SystemOverloadedError"
RETRYABLE = "RetryableError"
OVERLOAD_LABELS: tuple[str, ...] = (SYSTEM_OVERLOADED, RETRYABLE)


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

    def __init__(
        self,
        errmsg: str = "",
        *,
        labels: tuple[str, ...] | list[str] | None = None,
        retry_after_ms: int | None = None,
        command: str | None = None,
    ) -> None:
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

    code_name = "ClientError"


class ConnectionClosed(ClientError):
    """The connection is gone or could not be made; the subclasses say how."""

    code_name = "ConnectionClosed"


class ConnectFailed(ConnectionClosed):
    """No connection could be opened (refused, unreachable, TLS failed): nothing was sent."""

    code_name = "ConnectFailed"


class RequestNotSent(ConnectionClosed):
    """The connection broke before the request was sent: it provably did not run."""

    code_name = "RequestNotSent"


class PeerClosed(ConnectionClosed):
    """The server closed the connection after the request was sent: whether it ran is
    unknown (a read is retried; a write is not, and this error says so)."""

    code_name = "PeerClosed"


class MalformedReply(ConnectionClosed):
    """The server's reply could not be decoded; the connection is dropped."""

    code_name = "MalformedReply"


class ClientTimeout(ClientError):
    code_name = "ClientTimeout"


class ServerError(TenantKVError):
    """An error reported by the server; look at ``code``/``code_name``."""

    code_name = "ServerError"


#: code -> class, filled by :func:`_define`.
_BY_CODE: dict[int, type[ServerError]] = {}


def _define(
    code: int,
    name: str,
    doc: str,
    *,
    labels: tuple[str, ...] = (),
    fatal: bool = False,
) -> type[ServerError]:
    cls = type(
        name,
        (ServerError,),
        {
            "code": code,
            "code_name": name,
            "default_labels": labels,
            "fatal": fatal,
            "__doc__": doc,
            "__module__": __name__,
        },
    )
    assert code not in _BY_CODE, code
    _BY_CODE[code] = cls
    return cls


# The one table of codes. Keep docs/protocol.md in step (a test compares them).
InternalError = _define(1, "InternalError", "An unexpected server fault; the connection survives.")
BadValue = _define(2, "BadValue", "A parameter is missing, of the wrong type or out of range.")
UnknownCommand = _define(3, "UnknownCommand", "No command of that name exists.")
ProtocolError = _define(
    4, "ProtocolError", "The bytes are not a valid MessagePack-RPC request.", fatal=True
)
FrameTooLarge = _define(
    5, "FrameTooLarge", "A request exceeds the frame bound (max_frame_bytes).", fatal=True
)
HelloRequired = _define(6, "HelloRequired", "The first request must be hello.", fatal=True)
AuthenticationFailed = _define(
    7, "AuthenticationFailed", "Unknown user or wrong password.", fatal=True
)
Unauthorized = _define(8, "Unauthorized", "The user lacks the role this command needs.")
NoBucketSelected = _define(9, "NoBucketSelected", "A data command ran with no bucket selected.")
BucketNotFound = _define(10, "BucketNotFound", "No bucket of that name exists.")
BucketExists = _define(11, "BucketExists", "A bucket of that name already exists.")
UserNotFound = _define(12, "UserNotFound", "No user of that name exists.")
UserExists = _define(13, "UserExists", "A user of that name already exists.")
KeyNotFound = _define(14, "KeyNotFound", "The key does not exist (replace, touch, cas, incr).")
KeyExists = _define(15, "KeyExists", "The key already exists (set with mode=add).")
CasMismatch = _define(16, "CasMismatch", "The record's CAS differs from the one given.")
KeyTooLong = _define(17, "KeyTooLong", "The key is empty or longer than max_key_bytes.")
ValueTooLarge = _define(18, "ValueTooLarge", "The value is longer than max_value_bytes.")
NotANumber = _define(19, "NotANumber", "incr/decr on a value that is not a decimal integer.")
StorageFull = _define(20, "StorageFull", "The disk or the map limit is full; nothing was written.")
DeadlineExceeded = _define(
    21, "DeadlineExceeded", "The request's deadline passed before it ran; it had no effect."
)
IdleTimeout = _define(22, "IdleTimeout", "The connection was idle too long.", fatal=True)
ShuttingDown = _define(
    23, "ShuttingDown", "The server is stopping; the request had no effect.", labels=(RETRYABLE,)
)
Throttled = _define(
    25,
    "Throttled",
    "The bucket is over its unit allowance; retry after retryAfterMs.",
    labels=OVERLOAD_LABELS,
)
AdmissionQueueOverflow = _define(
    26,
    "AdmissionQueueOverflow",
    "An admission queue is full; the request was rejected before it ran.",
    labels=OVERLOAD_LABELS,
)
TooManyConnections = _define(
    27,
    "TooManyConnections",
    "The node is at max_connections; the connection is closed.",
    labels=OVERLOAD_LABELS,
    fatal=True,
)
TooManyLoginFailures = _define(
    28,
    "TooManyLoginFailures",
    "Too many failed logins from this address; wait retryAfterMs before trying again.",
    fatal=True,
)
RequestTooCostly = _define(
    29,
    "RequestTooCostly",
    "One request would cost more units than its bucket may spend in "
    "throttle_max_request_secs of its hard limit; it was refused before it ran.",
)
HardLimitZero = _define(
    30,
    "HardLimitZero",
    "The bucket's hard limit is 0: nothing runs on it until an admin raises the limit; "
    "not retryable.",
)
IngressRequestRateLimitExceeded = _define(
    462,
    "IngressRequestRateLimitExceeded",
    "The node's request rate limit is exceeded.",
    labels=OVERLOAD_LABELS,
)


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
