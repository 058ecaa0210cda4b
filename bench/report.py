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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import options
from bench.loadgen import LoadResult, LoadSpec


@dataclass
class Cell:
    """One measured cell on one server."""

    server: str
    spec: LoadSpec
    result: LoadResult

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.spec.op, self.spec.conns, self.spec.depth)

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


def format_table(cells: Sequence[Cell], servers: Sequence[str]) -> str:
    """The printed table: one line per (op, conns, depth), servers side by side."""
    keys: list[tuple[str, int, int]] = []
    for c in cells:
        if c.key not in keys:
            keys.append(c.key)
    by = {(c.server, c.key): c for c in cells}
    per = ["ops/s", "p50 µs", "p99 µs", "cli%", "srv%"]
    widths = [10, 8, 8, 5, 5]
    head1 = f"{'':<4} {'':>5} {'':>5}"
    head2 = f"{'op':<4} {'conns':>5} {'depth':>5}"
    for s in servers:
        block = sum(widths) + len(widths)
        head1 += " |" + s.center(block)
        head2 += " |" + "".join(f" {h:>{w}}" for h, w in zip(per, widths, strict=True))
    show_ratio = "tenantkv" in servers and "redis" in servers
    if show_ratio:
        head1 += " |" + " ratio".ljust(10)
        head2 += " | tkv/redis"
    lines = [head1, head2, "-" * len(head2)]
    for key in keys:
        op, conns, depth = key
        line = f"{op:<4} {conns:>5} {depth:>5}"
        for s in servers:
            cell = by.get((s, key))
            if cell is None:
                line += " |" + " " * (sum(widths) + len(widths))
                continue
            j = cell.to_json()
            vals = [
                _fmt_ops(cell.result.ops_per_s) + ("!" if j["errors"] else ""),
                _fmt_us(j["p50_us"]),
                _fmt_us(j["p99_us"]),
                _fmt_pct(j["client_cpu_pct"]),
                _fmt_pct(j["server_cpu_pct"]),
            ]
            line += " |" + "".join(f" {v:>{w}}" for v, w in zip(vals, widths, strict=True))
        if show_ratio:
            r = ratio(cells, key, "tenantkv", "redis")
            line += " | " + (f"{r:>8.2f}x" if r is not None else f"{'-':>9}")
        lines.append(line)
    errs = [c for c in cells if c.result.errors]
    if errs:
        lines.append("")
        lines.append("! = some requests failed (not counted in ops/s):")
        for c in errs:
            lines.append(
                f"  {c.server} {c.spec.op} conns={c.spec.conns} depth={c.spec.depth}: "
                f"{c.result.errors} errors, e.g. {c.result.error_sample}"
            )
    return "\n".join(lines)


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
