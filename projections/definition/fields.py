"""How a projection reads a value out of an event's payload: one rule for every engine.

The plain-Python fold, the Arrow decoder and Spark all take keys (``key_by``, a lookup's
``on``) and aggregated fields through these functions, so a dotted path, a number used as a
key or a value of the wrong type means the same thing in each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

SQL_TYPES = ("bigint", "double", "boolean", "string")
"""The Spark SQL types an aggregated field is computed in."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def path_value(data: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` (``customer.id``); None where any step is missing."""
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def key_text(value: Any) -> str | None:
    """A payload value as a key: text as it is, anything else as its JSON (``7``, ``true``,
    ``{"a":1}``), so the key reads the same whichever engine took it; None stays None."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def coerce(value: Any, sql_type: str) -> Any:
    """A payload value as an aggregated column's type; None (skipped by the aggregate, as SQL
    skips nulls) when it is not of that type."""
    if value is None:
        return None
    if sql_type == "string":
        return key_text(value)
    if sql_type == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if sql_type == "double":
        return float(value)
    whole = int(value)
    return whole if _INT64_MIN <= whole <= _INT64_MAX else None  # a BIGINT cannot hold it
