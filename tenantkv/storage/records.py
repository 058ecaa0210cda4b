"""The on-disk record: a fixed header (CAS, expiry, flags) followed by the value.

Kept as raw bytes rather than MessagePack so a read decodes with one
``struct.unpack_from`` and a slice, and the metered size is exact.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

# cas u64, expiry in epoch milliseconds u64 (0 = never), client flags u32
HEADER = struct.Struct(">QQI")
HEADER_BYTES = HEADER.size

# Expiry index key: expiry ms u64, bucket-name length u8, bucket name, key.
_EXP = struct.Struct(">QB")


class Record(NamedTuple):
    """A decoded record (a NamedTuple: it is built on every read, and a tuple
    is several times cheaper to construct than a frozen dataclass)."""

    value: bytes
    cas: int
    expiry_ms: int
    flags: int

    @property
    def stored_bytes(self) -> int:
        """Bytes this record occupies besides its key (metered as value + metadata)."""
        return HEADER_BYTES + len(self.value)

    def live(self, now_ms: int) -> bool:
        return self.expiry_ms == 0 or self.expiry_ms > now_ms


def encode(value: bytes, cas: int, expiry_ms: int, flags: int) -> bytes:
    return HEADER.pack(cas, expiry_ms, flags) + value


#: (cas, expiry_ms, flags) of a stored record
unpack_header = HEADER.unpack_from


def decode(raw: bytes | memoryview) -> Record:
    cas, expiry_ms, flags = unpack_header(raw)
    return Record(bytes(raw[HEADER_BYTES:]), cas, expiry_ms, flags)


def live_value(raw: bytes | memoryview, now_ms: Callable[[], int]) -> bytes | None:
    """A stored record's value, or None when it has expired (Redis GET's read)."""
    expiry_ms = unpack_header(raw)[1]
    if expiry_ms and expiry_ms <= now_ms():
        return None
    return bytes(raw[HEADER_BYTES:])


def expiry_key(expiry_ms: int, bucket: str, key: bytes) -> bytes:
    b = bucket.encode()
    return _EXP.pack(expiry_ms, len(b)) + b + key


def parse_expiry_key(raw: bytes) -> tuple[int, str, bytes]:
    expiry_ms, blen = _EXP.unpack_from(raw)
    start = _EXP.size
    return expiry_ms, raw[start : start + blen].decode(), raw[start + blen :]


def expiry_prefix_upto(now_ms: int) -> bytes:
    """Index keys strictly below this have expired by ``now_ms``."""
    return _EXP.pack(now_ms + 1, 0)[:8]
