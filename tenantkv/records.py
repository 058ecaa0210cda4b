"""Statistics records as the JSON-ready dicts of ``server_status``.

Every statistics snapshot is a frozen dataclass whose dict is its fields by
name, in declaration order; only some fields change name or form on the way
(a rounded float, a limit's wire form). :func:`fields_dict` gives that dict, so
a record's ``as_dict`` states only what differs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any

_NONE: Mapping[str, str] = MappingProxyType({})


def fields_dict(
    record: Any,
    *,
    renamed: Mapping[str, str] = _NONE,
    left_out: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A record's fields in declaration order, by name (``renamed`` gives the name a
    field has in the dict where it differs), but those ``left_out``. A caller that
    changes a value's form replaces it by key: the key keeps its place."""
    return {
        renamed.get(f.name, f.name): getattr(record, f.name)
        for f in fields(record)
        if f.name not in left_out
    }


def histogram_to_wire(histogram: tuple[tuple[float, int], ...]) -> list[list[Any]]:
    """``(upper bound in µs, count)`` bins as ``[bound, count]`` pairs, the last bound
    ``"+Inf"`` (JSON has no infinity)."""
    return [["+Inf" if math.isinf(le) else int(le), n] for le, n in histogram]
