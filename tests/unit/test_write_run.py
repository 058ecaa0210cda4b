"""A run of writes (server/write_run.py) against stand-ins for its session and
node: one item for the writer, each write answered in its own place."""

from __future__ import annotations

from typing import Any

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.server.commands import COMMANDS
from tenantkv.server.write_run import WriteRun
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import RunOp, SetOp


class FakePipeline:
    """Pipeline.join_room / join for a run whose holds hold no gate objects."""

    def join_room(self, holds: Holds) -> int:
        return 100

    def join(self, holds: Holds, n: int) -> None:
        holds.held += n
        holds.untaken += n
        holds.unanswered += n


class FakeNode:
    def __init__(self) -> None:
        self.pipeline = FakePipeline()
        self.submitted: list[tuple[Any, Any, Any]] = []
        self.counted: list[tuple[str, str, float, int]] = []
        self.charged: list[tuple[str, int, int, bool]] = []

    def submit(self, op: Any, callback: Any, taken: Any) -> None:
        self.submitted.append((op, callback, taken))

    def write_cost(self, op: Any, *, wrote: bool) -> tuple[int, int]:
        return self.write_costs((op,), wrote=wrote)

    def write_costs(self, ops: Any, *, wrote: bool = True) -> tuple[int, int]:
        return (len(ops), 2 * len(ops)) if wrote else (0, 2 * len(ops))

    def count_write(self, bucket: str, method: str, t0: float, n: int = 1) -> None:
        self.counted.append((bucket, method, t0, n))

    def charge_writes(
        self, bucket: str, wu: int, cost: int, unthrottled: bool, reserved: int = 0
    ) -> None:
        self.charged.append((bucket, wu, cost, unthrottled))


class FakeDoor:
    def __init__(self) -> None:
        self.replies: list[tuple[int, Any]] = []

    def reply(self, cmd: Any, msgid: int, result: Any) -> None:
        self.replies.append((msgid, result))

    def reply_all(self, cmd: Any, msgids: list[int], results: Any) -> None:
        for msgid, result in zip(msgids, results, strict=True):
            self.reply(cmd, msgid, result)

    def reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        self.replies.append((msgid or 0, exc.code_name))


class FakeSession:
    def __init__(self) -> None:
        self.node = FakeNode()
        self.door = FakeDoor()
        self.replies = self.door.replies
        self.user = None
        self.pending_writes = 0
        self.pending_write_bytes = 0
        self.reader_parked = False
        self.errors: list[str] = []

    def count_error(self, exc: errors.TenantKVError, n: int = 1) -> None:
        self.errors.append(exc.code_name)

    def wake_reader(self) -> None:
        pass

    def held_changed(self) -> None:
        self.held_reports = getattr(self, "held_reports", 0) + 1


def _run_of_three(s: FakeSession) -> tuple[WriteRun, Holds]:
    bucket = BucketHandle("b", None, {})
    holds = Holds(None, None, None, None, None)  # type: ignore[arg-type]
    run = WriteRun(s, bucket, COMMANDS["set"], holds, t0=5.0)  # type: ignore[arg-type]
    for msgid in (10, 11, 12):
        if msgid != 10:  # a write joining the run (Executor._write_inline)
            assert run.may_join()
        run.add(msgid, SetOp(bucket, b"k%d" % msgid, b"v"))
    assert run.joined == 2 and run.room == 98  # (FakePipeline's room: 100)
    return run, holds


def test_a_run_is_one_item_and_each_write_is_answered_in_its_place() -> None:
    s = FakeSession()
    run, holds = _run_of_three(s)
    assert s.node.submitted == [] and s.pending_writes == 3  # nothing sent while it may grow
    run.close()
    run.close()  # idempotent
    assert (holds.held, holds.untaken, holds.unanswered) == (3, 3, 3)  # joins counted once
    ((op, done, taken),) = s.node.submitted
    assert isinstance(op, RunOp) and op.op_count == 3 and len(op.ops) == 3
    assert op.size_hint == sum(w.size_hint for w in op.ops) == s.pending_write_bytes
    taken()  # the writer took the run: its three writes at once
    assert holds.untaken == 0 and holds.unanswered == 3
    done([{"cas": 1}, errors.KeyExists("key already exists"), {"cas": 3}], None)
    assert s.replies == [(10, {"cas": 1}), (11, "KeyExists"), (12, {"cas": 3})]
    assert s.errors == ["KeyExists"] and s.pending_writes == 0 == s.pending_write_bytes
    assert s.node.counted == [("b", "set", 5.0, 2)]  # once, the two that succeeded
    assert s.node.charged == [("b", 2, 6, False)]  # all three ran: each costs
    assert holds.unanswered == 0
    assert run._ops == []  # the values are not kept past their answers


def test_a_failed_commit_fails_every_write_of_the_run() -> None:
    s = FakeSession()
    run, holds = _run_of_three(s)
    run.close()
    ((_, done, taken),) = s.node.submitted
    taken()
    done(None, errors.StorageFull("disk full"))
    assert s.replies == [(10, "StorageFull"), (11, "StorageFull"), (12, "StorageFull")]
    assert s.errors == ["StorageFull"] * 3 and s.pending_writes == 0
    assert s.node.counted == [] and holds.unanswered == 0


def test_a_lone_write_goes_as_itself_and_asks_the_gates_nothing() -> None:
    s = FakeSession()
    bucket = BucketHandle("b", None, {})
    holds = Holds(None, None, None, None, None)  # type: ignore[arg-type]
    run = WriteRun(s, bucket, COMMANDS["set"], holds, t0=5.0)  # type: ignore[arg-type]
    op = SetOp(bucket, b"k", b"v", mode="add")
    run.add(7, op)
    run.close()
    assert run.room == -1  # no second write came: the gates were not asked
    ((sent, done, taken),) = s.node.submitted
    assert sent is op
    taken()
    done(None, errors.KeyExists("key already exists"))  # its own error, as the writer gives it
    assert s.replies == [(7, "KeyExists")] and s.pending_writes == 0
    assert s.node.charged == [("b", 0, 2, False)]  # it ran: it costs
    assert holds.unanswered == 0
