"""The KTable routes: a value by key, a key range (paged or NDJSON), a count, where a key or
a table's partitions are; and ``ktable_gets``, the get by key past the router, the read API's
hot path. Each answers through ``state.queries.KTableQueries``, which forwards or gathers what
another instance holds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette._utils import get_route_path
from starlette.routing import Route
from starlette.types import Scope

from eventfold.contract.asgi import Match
from eventfold.read_api.params import (
    DEFAULT_WAIT_MS,
    MAX_WAIT_MS,
    READ_YOUR_WRITES_DOC,
    checked_text,
    int_param,
    json_default,
    json_response,
    known_names,
    only_params,
    wait_deadline,
    wait_until,
)
from eventfold.read_api.query import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, parse_limit
from eventfold.read_api.read_models import ReadModel
from eventfold.read_api.responses import NOT_REACHED, UNAVAILABLE, not_found
from eventfold.read_api.schema import QueryError
from eventfold.read_api.state.queries import GATHER_PAGE, Caller, Forwarded, KTableQueries


def ktable_routes(router: APIRouter, read_models: dict[str, ReadModel],
                  queries: KTableQueries) -> Callable[..., Awaitable[Response]]:
    """The KTable routes on ``router``, over ``queries``; returns the get-by-key endpoint
    (``KTableGets``)."""
    names = known_names(read_models)

    def caller(request: Request) -> Caller:
        authorization = request.headers.get("authorization")
        if not request.scope["query_string"]:  # the common get: no parameter to read
            return Caller(authorization)
        params = request.query_params
        local = params.get("local") == "true"
        min_version = int_param(request, "min_version", None, 1, 2**62)
        return Caller(
            authorization=authorization, local=local,
            version=int_param(request, "version", None, 1, 2**31) if local else None,
            partitions=_partitions(params.get("partitions", "")) if local else (),
            partition=(int_param(request, "partition", None, 0, 2**31) if local else None),
            min_version=min_version,
            wait_ms=(int_param(request, "wait_ms", DEFAULT_WAIT_MS, 0, MAX_WAIT_MS)
                     if min_version is not None else None))

    @router.get("/ktables", tags=["ktables"], summary="KTables this instance serves")
    async def list_ktables() -> Response:
        return json_response(queries.tables())

    @router.get("/ktables/{name}/metadata", tags=["ktables"],
                summary="Which instance holds which partitions of a KTable",
                responses=not_found("no KTable of that name"))
    async def ktable_metadata(name: str = names) -> Response:
        return json_response(queries.metadata(name))

    @router.get("/ktables/{name}/keys/{key}/metadata", tags=["ktables"],
                summary="Which instance holds a key (as Kafka Streams' queryMetadataForKey)",
                responses=not_found("no KTable of that name"))
    async def key_metadata(key: str, name: str = names) -> Response:
        return json_response(queries.key_metadata(name, key))

    @router.get("/ktables/{name}/entries/{key}", tags=["ktables"], summary="One KTable value",
                description=READ_YOUR_WRITES_DOC + " Any instance answers: a key held by "
                "another is fetched from it (from a standby, marked `stale`, when its active "
                "host is down). `freshness.lag_records` is measured against the topic's end "
                "offsets (`lag_measured_at`).",
                responses={**not_found("no KTable of that name, or no value for the key"),
                           **UNAVAILABLE, **NOT_REACHED})
    async def get_entry(request: Request, key: str, name: str = names) -> Response:
        only_params(request, ("min_version", "wait_ms", "local", "version", "partition"))
        asked = caller(request)
        wait = None
        if asked.min_version is not None:
            if not read_models[name].schema.keyed_by_stream:
                raise QueryError(f"min_version: KTable {name} is keyed by "
                                 f"{read_models[name].projection.key_by!r}, not by stream; "
                                 "use the read model with stream=")
            wanted, deadline = asked.min_version, wait_deadline(request)

            async def wait(applied: Callable[[], Awaitable[int | None]]) -> None:
                await wait_until(applied, wanted, deadline, f"KTable {name} key {key!r}",
                                 "ktable")

        answer = await queries.get(name, key, asked, wait)
        if isinstance(answer, Forwarded):
            return Response(answer.body, answer.status, media_type="application/json")
        status, body = answer
        return json_response(body, status)

    @router.get("/ktables/{name}/entries", tags=["ktables"],
                summary="A key range of a KTable, paged or as NDJSON",
                description="`from` and `to` are inclusive key bounds (key order); `after` "
                f"and `limit` (1..{MAX_PAGE_SIZE}) page; `format=ndjson` streams every entry "
                "in the range, one JSON object per line. Gathered from every instance that "
                "holds a part of the table, merged in key order.",
                responses={**not_found("no KTable of that name"), **UNAVAILABLE})
    async def range_entries(request: Request, name: str = names) -> Response:
        only_params(request, ("from", "to", "after", "limit", "format", "local", "partitions",
                        "version"))
        params = request.query_params
        start, end, after = params.get("from"), params.get("to"), params.get("after")
        output = params.get("format", "json")
        if output not in ("json", "ndjson"):
            raise QueryError(f"format: {output!r}; use json or ndjson")
        asked = caller(request)
        if asked.local:  # one instance's part of a gathered range
            limit = int_param(request, "limit", DEFAULT_PAGE_SIZE, 1, GATHER_PAGE + 1) or 1
            return json_response(await queries.range(name, asked, start, end, after, limit))
        if output == "ndjson" or "application/x-ndjson" in request.headers.get("accept", ""):
            chunks = queries.export(name, asked, start, end)  # a 503 now, not a stream cut
            return StreamingResponse(_ndjson(chunks), media_type="application/x-ndjson")
        limit = parse_limit(params.get("limit"))
        return json_response(await queries.range(name, asked, start, end, after, limit))

    @router.get("/ktables/{name}/count", tags=["ktables"], summary="Key count",
                description="The keys of every partition, as each instance serving it holds "
                "them now.", responses={**not_found("no KTable of that name"), **UNAVAILABLE})
    async def count_entries(request: Request, name: str = names) -> Response:
        only_params(request, ("local", "partitions", "version"))
        return json_response(await queries.count(name, caller(request)))

    return get_entry


async def _ndjson(chunks: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield b"".join(orjson.dumps(entry, default=json_default) + b"\n" for entry in chunk)


def _partitions(raw: str) -> tuple[int, ...]:
    """A forwarded range's or count's partitions (``0,3,5``)."""
    try:
        return tuple(int(p) for p in raw.split(",") if p)
    except ValueError:
        raise QueryError(f"partitions: {raw!r} is not a list of partitions") from None


def ktable_gets(get_entry: Callable[..., Awaitable[Response]], names: frozenset[str],
                authorize: Callable[[str | None], None] | None) -> Match:
    """``GET /ktables/{name}/entries/{key}`` with no parameters but those of a forwarded
    read, for ``RouterBypass``: a KTable get is the read API's hot path, and one forwarded to
    another instance crosses two of them (docs/benchmarks.md, "KTable partitions among
    instances"). What the route's dependencies do, its endpoint here does first:
    ``authorize`` the Authorization header, check the path's text."""

    async def endpoint(request: Request, name: str, key: str) -> Response:
        if authorize is not None:
            authorize(request.headers.get("authorization"))
        await checked_text(request)
        return await get_entry(request, key=key, name=name)

    route = Route("/ktables/{name}/entries/{key}", endpoint, methods=["GET"])

    def match(scope: Scope) -> tuple[Route, dict[str, str]] | None:
        if scope.get("method") != "GET":
            return None
        parts = get_route_path(scope).split("/")
        if (len(parts) != 5 or parts[1] != "ktables" or parts[3] != "entries"
                or parts[2] not in names or not parts[4]):
            return None
        query = scope.get("query_string", b"")
        if query and not all(pair.split(b"=", 1)[0] in _FORWARD_PARAMETERS
                             for pair in query.split(b"&")):
            return None
        return route, {"name": parts[2], "key": parts[4]}

    return match


_FORWARD_PARAMETERS = frozenset({b"local", b"version", b"partition"})
