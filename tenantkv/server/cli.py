"""``tenantkv`` command line: ``tenantkv serve`` runs the daemon."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import trio

from tenantkv import config as config_mod
from tenantkv._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenantkv",
        description="tenantkv: a multi-tenant key-value database server.",
    )
    parser.add_argument("--version", action="version", version=f"tenantkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the server",
        description="Run the tenantkv server in the foreground. SIGINT/SIGTERM stop it "
        "gracefully. Flags override the config file, which overrides the defaults.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument(
        "--config", metavar="FILE", help="TOML config file (see docs/configuration.md)"
    )
    serve.add_argument(
        "--data-dir", metavar="DIR", help="data directory (default from config: ./tenantkv-data)"
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        help=f"TCP port, 0 for any free port (default {config_mod.DEFAULT_PORT})",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics on this loopback port (0 = any free port)",
    )
    serve.add_argument(
        "--ready-file",
        metavar="PATH",
        help='once listening, write {"host","port","metrics_port","pid"} as JSON here',
    )
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    serve.add_argument(
        "--enable-test-commands",
        action="store_true",
        default=None,
        help="allow test-only admin commands such as configure_fail_point",
    )
    cfg = sub.add_parser("config", help="check a config file or print the settings reference")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = cfg_sub.add_parser("check", help="validate a TOML config file (exit 0 if valid)")
    check.add_argument("file")
    cfg_sub.add_parser("docs", help="print docs/configuration.md (every setting)")
    return parser


def _config_command(args: argparse.Namespace) -> int:
    if args.config_command == "docs":
        print(config_mod.render_markdown(), end="")
        return 0
    try:
        config_mod.load(args.file)
    except config_mod.ConfigError as exc:
        print(f"tenantkv: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: ok")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "config":
        return _config_command(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    overrides = {
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "metrics_port": args.metrics_port,
        "log_level": args.log_level,
        "enable_test_commands": args.enable_test_commands,
    }
    try:
        cfg = config_mod.load(args.config, overrides)
    except config_mod.ConfigError as exc:
        print(f"tenantkv: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from tenantkv.server.server import Server

    try:
        server = Server(cfg)
    except Exception as exc:  # e.g. unreadable data dir, lock held by another process
        logging.getLogger("tenantkv").error("cannot open data directory %s: %s", cfg.data_dir, exc)
        return 1

    async def run() -> None:
        await server.serve(ready_file=args.ready_file, handle_signals=True)

    try:
        trio.run(run)
    except OSError as exc:
        logging.getLogger("tenantkv").error("cannot listen on %s:%s: %s", cfg.host, cfg.port, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
