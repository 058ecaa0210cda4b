"""Online backup and offline restore of a data directory.

Backup (``tenantkv-admin backup PATH``, the ``backup`` admin command)
    LMDB's compacting copy (``mdb_env_copy2`` with ``MDB_CP_COMPACT``, py-lmdb's
    ``env.copy(path, compact=True)``) of the whole environment as of one read
    transaction: *consistent* — every write committed before it began, nothing
    after, across all buckets, users, throttle settings and parameters — and
    *compacted* — free pages left out, so the copy is as large as the data, not
    the map. It runs on a worker thread while the server goes on serving reads
    and writes. A backup directory holds ``data.mdb`` and ``tenantkv-backup.json``
    (when, from where, how big).

    The copy holds a read transaction for its whole run, and LMDB cannot resize
    the map under an open transaction: py-lmdb makes ``set_mapsize`` wait for a
    running copy. The engine's map growth therefore must not wait *inside*
    ``txn_lock`` (inline readers on the event loop take that lock): the copy goes
    through :meth:`Engine.copy_to` when the engine has it, which defers growth
    until the copy is done (see the note in :func:`copy_environment`).

Restore (``tenantkv restore BACKUP_DIR --data-dir DIR``)
    Offline: checks that the backup opens as a tenantkv LMDB environment, takes the
    target's lock (refusing while a server uses it), refuses a non-empty target
    unless ``force``, then copies ``data.mdb`` in (fsynced, renamed into place).
    The restored directory starts like any other: same buckets, data, users,
    throttle properties and saved parameters.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from typing import Any

import lmdb
import msgpack
import trio

from tenantkv import errors
from tenantkv._version import __version__
from tenantkv.storage.engine import FORMAT_KEY, FORMAT_VERSION, LOCK_FILE, SYSTEM_DB, Engine

DATA_FILE = "data.mdb"
LMDB_LOCK_FILE = "lock.mdb"
MANIFEST = "tenantkv-backup.json"
#: What restore --force replaces in a target data directory (the admin-password
#: file belongs to the data it replaces).
REPLACED_FILES = (DATA_FILE, LMDB_LOCK_FILE, "admin-password")

#: Data directories with a backup running in this process (one at a time each).
_running: set[str] = set()


class RestoreError(Exception):
    """Restore cannot go on; the message says why in one line."""


# -- backup --------------------------------------------------------------------------


def _prepare_destination(path: str) -> tuple[str, bool]:
    """Check ``path`` and create it: (normalised path, whether this call created it).
    BadValue when it is relative, not a directory, or a non-empty directory."""
    if not os.path.isabs(path):
        raise errors.BadValue(
            f"backup path {path!r} must be absolute (it is a path on the server's machine)"
        )
    path = os.path.normpath(path)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise errors.BadValue(f"backup path {path!r} exists and is not a directory")
        if os.listdir(path):
            raise errors.BadValue(
                f"backup path {path!r} is not empty; give a new or empty directory"
            )
        return path, False
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        raise errors.BadValue(f"cannot create backup directory {path!r}: {exc.strerror}") from None
    return path, True


def copy_environment(engine: Engine, dest: str) -> None:
    """The compacting copy into ``dest`` (an empty directory), on a worker thread.

    ``Engine.copy_to`` (when present) runs the copy so that map growth waits for
    it outside ``txn_lock``. Without it the plain copy is still consistent and
    safe — py-lmdb makes ``set_mapsize`` wait for the copy — but a map growth
    falling inside the copy would hold ``txn_lock`` while it waits, stalling the
    event loop's inline reads until the copy ends.
    """
    copy_to = getattr(engine, "copy_to", None)
    if copy_to is not None:
        copy_to(dest)
    else:
        engine.env.copy(dest, compact=True)


def _fsync_path(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _backup_sync(engine: Engine, dest: str) -> dict[str, Any]:
    started = time.time()
    t0 = time.monotonic()
    copy_environment(engine, dest)
    data = os.path.join(dest, DATA_FILE)
    os.chmod(data, 0o600)
    _fsync_path(data)
    size = os.path.getsize(data)
    duration = time.monotonic() - t0
    manifest = {
        "tenantkv_version": __version__,
        "format_version": FORMAT_VERSION,
        "source": {"host": socket.gethostname(), "data_dir": os.path.abspath(engine.path)},
        "started": started,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "bytes": size,
        "duration_secs": round(duration, 3),
    }
    _write_json(os.path.join(dest, MANIFEST), manifest)
    _fsync_path(dest, directory=True)
    return manifest


async def backup(engine: Engine, path: Any) -> dict[str, Any]:
    """Write a consistent, compacted copy of ``engine``'s environment to ``path`` while
    the server serves. Returns ``{path, bytes, duration_secs, started_utc}``.

    BadValue for a bad destination or when a backup is already running."""
    if not isinstance(path, str) or not path:
        raise errors.BadValue("'path' must be a non-empty string")
    key = engine.path
    if key in _running:
        raise errors.BadValue("a backup of this server is already running; wait for it")
    _running.add(key)
    try:
        path, created = await trio.to_thread.run_sync(_prepare_destination, path)
    except BaseException:
        _running.discard(key)
        raise
    try:
        # Not abandoned on cancel: the engine must outlive the copy (a shutdown
        # waits for it; the copy cannot be interrupted).
        manifest = await trio.to_thread.run_sync(_backup_sync, engine, path)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_remove_partial, path, created)
        if isinstance(exc, (lmdb.Error, OSError)):
            raise errors.InternalError(f"backup to {path!r} failed: {exc}") from None
        raise
    finally:
        _running.discard(key)
    return {
        "path": path,
        "bytes": manifest["bytes"],
        "duration_secs": manifest["duration_secs"],
        "started_utc": manifest["started_utc"],
    }


def _remove_partial(path: str, created: bool) -> None:
    """Remove what a failed backup left (the directory too, if it made it)."""
    for name in (DATA_FILE, LMDB_LOCK_FILE, MANIFEST, MANIFEST + ".tmp"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, name))
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(path)


# -- validation and restore --------------------------------------------------------------


def inspect(path: str) -> dict[str, Any]:
    """Open a backup (or a stopped data directory) read-only and describe it:
    ``{format_version, buckets, users, bytes, manifest}``. RestoreError if it is not a
    tenantkv LMDB environment this build can read."""
    data = os.path.join(path, DATA_FILE)
    if not os.path.isdir(path):
        raise RestoreError(f"{path} is not a directory")
    if not os.path.isfile(data):
        raise RestoreError(f"{path} holds no {DATA_FILE}: not a tenantkv backup")
    try:
        env = lmdb.open(path, readonly=True, lock=False, max_dbs=4, subdir=True)
    except lmdb.Error as exc:
        raise RestoreError(f"{data} does not open as LMDB: {exc}") from None
    try:
        with env.begin() as txn:
            try:
                system = env.open_db(SYSTEM_DB, txn=txn, create=False)
            except lmdb.Error:
                raise RestoreError(f"{data} is LMDB but not tenantkv data") from None
            raw = txn.get(FORMAT_KEY, db=system)
            version = int(raw) if raw is not None and raw.isdigit() else 1
            if version > FORMAT_VERSION:
                raise RestoreError(
                    f"{data} holds format version {version}; this tenantkv reads up to "
                    f"{FORMAT_VERSION}: restore with a newer tenantkv"
                )
            buckets: list[str] = []
            users = 0
            for key, value in txn.cursor(db=system):
                if key.startswith(b"bucket:"):
                    buckets.append(key[len(b"bucket:") :].decode())
                    msgpack.unpackb(value)  # readable, or the backup is damaged
                elif key.startswith(b"user:"):
                    users += 1
    except lmdb.Error as exc:
        raise RestoreError(f"{data} cannot be read: {exc}") from None
    finally:
        env.close()
    manifest = None
    with contextlib.suppress(OSError, ValueError), open(os.path.join(path, MANIFEST)) as f:
        manifest = json.load(f)
    return {
        "format_version": version,
        "buckets": sorted(buckets),
        "users": users,
        "bytes": os.path.getsize(data),
        "manifest": manifest,
    }


def restore(backup_dir: str, data_dir: str, *, force: bool = False) -> dict[str, Any]:
    """Copy a backup into ``data_dir`` (offline). Returns what :func:`inspect` says of
    it, plus ``data_dir``. RestoreError, having changed nothing, if the backup is not
    valid, a server uses ``data_dir``, or ``data_dir`` is not empty and not ``force``."""
    info = inspect(backup_dir)
    if os.path.realpath(backup_dir) == os.path.realpath(data_dir):
        raise RestoreError("the backup and the data directory are the same directory")
    try:
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise RestoreError(f"cannot create {data_dir}: {exc.strerror}") from None
    if not os.path.isdir(data_dir):
        raise RestoreError(f"{data_dir} is not a directory")
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise RestoreError(
                f"a tenantkv server is using {data_dir}; stop it before restoring"
            ) from None
        present = [n for n in os.listdir(data_dir) if n != LOCK_FILE]
        if present and not force:
            raise RestoreError(
                f"{data_dir} is not empty ({', '.join(sorted(present)[:5])}); restore into "
                "a new directory, or pass --force to replace its data"
            )
        for name in REPLACED_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(data_dir, name))
        target = os.path.join(data_dir, DATA_FILE)
        tmp = target + ".restoring"
        shutil.copyfile(os.path.join(backup_dir, DATA_FILE), tmp)
        os.chmod(tmp, 0o600)
        _fsync_path(tmp)
        os.replace(tmp, target)
        _fsync_path(data_dir, directory=True)
    finally:
        os.close(fd)  # releases the lock
    inspect(data_dir)  # the copy reads back
    return {**info, "data_dir": data_dir}
