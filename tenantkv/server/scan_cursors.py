"""SCAN cursors that fit Redis clients: 64-bit numbers naming a resume key.

tenantkv scans a bucket in key order, and where a scan stopped is a key (up to
250 bytes), which no 64-bit integer can spell. Redis clients need the cursor
to be a decimal in [0, 2^64) (redis-cli reads it with ``strtoull``), so each
SCAN page that is not the last stores its resume key here under a fresh
number, and the next call looks it up. A scan resumes just after the last key
it returned, so a key present for the whole scan is returned exactly once.

Bounded and forgetful: at most :data:`MAX_CURSORS` entries in the process
(~250 bytes of key each, ~6 MB at most), at most :data:`MAX_PER_BUCKET` per
bucket, the oldest dropped first — a tenant that opens many scans drops its
own oldest cursors before anyone else's. Nothing survives a restart. Numbers
are drawn from a random 62-bit start per process, so a cursor from before a
restart, from another worker process or evicted is unknown (``invalid
cursor``) rather than another scan's position; a cursor names its bucket, so
it never resumes a scan of another bucket. Issued cursors are below 2^63:
a larger one (``SCAN -1`` reads as 2^64 - 1, as ``strtoul`` reads it) names
no position, and the scan it asks for is already over.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from dataclasses import dataclass

from tenantkv import errors

MAX_CURSORS = 16_384
MAX_PER_BUCKET = 1_024
#: Cursors at or above this are never issued: past the end of any scan.
END = 2**63
_STRTOUL = re.compile(rb"[+-]?[0-9]*")


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
    """The process's table of resume keys by cursor number (see the module)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._next = self._rng.randrange(1, 2**62)
        self._entries: dict[int, tuple[str, bytes]] = {}
        self._by_bucket: dict[str, OrderedDict[int, None]] = {}
        self.issued = 0
        self.evicted = 0

    def issue(self, bucket: str, after: bytes) -> int:
        """A new cursor resuming ``bucket``'s scan after the key ``after``."""
        own = self._by_bucket.setdefault(bucket, OrderedDict())
        if len(own) >= MAX_PER_BUCKET:
            self._drop(next(iter(own)))
        elif len(self._entries) >= MAX_CURSORS:
            self._drop(next(iter(self._entries)))
        n = self._next
        self._next = n + 1 if n + 1 < END else 1
        self._entries[n] = (bucket, after)
        own = self._by_bucket.setdefault(bucket, OrderedDict())
        own[n] = None
        self.issued += 1
        return n

    def resume(self, bucket: str, cursor: int) -> bytes:
        """The key a scan of ``bucket`` resumes after; BadValue if the cursor is unknown
        here (never issued, evicted, another process's or another bucket's)."""
        entry = self._entries.get(cursor)
        if entry is None or entry[0] != bucket:
            raise errors.BadValue(
                "invalid cursor (unknown or expired here: start the SCAN again from 0)"
            )
        return entry[1]

    def _drop(self, n: int) -> None:
        bucket, _ = self._entries.pop(n)
        own = self._by_bucket[bucket]
        del own[n]
        if not own:
            del self._by_bucket[bucket]
        self.evicted += 1

    def statistics(self) -> CursorStatistics:
        return CursorStatistics(len(self._entries), len(self._by_bucket), self.issued, self.evicted)


#: The table every connection of this process shares: a pool's connections see
#: each other's cursors.
CURSORS = ScanCursors()
