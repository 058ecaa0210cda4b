"""``INFO`` for the RESP door: Redis 7.0's sections and the fields tools read.

redis-py's test harness reads ``redis_version``, ``arch_bits`` and
``cluster_enabled``; ``redis-cli --stat`` reads ``connected_clients``,
``blocked_clients``, ``used_memory``, ``total_commands_processed``,
``total_connections_received`` and the ``dbN:keys=`` lines; exporters read
most of the rest. Every figure is real or a constant that is true of
tenantkv (no replicas, no evictions, no blocking commands); a figure tenantkv
does not keep is left out rather than made up.

Whose figure: the keyspace, ``total_commands_processed``,
``total_error_replies`` and the ``tenantkv`` section are the connection's
bucket's (a tenant sees its own work, never another's); the rest are this
serving process's (with ``--workers N``, the worker holding the connection).
docs/redis.md has the table.

Layout as Redis's ``genRedisInfoString``: a section is ``# Name`` and its
``field:value`` lines, each ended by CRLF, sections separated by an empty
line; ``INFO`` and ``INFO default`` give the default sections, ``INFO all``
and ``INFO everything`` every one, ``INFO a b ...`` the named ones
(case-insensitive; an unknown name adds nothing).
"""

from __future__ import annotations

import os
import platform
import resource
import secrets
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tenantkv._version import __version__

if TYPE_CHECKING:
    from tenantkv.server.executor import Executor

#: The Redis version the door speaks as (clients gate features on it: redis-py's
#: client-side cache needs 7.4, and HELLO's ``server`` to say ``redis``).
REDIS_VERSION = "7.4.0"
#: Redis's run id: random per process start (40 hex digits, as Redis's).
RUN_ID = secrets.token_hex(20)

Fields = list[tuple[str, object]]


def _server(ex: Executor) -> Fields:
    node = ex.node
    uptime = int(time.monotonic() - node.started_monotonic)
    return [
        ("redis_version", REDIS_VERSION),
        ("tenantkv_version", __version__),
        ("redis_mode", "cluster" if node.config.cluster else "standalone"),
        ("os", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("arch_bits", struct.calcsize("P") * 8),
        ("process_id", os.getpid()),
        ("run_id", RUN_ID),
        ("tcp_port", node.resp_port),
        ("server_time_usec", time.time_ns() // 1000),
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
    ]


def _clients(ex: Executor) -> Fields:
    node = ex.node
    return [
        ("connected_clients", len(node.sessions)),
        ("cluster_connections", 0),
        ("maxclients", node.config.max_connections),
        ("blocked_clients", 0),  # (no blocking commands)
        ("tracking_clients", 0),
    ]


def _memory(ex: Executor) -> Fields:
    proc = _proc_status()
    heap = proc.get("RssAnon", 0)
    rss = proc.get("VmRSS", 0)
    peak = proc.get("VmHWM", rss)
    total = _total_memory()
    return [
        ("used_memory", heap),
        ("used_memory_human", human_bytes(heap)),
        ("used_memory_rss", rss),
        ("used_memory_rss_human", human_bytes(rss)),
        ("used_memory_peak", peak),
        ("used_memory_peak_human", human_bytes(peak)),
        ("total_system_memory", total),
        ("total_system_memory_human", human_bytes(total)),
        ("maxmemory", 0),
        ("maxmemory_human", "0B"),
        ("maxmemory_policy", "noeviction"),
        ("mem_allocator", "libc"),
    ]


def _persistence(ex: Executor) -> Fields:
    # Every write is on disk when it is acknowledged (one LMDB commit): nothing
    # is ever waiting for a save, and the append-only file is always "on".
    return [
        ("loading", 0),
        ("async_loading", 0),
        ("rdb_changes_since_last_save", 0),
        ("rdb_bgsave_in_progress", 0),
        ("rdb_last_save_time", int(time.time())),
        ("rdb_last_bgsave_status", "ok"),
        ("aof_enabled", 1),
        ("aof_rewrite_in_progress", 0),
        ("aof_last_write_status", "ok"),
    ]


def _stats(ex: Executor) -> Fields:
    node = ex.node
    st = node.bucket_stats.get(ex.bucket) if ex.bucket is not None else None
    return [
        ("total_connections_received", node.connections_total),
        ("total_commands_processed", sum(st.ops.values()) if st else 0),
        ("rejected_connections", node.connections_rejected),
        ("evicted_keys", 0),
        ("total_error_replies", sum(st.errors.values()) if st else 0),
        ("pubsub_channels", 0),
        ("pubsub_patterns", 0),
        ("tracking_total_keys", 0),
    ]


def _replication(ex: Executor) -> Fields:
    return [
        ("role", "master"),
        ("connected_slaves", 0),
        ("master_failover_state", "no-failover"),
        ("master_replid", RUN_ID),
        ("master_repl_offset", 0),
    ]


def _cpu(ex: Executor) -> Fields:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        ("used_cpu_sys", f"{me.ru_stime:.6f}"),
        ("used_cpu_user", f"{me.ru_utime:.6f}"),
        ("used_cpu_sys_children", f"{kids.ru_stime:.6f}"),
        ("used_cpu_user_children", f"{kids.ru_utime:.6f}"),
    ]


def _cluster(ex: Executor) -> Fields:
    # Cluster clients and test harnesses read this to tell a cluster node apart.
    return [("cluster_enabled", 1 if ex.node.config.cluster else 0)]


def _keyspace(ex: Executor) -> Fields:
    """The bucket as ``db0``, listed only when it holds keys (as Redis lists a
    database). ``expires`` and ``avg_ttl`` are 0: tenantkv keeps no count of
    keys with a TTL (docs/redis.md)."""
    node = ex.node
    if ex.bucket is None or ex.bucket not in node.engine.buckets:
        return []
    keys = node.engine.bucket_entries(ex.bucket)
    return [("db0", f"keys={keys},expires=0,avg_ttl=0")] if keys else []


def _tenantkv(ex: Executor) -> Fields:
    """The bucket's units, limits and throttling."""
    out: Fields = [("bucket", ex.bucket or "")]
    if ex.bucket is not None:
        b = ex.node.gate.statistics().buckets.get(ex.bucket)
        if b is not None:
            out += [(k, v) for k, v in b.as_dict().items() if not isinstance(v, (list, dict))]
    out.append(("nonblocking_throttle", int(ex.nonblocking_throttle)))
    return out


#: Every section in Redis's order, with its heading; all are in the default set.
SECTIONS: dict[str, tuple[str, Callable[[Executor], Fields]]] = {
    "server": ("Server", _server),
    "clients": ("Clients", _clients),
    "memory": ("Memory", _memory),
    "persistence": ("Persistence", _persistence),
    "stats": ("Stats", _stats),
    "replication": ("Replication", _replication),
    "cpu": ("CPU", _cpu),
    "cluster": ("Cluster", _cluster),
    "keyspace": ("Keyspace", _keyspace),
    "tenantkv": ("Tenantkv", _tenantkv),
}
#: INFO's arguments that name every section.
EVERY = frozenset({"default", "all", "everything"})


def info_text(ex: Executor, asked: list[bytes]) -> str:
    """INFO's reply text for the sections ``asked`` (none: the default ones)."""
    want = {a.decode(errors="replace").lower() for a in asked}
    every = not want or bool(want & EVERY)
    parts = []
    for name, (heading, fields) in SECTIONS.items():
        if every or name in want:
            lines = [f"# {heading}\r\n"] + [f"{k}:{v}\r\n" for k, v in fields(ex)]
            parts.append("".join(lines))
    return "\r\n".join(parts)


def human_bytes(n: int) -> str:
    """Redis's ``bytesToHuman``: ``512B``, ``1.50K``, ``20.00M``, ``1.00G``."""
    if n < 1024:
        return f"{n}B"
    d, unit = n / 1024, 0
    while d >= 1024 and unit < 3:
        d, unit = d / 1024, unit + 1
    return f"{d:.2f}{'KMGT'[unit]}"


def _proc_status() -> dict[str, int]:
    """This process's memory figures from ``/proc/self/status`` in bytes (none
    where there is no /proc)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("RssAnon", "VmRSS", "VmHWM"):
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
