"""JSON logs: one object per line, carrying the correlation id of the request being served."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
from fastapi import FastAPI

from eventfold.logs import CorrelationFilter, CorrelationIds, JsonFormatter


def test_a_line_logged_while_a_request_runs_carries_its_correlation_id() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(CorrelationFilter())
    log = logging.getLogger("test.correlation")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    app = FastAPI()

    @app.get("/work")
    def work() -> dict[str, str]:
        log.info("working")
        return {}

    app.add_middleware(CorrelationIds)

    async def requests() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as client:
            await client.get("/work", headers={"X-Correlation-ID": "order-42"})
            await client.get("/work", headers={"X-Request-ID": "req-7"})
            await client.get("/work")
    try:
        asyncio.run(requests())
    finally:
        log.removeHandler(handler)
    # Formatted after the requests ended: the filter kept each one's id on its record.
    lines = [json.loads(JsonFormatter().format(r)) for r in records]
    assert [line.get("correlation_id") for line in lines] == ["order-42", "req-7", None]
    assert lines[0]["message"] == "working" and lines[0]["level"] == "INFO"
    assert lines[0]["logger"] == "test.correlation" and lines[0]["ts"].endswith("+00:00")


def test_extra_fields_and_exceptions_are_kept() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.WARNING, __file__, 1, "dead-lettering %s", ("t[0]@5",),
            exc_info=__import__("sys").exc_info(),
            extra={"projection": "totals", "event_id": "e1", "correlation_id": "c1"})
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "dead-lettering t[0]@5"
    assert (line["projection"], line["event_id"], line["correlation_id"]) == ("totals", "e1",
                                                                              "c1")
    assert "ValueError: boom" in line["exception"]
