"""Storage faults: map growth under load, a full disk, and data directories that
cannot be used.

- Map growth: a daemon started with a 1 MiB map takes concurrent writers and
  readers; the map grows under them and nobody sees an error.
- Disk full, injected (always runs): the engine's write transactions fail at
  commit with ENOSPC; writers get ``StorageFull``, nothing of the failed batch
  is stored, and writing resumes when the fault goes. The EIO that LMDB reports
  for a short write is classified by the free space left.
- Disk full, for real (when this process may ``mount`` a tmpfs, i.e. as root):
  the daemon's data directory on an 8 MiB tmpfs; filled until ``StorageFull``;
  reads and deletes go on; room is made by removing a filler file; writes
  resume; a restart finds every acknowledged write.
- Start-up: a missing directory is created; a file in its place, an unreadable
  directory, a directory another server holds, a file that is not LMDB data,
  or a newer data format stop start-up with exit status 1 and one log line
  naming the problem (no traceback).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from tenantkv import errors
from tenantkv.storage import engine as engine_mod
from tenantkv.storage.engine import Engine
from tenantkv.storage.group_commit import GroupCommitWriter, Pending
from tenantkv.storage.ops import CreateBucketOp, DeleteOp, SetOp, WriteOp
from tests.conftest import Daemon

TIMEOUT = 20


# -- map growth under load ------------------------------------------------------------------


def test_map_grows_under_concurrent_load(tmp_path: Path) -> None:
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("[server]\nmap_size_mb = 1\n")
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        with d.client() as c:
            c.create_bucket("g")
            before = c.server_status()["storage"]["map_size_bytes"]
        failures: list[BaseException] = []
        done = threading.Event()

        def writer(w: int) -> None:
            try:
                with d.client(bucket="g", timeout=60) as c:
                    for i in range(60):
                        with c.pipeline() as p:
                            for j in range(10):
                                p.set(f"w{w}:{i}:{j}", bytes([w]) * 6000)
            except BaseException as exc:
                failures.append(exc)

        def reader() -> None:
            try:
                with d.client(bucket="g", timeout=60) as c:
                    while not done.is_set():
                        c.mget([f"w0:{i}:0" for i in range(20)])
                        c.scan(prefix="w1:", limit=50)
            except BaseException as exc:
                failures.append(exc)

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in writers + readers:
            t.start()
        for t in writers:
            t.join(120)
        done.set()
        for t in readers:
            t.join(TIMEOUT)
        assert not failures, failures[:3]
        with d.client(bucket="g") as c:
            st = c.server_status()["storage"]
            assert c.get("w5:59:9") == bytes([5]) * 6000
            assert st["map_size_bytes"] > before and st["writer"]["map_grows"] >= 2
            assert st["writer"]["failed_batches"] == 0
            assert c.server_status()["buckets"]["g"]["entries"] == 6 * 60 * 10
        print(f"map grew {before} -> {st['map_size_bytes']} in {st['writer']['map_grows']} steps")
    finally:
        d.kill()


# -- disk full, injected ---------------------------------------------------------------------


class _FaultyTxn:
    def __init__(self, txn: Any, env: _FaultyEnv) -> None:
        self._txn, self._env = txn, env

    def commit(self) -> None:
        if self._env.fault is not None:
            self._txn.abort()
            raise self._env.fault
        self._txn.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)


class _FaultyEnv:
    """The engine's LMDB environment, whose write commits fail while ``fault`` is set."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.fault: BaseException | None = None

    def begin(self, *args: Any, **kwargs: Any) -> Any:
        txn = self._env.begin(*args, **kwargs)
        return _FaultyTxn(txn, self) if kwargs.get("write") else txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


class Store:
    def __init__(self, path: Path) -> None:
        self.engine = Engine(path, map_size=4 << 20)
        self.faulty = _FaultyEnv(self.engine.env)
        self.writer = GroupCommitWriter(self.engine, self._deliver)
        self.writer.start()

    @staticmethod
    def _deliver(batch: list[Pending]) -> None:
        for p in batch:
            p.callback(p.result, p.error)

    def run(self, *ops: WriteOp) -> list[tuple[Any, BaseException | None]]:
        out: list[Any] = [None] * len(ops)
        left = threading.Semaphore(0)
        for i, op in enumerate(ops):

            def cb(result: Any, error: BaseException | None, i: int = i) -> None:
                out[i] = (result, error)
                left.release()

            self.writer.submit(op, cb)
        for _ in ops:
            assert left.acquire(timeout=TIMEOUT)
        return out

    def close(self) -> None:
        self.engine.env = self.faulty._env
        self.writer.stop()
        self.writer.join(TIMEOUT)
        self.engine.close()


def test_injected_disk_full_gives_storage_full_and_service_resumes(tmp_path: Path) -> None:
    store = Store(tmp_path / "db")
    try:
        ((handle, err),) = store.run(CreateBucketOp("b", {}))
        assert err is None
        store.engine.buckets["b"] = handle
        assert store.run(SetOp(handle, b"before", b"kept"))[0][1] is None
        store.engine.env = store.faulty
        store.faulty.fault = OSError(errno.ENOSPC, "No space left on device")
        failed = store.run(*(SetOp(handle, b"k%d" % i, b"x" * 1000) for i in range(20)))
        assert all(isinstance(e, errors.StorageFull) for _, e in failed), failed[:2]
        assert "disk full" in str(failed[0][1])
        assert store.writer.failed_batches >= 1
        for i in range(20):  # nothing of the failed batches was stored
            assert store.engine.get(handle, b"k%d" % i) is None
        assert store.engine.get(handle, b"before").value == b"kept"  # type: ignore[union-attr]
        store.faulty.fault = None  # space returns
        done = store.run(SetOp(handle, b"after", b"v"), DeleteOp(handle, b"before"))
        assert [e for _, e in done] == [None, None]
    finally:
        store.close()
    reopened = Engine(tmp_path / "db")  # nothing corrupted
    try:
        b = reopened.bucket("b")
        assert reopened.get(b, b"after").value == b"v"  # type: ignore[union-attr]
        assert reopened.get(b, b"before") is None and reopened.get(b, b"k0") is None
    finally:
        reopened.close()


def test_eio_from_lmdb_is_disk_full_only_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(tmp_path / "db")  # is_disk_full looks at the open engines' filesystems
    short_write = lmdb.Error("mdb_txn_commit: Input/output error")
    free = [10 << 30]
    monkeypatch.setattr(Engine, "disk_free_bytes", lambda self: free[0])
    assert not engine_mod.is_disk_full(short_write)  # plenty of room: a real I/O error
    free[0] = 4096
    assert engine_mod.is_disk_full(short_write)
    assert engine_mod.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert engine_mod.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not engine_mod.is_disk_full(lmdb.Error("MDB_CORRUPTED"))
    eng.close()


# -- disk full, for real --------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
            capture_output=True,
            timeout=TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("cannot run mount here")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=TIMEOUT)


def test_real_disk_full_on_a_tiny_tmpfs(tiny_fs: Path, tmp_path: Path) -> None:
    filler = tiny_fs / "filler"
    filler.write_bytes(b"\0" * (2 << 20))  # 2 MiB we can give back later
    (tiny_fs / "data").mkdir()
    (tmp_path / "data").symlink_to(tiny_fs / "data")  # the log and ready file stay off it
    cfg = tmp_path / "tenantkv.toml"
    cfg.write_text("[server]\nmap_size_mb = 64\n")  # sparse: far more than the disk
    d = Daemon(tmp_path / "data", extra_args=["--config", str(cfg)]).start()
    try:
        acked: dict[str, bytes] = {}
        with d.client() as c:
            c.create_bucket("f")
        with d.client(bucket="f", timeout=60, max_overload_retries=0) as c:
            full = None
            for i in range(2000):
                value = os.urandom(64 * 1024)
                try:
                    c.set(f"k{i}", value)
                except errors.StorageFull as exc:
                    full = exc
                    break
                acked[f"k{i}"] = value
            assert full is not None, "the disk never filled"
            assert "disk full" in str(full), full
            assert len(acked) > 10
            # The connection and the server live on; reads and deletes still work.
            some = next(iter(acked))
            assert c.get(some) == acked[some]
            assert c.delete(some) is True
            del acked[some]
            filler.unlink()  # space returns
            for i in range(5):
                c.set(f"again{i}", b"v" * 1000)
                acked[f"again{i}"] = b"v" * 1000
        assert d.stop(signal.SIGTERM) == 0
        d.start()
        with d.client(bucket="f", timeout=60) as c:
            for key, value in acked.items():
                assert c.get(key) == value, key
        assert "write batch of 1 failed: StorageFull" in d.log()
    finally:
        d.kill()


# -- start-up errors -------------------------------------------------------------------------


def serve(data_dir: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``tenantkv serve`` expecting it to stop by itself."""
    env = {**os.environ, "TENANTKV_ADMIN_PASSWORD": "pw"}
    cmd = [sys.executable, "-m", "tenantkv.server.cli", "serve"]
    return subprocess.run(
        [*cmd, "--data-dir", str(data_dir), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_refused(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors_logged = [line for line in r.stderr.splitlines() if "ERROR" in line]
    assert len(errors_logged) == 1, r.stderr
    for needle in needles:
        assert needle in errors_logged[0], errors_logged[0]


def test_missing_data_directory_is_created(tmp_path: Path) -> None:
    assert not (tmp_path / "data").exists()
    d = Daemon(tmp_path / "data").start()
    try:
        assert (tmp_path / "data" / "data.mdb").exists()
        assert (tmp_path / "data").stat().st_mode & 0o077 == 0  # the server's user only
        with d.client() as c:
            assert c.ping() == "pong"
    finally:
        d.kill()
    nested = Engine(tmp_path / "a" / "b" / "c")  # parents too
    nested.close()


def test_a_file_where_the_directory_should_be(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("oops")
    assert_refused(serve(tmp_path / "data"), "not a directory", str(tmp_path / "data"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0)
    try:
        assert_refused(serve(data), "permission denied")
    finally:
        data.chmod(0o700)


def test_not_lmdb_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "data.mdb").write_bytes(b"this is not an LMDB file" * 1000)
    assert_refused(serve(data), "LMDB cannot open it")


def test_two_servers_on_one_directory(tmp_path: Path) -> None:
    first = Daemon(tmp_path / "data").start()
    try:
        assert first.proc is not None
        assert_refused(serve(tmp_path / "data"), "another process", f"pid {first.proc.pid}")
        with first.client() as c:  # the first one is unharmed
            assert c.ping() == "pong"
    finally:
        first.kill()
    first.start()  # SIGKILL released the lock: a new server gets it
    first.kill()


def test_newer_data_format_is_refused(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "data").start()
    d.stop()
    env = lmdb.open(str(tmp_path / "data"), max_dbs=4)
    try:
        system = env.open_db(engine_mod.SYSTEM_DB)
        with env.begin(write=True) as txn:
            assert (
                txn.get(engine_mod.FORMAT_KEY, db=system) == str(engine_mod.FORMAT_VERSION).encode()
            )  # written at creation
            txn.put(engine_mod.FORMAT_KEY, b"99", db=system)
    finally:
        env.close()
    assert_refused(serve(tmp_path / "data"), "format version 99", "newer")


def test_a_fresh_server_on_a_full_disk_exits_with_a_clear_line(tiny_fs: Path) -> None:
    """LMDB maps its lock file: on a full filesystem its first touch was a SIGBUS
    with no log line. Now: exit status 1 and one ERROR line saying why."""
    filler = tiny_fs / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
    r = serve(tiny_fs / "data")
    assert_refused(r, "free", "disk full")


def test_eio_with_space_left_is_not_reported_as_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenantkv.storage.group_commit import GroupCommitWriter

    eng = Engine(tmp_path / "db")
    monkeypatch.setattr(Engine, "disk_free_bytes", lambda self: 10 << 30)
    err = GroupCommitWriter._storage_error(lmdb.Error("mdb_txn_commit: Input/output error"))
    assert isinstance(err, errors.InternalError) and "not a full disk" in err.errmsg
    full = GroupCommitWriter._storage_error(OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(full, errors.StorageFull)
    map_limit = errors.StorageFull("the map limit is reached")
    assert GroupCommitWriter._storage_error(map_limit) is map_limit
    eng.close()
