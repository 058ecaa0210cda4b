"""The wire form of every write kind, byte for byte: a worker and the node's writer
of another release must read each other's writes, and fields travel positionally
(``storage/op_wire.py``), so a reordered field — one moved into a shared base
class, say — would silently swap values. The expected bytes were taken from the
release before the op classes shared a base."""

from __future__ import annotations

import msgpack
import pytest

from tenantkv.storage.op_wire import _FIELDS, op_to_wire
from tests.unit.test_op_wire import _samples

#: Each kind's fields, in wire order.
FIELDS = {
    "SetOp": ("bucket", "key", "value", "ttl", "flags", "cas", "mode", "nbytes"),
    "DeleteOp": ("bucket", "key", "cas", "nbytes"),
    "TouchOp": ("bucket", "key", "ttl", "nbytes"),
    "CounterOp": ("bucket", "key", "delta", "initial", "ttl", "nbytes"),
    "CreateBucketOp": ("name", "props", "exempt"),
    "DropBucketOp": ("handle", "system_puts", "exempt"),
    "PutSystemOp": ("key", "value", "expect", "exempt", "on_absent", "on_present", "what"),
    "ExpireDueOp": ("limit", "exempt", "removed"),
    "StringSetOp": ("bucket", "key", "value", "expiry", "only", "nbytes", "get", "reply_hint"),
    "MultiSetOp": ("bucket", "pairs", "only_new", "nbytes", "record_bytes"),
    "MultiDeleteOp": ("bucket", "keys", "nbytes", "record_bytes"),
    "GetDelOp": ("bucket", "key", "nbytes", "reply_hint"),
    "GetExOp": ("bucket", "key", "expiry", "nbytes", "reply_hint"),
    "ExpireOp": ("bucket", "key", "expiry", "only", "nbytes"),
    "IncrByOp": ("bucket", "key", "delta", "nbytes"),
    "AppendOp": ("bucket", "key", "value", "max_value_bytes", "nbytes"),
    "FlushOp": ("bucket", "nbytes"),
    "SetRangeOp": ("bucket", "key", "offset", "value", "max_value_bytes", "reply_hint", "nbytes"),
    "SetBitOp": ("bucket", "key", "offset", "bit", "reply_hint", "nbytes"),
    "IncrByFloatOp": ("bucket", "key", "incr", "nbytes"),
    "BitOpOp": (
        "bucket",
        "op",
        "dest",
        "keys",
        "max_value_bytes",
        "reply_hint",
        "nbytes",
        "record_bytes",
    ),
    "MoveOp": (
        "bucket",
        "source",
        "dest",
        "keep_source",
        "replace",
        "reply_hint",
        "nbytes",
        "record_bytes",
    ),
    "BitFieldOp": ("bucket", "key", "fops", "reply_hint", "nbytes"),
    "TransactionOp": (
        "bucket",
        "steps",
        "watches",
        "max_value_bytes",
        "nbytes",
        "deletes",
        "probe",
    ),
}

#: The packed ``op_to_wire`` of each sample in ``test_op_wire._samples``.
PACKED = {
    "SetOp": "92a55365744f7098a162c4016bc40176cb3ff80000000000000703a361646400",
    "DeleteOp": "92a844656c6574654f7094a162c4016b0900",
    "TouchOp": "92a7546f7563684f7094a162c4016b0200",
    "CounterOp": "92a9436f756e7465724f7096a162c4016e05010000",
    "CreateBucketOp": "92ae4372656174654275636b65744f7093a26e6282aa637265617465645f6d7301a87468726f74746c6581a8726573657276656400c3",  # noqa: E501
    "DropBucketOp": "92ac44726f704275636b65744f7093a16281c406757365723a7881a5726f6c657380c3",
    "PutSystemOp": "92ab50757453797374656d4f7097c406757365723a7881a16101a6616273656e74c3010da475736572",  # noqa: E501
    "ExpireDueOp": "92ab4578706972654475654f70930ac300",
    "StringSetOp": "92ab537472696e675365744f7098a162c4016bc4017692a872656c6174697665cd03e8a26e7800c200",  # noqa: E501
    "MultiSetOp": "92aa4d756c74695365744f7095a1629292c40161c4013192c40162c40132c30090",
    "MultiDeleteOp": "92ad4d756c746944656c6574654f7094a16292c40161c401620090",
    "GetDelOp": "92a847657444656c4f7094a162c4016b0000",
    "GetExOp": "92a747657445784f7095a162c4016b92a86162736f6c757465050000",
    "ExpireOp": "92a84578706972654f7095a162c4016b92a872656c61746976650a92a26774a26e7800",
    "IncrByOp": "92a8496e637242794f7094a162c4016efd00",
    "AppendOp": "92a8417070656e644f7095a162c4016bc4046d6f72656400",
    "FlushOp": "92a7466c7573684f7092a16200",
    "SetRangeOp": "92aa53657452616e67654f7097a162c4016b03c403616263640500",
    "SetBitOp": "92a85365744269744f7096a162c4016b09010000",
    "IncrByFloatOp": "92ad496e63724279466c6f61744f7094a162c40166c403312e3500",
    "BitOpOp": "92a74269744f704f7098a162a3786f72c4016492c40161c4016264000090",
    "MoveOp": "92a64d6f76654f7098a162c40161c40162c3c2000090",
    "BitFieldOp": "92aa4269744669656c644f7095a162c4016b9196a6696e63726279c3080005a37361740000",
    "TransactionOp": "92ad5472616e73616374696f6e4f7097a162909193a162c4016b0764009090",
}


def test_every_kind_keeps_its_fields_in_order() -> None:
    assert {cls.__name__: tuple(f.name for f in fs) for cls, fs in _FIELDS.items()} == FIELDS


@pytest.mark.parametrize("op", _samples(), ids=lambda op: type(op).__name__)
def test_every_kind_packs_to_the_same_bytes(op: object) -> None:
    assert msgpack.packb(op_to_wire(op)).hex() == PACKED[type(op).__name__]  # type: ignore[arg-type]


def test_every_kind_has_a_sample() -> None:
    assert {type(op).__name__ for op in _samples()} == set(FIELDS)
