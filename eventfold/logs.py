"""Logging for every Eventfold process: text for people, or one JSON object per line
(``EVENTFOLD_LOG_FORMAT=json``) for log pipelines.

A JSON line carries the correlation id of the command it concerns: the HTTP APIs take it
from the request (``X-Correlation-ID``, else ``X-Request-ID``) for every line logged while the
request runs, and a projection adds the one its event carries to the lines about that event
(a dead letter), so a command can be followed from the API to the projection.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import UTC, datetime

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

LOG_FORMATS = ("text", "json")
CORRELATION_ID: ContextVar[str | None] = ContextVar("correlation_id", default=None)
_CONTEXT_FIELDS = ("correlation_id", "projection", "event_id")
"""``extra`` fields a JSON line carries when a log call passes them."""
_MAX_ID = 200


def configure_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.addFilter(CorrelationFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("alembic", "py4j", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class CorrelationFilter(logging.Filter):
    """Stamps each record with the correlation id of the request being served when it was
    logged (a record may be formatted later, outside that context)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "correlation_id", None) is None:
            record.correlation_id = CORRELATION_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        for name in _CONTEXT_FIELDS:
            if (value := getattr(record, name, None)) is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class CorrelationIds:
    """ASGI middleware: the request's correlation id in ``CORRELATION_ID`` while it runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        raw = headers.get(b"x-correlation-id") or headers.get(b"x-request-id")
        token = CORRELATION_ID.set(raw[:_MAX_ID].decode("utf-8", "replace") if raw else None)
        try:
            await self.app(scope, receive, send)
        finally:
            CORRELATION_ID.reset(token)
