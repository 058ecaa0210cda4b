"""Rendering for ``tenantkv-admin``: aligned tables for people, JSON for scripts.

Pure functions from values to strings; nothing here prints or talks to a
server. Human output never shows raw control characters (a name or a path
from the server cannot move the cursor of the terminal it is printed on).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: Space between table columns.
GAP = "  "
#: Indent of a table under a section title.
INDENT = "  "


# -- JSON ------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """``value`` with bytes decoded as UTF-8 (bad bytes replaced), map keys made
    strings and anything else JSON cannot hold turned into its ``repr``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {_json_key(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return repr(value)


def _json_key(key: Any) -> str:
    k = to_jsonable(key)
    return k if isinstance(k, str) else json.dumps(k)


def dumps(value: Any) -> str:
    """The JSON text printed by ``--json``."""
    return json.dumps(to_jsonable(value), indent=2)


# -- cells -----------------------------------------------------------------------------


def text(s: str) -> str:
    """``s`` with non-printable characters escaped (``\\n``, ``\\x1b``, …)."""
    if s.isprintable():
        return s
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in s)


def cell(value: Any) -> str:
    """One value as table text: ``-`` for nothing, yes/no for booleans."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes | bytearray | memoryview):
        return text(bytes(value).decode("utf-8", errors="replace"))
    if isinstance(value, str):
        return text(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping):
        if not value:
            return "-"
        return ", ".join(f"{cell(k)}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        if not value:
            return "-"
        if all(_is_scalar(v) for v in value):
            return ", ".join(cell(v) for v in value)
    return text(json.dumps(to_jsonable(value), separators=(",", ":")))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str | bytes)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def human_bytes(n: int) -> str:
    """``1536`` → ``1.5 KiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


# -- tables ----------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "") -> str:
    """An aligned table under upper-case headers; all-number columns align right."""
    raw = [list(r) for r in rows]
    cells = [[cell(v) for v in r] for r in raw]
    ncols = len(headers)
    widths = [
        max([len(headers[i])] + [len(r[i]) for r in cells if i < len(r)]) for i in range(ncols)
    ]
    right = [
        bool(raw) and all(_is_number(r[i]) for r in raw if i < len(r) and r[i] is not None)
        for i in range(ncols)
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if right[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return (indent + GAP.join(parts)).rstrip()

    out = [line([h.upper() for h in headers])]
    out.extend(line(r + [""] * (ncols - len(r))) for r in cells)
    return "\n".join(out)


def flatten(mapping: Mapping[Any, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested maps as ``(dotted.key, value)`` pairs, in the map's own order."""
    out: list[tuple[str, Any]] = []
    for k, v in mapping.items():
        key = f"{prefix}{cell(k)}"
        if isinstance(v, Mapping) and v:
            out.extend(flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def kv_value(key: str, value: Any) -> str:
    """A value for a key/value table; byte counts and durations also get a readable form."""
    s = cell(value)
    if key.endswith("bytes") and _is_number(value) and abs(value) >= 1024:
        s += f" ({human_bytes(int(value))})"
    elif key.endswith("secs") and _is_number(value) and value >= 60:
        s += f" ({human_seconds(value)})"
    return s


def kv_table(mapping: Mapping[Any, Any], *, indent: str = "") -> str:
    """Two aligned columns, key and value; nested maps flattened to dotted keys."""
    pairs = flatten(mapping)
    if not pairs:
        return indent + "(empty)"
    width = max(len(k) for k, _ in pairs)
    return "\n".join((f"{indent}{k.ljust(width)}{GAP}{kv_value(k, v)}").rstrip() for k, v in pairs)


def section(title: str, body: str) -> str:
    """A titled block: the title on its own line, the body indented under it."""
    return f"{text(title)}\n{body}"


def human_seconds(secs: float) -> str:
    """``3725`` → ``1h 2m 5s``."""
    s = int(secs)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{n}{u}" for n, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if n]
    return " ".join(parts[:3]) or "0s"


# -- the status document ---------------------------------------------------------------


def status_text(doc: Any) -> str:
    """``server_status`` for people: top-level values under "server", then one
    titled block per map in the document. Buckets, the tenant throttle, the gates
    and latency have their own layouts — per-bucket tables, pools side by side —
    and any other map is shown as key/value pairs."""
    if not isinstance(doc, Mapping):
        return cell(doc)
    blocks = []
    top = {k: v for k, v in doc.items() if not isinstance(v, Mapping) and k != "workers"}
    if top:
        blocks.append(section("server", kv_table(top, indent=INDENT)))
    workers = doc.get("workers")
    if isinstance(workers, list) and all(isinstance(w, Mapping) for w in workers):
        # serve --workers N: the node's totals below, each worker's part here.
        keys = ["worker", "pid", "uptime_secs", "connections", "ops", "writes_done"]
        rows = [[w.get(k) for k in keys] for w in workers]
        blocks.append(section("workers", table([k.upper() for k in keys], rows, indent=INDENT)))
    for name, value in doc.items():
        if not isinstance(value, Mapping):
            continue
        render = SECTION_RENDERERS.get(name)
        body = None
        if render is not None:
            try:
                body = render(value)
            except (KeyError, TypeError, AttributeError, ValueError):
                body = None  # a shape this version does not know: show it plainly
        if body is None:
            body = generic_section_text(value)
        blocks.append(section(cell(name), body))
    return "\n\n".join(blocks)


def _buckets_text(value: Mapping[str, Any]) -> str | None:
    if not all(isinstance(v, Mapping) for v in value.values()):
        return None
    return bucket_status_table(value)


def _throttle_text(value: Mapping[str, Any]) -> str | None:
    if not isinstance(value.get("buckets"), Mapping):
        return None
    return throttle_status_text(value)


def side_by_side(maps: Mapping[str, Mapping[str, Any]], *, indent: str = INDENT) -> str:
    """Maps with (mostly) the same keys as one table: a row per key, a column per map
    (``-`` where a map lacks the key). Nested maps are flattened to dotted keys."""
    flat = {name: dict(flatten(m)) for name, m in maps.items()}
    keys: list[str] = []
    for f in flat.values():
        keys.extend(k for k in f if k not in keys)
    rows = [[k, *(f.get(k) for f in flat.values())] for k in keys]
    return table(["", *flat], rows, indent=indent)


def _ingress_text(value: Mapping[str, Any]) -> str:
    limiters = {k: v for k, v in value.items() if k != "admission" and isinstance(v, Mapping)}
    parts = []
    if limiters:
        parts.append(side_by_side(limiters))
    if isinstance(value.get("admission"), Mapping):
        parts.append(side_by_side({"admission tickets": value["admission"]}))
    return "\n\n".join(parts)


def _execution_text(value: Mapping[str, Any]) -> str:
    pools = {k: v for k, v in value.items() if k != "probing" and isinstance(v, Mapping)}
    parts = [side_by_side({f"{k} tickets": v for k, v in pools.items()})] if pools else []
    if isinstance(value.get("probing"), Mapping):
        parts.append(section(INDENT + "probing", kv_table(value["probing"], indent=INDENT * 2)))
    return "\n\n".join(parts)


def _p99_ms_of(pairs: Any) -> float | None:
    """p99 (ms, from the upper bound of its bucket) of a ``[[µs, n], ..., ["+Inf", n]]`` list."""
    if not isinstance(pairs, list):
        return None
    total = sum(n for _, n in pairs)
    if not total:
        return None
    seen, last = 0, None
    for le, n in pairs:
        seen += n
        if le != "+Inf":
            last = le
        if seen >= 0.99 * total:
            return None if last is None else round(last / 1000, 3)
    return None


def _node_and_buckets(value: Mapping[str, Any], headers: list[str], rows: list[list[Any]]) -> str:
    parts = []
    node = value.get("node")
    if isinstance(node, Mapping) and node:
        parts.append(kv_table(node, indent=INDENT))
    parts.append(table(headers, rows, indent=INDENT) if rows else INDENT + "(no buckets)")
    return "\n\n".join(parts)


def _overridden(stats: Mapping[str, Any], key: str) -> Any:
    v = stats.get(key)
    return f"{v}*" if stats.get(f"{key}_overridden") else v


def _bucket_queues_text(value: Mapping[str, Any]) -> str:
    rows = []
    for bucket, per in value["buckets"].items():
        for cls, q in per.items():
            rows.append(
                [
                    bucket,
                    cls,
                    _overridden(q, "concurrency"),
                    _overridden(q, "queue_tolerance"),
                    q.get("running"),
                    q.get("queued"),
                    q.get("admitted"),
                    q.get("queued_total"),
                    q.get("rejected_overflow"),
                    q.get("rejected_timeout"),
                    q.get("interrupted"),
                    round(q["release_rate"], 1) if _is_number(q.get("release_rate")) else None,
                ]
            )
    text = _node_and_buckets(
        value,
        [
            "bucket",
            "class",
            "concurrency",
            "tolerance",
            "running",
            "queued",
            "admitted",
            "waited",
            "overflow",
            "timeout",
            "interrupted",
            "release/s",
        ],
        rows,
    )
    if any("*" in str(r[2]) + str(r[3]) for r in rows):
        text += "\n" + INDENT + "* the bucket's own limit (bucket-queue-set), not the node's"
    return text


def _ms(micros: Any) -> Any:
    return round(micros / 1000) if _is_number(micros) else None


def _write_permits_text(value: Mapping[str, Any]) -> str:
    rows = [
        [
            bucket,
            b.get("capacity"),
            b.get("in_use"),
            b.get("waiting"),
            b.get("granted"),
            b.get("waited"),
            _ms(b.get("wait_micros_total")),
            _p99_ms_of(b.get("wait_histogram_us")),
            b.get("interrupted"),
        ]
        for bucket, b in value["buckets"].items()
    ]
    headers = [
        "bucket",
        "capacity",
        "in_use",
        "waiting",
        "granted",
        "waited",
        "wait_ms",
        "wait_p99_ms",
        "interrupted",
    ]
    return _node_and_buckets(value, headers, rows)


def _latency_text(value: Mapping[str, Any]) -> str:
    """Per bucket and operation since start: count, mean, p50, p99 (ms); then commits."""

    def ms(us: Any) -> Any:
        return None if not _is_number(us) else round(us / 1000, 3)

    def row(first: list[Any], h: Mapping[str, Any]) -> list[Any]:
        count = h.get("count") or 0
        mean = h["sum_micros"] / count if count and _is_number(h.get("sum_micros")) else None
        return [*first, count, ms(mean), ms(h.get("p50_micros")), ms(h.get("p99_micros"))]

    rows = [
        row([bucket, op], h)
        for bucket, per in (value.get("buckets") or {}).items()
        for op, h in per.items()
    ]
    parts = [
        table(["bucket", "operation", "count", "mean_ms", "p50_ms", "p99_ms"], rows, indent=INDENT)
        if rows
        else INDENT + "(no operations yet)"
    ]
    commit = value.get("commit")
    if isinstance(commit, Mapping):
        batches = commit.get("count") or 0
        per_batch = (
            round(commit["batch_ops_sum"] / batches, 1)
            if batches and _is_number(commit.get("batch_ops_sum"))
            else None
        )
        parts.append(
            table(
                ["commits", "count", "mean_ms", "p50_ms", "p99_ms", "ops/batch"],
                [[*row(["group commit"], commit), per_batch]],
                indent=INDENT,
            )
        )
    return "\n\n".join(parts)


def generic_section_text(value: Mapping[str, Any]) -> str:
    """Any other section: key/value pairs, and a table with a row per bucket when it
    has a ``buckets`` map of maps (columns: their scalar values)."""
    buckets = value.get("buckets")
    if not (
        isinstance(buckets, Mapping)
        and buckets
        and all(isinstance(b, Mapping) for b in buckets.values())
    ):
        return kv_table(value, indent=INDENT)
    rest = {k: v for k, v in value.items() if k != "buckets"}
    flat = {name: dict(flatten(b)) for name, b in buckets.items()}
    keys: list[str] = []
    for f in flat.values():
        keys.extend(k for k, v in f.items() if k not in keys and _is_scalar(v))
    rows = [[name, *(f.get(k) for k in keys)] for name, f in flat.items()]
    parts = [kv_table(rest, indent=INDENT)] if rest else []
    parts.append(table(["bucket", *keys], rows, indent=INDENT))
    return "\n\n".join(parts)


def bucket_status_table(buckets: Mapping[Any, Mapping[str, Any]]) -> str:
    if not buckets:
        return INDENT + "(no buckets)"
    rows = [
        [
            name,
            b.get("entries"),
            b.get("connections"),
            _total(b.get("ops")),
            _total(b.get("errors")),
        ]
        for name, b in buckets.items()
    ]
    return table(["name", "entries", "connections", "ops", "errors"], rows, indent=INDENT)


#: Per-bucket throttle columns: (header, status key).
THROTTLE_COLUMNS = (
    ("reserved", "reserved"),
    ("hard_limit", "hard_limit"),
    ("rate/s", "allowance_rate"),
    ("used/s", "units_used_previous_window"),
    ("ru_total", "ru_total"),
    ("wu_total", "wu_total"),
    ("throttled", "throttle_count_total"),
    ("wait_ms", "throttle_wait_micros_total"),
    ("rejected", "reject_count_total"),
    ("waiting", "waiting"),
)


def throttle_status_text(t: Mapping[str, Any]) -> str:
    """The tenant throttle section: node values, then one row per bucket."""
    node = {k: v for k, v in (t.get("node") or {}).items()}
    parts = [kv_table(node, indent=INDENT)] if node else []
    buckets = t["buckets"]
    if buckets:
        rows = []
        for name, b in buckets.items():
            row: list[Any] = [name]
            for _, key in THROTTLE_COLUMNS:
                v = b.get(key)
                if key == "throttle_wait_micros_total" and _is_number(v):
                    v = round(v / 1000)
                elif isinstance(v, float):
                    v = round(v)
                row.append(v)
            rows.append(row)
        parts.append(table(["bucket", *(h for h, _ in THROTTLE_COLUMNS)], rows, indent=INDENT))
    return "\n\n".join(parts)


def _total(value: Any) -> Any:
    """A count, or the sum of a map of counts (``{"get": 3, "set": 2}`` → 5)."""
    if isinstance(value, Mapping):
        return sum(v for v in value.values() if _is_number(v))
    return value


#: Sections of ``server_status`` with a layout of their own (others: key/value pairs).
SECTION_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "buckets": _buckets_text,
    "throttle": _throttle_text,
    "ingress": _ingress_text,
    "execution": _execution_text,
    "bucket_queues": _bucket_queues_text,
    "write_permits": _write_permits_text,
    "latency": _latency_text,
}
