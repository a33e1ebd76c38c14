"""The HTTP read API: read model rows by key and in pages, KTable values by key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query
from sqlalchemy import Engine, text

from projections import Projection
from projections.catalog import VERSIONS_TABLE
from read_api.ktables import KTableView
from read_api.read_models import MAX_PAGE_SIZE, ReadModelQueries


def create_read_app(
    projections: Iterable[Projection], engine: Engine, bootstrap_servers: str,
    title: str = "Eventfold read API", dependencies: Sequence[Any] = (),
) -> FastAPI:
    """``dependencies`` apply to every data route (the composition root passes auth here)."""
    by_name = {p.name: p for p in projections if p.has_state}
    queries = {name: ReadModelQueries(engine, p) for name, p in by_name.items()}
    ktables = {name: KTableView(bootstrap_servers, active_ktable_topic(engine, p))
               for name, p in by_name.items()}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for view in ktables.values():
            view.start()
        yield
        for view in ktables.values():
            view.stop()

    app = FastAPI(title=title, lifespan=lifespan)
    data = APIRouter(dependencies=list(dependencies))

    def read_model(name: str) -> ReadModelQueries:
        if name not in queries:
            raise HTTPException(404, f"unknown read model {name!r}; known: {sorted(queries)}")
        return queries[name]

    @data.get("/read-models")
    def list_read_models() -> list[dict[str, Any]]:
        return [{"name": p.name, "key": "key", "columns": {
            c: str(t) for c, t in p.columns.items()}, "ktable": p.ktable_topic}
            for p in by_name.values()]

    @data.get("/read-models/{name}/rows/{key}")
    def get_row(name: str, key: str) -> dict[str, Any]:
        row = read_model(name).get(key)
        if row is None:
            raise HTTPException(404, f"no row with key {key!r} in {name}")
        return row

    @data.get("/read-models/{name}/rows")
    def list_rows(
        name: str, after: str | None = None,
        limit: int = Query(default=50, ge=1, le=MAX_PAGE_SIZE),
    ) -> dict[str, Any]:
        rows = read_model(name).page(after, limit)
        return {"rows": rows, "next_after": rows[-1]["key"] if len(rows) == limit else None}

    @data.get("/ktables/{name}/{key}")
    def get_ktable_value(name: str, key: str) -> dict[str, Any]:
        if name not in ktables:
            raise HTTPException(404, f"unknown KTable {name!r}; known: {sorted(ktables)}")
        view = ktables[name]
        if not view.restored:
            raise HTTPException(503, f"KTable {name} is still restoring; retry shortly")
        entry = view.get(key)
        if entry is None:
            raise HTTPException(404, f"no value for key {key!r} in KTable {name}")
        return {"key": key, "value": entry.value, "version": entry.version}

    app.include_router(data)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    def ready() -> dict[str, Any]:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        restoring = [n for n, v in ktables.items() if not v.restored]
        if restoring:
            raise HTTPException(503, f"restoring KTables: {restoring}")
        return {"status": "ready"}

    return app


def active_ktable_topic(engine: Engine, projection: Projection) -> str:
    """The KTable topic of the version that serves reads (a replay writes a new one)."""
    with engine.connect() as conn:
        version = conn.execute(text(
            f"SELECT active_version FROM {VERSIONS_TABLE} WHERE projection = :name"),
            {"name": projection.name}).scalar()
    return projection.ktable_topic_for(version or 1)
