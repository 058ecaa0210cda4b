"""Rendering for ``tenantkv-admin``: aligned tables for people, JSON for scripts.

Pure functions from values to strings; nothing here prints or talks to a
server. Human output never shows raw control characters (a name or a path
from the server cannot move the cursor of the terminal it is printed on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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
    titled block per map in the document (buckets as a table, any other map —
    connections, storage, a gate's section — as key/value pairs)."""
    if not isinstance(doc, Mapping):
        return cell(doc)
    blocks = []
    top = {k: v for k, v in doc.items() if not isinstance(v, Mapping)}
    if top:
        blocks.append(section("server", kv_table(top, indent=INDENT)))
    for name, value in doc.items():
        if not isinstance(value, Mapping):
            continue
        if name == "buckets" and all(isinstance(v, Mapping) for v in value.values()):
            blocks.append(section("buckets", bucket_status_table(value)))
        elif name == "throttle" and isinstance(value.get("buckets"), Mapping):
            blocks.append(section("throttle", throttle_status_text(value)))
        else:
            blocks.append(section(cell(name), kv_table(value, indent=INDENT)))
    return "\n\n".join(blocks)


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
