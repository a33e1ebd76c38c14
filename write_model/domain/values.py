"""What a value must be to be stored and published: JSON that Postgres and every consumer
accept. Checked where values enter (command fields, the X-Metadata header), so that bad input
is refused with its place named instead of failing deep inside the database or a projection.

- no NUL character (Postgres text and jsonb cannot hold U+0000);
- no lone surrogate (not encodable as UTF-8);
- no infinite or NaN number (not JSON: it would be stored as null);
- no integer beyond 64 bits (no JSON encoder we use writes one, and consumers read integers
  as 64-bit);
- at most ``MAX_DEPTH`` levels of nesting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_DEPTH = 32
MIN_INTEGER, MAX_INTEGER = -(2**63), 2**63 - 1


def storable_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored, or None if it can; names the place inside ``value``
    (``items[2].name: ...``)."""
    found = _problem(value, 0)
    if found is None:
        return None
    path, reason = found
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return f"{where.lstrip('.')}: {reason}" if where else reason


def _problem(value: Any, depth: int) -> tuple[list[str | int], str] | None:
    if isinstance(value, str):
        reason = text_problem(value)
        return None if reason is None else ([], reason)
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], f"the number {value} is not finite")
    if isinstance(value, int) and not MIN_INTEGER <= value <= MAX_INTEGER:
        return [], f"the integer {value} does not fit in 64 bits"
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    if depth >= MAX_DEPTH:
        return [], f"nested deeper than {MAX_DEPTH} levels"
    for key, item in items:
        if isinstance(key, str) and (reason := text_problem(key)) is not None:
            return [], f"key {key!r} {reason}"
        if (found := _problem(item, depth + 1)) is not None:
            return [key, *found[0]], found[1]
    return None


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid Unicode)"
    return None


# -- the same rule in JSON Schema, for the API's OpenAPI document -------------------------------
# A schema cannot count nesting or see a lone surrogate (no JSON text a client generates
# holds one), but it can say "no NUL" and "64-bit integers", which a generated client or a
# fuzzer then respects.
STORABLE_TEXT_PATTERN = r"^[^\u0000]*$"
"""Text without NUL, as a JSON Schema (ECMA 262) pattern."""
STORABLE_INTEGER = {"type": "integer", "minimum": MIN_INTEGER, "maximum": MAX_INTEGER}


def storable_json_schema(ref: str) -> dict[str, Any]:
    """Any storable JSON value; ``ref`` is where this schema itself is found (it recurses)."""
    text = {"type": "string", "pattern": STORABLE_TEXT_PATTERN}
    return {"anyOf": [
        text, STORABLE_INTEGER, {"type": "number", "not": {"type": "integer"}},
        {"type": "boolean"}, {"type": "null"},
        {"type": "array", "items": {"$ref": ref}},
        {"type": "object", "propertyNames": text, "additionalProperties": {"$ref": ref}},
    ]}
