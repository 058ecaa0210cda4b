"""A node's life in the cluster: its lease, its registration, the map it follows,
and its campaign to coordinate.

etcd keys, under the cluster's prefix (``cluster_prefix``):

- ``nodes/<name>``: the node's :class:`NodeInfo`, under the node's lease, so it
  goes when the node stops renewing (stopped, killed, cut off);
- ``coordinator``: the elected coordinator's name, under its lease;
- ``map``: the :class:`ClusterMap`, written by the coordinator only.

Fencing: the node acknowledges writes to a slot only while the map it holds
gives it the slot and its lease surely lives (:meth:`Member.owns`): the lease's deadline is
counted from when each renewal was *sent*, so it ends on this node no later
than in etcd, where the node's key and its claims go with it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import trio

from tenantkv.cluster.cluster_map import ClusterMap, NodeInfo, next_map
from tenantkv.cluster.etcd import (
    Compare,
    Etcd,
    EtcdError,
    campaign,
    keep_lease_alive,
    put_op,
)

log = logging.getLogger("tenantkv.cluster")

#: Pause before a loop retries after etcd failed it (etcd down: nodes keep
#: serving on the map they hold and try again).
RETRY_SECS = 0.5


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    endpoints: tuple[str, ...]
    node_name: str
    prefix: str = "/tenantkv"
    lease_ttl_secs: int = 10
    min_nodes: int = 1

    def key(self, *parts: str) -> bytes:
        return "/".join((self.prefix, *parts)).encode()


class Member:
    """This node in the cluster. :meth:`run` joins and keeps it joined; the map it
    follows is :attr:`map`, current within a watch's delay of each change."""

    def __init__(self, etcd: Etcd, settings: ClusterSettings, me: NodeInfo) -> None:
        self.etcd = etcd
        self.settings = settings
        self.me = me
        self.map = ClusterMap()
        #: Trio time until which this node's lease surely lives (-inf: no lease)
        self.lease_deadline = -math.inf
        self.lease = 0
        self.coordinator = False
        self.map_changes = 0
        self.etcd_errors = 0
        #: called with each newer map (the role wires what must follow it)
        self.on_map: Callable[[ClusterMap], None] = lambda m: None
        #: run while this node coordinates, cancelled when it stops (the role
        #: wires the rebalance's mover here)
        self.while_coordinating: Callable[[], Awaitable[None]] | None = None
        #: the coordinator's office (key, revision won) while this node holds it
        self._office: tuple[bytes, int] | None = None
        #: the map update_map wrote last and its revision (None: unknown)
        self._written: tuple[ClusterMap, int] | None = None
        #: set (and replaced) at each newer map
        self.map_event = trio.Event()
        self._map_seen = trio.Event()
        #: the node is stopping: a lease that ends is not renewed by a new join
        self._leaving = False

    # -- what the node asks --------------------------------------------------------

    def lease_valid(self) -> bool:
        return trio.current_time() < self.lease_deadline

    def owns(self, slot: int) -> bool:
        """Write ``slot`` here? Only with the map's word and a live lease (fencing)."""
        return self.map.owner(slot) == self.me.name and self.lease_valid()

    def status(self) -> dict[str, Any]:
        return {
            "node": self.me.name,
            "advertise": f"{self.me.host}:{self.me.port}",
            "etcd": list(self.etcd.endpoints),
            "prefix": self.settings.prefix,
            "lease": {
                "id": f"{self.lease:x}",
                "ttl_secs": self.settings.lease_ttl_secs,
                "valid": self.lease_valid(),
            },
            "coordinator": self.coordinator,
            "map_changes": self.map_changes,
            "etcd_errors": self.etcd_errors,
            "map": self.map.summary(),
        }

    async def wait_for_map(self) -> None:
        await self._map_seen.wait()

    # -- running ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Join (started once registered), follow the map, campaign; when the lease
        is lost, join again with a new one."""
        started = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_map)
            while True:
                await self._retrying(self._join)
                if not started:
                    task_status.started()
                    started = True
                async with trio.open_nursery() as leased:
                    leased.start_soon(self._coordinate)
                    await keep_lease_alive(
                        self.etcd, self.lease, self.settings.lease_ttl_secs, self._renewed
                    )
                    leased.cancel_scope.cancel()  # the lease is gone: so is the office
                self.coordinator = False
                self.lease_deadline = -math.inf
                if self._leaving:
                    await trio.sleep_forever()  # (until the node's tasks are cancelled)
                log.error(
                    "node %s lost its etcd lease: writes to its slots are fenced; rejoining",
                    self.me.name,
                )

    async def leave(self) -> None:
        """Stop gracefully: revoking the lease removes the node's key at once."""
        self._leaving = True
        if self.lease:
            with trio.move_on_after(2):
                await self.etcd.lease_revoke(self.lease)
        self.lease_deadline = -math.inf

    def _renewed(self, deadline: float) -> None:
        self.lease_deadline = deadline

    async def _retrying(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` until etcd lets it finish."""
        while True:
            try:
                return await step()
            except EtcdError as exc:
                self.etcd_errors += 1
                log.warning("etcd: %s (retrying)", exc)
                await trio.sleep(RETRY_SECS)

    async def _join(self) -> None:
        """Register under a new lease. A key of the same name under another lease
        is an earlier run of this node (or a namesake): wait for it to expire
        rather than serve beside it."""
        key = self.settings.key("nodes", self.me.name)
        ttl = self.settings.lease_ttl_secs
        sent = trio.current_time()
        self.lease = await self.etcd.lease_grant(ttl)
        value = json.dumps(self.me.to_json()).encode()
        waited = False
        while not (
            await self.etcd.txn([Compare.absent(key)], [put_op(key, value, self.lease)])
        ).succeeded:
            if not waited:
                log.warning(
                    "node name %s is registered by another lease: waiting for it to expire",
                    self.me.name,
                )
                waited = True
            await trio.sleep(min(RETRY_SECS, ttl / 4))
        self.lease_deadline = sent + ttl
        log.info("joined the cluster at %s as %s", ",".join(self.etcd.endpoints), self.me.name)

    async def _follow_map(self) -> None:
        """Keep :attr:`map` current: read it, then watch it from that revision."""
        key = self.settings.key("map")
        while True:
            try:
                kvs, revision = await self.etcd.range(key)
                if kvs:
                    self._take(ClusterMap.decode(kvs[0].value))
                self._map_seen.set()
                async with self.etcd.watch(key, start_revision=revision + 1) as watch:
                    async for events in watch:
                        for event in events:
                            if event.type == "PUT":
                                self._take(ClusterMap.decode(event.kv.value))
            except EtcdError as exc:
                self.etcd_errors += 1
                log.warning(
                    "cluster map watch: %s (retrying; serving on map version %d)",
                    exc,
                    self.map.version,
                )
                await trio.sleep(RETRY_SECS)

    def _take(self, new: ClusterMap) -> None:
        if new.version <= self.map.version:
            return
        self.map = new
        self.map_changes += 1
        self.map_event.set()
        self.map_event = trio.Event()
        log.info(
            "cluster map version %d: %s",
            new.version,
            {n: new.slots_of(n) for n in sorted(new.nodes)},
        )
        self.on_map(new)

    # -- the coordinator ---------------------------------------------------------------

    async def _coordinate(self) -> None:
        """Campaign; once elected, write the map the membership calls for at each
        change of it, until the lease (and the office with it) goes."""
        office = self.settings.key("coordinator")
        while True:
            won = await self._retrying(
                lambda: campaign(self.etcd, office, self.me.name.encode(), self.lease)
            )
            self.coordinator = True
            self._office = (office, won)
            log.info("node %s is the coordinator", self.me.name)
            try:
                async with trio.open_nursery() as nursery:
                    if self.while_coordinating is not None:
                        nursery.start_soon(self.while_coordinating)
                    await self._serve_office(office, won)
            except* LostOffice as group:
                self.coordinator = False
                log.error("node %s: %s; campaigning again", self.me.name, group.exceptions[0])
            finally:
                self._office = None

    async def _serve_office(self, office: bytes, won: int) -> None:
        nodes = self.settings.key("nodes") + b"/"
        while True:
            try:
                revision = await self._reconcile(office, won)
                async with self.etcd.watch(nodes, prefix=True, start_revision=revision + 1) as w:
                    async for _ in w:
                        await self._reconcile(office, won)
            except LostOffice:
                raise
            except EtcdError as exc:
                self.etcd_errors += 1
                log.warning("coordinator: %s (retrying)", exc)
                await trio.sleep(RETRY_SECS)

    async def _reconcile(self, office: bytes, won: int) -> int:
        """Write the next map if the members call for one: one transaction that
        holds only while the map is the one read and this node still holds the
        office. Returns the revision the members were read at."""
        map_key = self.settings.key("map")
        while True:
            members, revision = await self.etcd.range(
                self.settings.key("nodes") + b"/", prefix=True
            )
            live = {}
            for kv in members:
                name = kv.key.rsplit(b"/", 1)[1].decode()
                live[name] = NodeInfo.from_json(name, json.loads(kv.value))
            stored = await self.etcd.get(map_key)
            current = ClusterMap.decode(stored.value) if stored else ClusterMap()
            new = next_map(current, live, self.settings.min_nodes)
            if new is None:
                return revision
            result = await self.etcd.txn(
                [
                    Compare.mod_revision(map_key, stored.mod_revision if stored else 0),
                    Compare.mod_revision(office, won),
                ],
                [put_op(map_key, new.encode())],
            )
            if result.succeeded:
                log.info("coordinator: wrote cluster map version %d", new.version)
                return revision
            holder = await self.etcd.get(office)
            if holder is None or holder.mod_revision != won:
                raise LostOffice("it no longer holds the coordinator's office")

    async def read_map(self) -> tuple[ClusterMap, int]:
        """The map as etcd holds it now, and its key's mod revision (0: none)."""
        stored = await self.etcd.get(self.settings.key("map"))
        if stored is None:
            return ClusterMap(), 0
        return ClusterMap.decode(stored.value), stored.mod_revision

    async def update_map(
        self, change: Callable[[ClusterMap], ClusterMap | None]
    ) -> ClusterMap | None:
        """Coordinator only: write ``change(map)`` with the version one higher, one
        transaction on the map's revision and this node's office (read again and
        retried when the map moved meanwhile). Returns the map written, or None
        when ``change`` wanted none. Raises LostOffice when the office is gone."""
        map_key = self.settings.key("map")
        # The map this node wrote last, if it is still etcd's (the transaction
        # checks): one round trip less per write in a move's switch.
        known = self._written
        while True:
            office = self._office
            if office is None:
                raise LostOffice("this node is not the coordinator")
            current, revision = known if known is not None else await self.read_map()
            known = None
            new = change(current)
            if new is None:
                return None
            new = replace(new, version=current.version + 1)
            result = await self.etcd.txn(
                [Compare.mod_revision(map_key, revision), Compare.mod_revision(*office)],
                [put_op(map_key, new.encode())],
            )
            if result.succeeded:
                self._written = (new, result.revision)
                log.info("coordinator: wrote cluster map version %d", new.version)
                return new
            self._written = None
            holder = await self.etcd.get(office[0])
            if holder is None or holder.mod_revision != office[1]:
                raise LostOffice("it no longer holds the coordinator's office")


class LostOffice(EtcdError):
    """The coordinator's key is no longer this node's: another may coordinate."""
