"""Every server setting, declared once, and the TOML config loader built from it.

The declaration (the fields of :class:`Config`, each made by :func:`declare`) is
the single source of the name, type, default, range and help of each setting;
:data:`SETTINGS` is derived from it, and the loader, the environment
variables, the ``serve`` flags, ``tenantkv config defaults`` and
``docs/configuration.md`` all follow it. Precedence: command line >
environment (``TENANTKV_<NAME>``) > config file > defaults. An unknown key or a
bad value stops start-up with a message naming it (and the variable, for the
environment).
"""

from __future__ import annotations

import functools
import json
import math
import textwrap
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tenantkv import errors, protocol
from tenantkv.admission.throughput_probing import PROBING_PARAMETERS, validate_probing_param

DEFAULT_PORT = protocol.DEFAULT_PORT
#: The RESP front door's default: next to tenantkv's own, and not Redis's 6379 (a
#: Redis on the same machine must not be mistaken for tenantkv, nor the reverse).
DEFAULT_RESP_PORT = 7208
#: A setting ``name`` may also come from the environment variable ``ENV_PREFIX + NAME``.
ENV_PREFIX = "TENANTKV_"


#: Where tenantkv's defaults differ from MongoDB's throughput probing: our write
#: tickets are held until the group commit is durable, so the pool bounds the
#: commit batch. Write-heavy throughput still grew from 256 to 512 tickets
#: (python -m bench probing), and starting at 2 x CPUs cut 16 x 64 pipelined
#: durable SETs from ~70k to ~10k ops/s until probing caught up (~30 s).
#: So: start at the maximum (512 per pool) and let probing come down.
SERVER_PROBING_DEFAULTS: dict[str, Any] = {
    "throughput_probing_initial_concurrency": 1024,
    "throughput_probing_max_concurrency": 512,
}


class ConfigError(ValueError):
    """A config file or flag is wrong; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    type: type
    default: Any
    help: str
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] = ()
    #: None allowed (the setting is "off" or "unbounded" when None)
    optional: bool = False
    #: changeable while the server runs (admin command set_parameter)
    runtime: bool = False
    #: extra check after type and range (e.g. an open interval); raises ValueError
    validate: Callable[[Any], Any] | None = None
    #: a value to show, commented out, for an optional setting that defaults to unset
    example: Any = None

    @property
    def env_var(self) -> str:
        """The environment variable that sets it: ``TENANTKV_<NAME>``."""
        return ENV_PREFIX + self.name.upper()


def declare(
    default: Any,
    help: str,
    min: float | None = None,
    max: float | None = None,
    *,
    choices: tuple[str, ...] = (),
    optional: bool = False,
    validate: Callable[[Any], Any] | None = None,
    example: Any = None,
) -> Any:
    """A setting, declared as a :class:`Config` field: its default, help text and
    checks (the field's annotation is its type). :data:`SETTINGS` is built from these."""
    return field(
        default=default,
        metadata={
            "help": help,
            "min": min,
            "max": max,
            "choices": choices,
            "optional": optional,
            "validate": validate,
            "example": example,
        },
    )


def probing(name: str) -> Any:
    """A throughput-probing setting: declared once, in :data:`PROBING_PARAMETERS`."""
    p = PROBING_PARAMETERS[name]
    return declare(
        SERVER_PROBING_DEFAULTS.get(name, p.default),
        p.help,
        p.minimum,
        p.maximum,
        validate=functools.partial(validate_probing_param, name),
    )


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting, declared once, in the order ``docs/configuration.md`` lists them."""

    data_dir: str = declare("./tenantkv-data", "Directory holding the LMDB files.")
    host: str = declare("127.0.0.1", "Address to listen on.")
    port: int = declare(DEFAULT_PORT, "TCP port; 0 picks a free port.", 0, 65535)
    resp_port: int = declare(
        DEFAULT_RESP_PORT,
        "TCP port of the RESP (Redis protocol) front door on the same host; 0 picks a "
        "free port (see docs/redis.md).",
        0,
        65535,
    )
    resp_enabled: bool = declare(True, "Serve the RESP (Redis protocol) front door on resp_port.")
    workers: int = declare(
        1,
        "Worker processes serving the one port and data directory, each on its own core "
        "(docs/scaling.md); 1 is a single process; 0 is one per usable core "
        "(--workers auto).",
        0,
        256,
    )
    cluster: str | None = declare(
        None,
        "Join a cluster coordinated by etcd: its client URLs, comma-separated "
        "(docs/cluster.md); unset: a single node that needs no etcd.",
        optional=True,
        validate=lambda v: _validated_cluster_urls(v),
        example="http://127.0.0.1:2379",
    )
    node_name: str | None = declare(
        None,
        "This node's name in the cluster, unique in it (default: the host name).",
        optional=True,
        validate=lambda v: _validated_node_name(v),
        example="node1",
    )
    advertise: str | None = declare(
        None,
        "HOST:PORT where clients and other nodes reach this node's main port (default: "
        "host and the port listened on; port 0: the port listened on).",
        optional=True,
        validate=lambda v: _validated_advertise(v),
        example="10.0.0.5:7207",
    )
    cluster_prefix: str = declare(
        "/tenantkv",
        "Key prefix of this cluster in etcd (clusters sharing one etcd differ here).",
        validate=lambda v: _validated_cluster_prefix(v),
    )
    cluster_lease_ttl_secs: int = declare(
        10,
        "TTL of the node's etcd lease: a node that stops renewing it is marked down this "
        "long after, and stops serving its slots by then (fencing).",
        1,
        3600,
    )
    cluster_min_nodes: int = declare(
        1,
        "Nodes that must be up before the coordinator first assigns the slots (start a new "
        "cluster of N nodes with N here, so that each gets a share).",
        1,
        1000,
    )
    metrics_port: int | None = declare(
        None,
        "Prometheus metrics port (/metrics and /healthz; off when unset).",
        0,
        65535,
        optional=True,
        example=9207,
    )
    metrics_host: str = declare(
        "127.0.0.1",
        "Address the metrics port listens on (loopback by default: metrics name buckets "
        "and users; 0.0.0.0 for a scraper on another machine).",
    )
    durability: str = declare(
        "fsync",
        "fsync: acknowledge writes after fsync; "
        "nosync: after the OS has the data (survives a process crash, not a power loss).",
        choices=("fsync", "nosync"),
    )
    map_size_mb: int = declare(1024, "Initial LMDB map size; it grows on its own.", 1)
    max_map_size_mb: int = declare(0, "Largest map size (0 = limited only by the disk).", 0)
    max_buckets: int = declare(1000, "Most buckets on this node.", 1, 30000)
    max_value_bytes: int = declare(
        protocol.MAX_VALUE_BYTES,
        "Largest value accepted.",
        0,
        protocol.MAX_VALUE_BYTES,
    )
    max_connections: int = declare(10000, "Most open client connections.", 1)
    max_connections_per_address: int = declare(
        1000,
        "Most open connections from one client address (beyond it, the oldest connection "
        "that has not said hello gives way, or the new one is refused).",
        1,
    )
    admin_reserved_connections: int = declare(
        3,
        "Connection slots only admins may use (at most max_connections - 1 apply).",
        0,
    )
    admin_reserved_connections_per_address: int = declare(
        3,
        "Connections from one address beyond max_connections_per_address that only admins "
        "may use (a host's users filling its slots cannot lock out its admin).",
        0,
        1000,
    )
    max_receive_buffer_bytes: int = declare(
        128 * 1024 * 1024,
        "Most bytes clients make the server hold, over all connections together: received "
        "and not yet decoded, and writes decoded and not yet durable (one user's connections: "
        "at most half). A connection that would pass it is not read (TCP back-pressure), "
        "except one at a time that holds part of a frame, which finishes it. The server's "
        "memory under such load is about twice this (a write's value and its commit's copy).",
        1024 * 1024,
    )
    max_inflight_per_connection: int = declare(
        1024,
        "Pipelined requests a connection may have unanswered before it stops being read.",
        1,
    )
    hello_timeout_secs: float = declare(10.0, "Time a new connection has to send hello.", 0.1)
    idle_timeout_secs: float = declare(3600.0, "Close connections idle this long (0 = never).", 0)
    frame_timeout_secs: float = declare(
        60.0,
        "Time a request frame has to arrive in full once its first byte came "
        "(a slow sender cannot hold a connection and its buffer).",
        0.1,
    )
    shutdown_grace_secs: float = declare(
        10.0,
        "On SIGTERM/SIGINT, time in-flight requests get to finish.",
        0,
    )
    expiry_pager_interval_secs: float = declare(
        5.0,
        "Longest the expiry pager sleeps. It wakes when the next record expires (and "
        "when a write sets an earlier expiry) to reclaim it from disk; this bounds the "
        "sleep in case the wall clock is stepped.",
        0.01,
    )
    tracking_table_max_keys: int = declare(
        100_000,
        "Most keys the RESP door's client-side caching (CLIENT TRACKING) remembers per "
        "process, as Redis's tracking-table-max-keys (~0.5 KB each with its readers); "
        "past it the oldest key of the bucket that holds the most is invalidated (its "
        "readers told) and forgotten, so one tenant's reads evict its own keys first.",
        1,
    )
    read_unit_size: int = declare(
        4096,
        "Bytes per read unit (RU): a read costs ceil(bytes / read_unit_size).",
        1,
    )
    write_unit_size: int = declare(
        4096,
        "Bytes per write unit (WU): a write costs ceil(bytes / write_unit_size).",
        1,
    )
    write_weight: int = declare(
        2,
        "Throttling cost of one WU in RU (a write also persists).",
        0,
        1000,
    )
    min_op_units: int = declare(
        1,
        "Least throttle cost of any executed operation, in RU (a write costs at least "
        "min_op_units x write_weight): misses and failed writes are throttled like hits. "
        "Metering (ru_total/wu_total) is unchanged.",
        0,
        1000,
    )
    throttle_max_wait_ms: int = declare(
        5000,
        "Longest a throttled request waits before it fails with Throttled.",
        0,
    )
    ingress_request_rate_limiter_enabled: bool = declare(
        False,
        "Limit the node's request rate (462 IngressRequestRateLimitExceeded beyond it).",
    )
    ingress_request_admission_rate_per_sec: float = declare(
        100000.0,
        "Requests per second the node admits when the limiter is on.",
        0.001,
        1e9,
    )
    ingress_request_admission_burst_capacity_secs: float = declare(
        1.0,
        "Burst of the request limiter, in seconds of its rate.",
        0.001,
        1e6,
    )
    ingress_request_rate_limiter_exemptions: str = declare(
        "",
        "Client addresses (CIDR list, comma-separated; IPv4 and IPv6) never rate-limited.",
    )
    ingress_connection_establishment_rate_limiter_enabled: bool = declare(
        False,
        "Limit the rate of new connections (they queue, then are refused).",
    )
    ingress_connection_establishment_rate_per_sec: float = declare(
        1000.0,
        "New connections per second admitted when the limiter is on.",
        0.001,
        1e9,
    )
    ingress_connection_establishment_burst_capacity_secs: float = declare(
        1.0,
        "Burst of the connection limiter, in seconds of its rate.",
        0.001,
        1e6,
    )
    ingress_connection_establishment_max_queue_depth: int = declare(
        100,
        "New connections that may wait for the connection limiter; more are refused.",
        0,
        1_000_000,
    )
    ingress_connection_establishment_rate_limiter_bypass: str = declare(
        "",
        "Client addresses (CIDR list) that skip the connection limiter.",
    )
    ingress_admission_controller_enabled: bool = declare(
        True,
        "Take an ingress admission ticket per operation (MongoDB's "
        "ingressAdmissionControllerEnabled); off, the controller costs nothing.",
    )
    bucket_queue_enabled: bool = declare(
        True,
        "Bound each bucket's concurrent operations per class (bucket_queue_*); off, "
        "requests skip the bucket queues.",
    )
    write_permit_enabled: bool = declare(
        True,
        "Lag-driven write permits per bucket (write_permit_*); off, writes skip them.",
    )
    ingress_admission_tickets: int = declare(
        1_000_000,
        "Operations that may be in the server at once (ingress admission controller).",
        1,
        1_000_000_000,
    )
    bucket_queue_concurrency: int = declare(
        512,
        "Per bucket and class (read/write): operations running at once.",
        1,
        65536,
    )
    bucket_queue_tolerance: int = declare(
        1024,
        "Per bucket and class: operations that may wait for a slot; more are rejected "
        "with AdmissionQueueOverflow.",
        0,
        1_000_000,
    )
    bucket_queue_pending_timeout_ms: int = declare(
        1000,
        "Longest an operation waits for a bucket-queue slot (0 = no limit).",
        0,
        600_000,
    )
    write_permit_target_lag: int = declare(
        1024,
        "Write backlog (queued, not yet durable) up to which buckets get max permits.",
        0,
        100_000_000,
    )
    write_permit_critical_lag: int = declare(
        8192,
        "Write backlog from which buckets get min permits.",
        1,
        100_000_000,
    )
    write_permit_min_capacity: int = declare(4, "Fewest write permits per bucket.", 1, 65536)
    write_permit_max_capacity: int = declare(512, "Most write permits per bucket.", 1, 65536)
    write_permit_adjustment_interval_ms: int = declare(
        10,
        "How often write permits follow the backlog.",
        1,
        60000,
    )
    execution_read_max_queue_depth: int | None = declare(
        None,
        "Most reads waiting for an execution ticket; beyond it AdmissionQueueOverflow "
        "(unset = unbounded).",
        0,
        optional=True,
        example=4096,
    )
    execution_write_max_queue_depth: int | None = declare(
        None,
        "Most writes waiting for an execution ticket; beyond it AdmissionQueueOverflow "
        "(unset = unbounded).",
        0,
        optional=True,
        example=4096,
    )
    throughput_probing_initial_concurrency: int = probing("throughput_probing_initial_concurrency")
    throughput_probing_min_concurrency: int = probing("throughput_probing_min_concurrency")
    throughput_probing_max_concurrency: int = probing("throughput_probing_max_concurrency")
    throughput_probing_read_write_ratio: float = probing("throughput_probing_read_write_ratio")
    throughput_probing_concurrency_moving_average_weight: float = probing(
        "throughput_probing_concurrency_moving_average_weight"
    )
    throughput_probing_step_multiple: float = probing("throughput_probing_step_multiple")
    throughput_probing_max_step_multiple: float = probing("throughput_probing_max_step_multiple")
    throughput_probing_concurrency_adjustment_interval_ms: int = probing(
        "throughput_probing_concurrency_adjustment_interval_ms"
    )
    storage_engine_concurrent_read_transactions: int = probing(
        "storage_engine_concurrent_read_transactions"
    )
    storage_engine_concurrent_write_transactions: int = probing(
        "storage_engine_concurrent_write_transactions"
    )
    tls_cert_file: str | None = declare(
        None,
        "Server TLS certificate (PEM); TLS is on when set.",
        optional=True,
        example="/etc/tenantkv/tls/server.crt",
    )
    tls_key_file: str | None = declare(
        None,
        "Private key of tls_cert_file (PEM).",
        optional=True,
        example="/etc/tenantkv/tls/server.key",
    )
    tls_ca_file: str | None = declare(
        None,
        "CA bundle (PEM) to verify client certificates; when set, clients must present one.",
        optional=True,
        example="/etc/tenantkv/tls/clients-ca.crt",
    )
    login_failure_limit: int = declare(
        10,
        "Failed logins counted per (user, address) pair and per address (each one doubles "
        "the delay of the next failure, up to login_delay_max_ms); 0 turns login delays "
        "and refusals off (the hash pool still applies).",
        0,
        1_000_000,
    )
    login_delay_ms: float = declare(
        100.0,
        "How long a failed login's answer is held (PostgreSQL's auth_delay), doubled for "
        "each recent failure of its (user, address) pair or its address; meanwhile that "
        "pair, unless it is known-good, is refused up front.",
        0.0,
        60_000.0,
    )
    login_delay_max_ms: float = declare(
        5000.0, "Longest hold of a failed login's answer (login_delay_ms grown).", 0.0, 600_000.0
    )
    login_hash_concurrency: int = declare(
        1,
        "Password verifications (scrypt, 16 MiB and ~50 ms each) running at once, node-wide "
        "(one more for users at addresses they logged in from before).",
        1,
        64,
    )
    login_hash_queue: int = declare(
        32,
        "Logins waiting for a password verification, node-wide, in each lane (known-good "
        "pairs first, then the others round-robin by address); beyond it a login is refused "
        "at once with a retry hint.",
        0,
        100_000,
    )
    login_hash_per_address: int = declare(
        2,
        "Logins from one address that is not known-good for their user, verifying or "
        "waiting to; more are refused at once with a retry hint.",
        1,
        1000,
    )
    throttle_max_request_secs: float = declare(
        5.0,
        "Most debt, in seconds of its bucket's hard limit, that admitting a write may "
        "leave: a write costing more is admitted only when its bucket owes nothing, then "
        "repaid before anything else runs on the bucket (debt is never forgiven).",
        0.1,
        3600.0,
    )
    login_failure_window_secs: float = declare(
        60.0,
        "A (user, address) pair's or an address's failed logins are forgotten this long "
        "after its last one.",
        1.0,
        86400.0,
    )
    login_failure_user_limit: int = declare(
        30,
        "Retired: accepted so that existing configurations still load, and ignored. Failed "
        "logins no longer lock a user out of new addresses (docs/security.md, Logins).",
        0,
        1_000_000,
    )
    enable_test_commands: bool = declare(
        False,
        "Allow test-only admin commands (configure_fail_point). Never in production.",
    )
    log_level: str = declare(
        "info",
        "Logging level (audit lines on tenantkv.audit are logged at every level).",
        choices=("debug", "info", "warning", "error"),
    )
    log_format: str = declare(
        "text",
        "Log lines on stderr: text (TIME LEVEL LOGGER: message) for people, or json "
        "(one object per line: time, level, logger, message and extra fields) for machines.",
        choices=("text", "json"),
    )

    def with_values(self, values: dict[str, Any], *, source: str = "") -> Config:
        return replace(self, **{k: check(k, v, source) for k, v in values.items()})


#: Settings an admin may change at runtime with ``set_parameter``. They apply
#: at once (throttle wait, log level) or to connections opened afterwards
#: (timeouts, limits), and persist in the data directory.
RUNTIME = frozenset(
    {
        "max_connections",
        "max_connections_per_address",
        "admin_reserved_connections",
        "max_inflight_per_connection",
        "hello_timeout_secs",
        "idle_timeout_secs",
        "frame_timeout_secs",
        "shutdown_grace_secs",
        "expiry_pager_interval_secs",
        "throttle_max_wait_ms",
        "throttle_max_request_secs",
        "log_level",
        "login_failure_limit",
        "login_failure_window_secs",
        "login_delay_ms",
        "login_delay_max_ms",
        "login_hash_concurrency",
        "login_hash_queue",
        "login_hash_per_address",
        "admin_reserved_connections_per_address",
        "execution_read_max_queue_depth",
        "execution_write_max_queue_depth",
        *PROBING_PARAMETERS,
        *(
            f.name
            for f in fields(Config)
            if f.name.startswith(("ingress_", "bucket_queue_", "write_permit_"))
        ),
    }
)
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _declared(f: Any) -> Setting:
    """A :class:`Config` field as the :class:`Setting` the loader, docs and CLI read."""
    kind = _TYPES[str(f.type).split("|")[0].strip()]
    return Setting(f.name, kind, f.default, runtime=f.name in RUNTIME, **f.metadata)


#: Every setting, from :class:`Config`'s fields (the one declaration).
SETTINGS: tuple[Setting, ...] = tuple(_declared(f) for f in fields(Config))
_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """The declaration of one setting; ConfigError naming it if unknown."""
    s = _BY_NAME.get(name)
    if s is None:
        raise ConfigError(f"unknown setting {name!r}")
    return s


def check(name: str, value: Any, source: str = "") -> Any:
    """Validate one setting; returns the value converted to its type."""
    where = f" in {source}" if source else ""
    s = _BY_NAME.get(name)
    if s is None:
        raise ConfigError(f"unknown setting {name!r}{where}")
    if value is None and s.optional:
        return None
    if s.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, s.type) or (isinstance(value, bool) and s.type is not bool):
        raise ConfigError(
            f"setting {name!r}{where} must be of type {s.type.__name__}, got {value!r}"
        )
    if s.choices and value not in s.choices:
        raise ConfigError(f"setting {name!r}{where} must be one of {', '.join(s.choices)}")
    if s.min is not None and value < s.min:  # type: ignore[operator]  # int or float here
        raise ConfigError(f"setting {name!r}{where} must be >= {s.min}, got {value!r}")
    if s.max is not None and value > s.max:  # type: ignore[operator]
        raise ConfigError(f"setting {name!r}{where} must be <= {s.max}, got {value!r}")
    if s.validate is not None:
        try:
            value = s.validate(value)
        except errors.BadValue as exc:
            raise ConfigError(f"{exc.errmsg}{where}") from None
    return value


def cross_check(cfg: Config) -> None:
    """Checks that span several settings (ranges alone cannot say min <= max)."""
    from tenantkv.admission import write_permits
    from tenantkv.admission.cidr import parse_cidrs
    from tenantkv.admission.throughput_probing import validate_probing_params

    try:
        validate_probing_params({n: getattr(cfg, n) for n in PROBING_PARAMETERS})
        write_permits.PermitSettings.from_config(cfg)
        for name in (
            "ingress_request_rate_limiter_exemptions",
            "ingress_connection_establishment_rate_limiter_bypass",
        ):
            parse_cidrs(getattr(cfg, name), name=name)
    except errors.BadValue as exc:
        raise ConfigError(exc.errmsg) from None
    if cfg.cluster is not None and cfg.workers != 1:
        # A cluster node is one process for now: its workers would each need the
        # map and the fencing of their own.
        raise ConfigError("setting 'cluster' runs one process per node: set workers = 1")


def _validated_cluster_urls(text: str) -> str:
    urls = [u.strip() for u in text.split(",")]
    for url in urls:
        if not url.startswith(("http://", "https://")) or len(url) <= len("https://"):
            raise errors.BadValue(
                f"setting 'cluster' must be etcd client URLs (http://HOST:PORT, comma-"
                f"separated), got {text!r}"
            )
    return ",".join(urls)


def _validated_node_name(name: str) -> str:
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise errors.BadValue(
            f"setting 'node_name' must be 1 to 64 letters, digits, '-', '_' or '.', got {name!r}"
        )
    return name


def _validated_advertise(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise errors.BadValue(f"setting 'advertise' must be HOST:PORT, got {text!r}")
    return text


def _validated_cluster_prefix(prefix: str) -> str:
    if not prefix.startswith("/") or prefix.endswith("/") or len(prefix) < 2:
        raise errors.BadValue(
            f"setting 'cluster_prefix' must start with '/' and not end with it, got {prefix!r}"
        )
    return prefix


def _type_words(s: Setting) -> str:
    if s.type is bool:
        return "true, false, 1 or 0"
    if s.type is int:
        return "an integer"
    if s.type is float:
        return "a number"
    return "text"


def parse_env_value(s: Setting, text: str) -> Any:
    """A setting's value from the text of its environment variable, parsed per its
    type (int, float, bool as true/false/1/0, str as is) and checked like a file's.
    An empty value unsets an optional setting. ConfigError names the variable."""
    where = f"environment variable {s.env_var}"
    if text == "" and s.optional:
        return None
    try:
        value: Any
        if s.type is bool:
            word = text.strip().lower()
            if word not in ("true", "false", "1", "0"):
                raise ValueError(text)
            value = word in ("true", "1")
        elif s.type is int:
            value = int(text.strip())
        elif s.type is float:
            value = float(text.strip())
            if not math.isfinite(value):
                raise ValueError(text)
        else:
            value = text
    except ValueError:
        raise ConfigError(
            f"{where}: setting {s.name!r} must be {_type_words(s)}, got {text!r}"
        ) from None
    return check(s.name, value, where)


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings given as ``TENANTKV_<NAME>`` variables in ``environ``. Other
    ``TENANTKV_*`` variables (``TENANTKV_ADMIN_PASSWORD``, the admin CLI's
    ``TENANTKV_PASSWORD``, …) are not settings and are left alone."""
    return {
        s.name: parse_env_value(s, environ[s.env_var]) for s in SETTINGS if s.env_var in environ
    }


def load(
    path: str | Path | None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Defaults, then the TOML file (top-level keys or a ``[server]`` table), then the
    ``TENANTKV_<NAME>`` variables of ``environ`` (``tenantkv serve`` passes
    ``os.environ``), then overrides (the command line; None values are not given)."""
    cfg = Config()
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        if isinstance(data.get("server"), dict):
            rest = {k: v for k, v in data.items() if k != "server"}
            data = {**rest, **data["server"]}
        cfg = cfg.with_values(data, source=str(path))
    if environ is not None:
        cfg = replace(cfg, **env_values(environ))  # checked as parsed
    if overrides:
        cfg = cfg.with_values(
            {k: v for k, v in overrides.items() if v is not None}, source="the command line"
        )
    cross_check(cfg)
    return cfg


def toml_value(value: Any) -> str:
    """A setting value as TOML (strings quoted with JSON's escapes, which TOML shares)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _range_words(s: Setting) -> str:
    if s.choices:
        return "one of " + ", ".join(s.choices)
    parts = []
    if s.min is not None:
        parts.append(f">= {_num(s.min)}")
    if s.max is not None:
        parts.append(f"<= {_num(s.max)}")
    return ", ".join(parts)


def render_defaults() -> str:
    """``tenantkv config defaults``: a TOML file setting every setting to its default,
    each under its help as comments; optional settings that default to unset are
    commented out (with an example value). ``tenantkv config check`` accepts it."""
    lines = [
        "# tenantkv configuration: every setting at its default.",
        "# Generated by `tenantkv config defaults`; see docs/configuration.md.",
        "# Precedence: command line > environment (TENANTKV_<NAME>) > this file > defaults.",
        "# Settings marked runtime can also change while the server runs",
        "# (tenantkv-admin param-set NAME VALUE).",
    ]
    for s in SETTINGS:
        lines.append("")
        lines.extend(textwrap.wrap(s.help, 86, initial_indent="# ", subsequent_indent="# "))
        facts = [s.type.__name__]
        if rng := _range_words(s):
            facts.append(rng)
        if s.optional:
            facts.append("optional")
        if s.runtime:
            facts.append("runtime")
        facts.append(f"env {s.env_var}")
        lines.append(f"# ({'; '.join(facts)})")
        if s.default is None:
            example = "" if s.example is None else toml_value(s.example)
            lines.append(f"# {s.name} = {example}".rstrip())
        else:
            lines.append(f"{s.name} = {toml_value(s.default)}")
    return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def render_markdown() -> str:
    """``docs/configuration.md``, generated from :data:`SETTINGS` (a test keeps them equal)."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from tenantkv/config.py by `tenantkv config docs > "
        "docs/configuration.md`; edit the declaration, not this file. -->",
        "",
        "`tenantkv serve --config FILE` reads a TOML file. Keys may sit at the top level",
        "or in a `[server]` table. An unknown key or a bad value stops start-up with a",
        "message naming it. `tenantkv config defaults` prints a file with every setting at",
        "its default, each under its help; `tenantkv config check FILE` validates a file",
        "without starting anything.",
        "",
        "```toml",
        "# tenantkv.toml",
        'data_dir = "/var/lib/tenantkv"',
        "port = 7207",
        'durability = "fsync"',
        "```",
        "",
        "Every setting can also come from the environment as `TENANTKV_<NAME>` (the name",
        "in upper case: `TENANTKV_PORT=7300`, `TENANTKV_LOG_FORMAT=json`), parsed per its",
        "type: integers, numbers, booleans as `true`/`false`/`1`/`0`, text as is; an empty",
        "value unsets an optional setting. A bad value stops start-up with a message naming",
        "the variable. Other `TENANTKV_*` variables (`TENANTKV_ADMIN_PASSWORD`, and",
        "`TENANTKV_PASSWORD` / `TENANTKV_USER` of `tenantkv-admin`) are not settings.",
        "Beware that `tenantkv-admin` also reads `TENANTKV_HOST` and `TENANTKV_PORT` (the",
        "server to talk to): exported in the server's environment they set where it listens.",
        "",
        "Precedence: command-line flags > environment > config file > defaults.",
        "",
        "Settings marked *runtime* can also be changed while the server runs, by an",
        "admin: `tenantkv-admin param-set NAME VALUE` (`param-get [NAME]` shows them).",
        "A runtime change persists in the data directory and, at the next start,",
        "overrides the file and the command line (`param-set NAME --reset` removes it).",
        "",
        "| setting | type | default | range | runtime | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        rng = " / ".join(s.choices) if s.choices else ""
        if s.min is not None or s.max is not None:
            lo = "" if s.min is None else f"≥ {_num(s.min)}"
            hi = "" if s.max is None else f"≤ {_num(s.max)}"
            rng = ", ".join(x for x in (lo, hi) if x)
        default = "unset" if s.default is None else f"`{s.default!r}`".replace("'", '"')
        rt = "runtime" if s.runtime else ""
        lines.append(f"| `{s.name}` | {s.type.__name__} | {default} | {rng} | {rt} | {s.help} |")
    lines += [
        "",
        "## Durability",
        "",
        "`fsync` (default) acknowledges a write only after the group commit holding it is",
        "flushed to disk: it survives a power loss. `nosync` acknowledges once the commit is",
        "in the OS page cache: it survives a crash or `kill -9` of the server, but a power",
        "loss may lose the last moments of writes (never corrupt the file). Group commit",
        "makes `fsync` cheap under concurrency: all writes queued while one commit runs",
        "share the next one.",
        "",
    ]
    return "\n".join(lines)
