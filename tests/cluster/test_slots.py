"""Slots agree with Redis Cluster's specification and its published vectors."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tenantkv.cluster.slots import SLOTS, crc16, hash_part, key_slot


def test_crc16_check_value() -> None:
    # The CRC16-XMODEM check value, as the Redis Cluster spec gives it.
    assert crc16(b"123456789") == 0x31C3
    assert crc16(b"") == 0


def test_known_slots() -> None:
    # Slots Redis itself answers (CLUSTER KEYSLOT).
    assert key_slot(b"foo") == 12182
    assert key_slot(b"bar") == 5061
    assert key_slot(b"somekey") == 11058
    assert key_slot(b"123456789") == 0x31C3 % SLOTS


def test_hashtag_rule() -> None:
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers")
    assert key_slot(b"{user1000}.following") == key_slot(b"user1000")
    assert hash_part(b"foo{}{bar}") == b"foo{}{bar}"  # an empty tag: the whole key
    assert hash_part(b"foo{{bar}}zap") == b"{bar"
    assert hash_part(b"foo{bar}{zap}") == b"bar"  # only the first tag counts
    assert hash_part(b"foo{bar") == b"foo{bar"  # no closing brace
    assert hash_part(b"}foo{bar}") == b"bar"


@given(st.binary(max_size=64))
def test_same_slot_as_redis_py(key: bytes) -> None:
    # redis-py's RedisCluster routes by its own implementation: agree with it.
    from redis.crc import key_slot as redis_key_slot

    assert key_slot(key) == redis_key_slot(key)
    assert 0 <= key_slot(key) < SLOTS


@given(st.binary(min_size=1, max_size=32).filter(lambda k: b"}" not in k))
def test_a_tag_hashes_as_the_bare_key(tag: bytes) -> None:
    assert key_slot(b"{" + tag + b"}:suffix") == key_slot(tag)
