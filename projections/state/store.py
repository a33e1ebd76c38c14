"""A projection version's state in Postgres, and the batch commit.

Each version has a state table ``<table>__v<N>`` holding every key it has seen with its version,
deleted keys included (``_deleted``), so the version guard survives a delete. Users query the
view named after the projection: live rows of the active version.

A batch is written where it is folded. Each task of the batch stages the rows of the keys it
changed (``Stage``: COPY into the version's UNLOGGED stage table, marked with the batch attempt
and with whether the key had a row), and its watermarks and parking letters; it produces the
KTable records, derived events and dead letters itself. The driver sees counts. Then
``ReadModelStore.commit`` merges the attempt's staged rows into the state table, in one
transaction with the watermarks, the parked events and the checkpoint: the read model still
changes atomically per batch, and no row passes through the driver. The merge inserts the new
keys and updates the known ones under the version guard (a row only moves to a higher
version), and counts what it touched: a key two tasks staged (its events in two source
partitions) fails the count and the batch folds again after a shuffle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from eventfold.contract import PartitionKey, libpq_url
from eventfold.projections.definition.projection import Projection
from eventfold.projections.faults import crash_point
from eventfold.projections.outcome import DeadLetter, KeyState, ParkedKey
from eventfold.projections.plan import compile_projection
from eventfold.projections.state.catalog import (
    CHECKPOINTS_TABLE,
    LOCK_TIMEOUT,
    READER_ROLE,
    Checkpoint,
    claim_batch,
    count_live_rows,
    delete_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from eventfold.projections.state.lease import LEASE_S, lease_clock, renew_held
from eventfold.projections.state.parking import (
    ParkedKeysReleased,
    any_parked,
    clear_staged,
    drop_parked,
    forget_resolutions_before,
    letters_produced,
    parked_counts,
    parked_heads,
    pending_letters,
    still_parked,
    take_staged,
)
from eventfold.projections.state.schema import (
    migrate,
    sources_table,
    stage_sources_table,
    stage_table,
    state_table,
    watermarks_of,
)
from eventfold.projections.state.source_ids import forget_ids, projection_reader
from eventfold.projections.state.stage import (
    SYSTEM_COLUMNS,
    KeySplitAcrossPartitions,
    Stage,
    StagedBatch,
    StageLost,
    column_list,
)

log = logging.getLogger(__name__)

def _runner_connection(database_url: str) -> psycopg.Connection:
    conn = psycopg.connect(libpq_url(database_url))
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
    conn.commit()
    return conn


PRUNE_BATCH = 5_000
PRUNE_BATCHES = 10
"""Pruning deletes this many rows a transaction, this many transactions a pass: a pass
between two batches stays short, and the rest waits for the next."""
ANALYZE_AFTER_SHARE = 0.1
"""Rows written since the planner's statistics were last taken, as a share of the live rows,
past which a commit takes them again: filtered counts are the planner's estimates, and a load
changing a table faster than autovacuum looks at it left them far off."""
ANALYZE_AFTER_ROWS = 1_000

def server_started(conn: psycopg.Connection) -> datetime:
    """When the Postgres server last started: a restart (crash recovery empties UNLOGGED
    tables; a failover lands on a server that never had them) changes it."""
    row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


class ReadModelStore:
    """One version of a projection's state in Postgres: load, stage, merge, checkpoint."""

    def __init__(self, database_url: str, projection: Projection, version: int,
                 conn: psycopg.Connection | None = None) -> None:
        """On ``conn`` when given (kept open by its owner: a task's Python worker), else on a
        connection of its own."""
        self.projection = projection
        self.plan = compile_projection(projection)
        self.version = version
        self.database_url = database_url
        self._owns_connection = conn is None
        self._written_since_analyze = 0
        self.conn = conn if conn is not None else _runner_connection(database_url)
        self._columns = list(projection.stored_columns)  # declared, and hidden components
        self._table = sql.Identifier(state_table(projection, version))
        self._stage = sql.Identifier(stage_table(projection, version))
        self._sources = sql.Identifier(sources_table(projection, version))
        self._stage_sources = sql.Identifier(stage_sources_table(projection, version))
        marks = watermarks_of(projection, version)
        self._marks_query = sql.SQL("SELECT {stream}, {version} FROM {table} "
                                    "WHERE {stream} = ANY(%s)").format(
            stream=sql.Identifier(marks.stream), version=sql.Identifier(marks.version),
            table=sql.Identifier(marks.table))
        self._load_query = sql.SQL(
            "SELECT key, _version, _position, _deleted, {columns} FROM {table} "
            "WHERE key = ANY(%s)").format(columns=column_list(self._columns), table=self._table)

    # -- schema -----------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create or migrate this version's tables through Alembic (``schema``)."""
        engine = create_engine(self.database_url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                for change in migrate(conn, self.projection, self.version):
                    log.info("projection %s v%d: %s", self.projection.name, self.version, change)
        finally:
            engine.dispose()
        marks = watermarks_of(self.projection, self.version)
        with self.conn.transaction():
            if self.projection.has_state:
                count_live_rows(self.conn, self.projection.name, self.version,
                                self._count_live_rows)
            if self.plan.watermarks_in_rows:
                self._watermarks_into_rows()
            # the read API waits on these watermarks for read-your-writes
            self.conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(marks.table), sql.Identifier(READER_ROLE)))

    def _count_live_rows(self) -> int:
        """Counted once, for a version from before its checkpoint kept the count."""
        row = self.conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE NOT _deleted").format(
            self._table)).fetchone()
        counted = int(row[0]) if row else 0
        log.info("projection %s v%d: %d live rows counted (kept by its batches from now on)",
                 self.projection.name, self.version, counted)
        return counted

    def _watermarks_into_rows(self) -> None:
        """A version made before watermarks lived in the rows of a projection keyed by
        aggregate id: its sources table's versions move into the rows (a stream that never
        had a state gets a deleted row), then the table goes."""
        found = self.conn.execute("SELECT to_regclass(%s)", (
            self._sources.as_string(self.conn),)).fetchone()
        if found is None or found[0] is None:
            return
        moved = self.conn.execute(sql.SQL("""
            INSERT INTO {table} (key, _version, _position, _deleted, _deleted_at)
            SELECT stream_id, version, 0, true, now() FROM {sources}
            ON CONFLICT (key) DO UPDATE SET _version = excluded._version
            WHERE {table}._version < excluded._version
        """).format(table=self._table, sources=self._sources)).rowcount
        self.conn.execute(sql.SQL("DROP TABLE {}").format(self._sources))
        log.info("projection %s v%d: watermarks now kept in the rows (%d moved from %s)",
                 self.projection.name, self.version, moved, self._sources.as_string(self.conn))

    def publish_view(self, conn: psycopg.Connection) -> None:
        """Point the user-facing view at this version (inside the caller's transaction).

        Drop and create rather than replace: a replay is how a projection changes columns."""
        if not self.projection.has_state:
            return
        view = sql.Identifier(self.projection.table)
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
        conn.execute(sql.SQL("""
            CREATE VIEW {view} AS SELECT key, {columns}, _version, _position, _updated_at
            FROM {table} WHERE NOT _deleted
        """).format(view=view, table=self._table, columns=column_list(self.projection.columns)))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(view, sql.Identifier(READER_ROLE)))

    def drop(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}, {}, {}").format(
            self._table, self._sources, self._stage, self._stage_sources))
        delete_checkpoint(conn, self.projection.name, self.version)
        forget_ids(conn, projection_reader(self.projection.name, self.version))
        drop_parked(conn, self.projection.name, self.version)
        clear_staged(conn, self.projection.name, self.version)

    # -- reads ------------------------------------------------------------------------------
    def load(self, keys: Iterable[str]) -> dict[str, KeyState]:
        """The keys' states as stored, deleted ones included (state None)."""
        keys = list(keys)
        if not keys or not self.projection.has_state:
            return {}
        states: dict[str, KeyState] = {}
        columns = self._columns
        with self.conn.transaction():
            plan_as_key_lookups(self.conn)
            for key, version, position, deleted, *values in self.conn.execute(
                    self._load_query, (keys,)):
                state = None if deleted else dict(zip(columns, values, strict=True))
                states[key] = KeyState(state, version, position)
        return states

    def watermarks(self, streams: Iterable[str]) -> dict[str, int]:
        """The last version met of each of ``streams`` (those met before)."""
        with self.conn.transaction():
            plan_as_key_lookups(self.conn)
            return dict(self.conn.execute(self._marks_query, (list(streams),)).fetchall())

    def parked(self, keys: Iterable[str]) -> dict[str, ParkedKey]:
        """Of ``keys``, the parked ones with the event each waits on."""
        with self.conn.transaction():
            return parked_heads(self.conn, self.projection.name, self.version, keys)

    def any_parked(self) -> bool:
        with self.conn.transaction():
            return any_parked(self.conn, self.projection.name, self.version)

    def row_count(self) -> int | None:
        """How many rows the read model holds: as its batches keep the count; None before
        the projection first ran."""
        if not self.projection.has_state:
            return None
        with self.conn.transaction():
            row = self.conn.execute(sql.SQL(
                "SELECT live_rows FROM {} WHERE projection = %s AND version = %s").format(
                sql.Identifier(CHECKPOINTS_TABLE)), (self.projection.name, self.version)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def forget_deleted(self, older_than_s: float, batch: int = PRUNE_BATCH,
                       batches: int = PRUNE_BATCHES) -> int:
        """Delete the rows of keys deleted more than ``older_than_s`` ago, at most
        ``batches`` transactions of ``batch`` rows (the rest next time), by the index of
        deleted rows; how many went. A key's version guard goes with its row: an event of it
        redelivered after that (a connector replaying from further back than the retention)
        would fold as new."""
        if not self.projection.has_state:
            return 0
        query = sql.SQL("""
            DELETE FROM {table} WHERE key IN (
                SELECT key FROM {table} WHERE _deleted
                AND _deleted_at < now() - make_interval(secs => %s)
                ORDER BY _deleted_at LIMIT %s FOR UPDATE SKIP LOCKED)""").format(
            table=self._table)
        forgotten = 0
        for _ in range(batches):
            with self.conn.transaction():
                deleted = self.conn.execute(query, (older_than_s, batch)).rowcount
            forgotten += deleted
            if deleted < batch:
                break
        return forgotten

    def forget_resolutions_before(self, first_offset: int) -> int:
        """What was done with the letters below the dead-letter topic's first offset."""
        with self.conn.transaction():
            return forget_resolutions_before(self.conn, self.projection.name, first_offset)

    def committed_offsets(self) -> dict[PartitionKey, int]:
        checkpoint = self.checkpoint()
        return checkpoint.offsets if checkpoint else {}

    def checkpoint(self) -> Checkpoint | None:
        return read_checkpoint(self.conn, self.projection.name, self.version)

    def parked_counts(self) -> tuple[int, int]:
        """(keys parked, events they hold)."""
        with self.conn.transaction():
            return parked_counts(self.conn, {self.projection.name: self.version}).get(
                self.projection.name, (0, 0))

    def server_started(self) -> datetime:
        with self.conn.transaction():
            return server_started(self.conn)

    # -- the batch commit -------------------------------------------------------------------
    def stage(self, attempt: str) -> Stage:
        """A stage for rows of batch attempt ``attempt`` on this store's connection."""
        return Stage(self.conn, self.projection, self.version, attempt)

    def commit(self, batch_id: int, batch: StagedBatch,
               previous_offsets: Mapping[PartitionKey, int],
               writer_epoch: int | None = None, writer_lease_s: float = LEASE_S,
               lease_renewed: Callable[[float], None] | None = None) -> int:
        """Merge what the tasks of ``batch`` staged, hold its parking letters, and save the
        checkpoint, in one transaction; how many letters it decided to produce (those of keys
        parked before the batch, once the transaction has checked they still are), which
        ``produce_pending_letters`` produces after it: no network work inside the commit.
        ``writer_epoch``: the runner's writer lease, checked under the registry row (a lock
        waited for past ``LOCK_TIMEOUT`` fails the commit; the batch runs again). The row
        stays locked until the commit ends, so a writer silent inside it for
        ``writer_lease_s`` (frozen, cut off) has the server end its session: its lock would
        otherwise keep a standby from taking the expired lease for as long as it sleeps.
        The commit renews the lease on that row as it ends, and tells ``lease_renewed`` when
        the renewal started (``lease.lease_clock()``).

        Raises, with nothing merged: ``WriterFenced`` when another runner holds the lease;
        ``ParkedKeysReleased`` when a key the batch held back
        was retried meanwhile (the retry holds the registry row this claims);
        ``KeySplitAcrossPartitions`` when two tasks staged one key; ``StageLost`` when the
        server restarted after the tasks staged."""
        offsets = {**previous_offsets, **batch.next_offsets}
        name = self.projection.name
        with self.conn.transaction():
            if writer_epoch is not None:
                self.conn.execute(sql.SQL("SET LOCAL idle_in_transaction_session_timeout = {}"
                                          ).format(sql.Literal(f"{writer_lease_s * 1000:.0f}")))
            claim_batch(self.conn, name, self.version, offsets, writer_epoch)
            if batch.servers and batch.servers != {server_started(self.conn)}:
                raise StageLost(f"projection {name} v{self.version}: the database restarted "
                                "after the batch's tasks staged their rows")
            if batch.held:
                released = batch.held - still_parked(self.conn, name, self.version,
                                                     batch.held)
                if released:
                    raise ParkedKeysReleased(released)
            self.merge(batch)
            crash_point("commit.merged")
            pending = take_staged(self.conn, name, self.version, batch.attempt)
            save_checkpoint(self.conn, name, self.version, batch_id, offsets, batch.applied,
                            batch.dead_letters, batch.live_rows_delta)
            self._clear_stage()
            renewal_started = lease_clock()
            if writer_epoch is not None:
                renew_held(self.conn, name, writer_epoch)
        if writer_epoch is not None and lease_renewed is not None:
            lease_renewed(renewal_started)
        self._refresh_statistics(batch.new_rows + batch.known_rows + batch.direct_rows)
        return pending

    def produce_pending_letters(self, produce: Callable[[Sequence[DeadLetter]], None]) -> int:
        """Produce (``produce``, which flushes) the letters committed batches decided and
        did not produce yet, and mark them produced; how many. A process that dies in
        between produces them again at its next start: a held event's letters may be
        several, which a retry folds once."""
        name = self.projection.name
        with self.conn.transaction():
            letters = pending_letters(self.conn, name, self.version)
        if letters:
            produce(letters)
            crash_point("letters.produced")
            with self.conn.transaction():
                letters_produced(self.conn, name, self.version, letters)
        return len(letters)

    def _refresh_statistics(self, written: int) -> None:
        """Take the planner's statistics of the table again once the rows written since
        the last time are a large share of it (``ANALYZE_AFTER_SHARE``)."""
        self._written_since_analyze += written
        if self._written_since_analyze < ANALYZE_AFTER_ROWS:
            return
        live = self.row_count() or 0
        if self._written_since_analyze < ANALYZE_AFTER_SHARE * live:
            return
        with self.conn.transaction():
            self.conn.execute(sql.SQL("ANALYZE {}").format(self._table))
        log.debug("projection %s v%d: statistics taken again after %d rows written (%d live)",
                  self.projection.name, self.version, self._written_since_analyze, live)
        self._written_since_analyze = 0

    def merge(self, batch: StagedBatch) -> None:
        """In the caller's transaction: the attempt's staged rows into the state table, its
        staged watermarks into the sources table. Raises ``KeySplitAcrossPartitions`` when
        what it touched differs from what the tasks staged."""
        attempt = batch.attempt
        if self.projection.has_state and (batch.new_rows or batch.known_rows):
            columns = ["key", *self._columns, *SYSTEM_COLUMNS]
            try:
                inserted = self.conn.execute(sql.SQL("""
                    INSERT INTO {table} ({columns}, _deleted_at)
                    SELECT {columns}, CASE WHEN _deleted THEN now() END FROM {stage}
                    WHERE _attempt = %s AND NOT _known
                """).format(table=self._table, stage=self._stage, columns=column_list(columns)),
                    (attempt,)).rowcount
            except psycopg.errors.UniqueViolation as exc:
                raise KeySplitAcrossPartitions(str(exc).splitlines()[0]) from None
            # The guard: a row only moves to a higher version.
            updates = sql.SQL(", ").join(sql.SQL("{c} = s.{c}").format(c=sql.Identifier(c))
                                         for c in [*self._columns, *SYSTEM_COLUMNS])
            updated = self.conn.execute(sql.SQL("""
                UPDATE {table} t SET {updates}, _updated_at = now(),
                    _deleted_at = CASE WHEN s._deleted THEN coalesce(t._deleted_at, now()) END
                FROM {stage} s
                WHERE s._attempt = %s AND s._known AND t.key = s.key
                  AND t._version < s._version
            """).format(table=self._table, stage=self._stage, updates=updates),
                (attempt,)).rowcount
            if (inserted, updated) != (batch.new_rows, batch.known_rows):
                raise KeySplitAcrossPartitions(
                    f"staged {batch.new_rows} new and {batch.known_rows} known rows, merged "
                    f"{inserted} and {updated}")
        if batch.marks:
            self.conn.execute(sql.SQL("""
                INSERT INTO {sources} SELECT stream_id, max(version) FROM {stage}
                WHERE _attempt = %s GROUP BY stream_id
                ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version
                WHERE {sources}.version < excluded.version
            """).format(sources=self._sources, stage=self._stage_sources), (attempt,))

    def begin_direct(self) -> None:
        """Empty this version's state table, for an attempt whose tasks write straight into
        it (``BatchContext.direct``): what an earlier attempt wrote goes."""
        if self.projection.has_state:
            with self.conn.transaction():
                self.conn.execute(sql.SQL("TRUNCATE {}").format(self._table))

    def unstage(self, attempt: str) -> None:
        """In the caller's transaction: the attempt's staged rows, once merged."""
        if self.projection.has_state:
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE _attempt = %s").format(self._stage),
                              (attempt,))
        if not self.plan.watermarks_in_rows:
            self.conn.execute(sql.SQL("DELETE FROM {} WHERE _attempt = %s").format(
                self._stage_sources), (attempt,))

    def _clear_stage(self) -> None:
        """Every staged row of the version, earlier attempts' included (one batch runs at a
        time)."""
        tables = [t for t, used in ((self._stage, self.projection.has_state),
                                    (self._stage_sources, not self.plan.watermarks_in_rows))
                  if used]
        if tables:
            self.conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(tables)))
        clear_staged(self.conn, self.projection.name, self.version)

    def close(self) -> None:
        if self._owns_connection:
            self.conn.close()

    def __enter__(self) -> ReadModelStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def plan_as_key_lookups(conn: psycopg.Connection) -> None:
    """In the caller's transaction: its ``key = ANY(%s)`` queries read the keys' index
    entries, never the whole table. Given tens of thousands of keys the planner takes a
    parallel scan of the whole table, whose cost grows with its rows; a bitmap scan of the
    index is faster on one process (docs/benchmarks.md, "Millions of keys: tasks write what
    they fold")."""
    conn.execute("SET LOCAL enable_seqscan = off")


def lookup_rows(conn: psycopg.Connection, table: str, keys: Iterable[str]) -> dict[str, Any]:
    """Rows of another projection's view by key, as dicts: the table side of a lookup."""
    query = sql.SQL("SELECT key, to_jsonb(t) - 'key' - '_version' - '_position' - "
                    "'_updated_at' FROM {} t WHERE key = ANY(%s)").format(sql.Identifier(table))
    with conn.transaction():
        plan_as_key_lookups(conn)
        try:
            return dict(conn.execute(query, (list(keys),)).fetchall())
        except psycopg.errors.UndefinedTable:
            return {}  # the other projection has not run yet: every lookup misses
