"""What the read API's routes can answer besides 200, as OpenAPI response objects: every status
a route can return is documented with its body, so that a client generated from the spec,
or a fuzzer checking the server against it, meets no surprise."""

from __future__ import annotations

from typing import Any

FRESHNESS: dict[str, Any] = {"type": "object", "description": "how current the answer is"}

RETRY_AFTER: dict[str, Any] = {"Retry-After": {
    "description": "seconds to wait before trying again", "schema": {"type": "integer"}}}


def error(description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    """A response whose JSON body is ``{"detail": ...}`` plus ``properties``."""
    return {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "required": ["detail"],
        "properties": {"detail": {"type": "string"}, **properties}}}}}


BAD_QUERY: dict[int | str, dict[str, Any]] = {400: error(
    "a parameter is unknown or malformed, or a path or query parameter holds a NUL or a lone "
    "surrogate; `detail` names the parameter")}

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {
    **error("the bearer token (EVENTFOLD_API_TOKEN) is missing or wrong"),
    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}}}

UNAVAILABLE: dict[int | str, dict[str, Any]] = {503: {
    **error("not answerable yet: the read model's projection has never run, a KTable is "
            "restoring, or the database is unreachable; retry after `Retry-After` seconds"),
    "headers": RETRY_AFTER}}

NOT_REACHED: dict[int | str, dict[str, Any]] = {504: error(
    "read-your-writes: the projection had not applied `min_version` within `wait_ms`; retry "
    "later", min_version={"type": "integer"},
    current_version={"type": ["integer", "null"]})}


def not_found(what: str, with_freshness: bool = False) -> dict[int | str, dict[str, Any]]:
    extra = {"freshness": FRESHNESS} if with_freshness else {}
    return {404: error(what, **extra)}
