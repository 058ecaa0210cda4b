"""The internal commands a slot's move runs (tenantkv.cluster.rebalance drives
them from the coordinator; tenantkv.cluster.peer carries them).

On the **source** (the node the slots leave):

- ``move_track {slots}``: note from now on the keys written or deleted in
  those slots (and lift any fence of theirs); every write before it is
  committed when it answers;
- ``move_page {slots, cursor}``: a page of the slots' records (value, CAS,
  expiry, flags: the stored bytes) through the slot index, and the next cursor;
- ``move_take {slots}``: take keys from the dirty sets with their state now
  (a record, or None: deleted), and which slots lost track (the source
  restarted, or a dirty set overflowed: copy them again);
- ``move_fence {slots}`` / ``move_end {slots}``: refuse their writes (every
  write before is committed when it answers) / forget the move.

On the **target** (the node they go to), each pulling from the source:

- ``move_reset {slots}``: drop what this node holds of them (a partial copy);
- ``move_copy {source, slots, cursor}``: copy pages for up to
  :data:`STEP_SECS`, then answer the cursor to continue from (None: done);
- ``move_catch_up {source, slots}``: take the dirty keys and write their
  state, until none are left or :data:`STEP_SECS` passed;
- ``move_import {records}``: write records the coordinator took from the
  source (the last catch-up, while the slots are fenced).

Each answers within about :data:`STEP_SECS` (bounded pages), so that the
coordinator notices a lost node quickly and no connection waits long.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from tenantkv import errors
from tenantkv.cluster.peer import PeerSession, internal_command, peer_session
from tenantkv.cluster.slots import SLOTS
from tenantkv.server.commands import Session
from tenantkv.storage.slot_ops import (
    DROP_BATCH,
    DropSlotOp,
    Imported,
    ImportOp,
    MoveControlOp,
    incarnation,
)

if TYPE_CHECKING:
    from tenantkv.cluster.routing import Router

#: Records one page carries at most, and bytes (values beyond it end the page).
PAGE_KEYS = 2000
PAGE_BYTES = 4 * 1024 * 1024
#: How long a target's step (``move_copy``, ``move_catch_up``) runs at most.
STEP_SECS = 0.5
#: Slots one move names at most.
MAX_MOVE_SLOTS = 4096


def _slots(p: dict[str, Any]) -> list[int]:
    slots = p.get("slots")
    if (
        not isinstance(slots, list)
        or not 0 < len(slots) <= MAX_MOVE_SLOTS
        or not all(type(s) is int and 0 <= s < SLOTS for s in slots)
    ):
        raise errors.BadValue(f"'slots' must be a list of 1 to {MAX_MOVE_SLOTS} slot numbers")
    return slots


def _index(s: Session) -> Any:
    index = s.node.engine.slots
    if index is None or s.node.cluster is None:
        raise errors.BadValue("this node is in no cluster")
    return index


def _router(s: Session) -> Router:
    """This node's router, after :func:`_index`'s check that it is in a cluster."""
    _index(s)
    router = s.node.cluster
    assert router is not None
    return router


def _records(s: Session, pairs: list[tuple[str, bytes]]) -> list[Imported]:
    """Each (bucket, key) with its stored record now (None: gone)."""
    engine = s.node.engine
    out: list[Imported] = []
    with engine.read_txn() as txn:
        for bucket, key in pairs:
            h = engine.buckets.get(bucket)
            raw = None if h is None or h.dropped else txn.get(key, None, h.db)
            out.append((bucket, key, None if raw is None else bytes(raw), incarnation(h)))
    return out


# -- the source ------------------------------------------------------------------------


@internal_command("move_track", "slots")
async def move_track(s: Session, p: dict[str, Any]) -> Any:
    slots = _slots(p)
    member = _router(s).member
    others = [slot for slot in slots if member.map.owner(slot) != member.me.name]
    if others:
        raise errors.BadValue(f"slots {others[:5]} are not this node's: nothing to copy here")
    await s.node.write(MoveControlOp("track", slots))
    assert s.node.cluster is not None
    s.node.cluster.fenced.difference_update(slots)
    return True


@internal_command("move_page", "slots", "cursor")
async def move_page(s: Session, p: dict[str, Any]) -> Any:
    """{records: [[bucket, key, record, incarnation]], cursor}: cursor [slot index, bucket, key]
    to continue after, or None when the slots are done."""
    slots = _slots(p)
    index = _index(s)
    cursor = p.get("cursor")
    at, after = 0, None
    if cursor is not None:
        if not (isinstance(cursor, list) and len(cursor) == 3 and type(cursor[0]) is int):
            raise errors.BadValue("'cursor' must be [slot index, bucket, key] or nil")
        at = cursor[0]
        after = (cursor[1], cursor[2]) if cursor[1] is not None else None
    out: list[Imported] = []
    size = 0
    while at < len(slots) and len(out) < PAGE_KEYS and size < PAGE_BYTES:
        batch = index.keys(slots[at], limit=min(500, PAGE_KEYS - len(out)), after=after)
        if not batch:
            at, after = at + 1, None
            continue
        records = _records(s, batch)
        out += records
        size += sum(len(k) + len(r or b"") for _, k, r, _ in records)
        after = batch[-1]
    if at >= len(slots):
        return {"records": out, "cursor": None}
    assert after is not None
    return {"records": out, "cursor": [at, after[0], after[1]]}


@internal_command("move_take", "slots", "limit")
async def move_take(s: Session, p: dict[str, Any]) -> Any:
    """{records, lost: [slots], left}: dirty keys taken with their state now."""
    slots = _slots(p)
    _index(s)
    limit = p.get("limit", PAGE_KEYS)
    if type(limit) is not int or not 0 < limit <= PAGE_KEYS:
        raise errors.BadValue(f"'limit' must be 1 to {PAGE_KEYS}")
    op = MoveControlOp("take", slots, limit)
    await s.node.write(op)  # (the keys noted before it: their writes are committed)
    return {"records": _records(s, op.taken), "lost": op.lost, "left": op.left}


@internal_command("move_fence", "slots")
async def move_fence(s: Session, p: dict[str, Any]) -> Any:
    slots = _slots(p)
    _router(s).fenced.update(slots)  # (refused at once at the door)
    await s.node.write(MoveControlOp("fence", slots))  # (and by the writer from now on)
    return True


@internal_command("move_end", "slots")
async def move_end(s: Session, p: dict[str, Any]) -> Any:
    slots = _slots(p)
    router = _router(s)
    await s.node.write(MoveControlOp("end", slots))
    router.fenced.difference_update(slots)
    return True


# -- the target ------------------------------------------------------------------------


async def drop_slots(node: Any, slots: list[int]) -> int:
    """Drop every key of ``slots`` held here, DROP_BATCH keys a commit (the slots
    that hold none cost a read, no commit)."""
    index = node.engine.slots
    held = [slot for slot in slots if index.keys(slot, limit=1)]
    dropped = 0
    while held:
        n = await node.write(DropSlotOp(held))
        dropped += n
        if n < DROP_BATCH:
            break
    return dropped


@internal_command("move_reset", "slots")
async def move_reset(s: Session, p: dict[str, Any]) -> Any:
    slots = _slots(p)
    router = _router(s)
    mine = [slot for slot in slots if router.member.map.owner(slot) == router.member.me.name]
    if mine:
        raise errors.BadValue(f"slots {mine[:5]} are this node's: not dropped")
    return await drop_slots(s.node, slots)


def _source(s: Session, p: dict[str, Any]) -> Any:
    name = p.get("source")
    router = s.node.cluster
    assert router is not None
    info = router.member.map.nodes.get(name) if isinstance(name, str) else None
    if info is None:
        raise errors.BadValue(f"'source' must name a node of the map, not {name!r}")
    return info


def _secret(s: Session) -> bytes:
    secret: bytes = getattr(s.node.role, "secret", b"")
    if not secret:
        raise errors.BadValue("this node is in no cluster")
    return secret


async def _import(s: Session, records: list[Any]) -> int:
    items: list[Imported] = [
        (str(b), bytes(k), None if r is None else bytes(r), made) for b, k, r, made in records
    ]
    if items:
        await s.node.write(ImportOp(items))
    return len(items)


@internal_command("move_import", "records")
async def move_import(s: Session, p: dict[str, Any]) -> Any:
    """The number of records written: records as ``move_take`` answers them (the
    coordinator relays the last catch-up of a fenced batch over the sessions it
    holds, sparing the target a connection in the fence)."""
    _index(s)
    records = p.get("records")
    if (
        not isinstance(records, list)
        or len(records) > PAGE_KEYS
        or not all(isinstance(r, list) and len(r) == 4 for r in records)
    ):
        raise errors.BadValue(
            f"'records' must be a list of up to {PAGE_KEYS} [bucket, key, record, incarnation]"
        )
    return await _import(s, records)


@internal_command("move_copy", "source", "slots", "cursor")
async def move_copy(s: Session, p: dict[str, Any]) -> Any:
    """{cursor, copied}: pages pulled from the source and written here."""
    slots = _slots(p)
    _index(s)
    source = _source(s, p)
    cursor = p.get("cursor")
    copied = 0
    deadline = trio.current_time() + STEP_SECS
    async with peer_session(source, _secret(s)) as peer:
        while trio.current_time() < deadline:
            page = await peer.call("move_page", {"slots": slots, "cursor": cursor})
            copied += await _import(s, page["records"])
            cursor = page["cursor"]
            if cursor is None:
                break
    return {"cursor": cursor, "copied": copied}


@internal_command("move_catch_up", "source", "slots")
async def move_catch_up(s: Session, p: dict[str, Any]) -> Any:
    """{applied, left, lost}: dirty keys taken from the source and written here."""
    slots = _slots(p)
    _index(s)
    source = _source(s, p)
    async with peer_session(source, _secret(s)) as peer:
        return await catch_up(s, peer, slots)


async def catch_up(s: Session, peer: PeerSession, slots: list[int]) -> dict[str, Any]:
    applied, left = 0, 0
    deadline = trio.current_time() + STEP_SECS
    while True:
        taken = await peer.call("move_take", {"slots": slots})
        if taken["lost"]:
            return {"applied": applied, "left": taken["left"], "lost": taken["lost"]}
        applied += await _import(s, taken["records"])
        left = taken["left"]
        if left == 0 or trio.current_time() >= deadline:
            return {"applied": applied, "left": left, "lost": []}
