"""PNG plots for ``docs/benchmarks.md`` (matplotlib: ``pip install -e '.[bench]'``).

Only curves get a plot — goodput and latency against offered load, units/s
over time against a limit, probing's throughput over time, memory and p99 over
a soak — because a table of those hides the shape that matters (a knee, a
drift, an overshoot). Importing this module fails without matplotlib; the
report then keeps the previous PNGs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

Env = dict[str, Any]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    # no timestamp in the file, so an unchanged plot is an unchanged file
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _part(result: dict[str, Any], key: str, name: str) -> dict[str, Any] | None:
    for p in result.get(key, []):
        if p.get("name") == name:
            return p
    return None


def overload(env: Env, out: Path) -> list[Path]:
    part = _part(env["result"], "parts", "load")
    if not part or not part.get("rows"):
        return []
    rows = part["rows"]
    x = [r["factor"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(x, [r["offered_per_s"] for r in rows], "k:", label="offered")
    ax.plot(x, [r["goodput_per_s"] for r in rows], "o-", label="goodput")
    ax.plot(x, [r["rejected_per_s"] for r in rows], "s--", label="rejected (462, retryable)")
    ax.axhline(part["C"], color="grey", lw=0.8, label=f"admitted capacity C = {part['C']:,.0f}/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}x" for v in x])
    ax.set_xlabel("offered load / C")
    ax.set_ylabel("requests/s")
    ax.set_title("Goodput vs offered load (Poisson GETs)")
    ax.legend(fontsize=8)
    paths = [_save(fig, out / "overload-goodput.png")]

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")):
        ax.plot(x, [r.get(key) for r in rows], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{v:g}x" for v in x])
    ax.set_xlabel("offered load / C")
    ax.set_ylabel("admitted latency, µs (from intended send)")
    ax.set_title("Admitted requests' latency vs offered load")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out / "overload-latency.png"))
    return paths


def _hard_limit(env: Env, out: Path, png: str) -> list[Path]:
    s = _part(env["result"], "scenarios", "hard-limit")
    if not s or not s.get("per_interval_units_per_s"):
        return []
    per = s["per_interval_units_per_s"]
    limit = s["settings"]["hard_limit"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    t = list(range(1, len(per) + 1))
    ax.plot(t, per, "o-", label="bucket units/s (server)")
    ax.axhline(limit, color="red", lw=1, label=f"hard limit {limit:,}")
    ax.axhspan(limit * 0.97, limit * 1.03, color="red", alpha=0.1, label="±3 %")
    if s["settings"].get("offered_ops_per_s") is not None:
        offered = s["settings"]["offered_ops_per_s"] * s["settings"].get("unit_cost", 1)
        ax.axhline(offered, color="grey", ls=":", label=f"offered {offered:,.0f}")
        ax.set_ylim(0, offered * 1.1)
        ax.set_title("A bucket pushed to 3x its hard limit")
    else:  # closed loop: demand bounded only by the throttle
        ax.set_ylim(0, limit * 1.5)
        client = str(s["settings"].get("client") or "closed loop").split()[0]
        ax.set_title(f"A bucket driven past its hard limit by {client}")
    ax.set_xlabel("second")
    ax.set_ylabel("units/s")
    ax.legend(fontsize=8, loc="lower center", ncol=2)
    return [_save(fig, out / png)]


def throttle_accuracy(env: Env, out: Path) -> list[Path]:
    return _hard_limit(env, out, "throttle-accuracy.png")


def throttle_accuracy_resp(env: Env, out: Path) -> list[Path]:
    return _hard_limit(env, out, "throttle-accuracy-resp.png")


def isolation(env: Env, out: Path) -> list[Path]:
    s = _part(env["result"], "scenarios", "fairness")
    if not s:
        return []
    one = s["one"].get("per_interval_units_per_s", [])
    many = s["many"].get("per_interval_units_per_s", [])
    if not one or not many:
        return []
    cap = s["settings"]["capacity"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(1, len(one) + 1), one, "o-", label="bucket 'one' (1 connection)")
    ax.plot(range(1, len(many) + 1), many, "s-", label="bucket 'many' (64 connections)")
    ax.axhline(cap / 2, color="grey", ls=":", label=f"fair share {cap / 2:,.0f}")
    ax.axhline(cap, color="red", lw=1, label=f"node capacity {cap:,}")
    ax.set_ylim(0, cap * 1.1)
    ax.set_xlabel("second")
    ax.set_ylabel("units/s")
    ax.set_title("Two buckets sharing the node capacity")
    ax.legend(fontsize=8, loc="lower center", ncol=2)
    return [_save(fig, out / "isolation-fairness.png")]


def probing(env: Env, out: Path) -> list[Path]:
    part = _part(env["result"], "parts", "probing")
    if not part or not part.get("phases"):
        return []
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax2 = ax.twinx()
    offset = 0.0
    for ph in part["phases"]:
        series = ph.get("series") or []
        if not series:
            continue
        t = [offset + row[0] for row in series]
        ax.plot(t, [row[1] for row in series], "-", label=f"{ph['short']}: ops/s")
        ax2.plot(t, [row[2] + row[3] for row in series], ":", color="grey")
        ref = ph.get("reference_ops_per_s")
        if ref:
            ax.hlines(0.95 * ref, t[0], t[-1], colors="red", lw=0.8)
        offset = t[-1]
    ax.set_xlabel("seconds (phases back to back); red: 95 % of the best fixed size")
    ax.set_ylabel("ops/s")
    ax2.set_ylabel("tickets, read + write (dotted)")
    ax.set_title("Throughput probing from the minimum pool size")
    ax.legend(fontsize=8, loc="lower right")
    return [_save(fig, out / "probing.png")]


def soak(env: Env, out: Path) -> list[Path]:
    rows = [r for r in env["result"].get("rows", []) if not r.get("warmup")]
    if not rows:
        return []
    t = [r["t"] / 60 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(t, [r["rss_anon_mb"] for r in rows], "-", label="RssAnon MiB")
    ax.set_ylim(0, max(r["rss_anon_mb"] for r in rows) * 1.3)
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax2 = ax.twinx()
    ax2.plot(t, [r["p99_ms"] for r in rows], ".", color="tab:orange", label="p99 ms")
    ax2.set_ylabel("p99 per interval, ms")
    ax.set_title("Soak: resident memory and p99 over time")
    ax.legend(loc="lower left", fontsize=8)
    ax2.legend(loc="lower right", fontsize=8)
    return [_save(fig, out / "soak.png")]


PLOTS: dict[str, Callable[[Env, Path], list[Path]]] = {
    "overload": overload,
    "throttle-accuracy": throttle_accuracy,
    "throttle-accuracy-resp": throttle_accuracy_resp,
    "isolation": isolation,
    "probing": probing,
    "soak": soak,
}


def draw_all(envs: dict[str, Env], out: Path) -> list[Path]:
    drawn: list[Path] = []
    for name, draw in PLOTS.items():
        if name in envs:
            drawn += draw(envs[name], out)
    return drawn
