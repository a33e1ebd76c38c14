"""The HTTP command API: one POST route per registered command, typed in the OpenAPI document.

Status codes: 201 with the append result (200 when a ``command_id`` was executed before, with
that first result, or when the command recorded nothing); 401 without the bearer token when
one is configured; 404 for an unknown command, or an unknown stream where the command needs
one; 409 when state the request could not know refuses it (a version conflict, with the
current version; a stream of another aggregate type; a business rule of the aggregate; a
command id used before with another payload); 413 for a body over the limit; 422 for a
payload or header that does not parse or validate; 503 while the database is unreachable.
Bad input never gives a 5xx.
"""

import asyncio
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eventfold.contract.asgi import Match, RouterBypass
from eventfold.write_model.bus import AsyncCommandBus
from eventfold.write_model.commands import Command
from eventfold.write_model.domain.aggregate import DomainError
from eventfold.write_model.domain.values import (
    storable_problem,
    text_problem,
)
from eventfold.write_model.openapi import (
    KEPT_UNTIL_HEADER,
    MAX_CORRELATION_ID,
    command_path,
    document_commands,
)
from eventfold.write_model.persistence.async_store import AsyncEventStore
from eventfold.write_model.persistence.store import (
    CommandIdReused,
    ConcurrencyError,
    StoreUnavailable,
    StreamNotFound,
    StreamOwnedByAnotherType,
    first_line,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
PRUNE_EVERY_S = 300.0


def create_command_app(
    bus: AsyncCommandBus, title: str = "Eventfold command API", api_token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    command_id_retention_s: float | None = None, skip_router: bool = True,
) -> FastAPI:
    """The app opens the bus's event store on startup and closes it on shutdown. Commands
    run on the event loop; concurrent ones share transactions (group commit). The results of
    commands with an id are kept ``command_id_retention_s`` (None: forever; an app's
    ``Settings.command_id_retention`` holds the default), and the app forgets older ones as it
    runs. ``skip_router`` off routes commands through the router like any other request: the
    reference that the bypass (``command_dispatch``) is tested against."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with bus.repository.store:
            pruning = None if command_id_retention_s is None else asyncio.create_task(
                _forget_old_command_results(bus.repository.store, command_id_retention_s))
            try:
                yield
            finally:
                if pruning is not None:
                    pruning.cancel()
                    with suppress(asyncio.CancelledError):
                        await pruning

    # FastAPI's native OpenTelemetry looks its providers up again on every request (3% of a
    # command's server time, docs/benchmarks.md); the API has Prometheus metrics and
    # correlation ids in its logs instead.
    app = FastAPI(title=title, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    specs = list(bus.registry)
    document_commands(app, specs, secured=api_token is not None)
    check_token = token_check(api_token)
    endpoints = {command_path(spec.command): _command_endpoint(bus, spec.command, check_token,
                                                               command_id_retention_s)
                 for spec in specs}
    authorize = bearer_auth(api_token)
    if not skip_router:
        app.router.routes.extend(Route(path, endpoint, methods=["POST"])
                                 for path, endpoint in endpoints.items())

    @app.post("/commands/{name}", status_code=404, include_in_schema=False,
              dependencies=[Depends(authorize)])
    def unknown_command(name: str) -> JSONResponse:
        try:
            bus.registry.get(name)
        except LookupError as exc:
            return JSONResponse(status_code=404, content={"detail": str(exc)})
        raise AssertionError("the bypass answers registered commands before the router")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, str]:
        await bus.repository.store.ping()
        return {"status": "ready"}

    add_error_handlers(app)
    if skip_router:
        # Inside the body limit and any middleware added later.
        app.add_middleware(RouterBypass, match=command_dispatch(endpoints),
                           handlers=app.exception_handlers)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    return app


async def _forget_old_command_results(store: AsyncEventStore, retention_s: float) -> None:
    """Every few minutes (more often for a short retention), until cancelled."""
    every_s = min(PRUNE_EVERY_S, max(retention_s / 2, 0.5))
    while True:
        await asyncio.sleep(every_s)
        try:
            pruned = await store.prune_command_results(retention_s)
        except (StoreUnavailable, psycopg.Error) as exc:
            log.warning("forgetting old command results: %s", first_line(exc))
            continue
        if pruned:
            log.info("forgot the results of %d command(s) older than %s s; their ids would "
                     "append again", pruned, f"{retention_s:,.0f}")


def kept_until(retention_s: float) -> str:
    """When a command id given now stops returning its first result (at the earliest)."""
    until = datetime.now(UTC) + timedelta(seconds=retention_s)
    return until.isoformat(timespec="seconds").replace("+00:00", "Z")


def token_check(api_token: str | None) -> Callable[[str | None], None]:
    """Checks a bearer token: it must be ``api_token`` when one is set, anything goes when not.
    Raises a 401 HTTPException."""

    def check(token: str | None) -> None:
        if api_token is None:
            return
        if token is None or not secrets.compare_digest(token.encode(), api_token.encode()):
            raise HTTPException(401, "missing or invalid bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def header_check(api_token: str | None) -> Callable[[str | None], None]:
    """Checks an Authorization header as ``bearer_auth`` does (for code that reads headers
    itself). Raises a 401 HTTPException."""
    check = token_check(api_token)

    def authorize(authorization: str | None) -> None:
        check(bearer_token(authorization))

    return authorize


def bearer_auth(api_token: str | None) -> Callable[..., Awaitable[None]]:
    """A dependency that requires ``Authorization: Bearer <api_token>`` when one is set."""
    scheme = HTTPBearer(auto_error=False)  # parses the header and documents the scheme
    check = token_check(api_token)

    async def authorize(  # async: a sync dependency costs a thread hop per request
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(scheme)],
    ) -> None:
        check(None if credentials is None else credentials.credentials)

    return authorize


Endpoint = Callable[[Request], Awaitable[Response]]


def _command_endpoint(bus: AsyncCommandBus, command_model: type[Command],
                      check_token: Callable[[str | None], None],
                      command_id_retention_s: float | None) -> Endpoint:
    async def execute(request: Request) -> Response:
        check_token(bearer_token(request.headers.get("authorization")))
        command = parse_command(command_model, await request.body())
        headers = CommandHeaders.of(request.headers)
        if headers.idempotency_key is not None and command.command_id is None:
            command = command.model_copy(update={"command_id": headers.idempotency_key})
        result = await bus.execute(command, metadata=headers.metadata,
                                   correlation_id=headers.correlation_id)
        appended = bool(result.event_ids) and not result.replayed
        response = Response(result.model_dump_json(), status_code=201 if appended else 200,
                            media_type="application/json")
        if appended and command.command_id is not None and command_id_retention_s is not None:
            response.headers[KEPT_UNTIL_HEADER] = kept_until(command_id_retention_s)
        return response

    return execute


def command_dispatch(endpoints: Mapping[str, Endpoint]) -> Match:
    """The command a request posts, if it is one of ``endpoints`` (``RouterBypass``: a
    command request is the API's hot path, and the router was a large share of it,
    docs/benchmarks.md "Commands bypass FastAPI and skip the router"; the body limit still
    wraps it)."""
    # What the router would put in the scope: middleware outside (metrics) reads its path.
    routes = {path: Route(path, endpoint, methods=["POST"])
              for path, endpoint in endpoints.items()}

    def match(scope: Scope) -> tuple[Route, dict[str, str]] | None:
        if scope.get("method") != "POST":
            return None
        route = routes.get(get_route_path(scope))
        return None if route is None else (route, {})

    return match


def parse_command(model: type[Command], body: bytes) -> Command:
    """The command in ``body`` (JSON), its types read as JSON Schema reads them (what the
    OpenAPI document promises): a number is never true or "5", and 5.0 is an integer. A 422
    with one error per field otherwise."""
    try:
        return model.model_validate_json(body, strict=True)
    except ValidationError as exc:
        if not all(_integral_float(error) for error in exc.errors()):
            raise _invalid(exc) from None
    try:
        # lax reads 5.0 as 5, all else having been valid; the integer it reads may still
        # break a bound (-0.0 is 0, and not > 0)
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(error: ValidationError) -> RequestValidationError:
    """A 422 with one error per field of the body."""
    return RequestValidationError([{**details, "loc": ("body", *details["loc"])}
                                   for details in error.errors(include_url=False,
                                                               include_input=False)])


def _integral_float(error: ErrorDetails) -> bool:
    """An integer field given a number with no fraction, which JSON Schema calls an integer."""
    value = error.get("input")
    return error["type"] == "int_type" and isinstance(value, float) and value.is_integer()


@dataclass(frozen=True)
class CommandHeaders:
    """What a command request may say besides its body."""

    idempotency_key: uuid.UUID | None
    correlation_id: str | None
    metadata: dict[str, Any]

    @classmethod
    def of(cls, headers: Headers) -> "CommandHeaders":
        errors: list[dict[str, Any]] = []

        def invalid(name: str, message: str, kind: str) -> None:
            errors.append({"loc": ("header", name), "msg": message, "type": kind})

        idempotency_key = None
        if (raw_key := headers.get("idempotency-key")) is not None:
            try:
                idempotency_key = uuid.UUID(raw_key)
            except ValueError:
                invalid("idempotency-key", "Input should be a valid UUID", "uuid_parsing")
        correlation_id = headers.get("x-correlation-id")
        if correlation_id is not None and len(correlation_id) > MAX_CORRELATION_ID:
            invalid("x-correlation-id", f"String should have at most {MAX_CORRELATION_ID} "
                    "characters", "string_too_long")
        elif correlation_id is not None and (problem := text_problem(correlation_id)):
            invalid("x-correlation-id", f"X-Correlation-ID {problem}", "storable")
        metadata, problem = _parse_metadata(headers.get("x-metadata"))
        if problem is not None:
            invalid("x-metadata", problem, "json_object")
        if errors:
            raise RequestValidationError(errors)
        return cls(idempotency_key, correlation_id, metadata or {})


def _parse_metadata(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """The X-Metadata header's object ({} without one), or why it is refused."""
    if raw is None:
        return {}, None
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return {}, "X-Metadata must be a JSON object"
    if not isinstance(parsed, dict):
        return {}, "X-Metadata must be a JSON object"
    if (problem := storable_problem(parsed)) is not None:
        return {}, f"X-Metadata: {problem}"
    return parsed, None


def _field_error(err: Mapping[str, Any]) -> dict[str, str]:
    if err["type"] == "json_invalid":
        return {"field": "body", "message": "invalid JSON: "
                f"{err.get('ctx', {}).get('error', err['msg'])}", "type": "json_invalid"}
    field = ".".join(str(part) for part in err["loc"][1:]) or str(err["loc"][0])
    return {"field": field, "message": err["msg"], "type": err["type"]}


def add_error_handlers(app: FastAPI) -> None:
    def json_error(status: int, **content: Any) -> JSONResponse:
        return JSONResponse(status_code=status, content=content)

    @app.exception_handler(RequestValidationError)
    async def invalid_payload(_: Request, exc: RequestValidationError) -> JSONResponse:
        return json_error(422, detail="invalid command",
                          errors=[_field_error(err) for err in exc.errors()])

    @app.exception_handler(ConcurrencyError)
    async def conflict(_: Request, exc: ConcurrencyError) -> JSONResponse:
        return json_error(409, detail=str(exc), stream_id=exc.stream_id,
                          expected_version=exc.expected_version,
                          current_version=exc.current_version)

    @app.exception_handler(StreamOwnedByAnotherType)
    async def owned(_: Request, exc: StreamOwnedByAnotherType) -> JSONResponse:
        return json_error(409, detail=str(exc), stream_id=exc.stream_id, owner=exc.owner)

    @app.exception_handler(CommandIdReused)
    async def reused(_: Request, exc: CommandIdReused) -> JSONResponse:
        # 409: the key is bound to the request that used it first, state the server holds
        # (the IETF idempotency-key draft answers 422; a request that is well formed by the
        # spec gets a 4xx only for state it could not know).
        return json_error(409, detail=str(exc), command_id=str(exc.command_id))

    @app.exception_handler(StreamNotFound)
    async def not_found(_: Request, exc: StreamNotFound) -> JSONResponse:
        return json_error(404, detail=str(exc))

    @app.exception_handler(DomainError)
    async def refused(_: Request, exc: DomainError) -> JSONResponse:
        # 409, not 422: the request was well formed, and the aggregate refused it in its
        # current state (RFC 9110's "conflict with the current state of the target
        # resource"), which no schema can express.
        return json_error(409, detail=str(exc), refused_by="aggregate")

    @app.exception_handler(StoreUnavailable)
    async def unavailable(_: Request, exc: StoreUnavailable) -> JSONResponse:
        log.warning("503: %s", exc)
        response = json_error(503, detail=f"{exc}; nothing was written, retry later")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return json_error(500, detail="internal error; see the server log")


class BodySizeLimit:
    """Answer 413 to a body over ``max_bytes``, by Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                # FastAPI passes HTTPExceptions raised while reading the body through as is.
                raise HTTPException(413, f"request body over {self.max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)

    async def _too_large(self, send: Callable[[Message], Awaitable[None]]) -> None:
        body = json.dumps({"detail": f"request body over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
