"""The command API's OpenAPI document: the commands' request and result schemas, what each
status code means, the headers a command reads. FastAPI does not see the command routes
(``http.command_dispatch`` calls them ahead of its router), so they are added to its document
here, with schemas that say what the command API checks where a schema can."""

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import (
    GenerateJsonSchema,
    JsonSchemaMode,
    JsonSchemaValue,
    models_json_schema,
)
from pydantic_core import core_schema

from eventfold.write_model.commands import Command, CommandResult, HandlerSpec
from eventfold.write_model.domain.values import (
    MAX_DEPTH,
    MAX_INTEGER,
    MIN_INTEGER,
    STORABLE_TEXT_PATTERN,
    storable_json_schema,
)

KEPT_UNTIL_HEADER = "Command-Id-Kept-Until"


def command_path(command: type[Command]) -> str:
    return f"/commands/{command.command_name}"


MAX_CORRELATION_ID = 200
STORABLE_JSON = "StorableJson"
HEADER_PARAMETERS: list[dict[str, Any]] = [
    {"name": "Idempotency-Key", "in": "header", "required": False,
     "description": "Same as command_id in the body.",
     "schema": {"type": "string", "format": "uuid"}},
    {"name": "X-Correlation-ID", "in": "header", "required": False,
     "description": "Stored with every event; defaults to the command id.",
     "schema": {"type": "string", "maxLength": MAX_CORRELATION_ID}},
    {"name": "X-Metadata", "in": "header", "required": False,
     "description": "A JSON object stored with every event (e.g. the acting user): no NUL "
                    f"character, at most {MAX_DEPTH} levels of nesting.",
     "content": {"application/json": {"schema": {
         "type": "object", "propertyNames": {"pattern": STORABLE_TEXT_PATTERN},
         "additionalProperties": {"$ref": f"#/components/schemas/{STORABLE_JSON}"}}}}},
]


class StorableSchema(GenerateJsonSchema):
    """Command schemas that say what ``values.storable_problem`` checks where a schema can:
    text holds no NUL, integers fit in 64 bits (a request the spec allows is then never
    refused for them)."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        generated = super().int_schema(schema)
        for bound, limit, tighter in (("minimum", MIN_INTEGER, max),
                                      ("maximum", MAX_INTEGER, min)):
            generated[bound] = tighter(generated.get(bound, limit), limit)
        return generated

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        generated = super().str_schema(schema)
        if "pattern" in generated:
            generated["allOf"] = [{"pattern": STORABLE_TEXT_PATTERN}]
        else:
            generated["pattern"] = STORABLE_TEXT_PATTERN
        return generated


def _error(description: str, **properties: dict[str, Any]) -> dict[str, Any]:
    """A response whose JSON body is ``{"detail": ...}`` plus ``properties``."""
    return {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "required": ["detail"],
        "properties": {"detail": {"type": "string"}, **properties}}}}}


_FIELD_ERRORS = {"type": "array", "items": {"type": "object", "properties": {
    "field": {"type": "string"}, "message": {"type": "string"}, "type": {"type": "string"}}}}
RESPONSES: dict[str, dict[str, Any]] = {
    "404": _error("the command needs an existing stream and there is none"),
    "409": _error("nothing was written, because of state the request could not know: the "
                  "stream moved past `expected_version` (`current_version` given); it belongs "
                  "to another aggregate type (`owner`); the aggregate refused the command in "
                  "its current state (a business rule, `refused_by`); or the command id "
                  "(Idempotency-Key) was used before with another payload (`command_id`)",
                  stream_id={"type": "string"},
                  expected_version={"type": ["integer", "null"]},
                  current_version={"type": ["integer", "null"]}, owner={"type": "string"},
                  refused_by={"type": "string"}, command_id={"type": "string"}),
    "413": _error("the body is over EVENTFOLD_MAX_BODY_BYTES"),
    "422": _error("nothing was written: the body is not JSON, or a field is invalid, unknown "
                  "or not storable (`errors`, one per field); or a header is malformed "
                  "(`errors` names it)", errors=_FIELD_ERRORS),
    "503": {**_error("the database is unreachable; nothing was written, retry"),
            "headers": {"Retry-After": {"description": "seconds to wait before retrying",
                                        "schema": {"type": "integer"}}}},
}
UNAUTHORIZED = {"401": {**_error("EVENTFOLD_API_TOKEN is set and the bearer token is missing "
                                 "or wrong"),
                        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}}}


def document_commands(app: FastAPI, specs: list[HandlerSpec[Any, Any]], secured: bool) -> None:
    """Adds the commands to the app's OpenAPI document. FastAPI does not see them: they are
    endpoints that the bypass (``command_dispatch``) calls ahead of the router; they parse
    their own bodies and headers.

    Why: FastAPI's per-request solving of a body model, three headers and a dependency was the
    largest cost of the HTTP layer (docs/benchmarks.md, "Commands bypass FastAPI").
    """
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (spec.command, "validation") for spec in specs]
    refs, top = models_json_schema([*models, (CommandResult, "serialization")],
                                   ref_template="#/components/schemas/{model}",
                                   schema_generator=StorableSchema)
    paths = {command_path(spec.command): {"post": _operation(
        spec, refs[(spec.command, "validation")], refs[(CommandResult, "serialization")],
        secured)} for spec in specs}
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("paths", {}).update(paths)
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(top.get("$defs", {}))
            components["schemas"][STORABLE_JSON] = storable_json_schema(
                f"#/components/schemas/{STORABLE_JSON}")
            if secured:
                components.setdefault("securitySchemes", {})["HTTPBearer"] = {
                    "type": "http", "scheme": "bearer"}
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]


def _operation(spec: HandlerSpec[Any, Any], request_schema: dict[str, Any],
               result_schema: dict[str, Any], secured: bool) -> dict[str, Any]:
    name = spec.command.command_name
    operation: dict[str, Any] = {
        "summary": f"{name} on a {spec.aggregate.stream_type}",
        "description": (spec.command.__doc__ or "").strip(),
        "operationId": f"execute_{name}",
        "parameters": HEADER_PARAMETERS,
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": request_schema}}},
        "responses": {
            "201": {"description": "events appended",
                    "headers": {KEPT_UNTIL_HEADER: {
                        "description": "with a command id: the same id returns this result "
                                       "at least until then, and appends again after it "
                                       "(EVENTFOLD_COMMAND_ID_RETENTION)",
                        "schema": {"type": "string", "format": "date-time"}}},
                    "content": {"application/json": {"schema": result_schema}}},
            "200": {"description": "the command id was executed before (its first result, "
                                   "`replayed: true`), or the command recorded nothing",
                    "content": {"application/json": {"schema": result_schema}}},
            **RESPONSES},
    }
    if secured:
        operation["security"] = [{"HTTPBearer": []}]
        operation["responses"].update(UNAUTHORIZED)
    return operation
