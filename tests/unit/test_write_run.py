"""A run of writes (server/write_run.py) against stand-ins for its session and
node: what it must get right whatever order the answers come in (a worker's
writes travel in concurrent messages to the node's writer)."""

from __future__ import annotations

from typing import Any

from tenantkv import errors
from tenantkv.admission.pipeline import Holds
from tenantkv.server.write_run import WriteRun
from tenantkv.storage.engine import BucketHandle
from tenantkv.storage.ops import SetOp


class FakeNode:
    def __init__(self) -> None:
        self.submitted: list[tuple[Any, Any, Any]] = []
        self.counted: list[tuple[str, str, float, int]] = []
        self.charged: list[tuple[str, int, int, bool]] = []

    def submit(self, op: Any, callback: Any, taken: Any) -> None:
        self.submitted.append((op, callback, taken))

    def write_cost(self, op: Any, *, wrote: bool) -> tuple[int, int]:
        return (1, 2) if wrote else (0, 2)

    def count_write(self, bucket: str, method: str, t0: float, n: int = 1) -> None:
        self.counted.append((bucket, method, t0, n))

    def charge_writes(self, bucket: str, wu: int, cost: int, unthrottled: bool) -> None:
        self.charged.append((bucket, wu, cost, unthrottled))


class FakeSession:
    def __init__(self) -> None:
        self.node = FakeNode()
        self.user = None
        self.pending_writes = 0
        self.pending_write_bytes = 0
        self._reader_parked = False
        self.replies: list[tuple[int, Any]] = []
        self.errors: list[str] = []

    def _reply(self, msgid: int, result: Any) -> None:
        self.replies.append((msgid, result))

    def _reply_error(self, msgid: int | None, exc: errors.TenantKVError) -> None:
        self.replies.append((msgid or 0, exc.code_name))

    def _count_error(self, exc: errors.TenantKVError, n: int = 1) -> None:
        self.errors.append(exc.code_name)

    def _wake_reader(self) -> None:
        pass


def test_answers_in_any_order_reach_their_own_requests_and_settle_once() -> None:
    s = FakeSession()
    bucket = BucketHandle("b", None, {})
    holds = Holds(None, None, None, None, None)  # type: ignore[arg-type]
    run = WriteRun(s, bucket, "set", holds, t0=5.0)  # type: ignore[arg-type]
    for msgid in (10, 11, 12):
        if msgid != 10:  # what Pipeline.try_join counts for a write joining the run
            holds.held += 1
            holds.untaken += 1
            holds.unanswered += 1
        run.add(msgid, SetOp(bucket, b"k%d" % msgid, b"v"))
    run.close()
    assert s.pending_writes == 3
    callbacks = [cb for _, cb, _ in s.node.submitted]
    last_op = s.node.submitted[2][0]
    callbacks[2]({"cas": 3}, None)
    # An answered write's op (its value) is not kept while the rest of the run waits.
    assert all(op is not last_op for op in run._ops)
    callbacks[0](None, errors.KeyExists("key already exists"))
    assert s.node.counted == [] and holds.unanswered == 3  # not settled yet
    callbacks[1]({"cas": 2}, None)
    assert s.replies == [(12, {"cas": 3}), (10, "KeyExists"), (11, {"cas": 2})]
    assert s.errors == ["KeyExists"] and s.pending_writes == 0
    assert s.node.counted == [("b", "set", 5.0, 2)]  # once, the two that succeeded
    assert s.node.charged == [("b", 2, 6, False)]  # all three ran: each costs
    assert holds.unanswered == 0
