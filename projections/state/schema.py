"""A projection version's tables as SQLAlchemy metadata, created and migrated through Alembic.

The read model's columns are declared with the projection; its state table adds the key and
the system columns (``_version``, ``_position``, ``_deleted``, ``_updated_at``,
``_deleted_at``); its pages keep room for updates (``STATE_FILLFACTOR``). Where a key gathers
several streams (re-keyed) or there is no state, a sources table holds the last version met
per source stream (``watermarks_of``). Stage tables hold a batch's rows between its tasks and
its commit. When a projection starts, Alembic's autogenerate compares these tables with the
database and the additive changes are applied: a new table, a new column, a new index.
Anything else (a column removed, a type changed) would rewrite or lose the rows that serve
reads, so it is refused with the command to run instead: a replay builds a new version with
the new schema beside the live one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    TIMESTAMP,
    BigInteger,
    Boolean,
    Column,
    Connection,
    Index,
    MetaData,
    Table,
    Text,
    exc,
    func,
    text,
)

from eventfold.projections.definition.projection import Projection
from eventfold.projections.plan import compile_projection

if TYPE_CHECKING:
    from alembic.operations import ops as alembic_ops


class SchemaNeedsReplay(RuntimeError):
    """The declared read model differs from the live table in a way only a replay can apply."""


def state_table(projection: Projection, version: int) -> str:
    return f"{projection.table}__v{version}"


def sources_table(projection: Projection, version: int) -> str:
    return f"{projection.table}__v{version}_sources"


def stage_table(projection: Projection, version: int) -> str:
    """Where a batch's tasks put the rows they folded, for the batch's commit to merge."""
    return f"{projection.table}__v{version}_stage"


def stage_sources_table(projection: Projection, version: int) -> str:
    return f"{projection.table}__v{version}_stage_sources"


@dataclass(frozen=True)
class Watermarks:
    """Where a version keeps the last version of each source stream it met (the duplicate
    guard, and what read-your-writes waits on): a table, its stream column, its version
    column."""

    table: str
    stream: str
    version: str


def watermarks_of(projection: Projection, version: int) -> Watermarks:
    """A projection keyed by aggregate id keeps them in its rows (``_version``), one keyed
    otherwise (or with no state) in its sources table."""
    if compile_projection(projection).watermarks_in_rows:
        return Watermarks(state_table(projection, version), "key", "_version")
    return Watermarks(sources_table(projection, version), "stream_id", "version")


STATE_FILLFACTOR = 80
"""Percent of each state table page that inserts fill: the rest holds the new versions of the
page's rows. A batch's merge updates a row in place (a heap-only tuple: no new index entry)
only where its page has room and no indexed column changed, which is also why no index of the
state table is on ``_updated_at``."""

STAGE_COLUMNS = ("_attempt", "_known")
"""What a staged row carries besides the state table's columns: the batch attempt that
staged it, and whether its key had a row when the task loaded it."""


def version_metadata(projection: Projection, version: int) -> MetaData:
    """The tables of one version of ``projection``, as declared. The stage tables are
    UNLOGGED: they hold one batch between its tasks and its commit, which checks that the
    server did not restart in between (an unlogged table is emptied by crash recovery)."""
    metadata = MetaData()
    unlogged = ["UNLOGGED"]
    if not compile_projection(projection).watermarks_in_rows:
        Table(sources_table(projection, version), metadata,
              Column("stream_id", Text, primary_key=True),
              Column("version", BigInteger, nullable=False))
        Table(stage_sources_table(projection, version), metadata,
              Column("_attempt", Text, nullable=False),
              Column("stream_id", Text, nullable=False),
              Column("version", BigInteger, nullable=False), prefixes=unlogged)
    if projection.has_state:
        name = state_table(projection, version)
        Table(name, metadata, *_row_columns(projection),
              Column("_updated_at", TIMESTAMP(timezone=True), nullable=False,
                     server_default=func.now()),
              # when the key was deleted (null while it is live): set once, so that updating
              # a live row leaves every indexed column as it was
              Column("_deleted_at", TIMESTAMP(timezone=True)),
              # (column, key): the read API pages sorted on a column, the key breaks ties
              *(Index(f"{name}_{column}", column, "key") for column in projection.indexes),
              # deleted keys by age, for their retention (``ReadModelStore.forget_deleted``)
              Index(f"{name}__deleted_at", "_deleted_at",
                    postgresql_where=text("_deleted_at IS NOT NULL")),
              postgresql_with={"fillfactor": STATE_FILLFACTOR})
        Table(stage_table(projection, version), metadata,
              Column("_attempt", Text, nullable=False),
              Column("_known", Boolean, nullable=False),
              *_row_columns(projection, keyed=False), prefixes=unlogged)
    return metadata


def _row_columns(projection: Projection, keyed: bool = True) -> list[Column[Any]]:
    """A state row: the key, the stored columns, the system columns."""
    return [Column("key", Text, primary_key=keyed, nullable=False),
            *(Column(column, column_type) for column, column_type
              in projection.stored_columns.items()),
            Column("_version", BigInteger, nullable=False),
            Column("_position", BigInteger, nullable=False),
            Column("_deleted", Boolean, nullable=False, server_default=text("false"))]


def migrate(conn: Connection, projection: Projection, version: int) -> list[str]:
    """Bring one version's tables to the declared schema (inside the caller's transaction);
    returns what changed. Raises ``SchemaNeedsReplay`` for a change that is not additive."""
    # Alembic is imported here, not with the module: read API workers import the projections'
    # definitions (and so this module) but never migrate, and Alembic is ~11 MB a process.
    from alembic.autogenerate import produce_migrations
    from alembic.migration import MigrationContext
    from alembic.operations import Operations
    from alembic.operations import ops as alembic_ops

    # What a live version may take without a replay: nothing here rewrites or drops a row.
    safe_changes = (alembic_ops.CreateTableOp, alembic_ops.AddColumnOp,
                    alembic_ops.CreateIndexOp, alembic_ops.DropIndexOp)
    metadata = version_metadata(projection, version)
    ours = set(metadata.tables)

    def include_name(name: str | None, type_: str, _parents: object) -> bool:
        return type_ != "table" or name in ours

    context = MigrationContext.configure(conn, opts={"include_name": include_name,
                                                     "compare_type": True})
    with warnings.catch_warnings():
        # Reflection reads the event store's tables too; types it does not know (xid8) are
        # nothing a read model uses.
        warnings.filterwarnings("ignore", "Did not recognize type", exc.SAWarning)
        upgrade = produce_migrations(context, metadata).upgrade_ops
        changes = list(_flatten(upgrade)) if upgrade is not None else []
    refused = [change for change in changes if not isinstance(change, safe_changes)]
    if refused:
        raise SchemaNeedsReplay(
            f"projection {projection.name!r} v{version}: the declared read model differs from "
            f"its table ({'; '.join(_describe(c) for c in refused)}). Changes other than new "
            f"tables, columns and indexes need a new version: run `eventfold projection replay "
            f"{projection.name}`")
    operations = Operations(context)
    for change in changes:
        operations.invoke(change)
    described = [_describe(change) for change in changes]
    if projection.has_state:
        described += _updates_in_place(conn, state_table(projection, version), changes)
    return described


def _updates_in_place(conn: Connection, table: str,
                      changes: list[alembic_ops.MigrateOperation]) -> list[str]:
    """A state table from before its pages kept room for updates: the rows deleted before it
    had ``_deleted_at`` take it from ``_updated_at`` (their retention runs on it), and its
    pages written from now on keep the room; what was done."""
    from alembic.operations import ops as alembic_ops

    done = []
    if any(isinstance(change, alembic_ops.AddColumnOp) and change.table_name == table
           and change.column.name == "_deleted_at" for change in changes):
        dated = conn.exec_driver_sql(
            f'UPDATE "{table}" SET _deleted_at = _updated_at WHERE _deleted').rowcount
        done.append(f"{table}: {dated} deleted rows dated by their last update")
    options = conn.exec_driver_sql(
        "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%(table)s)",
        {"table": f'"{table}"'}).scalar()
    wanted = f"fillfactor={STATE_FILLFACTOR}"
    if wanted not in (options or []):
        conn.exec_driver_sql(f'ALTER TABLE "{table}" SET ({wanted})')
        done.append(f"{table}: pages keep room for updates ({wanted})")
    return done


def _flatten(container: alembic_ops.OpContainer) -> Iterator[alembic_ops.MigrateOperation]:
    from alembic.operations import ops as alembic_ops

    for op in container.ops:
        if isinstance(op, alembic_ops.OpContainer):
            yield from _flatten(op)
        else:
            yield op


def _describe(op: alembic_ops.MigrateOperation) -> str:
    from alembic.operations import ops as alembic_ops

    if isinstance(op, alembic_ops.CreateTableOp):
        return f"create table {op.table_name}"
    if isinstance(op, alembic_ops.AddColumnOp):
        return f"add column {op.table_name}.{op.column.name} {op.column.type}"
    if isinstance(op, alembic_ops.CreateIndexOp):
        return f"create index {op.index_name} on {op.table_name}"
    if isinstance(op, alembic_ops.DropIndexOp):
        return f"drop index {op.index_name} (no longer declared)"
    if isinstance(op, alembic_ops.DropColumnOp):
        return f"column {op.table_name}.{op.column_name} is no longer declared"
    if isinstance(op, alembic_ops.AlterColumnOp):
        return (f"column {op.table_name}.{op.column_name} changes type "
                f"{op.existing_type} -> {op.modify_type}")
    return type(op).__name__
