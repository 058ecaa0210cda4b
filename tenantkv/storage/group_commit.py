"""The group-commit writer: one thread owns every LMDB write transaction.

py-lmdb write transactions must stay on the thread that began them, and a
durable commit costs an fsync (~9k commits/s here) while a put inside an open
transaction costs ~1 µs. So one dedicated thread takes every write queued
since its last commit, applies the whole batch in one transaction, commits
once, and only then hands the batch back (``deliver``) so each write is
acknowledged after it is durable. The queue length is the write "lag" that
later drives back-pressure.

``submit`` is O(1) and thread-safe (a ``SimpleQueue`` put, and the count of
writes submitted under a lock: with ``--workers N`` the supervisor's event
loop and each worker's write link submit); ``submit_many``
queues a list of writes as one item, so a thread that gathers its writes
(the server: every write of one turn of its event loop) wakes the writer once
for all of them instead of letting it start a commit with the first few.
``deliver`` runs on the writer thread and must be cheap — the server passes
one that schedules result delivery on the Trio loop (``TrioToken.run_sync_soon``).
"""

from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb

from tenantkv import errors
from tenantkv.storage.engine import Engine, is_disk_full
from tenantkv.storage.ops import WriteContext, WriteOp

log = logging.getLogger("tenantkv.storage")

#: Most operations committed in one transaction.
MAX_BATCH_OPS = 2048
#: Most value bytes committed in one transaction (a larger single op still goes alone).
MAX_BATCH_BYTES = 64 * 1024 * 1024
#: A batch that starts on an idle writer and holds fewer writes than expected
#: waits for more at most this share of the last commit's time, and never
#: longer than :data:`MAX_GATHER_SECONDS` (see ``_take_batch``).
GATHER_SHARE = 0.5
MAX_GATHER_SECONDS = 0.002

Callback = Callable[[Any, BaseException | None], None]


@dataclass(slots=True, eq=False)
class Pending:
    op: WriteOp
    callback: Callback
    #: called (on the loop) when the writer takes the op from its queue
    taken: Callable[[], None] | None = None
    result: Any = None
    error: BaseException | None = None
    #: the callback runs on the writer's thread (cheap and thread-safe: it
    #: sends a worker's answer itself), not on the event loop
    direct: bool = False


_STOP = object()


class GroupCommitWriter:
    def __init__(
        self,
        engine: Engine,
        deliver: Callable[[list[Pending]], None],
        *,
        taken: Callable[[list[Pending]], None] | None = None,
        max_batch_ops: int = MAX_BATCH_OPS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        gather_share: float = GATHER_SHARE,
        max_gather_seconds: float = MAX_GATHER_SECONDS,
        gather_when_busy: bool = False,
    ) -> None:
        self.engine = engine
        self._deliver = deliver
        #: told (from this thread) each batch it takes, before applying it: what
        #: bounds the queue (execution tickets, bucket slots, write permits) is
        #: given back then, so the next batch gathers while this one is committed
        #: and fsynced. The batch size then follows the offered load, not the pools.
        self._taken = taken
        self.max_batch_ops = max_batch_ops
        self.max_batch_bytes = max_batch_bytes
        self.gather_share = gather_share
        self.max_gather_seconds = max_gather_seconds
        #: a batch waits for the writes it expects even when it starts with
        #: writes queued (see ``_take_batch``)
        self.gather_when_busy = gather_when_busy
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: writes taken from the queue and not yet in a batch (a list's remainder)
        self._carry: list[Pending] = []
        # Writes submitted (from any thread: under the lock) and taken (by the
        # writer's thread only): ``lag`` reads them without one.
        self._count_lock = threading.Lock()
        self._submitted = 0
        self._taken_count = 0
        #: writes the next batch is expected to gather (see ``_take_batch``)
        self._expected = 0
        self._thread: threading.Thread | None = None
        # statistics (written by the writer thread only)
        self.batches = 0
        self.ops_committed = 0
        self.last_batch_ops = 0
        self.max_batch_seen = 0
        self.commit_seconds_total = 0.0
        self.last_commit_seconds = 0.0
        self.map_grows = 0
        self.failed_batches = 0
        #: callbacks that observe (ops, commit seconds) per batch; used by metrics.
        self.observers: list[Callable[[int, float], None]] = []
        #: called (on the writer thread) with the earliest expiry a committed batch
        #: wrote, so the expiry pager can wake for it instead of polling
        self.expiry_observers: list[Callable[[int], None]] = []

    @property
    def lag(self) -> int:
        """Writes queued and not yet committed (an item's ``op_count`` each: a
        run of writes queued as one item counts its writes)."""
        return self._submitted - self._taken_count + sum(p.op.op_count for p in self._carry)

    def statistics(self) -> dict[str, Any]:
        return {
            "queued": self.lag,
            "batches": self.batches,
            "ops_committed": self.ops_committed,
            "last_batch_ops": self.last_batch_ops,
            "max_batch_ops": self.max_batch_seen,
            "commit_seconds_total": round(self.commit_seconds_total, 6),
            "last_commit_micros": int(self.last_commit_seconds * 1e6),
            "map_grows": self.map_grows,
            "failed_batches": self.failed_batches,
            "durable": self.engine.sync,
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tenantkv-writer", daemon=True)
        self._thread.start()

    def submit(
        self, op: WriteOp, callback: Callback, taken: Callable[[], None] | None = None
    ) -> None:
        with self._count_lock:
            self._submitted += op.op_count
        self._queue.put(Pending(op, callback, taken))

    def submit_many(self, pending: list[Pending]) -> None:
        """Queue writes as one item (one wake-up of the writer)."""
        n = sum(p.op.op_count for p in pending)
        with self._count_lock:
            self._submitted += n
        self._queue.put(pending)

    def stop(self) -> None:
        """Ask the thread to commit what is queued and exit; then ``join``."""
        self._queue.put(_STOP)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    # -- writer thread -------------------------------------------------------

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch, size, count, stopping = self._take_batch()
            if batch:
                if self._taken is not None:
                    try:
                        self._taken(batch)
                    except Exception:  # the writer must outlive any callback bug
                        log.exception("reporting a taken write batch failed")
                self._commit(batch, size, count)
                try:
                    self._deliver(batch)
                except Exception:  # the writer must outlive any callback bug
                    log.exception("delivering a write batch failed")
                # The writers just answered may write again at once, and those
                # queued meanwhile are there already.
                self._expected = min(count + self.lag, self.max_batch_ops)

    def _take_batch(self) -> tuple[list[Pending], int, int, bool]:
        """What is queued now, up to the batch bounds (a write larger than the byte
        bound goes alone), its bytes and its writes; and whether stop was asked.

        When the writer finds nothing queued, the batch it then starts waits a
        little for as many writes as the last commit answered plus those queued
        behind it (``_expected``): like MySQL's ``binlog_group_commit_sync_delay``
        with its ``..._no_delay_count``, but both taken from the load. Without
        that, the first answered client to write again finds the writer idle
        and commits alone or with a few; the others gather behind that commit,
        and from then on the clients take turns in two groups: each write waits
        for two commits, and each commit carries half the writes (16 unpipelined
        clients: 8 writes per commit instead of 16, and 1.4x the CPU per write).
        The wait is at most half the last commit's time. A writer that finds
        writes queued does not wait: the event loop is then the bottleneck
        (pipelined clients), and holding its writes back only starves it.

        Unless ``gather_when_busy``: the node's writer of ``--workers N``,
        whose writers are workers that keep at most two messages unanswered
        (``server/remote_writer.py``) and send what gathered meanwhile as soon
        as an answer frees a place. What the last commit's answers release
        then arrives within a round trip, behind the messages queued already:
        waiting for it lets it join this commit instead of the next one (a
        commit's wait less for those writes; measured under durable SET 16 x
        64 on two workers, ~290 -> ~350 writes per commit).
        """
        batch: list[Pending] = []
        size = count = 0
        pending, self._carry = self._carry, []
        stopping = False
        max_bytes, max_ops = self.max_batch_bytes, self.max_batch_ops
        gather = self.gather_when_busy
        deadline = 0.0
        while True:
            for i, p in enumerate(pending):
                op = p.op
                grown = size + op.size_hint
                if batch and (grown > max_bytes or count >= max_ops):
                    self._carry = pending[i:]
                    return batch, size, count, stopping
                batch.append(p)
                size = grown
                count += op.op_count
            if stopping:
                return batch, size, count, True
            if not batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    gather = True  # idle: the batch this wakes for may wait for more
                    item = self._queue.get()
            else:
                try:
                    if gather and count < self._expected:
                        if not deadline:
                            wait = self.gather_share * self.last_commit_seconds
                            wait = min(wait, self.max_gather_seconds)
                            deadline = time.monotonic() + wait
                        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    else:
                        item = self._queue.get_nowait()
                except queue.Empty:
                    return batch, size, count, False
            if item is _STOP:
                stopping = True
                pending = []
                continue
            pending = item if type(item) is list else [item]
            self._taken_count += sum(p.op.op_count for p in pending)

    def _commit(self, batch: list[Pending], extra: int, n: int) -> None:
        """Apply and commit ``batch`` (``extra`` bytes, ``n`` writes)."""
        eng = self.engine
        t0 = time.perf_counter()
        for _attempt in range(8):
            try:
                if eng.maybe_grow(extra):
                    self.map_grows += 1
                earliest = self._apply_all(batch)
                if earliest:
                    for notify in self.expiry_observers:
                        notify(earliest)
                break
            except lmdb.MapResizedError:
                # Another worker process grew the map: adopt its size (no
                # transaction of this writer is open here) and try again.
                eng.adopt_map_size()
            except lmdb.MapFullError:
                try:
                    eng.force_grow(extra)
                    self.map_grows += 1
                except Exception as exc:
                    self._fail(batch, self._storage_error(exc))
                    break
            except Exception as exc:
                self._fail(batch, self._storage_error(exc))
                break
        else:
            self._fail(batch, errors.StorageFull("could not grow the map to fit the batch"))
        dt = time.perf_counter() - t0
        self.batches += 1
        self.ops_committed += n
        self.last_batch_ops = n
        self.max_batch_seen = max(self.max_batch_seen, n)
        self.commit_seconds_total += dt
        self.last_commit_seconds = dt
        for observe in self.observers:
            observe(n, dt)

    def _apply_all(self, batch: list[Pending]) -> int:
        """One transaction for the batch; per-op errors stay with their op. Returns
        the earliest expiry it wrote (0: none).

        On a transaction-level failure the transaction aborts and the
        exception propagates, so nothing of the batch is written and the
        caller may retry the whole batch (after growing the map).
        """
        eng = self.engine
        cas_before, ceiling_before = eng.cas_counter, eng.cas_ceiling
        txn = eng.env.begin(write=True)
        try:
            w = WriteContext(eng, txn, eng.now_ms())
            for p in batch:
                p.result, p.error = None, None
                try:
                    p.result = p.op.apply(w)
                except errors.TenantKVError as exc:
                    p.error = exc
            txn.commit()
        except BaseException:
            txn.abort()
            eng.cas_counter, eng.cas_ceiling = cas_before, ceiling_before
            raise
        return w.earliest_expiry_ms

    def _fail(self, batch: list[Pending], exc: errors.TenantKVError) -> None:
        self.failed_batches += 1
        log.error("write batch of %d failed: %s", len(batch), exc)
        for p in batch:
            p.result, p.error = None, exc

    @staticmethod
    def _storage_error(exc: BaseException) -> errors.TenantKVError:
        """A full disk (ENOSPC, a quota, or LMDB's EIO for a short write with no
        space left) is StorageFull; any other I/O error says so, and is not
        reported as a full disk. A StorageFull raised by the engine (the map
        limit) is passed on as it is."""
        if isinstance(exc, errors.StorageFull):
            return exc
        if is_disk_full(exc):
            return errors.StorageFull(f"disk full: {exc}")
        text = str(exc)
        if (isinstance(exc, OSError) and exc.errno == errno.EIO) or (
            "input/output error" in text.lower()
        ):
            log.error("storage I/O error (EIO) with free space left, not a full disk: %s", text)
            return errors.InternalError(f"storage I/O error (not a full disk): {text}")
        log.exception("storage failure", exc_info=exc)
        return errors.InternalError(f"storage failure: {text}")
