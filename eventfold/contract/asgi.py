"""The one way past the router that both HTTP APIs share: a request their hot path serves
(a command; a KTable get) goes straight to its endpoint, as a route would take it, and any
error it raises gets the app's exception handlers, as on a route.

Why: on those requests Starlette's exception middleware, router and FastAPI's request
solving were a large share of the time, and a forwarded KTable get crosses two instances
(docs/benchmarks.md). Middleware added to the app (request log, metrics) still wraps them,
and each API tests its bypass against its router with the same requests (differential
property tests): both must answer alike for every input.

Imports Starlette: only the HTTP layers import this module, never a Spark task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from starlette._exception_handler import _lookup_exception_handler
from starlette._utils import is_async_callable
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[..., Awaitable[Response]]
Match = Callable[[Scope], tuple[Route, dict[str, str]] | None]
"""The route a request is for and its path parameters, if the bypass serves it."""


class RouterBypass:
    """ASGI middleware: requests ``match`` recognises go to their route's endpoint, called
    with the request and the path parameters; all else goes on to the app."""

    def __init__(self, app: ASGIApp, match: Match,
                 handlers: Mapping[Any, Callable[..., Any]]) -> None:
        self.app = app
        self.match = match
        self.handlers = handlers
        """The app's exception handlers (its own dict: handlers added later count too)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self.match(scope) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        route, params = found
        # What the router would put in the scope: middleware outside (metrics) reads the
        # route's path from it.
        scope["route"] = route
        scope["path_params"] = params
        request = Request(scope, receive)
        try:
            response = await route.endpoint(request, **params)
        except Exception as exc:
            response = await self._error_response(request, exc)
        await response(scope, receive, send)

    async def _error_response(self, request: Request, exc: Exception) -> Response:
        """The handler a route would use: by status for an HTTPException, else by class;
        none (an error no handler takes) goes on, as from a route, to the server's 500."""
        handler: Callable[..., Any] | None = (
            self.handlers.get(exc.status_code) if isinstance(exc, HTTPException) else None)
        handler = handler or cast(Callable[..., Any] | None,
                                  _lookup_exception_handler(dict(self.handlers), exc))
        if handler is None:
            raise exc
        if is_async_callable(handler):
            return cast(Response, await handler(request, exc))
        sync_handler = cast(Callable[[Request, Exception], Response], handler)
        return await run_in_threadpool(sync_handler, request, exc)
