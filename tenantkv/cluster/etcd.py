"""A thin typed etcd v3 client for Trio, over etcd's HTTP/JSON gateway.

Why not a gRPC client: ``aetcd`` runs on asyncio (``asyncio.Event``/``Queue``
around ``grpc.aio``) and ``etcd3`` blocks in gRPC calls with threads of its own
(last release 2020); neither runs on a Trio loop. etcd serves the same v3 API
as JSON on its client port (``/v3/kv/range``, ``/v3/watch``, …), and ``httpx``
speaks HTTP under Trio through anyio, so the whole client is a few requests.

Keys and values are bytes; the gateway carries them base64 and its 64-bit
integers as strings. Several endpoints may be given: a request that cannot
reach one tries the next, and :class:`EtcdUnavailable` says none answered.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import trio

log = logging.getLogger("tenantkv.cluster")

#: Seconds a unary request may take before the next endpoint is tried.
REQUEST_TIMEOUT_SECS = 2.0
#: Watch batches read ahead of the watcher (then the stream waits for it).
WATCH_BUFFER = 64


class EtcdError(Exception):
    """etcd refused a request; the message is etcd's."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered (etcd down or unreachable)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (etcd's rule:
    the prefix with its last byte below 0xff incremented)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\x00"  # every key
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            _unb64(kv.get("key")),
            _unb64(kv.get("value")),
            int(kv.get("create_revision", 0)),
            int(kv.get("mod_revision", 0)),
            int(kv.get("version", 0)),
            int(kv.get("lease", 0)),
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["PUT", "DELETE"]
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: each op's response, as the gateway gives it (``response_range`` etc.)
    responses: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` compared to ``value``."""

    key: bytes
    target: Literal["VERSION", "CREATE", "MOD", "VALUE"]
    result: Literal["EQUAL", "GREATER", "LESS", "NOT_EQUAL"]
    value: int | bytes

    def to_json(self) -> dict[str, Any]:
        field = {
            "VERSION": "version",
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VALUE": "value",
        }[self.target]
        v = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {"key": _b64(self.key), "target": self.target, "result": self.result, field: v}

    @classmethod
    def absent(cls, key: bytes) -> Compare:
        """True while ``key`` does not exist (create-if-absent)."""
        return cls(key, "CREATE", "EQUAL", 0)

    @classmethod
    def mod_revision(cls, key: bytes, revision: int) -> Compare:
        """True while ``key`` was last changed at ``revision`` (0: it does not exist)."""
        return cls(key, "MOD", "EQUAL", revision)


def put_op(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def get_op(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


class Etcd:
    """An etcd client on the current Trio loop; close it with :meth:`aclose`."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = REQUEST_TIMEOUT_SECS):
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self._timeout = timeout
        self._http = httpx.AsyncClient(timeout=timeout)
        #: the endpoint that answered last: tried first next time
        self._current = 0

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(1):  # closes when cancelled
            await self.aclose()

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the first endpoint that answers."""
        failures: list[str] = []
        for i in range(len(self.endpoints)):
            index = (self._current + i) % len(self.endpoints)
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                reply = await self._http.post(url, json=body)
            except httpx.TransportError as exc:
                failures.append(f"{self.endpoints[index]}: {exc!r}")
                continue
            self._current = index
            return _checked(reply)
        raise EtcdUnavailable("etcd unreachable: " + "; ".join(failures))

    # -- keys ---------------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        kvs, _ = await self.range(key)
        return kvs[0] if kvs else None

    async def range(self, key: bytes, *, prefix: bool = False) -> tuple[list[KeyValue], int]:
        """The keys (one, or all under ``prefix``) and the store's revision."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        reply = await self.call("kv/range", body)
        revision = int(reply["header"]["revision"])
        return [KeyValue.from_json(kv) for kv in reply.get("kvs", [])], revision

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Store ``value``; returns the revision of the write."""
        reply = await self.call("kv/put", put_op(key, value, lease)["request_put"])
        return int(reply["header"]["revision"])

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        """Delete the key (or every key under ``prefix``); returns how many went."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        reply = await self.call("kv/deleterange", body)
        return int(reply.get("deleted", 0))

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> TxnResult:
        """If every comparison holds run ``success``, else ``failure``; atomically."""
        reply = await self.call(
            "kv/txn",
            {
                "compare": [c.to_json() for c in compare],
                "success": list(success),
                "failure": list(failure),
            },
        )
        return TxnResult(
            bool(reply.get("succeeded", False)),
            int(reply["header"]["revision"]),
            reply.get("responses", []),
        )

    # -- leases -------------------------------------------------------------------

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; returns its id."""
        reply = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(reply["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Renew the lease once; returns its new TTL, 0 when it has expired."""
        reply = await self.call("lease/keepalive", {"ID": str(lease)})
        return int(reply.get("result", {}).get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        """End the lease now: the keys attached to it go."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "not found" not in str(exc):  # already expired: the same outcome
                raise

    # -- watch --------------------------------------------------------------------

    @asynccontextmanager
    async def watch(
        self, key: bytes, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[Watch]:
        """The changes to ``key`` (or under ``prefix``) from ``start_revision`` (0:
        from now), a batch per etcd response: ``async with etcd.watch(k) as w:
        async for events in w``. Iterating raises :class:`EtcdUnavailable` when
        the stream breaks; the caller resumes from the revision after the last
        one it saw.

        The stream is read by a task of its own and stopped by cancelling it: a
        cancellation unwinds httpx's nested stream generators, where leaving them
        by ``break`` would leave them to the garbage collector."""
        create: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            create["range_end"] = _b64(prefix_end(key))
        if start_revision:
            create["start_revision"] = str(start_revision)
        send, receive = trio.open_memory_channel[list[WatchEvent] | EtcdError](WATCH_BUFFER)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump_watch, create, send)
                try:
                    yield Watch(receive)
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The pump raises nothing (its errors travel the channel): what the
            # nursery gathered is the caller's own, raised as the caller raised it.
            raise _sole(group) from None

    async def _pump_watch(
        self, create: dict[str, Any], send: trio.MemorySendChannel[list[WatchEvent] | EtcdError]
    ) -> None:
        url = f"{self.endpoints[self._current]}/v3/watch"
        timeout = httpx.Timeout(self._timeout, read=None)
        async with send:
            try:
                async with self._http.stream(
                    "POST", url, json={"create_request": create}, timeout=timeout
                ) as reply:
                    if reply.status_code != 200:
                        await reply.aread()
                        _checked(reply)
                    async for line in reply.aiter_lines():
                        events = _watch_events(line)
                        if events:
                            await send.send(events)
                raise EtcdUnavailable("etcd ended the watch stream")
            except httpx.TransportError as exc:
                self._current = (self._current + 1) % len(self.endpoints)
                await send.send(EtcdUnavailable(f"etcd watch broke: {exc!r}"))
            except EtcdError as exc:
                await send.send(exc)


class Watch:
    """The batches of one watch, in order; raises the error that ended it."""

    def __init__(self, receive: trio.MemoryReceiveChannel[list[WatchEvent] | EtcdError]):
        self._receive = receive

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, EtcdError):
            raise item
        return item


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception that matters in ``group``: the only one that is not a
    cancellation, else the first cancellation; the group itself if several."""
    others = [e for e in group.exceptions if not isinstance(e, trio.Cancelled)]
    if not others:
        return group.exceptions[0]
    return others[0] if len(others) == 1 else group


def _checked(reply: httpx.Response) -> dict[str, Any]:
    """The gateway's JSON reply, or :class:`EtcdError` with etcd's message."""
    try:
        data = reply.json()
    except json.JSONDecodeError:
        raise EtcdError(f"etcd answered {reply.status_code}: {reply.text[:200]}") from None
    if reply.status_code != 200 or ("error" in data and "header" not in data):
        message = data.get("message") or data.get("error") or reply.text[:200]
        raise EtcdError(f"etcd: {message}")
    return data


def _watch_events(line: str) -> list[WatchEvent]:
    """The events of one line of the watch stream (none for the creation notice)."""
    if not line.strip():
        return []
    data = json.loads(line)
    if "error" in data:
        raise EtcdError(f"etcd watch: {data['error'].get('message', data['error'])}")
    result = data.get("result", {})
    if result.get("canceled"):
        raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason', '')}")
    return [
        WatchEvent("DELETE" if e.get("type") == "DELETE" else "PUT", KeyValue.from_json(e["kv"]))
        for e in result.get("events", [])
    ]


async def keep_lease_alive(
    etcd: Etcd, lease: int, ttl: int, renewed: Callable[[float], None] = lambda deadline: None
) -> None:
    """Renew ``lease`` every third of its TTL; return when it has expired: etcd
    says so, or it stayed unreachable past the TTL. After each renewal
    ``renewed`` gets the Trio time until which the lease surely lives (counted
    from when the renewal was sent: etcd's clock started later)."""
    period = max(ttl / 3, 0.05)
    deadline = trio.current_time() + ttl
    while True:
        await trio.sleep(period)
        sent = trio.current_time()
        try:
            remaining = await etcd.lease_keepalive(lease)
        except EtcdError as exc:
            if trio.current_time() < deadline:
                log.warning("lease %x not renewed (will retry): %s", lease, exc)
                continue
            remaining = 0
        if remaining <= 0:
            log.error("lease %x expired", lease)
            return
        deadline = sent + remaining
        renewed(deadline)


async def campaign(etcd: Etcd, key: bytes, value: bytes, lease: int) -> int:
    """Become the holder of ``key`` (an election): create it under ``lease`` if
    absent, else wait for the holder's key to go and try again. Returns the
    revision at which this campaigner won; it stays leader while its lease lives."""
    while True:
        result = await etcd.txn([Compare.absent(key)], [put_op(key, value, lease)], [get_op(key)])
        if result.succeeded:
            return result.revision
        kvs = result.responses[0].get("response_range", {}).get("kvs", [])
        if kvs and KeyValue.from_json(kvs[0]).lease == lease:
            return result.revision  # already ours (a retried campaign)
        async with etcd.watch(key, start_revision=result.revision + 1) as stream:
            async for events in stream:
                if any(e.type == "DELETE" for e in events):
                    break
