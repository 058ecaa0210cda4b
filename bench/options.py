"""The command line of the measuring subcommands: one helper for all of them.

A subcommand declares each flag once, with :func:`add`: its type, its default
(a :class:`Quick` pair when ``--quick`` changes it) and its bounds. The help
text ends with the default (``[3; quick 1]``), so it cannot drift from it.
:func:`resolve`, run once before a subcommand's ``run`` (``python -m bench``
and the harness call it), picks each :class:`Quick` default and checks every
bound, so a subcommand's ``run`` starts from checked settings. A value out of
bounds is a :class:`~bench.loadgen.BenchError` (exit status 1), as before.

The flags most subcommands share have one function each: :func:`quick_flag`,
:func:`json_flag`, :func:`pin_flag`, :func:`window_flags` (``--seconds``,
``--warmup``, ``--rounds``), :func:`data_flags` (``--value-size``, ``--keys``)
and :func:`server_flags` (an existing server instead of a started one).
"""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.loadgen import BenchError

#: Namespace attribute holding a parser's bounds (not a flag; left out of results).
RULES = "_rules"


@dataclass(frozen=True)
class Quick:
    """A default that ``--quick`` changes: ``full`` normally, ``quick`` with it."""

    full: Any
    quick: Any

    def __str__(self) -> str:
        return f"{_show(self.full)}; quick {_show(self.quick)}"


@dataclass(frozen=True)
class Bound:
    """What a flag's value must be: at least ``low`` (or above it, ``strict``),
    at most ``high``; each of a list's items for a list."""

    flag: str
    low: float | None = None
    strict: bool = False
    high: float | None = None

    def check(self, value: Any) -> None:
        for v in value if isinstance(value, list) else [value]:
            if v is None:
                continue
            if self.low is not None and (v <= self.low if self.strict else v < self.low):
                op = ">" if self.strict else ">="
                raise BenchError(f"{self.flag} must be {op} {_show(self.low)}")
            if self.high is not None and v > self.high:
                raise BenchError(f"{self.flag} must be <= {_show(self.high)}")


def _show(v: Any) -> str:
    if isinstance(v, list | tuple):
        return ",".join(_show(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _rules(p: argparse.ArgumentParser) -> list[Bound]:
    rules = p.get_default(RULES)
    if rules is None:
        rules = []
        p.set_defaults(**{RULES: rules})
    return rules


def add(
    p: Any,
    flag: str,
    kind: Callable[[str], Any] | None,
    default: Any,
    help: str,
    *,
    low: float | None = None,
    above: float | None = None,
    high: float | None = None,
    show: str | None = None,
    parser: argparse.ArgumentParser | None = None,
    **kw: Any,
) -> None:
    """One flag: ``kind`` parses it, ``default`` may be a :class:`Quick` pair,
    ``low`` / ``above`` / ``high`` bound it (checked by :func:`resolve`). The
    default is shown in the help (``show`` replaces it; ``""`` shows none).

    ``p`` is a parser or one of its argument groups (``parser`` names the parser
    for a group)."""
    parser = p if parser is None else parser
    shown = _show(default) if show is None else show
    text = f"{help} [{shown}]" if shown and default is not None else help
    if kind is None:
        p.add_argument(flag, default=default, help=text, **kw)
    else:
        p.add_argument(flag, type=kind, default=default, help=text, **kw)
    if low is not None or above is not None or high is not None:
        strict = above is not None
        _rules(parser).append(Bound(flag, above if strict else low, strict, high))


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Pick every :class:`Quick` default and check every bound (BenchError)."""
    quick = bool(getattr(args, "quick", False))
    for name, value in vars(args).items():
        if isinstance(value, Quick):
            setattr(args, name, value.quick if quick else value.full)
    for rule in getattr(args, RULES, None) or []:
        rule.check(getattr(args, rule.flag.lstrip("-").replace("-", "_")))
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of a run, as its results record them."""
    return {
        k: sorted(v) if isinstance(v, set | frozenset) else v
        for k, v in vars(args).items()
        if k != "func" and not k.startswith("_")
    }


# -- argparse types ------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """``1,16``: comma-separated integers >= 1."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError("values must be integers >= 1")
    return vals


def float_list(text: str) -> list[float]:
    """``0.5,2``: comma-separated numbers > 0."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError("values must be > 0")
    return vals


def names(
    choices: Sequence[str], what: str, fold: Callable[[str], str] = str
) -> Callable[[str], list[str]]:
    """An argparse type: ``a,b``, a non-empty subset of ``choices`` (after ``fold``)."""

    def parse(text: str) -> list[str]:
        got = [x.strip() for x in fold(text).split(",") if x.strip()]
        if not got or [n for n in got if n not in choices]:
            raise argparse.ArgumentTypeError(
                f"{what} are a comma-separated subset of {tuple(choices)}"
            )
        return got

    parse.__name__ = what  # argparse names the type in its error
    return parse


# -- flags most subcommands share -----------------------------------------------------------


def subcommand(
    sub: Any, run: Callable[[argparse.Namespace], int], doc: str | None
) -> argparse.ArgumentParser:
    """A subcommand's parser from its module's docstring, which opens with
    ``python -m bench NAME``: HELP; the rest of it is the ``--help`` text."""
    first, _, rest = (doc or "").partition("\n")
    name = first.split("``")[1].split()[-1]
    help = first.split("``:", 1)[1].strip().rstrip(".")
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help.replace("%", "%%"),
        description=textwrap.dedent(rest).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=run)
    return p


def parts(
    p: argparse.ArgumentParser, flag: str, choices: Sequence[str], what: str, note: str = ""
) -> None:
    """``--part`` / ``--scenario``: run only some of a subcommand's parts."""
    p.add_argument(
        flag,
        type=names(choices, what),
        default=list(choices),
        metavar="NAME[,NAME]",
        help=f"run only these: {', '.join(choices)}{note} [all]",
    )


def json_flag(p: argparse.ArgumentParser) -> None:
    """``--json PATH``, as every measuring subcommand has it."""
    p.add_argument("--json", metavar="PATH", help="write results as JSON here ('-' = stdout)")


def quick_flag(p: argparse.ArgumentParser, what: str = "a fast smoke run, < 40 s in all") -> None:
    """``--quick``, as every measuring subcommand has it (what it means varies)."""
    p.add_argument("--quick", action="store_true", help=what)


def pin_flag(
    p: argparse.ArgumentParser,
    what: str = "split = the daemon on the first CPU, the load generator on the others",
) -> None:
    """``--pin none|split`` (resolved by :func:`bench.servers.pin_cpus`)."""
    p.add_argument(
        "--pin",
        choices=("none", "split"),
        default="none",
        help=f"CPU placement: none = the OS decides; {what} [none]",
    )


def common_flags(p: argparse.ArgumentParser, quick: str | None = None) -> None:
    """``--quick``, ``--json`` and ``--pin``."""
    quick_flag(p) if quick is None else quick_flag(p, quick)
    json_flag(p)
    pin_flag(p)


def window_flags(
    p: Any,
    seconds: Any,
    warmup: Any,
    rounds: Any = None,
    *,
    what: tuple[str, str, str] = ("window per run", "load before each window", "rounds"),
    parser: argparse.ArgumentParser | None = None,
) -> None:
    """``--seconds`` (> 0), ``--warmup`` (>= 0) and, given a default, ``--rounds`` (>= 1)."""
    add(p, "--seconds", float, seconds, what[0], above=0, parser=parser)
    add(p, "--warmup", float, warmup, what[1], low=0, parser=parser)
    if rounds is not None:
        add(p, "--rounds", int, rounds, what[2], low=1, parser=parser)


def data_flags(
    p: argparse.ArgumentParser,
    keys: Any,
    value_size: int = 100,
    *,
    keys_help: str = "keys, all preloaded",
    value_help: str = "value bytes",
    value_low: int = 0,
) -> None:
    """``--value-size`` (>= ``value_low``) and ``--keys`` (>= 1)."""
    add(p, "--value-size", int, value_size, value_help, low=value_low)
    add(p, "--keys", int, keys, keys_help, low=1)


def server_flags(p: argparse.ArgumentParser) -> None:
    """An existing tenantkv server instead of a daemon started for the run."""
    g = p.add_argument_group("existing server (default: start a tenantkv daemon)")
    g.add_argument("--host", help="tenantkv host; when given, no daemon is started")
    g.add_argument("--port", type=int, default=7207, help="tenantkv port (with --host) [7207]")
    g.add_argument("--user", default="admin", help="tenantkv user (with --host) [admin]")
    g.add_argument(
        "--password",
        default=os.environ.get("TENANTKV_PASSWORD"),
        help="tenantkv password (with --host) [env TENANTKV_PASSWORD]",
    )
    g.add_argument(
        "--data-dir", help="data directory for the started daemon; must be new [a temp dir]"
    )


def check(ok: bool, message: str) -> None:
    """A rule between flags (one flag's bounds are :func:`add`'s)."""
    if not ok:
        raise BenchError(message)
