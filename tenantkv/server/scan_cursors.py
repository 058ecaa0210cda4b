"""SCAN cursors that fit Redis clients: 64-bit numbers naming a resume key.

tenantkv scans a bucket in key order, and where a scan stopped is a key (up to
250 bytes), which no 64-bit integer can spell. Redis clients need the cursor
to be a decimal in [0, 2^64) (redis-cli reads it with ``strtoull``), so each
SCAN page that is not the last stores its resume key in a slot of a table,
and the cursor names the slot. A scan resumes just after the last key it
returned, so a key present for the whole scan is returned exactly once.

The table is shared by every process serving the data directory: each process
writes the slots of its own file, ``<data-dir>/scan-cursors/<pid>`` (mapped in
memory: :data:`SLOTS` slots of :data:`SLOT_BYTES`, ~6 MB, mostly never
touched), and reads any process's. So a cursor from one connection works on
any other connection to the same bucket, whichever worker of ``serve
--workers N`` serves it (connection pools). A cursor is::

    pid (22 bits) | slot (14 bits) | generation (27 bits)      < 2^63

Bounded and forgetful: a process keeps at most :data:`SLOTS` cursors and at
most :data:`MAX_PER_BUCKET` per bucket, the oldest reused first — a tenant
that opens many scans reuses its own oldest slots before anyone else's.
Nothing survives the process: its file is swept once the process is gone.
Generations start at a random number per process and a slot keeps the one it
was written with, so a cursor whose slot was reused, whose process is gone,
or which was never issued is unknown (``invalid cursor``) rather than another
scan's position; a slot names its bucket, so a cursor never resumes a scan of
another bucket. A cursor of 2^63 or more is never issued: it names no
position, and the scan it asks for is over (``SCAN -1`` reads as 2^64 - 1, as
``strtoul`` reads it).

A slot is read without a lock: its writer clears the generation, writes the
entry, then writes the generation; a reader checks the generation before and
after copying the entry (a seqlock), so it never takes a half-written entry.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import random
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass

from tenantkv import errors

SLOTS = 16_384
MAX_PER_BUCKET = 1_024
#: generation (8), bucket length (1), key length (2), bucket (<= 100), key (<= 250)
SLOT_BYTES = 384
_HEAD = struct.Struct(">QBH")
_PID_BITS, _SLOT_BITS, _GEN_BITS = 22, 14, 27
_GEN_MASK = (1 << _GEN_BITS) - 1
#: Cursors at or above this are never issued: past the end of any scan.
END = 2**63
#: Other processes' files kept mapped at once (each mapping is a file descriptor).
MAX_PEERS = 64
DIRECTORY = "scan-cursors"
log = logging.getLogger("tenantkv.session")
_STRTOUL = re.compile(rb"[+-]?[0-9]*")
UNKNOWN = "invalid cursor (unknown or expired: start the SCAN again from 0)"


def parse_cursor(arg: bytes) -> int:
    """A cursor as Redis reads it (``strtoul``: a sign allowed, a negative one
    wraps modulo 2^64, an empty one is 0; no spaces; out of range refused)."""
    if not _STRTOUL.fullmatch(arg) or arg in (b"+", b"-"):
        raise errors.BadValue("invalid cursor")
    if not arg:
        return 0
    n = int(arg)
    if abs(n) >= 2**64:
        raise errors.BadValue("invalid cursor")
    return n % 2**64


@dataclass(frozen=True, slots=True)
class CursorStatistics:
    entries: int
    buckets: int
    issued: int
    evicted: int


class ScanCursors:
    """One process's slots of the cursor table of a data directory (see the module).

    ``directory`` None keeps the slots in anonymous memory: no other process
    can read them (a table for tests)."""

    def __init__(
        self,
        directory: str | None = None,
        *,
        pid: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        if not 0 < self.pid < 1 << _PID_BITS:
            raise ValueError(f"pid {self.pid} does not fit a cursor")
        self.directory = directory
        self._rng = rng or random.Random()
        self._gen = self._rng.randrange(1, _GEN_MASK)
        self._map = self._own_map()
        #: slot -> bucket, oldest first; per bucket, its slots oldest first
        self._slots: OrderedDict[int, str] = OrderedDict()
        self._by_bucket: dict[str, OrderedDict[int, None]] = {}
        self._free = list(range(SLOTS - 1, -1, -1))
        self._peers: OrderedDict[int, mmap.mmap] = OrderedDict()
        self.issued = 0
        self.evicted = 0

    def _own_map(self) -> mmap.mmap:
        if self.directory is None:
            return mmap.mmap(-1, SLOTS * SLOT_BYTES)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        _sweep(self.directory, self.pid)
        path = os.path.join(self.directory, str(self.pid))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOTS * SLOT_BYTES)
            return mmap.mmap(fd, SLOTS * SLOT_BYTES)
        finally:
            os.close(fd)

    def issue(self, bucket: str, after: bytes) -> int:
        """A new cursor resuming ``bucket``'s scan after the key ``after``."""
        own = self._by_bucket.get(bucket)
        if own is not None and len(own) >= MAX_PER_BUCKET:
            self._drop(next(iter(own)))
        elif not self._free:
            self._drop(next(iter(self._slots)))
        slot = self._free.pop()
        gen = self._gen
        self._gen = gen + 1 if gen + 1 <= _GEN_MASK else 1
        name = bucket.encode()
        off = slot * SLOT_BYTES
        m = self._map
        m[off : off + 8] = bytes(8)  # (cleared first: a reader never takes a half-written slot)
        body = _HEAD.pack(0, len(name), len(after))[8:] + name + after
        m[off + 8 : off + 8 + len(body)] = body
        m[off : off + 8] = gen.to_bytes(8, "big")
        self._slots[slot] = bucket
        self._by_bucket.setdefault(bucket, OrderedDict())[slot] = None
        self.issued += 1
        return (self.pid << (_SLOT_BITS + _GEN_BITS)) | (slot << _GEN_BITS) | gen

    def resume(self, bucket: str, cursor: int) -> bytes:
        """The key a scan of ``bucket`` resumes after; BadValue if the cursor is
        unknown (never issued, its slot reused, its process gone, another bucket's)."""
        pid = cursor >> (_SLOT_BITS + _GEN_BITS)
        slot = (cursor >> _GEN_BITS) & ((1 << _SLOT_BITS) - 1)
        gen = cursor & _GEN_MASK
        m = self._map if pid == self.pid else self._peer(pid)
        entry = None if m is None or not gen else _read_slot(m, slot, gen)
        if entry is None or entry[0] != bucket.encode():
            raise errors.BadValue(UNKNOWN)
        return entry[1]

    def _peer(self, pid: int) -> mmap.mmap | None:
        """Another process's slots, mapped read-only (None: no such process here)."""
        m = self._peers.get(pid)
        if m is not None:
            self._peers.move_to_end(pid)
            return m
        if self.directory is None or pid <= 0:
            return None
        try:
            fd = os.open(os.path.join(self.directory, str(pid)), os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < SLOTS * SLOT_BYTES:
                return None
            m = mmap.mmap(fd, SLOTS * SLOT_BYTES, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._peers[pid] = m
        if len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)[1].close()
        return m

    def _drop(self, slot: int) -> None:
        bucket = self._slots.pop(slot)
        own = self._by_bucket[bucket]
        del own[slot]
        if not own:
            del self._by_bucket[bucket]
        off = slot * SLOT_BYTES
        self._map[off : off + 8] = bytes(8)
        self._free.append(slot)
        self.evicted += 1

    def statistics(self) -> CursorStatistics:
        return CursorStatistics(len(self._slots), len(self._by_bucket), self.issued, self.evicted)


def _read_slot(m: mmap.mmap, slot: int, gen: int) -> tuple[bytes, bytes] | None:
    """(bucket, key) of a slot written with generation ``gen``, else None."""
    off = slot * SLOT_BYTES
    raw = m[off : off + SLOT_BYTES]
    stored, blen, klen = _HEAD.unpack_from(raw)
    if stored != gen or 11 + blen + klen > SLOT_BYTES:
        return None
    entry = raw[11 : 11 + blen], raw[11 + blen : 11 + blen + klen]
    if int.from_bytes(m[off : off + 8], "big") != gen:
        return None  # rewritten while it was copied
    return entry


def _sweep(directory: str, me: int) -> None:
    """Remove the files of processes that are gone (and this pid's old one)."""
    for name in os.listdir(directory):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid != me:
            try:
                os.kill(pid, 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # alive, another user's
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, name))


_TABLES: dict[tuple[str, int], ScanCursors] = {}


def cursors(data_dir: str) -> ScanCursors:
    """This process's table for ``data_dir``, made on first use (a forked child
    makes its own: the table is keyed by pid too)."""
    key = (data_dir, os.getpid())
    table = _TABLES.get(key)
    if table is None:
        try:
            table = ScanCursors(os.path.join(data_dir, DIRECTORY))
        except OSError as exc:  # (a full disk, a read-only directory: this process's own)
            log.warning("SCAN cursors kept in this process only: %s", exc)
            table = ScanCursors()
        _TABLES[key] = table
    return table
