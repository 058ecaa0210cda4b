"""Write operations as plain data: how a worker hands its writes to the node's writer.

With ``serve --workers N`` one group-commit writer, in the supervisor, commits
the writes of every worker, so that one transaction and one fsync serve them
all (ops per commit do not fall as workers are added). A worker sends each
:class:`~tenantkv.storage.ops.WriteOp` as ``[kind, [field values]]`` — the
dataclass's own fields, in order — and gets back ``[result, error, nbytes,
record_bytes]``: what ``apply`` returned or raised, and the metering fields
``apply`` filled in (the worker charges the throttle from them).

A run of writes (:class:`~tenantkv.storage.ops.RunOp`, a connection's writes
admitted together) goes as one item, ``["run", [segment, ...]]``, each segment
its writes of one kind by field (:func:`_segment_to_wire`: the bucket once, the
keys and values as columns), and is applied there as a run, as the local
writer applies it (a run of plain sets is one ``putmulti``). Its answer is its
writes' outcomes by column, ``[results, errors, nbytes, record_bytes]``
(``errors`` and ``record_bytes`` None when every entry would be empty): one
list of each instead of a list per write.

Values that are not plain data go as tagged maps: a bucket by name (each
process holds its own LMDB handle), an expiry, an error class, a frozenset.
Results are plain data already, except the handle of a created
bucket, which goes as ``None``: the worker opens the bucket in its own
environment.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
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
        TransactionOp,
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
    if f.name == "steps":  # a transaction's (defined below: late-bound)
        return (lambda v: _steps_to_wire(v)), (lambda v, bucket: _steps_from_wire(v, bucket))
    if "tuple[bytes, bytes]" in kind:
        return (lambda pairs: [list(p) for p in pairs]), (lambda v, _: [tuple(p) for p in v])
    return None


#: Per kind: (index, encoder, decoder) of the fields that need converting.
_CODECS: dict[type[ops.WriteOp], list[tuple[int, Encoder, Decoder]]] = {
    cls: [(i, *c) for i, f in enumerate(fields) if (c := _codec(f)) is not None]
    for cls, fields in _FIELDS.items()
}
#: Per kind: the encoder of each field that needs converting, by index.
_ENCODERS: dict[type[ops.WriteOp], dict[int, Encoder]] = {
    cls: {i: encode for i, encode, _ in codecs} for cls, codecs in _CODECS.items()
}
#: Per kind: its fields' values as a tuple, in one C call (one is made per write).
_VALUES: dict[type[ops.WriteOp], Callable[[ops.WriteOp], tuple[Any, ...]]] = {
    cls: operator.attrgetter(*(f.name for f in fields))
    if len(fields) > 1
    # (one name: attrgetter returns the value itself)
    else (lambda op, name=fields[0].name: (getattr(op, name),))  # type: ignore[misc]
    for cls, fields in _FIELDS.items()
}
#: The wire kind of a run of writes (no write class has this name).
RUN = "run"


def op_to_wire(op: ops.WriteOp) -> list[Any]:
    cls = type(op)
    values_of = _VALUES.get(cls)
    if values_of is None:
        raise TypeError(f"{cls.__name__} cannot be sent to the node's writer")
    values = list(values_of(op))
    for i, encode, _ in _CODECS[cls]:
        values[i] = encode(values[i])
    return [cls.__name__, values]


def item_to_wire(op: ops.WriteOp) -> list[Any]:
    """A queued item: a write, or a run of writes as one (applied as a run)."""
    if isinstance(op, ops.RunOp):
        return [RUN, [_segment_to_wire(seg) for seg in _segments(op.ops)]]
    return op_to_wire(op)


def item_from_wire(data: Any, bucket: Callable[[str], BucketHandle]) -> ops.WriteOp:
    """The item ``data`` describes (:func:`item_to_wire`). Never raises: a write
    that cannot be decoded becomes a :class:`Refused` one, which fails in its
    place with the reason (a bucket not found, a malformed write)."""
    if type(data) is list and len(data) == 2 and data[0] == RUN and type(data[1]) is list:
        run = [op for seg in data[1] for op in _segment_from_wire(seg, bucket)]
        if run:
            return ops.RunOp(run, sum(op.size_hint for op in run))
    return _decoded(data, bucket)


#: Values a run's column may send once for all its writes: immutable, so the
#: writes that share one decoded value cannot change each other's. Not bytes:
#: keys and values always go as columns (equal values are a benchmark's case,
#: not a client's, and not worth comparing for).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _segments(writes: list[ops.WriteOp]) -> list[list[ops.WriteOp]]:
    """A run's writes in consecutive stretches of one kind (a run is one command's
    writes: almost always one stretch)."""
    if len(set(map(type, writes))) == 1:
        return [writes]
    out: list[list[ops.WriteOp]] = []
    for op in writes:
        if out and type(out[-1][0]) is type(op):
            out[-1].append(op)
        else:
            out.append([op])
    return out


def _segment_to_wire(writes: list[ops.WriteOp]) -> list[Any]:
    """Writes of one kind as ``[kind, n, {field: value}, {field: [values]}]``: a
    field with one plain value in every write (the bucket, a TTL, flags) goes
    once, the others (keys, values) as a column. A write's fields travel as
    the bytes they are, without a list and a kind per write."""
    cls = type(writes[0])
    values_of = _VALUES.get(cls)
    if values_of is None:
        raise TypeError(f"{cls.__name__} cannot be sent to the node's writer")
    n = len(writes)
    encoders = _ENCODERS[cls]
    same: dict[int, Any] = {}
    varying: dict[int, Any] = {}
    for i, col in enumerate(zip(*map(values_of, writes), strict=True)):
        first = col[0]
        encode = encoders.get(i)
        if col.count(first) == n and len(set(map(type, col))) == 1:
            value = first if encode is None else encode(first)
            if type(value) in _SCALARS:
                same[i] = value
                continue
        varying[i] = col if encode is None else list(map(encode, col))
    return [cls.__name__, n, same, varying]


def _segment_from_wire(data: Any, bucket: Callable[[str], BucketHandle]) -> list[ops.WriteOp]:
    """The writes of :func:`_segment_to_wire`; when they cannot be decoded together,
    each on its own, so each fails in its place with its own reason."""
    try:
        kind, n, same, varying = data
        cls = KINDS[kind]
        fields = len(_FIELDS[cls])
        if not (type(n) is int and n > 0 and len(same) + len(varying) == fields):
            raise ValueError(f"a run of {kind!r} with wrong fields")
        columns: list[Any] = [
            itertools.repeat(same[i], n) if i in same else varying[i] for i in range(fields)
        ]
    except (ValueError, TypeError, KeyError) as exc:
        return [Refused(errors.BadValue(f"malformed run of writes: {exc}"))]
    try:
        for i, _, decode in _CODECS[cls]:
            if i in same:
                columns[i] = itertools.repeat(decode(same[i], bucket), n)
            else:
                columns[i] = [decode(v, bucket) for v in columns[i]]
        if any(len(varying[i]) != n for i in varying):
            raise ValueError(f"a run of {n} {kind!r} with a column of another length")
        return list(itertools.starmap(cls, zip(*columns, strict=True)))
    except (errors.TenantKVError, ValueError, TypeError, KeyError, IndexError):
        raw = [itertools.repeat(same[i], n) if i in same else varying[i] for i in range(fields)]
        return [_decoded([kind, list(row)], bucket) for row in zip(*raw, strict=False)]


def _decoded(data: Any, bucket: Callable[[str], BucketHandle]) -> ops.WriteOp:
    try:
        return op_from_wire(data, bucket)
    except errors.TenantKVError as exc:
        return Refused(exc)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return Refused(errors.BadValue(f"malformed write: {exc}"))


@dataclasses.dataclass(slots=True, eq=False)
class Refused(ops.WriteOp):
    """A write the node's writer could not decode: applied, it fails with ``error``
    (that write only, as any write's error)."""

    error: errors.TenantKVError
    exempt: bool = True

    def apply(self, w: ops.WriteContext) -> Any:
        raise self.error


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

    writes: list[ops.WriteOp]
    exempt: bool = True
    #: buckets its writes created (the node's writer registers their handles)
    created: list[BucketHandle] = dataclasses.field(default_factory=list)

    @property
    def size_hint(self) -> int:  # type: ignore[override]
        return sum(op.size_hint for op in self.writes)

    @property
    def op_count(self) -> int:  # type: ignore[override]
        return sum(op.op_count for op in self.writes)

    def apply(self, w: ops.WriteContext) -> Any:
        out: list[Any] = []
        self.created = []  # applied again if the transaction is retried
        for op in self.writes:
            if isinstance(op, ops.RunOp):
                out.append(run_outcome_to_wire(op, op.apply(w)))
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
    return [result, _error_to_wire(error), p_op.nbytes, list(p_op.record_bytes)]


def run_outcome_to_wire(run: ops.RunOp, results: list[Any]) -> list[Any]:
    """A run's outcome, by column, from what ``RunOp.apply`` returned (each write's
    result, or the error it raised). Runs carry client writes: no bucket handle
    among their results."""
    errs: list[Any] | None = None
    if any([isinstance(r, BaseException) for r in results]):
        errs = [_error_to_wire(r) if isinstance(r, BaseException) else None for r in results]
        results = [None if isinstance(r, BaseException) else r for r in results]
    writes = run.ops
    record_bytes = None
    if any([op.record_bytes for op in writes]):
        record_bytes = [list(op.record_bytes) for op in writes]
    return [results, errs, [op.nbytes for op in writes], record_bytes]


def failed_outcome(item: ops.WriteOp, error: errors.TenantKVError) -> list[Any]:
    """The outcome of an item whose whole transaction failed: ``error`` for each write."""
    err = error.to_wire()
    if isinstance(item, ops.RunOp):
        n = item.op_count
        return [[None] * n, [err] * n, [0] * n, None]
    return [None, err, 0, []]


def _error_to_wire(error: BaseException | None) -> Any:
    if error is None:
        return None
    if not isinstance(error, errors.TenantKVError):
        error = errors.InternalError(f"storage failure: {error}")
    return error.to_wire()


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


def apply_run_outcome(run: ops.RunOp, data: Any) -> list[Any]:
    """:func:`apply_outcome` for a run: its writes' metering fields set, and each
    write's result or error in its place, as ``RunOp.apply`` returns them."""
    results, errs, nbytes, record_bytes = data
    writes = run.ops
    if len(results) != len(writes):
        raise ValueError(f"{len(results)} outcomes for a run of {len(writes)} writes")
    for op, n in zip(writes, nbytes, strict=True):
        op.nbytes = n
    if record_bytes is not None:
        for op, rb in zip(writes, record_bytes, strict=True):
            op.record_bytes = list(rb)
    if errs is None:
        return list(results)
    return [r if e is None else errors.from_wire(e) for r, e in zip(results, errs, strict=True)]
