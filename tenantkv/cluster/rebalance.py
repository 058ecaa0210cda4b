"""Rebalance: moving slots between nodes without losing a write.

What triggers it (nothing is automatic but assigning unowned slots):
``tenantkv-admin rebalance`` (even the slots out over the nodes that are up: a
node that joined gets its share) and ``tenantkv-admin node-remove NAME``
(move all its slots away, then take it out of the map). Either admin command
may go to any node; it is handed to the coordinator (internal command
``rebalance_request``), which records the goal in the map and works on it.

The coordinator's :class:`Mover` moves one batch of contiguous slots at a
time (:data:`~tenantkv.cluster.rebalance_plan.BATCH_SLOTS`), each step driven
over peer sessions (tenantkv.cluster.rebalance_commands):

1. the map gains the batch as a move in phase ``copy`` (one transaction on
   the map's revision, as every map change);
2. the target drops any old copy of the slots; the source starts noting the
   keys written or deleted in them (their dirty sets);
3. the target pulls the slots' records from the source in pages and writes
   them as they are; then takes the dirty keys and writes their state now,
   until few are left (writes go on at the source meanwhile);
4. the source fences the slots (writes refused with ``SlotMoving`` /
   ``-TRYAGAIN``; the writes before are committed), the target takes the
   last dirty keys;
5. the map moves the batch to phase ``switch`` (the source answers ``-ASK``,
   the target takes ``ASKING`` commands), then gives the slots to the target
   (everyone answers ``-MOVED``): two transactions;
6. the source drops its copy once it sees the new owner in the map
   (:class:`SlotJanitor`).

A slot is unavailable for writes from step 4 to the map of step 5.

Interrupted (a node or the coordinator killed, etcd unreachable), the move
resumes from the map: a move in phase ``switch`` holds every write at the
target, so it is finished (the slots are given to the target); a move in
phase ``copy`` starts its copy over (the source kept serving: nothing was
written elsewhere). A node that starts drops what it holds of slots the map
gives to another node, unless they are switching to it (a partial copy).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import trio

from tenantkv import errors
from tenantkv.cluster import rebalance_commands
from tenantkv.cluster.cluster_map import ClusterMap, Rebalance, SlotMove, SlotRange
from tenantkv.cluster.etcd import EtcdError
from tenantkv.cluster.membership import LostOffice, Member
from tenantkv.cluster.peer import PeerSession, internal_command, peer_session
from tenantkv.cluster.rebalance_plan import BATCH_SLOTS, done, next_batch, slots_to_move
from tenantkv.cluster.slots import SLOTS
from tenantkv.server.commands import Session
from tenantkv.storage.slot_ops import MoveControlOp

log = logging.getLogger("tenantkv.cluster")

#: Catch-up rounds before fencing a batch: fence once the dirty keys left are
#: fewer than :data:`FENCE_BELOW` (or after this many rounds: a slot written
#: faster than it is copied still gets a short fence, as the final catch-up
#: is bounded by what was written in one round).
CATCH_UP_ROUNDS = 20
FENCE_BELOW = 200
#: Pause before a failed batch is tried again.
RETRY_SECS = 0.5


def reassign(m: ClusterMap, mv: SlotMove) -> tuple[SlotRange, ...]:
    """``m``'s ranges with ``mv``'s slots given to its target (ranges merged)."""
    owners: list[str | None] = [None] * SLOTS
    for r in m.ranges:
        owners[r.start : r.end + 1] = [r.node] * len(r)
    owners[mv.start : mv.end + 1] = [mv.target] * len(mv)
    ranges: list[SlotRange] = []
    for slot, node in enumerate(owners):
        if node is None:
            continue
        last = ranges[-1] if ranges else None
        if last is not None and last.node == node and last.end == slot - 1:
            ranges[-1] = SlotRange(last.start, slot, node)
        else:
            ranges.append(SlotRange(slot, slot, node))
    return tuple(ranges)


def begin_move(m: ClusterMap, mv: SlotMove) -> ClusterMap | None:
    """The map with ``mv`` as the move in progress (None: a move is already on)."""
    if m.moves or m.rebalance is None:
        return None
    total = m.rebalance.moved + slots_to_move(m, m.rebalance.drain)
    return replace(m, moves=(mv,), rebalance=replace(m.rebalance, total=total))


def switch_move(m: ClusterMap, mv: SlotMove) -> ClusterMap | None:
    if m.moves != (mv,):
        raise StaleMove(f"the map no longer moves slots {mv.start}-{mv.end}")
    return replace(m, moves=(replace(mv, phase="switch"),))


def commit_move(m: ClusterMap, mv: SlotMove) -> ClusterMap | None:
    if len(m.moves) != 1 or m.moves[0].start != mv.start or m.moves[0].end != mv.end:
        raise StaleMove(f"the map no longer moves slots {mv.start}-{mv.end}")
    r = m.rebalance or Rebalance()
    return replace(
        m,
        ranges=reassign(m, mv),
        moves=(),
        rebalance=replace(r, moved=r.moved + len(mv), total=max(r.total, r.moved + len(mv))),
    )


def finish(m: ClusterMap) -> ClusterMap | None:
    """The rebalance done: drained nodes leave the map (kept out while registered)."""
    r = m.rebalance
    if r is None or m.moves:
        return None
    nodes = {n: info for n, info in m.nodes.items() if n not in r.drain}
    removed = tuple(sorted(set(m.removed) | set(r.drain)))
    return replace(m, nodes=nodes, rebalance=None, removed=removed)


def request(m: ClusterMap, drain: tuple[str, ...], batch: int = 0) -> ClusterMap | None:
    """The map with a rebalance goal (``drain``: nodes to empty and remove;
    ``batch``: slots per batch, 0 for the default)."""
    for name in drain:
        info = m.nodes.get(name)
        if info is None:
            raise errors.BadValue(f"no node {name!r} in the cluster map")
        if not info.up and m.slots_of(name):
            raise errors.BadValue(
                f"node {name!r} is down: its slots' data is on it alone; start it first"
            )
    old = m.rebalance or Rebalance()
    goal = tuple(sorted(set(old.drain) | set(drain)))
    if not [n for n, i in m.nodes.items() if i.up and n not in goal]:
        raise errors.BadValue("no node would be left to hold the slots")
    total = old.moved + slots_to_move(m, goal)
    if m.rebalance is None and total == 0 and not goal:
        return None  # balanced already
    return replace(m, rebalance=Rebalance(goal, old.moved, total, batch or old.batch))


class StaleMove(Exception):
    """The map moved on from the move being worked on (another coordinator)."""


class Mover:
    """The coordinator's side: works on the map's rebalance goal while this node
    coordinates (:meth:`run`, cancelled when it stops)."""

    def __init__(self, member: Member, secret: bytes) -> None:
        self.member = member
        self.secret = secret
        #: per batch: seconds from its fence to its new owner in the map
        self.fence_secs: list[float] = []
        self.batches = 0
        self.restarts = 0
        self._began = 0.0

    def status(self) -> dict[str, Any]:
        f = sorted(self.fence_secs)
        return {
            "batches": self.batches,
            "restarts": self.restarts,
            "fence_ms_max": round(f[-1] * 1000, 1) if f else None,
            "fence_ms_p99": round(f[math.ceil(0.99 * len(f)) - 1] * 1000, 1) if f else None,
        }

    async def run(self) -> None:
        while True:
            try:
                await self._step()
            except LostOffice:
                raise
            except (EtcdError, errors.TenantKVError, StaleMove, OSError) as exc:
                self.restarts += 1
                log.warning("rebalance: %s (trying again)", exc)
                await trio.sleep(RETRY_SECS)
            except Exception:  # (a bug must not take the node's membership down)
                self.restarts += 1
                log.exception("rebalance: unexpected failure (trying again)")
                await trio.sleep(RETRY_SECS)

    async def _step(self) -> None:
        seen = self.member.map
        if not seen.moves and seen.rebalance is None:
            await self.member.map_event.wait()  # (idle: nothing read from etcd)
            return
        m, _ = await self.member.read_map()
        if m.moves:
            mv = m.moves[0]
            if mv.phase == "switch":
                await self._commit(mv)  # every write is at the target: finish it
            else:
                await self._move(mv)  # (again from the start: the source kept serving)
            return
        r = m.rebalance
        if r is None:
            return
        batch = next_batch(m, r.drain, r.batch or BATCH_SLOTS)
        if batch is None:
            if done(m, r.drain):
                await self.member.update_map(finish)
                log.info("rebalance: done, %d slots moved", r.moved)
            else:  # (the moves left wait for a node that is down)
                with trio.move_on_after(RETRY_SECS * 4):
                    await self.member.map_event.wait()
            return
        if await self.member.update_map(lambda c: begin_move(c, batch)) is not None:
            await self._move(batch)

    async def _move(self, mv: SlotMove) -> None:
        m = self.member.map
        source, target = m.nodes.get(mv.source), m.nodes.get(mv.target)
        if source is None or target is None or not (source.up and target.up):
            await self.member.update_map(lambda c: _undo(c, mv))  # (planned again)
            return
        slots = list(mv.slots())
        async with (
            peer_session(source, self.secret) as src,
            peer_session(target, self.secret) as dst,
        ):
            switched = [False]
            try:
                await self._copy(src, dst, mv, slots, switched)
            except BaseException:
                if not switched[0]:  # (once switching, the source must stay fenced)
                    with trio.move_on_after(2, shield=True):
                        await src.call("move_end", {"slots": slots})  # (serving as before)
                raise
        self.batches += 1

    async def _copy(
        self,
        src: PeerSession,
        dst: PeerSession,
        mv: SlotMove,
        slots: list[int],
        switched: list[bool],
    ) -> None:
        args = {"source": mv.source, "slots": slots}
        self._began = trio.current_time()
        await dst.call("move_reset", {"slots": slots})
        await src.call("move_track", {"slots": slots})
        cursor = None
        while True:
            step = await dst.call("move_copy", {**args, "cursor": cursor})
            cursor = step["cursor"]
            if cursor is None:
                break
        for _ in range(CATCH_UP_ROUNDS):
            done = await dst.call("move_catch_up", args)
            _check(done, mv)
            if done["left"] < FENCE_BELOW:
                break
        copied = trio.current_time()
        await src.call("move_fence", {"slots": slots})
        fenced = trio.current_time()
        while True:  # (relayed here: the sessions are open)
            taken = await src.call("move_take", {"slots": slots})
            _check(taken, mv)
            await dst.call("move_import", {"records": taken["records"]})
            if taken["left"] == 0:
                break
        caught_up = trio.current_time()
        switched[0] = True  # (the write may succeed with its answer lost)
        await self.member.update_map(lambda c: switch_move(c, mv))
        switching = trio.current_time()
        await self._commit(mv)
        done_at = trio.current_time()
        self.fence_secs.append(done_at - copied)
        log.info(
            "rebalance: batch %d-%d copied in %.0f ms; writes paused %.0f ms (fence %.0f, "
            "last catch-up %.0f, switch %.0f, new owner %.0f)",
            mv.start,
            mv.end,
            (copied - self._began) * 1000,
            (done_at - copied) * 1000,
            (fenced - copied) * 1000,
            (caught_up - fenced) * 1000,
            (switching - caught_up) * 1000,
            (done_at - switching) * 1000,
        )
        await src.call("move_end", {"slots": slots})

    async def _commit(self, mv: SlotMove) -> None:
        await self.member.update_map(lambda c: commit_move(c, mv))
        log.info(
            "rebalance: slots %d-%d moved from %s to %s", mv.start, mv.end, mv.source, mv.target
        )


def _check(done: dict[str, Any], mv: SlotMove) -> None:
    if done["lost"]:
        raise StaleMove(
            f"the source lost track of slots {done['lost'][:5]} (restarted, or written "
            f"faster than copied): copying slots {mv.start}-{mv.end} again"
        )


def _undo(m: ClusterMap, mv: SlotMove) -> ClusterMap | None:
    """The move given up (its source or target went): planned again later."""
    if not m.moves or m.moves[0].start != mv.start or m.moves[0].phase != "copy":
        return None
    return replace(m, moves=())


class SlotJanitor:
    """Drops this node's copy of slots that the map gives to another node: at start
    (a partial copy of a move that did not finish, or an old copy whose drop was
    interrupted) and when a slot of this node's moves away."""

    def __init__(self, node: Any, member: Member) -> None:
        self.node = node
        self.member = member
        self.dropped = 0
        self._send, self._receive = trio.open_memory_channel[tuple[str, list[int]]](math.inf)
        self._last = member.map

    def map_changed(self, new: ClusterMap) -> None:
        """(Member.on_map) Slots of this node's that the new map gives away; slots
        it gains lose any move state left from when they last left it."""
        old, self._last = self._last, new
        me = self.member.me.name
        gained = [
            s
            for r in new.ranges
            if r.node == me
            for s in range(r.start, r.end + 1)
            if old.owner(s) != me
        ]
        if gained and old.version:
            self._send.send_nowait(("gained", gained))
        gone = [
            s
            for r in old.ranges
            if r.node == me
            for s in range(r.start, r.end + 1)
            if new.owner(s) not in (me, None)
        ]
        if gone:
            self._send.send_nowait(("gone", gone))

    async def foreign(self, m: ClusterMap) -> list[int]:
        """Slots that hold keys here while the map gives them to another node and
        they are not switching to this one."""
        me, index = self.member.me.name, self.node.engine.slots
        switching = {
            s for mv in m.moves if mv.target == me and mv.phase == "switch" for s in mv.slots()
        }
        out = []
        for r in m.ranges:
            if r.node == me:
                continue
            for slot in range(r.start, r.end + 1):
                if slot not in switching and index.keys(slot, limit=1):
                    out.append(slot)
                if slot % 256 == 0:
                    await trio.lowlevel.checkpoint()
        return out

    async def drop_foreign(self) -> None:
        """At start, before the node serves: drop partial and leftover copies."""
        self._last = self.member.map
        slots = await self.foreign(self._last)
        if slots:
            n = await rebalance_commands.drop_slots(self.node, slots)
            self.dropped += n
            log.info("dropped %d keys of %d slots the map gives to other nodes", n, len(slots))

    async def run(self) -> None:
        async for what, slots in self._receive:
            if what == "gained":
                router = self.node.cluster
                if router is not None:
                    router.fenced.difference_update(slots)
                step = rebalance_commands.MAX_MOVE_SLOTS
                for at in range(0, len(slots), step):
                    await self.node.write(MoveControlOp("end", slots[at : at + step]))
                continue
            me, m = self.member.me.name, self.member.map
            # (not one moving here again meanwhile: its copy is being written)
            slots = [s for s in slots if m.owner(s) != me and m.move_of(s) is None]
            n = await rebalance_commands.drop_slots(self.node, slots)
            self.dropped += n
            if n:
                log.info("dropped %d keys of %d slots that moved to other nodes", n, len(slots))


# -- the admin commands -----------------------------------------------------------------


def _role(s: Session) -> Any:
    role = s.node.role
    if getattr(role, "mover", None) is None:
        raise errors.BadValue("this node is in no cluster")
    return role


async def _to_coordinator(s: Session, drain: list[str], batch: int) -> Any:
    """Hand a rebalance request to the coordinator (this node, or over a peer
    session) and answer its progress."""
    role = _role(s)
    member: Member = role.member
    if member.coordinator:
        return await _request_here(member, drain, batch)
    try:
        kv = await member.etcd.get(member.settings.key("coordinator"))
    except EtcdError as exc:
        raise errors.NodeUnavailable(f"etcd is unreachable: {exc}") from None
    info = member.map.nodes.get(kv.value.decode()) if kv is not None else None
    if info is None:
        raise errors.NodeUnavailable("the cluster has no coordinator now; try again")
    async with peer_session(info, role.secret) as peer:
        return await peer.call("rebalance_request", {"drain": drain, "batch": batch})


async def _request_here(member: Member, drain: list[str], batch: int) -> Any:
    try:
        new = await member.update_map(lambda m: request(m, tuple(drain), batch))
    except (EtcdError, LostOffice) as exc:
        raise errors.NodeUnavailable(f"the map could not be written: {exc}") from None
    m = new if new is not None else member.map
    return m.progress() or {"moved": 0, "total": 0, "drain": [], "moving": []}


def _batch(p: dict[str, Any]) -> int:
    batch = p.get("batch_slots", p.get("batch", 0))
    if type(batch) is not int or not 0 <= batch <= rebalance_commands.MAX_MOVE_SLOTS:
        raise errors.BadValue(
            f"'batch_slots' must be 1 to {rebalance_commands.MAX_MOVE_SLOTS} (0: the default)"
        )
    return batch


@internal_command("rebalance_request", "drain", "batch")
async def rebalance_request(s: Session, p: dict[str, Any]) -> Any:
    drain = p.get("drain")
    if not isinstance(drain, list) or not all(isinstance(n, str) for n in drain):
        raise errors.BadValue("'drain' must be a list of node names")
    member: Member = _role(s).member
    if not member.coordinator:
        raise errors.NodeUnavailable("this node is no longer the coordinator; try again")
    return await _request_here(member, drain, _batch(p))


async def move_slots(s: Session, drain: list[str], p: dict[str, Any]) -> Any:
    """{moved, total, drain, moving}: the admin commands ``cluster_rebalance`` (no
    ``drain``: even the slots out over the nodes that are up) and
    ``cluster_node_remove`` (move every slot off the drained node, then take it out
    of the map); answers once the coordinator took it on (docs/cluster.md,
    "Rebalance"). ``batch_slots``: slots moved together (default 256)."""
    return await _to_coordinator(s, drain, _batch(p))
