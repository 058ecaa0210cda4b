"""A transaction (Redis MULTI ... EXEC, MessagePack ``multi`` ... ``exec``) as one
write operation: its queued commands applied in order in one transaction of
the group-commit writer, and acknowledged with the commit, once durable.

Atomic by construction: the writer applies a batch's ops one after another in
one LMDB write transaction, so no other write comes between two of a
transaction's commands, and none of them is seen before the commit. Reads
queued in a transaction run there too, on the writer's transaction, so they
see the transaction's earlier writes (``SET k 1; INCR k; GET k`` answers
``OK, 2, "2"``): each runs its command's own read handler against
:class:`EngineReads`, the engine's read methods lent that transaction.

Watched keys (WATCH) are checked first, in the same transaction: each must
still have the CAS it had when it was watched (0: no live record). One that
changed — written by anyone, on either door, by any worker process, or expired
— makes the whole transaction apply nothing (EXEC answers nil). A key absent
when watched has no CAS to compare if it was created and deleted since: for
those the bucket's count of deletes in this writer (:data:`ops.DELETES`) was
recorded at WATCH (a ``probe``, read here with the keys' CAS), and a count
that moved fails the transaction too — conservatively, as any delete in the
bucket moves it.

The result is plain data, so it travels unchanged from the node's writer to a
worker process (``serve --workers N``, :mod:`tenantkv.storage.op_wire`): None
when a watched key changed, else one outcome per step, ``[result, error (its
wire form) or None, nbytes, record_bytes, read_sizes, read_keys]`` — what the
connection answers, meters and charges.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb

from tenantkv import errors
from tenantkv.storage import ops, records
from tenantkv.storage.engine import BucketHandle, Engine
from tenantkv.storage.ops import WriteContext, WriteOp

#: The most bytes a transaction's reads may return together: past it, each
#: further read fails (its reply would be held with the others until EXEC is
#: answered — a queue of GETs of 20 MiB values would be gigabytes).
MAX_READ_BYTES = 64 * 1024 * 1024

#: Read handlers a transaction may queue, by their step name (``door:command``):
#: registered by the server's command tables (``server/transaction_reads.py``).
READ_HANDLERS: dict[str, Callable[[Any, BucketHandle, dict[str, Any]], Any]] = {}
#: The module whose ``register`` registers them, imported on first use (by name:
#: storage imports nothing of the server; the command tables are complete by
#: then, and the node's writer process, with workers, loads them so).
_REGISTRAR = "tenantkv.server.transaction_reads"


def read_handler(name: str) -> Callable[[Any, BucketHandle, dict[str, Any]], Any]:
    """The read handler of step ``name``; ValueError when there is none."""
    handler = READ_HANDLERS.get(name)
    if handler is None:
        importlib.import_module(_REGISTRAR).register()
        handler = READ_HANDLERS.get(name)
        if handler is None:
            raise ValueError(f"no read {name!r} may be queued in a transaction")
    return handler


class _TxnReads:
    """The writer's transaction lent to read code written for a read transaction
    of its own (``with env.begin(db=...) as txn``): its reads see the
    transaction's earlier writes, and leaving it ends nothing."""

    __slots__ = ("_db", "_txn")

    def __init__(self, txn: lmdb.Transaction, db: Any = None) -> None:
        self._txn = txn
        self._db = db

    def __enter__(self) -> _TxnReads:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def get(self, key: bytes, default: Any = None, db: Any = None) -> Any:
        return self._txn.get(key, default, db or self._db)

    def cursor(self, db: Any = None) -> Any:
        return self._txn.cursor(db or self._db)

    def stat(self, db: Any) -> Any:
        return self._txn.stat(db)

    def abort(self) -> None:
        pass


class _EnvReads:
    """``Engine.env`` as the engine's read methods use it, on the writer's transaction."""

    __slots__ = ("_txn",)

    def __init__(self, txn: lmdb.Transaction) -> None:
        self._txn = txn

    def begin(self, db: Any = None, buffers: bool = False, **_: Any) -> _TxnReads:
        return _TxnReads(self._txn, db)


class EngineReads:
    """The engine as a read handler sees it inside a transaction: the
    :class:`Engine`'s own read methods (``mget``, ``headers``, ``scan_keys``...),
    bound to this object, whose ``env`` and lock hand them the writer's
    transaction; anything else is the engine's. No read method is copied."""

    def __init__(self, engine: Engine, txn: lmdb.Transaction) -> None:
        self._engine = engine
        self.env = _EnvReads(txn)
        #: the writer's thread holds the transaction already: no lock to take
        self.txn_lock = contextlib.nullcontext()

    def begin_read(self) -> _TxnReads:
        return self.env.begin()

    def end_read(self, txn: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        attr = getattr(Engine, name, None)
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        return getattr(self._engine, name)


class _Config:
    """What read handlers read of the node's configuration."""

    __slots__ = ("max_value_bytes",)

    def __init__(self, max_value_bytes: int) -> None:
        self.max_value_bytes = max_value_bytes


class _Node:
    __slots__ = ("config", "engine")

    def __init__(self, engine: EngineReads, config: _Config) -> None:
        self.engine = engine
        self.config = config


class ReadSession:
    """What a read handler sees of its connection, inside a transaction: the
    writer's transaction as the chunk's read transaction, and its metering."""

    __slots__ = ("node", "read_keys", "read_sizes", "rtxn")

    def __init__(self, node: _Node, txn: _TxnReads) -> None:
        self.node = node
        self.rtxn = txn
        self.read_sizes: list[int] = []
        self.read_keys = 1

    def read_txn(self) -> _TxnReads:
        return self.rtxn


@dataclass(slots=True, eq=False)
class ReadStep:
    """A read queued in a transaction: the step name of its handler
    (:data:`READ_HANDLERS`) and its checked parameters."""

    name: str
    params: dict[str, Any]
    #: (a step's share of the transaction's size: reads write nothing)
    size_hint: int = 0


def deletes(w: WriteContext, bucket: str) -> int:
    """The records of ``bucket`` this writer deleted so far."""
    return ops.DELETES.get(w.engine, {}).get(bucket, 0)


def watch_token(raw: bytes | memoryview | None, now_ms: int) -> int:
    """What WATCH remembers of a key's stored record, and EXEC compares: its CAS
    while it is live, minus its CAS once it has expired (until the expiry pager
    removes it), 0 when there is none. So a key created since and expired
    already, or a watched key that expired, fails EXEC as in Redis (since 6.0.9);
    an expired record left alone passes."""
    if raw is None:
        return 0
    found, expiry_ms, _ = records.unpack_header(raw)
    return found if not expiry_ms or expiry_ms > now_ms else -found


def _cas(w: WriteContext, h: BucketHandle, key: bytes) -> int:
    """``key``'s :func:`watch_token` in the writer's transaction."""
    if h.dropped:
        return 0
    return watch_token(w.txn.get(key, None, h.db), w.now_ms)


#: What a step's outcome holds when it failed or read nothing.
def _outcome(
    result: Any, error: errors.TenantKVError | None, op: WriteOp | None, s: ReadSession | None
) -> list[Any]:
    return [
        result,
        None if error is None else error.to_wire(),
        0 if op is None else op.nbytes,
        [] if op is None else list(op.record_bytes),
        [] if s is None else s.read_sizes,
        1 if s is None else s.read_keys,
    ]


@dataclass(slots=True, eq=False)
class TransactionOp(WriteOp):
    """A transaction's queued commands (write ops and :class:`ReadStep`), applied
    in order in one write transaction when every watched key still has the CAS
    it was watched with (``watches``: ``[bucket name, key, cas]``, 0 for none)."""

    bucket: BucketHandle
    steps: list[WriteOp | ReadStep]
    watches: list[list[Any]] = field(default_factory=list)
    #: the node's max_value_bytes (read handlers check offsets against it)
    max_value_bytes: int = 0
    #: (what the writer fills in, sent back to a worker: a transaction meters per step)
    nbytes: int = 0
    #: ``[bucket name, count]``: the bucket's deletes (:data:`ops.DELETES`) when
    #: an absent key of it was watched; a count that moved fails the transaction
    deletes: list[list[Any]] = field(default_factory=list)
    #: WATCH of keys absent in the watcher's snapshot: no steps run; the result
    #: is ``[the bucket's delete count, [each key's CAS]]``, read together here
    probe: list[bytes] = field(default_factory=list)

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return sum(step.size_hint for step in self.steps) + 64

    @property
    def op_count(self) -> int:  # type: ignore[override]
        return max(1, len(self.steps))

    def apply(self, w: WriteContext) -> Any:
        if self.probe:
            return [deletes(w, self.bucket.name), [_cas(w, self.bucket, k) for k in self.probe]]
        if not self.watches_hold(w):
            return None
        slots = w.engine.slots
        if slots is not None and slots.fenced:
            # A slot switching to another node refuses writes (SlotMoving,
            # retryable: the client sends the transaction again), so a step
            # refused must take the steps before it back with it.
            with w.nested():
                return self._steps(w)
        return self._steps(w)

    def _steps(self, w: WriteContext) -> list[list[Any]]:
        out: list[list[Any]] = []
        read = 0  # bytes the reads returned so far
        for step in self.steps:
            if isinstance(step, ReadStep):
                outcome = self._read(w, step, read)
                read += sum(outcome[4])
                out.append(outcome)
                continue
            try:
                result = step.apply(w)
            except errors.SlotMoving:
                raise  # (the whole transaction: see apply)
            except errors.TenantKVError as exc:
                out.append(_outcome(None, exc, step, None))
            else:
                out.append(_outcome(result, None, step, None))
        return out

    def watches_hold(self, w: WriteContext) -> bool:
        """Does every watched key still have the CAS it was watched with?"""
        for bucket, count in self.deletes:
            if deletes(w, bucket) != count:
                return False  # (conservative: any delete, maybe not of a watched key)
        for bucket, key, cas in self.watches:
            h = w.engine.buckets.get(bucket)
            if (0 if h is None else _cas(w, h, key)) != cas:
                return False
        return True

    def _read(self, w: WriteContext, step: ReadStep, before: int) -> list[Any]:
        """Run a queued read on the writer's transaction; its outcome (``before``:
        the bytes the transaction's reads returned before it)."""
        txn = _TxnReads(w.txn)
        node = _Node(EngineReads(w.engine, w.txn), _Config(self.max_value_bytes))
        s = ReadSession(node, txn)
        try:
            if self.bucket.dropped:
                raise errors.BucketNotFound(f"bucket {self.bucket.name!r} was deleted")
            result = read_handler(step.name)(s, self.bucket, step.params)
            if before + sum(s.read_sizes) > MAX_READ_BYTES:
                raise errors.BadValue(
                    f"the transaction's reads return more than {MAX_READ_BYTES} bytes"
                )
        except errors.TenantKVError as exc:
            return _outcome(None, exc, None, s)
        except Exception as exc:  # a handler's bug fails its command, not the commit
            return _outcome(None, errors.InternalError(f"internal error: {exc!r:.200}"), None, s)
        return _outcome(result, None, None, s)
