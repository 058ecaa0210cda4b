"""Hash slots as Redis Cluster has them: ``CRC16(key) mod 16384``.

CRC16 is the XMODEM variant (polynomial 0x1021, initial value 0), and a key
with a ``{hashtag}`` hashes only the tag: the bytes between the first ``{``
and the first ``}`` after it, when there are any. Redis cluster clients
compute the same slot, so they route to the same node as the bundled client.
"""

from __future__ import annotations

SLOTS = 16384


def _table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16_TABLE = _table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM of ``data`` (``crc16(b"123456789") == 0x31C3``)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16_TABLE[(crc >> 8) ^ byte]
    return crc


def hash_part(key: bytes) -> bytes:
    """What of ``key`` is hashed: its ``{hashtag}`` if it has a non-empty one,
    else the whole key (Redis's rule: first ``{``, then the first ``}`` after it)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_slot(key: bytes) -> int:
    """The slot of ``key``, 0 to 16383."""
    return crc16(hash_part(key)) & (SLOTS - 1)
