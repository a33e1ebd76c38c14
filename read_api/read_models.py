"""Queries over the projections' SQL read models (their views), as the read-only role.

Every statement is built by ``read_api.query`` from checked names and bound values; the
connection pool runs them in read-only transactions as the reader role.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from psycopg import AsyncConnection, errors, sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from eventfold.contract import libpq_url
from eventfold.projections import Projection
from eventfold.projections.state.catalog import ACTIVE_LIVE_ROWS
from eventfold.projections.state.schema import watermarks_of
from eventfold.read_api.query import (
    Filter,
    ListQuery,
    count_query,
    encode_cursor,
    get_query,
    matching_query,
    needs_a_value,
    page_query,
)
from eventfold.read_api.schema import ReadModelSchema


def reader_session(role: str, read_only: bool = True) -> list[sql.SQL | sql.Composed]:
    """What makes a session a reader's: read-only transactions (unless ``read_only`` is off,
    for the instance's own presence rows), as ``role`` when one is given (the login may
    already be that role)."""
    statements: list[sql.SQL | sql.Composed] = (
        [sql.SQL("SET default_transaction_read_only = on")] if read_only else [])
    if role:
        statements.insert(0, sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return statements


def reader_pool(database_url: str, role: str, size: int, statement_timeout_ms: int
                ) -> AsyncConnectionPool:
    """An unopened pool (open it inside the event loop) of read-only reader sessions, whose
    statements are cancelled after ``statement_timeout_ms`` (a query no index serves must
    not hold a worker and a connection for as long as it scans)."""

    async def configure(conn: AsyncConnection) -> None:
        await conn.set_autocommit(True)
        for statement in reader_session(role):
            await conn.execute(statement)
        await conn.execute(sql.SQL("SET statement_timeout = {}").format(
            sql.Literal(statement_timeout_ms)))

    return AsyncConnectionPool(libpq_url(database_url), min_size=min(2, size), max_size=size,
                               configure=configure, open=False, timeout=5.0,
                               kwargs={"row_factory": dict_row})


@dataclass(frozen=True)
class RowCount:
    count: int
    exact: bool
    estimated_from: dict[str, Any] | None = None
    """An estimate's basis: when the planner's statistics were taken, and the rows written
    to the table since (the estimate may be off by up to about that many)."""

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"count": self.count, "exact": self.exact}
        if self.estimated_from is not None:
            found["estimated_from"] = self.estimated_from
        return found


ESTIMATE_TIMEOUT_MS = 2_000
"""The statement timeout of an estimate, whatever the read statement timeout: it only plans
and reads catalog rows, and it is the answer a count falls back on when counting took too
long. Under a page's tight timeout (tens of ms), a busy database or a reader's cold session
can take longer than that to plan, and the count would fail instead of estimating."""

# The view's table (the active version's state table) as the planner sees it: its rows, as
# the planner scales its statistics to the table's size now (rows per page of the last
# statistics times the pages there are), when they were taken, and the rows written since.
_STATISTICS = """
    SELECT CASE WHEN c.relpages > 0 THEN c.reltuples / c.relpages
                * (pg_relation_size(c.oid) / current_setting('block_size')::int)
                ELSE greatest(c.reltuples, 0) END AS rows,
           greatest(s.last_analyze, s.last_autoanalyze) AS taken_at,
           s.n_mod_since_analyze AS written_since
    FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid
    JOIN pg_class c ON c.oid = d.refobjid AND c.relkind = 'r'
    JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE r.ev_class = to_regclass(%s) AND d.refobjid <> r.ev_class
    LIMIT 1
"""


@asynccontextmanager
async def _timed_out_after(conn: AsyncConnection[Any], timeout_ms: int
                           ) -> AsyncIterator[None]:
    """A transaction whose statements are cancelled after ``timeout_ms``, whatever the
    session's statement timeout; the session's own comes back when it ends."""
    async with conn.transaction():
        await conn.execute("SELECT set_config('statement_timeout', %s, true)",
                           (str(timeout_ms),))
        yield


class ReadModel:
    """One projection's read model: get, list, count, and its source streams' watermarks."""

    def __init__(self, pool: AsyncConnectionPool, projection: Projection,
                 count_timeout_ms: int, exact_count_max_rows: int | None = None) -> None:
        self.pool = pool
        self.count_timeout_ms = count_timeout_ms
        self.exact_count_max_rows = exact_count_max_rows
        self.projection = projection
        self.schema = ReadModelSchema.of(projection)
        self._get = get_query(self.schema)

    async def get(self, key: str) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(self._get, (key,), prepare=True)
            return cast(dict[str, Any] | None, await cursor.fetchone())

    async def page(self, query: ListQuery) -> tuple[list[dict[str, Any]], str | None]:
        """A page of rows and the cursor of the next page (None on the last)."""
        compiled = page_query(self.schema, query)
        async with self.pool.connection() as conn:
            cursor = await conn.execute(compiled.sql, compiled.params)
            rows = cast(list[dict[str, Any]], await cursor.fetchall())
        next_cursor = None
        if len(rows) > query.limit:
            rows = rows[:query.limit]
            next_cursor = encode_cursor(query.sort, rows[-1])
        if len(rows) and len(rows[0]) > len(query.fields):
            rows = [{name: row[name] for name in query.fields} for row in rows]
        return rows, next_cursor

    async def count(self, filters: Sequence[Filter]) -> RowCount:
        """How many rows match. Without filters: exact, as the batches that wrote the rows
        keep it. With filters: the planner's estimate when it is above
        ``exact_count_max_rows`` (counting them would read that many), else counted if that
        takes under the count timeout, else the estimate."""
        async with self.pool.connection() as conn:
            if not filters:
                cursor = await conn.execute(ACTIVE_LIVE_ROWS, (self.projection.name,))
                kept = cast(dict[str, Any] | None, await cursor.fetchone())
                if kept is not None and kept["live_rows"] is not None:
                    return RowCount(int(kept["live_rows"]), True)
            if self.exact_count_max_rows is not None:
                estimate = await self._estimate(conn, filters)
                if estimate.count > self.exact_count_max_rows:
                    return estimate
            compiled = count_query(self.schema, filters)
            try:
                async with _timed_out_after(conn, self.count_timeout_ms):
                    cursor = await conn.execute(compiled.sql, compiled.params)
                    row = cast(dict[str, Any], await cursor.fetchone())
                return RowCount(int(row["count_1"]), True)
            except errors.QueryCanceled:
                return await self._estimate(conn, filters)

    async def _estimate(self, conn: AsyncConnection[Any], filters: Sequence[Filter]
                        ) -> RowCount:
        """The planner's estimate of the rows ``filters`` match (the top node of the plan),
        and what it rests on: when the table's statistics were taken, and how many rows
        were written since; bounded by ``ESTIMATE_TIMEOUT_MS``."""
        async with _timed_out_after(conn, ESTIMATE_TIMEOUT_MS):
            estimate = await self._planned_rows(conn, filters)
            cursor = await conn.execute(_STATISTICS, (self.schema.view,))
            table = cast(dict[str, Any] | None, await cursor.fetchone())
            if table is None:
                return RowCount(round(estimate), False)
            if needs_a_value(filters) and table["rows"] > 0:
                # The planner's share of live rows, taken out again (``needs_a_value``).
                live = await self._planned_rows(conn, ())
                estimate *= table["rows"] / max(live, 1.0)
        return RowCount(round(estimate), False, {
            "statistics_taken_at": (table["taken_at"].isoformat() if table["taken_at"]
                                    else None),
            "rows_written_since": int(table["written_since"] or 0)})

    async def _planned_rows(self, conn: AsyncConnection[Any], filters: Sequence[Filter]
                            ) -> float:
        """The planner's estimate of the view's rows ``filters`` match (the top node of the
        plan)."""
        matching = matching_query(self.schema, filters)
        cursor = await conn.execute("EXPLAIN (FORMAT JSON) " + matching.sql, matching.params)
        plan = cast(dict[str, Any], await cursor.fetchone())["QUERY PLAN"][0]["Plan"]
        return float(plan["Plan Rows"])

    async def stream_version(self, version: int, stream_id: str) -> int | None:
        """The last version of source stream ``stream_id`` that version ``version`` of the
        projection has met (None: none yet, or that version's table is gone)."""
        marks = watermarks_of(self.projection, version)
        query = sql.SQL("SELECT {} AS version FROM {} WHERE {} = %s").format(
            sql.Identifier(marks.version), sql.Identifier(marks.table),
            sql.Identifier(marks.stream))
        async with self.pool.connection() as conn:
            try:
                cursor = await conn.execute(query, (stream_id,))
            except errors.UndefinedTable:
                return None  # a replay switched versions and dropped it; the caller re-asks
            row = cast(dict[str, Any] | None, await cursor.fetchone())
        return int(row["version"]) if row else None
