"""Turning measurements into a table a person reads and JSON a script reads.

One row per cell (op, connections, pipeline depth) with every server side by
side and the tenantkv/redis ratio, because the ratio is only meaningful
between numbers taken in the same run on the same machine. CPU columns show
where the 2 cores went: ``cli%`` is all load-generator processes together,
``srv%`` the server process, both in % of one core (200 % = the machine).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

from bench import loadgen, options
from bench.loadgen import LoadResult, LoadSpec, Target


@dataclass
class Cell:
    """One measured cell on one server."""

    server: str
    spec: LoadSpec
    result: LoadResult

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.spec.op, self.spec.conns, self.spec.depth)

    @property
    def ops_per_s(self) -> float:
        return self.result.ops_per_s

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "server": self.server,
            "op": self.spec.op,
            "conns": self.spec.conns,
            "depth": self.spec.depth,
            "value_size": len(self.spec.value),
            "mode": "open" if self.spec.rate else "closed",
            "target_rate": self.spec.rate,
            "seconds": r.window_s,
            "ops": r.ok,
            "errors": r.errors,
            "ops_per_s": round(r.ops_per_s, 1),
            **load_figures(r),
        }


C = TypeVar("C", bound=Cell)


def run_on_each(
    targets: Sequence[tuple[str, Any, Target]],
    spec: LoadSpec,
    make: Callable[[str, LoadSpec, LoadResult], C],
    what: str,
    prepare: Callable[[Target], None] | None = None,
) -> list[C]:
    """One cell on every server, back to back (``prepare`` first on each), with a
    progress line each."""
    cells = []
    for name, handle, target in targets:
        if prepare is not None:
            prepare(target)
        res = loadgen.run_load(target, spec, handle.cpu_seconds)
        cell = make(name, spec, res)
        cells.append(cell)
        j = cell.to_json()
        log(
            f"  {name:<8} {what} {cell.ops_per_s:>10,.0f} ops/s  p50 {j['p50_us']} µs  "
            f"p99 {j['p99_us']} µs  p99.9 {j['p999_us']} µs  errors {res.errors}"
        )
    return cells


def load_figures(r: LoadResult) -> dict[str, Any]:
    """Latency percentiles, CPU shares and diagnostics of one load, as every cell reports them."""
    return {
        "p50_us": _round(r.percentile_us(0.50)),
        "p99_us": _round(r.percentile_us(0.99)),
        "p999_us": _round(r.percentile_us(0.999)),
        "max_us": _round(max(r.hist) / 1000 if r.hist else None),
        "client_cpu_pct": _pct(r.client_cpu_s, r.window_s),
        "server_cpu_pct": _pct(r.server_cpu_s, r.window_s),
        "workers": r.workers,
        "error_sample": r.error_sample,
        **r.extra,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _pct(cpu_s: float | None, window_s: float) -> float | None:
    return None if cpu_s is None or window_s <= 0 else round(100 * cpu_s / window_s, 1)


def ratio(cells: Sequence[Cell], key: tuple[str, int, int], a: str, b: str) -> float | None:
    """ops/s of server ``a`` over server ``b`` for one cell, None if either is missing."""
    by = {c.server: c.result.ops_per_s for c in cells if c.key == key}
    if by.get(a) and by.get(b):
        return by[a] / by[b]
    return None


def _fmt_ops(x: float) -> str:
    return f"{x:,.0f}"


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 100 else f"{x:,.0f}"


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


@dataclass(frozen=True)
class Layout:
    """How :func:`side_by_side` draws a table: the key columns (both header
    lines and a row's text), each server's figures (names, widths), and how a
    failed cell is named under the table."""

    heads: tuple[str, str]
    key_text: Callable[[Any], str]
    figures: Sequence[str]
    widths: Sequence[int]
    errors_head: str
    error_text: Callable[[Any], str]


def side_by_side(
    cells: Sequence[Any],
    servers: Sequence[str],
    layout: Layout,
    values: Callable[[Any], Sequence[str]],
    ratio_of: Callable[[Any], float | None],
    missing: Callable[[str, Any], str] = lambda server, key: "",
) -> str:
    """A table with one line per cell key and each server's figures side by
    side (``values(cell)``; ``missing`` names a cell not run), then the
    tenantkv/redis ratio when both ran, then the cells that had errors."""
    keys = list(dict.fromkeys(c.key for c in cells))
    by = {(c.server, c.key): c for c in cells}
    widths = layout.widths
    block = sum(widths) + len(widths)
    head1, head2 = layout.heads
    for s in servers:
        head1 += " |" + s.center(block)
        head2 += " |" + "".join(f" {h:>{w}}" for h, w in zip(layout.figures, widths, strict=True))
    show_ratio = "tenantkv" in servers and "redis" in servers
    if show_ratio:
        head1 += " |" + " ratio".ljust(10)
        head2 += " | tkv/redis"
    lines = [head1, head2, "-" * len(head2)]
    for key in keys:
        line = layout.key_text(key)
        for s in servers:
            cell = by.get((s, key))
            if cell is None:
                line += " |" + f"{missing(s, key):^{block}}"
            else:
                vals = values(cell)
                line += " |" + "".join(f" {v:>{w}}" for v, w in zip(vals, widths, strict=True))
        if show_ratio:
            r = ratio_of(key)
            line += " | " + (f"{r:>8.2f}x" if r is not None else f"{'-':>9}")
        lines.append(line)
    errs = [c for c in cells if c.result.errors]
    if errs:
        lines += ["", layout.errors_head]
        lines += [f"  {layout.error_text(c)}, e.g. {c.result.error_sample}" for c in errs]
    return "\n".join(lines)


#: the throughput table: one line per (op, conns, depth)
THROUGHPUT = Layout(
    (f"{'':<4} {'':>5} {'':>5}", f"{'op':<4} {'conns':>5} {'depth':>5}"),
    lambda k: f"{k[0]:<4} {k[1]:>5} {k[2]:>5}",
    ["ops/s", "p50 µs", "p99 µs", "cli%", "srv%"],
    [10, 8, 8, 5, 5],
    "! = some requests failed (not counted in ops/s):",
    lambda c: (
        f"{c.server} {c.spec.op} conns={c.spec.conns} depth={c.spec.depth}: "
        f"{c.result.errors} errors"
    ),
)


def _throughput_values(cell: Cell) -> list[str]:
    j = cell.to_json()
    return [
        _fmt_ops(cell.result.ops_per_s) + ("!" if j["errors"] else ""),
        _fmt_us(j["p50_us"]),
        _fmt_us(j["p99_us"]),
        _fmt_pct(j["client_cpu_pct"]),
        _fmt_pct(j["server_cpu_pct"]),
    ]


def format_table(cells: Sequence[Cell], servers: Sequence[str]) -> str:
    """The printed table: one line per (op, conns, depth), servers side by side."""
    return side_by_side(
        cells,
        servers,
        THROUGHPUT,
        _throughput_values,
        lambda key: ratio(cells, key, "tenantkv", "redis"),
    )


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on; both sides share these cores."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def source_info() -> dict[str, Any]:
    """The tenantkv commit measured, and whether the server code had local changes."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        try:
            r = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    return {
        "commit": commit or None,
        "server_code_modified": bool(git("status", "--porcelain", "--", "tenantkv"))
        if commit
        else None,
    }


def results_doc(
    cells: Sequence[Cell], servers: Sequence[str], meta: dict[str, Any]
) -> dict[str, Any]:
    keys: list[tuple[str, int, int]] = []
    for c in cells:
        if c.key not in keys:
            keys.append(c.key)
    ratios = []
    if "tenantkv" in servers and "redis" in servers:
        for key in keys:
            r = ratio(cells, key, "tenantkv", "redis")
            ratios.append(
                {
                    "op": key[0],
                    "conns": key[1],
                    "depth": key[2],
                    "tenantkv_over_redis": None if r is None else round(r, 3),
                }
            )
    return {
        "benchmark": "throughput",
        "meta": meta,
        "cells": [c.to_json() for c in cells],
        "ratios": ratios,
    }


def write_json(path: str, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    with open(path, "w") as f:
        f.write(text)


# -- results: a run's header, its table of figures, its verdict ----------------------------


def machine_line(meta: dict[str, Any], who: str = "server and load generator") -> str:
    """``N cores (model) shared by WHO``: how to read every figure of the run."""
    m = meta["machine"]
    return f"{m['cpus']} cores ({m['cpu_model']}) shared by {who}"


def run_header(args: Any, name: str) -> tuple[TextIO, dict[str, Any]]:
    """Where a run prints (stderr when its JSON goes to stdout) and its meta;
    the first line of its header is ``NAME: version; machine``."""
    out = sys.stderr if getattr(args, "json", None) == "-" else sys.stdout
    meta = run_meta(args)
    print(f"\n{name}: {version_line(meta)}; {machine_line(meta)}", end="", file=out)
    return out, meta


def markdown_head(*names: str) -> str:
    """A markdown table's header and rule."""
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def columns(rows: Iterable[Sequence[Any]], widths: Sequence[int]) -> str:
    """Rows of cells, each cell but the last left-aligned to its width."""
    return "\n".join(
        " ".join(f"{c!s:{w}}" for c, w in zip(row, widths, strict=False))
        + (f" {row[-1]}" if len(row) > len(widths) else "")
        for row in rows
    )


def verdict(args: Any, benchmark: str, figures: dict[str, Any]) -> int:
    """The last line of a run with targets, its JSON (``--json``) and its exit
    status: 0 when every part's ``met`` holds, else 1."""
    met = all(part["met"] for part in figures.values())
    print("all targets met" if met else "TARGET MISSED")
    if args.json:
        write_json(args.json, {"benchmark": benchmark, "meta": run_meta(args), **figures})
    return 0 if met else 1


# -- helpers every scenario module uses ---------------------------------------------------


def log(msg: str) -> None:
    """Progress lines go to stderr, so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def value_bytes(size: int, tag: bytes) -> bytes:
    """A value of ``size`` bytes that names the scenario that wrote it."""
    seed = b"tenantkv-" + tag + b"-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return (seed * (size // len(seed) + 1))[:size]


def run_meta(args: Any) -> dict[str, Any]:
    """Machine, source commit and the settings of a run, for --json and headers."""
    return {
        "machine": machine_info(),
        "source": source_info(),
        "settings": options.settings(args),
    }


def version_line(meta: dict[str, Any]) -> str:
    """``tenantkv 0.1.0 @ abc1234 (+local changes)``."""
    from tenantkv import __version__

    src = meta["source"]
    version = f"tenantkv {__version__}"
    if src["commit"]:
        version += f" @ {src['commit']}" + (
            " (+local changes)" if src["server_code_modified"] else ""
        )
    return version
