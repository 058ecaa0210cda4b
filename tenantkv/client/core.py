"""The sans-IO client core shared by :class:`tenantkv.Client` and :class:`tenantkv.AsyncClient`.

It encodes requests, pairs responses with requests by msgid, and turns error
maps into exceptions; it never touches a socket. :class:`Commands` describes
every command once — its parameters and how its result is read — and each
driver only supplies ``_execute(call)``, which sends a :class:`Call` and
returns its parsed result (or, for the async client, a coroutine of it),
following the decisions of the shared retry policy
(:mod:`tenantkv.client.retry`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any, Generic, TypeVar

from tenantkv import errors, protocol

T = TypeVar("T")
CLIENT_NAME = "tenantkv-python"
#: A reply that opens so is a Redis protocol (RESP) error or status line; a
#: MessagePack-RPC response opens with an array (0x94), never with these.
_RESP_LINE_HEADS = (b"-", b"+")
#: How the server's RESP door names its MessagePack port (``tenantkv.server.doors.resp``).
_MSGPACK_PORT = re.compile(r"MessagePack port (\d+)")

Key = bytes | str


@dataclass(frozen=True, slots=True)
class Record:
    """A stored value with its metadata."""

    value: bytes
    cas: int
    flags: int
    expiry_ms: int


@dataclass(frozen=True, slots=True)
class Item:
    """One record returned by ``scan``."""

    key: bytes
    value: bytes
    cas: int
    flags: int
    expiry_ms: int


@dataclass(frozen=True, slots=True)
class ScanPage:
    items: list[Item]
    #: pass as ``after`` to get the next page; None when the scan is complete
    cursor: bytes | None


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    params: dict[str, Any]
    parse: Callable[[Any], T]
    #: a read: retried on overload when ``retry_reads`` (else ``retry_writes``)
    is_read: bool = False
    #: sent by ``command()``: its class is unknown, so it is retried on overload only
    #: when both ``retry_reads`` and ``retry_writes`` are on
    generic: bool = False


def _key(key: Key) -> bytes:
    return key.encode() if isinstance(key, str) else key


def _value(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _ident(x: Any) -> Any:
    return x


def _record(r: Any) -> Record | None:
    return None if r is None else Record(r["value"], r["cas"], r["flags"], r["expiry_ms"])


def _value_of(r: Any) -> bytes | None:
    return None if r is None else r["value"]


def _cas(r: Any) -> int:
    return int(r["cas"])


def _transaction_results(r: Any) -> list[Any] | None:
    if r is None:
        return None
    return [
        x.get("result") if "error" not in x else errors.from_wire(x["error"], command="transaction")
        for x in r
    ]


def _scan(r: Any) -> ScanPage:
    return ScanPage([Item(*row) for row in r["items"]], r["cursor"])


class ClientCore:
    """Request encoding and response matching."""

    def __init__(self) -> None:
        self._ids = count(1)
        self._decoder = protocol.ResponseDecoder()
        self._answered = False
        #: the server's ``max_value_bytes`` (from its hello; None: not known yet)
        self.max_value_bytes: int | None = None

    def heed_limits(self, hello_result: Any) -> None:
        """Take the server's limits from its hello result."""
        limits = hello_result.get("limits") if isinstance(hello_result, dict) else None
        limit = limits.get("max_value_bytes") if isinstance(limits, dict) else None
        self.max_value_bytes = limit if isinstance(limit, int) else None

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        """The request's msgid and frame. A ``value`` over the server's
        ``max_value_bytes`` raises ValueTooLarge, as the server would, without
        being sent: a value far over it would exceed the server's frame bound,
        and the server would close the connection while it is still sent."""
        value = params.get("value") if method == "set" else None  # (the one stored value)
        limit = self.max_value_bytes
        if limit is not None and isinstance(value, (bytes, str)):
            n = len(value) if isinstance(value, bytes) else len(value.encode())
            if n > limit:
                raise errors.ValueTooLarge(
                    f"value of {n} bytes exceeds max_value_bytes={limit} (not sent)"
                )
        msgid = next(self._ids) & 0xFFFFFFFF
        return msgid, protocol.encode_request(msgid, method, params)

    def receive(self, data: bytes | bytearray) -> list[protocol.Response]:
        if not self._answered and data:
            self._answered = True
            if bytes(data[:1]) in _RESP_LINE_HEADS:
                raise errors.MalformedReply(wrong_door_message(data))
        self._decoder.feed(data)
        return list(self._decoder)

    @staticmethod
    def outcome(resp: protocol.Response, call: Call[T]) -> T:
        """The parsed result, or raise the error the server sent."""
        if resp.error is not None:
            raise errors.from_wire(resp.error, command=call.method)
        return call.parse(resp.result)


def wrong_door_message(data: bytes | bytearray) -> str:
    """What to say when the server answered in the Redis protocol: the port given
    is the RESP door (the server's own line, bounded, tells what it saw)."""
    line = bytes(data[1:200]).split(b"\r\n", 1)[0].decode("utf-8", "replace")
    m = _MSGPACK_PORT.search(line)
    where = f"the MessagePack port {m[1]}" if m else f"the MessagePack port (it answered {line!r})"
    return (
        "this looks like the RESP (Redis protocol) port; tenantkv-admin and tenantkv.Client "
        f"talk to {where}"
    )


def hello_call(
    user: str,
    password: str,
    bucket: str | None,
    client_name: str,
    version: str,
    nonblocking_throttle: bool = False,
) -> Call[dict[str, Any]]:
    params: dict[str, Any] = {
        "user": user,
        "password": password,
        "client": {"name": client_name, "version": version},
        "backpressure": True,
    }
    if nonblocking_throttle:
        params["nonblocking_throttle"] = True
    if bucket is not None:
        params["bucket"] = bucket
    return Call("hello", params, _ident)


class Commands:
    """Every command, described once. Drivers implement ``_execute``."""

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        raise NotImplementedError  # pragma: no cover - abstract

    def with_timeout(self, seconds: float | None) -> Commands:
        """A view of this client whose operations use this timeout, e.g.
        ``c.with_timeout(0.5).get("k")`` (``await`` it on the async client)."""
        return _TimeoutView(self, seconds)

    # -- data ---------------------------------------------------------------

    def get(self, key: Key) -> Any:
        """The value, or None if the key does not exist."""
        return self._execute(Call("get", {"key": _key(key)}, _value_of, True))

    def get_record(self, key: Key) -> Any:
        """A :class:`Record` (value, cas, flags, expiry_ms), or None."""
        return self._execute(Call("get", {"key": _key(key)}, _record, True))

    def exists(self, key: Key) -> Any:
        return self._execute(Call("exists", {"key": _key(key)}, bool, True))

    def set(
        self,
        key: Key,
        value: bytes | str,
        *,
        ttl: float = 0,
        flags: int = 0,
        cas: int = 0,
        mode: str = "upsert",
    ) -> Any:
        """Store a value; returns its new CAS. ``cas`` makes it a compare-and-swap;
        ``mode`` is upsert, add (fail if present) or replace (fail if absent)."""
        params: dict[str, Any] = {"key": _key(key), "value": _value(value)}
        if ttl:
            params["ttl"] = ttl
        if flags:
            params["flags"] = flags
        if cas:
            params["cas"] = cas
        if mode != "upsert":
            params["mode"] = mode
        return self._execute(Call("set", params, _cas))

    def add(self, key: Key, value: bytes | str, *, ttl: float = 0, flags: int = 0) -> Any:
        return self.set(key, value, ttl=ttl, flags=flags, mode="add")

    def replace(self, key: Key, value: bytes | str, *, ttl: float = 0, flags: int = 0) -> Any:
        return self.set(key, value, ttl=ttl, flags=flags, mode="replace")

    def delete(self, key: Key, *, cas: int = 0) -> Any:
        """True if a record was deleted, False if there was none."""
        params: dict[str, Any] = {"key": _key(key)}
        if cas:
            params["cas"] = cas
        return self._execute(Call("delete", params, bool))

    def touch(self, key: Key, ttl: float) -> Any:
        """Set a new ttl (0 = never expires); returns the new CAS."""
        return self._execute(Call("touch", {"key": _key(key), "ttl": ttl}, _cas))

    def incr(self, key: Key, delta: int = 1, *, initial: int | None = None, ttl: float = 0) -> Any:
        """Atomically add ``delta``; a missing key is set to ``initial`` if given."""
        return self._counter("incr", key, delta, initial, ttl)

    def decr(self, key: Key, delta: int = 1, *, initial: int | None = None, ttl: float = 0) -> Any:
        return self._counter("decr", key, delta, initial, ttl)

    def _counter(self, method: str, key: Key, delta: int, initial: int | None, ttl: float) -> Any:
        params: dict[str, Any] = {"key": _key(key), "delta": delta}
        if initial is not None:
            params["initial"] = initial
        if ttl:
            params["ttl"] = ttl
        return self._execute(Call(method, params, lambda r: int(r["value"])))

    def mget(self, keys: Iterable[Key]) -> Any:
        """Values in key order, None for missing keys."""
        return self._execute(
            Call(
                "mget",
                {"keys": [_key(k) for k in keys]},
                lambda r: [None if x is None else x["value"] for x in r],
                True,
            )
        )

    def mget_records(self, keys: Iterable[Key]) -> Any:
        return self._execute(
            Call("mget", {"keys": [_key(k) for k in keys]}, lambda r: [_record(x) for x in r], True)
        )

    def scan(
        self,
        *,
        prefix: Key | None = None,
        start: Key | None = None,
        end: Key | None = None,
        after: Key | None = None,
        limit: int = 100,
    ) -> Any:
        """One page of records in key order (by prefix or [start, end)); see ScanPage."""
        params: dict[str, Any] = {"limit": limit}
        for name, v in (("prefix", prefix), ("start", start), ("end", end), ("after", after)):
            if v is not None:
                params[name] = _key(v)
        return self._execute(Call("scan", params, _scan, True))

    def ping(self) -> Any:
        return self._execute(Call("ping", {}, _ident, True))

    def select_bucket(self, name: str) -> Any:
        return self._execute(Call("select_bucket", {"bucket": name}, _ident))

    # -- admin ---------------------------------------------------------------

    def create_bucket(
        self, name: str, *, reserved: int | str | None = None, hard_limit: int | str | None = None
    ) -> Any:
        """Create a bucket; throttle limits (units/s or "unlimited") default to the node's."""
        params: dict[str, Any] = {"name": name}
        if reserved is not None:
            params["reserved"] = reserved
        if hard_limit is not None:
            params["hard_limit"] = hard_limit
        return self._execute(Call("create_bucket", params, _ident))

    def set_node_throttle(self, props: dict[str, Any] | str) -> Any:
        """SetNodeThrottleProperties: {capacity, default_throttle_hard_limit,
        default_throttle_reserved_units} (any subset; a dict or its JSON text)."""
        body = props if isinstance(props, str) else json.dumps(props)
        return self._execute(Call("SetNodeThrottleProperties", {"json": body}, _ident))

    def get_node_throttle(self) -> Any:
        return self._execute(Call("GetNodeThrottleProperties", {}, _ident, True))

    def set_bucket_throttle(self, bucket: str, props: dict[str, Any] | str) -> Any:
        """SetBucketThrottleProperties: {reserved, hard_limit} (a dict or its JSON text)."""
        body = props if isinstance(props, str) else json.dumps(props)
        return self._execute(
            Call("SetBucketThrottleProperties", {"bucket": bucket, "json": body}, _ident)
        )

    def get_bucket_throttle(self, bucket: str) -> Any:
        return self._execute(Call("GetBucketThrottleProperties", {"bucket": bucket}, _ident, True))

    def delete_bucket(self, name: str) -> Any:
        return self._execute(Call("delete_bucket", {"name": name}, _ident))

    def list_buckets(self) -> Any:
        return self._execute(Call("list_buckets", {}, _ident, True))

    def create_user(
        self,
        name: str,
        password: str,
        *,
        roles: dict[str, str] | None = None,
        admin: bool = False,
        unthrottled: bool = False,
    ) -> Any:
        """roles: {bucket: "read" | "readwrite"}."""
        return self._execute(
            Call(
                "create_user",
                {
                    "name": name,
                    "password": password,
                    "roles": roles or {},
                    "admin": admin,
                    "unthrottled": unthrottled,
                },
                _ident,
            )
        )

    def delete_user(self, name: str) -> Any:
        return self._execute(Call("delete_user", {"name": name}, _ident))

    def list_users(self) -> Any:
        return self._execute(Call("list_users", {}, _ident, True))

    def server_status(self) -> Any:
        return self._execute(Call("server_status", {}, _ident, True))

    def command(self, method: str, /, **args: Any) -> Any:
        """Run any server command with these parameters; returns its raw result.

        A ``timeout_ms`` among them also bounds the operation on the client side."""
        return self._execute(Call(method, args, _ident, generic=True))

    def transaction(
        self,
        ops: Iterable[tuple[str, Mapping[str, Any]]],
        *,
        watch: Mapping[Key, int] | None = None,
    ) -> Any:
        """Run ``ops`` — ``(method, params)`` pairs of data commands, e.g.
        ``("set", {"key": "a", "value": "1"})``, ``("incr", {"key": "n"})``,
        ``("get", {"key": "a"})`` — atomically, in one request: applied in one
        commit, acknowledged once durable; a read sees the earlier ops' writes.

        Returns each op's raw result in order, or the :class:`ServerError` it
        failed with (a runtime error fails that op only, as in Redis); None when
        ``watch`` ({key: CAS} from :meth:`get_record`, 0 for "no such key")
        does not hold any more: then nothing ran. An op that fails its check
        (parameters, role) fails the whole request before anything runs.

        Retried as a write is: only when the server proves it did not run (an
        overload error before admission), never after a lost connection."""
        params: dict[str, Any] = {"ops": [[method, dict(p)] for method, p in ops]}
        if watch:
            params["watch"] = [[_key(k), int(cas)] for k, cas in watch.items()]
        return self._execute(Call("transaction", params, _transaction_results))

    # -- Redis's string and keyspace commands (the RESP door's, same rules) -----

    def _string(self, method: str, params: dict[str, Any], is_read: bool) -> Any:
        given = {k: v for k, v in params.items() if v is not None and v is not False}
        return self._execute(Call(method, given, _ident, is_read))

    def getrange(self, key: Key, start: int, end: int) -> Any:
        """The bytes of the value from ``start`` to ``end`` inclusive (negative:
        from the end), as Redis's GETRANGE; b"" for a missing key."""
        return self._string("getrange", {"key": _key(key), "start": start, "end": end}, True)

    def setrange(self, key: Key, offset: int, value: bytes | str) -> Any:
        """Overwrite the value from ``offset`` (zero-padded); the new length."""
        return self._string(
            "setrange", {"key": _key(key), "offset": offset, "value": _value(value)}, False
        )

    def append(self, key: Key, value: bytes | str) -> Any:
        """Append to the value (created if missing); the new length."""
        return self._string("append", {"key": _key(key), "value": _value(value)}, False)

    def strlen(self, key: Key) -> Any:
        return self._string("strlen", {"key": _key(key)}, True)

    def getdel(self, key: Key) -> Any:
        """The value, deleting the key; None if there was none."""
        return self._string("getdel", {"key": _key(key)}, False)

    def incrbyfloat(self, key: Key, delta: float) -> Any:
        """Add ``delta`` as Redis's INCRBYFLOAT does; the new value as decimal bytes."""
        return self._string("incrbyfloat", {"key": _key(key), "delta": delta}, False)

    def getbit(self, key: Key, offset: int) -> Any:
        return self._string("getbit", {"key": _key(key), "offset": offset}, True)

    def setbit(self, key: Key, offset: int, bit: int) -> Any:
        """Set or clear one bit; the bit's old value."""
        return self._string("setbit", {"key": _key(key), "offset": offset, "bit": bit}, False)

    def bitcount(
        self, key: Key, start: int | None = None, end: int | None = None, unit: str | None = None
    ) -> Any:
        """Set bits, in the whole value or a range of bytes (``unit="bit"``: bits)."""
        params = {"key": _key(key), "start": start, "end": end, "unit": unit}
        return self._string("bitcount", params, True)

    def bitpos(
        self,
        key: Key,
        bit: int,
        start: int | None = None,
        end: int | None = None,
        unit: str | None = None,
    ) -> Any:
        params = {"key": _key(key), "bit": bit, "start": start, "end": end, "unit": unit}
        return self._string("bitpos", params, True)

    def bitop(self, op: str, dest: Key, keys: Iterable[Key]) -> Any:
        """AND, OR, XOR or NOT of ``keys`` into ``dest``; the result's length."""
        params = {"op": op, "dest": _key(dest), "keys": [_key(k) for k in keys]}
        return self._string("bitop", params, False)

    def lcs(
        self,
        key: Key,
        key2: Key,
        *,
        length: bool = False,
        idx: bool = False,
        minmatchlen: int | None = None,
        withmatchlen: bool = False,
    ) -> Any:
        """The longest common subsequence of two values, as Redis's LCS
        (``length``: its length only, Redis's ``LEN``)."""
        params = {"key": _key(key), "key2": _key(key2), "len": length, "idx": idx}
        params |= {"minmatchlen": minmatchlen, "withmatchlen": withmatchlen}
        return self._string("lcs", params, True)

    def copy(self, key: Key, dest: Key, *, replace: bool = False) -> Any:
        """Copy value, expiry and flags to ``dest``; 1, or 0 if ``dest`` exists."""
        params = {"key": _key(key), "dest": _key(dest), "replace": replace}
        return self._string("copy", params, False)

    def rename(self, key: Key, dest: Key) -> Any:
        return self._string("rename", {"key": _key(key), "dest": _key(dest)}, False)

    def renamenx(self, key: Key, dest: Key) -> Any:
        """Rename unless ``dest`` exists; 1, or 0."""
        return self._string("renamenx", {"key": _key(key), "dest": _key(dest)}, False)

    def randomkey(self) -> Any:
        return self._string("randomkey", {}, True)


class _TimeoutView(Commands):
    __slots__ = ("_client", "_seconds")

    def __init__(self, client: Commands, seconds: float | None) -> None:
        self._client = client
        self._seconds = seconds

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> Any:
        return self._client._execute(call, self._seconds if op_timeout is None else op_timeout)
