"""``tenantkv`` command line: ``tenantkv serve`` runs the daemon.

Also: ``tenantkv config check|docs|defaults`` (the settings, see
:mod:`tenantkv.config`) and ``tenantkv restore`` (a backup into a data
directory, offline; see :mod:`tenantkv.storage.backup`). Logging is set up
here: text lines for people or, with ``log_format = "json"``, one JSON object
per line for machines.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import trio

from tenantkv import config as config_mod
from tenantkv._version import __version__
from tenantkv.server import process_memory
from tenantkv.server.log_setup import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenantkv",
        description="tenantkv: a multi-tenant key-value database server.",
    )
    parser.add_argument("--version", action="version", version=f"tenantkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_serve(sub)
    _add_config(sub)
    _add_restore(sub)
    return parser


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the server",
        description="Run the tenantkv server in the foreground. SIGINT/SIGTERM stop it "
        "gracefully. Flags override TENANTKV_<SETTING> environment variables, which "
        "override the config file, which overrides the defaults (each named once "
        "below; every other setting: docs/configuration.md).",
    )

    def default(name: str) -> object:
        return config_mod.setting(name).default

    serve.add_argument(
        "--config", metavar="FILE", help="TOML config file (see docs/configuration.md)"
    )
    serve.add_argument(
        "--data-dir", metavar="DIR", help=f"data directory (default {default('data_dir')})"
    )
    serve.add_argument("--host", help=f"address to listen on (default {default('host')})")
    serve.add_argument(
        "--port",
        type=int,
        help=f"TCP port, 0 for any free port (default {default('port')})",
    )
    serve.add_argument(
        "--resp-port",
        type=int,
        metavar="N",
        help="port of the RESP (Redis protocol) front door, 0 for any free port "
        f"(default {default('resp_port')}; resp_enabled = false turns it off)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus /metrics and /healthz on this port, on metrics_host (loopback "
        "by default; 0 = any free port; default: off)",
    )
    serve.add_argument(
        "--workers",
        metavar="N|auto",
        type=_workers_arg,
        help="worker processes sharing the port and the data directory, one per core "
        "(auto: one per usable core; default 1: a single process; see docs/scaling.md)",
    )
    _add_cluster_flags(serve)
    serve.add_argument(
        "--ready-file",
        metavar="PATH",
        help='once listening, write {"host","port","resp_port","metrics_port","pid","node"} '
        "as JSON here",
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help=f"least severe level logged (default {default('log_level')})",
    )
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        help=f"text lines for people or one JSON object per line (default {default('log_format')})",
    )
    serve.add_argument(
        "--enable-test-commands",
        action="store_true",
        default=None,
        help="allow test-only admin commands such as configure_fail_point",
    )


def _add_cluster_flags(serve: Any) -> None:
    """``serve``'s cluster flags (docs/cluster.md); without ``--cluster``, one node."""
    serve.add_argument(
        "--cluster",
        metavar="ETCD_URL[,...]",
        help="join the cluster coordinated by the etcd at these client URLs "
        "(docs/cluster.md; default: a single node, no etcd)",
    )
    serve.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name in the cluster, unique in it (default: the host name)",
    )
    serve.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        help="where clients and other nodes reach this node (default: host and the port "
        "listened on)",
    )


def _add_config(sub: Any) -> None:
    cfg = sub.add_parser("config", help="check a config file or print the settings reference")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = cfg_sub.add_parser("check", help="validate a TOML config file (exit 0 if valid)")
    check.add_argument("file")
    cfg_sub.add_parser("docs", help="print docs/configuration.md (every setting)")
    cfg_sub.add_parser(
        "defaults",
        help="print a TOML config file with every setting at its default, commented",
    )


def _add_restore(sub: Any) -> None:
    restore = sub.add_parser(
        "restore",
        help="restore a backup into a data directory (server stopped)",
        description="Copy a backup made by `tenantkv-admin backup` into a data directory, "
        "then start the server on it. The backup is checked first (it must open as "
        "tenantkv's LMDB data); the data directory must not be in use by a server, and "
        "must be empty or new unless --force.",
    )
    restore.add_argument("backup_dir", metavar="BACKUP_DIR", help="the backup's directory")
    restore.add_argument(
        "--data-dir", metavar="DIR", required=True, help="data directory to restore into"
    )
    restore.add_argument(
        "--force",
        action="store_true",
        help="replace the data in a non-empty data directory (it is lost)",
    )


def _workers_arg(text: str) -> int:
    """``auto`` is 0 (one per usable core); otherwise a number from 1 to 256."""
    if text == "auto":
        return 0
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"expected 1 to 256 workers, got {n}")
    return n


def _config_command(args: argparse.Namespace) -> int:
    if args.config_command == "docs":
        print(config_mod.render_markdown(), end="")
        return 0
    if args.config_command == "defaults":
        print(config_mod.render_defaults(), end="")
        return 0
    try:
        config_mod.load(args.file)
    except config_mod.ConfigError as exc:
        print(f"tenantkv: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: ok")
    return 0


def _restore_command(args: argparse.Namespace) -> int:
    from tenantkv.storage import backup

    try:
        info = backup.restore(args.backup_dir, args.data_dir, force=args.force)
    except backup.RestoreError as exc:
        print(f"tenantkv: restore: {exc}", file=sys.stderr)
        return 1
    taken = (info.get("manifest") or {}).get("started_utc", "unknown time")
    print(
        f"restored {args.backup_dir} (taken {taken}) into {args.data_dir}: "
        f"{info['bytes']} bytes, {len(info['buckets'])} buckets, {info['users']} users"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "config":
        return _config_command(args)
    if args.command == "restore":
        return _restore_command(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    overrides = {
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "resp_port": args.resp_port,
        "metrics_port": args.metrics_port,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "enable_test_commands": args.enable_test_commands,
        "workers": args.workers,
        "cluster": args.cluster,
        "node_name": args.node_name,
        "advertise": args.advertise,
    }

    def load() -> config_mod.Config:
        return config_mod.load(args.config, overrides, environ=os.environ)

    try:
        cfg = load()
    except config_mod.ConfigError as exc:
        print(f"tenantkv: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_level, cfg.log_format)
    # The daemon (or the supervisor, whose writer holds every worker's values)
    # owns this process: large buffers go back to the kernel when freed.
    process_memory.return_large_allocations()
    from tenantkv.server.supervisor import usable_cores

    workers = cfg.workers or usable_cores()
    if workers > 1:
        return _supervise(cfg, workers, load, args.ready_file)
    from tenantkv.server.server import ListenError, Server, TLSConfigError

    try:
        server = Server(cfg, role=_cluster_role(cfg))
    except TLSConfigError as exc:
        logging.getLogger("tenantkv").error("%s", exc)
        return 1
    except Exception as exc:  # e.g. unreadable data dir, lock held by another process
        logging.getLogger("tenantkv").error("cannot open data directory %s: %s", cfg.data_dir, exc)
        return 1

    async def run() -> None:
        await server.serve(
            ready_file=args.ready_file, handle_signals=True, reload_config=load, freeze_gc=True
        )

    try:
        trio.run(run)
    except ListenError as exc:
        logging.getLogger("tenantkv").error("cannot listen on the %s", exc)
        return 1
    except OSError as exc:
        logging.getLogger("tenantkv").error("cannot listen on %s:%s: %s", cfg.host, cfg.port, exc)
        return 1
    return 0


def _cluster_role(cfg: config_mod.Config) -> Any:
    """With ``--cluster``, this process is a cluster node; else the default role."""
    if cfg.cluster is None:
        return None
    from tenantkv.cluster.node_role import ClusterNode

    return ClusterNode(cfg)


def _supervise(cfg: config_mod.Config, workers: int, load: Any, ready_file: str | None) -> int:
    """``serve --workers N`` (N > 1): the supervisor of N worker processes."""
    from tenantkv.server.server import ListenError, TLSConfigError
    from tenantkv.server.supervisor import Supervisor, WorkerStartError

    log = logging.getLogger("tenantkv")
    try:
        supervisor = Supervisor(cfg, workers, reload_config=load)
    except TLSConfigError as exc:
        log.error("%s", exc)
        return 1
    except Exception as exc:  # e.g. lock held by another process
        log.error("cannot open data directory %s: %s", cfg.data_dir, exc)
        return 1
    try:
        trio.run(supervisor.run, ready_file)
    except ListenError as exc:
        log.error("cannot listen on the %s", exc)
        return 1
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", cfg.host, cfg.port, exc)
        return 1
    except WorkerStartError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
