"""The HTTP read API: SQL read models and interactive queries over KTables.

    GET /read-models                          every read model: fields, types, what sorts
    GET /read-models/{name}/rows/{key}        one row   (?min_version=N[&stream=ID]&wait_ms=)
    GET /read-models/{name}/rows              a page    (filters, fields, sort, limit, cursor)
    GET /read-models/{name}/count             how many rows match the filters
    GET /ktables                              which KTables this instance serves, lag, restore
    GET /ktables/{name}/entries/{key}         one value (?min_version=N&wait_ms=)
    GET /ktables/{name}/entries               key range / all (?from=&to=&after=&limit=), or
                                              every entry as NDJSON (?format=ndjson)
    GET /ktables/{name}/count                 key count
    GET /ktables/{name}/metadata              instances, their active and standby partitions
    GET /ktables/{name}/keys/{key}/metadata   a key's partition, active host and standbys

Instances with an advertised URL divide each KTable's partitions among themselves; any of
them answers any KTable request, forwarding or gathering it (``read_api.state.routing``).

Every data response carries ``freshness``. Read-your-writes: ``min_version`` waits (at most
``wait_ms``) until the projection has applied that version of the stream, else 504 with the
current version. The query grammar is in ``read_api.query``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import pathlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
import psycopg
from eventfold.outbox.connection import KafkaConnection
from eventfold.projections import Projection
from eventfold.read_api.commits import CommitNotifications
from eventfold.read_api.freshness import FreshnessMonitor
from eventfold.read_api.ktables import KTableHost
from eventfold.read_api.metrics import KTABLES, READ_YOUR_WRITES
from eventfold.read_api.presence import ReaderPresence
from eventfold.read_api.query import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    parse_filters,
    parse_limit,
    parse_list_query,
)
from eventfold.read_api.read_models import ReadModel, reader_pool
from eventfold.read_api.responses import (
    BAD_QUERY,
    FRESHNESS,
    NOT_REACHED,
    UNAUTHORIZED,
    UNAVAILABLE,
    error,
    not_found,
)
from eventfold.read_api.schema import QueryError, check_text
from eventfold.read_api.state import StoreConfig
from eventfold.read_api.state.membership import Membership, Report, TopicReport
from eventfold.read_api.state.queries import (
    GATHER_PAGE,
    Caller,
    Forwarded,
    KTableQueries,
    Unavailable,
    UnknownTable,
)
from eventfold.read_api.state.routing import DEFAULT_ACCEPTABLE_LAG, Router
from eventfold.read_api.state.stores import IN_MEMORY
from eventfold.read_api.workers import WorkerLead
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Request
from fastapi.responses import Response, StreamingResponse
from psycopg_pool import PoolTimeout
from starlette._utils import get_route_path
from starlette.routing import Route
from starlette.types import Scope

from eventfold.contract.asgi import Match, RouterBypass

log = logging.getLogger(__name__)

DEFAULT_WAIT_MS = 5_000
MAX_WAIT_MS = 30_000
_POLL_S = 0.02
_YOUNG_OBJECTS_BEFORE_A_COLLECTION = 10_000
_NOTIFIED_POLL_S = 1.0  # notified of commits: a look now and then, in case one was missed
READ_YOUR_WRITES_DOC = (
    f"Read-your-writes: `min_version=N` (the `version` the command API returned) waits up to "
    f"`wait_ms` (default {DEFAULT_WAIT_MS}, at most {MAX_WAIT_MS}) until the projection has "
    "applied version N of the stream, else answers 504; a read model re-keyed with `key_by` "
    "also takes `stream=<the aggregate id the command wrote to>`.")


@dataclass(frozen=True)
class ReadApiOptions:
    database_url: str
    kafka: KafkaConnection
    reader_role: str = "eventfold_reader"
    instance_id: str = ""
    pool_size: int = 10
    statement_timeout_ms: int = 5_000
    count_timeout_ms: int = 200
    exact_count_max_rows: int | None = None
    """Counts whose estimate is above this answer the estimate at once (None: always try)."""
    title: str = "Eventfold read API"
    ktable_store: StoreConfig = IN_MEMORY
    advertised_url: str = ""
    """Where the other instances reach this one; empty: it is alone, and holds every KTable
    partition."""
    standby_replicas: int = 1
    workers_dir: pathlib.Path | None = None
    """The directory this instance's HTTP workers share (``read_api.workers``); None: one
    worker."""
    acceptable_lag: int = DEFAULT_ACCEPTABLE_LAG
    """How far behind (records) an instance may be and still become a partition's active
    host, as Kafka Streams' ``acceptable.recovery.lag``."""
    skip_router: bool = True
    """KTable gets go past the router (``ktable_gets``); off: through it, as the reference
    the bypass is tested against."""


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body, default=_json_default), status_code=status,
                    media_type="application/json")


def _query_params(request: Request) -> list[tuple[str, str]]:
    return list(request.query_params.multi_items())


def _int_param(request: Request, name: str, default: int | None, low: int, high: int
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


async def _checked_text(request: Request) -> None:
    """Every path and query parameter must be text a stored value could hold: a 400 naming
    the parameter, never a database error."""
    for name, value in request.path_params.items():
        check_text(value, name)
    for name, value in request.query_params.multi_items():
        check_text(name, "parameter name")
        check_text(value, name)


def _only(request: Request, allowed: Iterable[str]) -> None:
    known = set(allowed)
    for name in request.query_params:
        if name not in known:
            raise QueryError(f"{name}: unknown parameter; this endpoint takes "
                             f"{', '.join(sorted(known)) or 'none'}")


def _wait_deadline(request: Request) -> float:
    wait_ms = _int_param(request, "wait_ms", DEFAULT_WAIT_MS, 0, MAX_WAIT_MS) or 0
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


def create_read_app(projections: Iterable[Projection], options: ReadApiOptions,
                    auth: Sequence[Any] = (),
                    authorize: Callable[[str | None], None] | None = None) -> FastAPI:
    """``auth``: dependencies that check credentials on every data route (the composition
    root passes the bearer token check here when a token is configured; then, and only then,
    the spec declares the security scheme and 401 on those routes). ``authorize``: the same
    check, on a request's Authorization header, for the KTable gets that skip the router
    (``ktable_gets``); with ``auth`` and without it, they take the router's way."""
    stateful = [p for p in projections if p.has_state]
    instance_id = options.instance_id or f"{socket.gethostname()}:{os.getpid()}"
    pool = reader_pool(options.database_url, options.reader_role, options.pool_size,
                       options.statement_timeout_ms)
    lead = WorkerLead(options.workers_dir)
    monitor = FreshnessMonitor(stateful, options.database_url, options.kafka,
                               options.reader_role, lead=lead)
    read_models = {p.name: ReadModel(pool, p, options.count_timeout_ms,
                                     options.exact_count_max_rows) for p in stateful}
    presence = ReaderPresence(options.database_url, options.reader_role, instance_id, lead)
    commits = CommitNotifications(options.database_url)
    hosts: dict[str, KTableHost] = {}

    def report() -> Report:
        return {view.topic: TopicReport(view.partition_lags(), view.held_partitions,
                                        view.stored_partitions())
                for host in list(hosts.values()) for view in host.views()}

    def rebalance(members: Any) -> None:
        for host in list(hosts.values()):
            host.rebalance(members)

    membership = Membership(options.advertised_url, report, options.database_url,
                            options.reader_role, lead)
    membership.on_change(rebalance)
    routing = Router(membership, options.standby_replicas, options.acceptable_lag)
    queries = KTableQueries(hosts, routing, instance_id, list(read_models))

    def follow_version(name: str, version: int) -> None:
        host = hosts.get(name)
        if host is not None:
            host.follow(version)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.open()
        await commits.start()
        monitor.on_version(follow_version)
        monitor.start()
        await asyncio.to_thread(monitor.wait_first_poll, 10)
        # Everything built so far lives as long as the process: keep the cyclic collector
        # from walking it again and again while a restore allocates (and during requests).
        # A request allocates hundreds of containers that reference counting frees; the
        # default threshold (700) collected every few requests (docs/benchmarks.md, "Range
        # pages merged in C, rows cached, fewer collections").
        gc.freeze()
        gc.set_threshold(_YOUNG_OBJECTS_BEFORE_A_COLLECTION)
        presence.start()
        for p in stateful:
            version = monitor.active_version(p.name) or 1
            hosts[p.name] = KTableHost(options.kafka, p.name, p.ktable_topic_for, version,
                                       presence, options.ktable_store, routing,
                                       monitor.partition_history).start()
        membership.start()
        KTABLES.watch(instance_id, lambda: hosts)
        log.info("read API %s serving %d read models and KTables", instance_id, len(stateful))
        try:
            yield
        finally:
            KTABLES.forget(instance_id)
            await commits.stop()
            monitor.stop()
            membership.stop()
            await routing.close()
            for host in hosts.values():
                host.stop()
            presence.stop()
            await pool.close()

    app = FastAPI(title=options.title, lifespan=lifespan,
                  description=__doc__.split("\n\n", 1)[1] if __doc__ else "")

    @app.exception_handler(QueryError)
    async def bad_query(_: Request, exc: QueryError) -> Response:
        return json_response({"detail": str(exc)}, 400)

    @app.exception_handler(psycopg.errors.UndefinedTable)
    async def not_built(request: Request, exc: psycopg.Error) -> Response:
        name = request.path_params.get("name") or request.url.path.split("/")[2]
        return _unavailable(f"read model {name} has no table yet: its projection has never "
                            f"run (start it with `eventfold projection run {name}`)")

    @app.exception_handler(psycopg.errors.QueryCanceled)
    async def too_slow(_: Request, exc: psycopg.Error) -> Response:
        log.warning("503: a read query ran past the statement timeout: %s", exc)
        return _unavailable(f"the query ran past the read statement timeout "
                            f"({options.statement_timeout_ms} ms): narrow its filters, or sort "
                            "by an indexed field")

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(PoolTimeout)
    async def database_down(_: Request, exc: Exception) -> Response:
        log.warning("503: database unavailable: %s", exc)
        return _unavailable("the database is unavailable; retry shortly")

    @app.exception_handler(VersionNotReached)
    async def not_reached(_: Request, exc: VersionNotReached) -> Response:
        return json_response({"detail": str(exc), "min_version": exc.wanted,
                              "current_version": exc.current}, 504)

    @app.exception_handler(Unavailable)
    async def not_yet(_: Request, exc: Unavailable) -> Response:
        return _unavailable(str(exc))

    @app.exception_handler(UnknownTable)
    async def no_such_table(_: Request, exc: UnknownTable) -> Response:
        return json_response({"detail": str(exc)}, 404)

    data = APIRouter(dependencies=[*auth, Depends(_checked_text)],
                     responses={**BAD_QUERY, **(UNAUTHORIZED if auth else {})})
    _discovery_routes(data, read_models, monitor)
    for read_model in read_models.values():
        _read_model_routes(data, read_model, monitor, commits)
    get_entry = _ktable_routes(data, read_models, queries)
    if options.skip_router and (not auth or authorize is not None):
        app.add_middleware(RouterBypass, handlers=app.exception_handlers,
                           match=ktable_gets(get_entry, frozenset(read_models), authorize))
    _unknown_read_model_route(data, read_models)
    app.include_router(data)
    _health_routes(app, pool, hosts, monitor)
    return app


def _known_names(read_models: dict[str, ReadModel]) -> Any:
    """The ``{name}`` path parameter, documented as one of the app's read models (any other
    name is answered 404)."""
    return Path(description="a read model (and KTable) of this app",
                json_schema_extra={"enum": sorted(read_models)})


def _discovery_routes(router: APIRouter, read_models: dict[str, ReadModel],
                      monitor: FreshnessMonitor) -> None:
    names = _known_names(read_models)

    @router.get("/read-models", tags=["read models"])
    async def list_read_models() -> Response:
        return json_response([{**rm.schema.describe(), "outputs": monitor.outputs(name),
                               "freshness": monitor.get(name).as_json()}
                              for name, rm in read_models.items()])

    @router.get("/read-models/{name}", tags=["read models"],
                responses=not_found("no read model of that name"))
    async def describe_read_model(name: str = names) -> Response:
        read_model = read_models.get(name)
        if read_model is None:
            raise HTTPException(404, f"unknown read model {name!r}; known: "
                                     f"{sorted(read_models)}")
        return json_response({**read_model.schema.describe(),
                              "row_schema": read_model.schema.row_json_schema(),
                              "outputs": monitor.outputs(name),
                              "freshness": monitor.get(name).as_json()})


def _read_model_routes(router: APIRouter, read_model: ReadModel,
                       monitor: FreshnessMonitor, commits: CommitNotifications) -> None:
    schema = read_model.schema
    name = schema.name
    row_schema = schema.row_json_schema()
    filterable = ", ".join(f for f, d in schema.fields.items() if d.kind.comparable)
    filters_doc = ("Filters: `field=value` or `field.OP=value` (OP: eq, ne, lt, lte, gt, gte, "
                   f"in, prefix, null) on {filterable}.")

    def freshness() -> dict[str, Any]:
        return monitor.get(name).as_json()

    @router.get(f"/read-models/{name}/rows/{{key}}", tags=[name],
                summary=f"One {name} row by key", description=READ_YOUR_WRITES_DOC,
                responses={200: {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {"row": row_schema,
                                                     "freshness": FRESHNESS}}}}},
                           **not_found("no row with that key", with_freshness=True),
                           **UNAVAILABLE, **NOT_REACHED})
    async def get_row(key: str, request: Request) -> Response:
        _only(request, ("min_version", "stream", "wait_ms"))
        min_version = _int_param(request, "min_version", None, 1, 2**62)
        if min_version is not None:
            stream = request.query_params.get("stream")
            if stream is None and not schema.keyed_by_stream:
                raise QueryError(f"min_version: {name} is keyed by "
                                 f"{read_model.projection.key_by!r}, not by stream; also pass "
                                 "stream=<the aggregate id the command wrote to>")

            async def applied() -> int | None:
                version = monitor.active_version(name)
                return None if version is None else await read_model.stream_version(
                    version, stream or key)

            await wait_until(applied, min_version, _wait_deadline(request),
                             f"{name} for stream {stream or key!r}", "read_model",
                             woken=lambda: commits.next_commit(name))
        row = await read_model.get(key)
        if row is None:
            return json_response({"detail": f"no row with key {key!r} in {name}",
                                  "freshness": freshness()}, 404)
        return json_response({"row": row, "freshness": freshness()})

    @router.get(f"/read-models/{name}/rows", tags=[name], summary=f"A page of {name} rows",
                description=filters_doc + f" Sortable: {', '.join(schema.sortable)}. "
                f"`limit` 1..{MAX_PAGE_SIZE}; pass `next_cursor` back as `cursor`.",
                responses={200: {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {
                        "rows": {"type": "array", "items": row_schema},
                        "next_cursor": {"type": ["string", "null"]},
                        "freshness": FRESHNESS}}}}}, **UNAVAILABLE})
    async def list_rows(request: Request) -> Response:
        query = parse_list_query(schema, _query_params(request))
        rows, next_cursor = await read_model.page(query)
        return json_response({"rows": rows, "next_cursor": next_cursor,
                              "freshness": freshness()})

    @router.get(f"/read-models/{name}/count", tags=[name], summary=f"Count {name} rows",
                description=filters_doc + " Without filters, exact (the projection keeps the "
                "count as it writes). With filters, counted exactly when that is quick, else "
                "the planner's estimate, with `exact: false` and `estimated_from`: when the "
                "statistics it rests on were taken, and how many rows were written since.",
                responses={200: {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {
                        "count": {"type": "integer"}, "exact": {"type": "boolean"},
                        "estimated_from": {"type": "object", "properties": {
                            "statistics_taken_at": {"type": ["string", "null"]},
                            "rows_written_since": {"type": "integer"}}},
                        "freshness": FRESHNESS}}}}}, **UNAVAILABLE})
    async def count_rows(request: Request) -> Response:
        counted = await read_model.count(parse_filters(schema, _query_params(request)))
        return json_response({**counted.as_json(), "freshness": freshness()})


def _unknown_read_model_route(router: APIRouter, read_models: dict[str, ReadModel]) -> None:
    @router.get("/read-models/{name}/{rest:path}", include_in_schema=False)
    async def unknown(name: str, rest: str) -> Response:
        if name in read_models:
            raise HTTPException(404, f"no endpoint {rest!r} on read model {name}; use rows, "
                                     "rows/{key} or count")
        raise HTTPException(404, f"unknown read model {name!r}; known: {sorted(read_models)}")


def _ktable_routes(router: APIRouter, read_models: dict[str, ReadModel],
                   queries: KTableQueries) -> Callable[..., Awaitable[Response]]:
    """The KTable routes on ``router``, over ``queries``; returns the get-by-key endpoint
    (``KTableGets``)."""
    names = _known_names(read_models)

    def caller(request: Request) -> Caller:
        authorization = request.headers.get("authorization")
        if not request.scope["query_string"]:  # the common get: no parameter to read
            return Caller(authorization)
        params = request.query_params
        local = params.get("local") == "true"
        min_version = _int_param(request, "min_version", None, 1, 2**62)
        return Caller(
            authorization=authorization, local=local,
            version=_int_param(request, "version", None, 1, 2**31) if local else None,
            partitions=_partitions(params.get("partitions", "")) if local else (),
            partition=(_int_param(request, "partition", None, 0, 2**31) if local else None),
            min_version=min_version,
            wait_ms=(_int_param(request, "wait_ms", DEFAULT_WAIT_MS, 0, MAX_WAIT_MS)
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
        _only(request, ("min_version", "wait_ms", "local", "version", "partition"))
        asked = caller(request)
        wait = None
        if asked.min_version is not None:
            if not read_models[name].schema.keyed_by_stream:
                raise QueryError(f"min_version: KTable {name} is keyed by "
                                 f"{read_models[name].projection.key_by!r}, not by stream; "
                                 "use the read model with stream=")
            wanted, deadline = asked.min_version, _wait_deadline(request)

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
        _only(request, ("from", "to", "after", "limit", "format", "local", "partitions",
                        "version"))
        params = request.query_params
        start, end, after = params.get("from"), params.get("to"), params.get("after")
        output = params.get("format", "json")
        if output not in ("json", "ndjson"):
            raise QueryError(f"format: {output!r}; use json or ndjson")
        asked = caller(request)
        if asked.local:  # one instance's part of a gathered range
            limit = _int_param(request, "limit", DEFAULT_PAGE_SIZE, 1, GATHER_PAGE + 1) or 1
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
        _only(request, ("local", "partitions", "version"))
        return json_response(await queries.count(name, caller(request)))

    return get_entry


async def _ndjson(chunks: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield b"".join(orjson.dumps(entry, default=_json_default) + b"\n" for entry in chunk)


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
        await _checked_text(request)
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


def _unavailable(detail: str) -> Response:
    response = json_response({"detail": detail}, 503)
    response.headers["Retry-After"] = "1"
    return response


def _health_routes(app: FastAPI, pool: Any, hosts: dict[str, KTableHost],
                   monitor: FreshnessMonitor) -> None:
    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"], responses={503: error(
        "not ready: the database is unreachable, a projection has never run, or a KTable is "
        "restoring", status={"type": "string"})})
    async def ready() -> Response:
        try:
            async with pool.connection(timeout=5) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:
            return json_response({"status": "database unavailable", "detail": str(exc)}, 503)
        never_ran = [name for name in hosts if monitor.get(name).version is None]
        if never_ran:
            return json_response({"status": "waiting for projections", "detail": (
                f"no read model yet for {', '.join(never_ran)}: their projections have never "
                "run")}, 503)
        restoring = {name: host.view.progress.as_json() for name, host in hosts.items()
                     if not host.view.restored}
        if restoring:
            return json_response({"status": "restoring", "ktables": restoring}, 503)
        return json_response({"status": "ready"})
