"""Which requests this node serves: the ownership check on the request path.

In cluster mode every data request's keys are checked against the map before
the request reaches any gate, on both doors: a key of another node's slot is
refused with ``NotMyPartition`` (RESP: ``-MOVED slot host:port``), a slot no
node can serve now with ``NodeUnavailable`` (``-CLUSTERDOWN``; so is a write
of this node's own slot while its lease has lapsed: fencing), and on the
RESP door keys of several slots with ``CrossSlot`` (``-CROSSSLOT``, Redis
Cluster's rule; the bundled client splits a multi-key request by node
itself, so on the MessagePack door it is enough that this node serves them
all). A refusal is cheap and early — nothing ran, so the retryable ones carry
``RetryableError`` — and costs the read floor per key named, as any refused
request does.

While a slot moves (tenantkv.cluster.rebalance) its source takes no write of
it once fenced, and in the move's ``switch`` phase no request of it, while the
target takes a RESP request of it that follows ``ASKING`` (a flag for the
connection's next command, as in Redis Cluster). Such a request is **held**
(:class:`~tenantkv.server.held.Held`, :meth:`Router.hold`): the connection waits, up to
``HOLD_SECS``, until the move settles, and the request is then answered as
the map says — ``NotMyPartition`` (``-MOVED``) once the target owns the slot,
served here if the move was given up — and only a move that outlasts the hold
answers ``SlotMoving`` (``-TRYAGAIN``, retryable). A client therefore follows
one redirection instead of spending its retries on a pause: redis-py gives up
on ``-TRYAGAIN`` after about 0.6 s, and a switch's pause on a loaded machine
can be longer. A request inside ``MULTI`` is refused at once (EXEC answers
EXECABORT), as any refused request there.

The check filters the chunk's decoded requests (:meth:`Router.route`), so it
sees every request whatever path the executor then takes it down (runs of
reads and writes take theirs straight from the chunk). Its cost on the path:
a CRC16 and a range lookup per key, and a generator step per request; a
single node has no router and pays nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import partial
from typing import Any, Final

import trio

from tenantkv import errors
from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo, SlotMove
from tenantkv.cluster.membership import Member
from tenantkv.cluster.slots import SLOTS, key_slot
from tenantkv.server.held import Held

#: Command kinds whose requests name keys.
DATA_KINDS = frozenset({"read", "write"})
#: How long a request of a moving slot waits for the move to settle (Router.hold):
#: a switch pauses a slot for about 0.3 s on a quiet machine.
HOLD_SECS: Final = 2.0
#: A move given up lifts its fence without a new map: looked at this often.
HOLD_POLL_SECS: Final = 0.05


def node_id(name: str) -> str:
    """A node's id as Redis Cluster shows ids (40 hex digits), stable for its name."""
    return hashlib.sha1(name.encode()).hexdigest()


def request_keys(params: Any) -> list[bytes] | None:
    """The keys a data request names (``key``, ``keys``, ``pairs``, ``dest``), or
    None when it names none or names them wrongly (the command's own check
    answers that precisely)."""
    if not isinstance(params, dict):
        return None
    keys: list[Any] = []
    if "key" in params:
        keys.append(params["key"])
    many = params.get("keys")
    if isinstance(many, list):
        keys += many
    pairs = params.get("pairs")
    if isinstance(pairs, list):
        keys += [p[0] for p in pairs if isinstance(p, (list, tuple)) and p]
    if "dest" in params:
        keys.append(params["dest"])
    out: list[bytes] = []
    for k in keys:
        if isinstance(k, str):
            k = k.encode()
        if not isinstance(k, bytes):
            return None
        out.append(k)
    return out or None


def address(info: NodeInfo, *, resp: bool) -> str:
    """Where a client of this door reaches the node."""
    return f"{info.host}:{info.resp_port if resp else info.port}"


class Router:
    """The node's ownership check (see the module docstring)."""

    def __init__(self, member: Member) -> None:
        self.member = member
        self.refused = 0
        #: requests held while their slot moved (hold)
        self.held = 0
        #: slots whose writes this node refuses now (a move's fence; the writer
        #: enforces it too, for writes routed before it)
        self.fenced: set[int] = set()
        #: each slot's owner in the map last seen (a list lookup per key, not a search)
        self._map: ClusterMap | None = None
        self._owners: list[str | None] = []
        #: slots in a move's switch phase, by slot, in the map last seen
        self._switching: dict[int, SlotMove] = {}

    def map_document(self) -> dict[str, Any]:
        """The map as the ``cluster_map`` command gives it to clients."""
        m = self.member.map
        return {
            "enabled": True,
            "version": m.version,
            "node": self.member.me.name,
            "ranges": [[r.start, r.end, r.node] for r in m.ranges],
            "nodes": {name: info.to_json() for name, info in sorted(m.nodes.items())},
        }

    def route(self, ex: Any, requests: Iterator[Any]) -> Iterator[Any]:
        """The requests of a chunk this node serves; the others answered here."""
        commands = ex.door.commands
        resp = ex.door.protocol_name == "resp"
        for req in requests:
            if ex.user is not None:
                cmd = commands.get(req[1])
                asking = False
                if resp and getattr(ex, "asking", False):
                    ex.asking = False  # (ASKING is good for the next command only)
                    asking = True
                if cmd is not None and cmd.kind in DATA_KINDS:
                    keys = request_keys(req[2])
                    if keys is not None:
                        write = cmd.kind == "write"
                        exc = self.refusal(keys, resp=resp, write=write, asking=asking)
                        if exc is not None:
                            if ex.in_multi:  # not queued: EXEC answers EXECABORT
                                ex.transaction_refused(req[1])
                            elif type(exc) is errors.SlotMoving:  # (answered once settled)
                                yield Held(req, partial(self.hold, req, keys, write))
                                continue
                            self._refuse(ex, req, exc, len(keys))
                            continue
                elif resp and req[1] == "asking":
                    ex.asking = True
            yield req

    async def hold(self, req: Any, keys: list[bytes], write: bool, ex: Any) -> Any:
        """Wait until the slot of ``req`` (naming ``keys``) is no longer moving, at
        most ``HOLD_SECS``, then answer it as the map says: the request to serve
        here (the move was given up), or None when it was answered."""
        self.held += 1
        resp = ex.door.protocol_name == "resp"
        exc = self.refusal(keys, resp=resp, write=write)
        with trio.move_on_after(HOLD_SECS):
            while type(exc) is errors.SlotMoving:
                with trio.move_on_after(HOLD_POLL_SECS):  # (a fence lifted: no new map)
                    await self.member.map_event.wait()
                exc = self.refusal(keys, resp=resp, write=write)
        if exc is None:
            return req
        self._refuse(ex, req, exc, len(keys))
        return None

    def refusal(
        self, keys: list[bytes], *, resp: bool, write: bool = True, asking: bool = False
    ) -> errors.ServerError | None:
        """Why this node does not serve ``keys`` now, or None when it does. Without a
        valid lease it still serves reads of its slots on the map it holds (etcd
        down: data keeps serving) but acknowledges no write (fencing)."""
        slots = {key_slot(k) for k in keys} if len(keys) > 1 else (key_slot(keys[0]),)
        if resp and len(slots) > 1:
            return errors.CrossSlot("keys in request don't hash to the same slot")
        member, m = self.member, self.member.map
        if m is not self._map:
            self._map, self._owners = m, _owners(m)
            self._switching = {s: mv for mv in m.moves if mv.phase == "switch" for s in mv.slots()}
        owners = self._owners
        me = member.me.name
        for slot in slots:
            owner = owners[slot]
            if owner == me:
                if self._switching or self.fenced:
                    exc = self._moving(m, slot, write=write, resp=resp)
                    if exc is not None:
                        return exc
                if write and not member.lease_valid():
                    return errors.NodeUnavailable(
                        f"node {owner} cannot prove it still owns slot {slot}: its cluster "
                        "lease lapsed"
                    )
                continue
            if asking and (mv := self._switching.get(slot)) is not None and mv.target == me:
                continue  # (its source sent this request here with -ASK)
            return self._elsewhere(m, slot, owner, resp=resp)
        return None

    def _moving(
        self, m: ClusterMap, slot: int, *, write: bool, resp: bool
    ) -> errors.ServerError | None:
        """A slot of this node's that is moving away: fenced, writes wait; switching,
        everything goes to the target."""
        mv = self._switching.get(slot)
        if mv is not None:
            # Held, then -MOVED (or -TRYAGAIN past the hold), not -ASK: redis-py
            # (8.x) fails with an AttributeError on an -ASK to a node its topology
            # lacks (one that got its first slots since it last read CLUSTER
            # SLOTS). The target still takes ASKING for a switching slot, for
            # clients that send it.
            return errors.SlotMoving(
                f"slot {slot} is switching to node {mv.target}; try again in a moment",
                retry_after_ms=50,
            )
        if write and slot in self.fenced:
            return errors.SlotMoving(
                f"slot {slot} is switching to another node; try again in a moment",
                retry_after_ms=50,
            )
        return None

    @staticmethod
    def _elsewhere(
        m: ClusterMap, slot: int, owner: str | None, *, resp: bool
    ) -> errors.ServerError:
        if owner is None:
            return errors.NodeUnavailable(
                f"slot {slot} is not served: the cluster has not assigned it"
            )
        info = m.nodes[owner]
        if not info.up:
            return errors.NodeUnavailable(f"slot {slot} is not served: its node {owner} is down")
        where = address(info, resp=resp)
        return errors.NotMyPartition(
            f"slot {slot} is served by node {owner} at {where} (map version {m.version})",
            slot=slot,
            owner=where,
            map_version=m.version,
        )

    def _refuse(self, ex: Any, req: Any, exc: errors.ServerError, keys: int) -> None:
        """Answer a refused request, charged the read floor per key it named."""
        self.refused += 1
        if exc.labels:
            ex.charge_floor(keys)  # (fail charges only refusals without labels)
            ex.fail(req[0], req[1], exc, charge=False)
        else:
            ex.fail(req[0], req[1], exc, keys=keys)


def _owners(m: ClusterMap) -> list[str | None]:
    """The owner of each slot, by slot number."""
    owners: list[str | None] = [None] * SLOTS
    for r in m.ranges:
        owners[r.start : r.end + 1] = [r.node] * len(r)
    return owners
