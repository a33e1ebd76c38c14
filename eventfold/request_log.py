"""Structured request logs for both HTTP APIs: one JSON object per request on the
``eventfold.requests`` logger (method, path, status, duration, client, request id).

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware: it adds no task per
request, which matters on the read API's hot path.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("eventfold.requests")


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex[:16]
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            client = scope.get("client")
            log.info(orjson.dumps({
                "method": scope["method"], "path": scope["path"],
                "query": scope.get("query_string", b"").decode(errors="replace"),
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                "client": client[0] if client else None, "request_id": request_id,
            }).decode())


def _header(scope: MutableMapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            decoded: str = value.decode(errors="replace")
            return decoded[:64]
    return None
