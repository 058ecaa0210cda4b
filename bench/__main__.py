"""``python -m bench SUBCOMMAND``: the benchmark command line.

Two layers: the harness (``list``, ``run``, ``all``, ``smoke``, ``report``;
bench/harness.py, bench/publish.py) runs named scenarios with the settings the
published figures use; the measuring subcommands (``throughput``,
``throttle``, ...) are modules with ``add_parser(subparsers)`` that register
their subcommand (help from the module docstring) with all its flags
(bench/options.py) and set ``func``. Adding one is one import and one line
below, plus a Scenario in bench/harness.py to publish it. Every run's flags go
through ``options.resolve`` (``--quick`` defaults, bounds) before ``func``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import (
    attack,
    attack_login,
    attack_memory,
    attack_resp,
    attack_throttle,
    cluster,
    cluster_limits,
    cluster_rebalance,
    cpu,
    crash,
    gates,
    harness,
    micro,
    options,
    overload,
    probing,
    publish,
    resp,
    retries,
    soak,
    throttle,
    throughput,
    workers,
    ycsb,
)
from bench.loadgen import BenchError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="tenantkv benchmarks: `list` names the scenarios, `run`/`all` run "
        "them, `report` writes docs/benchmarks.md (see docs/benchmarking.md).",
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    # the harness: scenarios (presets of the subcommands below) and the report
    harness.add_parsers(sub, build_parser)
    publish.add_parser(sub)
    # the measuring subcommands, each with every flag of its own
    throughput.add_parser(sub)
    throttle.add_parser(sub)
    cluster_limits.add_parser(sub)
    retries.add_parser(sub)
    soak.add_parser(sub)
    probing.add_parser(sub)
    overload.add_parser(sub)
    gates.add_parser(sub)
    crash.add_parser(sub)
    attack.add_parser(sub)
    attack_memory.add_parser(sub)
    attack_resp.add_parser(sub)
    attack_throttle.add_parser(sub)
    attack_login.add_parser(sub)
    cpu.add_parser(sub)
    ycsb.add_parser(sub)
    resp.add_parser(sub)
    micro.add_parser(sub)
    workers.add_parser(sub)
    cluster.add_parser(sub)
    cluster_rebalance.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(options.resolve(args)))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
