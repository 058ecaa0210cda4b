"""The LMDB environment: one named database per bucket, a system database, an expiry index.

Reads run inline on the caller's thread in short read transactions: a read of
mmap'd pages costs ~0.5 µs here, far below the ~80 µs of a thread hop, so the
event loop reads directly (one transaction per request, or per batch for
``mget``/``scan``). Every write goes through the group-commit writer
(:mod:`tenantkv.storage.group_commit`), the only thread that opens write
transactions.

LMDB forbids ``set_mapsize`` while any transaction of the process is open, so
inline readers and the writer's map growth share ``txn_lock``; holding an
uncontended lock costs ~50 ns. It is re-entrant: a session holds one read
transaction (and the lock) across the reads of a received chunk
(:meth:`Engine.begin_read`), and an ``mget`` in that chunk takes it again.

Opening a data directory is checked, and each refusal is a
:class:`DataDirError` with one line that names the problem: the directory is
created if missing; it must be a readable, writable directory; only one
process may use it at a time (an exclusive ``flock`` on ``tenantkv.lock``,
released by the kernel however the process ends — LMDB itself would let two
servers open one environment); and its format version, written into the
system database at creation, must not be newer than this build reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgpack

from tenantkv import errors, protocol
from tenantkv.storage import records
from tenantkv.storage.records import Record
from tenantkv.storage.slot_index import SlotIndex

log = logging.getLogger("tenantkv.storage")

#: Matched with fullmatch: ``$`` alone would also accept a trailing newline.
BUCKET_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
SYSTEM_DB = b"__system__"
EXPIRY_DB = b"__expiry__"
BUCKET_DB_PREFIX = b"b:"
CAS_KEY = b"meta:cas"
#: CAS values are reserved in blocks: the system record holds the ceiling of
#: the current block, so a commit writes it only once per CAS_BLOCK writes
#: instead of dirtying the system database's pages in every batch.
CAS_BLOCK = 100_000
#: The map every worker process of ``serve --workers N`` sets at open when no
#: ``max_map_size`` is configured: address space, not disk (the file grows as
#: pages are used), so that no worker ever has to grow it under the others.
SHARED_MAP_SIZE = 1 << 40
#: System record holding the on-disk format version (ASCII decimal).
FORMAT_KEY = b"meta:format"
#: The format this build writes and the newest it reads. Raise it, with a
#: migration, whenever a record layout or a system key changes meaning.
FORMAT_VERSION = 1
#: The file whose exclusive ``flock`` marks a data directory in use (holds the pid).
LOCK_FILE = "tenantkv.lock"
#: Bound on the records one ``mget`` or ``scan`` returns, in bytes (keys, values
#: and ~64 bytes each of framing): a response must fit the clients' frame bound,
#: and 1000 keys of a 20 MiB value must not make the server build 20 GB.
MAX_RESULT_BYTES = protocol.MAX_VALUE_BYTES + 16 * 1024
RESULT_ENTRY_OVERHEAD = 64
#: Free space below which a failed write is taken for a full disk (LMDB reports
#: the short write a full disk causes as EIO).
DISK_FULL_SLACK_BYTES = 1024 * 1024

GiB = 1024**3

#: Engines open in this process, so that :func:`is_disk_full` can look at the
#: filesystems they live on.
_open_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


class DataDirError(Exception):
    """The data directory cannot be used; the message names the problem in one line."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class NonDecreasingClock:
    """Wall-clock milliseconds that never go back.

    Expiry is absolute wall-clock time, as in Redis (a TTL becomes a deadline;
    EXPIREAT-style deadlines are wall-clock by nature). When the system clock
    steps back, this clock holds its highest reading until the wall clock catches
    up, so a key already reported missing, or removed by the pager, never comes
    back. Called from the event loop and the writer thread: a race can at worst
    return a reading a few ms older than another thread's, never one from before
    a step.
    """

    __slots__ = ("_high", "_wall")

    def __init__(self, wall: Callable[[], int] = wall_ms) -> None:
        self._wall = wall
        self._high = wall()

    def __call__(self) -> int:
        t = self._wall()
        if t > self._high:
            self._high = t
            return t
        return self._high


@dataclass(frozen=True)
class KeyRange:
    """The keys a scan visits: start <= key < end, and key > after (the last key
    of the page before, a cursor)."""

    start: bytes = b""
    end: bytes | None = None
    after: bytes | None = None


#: every key of a bucket
ALL_KEYS = KeyRange()


@dataclass(eq=False)
class BucketHandle:
    """An open bucket. ``dropped`` is set before its drop is queued, so a
    write still in the writer queue fails with BucketNotFound instead of
    touching a freed database handle."""

    name: str
    db: Any
    props: dict[str, Any] = field(default_factory=dict)
    dropped: bool = False


def validate_bucket_name(name: Any) -> str:
    if not isinstance(name, str) or not BUCKET_NAME_RE.fullmatch(name):
        raise errors.BadValue(
            "bucket name must be 1-100 characters of letters, digits, '_', '.', '-'"
        )
    return name


class Engine:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size: int = 1 * GiB,
        max_map_size: int = 0,
        sync: bool = True,
        max_buckets: int = 1000,
        now_ms: Callable[[], int] = wall_ms,
        shared: bool = False,
        slot_index: bool = False,
    ) -> None:
        """``slot_index``: keep every key in the index by cluster slot (a node in a
        cluster: :mod:`tenantkv.storage.slot_index`).
        ``shared``: a worker of ``serve --workers N``. The supervisor holds the
        data directory's lock (this process inherited it), and every process maps
        the same size from the start, so that no process grows the map under the
        others (LMDB would fail their next transaction with ``MAP_RESIZED``)."""
        self.path = os.fspath(path)
        self.max_map_size = max_map_size
        self.now_ms = NonDecreasingClock(now_ms)
        self.sync = sync
        self.txn_lock = threading.RLock()
        #: online copies running (copy_to); map growth waits for them to end
        self._copies = 0
        self._copies_done = threading.Condition()
        self.buckets: dict[str, BucketHandle] = {}
        self.cas_counter = 0
        #: highest CAS the disk allows without a new reservation
        self.cas_ceiling = 0
        #: the on-disk format version found (or written) at open
        self.format_version = FORMAT_VERSION
        self._lock_fd: int | None = None if shared else lock_data_dir(self.path)
        try:
            _reserve_space(self.path)
        except DataDirError:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            raise
        if shared:
            map_size = max(map_size, max_map_size or SHARED_MAP_SIZE)
        self.env: Any = None
        #: the index of keys by cluster slot (None: not kept, a single node)
        self.slots: SlotIndex | None = None
        try:
            try:
                self.env = lmdb.open(
                    self.path,
                    map_size=map_size,
                    max_dbs=max_buckets + 3,  # + system, expiry, slot index
                    sync=sync,
                    metasync=sync,
                    max_readers=256,
                    # A read transaction, once aborted, is kept (reset) for the next
                    # begin: beginning one otherwise allocates and zeroes
                    # ~50 bytes per possible database (~50 KiB at 1,000 buckets)
                    # and takes a reader slot: ~1 µs, and the L1 cache, per chunk.
                    max_spare_txns=1,
                    mode=0o700,
                )
                if shared:
                    # Reader slots left by a worker that was killed would pin old
                    # pages (the file would only grow): free them.
                    self.env.reader_check()
                self.system = self.env.open_db(SYSTEM_DB)
                self.expiry = self.env.open_db(EXPIRY_DB)
            except lmdb.Error as exc:
                raise DataDirError(f"LMDB cannot open it: {_one_line(exc)}") from None
            self._load()
            self.slots = SlotIndex.open(self, enabled=slot_index)
        except BaseException:
            self.close()
            raise
        _open_engines.add(self)

    def _load(self) -> None:
        with self.env.begin(write=True) as txn:
            stored = txn.get(FORMAT_KEY, db=self.system)
            self.format_version = _check_format(stored)
            if stored is None:
                # A new directory (or one from before versioning, which is format 1).
                txn.put(FORMAT_KEY, str(FORMAT_VERSION).encode(), db=self.system)
            raw = txn.get(CAS_KEY, db=self.system)
            # Start above everything the last run may have handed out.
            self.cas_counter = self.cas_ceiling = int(raw) if raw else 0
            for key, value in txn.cursor(db=self.system):
                if key.startswith(b"bucket:"):
                    name = key[len(b"bucket:") :].decode()
                    db = self.env.open_db(BUCKET_DB_PREFIX + name.encode(), txn=txn)
                    self.buckets[name] = BucketHandle(name, db, msgpack.unpackb(value))

    def close(self) -> None:
        _open_engines.discard(self)
        if self.env is not None:
            self.env.close()
            self.env = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- reads (inline) ---------------------------------------------------

    @contextmanager
    def read_txn(self) -> Iterator[lmdb.Transaction]:
        with self.txn_lock, self.env.begin(buffers=False) as txn:
            yield txn

    def bucket(self, name: str) -> BucketHandle:
        h = self.buckets.get(name)
        if h is None or h.dropped:
            raise errors.BucketNotFound(f"bucket {name!r} does not exist")
        return h

    def get(self, h: BucketHandle, key: bytes) -> Record | None:
        """One read in a transaction of its own."""
        txn = self.begin_read()
        try:
            return self.get_in(txn, h, key)
        finally:
            self.end_read(txn)

    def begin_read(self) -> lmdb.Transaction:
        """A read transaction for several reads on the event loop (a received chunk's):
        one transaction and one lock round trip instead of one per read. It holds
        ``txn_lock`` until :meth:`end_read`, so it must never be held across an
        await (the writer's map growth would wait for it)."""
        self.txn_lock.acquire()
        try:
            return self.env.begin()
        except BaseException:
            self.txn_lock.release()
            raise

    def end_read(self, txn: lmdb.Transaction) -> None:
        txn.abort()
        self.txn_lock.release()

    def get_in(self, txn: lmdb.Transaction, h: BucketHandle, key: bytes) -> Record | None:
        """The live record of ``key`` read in ``txn`` (see :meth:`begin_read`)."""
        raw = txn.get(key, None, h.db)  # (key, default, db): positional is ~60 ns cheaper
        if raw is None:
            return None
        rec = records.decode(raw)
        return rec if rec.expiry_ms == 0 or rec.expiry_ms > self.now_ms() else None

    def get_value_in(
        self, txn: lmdb.Transaction, h: BucketHandle, key: bytes
    ) -> tuple[bytes, int] | None:
        """The value of the live record of ``key`` read in ``txn`` and its stored size
        (metered), or None: :meth:`get_in` for a reader that wants the value only."""
        raw = txn.get(key, None, h.db)
        if raw is None:
            return None
        value = records.live_value(raw, self.now_ms)
        return None if value is None else (value, len(raw))

    def mget(
        self, h: BucketHandle, keys: list[bytes], *, max_bytes: int = MAX_RESULT_BYTES
    ) -> list[Record | None]:
        """The live record of each key (None where there is none).

        Raises BadValue, having built nothing big, when the records would
        exceed ``max_bytes`` (values plus framing): one response must fit a frame.
        """
        now = self.now_ms()
        out: list[Record | None] = []
        total = 0
        # Views of the stored records (buffers=True): each value's size is checked
        # before anything is copied, and a live one is copied once, by decode.
        with self.txn_lock, self.env.begin(db=h.db, buffers=True) as txn:
            for raw in _live_records(txn, keys, now):
                if raw is None:
                    out.append(None)
                    continue
                total += len(raw) - records.HEADER_BYTES + RESULT_ENTRY_OVERHEAD
                if total > max_bytes:
                    raise errors.BadValue(
                        f"the values of these {len(keys)} keys exceed {max_bytes} bytes, "
                        "more than one response may carry; ask for fewer keys"
                    )
                out.append(records.decode(raw))
        return out

    def headers(self, h: BucketHandle, keys: list[bytes]) -> list[tuple[int, int] | None]:
        """``(stored bytes, expiry_ms)`` of each key's live record (None where there
        is none), read on views of the records: for readers that want no value
        (Redis EXISTS, STRLEN, TYPE, TTL), which copied up to 1 MiB per key named."""
        now = self.now_ms()
        with self.txn_lock, self.env.begin(db=h.db, buffers=True) as txn:
            return [
                None if raw is None else (len(raw), records.unpack_header(raw)[1])
                for raw in _live_records(txn, keys, now)
            ]

    def scan(
        self,
        h: BucketHandle,
        where: KeyRange = ALL_KEYS,
        *,
        limit: int = 100,
        max_bytes: int = MAX_RESULT_BYTES,
    ) -> tuple[list[tuple[bytes, Record]], bool]:
        """Live records of ``where``, in key order.

        Returns (items, more): ``more`` says a further call may return more.
        A page also ends before its keys and values would exceed ``max_bytes``
        (it always holds at least one record).
        """
        now = self.now_ms()
        items: list[tuple[bytes, Record]] = []
        total = 0
        with self.txn_lock, self.env.begin(db=h.db) as txn:
            for key, raw in _live_in_range(txn, where, now):
                rec = records.decode(raw)
                if len(items) == limit:
                    return items, True
                total += len(key) + len(rec.value) + RESULT_ENTRY_OVERHEAD
                if items and total > max_bytes:
                    return items, True
                items.append((key, rec))
        return items, False

    def scan_keys(
        self, h: BucketHandle, where: KeyRange = ALL_KEYS, *, limit: int = 100
    ) -> tuple[list[bytes], bool]:
        """:meth:`scan` for the keys alone (Redis KEYS and SCAN): each record's
        expiry is read on a view of it, and nothing of its value is copied — a
        scan of 10,000 keys of 1 MiB copied 10 GB on the event loop.

        Returns (keys, more): ``more`` says a further call may return more.
        """
        now = self.now_ms()
        keys: list[bytes] = []
        with self.txn_lock, self.env.begin(db=h.db, buffers=True) as txn:
            for key, _raw in _live_in_range(txn, where, now):
                if len(keys) == limit:
                    return keys, True
                keys.append(key)
        return keys, False

    def last_key(self, h: BucketHandle) -> bytes | None:
        """The bucket's greatest key, live or not (Redis RANDOMKEY's upper bound)."""
        with self.txn_lock, self.env.begin(db=h.db, buffers=True) as txn, txn.cursor() as cur:
            return bytes(cur.key()) if cur.last() else None

    def next_expiry_ms(self) -> int | None:
        """When the earliest record with an expiry expires (wall-clock ms), from the
        head of the sorted expiry index; None when no record has one."""
        with self.txn_lock, self.env.begin(db=self.expiry) as txn:
            cur = txn.cursor()
            if not cur.first():
                return None
            return records.parse_expiry_key(bytes(cur.key()))[0]

    def bucket_entries(self, bucket: str) -> int:
        h = self.bucket(bucket)
        with self.txn_lock, self.env.begin() as txn:
            return int(txn.stat(h.db)["entries"])

    def system_items(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        with self.txn_lock, self.env.begin(db=self.system) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    yield key[len(prefix) :], msgpack.unpackb(value)

    def system_get(self, key: bytes) -> Any:
        with self.txn_lock, self.env.begin(db=self.system) as txn:
            raw = txn.get(key)
        return None if raw is None else msgpack.unpackb(raw)

    # -- map size ----------------------------------------------------------

    def open_bucket(self, name: str, props: dict[str, Any]) -> BucketHandle | None:
        """This process's handle of a bucket another process created (``serve
        --workers N``); None if it is gone again. LMDB shares a database handle
        with later transactions only when the transaction that opened it
        commits, and a read-only one does not: so it is opened in a short write
        transaction that writes nothing (it waits for a commit in progress, a
        few ms at most). Only for a process whose writes go elsewhere: it must
        not have a write transaction of its own open."""
        try:
            db = self.env.open_db(BUCKET_DB_PREFIX + name.encode(), create=False)
        except lmdb.NotFoundError:
            return None
        return BucketHandle(name, db, dict(props))

    def reserve_cas_block(self, txn: lmdb.Transaction, n: int = 1) -> None:
        """Reserve the next ``CAS_BLOCK`` CAS values (``n`` if more: a run of
        writes takes its values together) in the write transaction ``txn``.

        The ceiling is read from the system record, not from memory: worker
        processes sharing the environment take their blocks one after another
        (LMDB runs one write transaction at a time across processes), so CAS
        values stay unique node-wide. The writer puts the counters back if the
        transaction aborts.
        """
        raw = txn.get(CAS_KEY, db=self.system)
        base = max(int(raw) if raw else 0, self.cas_ceiling)
        self.cas_counter = base
        self.cas_ceiling = base + max(CAS_BLOCK, n)
        txn.put(CAS_KEY, str(self.cas_ceiling).encode(), db=self.system)

    def adopt_map_size(self) -> None:
        """Another process grew the map: map the size it set (``set_mapsize(0)``).
        Called by the writer between transactions; inline readers wait on
        ``txn_lock`` meanwhile."""
        with self.txn_lock:
            self.env.set_mapsize(0)
        log.info("adopted the map size another worker set: %d bytes", self.env.info()["map_size"])

    def map_usage(self) -> tuple[int, int]:
        """(bytes used, map size)."""
        info = self.env.info()
        psize = self.env.stat()["psize"]
        return (info["last_pgno"] + 1) * psize, info["map_size"]

    def copy_to(self, path: str) -> None:
        """A consistent, compacted copy of the environment into ``path`` (an empty
        directory): an online backup, run on a worker thread while reads and writes
        go on. LMDB cannot remap the map under the copy's read transaction (py-lmdb
        makes ``set_mapsize`` wait for the copy), so map growth waits for running
        copies *before* it takes ``txn_lock``: inline readers never queue behind a copy.
        """
        with self._copies_done:
            self._copies += 1
        try:
            self.env.copy(path, compact=True)
        finally:
            with self._copies_done:
                self._copies -= 1
                self._copies_done.notify_all()

    def _set_mapsize(self, new: int) -> None:
        with self._copies_done:
            while self._copies:
                self._copies_done.wait()
            with self.txn_lock:
                self.env.set_mapsize(new)

    def maybe_grow(self, extra: int = 0) -> bool:
        """Grow the map when it is 3/4 full (or cannot hold ``extra`` more bytes).

        Called by the writer between transactions. Raises StorageFull when the
        configured ``max_map_size`` is reached or the disk cannot hold more.
        """
        used, size = self.map_usage()
        want = used + 2 * extra
        if want * 4 < size * 3 or self._copies:
            return False  # (during a copy, only a full map grows: force_grow waits for it)
        new = max(size * 2, want * 2)
        if self.max_map_size:
            if size >= self.max_map_size:
                if used + extra >= size:
                    raise errors.StorageFull(
                        f"map is full at max_map_size={self.max_map_size} bytes"
                    )
                return False
            new = min(new, self.max_map_size)
        self._set_mapsize(new)
        return True

    def force_grow(self, extra: int) -> None:
        """After a MapFullError: grow so that at least ``extra`` more bytes fit."""
        used, size = self.map_usage()
        new = max(size * 2, (used + extra) * 2)
        if self.max_map_size:
            if size >= self.max_map_size:
                raise errors.StorageFull(f"map is full at max_map_size={self.max_map_size} bytes")
            new = min(new, self.max_map_size)
        self._set_mapsize(new)

    # -- disk space ----------------------------------------------------------

    def disk_free_bytes(self) -> int | None:
        """Bytes this process may still write on the data directory's filesystem."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserve
        return blocks * st.f_frsize


def is_disk_full(exc: BaseException) -> bool:
    """Did this storage error come from a full disk (or quota)?

    LMDB reports a short ``pwrite`` — what a full filesystem causes — as EIO
    (``mdb_txn_commit: Input/output error``), the same as a real I/O error;
    the two are told apart by the free space left where the data lives.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc).lower()
    if "no space left" in text or "disk quota" in text:
        return True
    if (isinstance(exc, OSError) and exc.errno == errno.EIO) or "input/output error" in text:
        for engine in list(_open_engines):
            free = engine.disk_free_bytes()
            if free is not None and free < DISK_FULL_SLACK_BYTES:
                return True
    return False


# -- opening a data directory -------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return " ".join(str(text).split())


def lock_data_dir(path: str) -> int:
    """Create ``path`` if needed, check it, and take its exclusive lock; returns the fd."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        raise DataDirError("it exists and is not a directory") from None
    except OSError as exc:
        raise DataDirError(f"cannot create it: {_one_line(exc)}") from None
    if not os.path.isdir(path):
        raise DataDirError("it is not a directory")
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise DataDirError("permission denied: the server needs to read and write it")
    mode = os.stat(path).st_mode & 0o777
    if mode != 0o700:
        # Users' password hashes and every tenant's data live here: the server's
        # user only, as a new directory is made (an existing one may be 0755).
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            raise DataDirError(
                f"it is mode {mode:o} and cannot be made 0700: {_one_line(exc)}"
            ) from None
        log.warning("data directory %s was mode %o; made it 0700", path, mode)
    lock_path = os.path.join(path, LOCK_FILE)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DataDirError(f"cannot open its lock file {LOCK_FILE}: {_one_line(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirError(
                f"another process{holder} is using it: only one tenantkv server may "
                "open a data directory at a time"
            ) from None
        raise DataDirError(f"cannot lock it: {_one_line(exc)}") from None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


#: Free space the server needs to open its files: LMDB's lock file (its reader
#: table, mapped into memory) and the first pages of the data file. Small on
#: purpose: a server on a nearly full disk must still start (reads, deletes).
MIN_FREE_BYTES = 256 * 1024
#: LMDB's lock file for 256 readers is ~16 KiB; reserved a little larger.
LOCK_FILE_RESERVE = 64 * 1024


def _reserve_space(path: str) -> None:
    """Check free space and allocate LMDB's lock file before LMDB maps it.

    LMDB maps ``lock.mdb`` into memory and writes through the mapping: on a full
    filesystem the first touch of an unbacked page is a SIGBUS that kills the
    server without a word. Allocating the file's blocks first (posix_fallocate)
    turns that into ENOSPC here, where it becomes one clear error line.
    """
    try:
        st = os.statvfs(path)
        free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    except OSError:
        free = None
    if free is not None and free < MIN_FREE_BYTES:
        raise DataDirError(
            f"its filesystem has only {free // 1024} KiB free; the server needs at least "
            f"{MIN_FREE_BYTES // 1024} KiB to open its files (disk full?)"
        )
    lock = os.path.join(path, "lock.mdb")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DataDirError(f"cannot create lock.mdb: {_one_line(exc)}") from None
    try:
        os.posix_fallocate(fd, 0, LOCK_FILE_RESERVE)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataDirError(
                f"no space to allocate lock.mdb: {_one_line(exc)} (disk full?)"
            ) from None
        # EOPNOTSUPP and friends: the filesystem cannot preallocate; go on.
    finally:
        os.close(fd)


def _check_format(raw: bytes | None) -> int:
    """The format version stored in the system database (1 when absent: before versioning)."""
    if raw is None:
        return 1
    try:
        version = int(raw)
    except ValueError:
        raise DataDirError(
            f"unrecognised format version {raw[:32]!r} in its system database"
        ) from None
    if version > FORMAT_VERSION:
        raise DataDirError(
            f"it holds data format version {version}, newer than this tenantkv reads "
            f"(up to {FORMAT_VERSION}); run a newer tenantkv on it"
        )
    if version < 1:
        raise DataDirError(f"unrecognised format version {version} in its system database")
    return version


def _live_records(txn: lmdb.Transaction, keys: list[bytes], now: int) -> Iterator[Any]:
    """Each key's stored record as the transaction gives it, or None where there
    is none or it expired at ``now`` (wall-clock ms; read from the header alone)."""
    for key in keys:
        raw = txn.get(key)
        if raw is not None:
            expiry_ms = records.unpack_header(raw)[1]
            if expiry_ms and expiry_ms <= now:
                raw = None
        yield raw


def _live_in_range(txn: lmdb.Transaction, where: KeyRange, now: int) -> Iterator[tuple[bytes, Any]]:
    """``(key, stored record)`` of ``where``, in key order, from ``txn``'s database,
    passing over the records expired at ``now`` (wall-clock ms; read from the
    header alone). Records as the transaction gives them: views in a
    ``buffers=True`` one; keys always copied."""
    start, end, after = where.start, where.end, where.after
    cur = txn.cursor()
    seek = start
    if after is not None and after >= seek:
        seek = after
    if not cur.set_range(seek):
        return
    for view, raw in cur:
        key = bytes(view)
        if after is not None and key <= after:
            continue
        if end is not None and key >= end:
            return
        expiry_ms = records.unpack_header(raw)[1]
        if expiry_ms and expiry_ms <= now:
            continue
        yield key, raw
