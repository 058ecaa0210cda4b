"""``python -m bench SUBCOMMAND``: the benchmark command line.

Each scenario is a module with ``add_parser(subparsers)`` that registers its
subcommand and sets ``func``; adding one (``throttle``, ...) is one import and
one line below.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import overload, probing, retries, soak, throttle, throughput
from bench.loadgen import BenchError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="tenantkv benchmarks (see docs/benchmarks.md)."
    )
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND")
    throughput.add_parser(sub)
    throttle.add_parser(sub)
    retries.add_parser(sub)
    soak.add_parser(sub)
    probing.add_parser(sub)
    overload.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
