"""Client-side caching (Redis's ``CLIENT TRACKING``): which connection read which
key, and the ``invalidate`` pushes a change of that key owes them.

One :class:`TrackingTable` per process. Default mode remembers, per bucket, the
keys each tracking connection read; a change of a key pushes ``invalidate``
to each of them once and forgets the key (Redis semantics: read it again to
be told again). BCAST mode remembers nothing: every change in the bucket whose
key starts with one of the connection's prefixes is pushed. A whole bucket
emptied (FLUSHDB, a bucket dropped) pushes ``invalidate`` with a null array.

Bounds: the table holds at most ``max_keys`` keys (Redis's
``tracking-table-max-keys``); a key read past that evicts the oldest one,
whose readers are told first (the client drops it, as if it had changed).
What a connection is owed is bounded by its connection
(:meth:`tenantkv.server.connection.Connection.push`).

Cost: a process where no connection tracks pays one attribute test per
commit; a change of a key nobody tracks costs one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tenantkv.storage.op_wire import RemoteBatchOp
from tenantkv.storage.ops import DropBucketOp, ExpireDueOp, RunOp, WriteOp
from tenantkv.storage.slot_ops import DropSlotOp
from tenantkv.storage.string_ops import FlushOp
from tenantkv.storage.transaction_ops import TransactionOp
from tenantkv.storage.value_ops import BitOpOp, MoveOp

#: Redis's default ``tracking-table-max-keys`` is 1,000,000 (0 there: no bound;
#: here there is always one).
DEFAULT_MAX_KEYS = 1_000_000
#: Most BCAST prefixes one connection may give (Redis sets no bound).
MAX_PREFIXES = 64

#: A change: (bucket name, the keys changed, or None for the whole bucket).
Change = tuple[str, list[bytes] | None]


class Tracker:
    """One connection's tracking: its mode, and how it is told (``push``: the
    keys, or None for "everything")."""

    __slots__ = (
        "bcast",
        "bucket",
        "caching",
        "conn_id",
        "noloop",
        "optin",
        "optout",
        "prefixes",
        "push",
        "table",
    )

    def __init__(
        self,
        table: TrackingTable,
        conn_id: int,
        bucket: Callable[[], str | None],
        push: Callable[[list[bytes] | None], None],
        *,
        bcast: bool = False,
        prefixes: Iterable[bytes] = (),
        noloop: bool = False,
        optin: bool = False,
        optout: bool = False,
    ) -> None:
        self.table = table
        self.conn_id = conn_id
        #: the connection's bucket now (SELECT moves it)
        self.bucket = bucket
        self.push = push
        #: CLIENT CACHING yes|no, for the next command only (OPTIN / OPTOUT)
        self.caching: bool | None = None
        self.bcast = bcast
        self.prefixes = tuple(prefixes)
        self.noloop = noloop
        self.optin = optin
        self.optout = optout

    def flags(self) -> list[str]:
        """CLIENT TRACKINGINFO's flags, in Redis's words."""
        out = ["on"]
        for flag, name in (
            (self.bcast, "bcast"),
            (self.optin, "optin"),
            (self.optout, "optout"),
            (self.caching is True, "caching-yes"),
            (self.caching is False, "caching-no"),
            (self.noloop, "noloop"),
        ):
            if flag:
                out.append(name)
        return out

    def command(self, args: list[bytes], spec: tuple[int, int, int] | None) -> None:
        """The connection sent a command (as decoded: in the order sent). A read
        (``spec``: its keys' positions, Redis's first, last, step) has its keys
        remembered, as OPTIN / OPTOUT and CLIENT CACHING allow; CLIENT CACHING
        applies to the command after it, and only to that one."""
        caching, self.caching = self.caching, None
        if spec is None or self.bcast:
            return
        if (self.optin and caching is not True) or (self.optout and caching is False):
            return
        bucket = self.bucket()
        first, last, step = spec
        if bucket is None or first <= 0:
            return
        stop = len(args) + last + 1 if last < 0 else min(len(args), last + 1)
        self.table.remember(self, bucket, args[first:stop:step])

    def wants(self, key: bytes) -> bool:
        """BCAST: does a change of ``key`` concern this connection?"""
        return not self.prefixes or key.startswith(self.prefixes)


class TrackingTable:
    """The process's tracked keys, per bucket, and its BCAST connections."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.max_keys = max_keys
        #: bucket -> key -> the connections that read it since it last changed
        self._keys: dict[str, dict[bytes, set[Tracker]]] = {}
        #: bucket -> its BCAST connections
        self._bcast: dict[str, set[Tracker]] = {}
        #: every tracker on, by connection id (TRACKING OFF and a close remove it)
        self.trackers: dict[int, Tracker] = {}
        #: keys held (the sum over buckets), and keys evicted for the bound
        self.count = 0
        self.evicted = 0
        #: invalidations pushed (keys, and whole-bucket ones)
        self.invalidations = 0
        #: told when the first tracker starts and the last stops (workers tell
        #: the supervisor, which sends changes only while someone tracks)
        self.on_active: Callable[[bool], None] = lambda active: None

    @property
    def active(self) -> bool:
        return bool(self.trackers)

    # -- connections -------------------------------------------------------------

    def start(self, tracker: Tracker, bucket: str | None) -> None:
        """A connection turns tracking on (again: its new options replace the old)."""
        self.stop(tracker.conn_id)
        was = self.active
        self.trackers[tracker.conn_id] = tracker
        if tracker.bcast and bucket is not None:
            self._bcast.setdefault(bucket, set()).add(tracker)
        if not was:
            self.on_active(True)

    def stop(self, conn_id: int) -> None:
        """Tracking off or the connection closed. The keys it read stay in the
        table until they change or are evicted (as in Redis): a dead tracker is
        skipped then."""
        tracker = self.trackers.pop(conn_id, None)
        if tracker is None:
            return
        for bucket, subs in list(self._bcast.items()):
            subs.discard(tracker)
            if not subs:
                del self._bcast[bucket]
        if not self.trackers:
            self.on_active(False)

    def moved(self, tracker: Tracker, old: str | None, new: str | None) -> None:
        """A BCAST connection selected another bucket."""
        if not tracker.bcast or self.trackers.get(tracker.conn_id) is not tracker:
            return
        if old is not None and old in self._bcast:
            self._bcast[old].discard(tracker)
        if new is not None:
            self._bcast.setdefault(new, set()).add(tracker)

    # -- reads -------------------------------------------------------------------

    def remember(self, tracker: Tracker, bucket: str, keys: Iterable[bytes]) -> None:
        """``tracker`` read ``keys`` of ``bucket``: tell it when they change."""
        table = self._keys.get(bucket)
        if table is None:
            table = self._keys[bucket] = {}
        for key in keys:
            readers = table.get(key)
            if readers is None:
                if self.count >= self.max_keys:
                    self._evict_one()
                readers = table[key] = set()
                self.count += 1
            readers.add(tracker)

    def _evict_one(self) -> None:
        """The table is full: the oldest key of the bucket that holds the most
        goes, its readers told first — a tenant that reads keys by the million
        evicts its own, not another tenant's few."""
        keys = self._keys
        if not keys:
            return
        bucket = max(keys, key=lambda b: len(keys[b]))
        self._invalidate(bucket, [next(iter(keys[bucket]))], None)
        self.evicted += 1

    # -- changes -----------------------------------------------------------------

    def changed(self, changes: Iterable[Change], origin: int | None = None) -> None:
        """Keys changed (a commit): push ``invalidate`` to those who read them.
        ``origin`` is the writing connection, if known (NOLOOP skips it)."""
        for bucket, keys in changes:
            if keys is None:
                self._flushed(bucket)
            else:
                self._invalidate(bucket, keys, origin)

    def _invalidate(self, bucket: str, keys: list[bytes], origin: int | None) -> None:
        owed: dict[Tracker, list[bytes]] = {}
        table = self._keys.get(bucket)
        if table is not None:
            for key in keys:
                readers = table.pop(key, None)
                if readers is None:
                    continue
                self.count -= 1
                for t in readers:
                    owed.setdefault(t, []).append(key)
            if not table:
                del self._keys[bucket]
        for t in self._bcast.get(bucket, ()):
            wanted = [k for k in keys if t.wants(k)]
            if wanted:
                owed.setdefault(t, []).extend(wanted)
        live = self.trackers
        for t, owed_keys in owed.items():
            if live.get(t.conn_id) is t and not (t.noloop and t.conn_id == origin):
                self.invalidations += len(owed_keys)
                t.push(owed_keys)

    def _flushed(self, bucket: str) -> None:
        """The whole bucket changed: every tracker in it is told to drop everything."""
        table = self._keys.pop(bucket, None)
        told: set[Tracker] = set(self._bcast.get(bucket, ()))
        if table is not None:
            self.count -= len(table)
            for readers in table.values():
                told.update(readers)
        live = self.trackers
        for t in told:
            if live.get(t.conn_id) is t:
                self.invalidations += 1
                t.push(None)

    def figures(self) -> dict[str, int]:
        return {
            "tracking_clients": len(self.trackers),
            "tracking_total_keys": self.count,
            "tracking_evicted_keys": self.evicted,
            "tracking_invalidations": self.invalidations,
        }


# -- what a commit changed ---------------------------------------------------------


def changes_of(ops: Iterable[Any]) -> Iterator[Change]:
    """The keys each op changed (or may have: an op that failed is told too, which
    costs its readers one needless read again, never a stale value). An op of a
    kind not known here that names a bucket counts as a change of the whole
    bucket, so a new kind of write is never missed."""
    for op in ops:
        yield from _changes(op)


def _changes(op: Any) -> Iterator[Change]:
    if isinstance(op, RunOp):
        yield from changes_of(op.ops)
    elif isinstance(op, RemoteBatchOp):
        yield from changes_of(op.writes)
    elif isinstance(op, TransactionOp):
        yield from changes_of(s for s in op.steps if isinstance(s, WriteOp))
    elif isinstance(op, (ExpireDueOp, DropSlotOp)):  # (keys found as it ran)
        by_bucket: dict[str, list[bytes]] = {}
        for bucket, key in op.removed_keys:
            by_bucket.setdefault(bucket, []).append(key)
        yield from by_bucket.items()
    elif isinstance(op, (FlushOp,)):
        yield op.bucket.name, None
    elif isinstance(op, DropBucketOp):
        yield op.handle.name, None
    elif isinstance(op, MoveOp):
        yield op.bucket.name, [op.source, op.dest]
    elif isinstance(op, BitOpOp):
        yield op.bucket.name, [op.dest]
    else:
        yield from _named_keys(op)


def _named_keys(op: Any) -> Iterator[Change]:
    """An op of one bucket: the key(s) it names, else the whole bucket."""
    handle = getattr(op, "bucket", None)
    if handle is None:
        return  # (system records: users, buckets made, parameters)
    name: str = handle.name
    one = getattr(op, "key", None)
    pairs = getattr(op, "pairs", None)
    many = getattr(op, "keys", None)
    if one is not None:
        yield name, [one]
    elif pairs is not None:
        yield name, [k for k, _ in pairs]
    elif many is not None:
        yield name, list(many)
    else:
        yield name, None
