"""The HTTP command API: one POST route per registered command, typed in the OpenAPI document.

Status codes: 201 with the append result; 404 for an unknown command, or an unknown stream where
the command needs one; 409 for a version conflict (with the current version); 422 for a payload
that does not parse or validate, or a command a business rule rejects. Bad input never gives 500.
"""

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text

from write_model.aggregate import DomainError
from write_model.commands import Command, CommandBus, CommandResult, HandlerSpec
from write_model.store import ConcurrencyError, StreamNotFound

log = logging.getLogger(__name__)


def create_command_app(bus: CommandBus, title: str = "Eventfold command API") -> FastAPI:
    app = FastAPI(title=title)
    for spec in bus.registry:
        _add_command_route(app, bus, spec)

    @app.post("/commands/{name}", status_code=404, include_in_schema=False)
    def unknown_command(name: str) -> JSONResponse:
        try:
            bus.registry.get(name)
        except LookupError as exc:
            return JSONResponse(status_code=404, content={"detail": str(exc)})
        raise AssertionError("registered commands have their own routes")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    def ready() -> JSONResponse:
        try:
            with bus.repository.store.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # readiness reports any database failure as not ready
            return JSONResponse(status_code=503, content={"status": "unavailable",
                                                          "detail": str(exc)[:200]})
        return JSONResponse(content={"status": "ready"})

    _add_error_handlers(app)
    return app


def _add_command_route(app: FastAPI, bus: CommandBus, spec: HandlerSpec[Any, Any]) -> None:
    command_model: type[Command] = spec.command

    def execute(command: command_model) -> CommandResult:  # type: ignore[valid-type]
        return bus.execute(command)

    execute.__name__ = f"execute_{command_model.command_name}"
    app.post(
        f"/commands/{command_model.command_name}",
        response_model=CommandResult,
        status_code=201,
        summary=f"{command_model.command_name} on a {spec.aggregate.stream_type}",
        description=(command_model.__doc__ or "").strip(),
        responses={404: {"description": "unknown stream"}, 409: {"description": "conflict"}},
    )(execute)


def _field_error(err: Mapping[str, Any]) -> dict[str, str]:
    if err["type"] == "json_invalid":  # loc is ("body", character position)
        position = err["loc"][-1] if len(err["loc"]) > 1 else "?"
        return {"field": "body", "message": f"invalid JSON at character {position}: "
                f"{err.get('ctx', {}).get('error', err['msg'])}", "type": "json_invalid"}
    field = ".".join(str(part) for part in err["loc"][1:]) or "body"
    return {"field": field, "message": err["msg"], "type": err["type"]}


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_payload(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_field_error(err) for err in exc.errors()]
        return JSONResponse(status_code=422,
                            content={"detail": "invalid command", "errors": errors})

    @app.exception_handler(ConcurrencyError)
    async def conflict(_: Request, exc: ConcurrencyError) -> JSONResponse:
        return JSONResponse(status_code=409, content={
            "detail": str(exc), "stream_id": exc.stream_id,
            "expected_version": exc.expected_version, "current_version": exc.current_version,
        })

    @app.exception_handler(StreamNotFound)
    async def not_found(_: Request, exc: StreamNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(DomainError)
    async def rejected(_: Request, exc: DomainError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc)})
