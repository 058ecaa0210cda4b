"""The engine and the group-commit writer, on real LMDB files in a temp dir."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tenantkv import errors
from tenantkv.storage.engine import ALL_KEYS, Engine, KeyRange
from tenantkv.storage.group_commit import GroupCommitWriter, Pending
from tenantkv.storage.ops import (
    CounterOp,
    CreateBucketOp,
    DeleteOp,
    DropBucketOp,
    ExpireDueOp,
    RunOp,
    SetOp,
    TouchOp,
    WriteOp,
)
from tenantkv.storage.records import HEADER_BYTES
from tenantkv.storage.string_ops import StringSetOp


class Clock:
    """Wall clock in ms that the test moves by hand."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms


class Store:
    def __init__(self, path: Path, **kw: Any) -> None:
        self.clock = Clock()
        self.engine = Engine(path, now_ms=self.clock, **kw)
        self.batches: list[list[Pending]] = []
        self.writer = GroupCommitWriter(self.engine, self._deliver)
        self.writer.start()

    def _deliver(self, batch: list[Pending]) -> None:
        # Called by the writer after the batch's commit, like the server's.
        self.batches.append(batch)
        for p in batch:
            p.callback(p.result, p.error)

    def run(self, *ops: WriteOp) -> list[tuple[Any, BaseException | None]]:
        """Submit ops together; wait until every callback ran."""
        out: list[Any] = [None] * len(ops)
        left = threading.Semaphore(0)

        def cb(i: int) -> Any:
            def done(result: Any, error: BaseException | None) -> None:
                out[i] = (result, error)
                left.release()

            return done

        self.writer.submit_many([Pending(op, cb(i)) for i, op in enumerate(ops)])
        for _ in ops:
            assert left.acquire(timeout=10)
        return out

    def get(self, key: bytes, bucket: str = "b") -> Any:
        return self.engine.get(self.engine.bucket(bucket), key)

    def scan(self, where: KeyRange = ALL_KEYS, bucket: str = "b", **kw: Any) -> Any:
        return self.engine.scan(self.engine.bucket(bucket), where, **kw)

    def ok(self, op: WriteOp) -> Any:
        ((result, error),) = self.run(op)
        if error is not None:
            raise error
        return result

    def bucket(self, name: str = "b") -> Any:
        h = self.ok(CreateBucketOp(name, {}))
        self.engine.buckets[name] = h
        return h

    def close(self) -> None:
        self.writer.stop()
        self.writer.join(10)
        self.engine.close()


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def test_set_get_delete_and_cas(store: Store) -> None:
    b = store.bucket()
    cas1 = store.ok(SetOp(b, b"k", b"v1", flags=7))["cas"]
    rec = store.get(b"k")
    assert rec is not None and (rec.value, rec.cas, rec.flags) == (b"v1", cas1, 7)
    with pytest.raises(errors.CasMismatch):
        store.ok(SetOp(b, b"k", b"v2", cas=cas1 + 100))
    cas2 = store.ok(SetOp(b, b"k", b"v2", cas=cas1))["cas"]
    assert cas2 > cas1
    with pytest.raises(errors.CasMismatch):
        store.ok(DeleteOp(b, b"k", cas=cas1))
    assert store.ok(DeleteOp(b, b"k", cas=cas2)) is True
    assert store.ok(DeleteOp(b, b"k")) is False
    assert store.get(b"k") is None


def test_add_and_replace_modes(store: Store) -> None:
    b = store.bucket()
    with pytest.raises(errors.KeyNotFound):
        store.ok(SetOp(b, b"k", b"v", mode="replace"))
    store.ok(SetOp(b, b"k", b"v", mode="add"))
    with pytest.raises(errors.KeyExists):
        store.ok(SetOp(b, b"k", b"v", mode="add"))
    store.ok(SetOp(b, b"k", b"w", mode="replace"))
    assert store.get(b"k").value == b"w"  # type: ignore[union-attr]


def test_ttl_hides_at_once_and_pager_reclaims(store: Store) -> None:
    b = store.bucket()
    store.ok(SetOp(b, b"short", b"v", ttl=10))
    store.ok(SetOp(b, b"long", b"v", ttl=100))
    store.ok(SetOp(b, b"forever", b"v"))
    store.clock.ms += 10_000  # exactly at expiry: gone
    assert store.get(b"short") is None
    assert store.get(b"long") is not None
    assert [k for k, _ in store.scan()[0]] == [b"forever", b"long"]
    assert store.engine.scan_keys(store.engine.bucket("b")) == ([b"forever", b"long"], False)
    assert store.engine.bucket_entries("b") == 3  # still on disk
    assert store.ok(ExpireDueOp())["removed"] == 1
    assert store.engine.bucket_entries("b") == 2
    # an expired key behaves as absent for add, and can be re-set
    store.ok(SetOp(b, b"short", b"again", mode="add"))
    assert store.get(b"short").value == b"again"  # type: ignore[union-attr]


def test_touch_moves_expiry_and_pager_respects_it(store: Store) -> None:
    b = store.bucket()
    store.ok(SetOp(b, b"k", b"v", ttl=5))
    store.ok(TouchOp(b, b"k", ttl=60))
    store.clock.ms += 10_000
    assert store.ok(ExpireDueOp())["removed"] == 0
    assert store.get(b"k") is not None
    store.ok(TouchOp(b, b"k", ttl=0))
    store.clock.ms += 100_000
    store.ok(ExpireDueOp())
    assert store.get(b"k") is not None
    with pytest.raises(errors.KeyNotFound):
        store.ok(TouchOp(b, b"missing", ttl=1))


def test_counters(store: Store) -> None:
    b = store.bucket()
    with pytest.raises(errors.KeyNotFound):
        store.ok(CounterOp(b, b"n", 1))
    assert store.ok(CounterOp(b, b"n", 1, initial=10))["value"] == 10
    assert store.ok(CounterOp(b, b"n", 5))["value"] == 15
    assert store.ok(CounterOp(b, b"n", -20))["value"] == -5
    store.ok(SetOp(b, b"s", b"abc"))
    with pytest.raises(errors.NotANumber):
        store.ok(CounterOp(b, b"s", 1))
    store.ok(SetOp(b, b"big", str(2**63 - 1).encode()))
    with pytest.raises(errors.BadValue):
        store.ok(CounterOp(b, b"big", 1))


def test_one_batch_one_commit_and_per_op_errors(store: Store) -> None:
    b = store.bucket()
    store.ok(SetOp(b, b"exists", b"v"))
    ops: list[WriteOp] = [SetOp(b, b"k%d" % i, b"v") for i in range(200)]
    ops.insert(50, SetOp(b, b"exists", b"x", mode="add"))
    before = store.writer.batches
    results = store.run(*ops)
    assert isinstance(results[50][1], errors.KeyExists)
    assert all(err is None for i, (_, err) in enumerate(results) if i != 50)
    # 201 ops submitted back to back commit in far fewer transactions
    assert store.writer.batches - before < 50
    assert store.engine.bucket_entries("b") == 201


def test_acknowledged_only_after_commit(tmp_path: Path) -> None:
    """When a callback runs, another process opening the files sees the write."""
    s = Store(tmp_path / "db")
    b = s.bucket()
    seen: list[str] = []
    done = threading.Event()
    probe = (
        "import lmdb,sys; e=lmdb.open(sys.argv[1], max_dbs=10, readonly=True);"
        "t=e.begin(db=e.open_db(b'b:b', create=False)); print(t.get(b'k'))"
    )

    def check(result: Any, error: BaseException | None) -> None:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "db")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen.append(out.stdout + out.stderr)
        done.set()

    s.writer.submit(SetOp(b, b"k", b"durable"), check)
    assert done.wait(30)
    assert "durable" in seen[0], seen
    s.close()


def test_state_survives_reopen_and_cas_keeps_growing(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    b = s.bucket()
    cas = s.ok(SetOp(b, b"k", b"v"))["cas"]
    s.close()
    s2 = Store(tmp_path / "db")
    assert "b" in s2.engine.buckets
    assert s2.get(b"k").value == b"v"  # type: ignore[union-attr]
    assert s2.ok(SetOp(s2.engine.buckets["b"], b"k2", b"v"))["cas"] > cas
    s2.close()


def test_map_grows_before_anyone_sees_map_full(tmp_path: Path) -> None:
    s = Store(tmp_path / "db", map_size=256 * 1024)
    b = s.bucket()
    for i in range(40):
        s.ok(SetOp(b, b"k%d" % i, b"x" * 50_000))
    assert s.writer.map_grows >= 1
    assert s.engine.bucket_entries("b") == 40
    s.close()


def test_max_map_size_gives_storage_full_and_keeps_data(tmp_path: Path) -> None:
    s = Store(tmp_path / "db", map_size=256 * 1024, max_map_size=512 * 1024)
    b = s.bucket()
    s.ok(SetOp(b, b"keep", b"v"))
    with pytest.raises(errors.StorageFull):
        for i in range(100):
            s.ok(SetOp(b, b"k%d" % i, b"x" * 60_000))
    assert s.get(b"keep").value == b"v"  # type: ignore[union-attr]
    s.ok(DeleteOp(b, b"k0"))  # small writes still work after the failure
    s.close()


def test_drop_bucket_fails_queued_writes_cleanly(store: Store) -> None:
    b = store.bucket()
    store.ok(SetOp(b, b"k", b"v"))
    b.dropped = True
    results = store.run(SetOp(b, b"k2", b"v"), DropBucketOp(b))
    assert isinstance(results[0][1], errors.BucketNotFound)
    assert results[1] == (True, None)
    store.engine.buckets.pop("b")
    with pytest.raises(errors.BucketNotFound):
        store.get(b"k")
    # same name again: a fresh, empty bucket
    store.bucket("b")
    assert store.get(b"k") is None


def test_scan_ranges_prefix_and_cursor(store: Store) -> None:
    b = store.bucket()
    store.run(*[SetOp(b, k, b"v") for k in (b"a1", b"a2", b"a3", b"b1", b"c1")])
    items, more = store.scan(KeyRange(b"a", b"b"), limit=2)
    assert [k for k, _ in items] == [b"a1", b"a2"] and more
    items, more = store.scan(KeyRange(b"a", b"b", b"a2"), limit=2)
    assert [k for k, _ in items] == [b"a3"] and not more
    items, _ = store.scan(KeyRange(b"b"))
    assert [k for k, _ in items] == [b"b1", b"c1"]


def test_overwriting_clears_or_moves_the_expiry(store: Store) -> None:
    b = store.bucket()
    store.ok(SetOp(b, b"k", b"v", ttl=10))
    store.ok(SetOp(b, b"k", b"v2"))  # upsert without ttl: never expires now
    store.ok(SetOp(b, b"m", b"v", ttl=10))
    store.ok(SetOp(b, b"m", b"v2", ttl=100))  # moved later
    store.clock.ms += 20_000
    assert store.ok(ExpireDueOp())["removed"] == 0
    assert store.get(b"k").value == b"v2"
    assert store.get(b"m").value == b"v2"
    store.clock.ms += 100_000
    assert store.ok(ExpireDueOp())["removed"] == 1
    assert store.get(b"m") is None and store.get(b"k") is not None


def test_a_plain_set_keeps_the_expiry_index_in_step_whether_or_not_it_was_empty(
    store: Store,
) -> None:
    """A set without ttl takes a plain put only while no key has an expiry: in the
    same batch as a set with ttl, or after one, overwriting a key drops its index
    entry (else the pager would delete the key that no longer expires)."""
    b = store.bucket()
    store.ok(SetOp(b, b"plain", b"v"))  # index empty: the plain put
    # One batch: the first write finds the index empty, the second adds to it,
    # the third overwrites that key without ttl and must drop its entry.
    store.run(SetOp(b, b"a", b"v"), SetOp(b, b"k", b"v", ttl=10), SetOp(b, b"k", b"v2"))
    assert expiry_entries(store) == 0  # k's entry went with its TTL, in the same batch
    store.ok(SetOp(b, b"m", b"v", ttl=10))
    store.ok(SetOp(b, b"m", b"v2"))  # a later batch: the index is not empty
    assert expiry_entries(store) == 0
    store.clock.ms += 20_000
    assert store.ok(ExpireDueOp())["removed"] == 0
    assert [store.get(k).value for k in (b"plain", b"a", b"k", b"m")] == [b"v", b"v", b"v2", b"v2"]
    assert expiry_entries(store) == 0


def expiry_entries(store: Store) -> int:
    """Entries in the expiry index (every key with an expiry has one)."""
    with store.engine.env.begin() as txn:
        return int(txn.stat(store.engine.expiry)["entries"])


def test_a_backward_clock_step_resurrects_no_expired_key(store: Store) -> None:
    """Expiry is absolute wall-clock time (as in Redis); when the clock steps back,
    a key already reported missing, or already reclaimed, stays gone."""
    b = store.bucket()
    store.ok(SetOp(b, b"seen", b"v", ttl=10))
    store.ok(SetOp(b, b"paged", b"v", ttl=10))
    store.clock.ms += 11_000
    assert store.get(b"seen") is None  # reported missing
    assert store.ok(ExpireDueOp())["removed"] >= 1  # reclaimed by the pager
    store.clock.ms -= 3_600_000  # the system clock steps an hour back
    assert store.get(b"seen") is None
    assert store.get(b"paged") is None
    # A TTL set meanwhile counts from the clock's highest reading, not the stepped one.
    store.ok(SetOp(b, b"new", b"v", ttl=10))
    store.clock.ms += 3_600_000 + 11_000
    assert store.get(b"new") is None


def test_a_plain_redis_set_upserts_and_keeps_the_expiry_index_in_step(store: Store) -> None:
    """Redis SET without NX/XX/KEEPTTL writes in one B-tree operation: it returns the
    old live value (for SET ... GET; a plain SET does not copy it), clears or moves
    the expiry index entry, and an expiry already past still deletes the key."""
    from tenantkv.storage.string_ops import CLEAR, Expiry

    b = store.bucket()
    assert store.ok(StringSetOp(b, b"k", b"v1", Expiry("relative", 10_000))) == (True, None)
    assert store.ok(StringSetOp(b, b"k", b"v2", get=True)) == (True, b"v1")  # the TTL is cleared
    assert store.ok(StringSetOp(b, b"m", b"v1", Expiry("relative", 10_000))) == (True, None)
    assert store.ok(StringSetOp(b, b"m", b"v2", Expiry("relative", 100_000), get=True)) == (
        True,
        b"v1",
    )
    assert store.ok(StringSetOp(b, b"x", b"v1", Expiry("relative", 1_000))) == (True, None)
    store.clock.ms += 20_000
    assert store.ok(StringSetOp(b, b"x", b"v2", CLEAR, get=True)) == (True, None)  # old one expired
    assert store.ok(ExpireDueOp())["removed"] == 0
    assert store.get(b"k").value == b"v2" and store.get(b"k").expiry_ms == 0
    assert store.get(b"m").value == b"v2" and store.get(b"x").value == b"v2"
    store.clock.ms += 100_000
    assert store.ok(ExpireDueOp())["removed"] == 1
    assert store.get(b"m") is None and store.get(b"k") is not None
    past = Expiry("absolute", store.clock.ms - 1)
    assert store.ok(StringSetOp(b, b"k", b"v3", past)) == (True, None)  # (no GET: not copied)
    assert store.get(b"k") is None
    assert store.ok(StringSetOp(b, b"k", b"v4")) == (True, None)
    assert store.ok(StringSetOp(b, b"k", b"v5", past, get=True)) == (True, b"v4")
    assert store.get(b"k") is None  # an expiry already past deletes the key, as Redis does


def test_writes_submitted_together_commit_in_order_within_the_batch_bounds(
    tmp_path: Path,
) -> None:
    """``submit_many`` queues a turn's writes as one item: they commit in order,
    split where the batch bounds say (the rest carried to the next commit), and
    ``lag`` counts each write until its batch is taken."""
    s = Store(tmp_path / "db")
    h = s.bucket()
    s.writer.stop()
    s.writer.join(10)
    s.writer = GroupCommitWriter(s.engine, s._deliver, max_batch_ops=4)
    done = threading.Semaphore(0)
    order: list[int] = []

    def cb(i: int) -> Any:
        def callback(result: Any, error: BaseException | None) -> None:
            assert error is None
            order.append(i)
            done.release()

        return callback

    s.writer.submit_many([Pending(SetOp(h, b"k%d" % i, b"v%d" % i), cb(i)) for i in range(10)])
    assert s.writer.lag == 10
    s.writer.start()
    for _ in range(10):
        assert done.acquire(timeout=10)
    try:
        assert order == list(range(10))
        assert [len(b) for b in s.batches[-3:]] == [4, 4, 2]
        assert s.writer.lag == 0
        assert s.get(b"k9").value == b"v9"
    finally:
        s.close()


def _writer_with(s: Store, **kw: Any) -> None:
    s.writer.stop()
    s.writer.join(10)
    s.writer = GroupCommitWriter(s.engine, s._deliver, **kw)
    s.writer.start()


def _until_idle(writer: GroupCommitWriter, expected: int) -> None:
    """Until the writer has settled what its last commit expects and gone back
    to its (empty) queue."""
    for _ in range(1000):
        if writer._expected == expected:
            break
        time.sleep(0.001)
    assert writer._expected == expected
    time.sleep(0.05)  # it blocks on the queue right after setting that


def test_an_idle_writer_waits_for_as_many_writes_as_its_last_commit_answered(
    tmp_path: Path,
) -> None:
    """Four clients that write again once answered commit together again: the
    first of them to come back finds the writer idle, and its batch waits for
    the other three instead of committing alone (and splitting the clients
    into groups that take turns)."""
    s = Store(tmp_path / "db")
    h = s.bucket()
    # A window far longer than the test: only the count ends the wait here.
    _writer_with(s, gather_share=1e9, max_gather_seconds=60.0)
    try:
        s.run(*(SetOp(h, b"k%d" % i, b"a") for i in range(4)))
        assert len(s.batches[-1]) == 4
        _until_idle(s.writer, 4)
        first = threading.Event()
        s.writer.submit(SetOp(h, b"k0", b"b"), lambda result, error: first.set())
        assert not first.wait(0.2), "committed alone, before the other three came"
        s.run(*(SetOp(h, b"k%d" % i, b"b") for i in (1, 2, 3)))
        assert first.wait(10)
        assert [len(b) for b in s.batches[-2:]] == [4, 4]
        assert s.writer.batches == 2
    finally:
        s.close()


def test_the_wait_for_more_writes_is_bounded_and_only_on_an_idle_writer(
    tmp_path: Path,
) -> None:
    """A client that does not come back costs the others one bounded wait; and
    a writer that finds writes queued when it commits next does not wait."""
    s = Store(tmp_path / "db")
    h = s.bucket()
    _writer_with(s, gather_share=1e9, max_gather_seconds=0.05)
    try:
        s.run(*(SetOp(h, b"k%d" % i, b"a") for i in range(4)))
        # Three of four come back: they commit once the window has passed.
        _until_idle(s.writer, 4)
        s.run(*(SetOp(h, b"k%d" % i, b"b") for i in range(3)))
        assert [len(b) for b in s.batches[-2:]] == [4, 3]
        # Now the writer expects 3; it finds 2 queued (not idle): no wait.
        s.writer.stop()
        s.writer.join(10)
        s.writer = GroupCommitWriter(
            s.engine, s._deliver, gather_share=1e9, max_gather_seconds=60.0
        )
        s.writer._expected = 3
        done = threading.Semaphore(0)
        for i in range(2):
            s.writer.submit(SetOp(h, b"q%d" % i, b"c"), lambda result, error: done.release())
        s.writer.start()
        for _ in range(2):
            assert done.acquire(timeout=10), "a writer with writes queued waited for more"
        assert len(s.batches[-1]) == 2
    finally:
        s.close()


def test_a_writer_that_gathers_when_busy_waits_for_what_it_expects_with_writes_queued(
    tmp_path: Path,
) -> None:
    """The node's writer of --workers N (gather_when_busy): it finds writes
    queued and still waits for as many as it expects (the messages its last
    answers release), so they join this commit; the wait stays bounded."""
    s = Store(tmp_path / "db")
    h = s.bucket()
    s.writer.stop()
    s.writer.join(10)
    try:
        for window, then in ((60.0, 1), (0.05, 0)):
            s.writer = GroupCommitWriter(
                s.engine,
                s._deliver,
                gather_share=1e9,
                max_gather_seconds=window,
                gather_when_busy=True,
            )
            s.writer._expected = 3
            s.writer.last_commit_seconds = 1.0
            done = threading.Semaphore(0)

            def answered(result: Any, error: BaseException | None, done: Any = done) -> None:
                done.release()

            for i in range(2):
                s.writer.submit(SetOp(h, b"q%d" % i, b"c"), answered)
            s.writer.start()
            if then:
                assert not done.acquire(timeout=0.2), "committed without the write it expects"
                s.writer.submit(SetOp(h, b"q2", b"c"), answered)
            for _ in range(2 + then):
                assert done.acquire(timeout=10)
            assert len(s.batches[-1]) == 2 + then
            s.writer.stop()
            s.writer.join(10)
        s.writer = GroupCommitWriter(s.engine, s._deliver)
        s.writer.start()
    finally:
        s.close()


def _run_op(ops: list[WriteOp]) -> RunOp:
    return RunOp(ops, sum(op.size_hint for op in ops))


def _stored(store: Store, keys: list[bytes]) -> list[Any]:
    return [(r.value, r.cas, r.flags, r.expiry_ms) for r in (store.get(k) for k in keys)]


def test_a_run_of_plain_sets_writes_what_its_sets_would_one_by_one(tmp_path: Path) -> None:
    """A connection's run of plain sets (no TTL, no CAS condition) is applied in
    one call: the same records, CAS values, answers and metered bytes as the
    same sets applied one by one, a key set twice included (the last wins)."""
    keys = [b"k%d" % (i % 7) for i in range(20)]
    results = []
    for name, as_run in (("one_by_one", False), ("run", True)):
        s = Store(tmp_path / name)
        try:
            b = s.bucket()
            # the MessagePack door's set and the RESP door's plain SET, mixed
            ops: list[WriteOp] = [
                SetOp(b, k, b"v%d" % i, flags=i) if i % 3 else StringSetOp(b, k, b"v%d" % i)
                for i, k in enumerate(keys)
            ]
            answers = s.ok(_run_op(ops)) if as_run else [r for r, _ in s.run(*ops)]
            results.append((answers, [op.nbytes for op in ops], _stored(s, sorted(set(keys)))))
        finally:
            s.close()
    assert results[0] == results[1]
    answers, nbytes, _ = results[1]
    cas = [a["cas"] for a in answers if isinstance(a, dict)]
    assert cas == sorted(set(cas))  # in order
    assert [a for a in answers if not isinstance(a, dict)] == [(True, None)] * 7
    assert nbytes == [len(k) + len(b"v%d" % i) + HEADER_BYTES for i, k in enumerate(keys)]


def test_a_run_of_plain_sets_from_either_door_is_one_bulk_write(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESP SETs without options join the bulk write as MessagePack sets do (one
    C call for the run, not an upsert per key); SET with an option does not."""
    from tenantkv.storage import ops as ops_mod
    from tenantkv.storage import string_ops as string_ops_mod

    upserts: list[bytes] = []
    real = ops_mod.upsert

    def counted(w: Any, h: Any, key: bytes, *args: Any, **kw: Any) -> Any:
        upserts.append(key)
        return real(w, h, key, *args, **kw)

    monkeypatch.setattr(ops_mod, "upsert", counted)
    monkeypatch.setattr(string_ops_mod, "upsert", counted)
    b = store.bucket()
    store.ok(
        _run_op([StringSetOp(b, b"r1", b"1"), SetOp(b, b"m1", b"2"), StringSetOp(b, b"r2", b"3")])
    )
    assert upserts == []
    store.ok(_run_op([StringSetOp(b, b"r3", b"1"), StringSetOp(b, b"r4", b"2", only="nx")]))
    assert upserts == [b"r3"]  # the run went write by write (NX reads the old record)
    assert [store.get(k).value for k in (b"r1", b"m1", b"r2", b"r3", b"r4")] == [
        b"1",
        b"2",
        b"3",
        b"1",
        b"2",
    ]


def test_a_run_of_sets_is_applied_write_by_write_when_any_needs_more(store: Store) -> None:
    """Whatever is not a plain set in a run (a condition, a TTL), or a key with an
    expiry anywhere, and the run is applied write by write: each its own outcome,
    the expiry index in step."""
    b = store.bucket()
    store.ok(SetOp(b, b"exists", b"v"))
    ops: list[WriteOp] = [SetOp(b, b"a", b"1"), SetOp(b, b"exists", b"x", mode="add")]
    answers = store.ok(_run_op(ops))
    assert isinstance(answers[1], errors.KeyExists) and "cas" in answers[0]
    store.ok(SetOp(b, b"t", b"v", ttl=10))  # the expiry index is not empty now
    store.ok(_run_op([SetOp(b, b"a", b"2"), SetOp(b, b"t", b"v2")]))
    assert expiry_entries(store) == 0  # t's entry went with its TTL
    store.clock.ms += 20_000
    assert store.ok(ExpireDueOp())["removed"] == 0
    assert [store.get(k).value for k in (b"a", b"t", b"exists")] == [b"2", b"v2", b"v"]


def test_a_run_of_plain_sets_on_a_dropped_bucket_fails_each_write(store: Store) -> None:
    b = store.bucket()
    b.dropped = True  # as the server marks it, before it queues the drop
    store.ok(DropBucketOp(b))
    answers = store.ok(_run_op([SetOp(b, b"a", b"1"), SetOp(b, b"b", b"2")]))
    assert [type(a) for a in answers] == [errors.BucketNotFound] * 2


def test_a_run_past_the_cas_block_reserves_enough_for_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CAS values stay unique across restarts when one run of plain sets takes more
    than is left of the reserved block, or more than a whole block."""
    from tenantkv.storage import engine as engine_mod

    monkeypatch.setattr(engine_mod, "CAS_BLOCK", 5)
    s = Store(tmp_path / "db")
    b = s.bucket()
    s.ok(SetOp(b, b"first", b"v"))
    answers = s.ok(_run_op([SetOp(b, b"k%d" % i, b"v") for i in range(12)]))
    highest = max(a["cas"] for a in answers)
    s.close()  # a restart: CAS values continue from the reserved ceiling
    s2 = Store(tmp_path / "db")
    assert s2.ok(SetOp(s2.engine.buckets["b"], b"after", b"v"))["cas"] > highest
    s2.close()
