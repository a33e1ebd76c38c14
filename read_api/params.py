"""What every read API route shares: its query parameters checked (a 400 naming the
parameter), the read-your-writes wait, JSON answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from decimal import Decimal
from typing import Any

import orjson
from fastapi import Path, Request
from fastapi.responses import Response

from eventfold.read_api.metrics import READ_YOUR_WRITES
from eventfold.read_api.read_models import ReadModel
from eventfold.read_api.schema import QueryError, check_text

DEFAULT_WAIT_MS = 5_000
MAX_WAIT_MS = 30_000
_POLL_S = 0.02
_NOTIFIED_POLL_S = 1.0  # notified of commits: a look now and then, in case one was missed
READ_YOUR_WRITES_DOC = (
    f"Read-your-writes: `min_version=N` (the `version` the command API returned) waits up to "
    f"`wait_ms` (default {DEFAULT_WAIT_MS}, at most {MAX_WAIT_MS}) until the projection has "
    "applied version N of the stream, else answers 504; a read model re-keyed with `key_by` "
    "also takes `stream=<the aggregate id the command wrote to>`.")


def json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, default=json_default), status_code=status,
                    media_type="application/json")


def query_params(request: Request) -> list[tuple[str, str]]:
    return list(request.query_params.multi_items())


def int_param(request: Request, name: str, default: int | None, low: int, high: int
              ) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise QueryError(f"{name}: {raw!r} is not an integer") from None
    if not low <= value <= high:
        raise QueryError(f"{name}: must be between {low} and {high}, got {value}")
    return value


async def checked_text(request: Request) -> None:
    """Every path and query parameter must be text a stored value could hold: a 400 naming
    the parameter, never a database error."""
    for name, value in request.path_params.items():
        check_text(value, name)
    for name, value in request.query_params.multi_items():
        check_text(name, "parameter name")
        check_text(value, name)


def only_params(request: Request, allowed: Iterable[str]) -> None:
    known = set(allowed)
    for name in request.query_params:
        if name not in known:
            raise QueryError(f"{name}: unknown parameter; this endpoint takes "
                             f"{', '.join(sorted(known)) or 'none'}")


def wait_deadline(request: Request) -> float:
    wait_ms = int_param(request, "wait_ms", DEFAULT_WAIT_MS, 0, MAX_WAIT_MS) or 0
    return time.monotonic() + wait_ms / 1000


async def wait_until(probe: Callable[[], Awaitable[int | None]], min_version: int,
                     deadline: float, what: str, kind: str,
                     woken: Callable[[], asyncio.Event | None] = lambda: None) -> None:
    """Ask ``probe`` (the version applied so far) again, when ``woken`` says something may
    have changed (else every ``_POLL_S``), until it reaches ``min_version``; past the deadline
    answer 504 with the version reached. ``kind`` (read_model, ktable) labels the wait's
    metric."""
    waited = False
    while True:
        wake = woken()
        current = await probe()
        if current is not None and current >= min_version:
            READ_YOUR_WRITES.labels(kind, "waited" if waited else "at_once").inc()
            return
        if time.monotonic() >= deadline:
            READ_YOUR_WRITES.labels(kind, "timed_out").inc()
            raise VersionNotReached(what, min_version, current)
        waited = True
        pause = min(_POLL_S if wake is None else _NOTIFIED_POLL_S,
                    max(deadline - time.monotonic(), 0.0))
        if wake is None:
            await asyncio.sleep(pause)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), pause)


class VersionNotReached(Exception):
    def __init__(self, what: str, wanted: int, current: int | None) -> None:
        super().__init__(f"{what} has not reached version {wanted} yet (at "
                         f"{current if current is not None else 'none'}); retry later")
        self.wanted = wanted
        self.current = current


def known_names(read_models: dict[str, ReadModel]) -> Any:
    """The ``{name}`` path parameter, documented as one of the app's read models (any other
    name is answered 404)."""
    return Path(description="a read model (and KTable) of this app",
                json_schema_extra={"enum": sorted(read_models)})


def unavailable(detail: str) -> Response:
    response = json_response({"detail": detail}, 503)
    response.headers["Retry-After"] = "1"
    return response
