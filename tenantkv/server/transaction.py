"""Transactions on a connection, for both doors: MULTI / EXEC / DISCARD / WATCH /
UNWATCH as Redis 7.0 defines them (MessagePack: ``multi``, ``exec``, ``discard``,
``watch``, ``unwatch``).

One state per connection (:class:`Transaction`, on the executor), so both
doors share it and its bounds. After MULTI the executor hands every request to
:func:`queue_command` before it would run: a data command is checked as it
would be before admission (:meth:`Executor._prepare`: parameters, bucket,
role, its write built) and answered ``QUEUED``; one that fails that is
answered its error and the transaction is marked, so EXEC answers
``EXECABORT``. Each queued command is charged a read's floor as it is
queued (checking it was work, whether or not EXEC ever comes). EXEC
(:func:`execute`) admits the queue as one request costing the sum of its
writes' known costs, runs it as one write operation
(:class:`~tenantkv.storage.transaction_ops.TransactionOp`) in one transaction
of the group-commit writer, answers once that commit is durable, and charges
each command as it would be charged alone — writes their write units, reads
their read units — less the floors already charged. An EXEC that admission
refuses with an overload error keeps the transaction for a retried EXEC.
RESP connection commands queue too (:func:`_constant`) and run at EXEC.

Bounds: at most :data:`MAX_TRANSACTION_COMMANDS` commands and
:data:`MAX_TRANSACTION_BYTES` bytes of arguments queued, and
:data:`MAX_WATCHED_KEYS` watched keys; the queued bytes also count against the
node-wide ``max_receive_buffer_bytes`` (:func:`_over_bounds`). Queueing past a
bound is an error that aborts the transaction; from then on nothing more is
kept (a client sending MULTI and then ten million SETs holds at most the
bound), and each further command is answered as queued after its check,
charged a read's floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.admission.receive_buffers import ReceiveBuffers
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import WriteOp
from tenantkv.storage.transaction_ops import ReadStep, TransactionOp, watch_token

#: The most commands one transaction may queue.
MAX_TRANSACTION_COMMANDS = 10_000
#: The most bytes of arguments (keys and values) one transaction may queue.
MAX_TRANSACTION_BYTES = 32 * 1024 * 1024
#: The most keys one connection may watch at once.
MAX_WATCHED_KEYS = 1000
#: The most keys the reads of one transaction may name (an MGET counts its keys):
#: EXEC's reads run in the node's one writer, which every tenant's writes wait
#: for, so their work is bounded before EXEC as well as their bytes after.
MAX_TRANSACTION_READ_KEYS = 10_000
#: Reads whose work grows with the bucket or the value, not with the keys they
#: name (a scan, a pattern, LCS's table): refused inside a transaction, which
#: would run them in the writer.
UNBOUNDED_READS = frozenset({"keys", "scan", "lcs", "bitcount", "bitpos", "randomkey"})
#: The commands that act on the transaction itself: run, never queued (UNWATCH
#: inside MULTI is queued, as in Redis).
CONTROL = frozenset({"multi", "exec", "discard", "watch"})
#: The commands that end MULTI.
ENDS = frozenset({"exec", "discard"})
#: Door commands that run inside MULTI as outside (Redis: QUIT and RESET).
PASS_THROUGH = frozenset({"quit", "reset"})
#: MessagePack session commands answered at once inside ``multi``, not queued: a
#: health check or a look at the connection must not fail because a transaction
#: is open (RESP's PING is Redis's: queued).
AT_ONCE = frozenset({"ping", "whoami"})
#: EXEC's answer after a queue-time error (Redis's words).
EXECABORT = "EXECABORT Transaction discarded because of previous errors."
NOT_IN_TRANSACTION = "Command not allowed inside a transaction"


def _queued_reply(enc: Any, v: Any) -> bytes:
    return b"+QUEUED\r\n"


#: How a queued command is answered (RESP: +QUEUED; MessagePack: "QUEUED").
class _QueuedCommand:
    """The command a QUEUED answer is sent as (the doors read its reply)."""

    name = "queued"
    reply = staticmethod(_queued_reply)


QUEUED: Any = _QueuedCommand()


@dataclass(slots=True, eq=False)
class Queued:
    """A command checked and queued: what EXEC runs and how it answers it."""

    #: its command (server/commands.py ``Command``: this module precedes that table)
    cmd: Any
    params: dict[str, Any]
    bucket: BucketHandle | None
    #: its write (None: a read), and the write's cost known before it runs
    op: WriteOp | None
    cost: int
    #: the reply of a call that differs from its command's (RESP SET ... GET)
    reply: Callable[[Any, Any], bytes] | None = None
    #: the result of a command that is no data command (UNWATCH, PING, ECHO)
    result: Any = True


class ExecAborted:
    """EXEC after a queue-time error: the door answers :data:`EXECABORT`."""


EXEC_ABORTED = ExecAborted()

#: What EXEC ran: each queued command with its result or error; None when a
#: watched key changed (nothing ran); :data:`EXEC_ABORTED`.
ExecResult = list[tuple[Queued, Any, errors.TenantKVError | None]] | None | ExecAborted


@dataclass(slots=True, eq=False)
class Transaction:
    """A connection's transaction state: MULTI's queue and its watched keys."""

    active: bool = False
    #: a queue-time error happened: EXEC answers EXECABORT
    dirty: bool = False
    queue: list[Queued] = field(default_factory=list)
    nbytes: int = 0
    #: (bucket name, key) -> the CAS it had when watched (0: no live record)
    watches: dict[tuple[str, bytes], int] = field(default_factory=dict)
    #: bucket name -> its delete count when a key absent then was first watched
    deletes: dict[str, int] = field(default_factory=dict)
    #: the throttle units the queued data commands were charged as they were
    #: queued (a read's floor each), and their bucket: EXEC charges the rest
    prepaid: int = 0
    prepaid_bucket: str | None = None
    #: keys named by the queued reads (:data:`MAX_TRANSACTION_READ_KEYS`)
    read_keys: int = 0
    #: the node-wide cap the queued bytes count against (set on first use)
    buffers: ReceiveBuffers | None = None
    user: str | None = None

    def flag(self) -> None:
        """A queue-time error: EXEC will fail, and nothing more is kept."""
        if self.active:
            self.dirty = True
            self._drop_queue()

    def reset(self) -> None:
        """Out of MULTI, nothing queued, nothing watched (EXEC, DISCARD, RESET,
        the connection's close)."""
        self.active = self.dirty = False
        self._drop_queue()
        self.unwatch()

    def unwatch(self) -> None:
        self.watches = {}
        self.deletes = {}

    def hold(self, nbytes: int) -> None:
        """The queue now holds ``nbytes`` of arguments: tell the node-wide cap."""
        self.nbytes = nbytes
        if self.buffers is not None:
            self.buffers.update(self, nbytes, self.user)

    def _drop_queue(self) -> None:
        self.queue = []
        self.read_keys = 0
        self.prepaid = 0
        self.prepaid_bucket = None
        if self.nbytes:
            self.hold(0)


def state(ex: Any) -> Transaction:
    """The connection's transaction state (made on first use)."""
    txn: Transaction | None = ex.txn
    if txn is None:
        txn = ex.txn = Transaction()
    return txn


def queue_command(ex: Any, cmd: Any, req: tuple[int, str, Any], size: int) -> bool:
    """A request received inside MULTI (``size``: its arguments' bytes): True
    when it was answered here (queued, or refused), False when it runs as usual
    (the transaction's own commands, QUIT, RESET, and a request the door or
    the executor refuses as it would outside — the transaction is then marked)."""
    msgid, method, params = req
    txn = state(ex)
    if cmd is not None and (
        cmd.name in CONTROL
        or cmd.name in PASS_THROUGH
        or (cmd.kind == "session" and cmd.name in AT_ONCE)
    ):
        if cmd.name == "reset":
            txn.reset()
            ex.in_multi = False
        return False
    if cmd is None or (cmd.kind == "door" and method.startswith("\0")):
        txn.flag()  # unknown or malformed: answered as it would be outside MULTI
        return False
    try:
        if cmd.kind not in ("read", "write"):
            # (its arguments held until EXEC count against the bounds as a data
            # command's do: an ECHO of 20 MiB is 20 MiB queued)
            return _queue(ex, txn, _constant(cmd, params), msgid, size)
        prep = ex._prepare(cmd, params)
        if cmd.kind == "read":
            _check_read(txn, cmd.name, prep.params)
    except Exception as exc:
        txn.flag()
        ex._inline_failed(msgid, method, exc)  # (its error, as outside MULTI)
        return True
    queued = Queued(prep.cmd, prep.params, prep.bucket, prep.op, prep.cost)
    return _queue(ex, txn, queued, msgid, size)


def _check_read(txn: Transaction, name: str, params: dict[str, Any]) -> None:
    """A read queued in MULTI: one whose work the writer could not bound is
    refused, and the reads' keys count against :data:`MAX_TRANSACTION_READ_KEYS`."""
    if name in UNBOUNDED_READS:
        raise errors.BadValue(
            f"{name.upper()} is not allowed inside a transaction: it would run in the "
            "node's writer, which every tenant's writes wait for"
        )
    keys = params.get("keys")
    txn.read_keys += len(keys) if isinstance(keys, list) else 1
    if txn.read_keys > MAX_TRANSACTION_READ_KEYS:
        raise errors.BadValue(
            f"a transaction's reads may name at most {MAX_TRANSACTION_READ_KEYS} keys; "
            "transaction aborted"
        )


def refused(ex: Any, method: str) -> None:
    """The request rate limiter refused a request inside MULTI: it was not queued,
    so the transaction fails; a refused EXEC or DISCARD ends it (Redis discards
    a transaction whose EXEC it rejects), so that the client's next commands
    are not queued unseen."""
    txn = state(ex)
    if method in ENDS:
        txn.reset()
        ex.in_multi = False
    else:
        txn.flag()


def _constant(cmd: Any, params: Any) -> Queued:
    """A command that is no data command, queued: UNWATCH, and RESP's PING and
    ECHO, whose answers are known now; any other is refused (BadValue)."""
    if cmd.name == "unwatch" and cmd.kind == "session":
        return Queued(cmd, {}, None, None, 0)
    if cmd.kind == "door" and cmd.name in ("ping", "echo") and isinstance(params, list):
        n = len(params)
        if (cmd.name == "ping" and n <= 2) or (cmd.name == "echo" and n == 2):
            if n == 1:
                return Queued(cmd, {}, None, None, 0, _pong, None)
            return Queued(cmd, {}, None, None, 0, _bulk, bytes(params[1]))
        raise errors.BadValue(f"wrong number of arguments for '{cmd.name}' command")
    if cmd.kind == "door" and isinstance(params, list) and cmd.name not in NOT_QUEUED:
        # TIME, INFO, CLIENT ..., CONFIG ..., COMMAND ...: run at EXEC, in place.
        return Queued(cmd, {}, None, None, 0, _raw, [bytes(a) for a in params])
    raise errors.BadValue(NOT_IN_TRANSACTION)


#: RESP connection commands refused inside MULTI (Redis queues them): they pick
#: the user or the bucket the queued commands were checked against.
NOT_QUEUED = frozenset({"auth", "hello", "select"})


def _raw(enc: Any, v: Any) -> bytes:
    return bytes(v)


async def _run_door(ex: Any, i: int, q: Queued) -> tuple[Queued, Any, Any]:
    """A connection command queued on the RESP door, run at EXEC (its floor was
    charged as it was queued): its reply, caught from the door's reply slots
    under a number no request has, goes in its place in EXEC's array."""
    door = ex.door
    msgid = -1 - i
    try:
        await q.cmd.handler(door, ex, msgid, q.result)
    except errors.TenantKVError as exc:
        door._slots.pop(msgid, None)
        return q, None, exc
    return q, door._slots.pop(msgid, b""), None


async def _answers(ex: Any, queue: list[Queued], ran: list[Any]) -> list[Any]:
    """EXEC's answers in queue order: the data commands' from ``ran``, the rest
    known at queue time or run now (:func:`_run_door`)."""
    found = iter(ran)
    out: list[Any] = []
    for i, q in enumerate(queue):
        if q.cmd.kind in ("read", "write"):
            out.append(next(found))
        elif q.reply is _raw:
            out.append(await _run_door(ex, i, q))
        else:
            out.append((q, q.result, None))
    return out


def _pong(enc: Any, v: Any) -> bytes:
    return b"+PONG\r\n"


def _bulk(enc: Any, v: Any) -> bytes:
    return enc.bulk(v)


def _queue(ex: Any, txn: Transaction, queued: Queued, msgid: int, size: int) -> bool:
    """Keep a checked command (within the bounds) and answer it QUEUED."""
    take_special = getattr(ex.door, "take_special", None)
    special = None if take_special is None else take_special(msgid)
    if special is not None:
        queued.reply = special
    if txn.dirty:
        ex.charge_floor()  # checked, kept nowhere: not charged by any EXEC
    else:
        exc = _over_bounds(ex, txn, size)
        if exc is not None:
            txn.flag()
            ex.fail(msgid, queued.cmd.name, exc)
            return True
        _prepay(ex, txn, queued)
        txn.queue.append(queued)
        if size:
            txn.hold(txn.nbytes + size)
    ex.door.reply(QUEUED, msgid, "QUEUED")
    return True


def _over_bounds(ex: Any, txn: Transaction, size: int) -> errors.TenantKVError | None:
    """The error queueing ``size`` more bytes would break a bound with, or None:
    the transaction's own bounds, and the node-wide cap on what clients make the
    server hold (``max_receive_buffer_bytes``, shared with undecoded frames and
    writes not yet durable), which queued bytes count against until EXEC,
    DISCARD or the close: a thousand connections cannot each hold a transaction
    of :data:`MAX_TRANSACTION_BYTES`. Past the cap the command is refused (an
    overload error; the transaction aborts) instead of waiting, as a frame
    would: bytes held by an idle MULTI would otherwise hold up everyone."""
    if len(txn.queue) >= MAX_TRANSACTION_COMMANDS or txn.nbytes + size > MAX_TRANSACTION_BYTES:
        return errors.BadValue(
            f"a transaction may queue at most {MAX_TRANSACTION_COMMANDS} commands and "
            f"{MAX_TRANSACTION_BYTES} bytes of arguments; transaction aborted"
        )
    if not size:
        return None
    if txn.buffers is None:
        txn.buffers = ex.node.receive_buffers
        txn.user = ex.user.name if ex.user is not None else None
    assert txn.buffers is not None
    if txn.buffers.has_room(txn.user):
        return None
    return errors.AdmissionQueueOverflow(
        "the node holds as many received bytes as max_receive_buffer_bytes allows; "
        "the command was not queued and the transaction is aborted"
    )


def _prepay(ex: Any, txn: Transaction, queued: Queued) -> None:
    """Charge a command a read's floor as it is queued, as any request that runs
    no data operation is: checking it was work, and a client that queues and
    never runs EXEC (a disconnect, DISCARD) must pay for it. A data command's
    floor is deducted from what EXEC charges for it (:func:`_settle`)."""
    ex.charge_floor()
    tenant = ex.floor_tenant()
    if tenant is not None and queued.cmd.kind in ("read", "write"):
        if txn.prepaid_bucket not in (None, tenant[0]):
            txn.prepaid = 0  # (the bucket changed: what EXEC charges is another's)
        txn.prepaid_bucket = tenant[0]
        txn.prepaid += ex.node.config.min_op_units


# -- the transaction's own commands ----------------------------------------------------


def multi(ex: Any) -> None:
    txn = state(ex)
    if txn.active:
        raise errors.BadValue("MULTI calls can not be nested")
    txn.active = True
    ex.in_multi = True


def discard(ex: Any) -> None:
    txn = state(ex)
    if not txn.active:
        raise errors.BadValue("DISCARD without MULTI")
    txn.reset()
    ex.in_multi = False


def unwatch(ex: Any) -> None:
    state(ex).unwatch()


async def watch(ex: Any, keys: list[bytes]) -> None:
    """Remember each key's CAS now (:func:`watch_token`): EXEC applies nothing if
    one of them has another then. The connection's writes before WATCH are
    durable by now (a command that is no write waits for them).

    A key absent now, then created and deleted before EXEC, would have no CAS
    again: for those keys the bucket's count of deletes is recorded too, read
    in the writer with their CAS (:func:`_watch_absent`: with ``--workers N``
    the writer is another process), and EXEC fails if it moved — a delete of
    any key of the bucket fails it, a conservative abort that an optimistic
    client retries (redis-py's ``transaction()`` does)."""
    txn = state(ex)
    if txn.active:
        raise errors.BadValue("WATCH inside MULTI is not allowed")
    b = ex._data_bucket(write=False)
    new = [k for k in dict.fromkeys(keys) if (b.name, k) not in txn.watches]
    if len(txn.watches) + len(new) > MAX_WATCHED_KEYS:
        raise errors.BadValue(f"a connection may watch at most {MAX_WATCHED_KEYS} keys")
    engine = ex.node.engine
    now = engine.now_ms()
    with engine.read_txn() as rtxn:
        for key in new:
            txn.watches[(b.name, key)] = watch_token(rtxn.get(key, None, b.db), now)
    absent = [k for k in new if not txn.watches[(b.name, k)]]
    if absent and b.name not in txn.deletes:
        await _watch_absent(ex, txn, b, absent)
    if len(keys) > 1:
        ex.charge_floor(len(keys) - 1)  # (the first key's floor: the request's)


async def _watch_absent(ex: Any, txn: Transaction, b: BucketHandle, keys: list[bytes]) -> None:
    """Record the bucket's delete count, and the CAS of ``keys`` again, as the
    writer has them together (a key created since the snapshot has one now)."""
    op = TransactionOp(b, [], probe=keys)
    result, error = await _submit(ex.node, op, None)
    if error is not None:
        for key in keys:
            txn.watches.pop((b.name, key), None)
        if isinstance(error, errors.TenantKVError):
            raise error
        raise errors.InternalError(f"internal error: {error!r:.200}")
    count, cas = result
    txn.deletes[b.name] = count
    for key, c in zip(keys, cas, strict=True):
        txn.watches[(b.name, key)] = c


def _watches_hold(ex: Any, watches: dict[tuple[str, bytes], int]) -> bool:
    """EXEC of an empty queue: do the watched keys still have their CAS?"""
    engine = ex.node.engine
    now = engine.now_ms()
    with engine.read_txn() as rtxn:
        for (bucket, key), cas in watches.items():
            h = engine.buckets.get(bucket)
            raw = None if h is None or h.dropped else rtxn.get(key, None, h.db)
            if watch_token(raw, now) != cas:
                return False
    return True


async def execute(ex: Any) -> ExecResult:
    """EXEC: run the queue atomically, or say why not (see :data:`ExecResult`)."""
    txn = state(ex)
    if not txn.active:
        raise errors.BadValue("EXEC without MULTI")
    queue, watches, deletes = txn.queue, txn.watches, txn.deletes
    runs = [q for q in queue if q.cmd.kind in ("read", "write")]
    if txn.dirty or not (runs or deletes):
        dirty = txn.dirty
        _end(ex, txn)
        if dirty:
            return EXEC_ABORTED
        if watches and not _watches_hold(ex, watches):
            return None
        return await _answers(ex, queue, [])
    prepaid = txn.prepaid if txn.prepaid_bucket == ex.bucket else 0
    try:
        outcomes = await _commit(
            ex, runs, watches, prepaid, deletes, admitted=lambda: _end(ex, txn)
        )
    except errors.TenantKVError as exc:
        if txn.active and not exc.has_label(errors.SYSTEM_OVERLOADED):
            _end(ex, txn)
        raise
    if outcomes is None:
        return None
    return await _answers(ex, queue, outcomes)


def _end(ex: Any, txn: Transaction) -> None:
    """EXEC goes ahead (admitted) or fails for good: out of MULTI."""
    txn.reset()
    ex.in_multi = False


def _check_owned(
    cluster: Any, runs: list[Queued], watches: dict[tuple[str, bytes], int], writes: bool
) -> None:
    """Cluster mode: every key the transaction names or watches is in a slot this
    node serves now (the map may have moved since a command was queued; the
    MessagePack ``transaction`` request is checked only here), else the whole
    transaction is refused as its first foreign key would be: nothing runs."""
    from tenantkv.cluster.routing import request_keys

    keys = [k for q in runs for k in request_keys(q.params) or ()]
    keys += [key for _, key in watches]
    if keys:
        exc = cluster.refusal(keys, resp=False, write=writes)
        if exc is not None:
            raise exc


async def _commit(
    ex: Any,
    runs: list[Queued],
    watches: dict[tuple[str, bytes], int],
    prepaid: int = 0,
    deletes: dict[str, int] | None = None,
    admitted: Callable[[], None] | None = None,
) -> list[tuple[Queued, Any, errors.TenantKVError | None]] | None:
    """Admit the queued data commands as one request (the sum of their known
    costs), apply them as one write operation, answer once durable, charge them
    (less ``prepaid``, the floors charged as they were queued). ``admitted`` is
    called once admission let it through (an overload refusal before that keeps
    the connection's transaction for a retried EXEC)."""
    node = ex.node
    writes = any(q.op is not None for q in runs)
    b = ex._data_bucket(write=writes)
    if node.cluster is not None:
        _check_owned(node.cluster, runs, watches, writes)
    user = ex.current_user()
    t0 = time.perf_counter()
    holds = await node.pipeline.acquire(
        b.name,
        "write" if writes else "read",
        unthrottled=user.unthrottled,
        deadline=None,
        nonblocking=ex.nonblocking_throttle,
        operation="exec",
        key_len=0,
        cost=sum(q.cost for q in runs),
    )
    try:
        b = ex._data_bucket(write=writes)  # (the user or the bucket may have changed)
    except BaseException:
        node.pipeline.refund(b.name, holds)
        holds.release("exec", outcome="rejected")
        if admitted is not None:
            admitted()  # (not an overload: the transaction ends)
        raise
    if admitted is not None:
        admitted()
    protocol = ex.door.protocol_name
    steps: list[WriteOp | ReadStep] = [
        q.op if q.op is not None else ReadStep(f"{protocol}:{q.cmd.name}", q.params) for q in runs
    ]
    watched = [[bucket, key, cas] for (bucket, key), cas in watches.items()]
    op = TransactionOp(b, steps, watched, node.config.max_value_bytes)
    op.deletes = [[bucket, n] for bucket, n in (deletes or {}).items()]
    result, error = await _submit(node, op, holds)
    if error is not None:
        holds.release("exec", outcome="error")
        node.charge_writes(b.name, 0, 0, user.unthrottled, holds.reserved)
        raise (
            error
            if isinstance(error, errors.TenantKVError)
            else errors.InternalError(f"internal error: {error!r:.200}")
        )
    outcomes = None if result is None else _settle(ex, b.name, runs, result, holds, user, prepaid)
    if outcomes is None:  # a watched key changed: nothing ran; the reservation back
        holds.release("exec", outcome="ok")
        node.charge_writes(b.name, 0, 0, user.unthrottled, holds.reserved)
    node.count_write(b.name, "exec", t0)
    return outcomes


async def _submit(
    node: Any, op: TransactionOp, holds: Holds | None
) -> tuple[Any, BaseException | None]:
    """Queue the transaction on the writer and wait until it is durable. Shielded:
    once queued it commits, and the answer must say what it did."""
    done = trio.Event()
    box: list[Any] = [None, None]

    def callback(result: Any, error: BaseException | None) -> None:
        box[0], box[1] = result, error
        done.set()

    node.submit(op, callback, None if holds is None else holds.release_queue_bounds)
    with trio.CancelScope(shield=True):
        await done.wait()
    return box[0], box[1]


def _settle(
    ex: Any,
    bucket: str,
    runs: list[Queued],
    result: list[Any],
    holds: Holds,
    user: Any,
    prepaid: int = 0,
) -> list[tuple[Queued, Any, errors.TenantKVError | None]]:
    """Each command's outcome from the writer's (plain data: also from another
    process's writer), and the charge: its writes' units and its reads' units,
    as each would cost alone, less what admission reserved and the floors
    charged as they were queued (``prepaid``: settled as a reservation is, the
    difference spent or given back — never charged twice)."""
    node = ex.node
    out: list[tuple[Queued, Any, errors.TenantKVError | None]] = []
    ran: list[WriteOp] = []
    ru_sum = read_cost = 0
    for q, (value, err, nbytes, record_bytes, sizes, keys) in zip(runs, result, strict=True):
        exc = None if err is None else errors.from_wire(err, command=q.cmd.name)
        if exc is not None:
            ex.count_error(exc)
        out.append((q, value, exc))
        if q.op is not None:
            q.op.nbytes = nbytes
            if record_bytes:
                q.op.record_bytes = list(record_bytes)
            ran.append(q.op)
        else:
            ru, cost = node.read_cost(list(sizes), keys)
            ru_sum += ru
            read_cost += cost
    holds.release("exec", outcome="ok" if all(e is None for _, _, e in out) else "error")
    wu, cost = node.write_costs(ran) if ran else (0, 0)
    node.charge_writes(bucket, wu, cost, user.unthrottled, holds.reserved + prepaid)
    if read_cost:
        node.charge_reads(bucket, ru_sum, read_cost, user.unthrottled)
    return out


# -- the MessagePack door's forms (its commands: server/commands.py) -------------------


def exec_result(done: ExecResult) -> Any:
    """EXEC's outcome as the MessagePack ``exec`` answers it."""
    if isinstance(done, ExecAborted):
        raise errors.BadValue(EXECABORT)
    return None if done is None else _wire(done)


def _wire(done: list[tuple[Queued, Any, errors.TenantKVError | None]]) -> list[Any]:
    return [{"result": r} if e is None else {"error": e.to_wire()} for _, r, e in done]


async def run_ops(ex: Any, ops: list[tuple[Any, dict[str, Any]]], watch: list[Any]) -> Any:
    """The MessagePack ``transaction`` request: ``ops`` (each a data command and
    its parameters) checked as EXEC's queue is — the first that fails its check
    fails the request, nothing ran — then run as EXEC runs a queue, if each of
    ``watch`` (``(key, cas)``, in the connection's bucket) still holds."""
    if len(ops) > MAX_TRANSACTION_COMMANDS or len(watch) > MAX_WATCHED_KEYS:
        raise errors.BadValue(
            f"a transaction takes at most {MAX_TRANSACTION_COMMANDS} ops "
            f"and {MAX_WATCHED_KEYS} watched keys"
        )
    reads = Transaction()  # (counts the reads' keys, as MULTI's queue does)
    runs = [_checked(ex, i, cmd, params, reads) for i, (cmd, params) in enumerate(ops)]
    b = ex._data_bucket(write=False)
    outcomes = await _commit(ex, runs, {(b.name, key): cas for key, cas in watch})
    return None if outcomes is None else _wire(outcomes)


def _checked(ex: Any, i: int, cmd: Any, params: dict[str, Any], reads: Transaction) -> Queued:
    """The ``i``-th op of a ``transaction`` request, checked as EXEC's queue is."""
    if cmd is None or cmd.kind not in ("read", "write"):
        raise errors.BadValue(f"ops[{i}] is no data command")
    try:
        prep = ex._prepare(cmd, params)
        if cmd.kind == "read":
            _check_read(reads, cmd.name, prep.params)
    except errors.TenantKVError as exc:
        exc.errmsg = f"ops[{i}] ({cmd.name}): {exc.errmsg}"
        raise
    return Queued(prep.cmd, prep.params, prep.bucket, prep.op, prep.cost)
