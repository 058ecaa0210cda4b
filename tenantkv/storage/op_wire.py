"""Write operations as plain data: how a worker hands its writes to the node's writer.

With ``serve --workers N`` one group-commit writer, in the supervisor, commits
the writes of every worker, so that one transaction and one fsync serve them
all (ops per commit do not fall as workers are added). A worker sends each
:class:`~tenantkv.storage.ops.WriteOp` as ``[kind, [field values]]`` — the
dataclass's own fields, in order — and gets back ``[result, error, nbytes,
record_bytes]``: what ``apply`` returned or raised, and the metering fields
``apply`` filled in (the worker charges the throttle from them).

Values that are not plain data go as tagged maps: a bucket by name (each
process holds its own LMDB handle), an expiry, an error class, a frozenset.
Results are plain data already, except the handle of a created
bucket, which goes as ``None``: the worker opens the bucket in its own
environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tenantkv import errors
from tenantkv.storage import ops, string_ops, value_ops
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.string_ops import Expiry
from tenantkv.storage.transaction_ops import ReadStep, TransactionOp, read_handler

#: Every operation a worker may send, by its wire kind (the class name).
KINDS: dict[str, type[ops.WriteOp]] = {
    cls.__name__: cls
    for cls in (
        ops.SetOp,
        ops.DeleteOp,
        ops.TouchOp,
        ops.CounterOp,
        ops.CreateBucketOp,
        ops.DropBucketOp,
        ops.PutSystemOp,
        ops.ExpireDueOp,
        string_ops.StringSetOp,
        string_ops.MultiSetOp,
        string_ops.MultiDeleteOp,
        string_ops.GetDelOp,
        string_ops.GetExOp,
        string_ops.ExpireOp,
        string_ops.IncrByOp,
        string_ops.AppendOp,
        string_ops.FlushOp,
        value_ops.SetRangeOp,
        value_ops.SetBitOp,
        value_ops.IncrByFloatOp,
        value_ops.BitOpOp,
        value_ops.MoveOp,
        value_ops.BitFieldOp,
    )
}
#: Each kind's fields (those a caller sets), in order: sent positionally.
_FIELDS: dict[type[ops.WriteOp], tuple[dataclasses.Field[Any], ...]] = {
    cls: tuple(f for f in dataclasses.fields(cls) if f.init)  # type: ignore[arg-type]
    for cls in KINDS.values()
}
_ERROR_CLASSES = errors.error_classes()

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any, Callable[[str], BucketHandle]], Any]


def _codec(f: dataclasses.Field[Any]) -> tuple[Encoder, Decoder] | None:
    """How a field travels, from its declared type (None: as it is)."""
    kind = str(f.type)
    if "BucketHandle" in kind:
        return (lambda h: h.name), (lambda name, bucket: bucket(name))
    if "Expiry" in kind:
        return (lambda e: [e.mode, e.ms]), (lambda v, _: Expiry(v[0], v[1]))
    if "frozenset" in kind:
        return (lambda v: sorted(v)), (lambda v, _: frozenset(v))
    if "ServerError" in kind:
        return (lambda cls: cls.code), (lambda code, _: _ERROR_CLASSES[code])
    if "tuple[bytes, bytes]" in kind:
        return (lambda pairs: [list(p) for p in pairs]), (lambda v, _: [tuple(p) for p in v])
    return None


#: Per kind: (index, encoder, decoder) of the fields that need converting.
_CODECS: dict[type[ops.WriteOp], list[tuple[int, Encoder, Decoder]]] = {
    cls: [(i, *c) for i, f in enumerate(fields) if (c := _codec(f)) is not None]
    for cls, fields in _FIELDS.items()
}


def op_to_wire(op: ops.WriteOp) -> list[Any]:
    cls = type(op)
    fields = _FIELDS.get(cls)
    if fields is None:
        raise TypeError(f"{cls.__name__} cannot be sent to the node's writer")
    values = [getattr(op, f.name) for f in fields]
    for i, encode, _ in _CODECS[cls]:
        values[i] = encode(values[i])
    return [cls.__name__, values]


def op_from_wire(data: Any, bucket: Callable[[str], BucketHandle]) -> ops.WriteOp:
    """The operation ``data`` describes; ``bucket`` gives this process's handle of
    a bucket by name (raising BucketNotFound). Malformed data raises ValueError."""
    if not isinstance(data, list) or len(data) != 2:
        raise ValueError("a write must be [kind, fields]")
    kind, values = data
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None or not isinstance(values, list) or len(values) != len(_FIELDS[cls]):
        raise ValueError(f"unknown write {kind!r} or wrong fields")
    for i, _, decode in _CODECS[cls]:
        values[i] = decode(values[i], bucket)
    return cls(*values)


@dataclasses.dataclass(slots=True, eq=False)
class RemoteBatchOp(ops.WriteOp):
    """One worker message of writes, queued for the node's writer as one item:
    applied in order in the commit's transaction, each with its own outcome
    (an error fails that write only, as in one process)."""

    writes: list[ops.WriteOp | errors.TenantKVError]
    exempt: bool = True
    #: buckets its writes created (the node's writer registers their handles)
    created: list[BucketHandle] = dataclasses.field(default_factory=list)

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return sum(op.size_hint for op in self.writes if isinstance(op, ops.WriteOp))

    @property
    def op_count(self) -> int:  # type: ignore[override]
        return len(self.writes)

    def apply(self, w: ops.WriteContext) -> Any:
        out: list[Any] = []
        self.created = []  # applied again if the transaction is retried
        for op in self.writes:
            if not isinstance(op, ops.WriteOp):  # it could not be decoded
                out.append([None, op.to_wire(), 0, []])
                continue
            try:
                result = op.apply(w)
            except errors.TenantKVError as exc:
                out.append(outcome_to_wire(op, None, exc))
            else:
                if isinstance(result, BucketHandle):
                    self.created.append(result)
                out.append(outcome_to_wire(op, result, None))
        return out


def outcome_to_wire(p_op: ops.WriteOp, result: Any, error: BaseException | None) -> list[Any]:
    if isinstance(result, BucketHandle):
        result = None  # the worker opens it in its own environment
    err: Any = None
    if error is not None:
        if not isinstance(error, errors.TenantKVError):
            error = errors.InternalError(f"storage failure: {error}")
        err = error.to_wire()
    return [result, err, p_op.nbytes, list(p_op.record_bytes)]


def apply_outcome(op: ops.WriteOp, data: Any) -> tuple[Any, BaseException | None]:
    """Set the metering fields ``apply`` filled in on the node's writer, and return
    ``(result, error)`` as the local writer would have."""
    result, err, nbytes, record_bytes = data
    op.nbytes = nbytes
    if record_bytes or op.record_bytes:
        op.record_bytes = list(record_bytes)
    if isinstance(op, ops.ExpireDueOp) and isinstance(result, Mapping):
        op.removed = int(result.get("removed", 0))
    return result, None if err is None else errors.from_wire(err)


# -- transactions (storage/transaction_ops.py): their steps are operations too -------


def _steps_to_wire(steps: list[Any]) -> list[Any]:
    return [
        ["ReadStep", [s.name, s.params]] if isinstance(s, ReadStep) else op_to_wire(s)
        for s in steps
    ]


def _steps_from_wire(data: Any, bucket: Callable[[str], BucketHandle]) -> list[Any]:
    """A transaction's steps: each a write a worker may send, or a read whose
    handler this process knows (a transaction inside one is malformed)."""
    if not isinstance(data, list):
        raise ValueError("a transaction's steps must be a list")
    steps: list[Any] = []
    for item in data:
        if isinstance(item, list) and len(item) == 2 and item[0] == "ReadStep":
            name, params = item[1]
            read_handler(name)  # (raises ValueError for an unknown one)
            steps.append(ReadStep(name, params))
        elif isinstance(item, list) and item and item[0] == TransactionOp.__name__:
            raise ValueError("a transaction cannot hold a transaction")
        else:
            steps.append(op_from_wire(item, bucket))
    return steps


KINDS[TransactionOp.__name__] = TransactionOp
_FIELDS[TransactionOp] = tuple(f for f in dataclasses.fields(TransactionOp) if f.init)
_CODECS[TransactionOp] = [
    (i, *c)
    for i, f in enumerate(_FIELDS[TransactionOp])
    if (c := _codec(f) or ((_steps_to_wire, _steps_from_wire) if f.name == "steps" else None))
]
