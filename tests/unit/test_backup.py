"""Backup and restore of a data directory, without a server (see also
tests/e2e/test_operator.py for both through the CLIs against live daemons)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest

from tenantkv import errors
from tenantkv.storage import backup
from tenantkv.storage.engine import BUCKET_DB_PREFIX, SYSTEM_DB, Engine


def make_data_dir(path: Path, *, records: int = 100) -> None:
    """A closed data directory with a bucket 'b', a user record and some data."""
    eng = Engine(path, map_size=64 << 20)
    with eng.env.begin(write=True) as txn:
        system = eng.env.open_db(SYSTEM_DB, txn=txn)
        txn.put(b"bucket:b", msgpack.packb({"throttle": {"reserved": 5}}), db=system)
        txn.put(b"user:u", msgpack.packb({"name": "u"}), db=system)
        db = eng.env.open_db(BUCKET_DB_PREFIX + b"b", txn=txn)
        for i in range(records):
            txn.put(b"k%06d" % i, b"v" * 100, db=db)
    eng.close()


async def test_backup_then_inspect_then_restore(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "src")
    eng = Engine(tmp_path / "src", map_size=64 << 20)
    try:
        result = await backup.backup(eng, str(tmp_path / "bk"))
    finally:
        eng.close()
    assert result["bytes"] == (tmp_path / "bk" / "data.mdb").stat().st_size
    info = backup.inspect(str(tmp_path / "bk"))
    assert (info["buckets"], info["users"], info["manifest"]["bytes"]) == (
        ["b"],
        1,
        result["bytes"],
    )
    assert not (tmp_path / "bk" / "lock.mdb").exists()  # inspecting leaves no trace

    out = backup.restore(str(tmp_path / "bk"), str(tmp_path / "dst"))
    assert out["data_dir"] == str(tmp_path / "dst")
    eng = Engine(tmp_path / "dst", map_size=64 << 20)
    try:
        assert eng.get(eng.bucket("b"), b"k000042") is not None
        assert eng.bucket_entries("b") == 100
    finally:
        eng.close()


async def test_backup_refusals_leave_nothing_behind(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "src")
    eng = Engine(tmp_path / "src", map_size=64 << 20)
    try:
        with pytest.raises(errors.BadValue, match="absolute"):
            await backup.backup(eng, "bk")
        with pytest.raises(errors.BadValue, match="non-empty string"):
            await backup.backup(eng, 42)
        # A second backup while one runs is refused.
        backup._running.add(eng.path)
        try:
            with pytest.raises(errors.BadValue, match="already running"):
                await backup.backup(eng, str(tmp_path / "two"))
        finally:
            backup._running.discard(eng.path)
        assert not (tmp_path / "two").exists()
        full = tmp_path / "full"
        full.mkdir()
        (full / "x").write_text("x")
        with pytest.raises(errors.BadValue, match="not empty"):
            await backup.backup(eng, str(full))
        assert await backup.backup(eng, str(tmp_path / "three"))
    finally:
        eng.close()


def test_restore_refuses_without_changing_anything(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "src")
    with pytest.raises(backup.RestoreError, match="is not a directory"):
        backup.restore(str(tmp_path / "nothing-here"), str(tmp_path / "x"))
    # An LMDB environment that is not tenantkv's
    other = tmp_path / "other"
    env = lmdb.open(str(other))
    with env.begin(write=True) as txn:
        txn.put(b"a", b"b")
    env.close()
    with pytest.raises(backup.RestoreError, match="not tenantkv data"):
        backup.restore(str(other), str(tmp_path / "x"))

    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("keep")
    with pytest.raises(backup.RestoreError, match=r"not empty.*--force"):
        backup.restore(str(tmp_path / "src"), str(target))
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt", "tenantkv.lock"]
    backup.restore(str(tmp_path / "src"), str(target), force=True)
    assert (target / "notes.txt").read_text() == "keep"  # only the data is replaced

    eng = Engine(target, map_size=64 << 20)  # a server holds it
    try:
        with pytest.raises(backup.RestoreError, match="stop it"):
            backup.restore(str(tmp_path / "src"), str(target), force=True)
    finally:
        eng.close()
    with pytest.raises(backup.RestoreError, match="same directory"):
        backup.restore(str(target), str(target), force=True)


class _SlowCopyEnv:
    """The real environment, but a copy that first sleeps (a big data file)."""

    def __init__(self, env: Any, secs: float) -> None:
        self._env, self._secs = env, secs
        self.copy_started = self.copy_ended = 0.0

    def copy(self, path: str, compact: bool = False) -> None:
        self.copy_started = time.monotonic()
        time.sleep(self._secs)
        self._env.copy(path, compact=compact)
        self.copy_ended = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


@pytest.mark.skipif(
    not hasattr(Engine, "copy_to"),
    reason="Engine.copy_to is not there yet: map growth during a backup would hold "
    "txn_lock until the copy ends (see tenantkv/storage/backup.py)",
)
def test_map_growth_during_a_copy_waits_without_blocking_readers(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "src")
    eng = Engine(tmp_path / "src", map_size=64 << 20)
    slow = _SlowCopyEnv(eng.env, 0.4)
    eng.env = slow
    (tmp_path / "bk").mkdir()
    grown = [0.0]
    try:
        copier = threading.Thread(target=backup.copy_environment, args=(eng, str(tmp_path / "bk")))
        copier.start()
        time.sleep(0.05)
        assert not eng.maybe_grow(1 << 40)  # proactive growth waits for the copy's end

        def grow() -> None:
            eng.force_grow(1 << 20)  # a full map must grow: it waits, outside txn_lock
            grown[0] = time.monotonic()

        grower = threading.Thread(target=grow)
        grower.start()
        reads: list[tuple[float, float]] = []  # (began, ended) of each read
        while copier.is_alive():
            t0 = time.monotonic()
            assert eng.get(eng.bucket("b"), b"k000001") is not None
            reads.append((t0, time.monotonic()))
            time.sleep(0.001)
        copier.join()
        grower.join(10)
        # Inline reads went on during the copy: one began and ended inside it (a
        # read held by the copy would end after it). An order, not a duration: a
        # loaded machine makes the reads slower, never the copy shorter.
        inside = [r for r in reads if slow.copy_started < r[0] and r[1] < slow.copy_ended]
        assert inside, (slow.copy_started, slow.copy_ended, reads[:3])
        assert grown[0] >= slow.copy_ended > 0  # the map grew after the copy
        assert eng.map_usage()[1] > 64 << 20
    finally:
        eng.env = slow._env
        eng.close()
