"""Pipelines of the cluster clients: each node gets its part in one batch.

    with cc.pipeline() as p:              # cc: a ClusterClient
        p.set("user:1", b"x"); p.get("user:2"); p.mget(["a", "b", "c"])
    print(p.results)                      # in the order queued

    async with acc.pipeline() as p:       # acc: an AsyncClusterClient
        p.get("user:1"); p.incr("n", initial=0)

``execute`` plans each queued call by the map (:func:`~tenantkv.client.cluster.plan`:
an ``mget`` over several nodes is a part per node), sends every node the parts
it serves in one write — as the plain client's
:class:`~tenantkv.client.sync_client.Pipeline` sends its batch, one attempt per
command, in the order queued, so that one key's commands keep their order and
effects — and puts the answers back in the order queued.

A part refused with ``NotMyPartition`` did not run (the node checked the key's
slot before anything else): the client reads the map again and sends again only
the calls refused, up to ``max_redirects`` times. The parts that ran are not
sent again — except the other parts of a split ``mget`` whose one part was
refused: the call is planned again whole, and an ``mget`` is a read. Any other
error stays in its call's place, as in the plain pipeline; a node that cannot be
reached fails only its own calls (``ConnectFailed``: not sent), the other nodes'
calls still run. The blocking client sends to the nodes one after another, the
Trio client to all at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import trio

from tenantkv import errors
from tenantkv.client.async_client import AsyncClient, _Slot
from tenantkv.client.cluster_plan import Part, SlotMap, joined, plan, unreachable
from tenantkv.client.core import Call, Commands
from tenantkv.client.servers import Address
from tenantkv.client.sync_client import Client


class ClusterClient(Protocol):
    """What a pipeline needs of :class:`tenantkv.client.cluster.ClusterClient`."""

    map: SlotMap
    seed: Address
    max_redirects: int

    def refresh_map(self) -> SlotMap: ...

    def node_client(self, address: Address) -> Client: ...


class AsyncClusterClient(Protocol):
    """What a pipeline needs of :class:`tenantkv.client.cluster.AsyncClusterClient`."""

    map: SlotMap | None
    seed: Address
    max_redirects: int

    async def refresh_map(self) -> SlotMap: ...

    async def node_client(self, address: Address) -> AsyncClient: ...


C = TypeVar("C")

#: Each node's batch: (the call's place in the pipeline, the part of it the node gets).
Batches = dict[Address | None, list[tuple[int, Part]]]


def batches(
    calls: Sequence[Call[Any]], todo: Iterable[int], slot_map: SlotMap, seed: Address
) -> Batches:
    """The calls ``todo`` (places in ``calls``) as one batch per node, each in
    the order queued (None: the slot has no node)."""
    out: Batches = {}
    for i in todo:
        for part in plan(calls[i], slot_map, seed):
            out.setdefault(part[0], []).append((i, part))
    return out


def settle(
    by_node: Batches, answers: dict[Address | None, list[Any]], results: list[Any]
) -> list[int]:
    """Put each call's answer in ``results`` (joined from its parts; an error
    in its place) and return the places of the calls refused with
    ``NotMyPartition``: they did not run, and go again by a newer map."""
    per_call: dict[int, tuple[list[Part], list[Any]]] = {}
    for address, batch in by_node.items():
        for (i, part), answer in zip(batch, answers[address], strict=True):
            parts, got = per_call.setdefault(i, ([], []))
            parts.append(part)
            got.append(answer)
    again: list[int] = []
    for i, (parts, got) in sorted(per_call.items()):
        failures = [a for a in got if isinstance(a, BaseException)]
        refused = [a for a in failures if isinstance(a, errors.NotMyPartition)]
        if refused:
            again.append(i)
            results[i] = refused[0]
        elif failures:
            results[i] = failures[0]
        else:
            results[i] = joined(parts, got)
    return again


def no_node(batch: list[tuple[int, Part]]) -> list[Any]:
    """The answers of a batch whose keys' slots have no node in the map."""
    return [
        errors.NodeUnavailable(f"{part[1].method}: the key's slot has no node in the map")
        for _, part in batch
    ]


def lost(address: Address, exc: errors.TenantKVError, n: int) -> list[Any]:
    """The answers of a batch of ``n`` calls that a node's connection could not
    take: unreachable (not sent) or the error itself (a login refused, say) in
    every call's place."""
    if isinstance(exc, errors.ConnectFailed):
        return [unreachable(address, exc)] * n
    exc.__traceback__ = None
    return [exc] * n


class _Queued(Commands, Generic[C]):
    """What both pipelines share, all of it sans-IO: the queue, and the rounds of
    an ``execute`` — plan the calls left by the map, settle the nodes' answers,
    go again by a newer map for the calls refused. Only how a round's batches
    are sent differs: one node after another, or all at once on Trio."""

    def __init__(self, client: C, *, raise_on_error: bool = True) -> None:
        self._client = client
        self._calls: list[Call[Any]] = []
        self.raise_on_error = raise_on_error
        self.results: list[Any] = []
        #: the execute under way: its calls, their results, the places still to send
        self._sent: list[Call[Any]] = []
        self._results: list[Any] = []
        self._todo: list[int] = []
        self._by_node: Batches = {}

    def _execute(self, call: Call[Any], op_timeout: float | None = None) -> None:
        self._calls.append(call)  # queued calls share the timeout given to execute()

    def _begin(self) -> None:
        """Take the queue: every call still to send."""
        self._sent, self._calls = self._calls, []
        self._results = [None] * len(self._sent)
        self._todo = list(range(len(self._sent)))

    def _plan(self, slot_map: SlotMap, seed: Address) -> Batches:
        """This round's batch for each node: the calls left, by ``slot_map``."""
        self._by_node = batches(self._sent, self._todo, slot_map, seed)
        return self._by_node

    def _settle(self, answers: dict[Address | None, list[Any]]) -> bool:
        """The round's answers in place; whether every call is answered (else the
        refused go again, by a newer map)."""
        self._todo = settle(self._by_node, answers, self._results)
        return not self._todo

    def _end(self) -> list[Any]:
        """The results, in the order queued; the first error raised if asked."""
        self.results = results = self._results
        error = next((r for r in results if isinstance(r, BaseException)), None)
        if error is not None and self.raise_on_error:
            raise error
        return results


class ClusterPipeline(_Queued["ClusterClient"]):
    """Queues commands; ``execute()`` sends each node its part in one batch and
    returns the results in the order queued. ``raise_on_error`` as in
    :class:`~tenantkv.client.sync_client.Pipeline`: the first failed command's
    error is raised after every answer is in (else ``results`` holds it)."""

    def execute(self, timeout: float | None = None) -> list[Any]:
        cc = self._client
        self._begin()
        for redirects in range(cc.max_redirects + 1):
            if redirects:
                cc.refresh_map()  # the refused calls did not run: resend by the new map
            by_node = self._plan(cc.map, cc.seed)
            if self._settle({a: self._send(a, batch, timeout) for a, batch in by_node.items()}):
                break
        return self._end()

    def _send(
        self, address: Address | None, batch: list[tuple[int, Part]], timeout: float | None
    ) -> list[Any]:
        """One node's batch, through its client's pipeline: its answers, or the
        error that lost the connection in every place."""
        if address is None:
            return no_node(batch)
        try:
            node: Client = self._client.node_client(address)
            pipe = node.pipeline(raise_on_error=False)
            for _, (_, call, _) in batch:
                pipe._execute(call)
            return pipe.execute(timeout)
        except errors.TenantKVError as exc:
            return lost(address, exc, len(batch))

    def __enter__(self) -> ClusterPipeline:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None and self._calls:
            self.execute()


class AsyncClusterPipeline(_Queued["AsyncClusterClient"]):
    """:class:`ClusterPipeline` on Trio: queue commands (no ``await``), then
    ``await p.execute()`` (``op_timeout``: each call's timeout), or ``async
    with`` (executes on exit). The nodes' batches go out at once, each on its
    node's connection."""

    async def execute(self, op_timeout: float | None = None) -> list[Any]:
        cc = self._client
        self._begin()
        for redirects in range(cc.max_redirects + 1):
            if redirects:
                await cc.refresh_map()
            assert cc.map is not None, "use AsyncClusterClient in async with"
            by_node = self._plan(cc.map, cc.seed)
            answers: dict[Address | None, list[Any]] = {}
            async with trio.open_nursery() as nursery:
                for address, batch in by_node.items():
                    nursery.start_soon(self._send, address, batch, op_timeout, answers)
            if self._settle(answers):
                break
        return self._end()

    async def _send(
        self,
        address: Address | None,
        batch: list[tuple[int, Part]],
        op_timeout: float | None,
        answers: dict[Address | None, list[Any]],
    ) -> None:
        if address is None:
            answers[address] = no_node(batch)
            return
        try:
            node = await self._client.node_client(address)
            calls = [part[1] for _, part in batch]
            answers[address] = await send_batch(node, calls, op_timeout)
        except errors.TenantKVError as exc:
            answers[address] = lost(address, exc, len(batch))

    async def __aenter__(self) -> AsyncClusterPipeline:
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None and self._calls:
            await self.execute()


async def send_batch(
    client: AsyncClient, calls: list[Call[Any]], op_timeout: float | None
) -> list[Any]:
    """``calls`` to ``client``'s home server in one write, one attempt each (as
    the blocking :class:`~tenantkv.client.sync_client.Pipeline`): their answers
    in order, a server's error in its call's place; the calls whose answers a
    lost connection or the timeout took get that error."""
    conn = await client._connection(client._servers.home)
    clock = client._clock
    now = clock()
    ops = [client._begin(call, op_timeout, now, retry=False) for call in calls]
    waits: list[tuple[int, _Slot]] = []
    chunks: list[bytes] = []
    for call, op in zip(calls, ops, strict=True):
        msgid, data = conn.core.request(call.method, op.params(now))
        waits.append((msgid, _Slot()))
        chunks.append(data)
    conn.waiting.update(waits)
    answers: list[Any] = []
    try:
        if conn.failure is not None or conn.stream is None:
            raise errors.RequestNotSent("the connection is gone")
        for op in ops:
            op.started(op.first_attempt(), now)
        async with conn.send_lock:
            await conn.stream.send_all(b"".join(chunks))
        for (_, slot), call, op in zip(waits, calls, ops, strict=True):
            answers.append(await _answer(conn, slot, call, op.deadline))
            if isinstance(answers[-1], BaseException):
                op.failed(answers[-1], clock())
            else:
                op.succeeded(clock())
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        lost: errors.TenantKVError = errors.RequestNotSent(f"send failed: {exc!r}")
        answers += [lost] * (len(calls) - len(answers))
    except errors.RequestNotSent as exc:
        exc.__traceback__ = None
        answers += [exc] * (len(calls) - len(answers))
    finally:
        for msgid, _ in waits:
            conn.waiting.pop(msgid, None)
    return answers


async def _answer(conn: Any, slot: _Slot, call: Call[Any], deadline: float | None) -> Any:
    """One call's answer in a batch: its result, or the error (kept, not raised)."""
    with trio.move_on_at(math.inf if deadline is None else deadline):
        await slot.event.wait()
    if slot.response is None:
        if conn.failure is not None:  # the connection broke: every later call's too
            return conn.failure
        return errors.ClientTimeout(f"no response to {call.method} within the timeout")
    try:
        return conn.core.outcome(slot.response, call)
    except errors.ServerError as exc:
        exc.__traceback__ = None  # kept as a result: freed without a collection
        return exc
