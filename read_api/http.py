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
import gc
import logging
import os
import pathlib
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from psycopg_pool import PoolTimeout

from eventfold.contract.asgi import RouterBypass
from eventfold.outbox.connection import KafkaConnection
from eventfold.projections import Projection
from eventfold.read_api.commits import CommitNotifications
from eventfold.read_api.freshness import FreshnessMonitor
from eventfold.read_api.ktable_routes import ktable_gets, ktable_routes
from eventfold.read_api.ktables import KTableHost
from eventfold.read_api.metrics import KTABLES
from eventfold.read_api.params import (
    READ_YOUR_WRITES_DOC,
    VersionNotReached,
    checked_text,
    int_param,
    json_response,
    known_names,
    only_params,
    query_params,
    unavailable,
    wait_deadline,
    wait_until,
)
from eventfold.read_api.presence import ReaderPresence
from eventfold.read_api.query import (
    MAX_PAGE_SIZE,
    parse_filters,
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
from eventfold.read_api.schema import QueryError
from eventfold.read_api.state import StoreConfig
from eventfold.read_api.state.forwarding import READ_TIMEOUT_S
from eventfold.read_api.state.membership import Membership, Report, TopicReport
from eventfold.read_api.state.queries import (
    KTableQueries,
    Unavailable,
    UnknownTable,
)
from eventfold.read_api.state.routing import DEFAULT_ACCEPTABLE_LAG, Router
from eventfold.read_api.state.stores import scratch_store_config
from eventfold.read_api.workers import WorkerLead

log = logging.getLogger(__name__)

_YOUNG_OBJECTS_BEFORE_A_COLLECTION = 10_000


@dataclass(frozen=True)
class ReadApiOptions:
    database_url: str
    kafka: KafkaConnection
    reader_role: str = "eventfold_reader"
    instance_id: str = ""
    pool_size: int = 10
    read_statement_timeout_ms: int = 5_000
    read_count_timeout_ms: int = 200
    read_exact_count_max_rows: int | None = None
    """Counts whose estimate is above this answer the estimate at once (None: always try)."""
    title: str = "Eventfold read API"
    ktable_store: StoreConfig = field(default_factory=scratch_store_config)
    advertised_url: str = ""
    """Where the other instances reach this one; empty: it is alone, and holds every KTable
    partition."""
    ktable_standby_replicas: int = 1
    workers_dir: pathlib.Path | None = None
    """The directory this instance's HTTP workers share (``read_api.workers``); None: one
    worker."""
    ktable_acceptable_lag: int = DEFAULT_ACCEPTABLE_LAG
    """How far behind (records) an instance may be and still become a partition's active
    host, as Kafka Streams' ``acceptable.recovery.lag``."""
    read_forward_timeout_s: float = READ_TIMEOUT_S
    """How long a read forwarded to another instance may take (beyond a version it waits for)
    before the read goes to another replica."""
    skip_router: bool = True
    """KTable gets go past the router (``ktable_gets``); off: through it, as the reference
    the bypass is tested against."""


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
                       options.read_statement_timeout_ms)
    lead = WorkerLead(options.workers_dir)
    monitor = FreshnessMonitor(stateful, options.database_url, options.kafka,
                               options.reader_role, lead=lead)
    read_models = {p.name: ReadModel(pool, p, options.read_count_timeout_ms,
                                     options.read_exact_count_max_rows) for p in stateful}
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
    routing = Router(membership, options.ktable_standby_replicas, options.ktable_acceptable_lag,
                     options.read_forward_timeout_s)
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
        # pages merged in C").
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
        return unavailable(f"read model {name} has no table yet: its projection has never "
                            f"run (start it with `eventfold projection run {name}`)")

    @app.exception_handler(psycopg.errors.QueryCanceled)
    async def too_slow(_: Request, exc: psycopg.Error) -> Response:
        log.warning("503: a read query ran past the statement timeout: %s", exc)
        return unavailable(f"the query ran past the read statement timeout "
                           f"({options.read_statement_timeout_ms} ms): narrow its filters, or "
                           "sort by an indexed field")

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(PoolTimeout)
    async def database_down(_: Request, exc: Exception) -> Response:
        log.warning("503: database unavailable: %s", exc)
        return unavailable("the database is unavailable; retry shortly")

    @app.exception_handler(VersionNotReached)
    async def not_reached(_: Request, exc: VersionNotReached) -> Response:
        return json_response({"detail": str(exc), "min_version": exc.wanted,
                              "current_version": exc.current}, 504)

    @app.exception_handler(Unavailable)
    async def not_yet(_: Request, exc: Unavailable) -> Response:
        return unavailable(str(exc))

    @app.exception_handler(UnknownTable)
    async def no_such_table(_: Request, exc: UnknownTable) -> Response:
        return json_response({"detail": str(exc)}, 404)

    data = APIRouter(dependencies=[*auth, Depends(checked_text)],
                     responses={**BAD_QUERY, **(UNAUTHORIZED if auth else {})})
    _discovery_routes(data, read_models, monitor)
    for read_model in read_models.values():
        _read_model_routes(data, read_model, monitor, commits)
    get_entry = ktable_routes(data, read_models, queries)
    if options.skip_router and (not auth or authorize is not None):
        app.add_middleware(RouterBypass, handlers=app.exception_handlers,
                           match=ktable_gets(get_entry, frozenset(read_models), authorize))
    _unknown_read_model_route(data, read_models)
    app.include_router(data)
    _health_routes(app, pool, hosts, monitor)
    return app


def _discovery_routes(router: APIRouter, read_models: dict[str, ReadModel],
                      monitor: FreshnessMonitor) -> None:
    names = known_names(read_models)

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
        only_params(request, ("min_version", "stream", "wait_ms"))
        min_version = int_param(request, "min_version", None, 1, 2**62)
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

            await wait_until(applied, min_version, wait_deadline(request),
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
        query = parse_list_query(schema, query_params(request))
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
        counted = await read_model.count(parse_filters(schema, query_params(request)))
        return json_response({**counted.as_json(), "freshness": freshness()})


def _unknown_read_model_route(router: APIRouter, read_models: dict[str, ReadModel]) -> None:
    @router.get("/read-models/{name}/{rest:path}", include_in_schema=False)
    async def unknown(name: str, rest: str) -> Response:
        if name in read_models:
            raise HTTPException(404, f"no endpoint {rest!r} on read model {name}; use rows, "
                                     "rows/{key} or count")
        raise HTTPException(404, f"unknown read model {name!r}; known: {sorted(read_models)}")


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
