"""The catalog tables every projection shares, and the only code that reads or writes them.

- ``projection_versions``: which version of each projection serves reads, the one a replay is
  building, the emission mark (the source offsets up to which derived events went out) and the
  derived-event topics written so far;
- ``projection_checkpoints``: per version, the source offsets a batch committed up to, in the
  same transaction as the rows it wrote;
- ``retired_ktable_topics``: replaced versions' KTable topics, deleted once no read API
  instance has them open (``readers``, members of kind ``KTABLE_READER``);
- ``ktable_partitions``: every partition count each KTable topic has had.

Version 1 is registered when a projection first runs. A replay builds version N+1 beside the
active one; the switch (view, registry row, old tables) is one Postgres transaction taken while
holding the registry row, which is also what every batch of the active version locks to
commit (``claim_batch``), so no batch of the old version can land after the switch. The runner,
replays, ``status`` and the read API all go through here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from eventfold.contract import PartitionKey, flatten_offsets, libpq_url, nest_offsets
from eventfold.projections.state.lease import VERSIONS_TABLE, WriterFenced
from eventfold.projections.state.readers import (
    LIVE_READER_OF_TOPIC,
    SWITCH_LOCK,
    forget_gone_readers,
)

CHECKPOINTS_TABLE = "projection_checkpoints"
READER_ROLE = "eventfold_reader"  # created by migration 0005; read models grant it SELECT
RETIRED_TOPICS_TABLE = "retired_ktable_topics"  # replaced versions' topics awaiting deletion

_TABLE = sql.Identifier(VERSIONS_TABLE)
_CHECKPOINTS = sql.Identifier(CHECKPOINTS_TABLE)
_RETIRED = sql.Identifier(RETIRED_TOPICS_TABLE)
_IN_FLIGHT = sql.Identifier("batches_in_flight")
# A retired topic nobody reads: no fresh heartbeat for it. A reader that saw the old version
# just before the switch has its row by then (``readers.note_reader``, under ``SWITCH_LOCK``).
_UNREAD_RETIRED = sql.SQL("SELECT r.topic FROM {retired} r WHERE NOT EXISTS ({readers})").format(
    retired=_RETIRED, readers=sql.SQL(LIVE_READER_OF_TOPIC.format(topic="r.topic")))

log = logging.getLogger(__name__)


LOCK_TIMEOUT = "30s"
"""The longest a runner's own connections wait for a lock (a row an operator's session holds,
a replay's switch, a `dlq retry`): past it the statement fails, and the batch (or the start)
runs again from the checkpoint, instead of hanging the projection."""


LOCKED_IDLE_TIMEOUT = "120s"
"""The longest a holder of a projection's registry row (a replay's switch, ``dlq discard``)
may go without a statement before the server ends its session."""


class ProjectionCatalog:
    """The registry of one database's projections, through one autocommit connection."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._connection: psycopg.Connection | None = None

    def _conn(self) -> psycopg.Connection:
        """One autocommit connection, opened on first use: a runner asks every batch."""
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(libpq_url(self.database_url), autocommit=True)
            self._connection.execute(sql.SQL("SET lock_timeout = {}").format(
                sql.Literal(LOCK_TIMEOUT)))
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def register(self, name: str) -> int:
        """The active version, registering version 1 on a projection's first run."""
        self._conn().execute(sql.SQL("INSERT INTO {} (projection, active_version) VALUES "
                                     "(%s, 1) ON CONFLICT (projection) DO NOTHING")
                             .format(_TABLE), (name,))
        return self.active(name)

    def active(self, name: str) -> int:
        row = self._conn().execute(sql.SQL("SELECT active_version FROM {} WHERE projection = %s")
                           .format(_TABLE), (name,)).fetchone()
        if row is None:
            raise LookupError(f"projection {name!r} has never run")
        return int(row[0])

    def note_partitions(self, topic: str, topic_id: str, partitions: int) -> tuple[int, ...]:
        """``note_partitions`` on this catalog's connection."""
        return note_partitions(self._conn(), topic, topic_id, partitions)

    def partition_history(self, topic: str, topic_id: str) -> tuple[int, ...]:
        return partition_history(self._conn(), [topic]).get((topic, topic_id), ())

    def emitted_offsets(self, name: str) -> dict[PartitionKey, int]:
        row = self._conn().execute(sql.SQL("SELECT emitted_offsets FROM {} WHERE projection = %s")
                                   .format(_TABLE), (name,)).fetchone()
        return flatten_offsets(row[0]) if row else {}

    def note_outputs(self, name: str, topics: Iterable[str]) -> None:
        """Record derived-event topics the projection has written to."""
        self._conn().execute(sql.SQL("""
            UPDATE {} SET output_topics = (
                SELECT coalesce(jsonb_agg(DISTINCT topic ORDER BY topic), '[]')
                FROM (SELECT jsonb_array_elements_text(output_topics) AS topic
                      UNION SELECT unnest(%s::text[])) AS known)
            WHERE projection = %s""").format(_TABLE), (sorted(topics), name))

    def outputs(self, name: str) -> tuple[int, list[str]]:
        """(active version, derived-event topics written so far); (1, []) before a first run."""
        row = self._conn().execute(sql.SQL(
            "SELECT active_version, output_topics FROM {} WHERE projection = %s")
            .format(_TABLE), (name,)).fetchone()
        return (int(row[0]), list(row[1])) if row else (1, [])

    def batch_started(self, name: str, version: int, ends: Mapping[PartitionKey, int],
                      run_id: str) -> None:
        """The active version's next batch, ending at ``ends``, is under way: recorded for
        run ``run_id`` before its tasks write anything, once no switch holds the registry
        row. Raises ``VersionSwitched`` when the version is no longer active."""
        conn = self._conn()
        with conn.transaction():
            row = conn.execute(sql.SQL(
                "SELECT active_version FROM {} WHERE projection = %s FOR SHARE").format(_TABLE),
                (name,)).fetchone()
            if row is None or row[0] != version:
                raise VersionSwitched.past(name, version, row[0] if row else None)
            conn.execute(sql.SQL("""
                INSERT INTO {} (projection, version, ends, run_id) VALUES (%s, %s, %s, %s)
                ON CONFLICT (projection) DO UPDATE SET version = excluded.version,
                    ends = excluded.ends, tasks_done = false, started_at = now(),
                    run_id = excluded.run_id
            """).format(_IN_FLIGHT), (name, version, Jsonb(nest_offsets(ends)), run_id))

    def batch_written(self, name: str, run_id: str) -> None:
        """Its tasks are done: what they wrote to the KTable is all the batch writes there."""
        self._conn().execute(sql.SQL("UPDATE {} SET tasks_done = true WHERE projection = %s "
                                     "AND run_id = %s").format(_IN_FLIGHT), (name, run_id))

    def batch_ended(self, name: str, run_id: str) -> None:
        """Failed: no batch of run ``run_id`` is under way (a commit ends it in
        ``claim_batch``). A newer run's batch stays recorded: a run given up as stalled may
        end long after its successor started."""
        self._conn().execute(sql.SQL("DELETE FROM {} WHERE projection = %s AND run_id = %s")
                             .format(_IN_FLIGHT), (name, run_id))

    def check_current(self, name: str, version: int) -> None:
        """Raise ``VersionSwitched`` when ``version`` is neither active nor being built."""
        row = self._conn().execute(sql.SQL(
            "SELECT active_version, building_version FROM {} WHERE projection = %s")
            .format(_TABLE), (name,)).fetchone()
        if row is None or version not in row:
            raise VersionSwitched.past(name, version, row[0] if row else None)

    def begin_build(self, name: str) -> int:
        """The version a replay builds: a new one, or the unfinished one of an earlier replay
        (its checkpoints are consistent, so it resumes)."""
        row = self._conn().execute(sql.SQL(
            "UPDATE {} SET building_version = coalesce(building_version, active_version + 1)"
            " WHERE projection = %s RETURNING building_version").format(_TABLE),
            (name,)).fetchone()
        if row is None:
            raise LookupError(f"projection {name!r} has never run")
        return int(row[0])

    @contextmanager
    def locked(self, name: str) -> Iterator[psycopg.Connection]:
        """A transaction holding the registry row: the active version cannot commit, nor a
        standby take the writer lease, meanwhile. One that goes ``LOCKED_IDLE_TIMEOUT``
        without a statement (its process frozen: a replay's switch folds its tail meanwhile,
        on other connections) has its session ended by the server, and changes nothing."""
        with psycopg.connect(libpq_url(self.database_url)) as conn, conn.transaction():
            conn.execute(sql.SQL("SET LOCAL idle_in_transaction_session_timeout = {}").format(
                sql.Literal(LOCKED_IDLE_TIMEOUT)))
            conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                sql.Literal(LOCK_TIMEOUT)))
            lock_registry(conn, name)
            yield conn

    @staticmethod
    def activate(conn: psycopg.Connection, name: str, version: int,
                 reached: dict[PartitionKey, int]) -> None:
        """Make ``version`` active. It did not emit derived events while it was building, and
        nothing it already applied will emit later: the emission mark moves up to ``reached``."""
        row = conn.execute(sql.SQL("SELECT emitted_offsets FROM {} WHERE projection = %s")
                           .format(_TABLE), (name,)).fetchone()
        emitted = flatten_offsets(row[0]) if row else {}
        for key, offset in reached.items():
            emitted[key] = max(emitted.get(key, 0), offset)
        conn.execute(sql.SQL("UPDATE {} SET active_version = %s, building_version = NULL, "
                             "emitted_offsets = %s, switched_at = now() WHERE projection = %s")
                     .format(_TABLE), (version, Jsonb(nest_offsets(emitted)), name))

    @staticmethod
    def retire_topic(conn: psycopg.Connection, name: str, version: int, topic: str) -> None:
        """Queue a replaced version's KTable topic for deletion (in the switch's transaction).
        It is deleted once no read API instance has it open, so that no reader serves from
        a topic being deleted under it."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (SWITCH_LOCK + name,))
        conn.execute(sql.SQL("INSERT INTO {} (topic, projection, version) VALUES (%s, %s, %s) "
                             "ON CONFLICT (topic) DO NOTHING").format(_RETIRED),
                     (topic, name, version))

    def delete_retired_topics(self, delete: Callable[[list[str]], None],
                              wait_s: float = 0.0) -> list[str]:
        """Delete every retired topic no live reader has open, waiting up to ``wait_s`` for
        readers to move off. The topics still read are left for a later call (the next
        replay, or a streaming run, which calls this as it goes). Rows of readers gone go
        first, so a topic deleted because its reader is gone takes the
        reader's row with it."""
        deadline = time.monotonic() + wait_s
        deleted: list[str] = []
        while True:
            with self._conn().transaction():  # one now(): a row forgotten, or one that counts
                forget_gone_readers(self._conn())
                topics = [row[0] for row in self._conn().execute(_UNREAD_RETIRED).fetchall()]
            if topics:
                delete(topics)
                self._conn().execute(sql.SQL("DELETE FROM {} WHERE topic = ANY(%s)")
                                     .format(_RETIRED), (topics,))
                deleted += topics
                log.info("deleted retired KTable topics %s (no reader has them open)", topics)
            waiting = self._conn().execute(sql.SQL("SELECT count(*) FROM {}").format(_RETIRED)
                                           ).fetchone()
            if not waiting or not waiting[0] or time.monotonic() >= deadline:
                if waiting and waiting[0]:
                    log.info("%d retired KTable topic(s) still open in a read API; deleted once "
                             "its instances move to the active version", waiting[0])
                return deleted
            time.sleep(1.0)


def written_in_flight(conn: psycopg.Connection, name: str, version: int,
                      wait_s: float) -> dict[PartitionKey, int]:
    """In the caller's transaction (a switch, holding the registry row): the end of the
    active version's batch under way once its tasks are done (waiting up to ``wait_s``; its
    commit then waits on the registry row); {} when none is under way, or its tasks did not
    finish in time (its run died, say)."""
    deadline = time.monotonic() + wait_s
    query = sql.SQL("SELECT ends, tasks_done FROM {} WHERE projection = %s AND version = %s"
                    ).format(_IN_FLIGHT)
    while True:
        row = conn.execute(query, (name, version)).fetchone()
        if row is None:
            return {}
        ends, done = row
        if done:
            return flatten_offsets(ends)
        if time.monotonic() >= deadline:
            log.warning("projection %s v%d: its batch under way did not finish its tasks in "
                        "%.0f s; switching without it", name, version, wait_s)
            return {}
        time.sleep(0.05)


BATCH_COMMITTED = "eventfold_batch_committed"  # a LISTEN channel; the payload: a projection


class VersionSwitched(RuntimeError):
    """This version is no longer active nor being built: a replay switched past it."""

    @classmethod
    def past(cls, name: str, version: int, active: int | None) -> VersionSwitched:
        return cls(f"projection {name!r} v{version} is no longer active or building "
                   f"(active: v{active if active is not None else '?'})")


@dataclass(frozen=True)
class Checkpoint:
    batch_id: int
    offsets: dict[PartitionKey, int]
    events_applied: int
    dead_letters: int
    updated_at: datetime


def read_checkpoint(conn: psycopg.Connection, name: str, version: int) -> Checkpoint | None:
    with conn.transaction():
        row = conn.execute(sql.SQL(
            "SELECT batch_id, offsets, events_applied, dead_letters, updated_at FROM {} "
            "WHERE projection = %s AND version = %s").format(_CHECKPOINTS),
            (name, version)).fetchone()
    if row is None:
        return None
    batch_id, offsets, applied, dead_letters, updated_at = row
    return Checkpoint(batch_id, flatten_offsets(offsets), applied, dead_letters, updated_at)


def lock_registry(conn: psycopg.Connection, name: str) -> int | None:
    """In the caller's transaction: hold the projection's registry row, so that no batch of
    its active version commits meanwhile; its active version (None: it never ran)."""
    row = conn.execute(sql.SQL("SELECT active_version FROM {} WHERE projection = %s FOR UPDATE")
                       .format(_TABLE), (name,)).fetchone()
    return None if row is None else int(row[0])


def claim_batch(conn: psycopg.Connection, name: str, version: int,
                offsets: Mapping[PartitionKey, int], writer_epoch: int | None = None) -> None:
    """In a batch's transaction: the active version locks its registry row (a switch waits
    for the batch), checks the writer lease is still at ``writer_epoch`` (when the runner
    holds one), moves the emission mark up to ``offsets`` and ends the batch's record of
    being under way (``batch_started``; gone as the batch commits, not a statement after);
    a replay's version only checks that it is still the one building. Raises
    ``VersionSwitched`` or ``WriterFenced``."""
    query = sql.SQL("SELECT active_version, building_version, emitted_offsets, writer, "
                    "writer_epoch FROM {} WHERE projection = %s").format(_TABLE)
    row = conn.execute(query, (name,)).fetchone()
    if row is not None and row[0] == version:
        row = conn.execute(query + sql.SQL(" FOR UPDATE"), (name,)).fetchone()
    if row is None:
        raise VersionSwitched(f"projection {name!r} is not registered")
    active, building, emitted, writer, epoch = row
    if active == version and writer_epoch is not None and epoch != writer_epoch:
        raise WriterFenced(name, writer, epoch)
    if active == version:
        merged = flatten_offsets(emitted)
        for key, offset in offsets.items():
            merged[key] = max(merged.get(key, 0), offset)
        conn.execute(sql.SQL("UPDATE {} SET emitted_offsets = %s WHERE projection = %s")
                     .format(_TABLE), (Jsonb(nest_offsets(merged)), name))
        conn.execute(sql.SQL("DELETE FROM {} WHERE projection = %s").format(_IN_FLIGHT),
                     (name,))
    elif building != version:
        raise VersionSwitched.past(name, version, active)


def save_checkpoint(conn: psycopg.Connection, name: str, version: int, batch_id: int,
                    offsets: Mapping[PartitionKey, int], applied: int,
                    dead_letters: int, live_rows_delta: int = 0) -> None:
    """In a batch's transaction: the offsets it committed up to, and its counts added (the
    live rows it added less those it deleted among them); and a notification on
    ``BATCH_COMMITTED``, which Postgres delivers when it commits."""
    conn.execute("SELECT pg_notify(%s, %s)", (BATCH_COMMITTED, name))
    conn.execute(sql.SQL("""
        INSERT INTO {table} (projection, version, batch_id, offsets, events_applied,
                             dead_letters, live_rows, updated_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, now())
        ON CONFLICT (projection, version) DO UPDATE SET
            batch_id = excluded.batch_id, offsets = excluded.offsets,
            events_applied = {table}.events_applied + excluded.events_applied,
            dead_letters = {table}.dead_letters + excluded.dead_letters,
            live_rows = {table}.live_rows + excluded.live_rows,
            updated_at = now()
    """).format(table=_CHECKPOINTS), (name, version, batch_id, Jsonb(nest_offsets(offsets)),
                                     applied, dead_letters, live_rows_delta))


def add_live_rows(conn: psycopg.Connection, name: str, version: int, delta: int) -> None:
    """In the transaction that wrote rows outside a batch (a dead letter retried): the
    version's live rows moved by ``delta``."""
    if delta:
        conn.execute(sql.SQL("UPDATE {} SET live_rows = live_rows + %s "
                             "WHERE projection = %s AND version = %s").format(_CHECKPOINTS),
                     (delta, name, version))


def count_live_rows(conn: psycopg.Connection, name: str, version: int,
                    count: Callable[[], int]) -> int | None:
    """In the caller's transaction: the version's live rows, counted by ``count`` if its
    checkpoint does not keep them yet (a version from before they were kept); None before
    its first batch. The checkpoint row is held meanwhile: a write that would add to the
    count (a dead letter retried) waits, and adds to what was counted."""
    row = conn.execute(sql.SQL("SELECT live_rows FROM {} WHERE projection = %s AND "
                               "version = %s FOR UPDATE").format(_CHECKPOINTS),
                       (name, version)).fetchone()
    if row is None:
        return None
    if row[0] is not None:
        return int(row[0])
    counted = count()
    conn.execute(sql.SQL("UPDATE {} SET live_rows = %s WHERE projection = %s AND version = %s")
                 .format(_CHECKPOINTS), (counted, name, version))
    return counted


ACTIVE_LIVE_ROWS = sql.SQL("""
    SELECT c.live_rows FROM {versions} v JOIN {checkpoints} c
      ON c.projection = v.projection AND c.version = v.active_version
    WHERE v.projection = %s
""").format(versions=_TABLE, checkpoints=_CHECKPOINTS)
"""The live rows of a projection's active version (no row, or null: not kept yet, or no
batch committed): what its view holds, read in one row, in the snapshot that reads it."""


def delete_checkpoint(conn: psycopg.Connection, name: str, version: int) -> None:
    conn.execute(sql.SQL("DELETE FROM {} WHERE projection = %s AND version = %s").format(
        _CHECKPOINTS), (name, version))


@dataclass(frozen=True)
class ActiveCheckpoint:
    """A projection's active version and how far it has committed (None: it never ran)."""

    projection: str
    version: int
    checkpoint: Checkpoint | None
    derived_topics: list[str]


def active_checkpoints(conn: psycopg.Connection, names: Sequence[str]
                       ) -> list[ActiveCheckpoint]:
    """The active version and its checkpoint of each of ``names`` that is registered."""
    rows = conn.execute(sql.SQL("""
        SELECT v.projection, v.active_version, v.output_topics, c.batch_id, c.offsets,
               c.events_applied, c.dead_letters, c.updated_at
        FROM {versions} v LEFT JOIN {checkpoints} c
          ON c.projection = v.projection AND c.version = v.active_version
        WHERE v.projection = ANY(%s)
    """).format(versions=_TABLE, checkpoints=_CHECKPOINTS), (list(names),)).fetchall()
    return [ActiveCheckpoint(name, version, None if batch_id is None else Checkpoint(
        batch_id, flatten_offsets(offsets), applied, dead_letters, updated_at), list(derived))
        for name, version, derived, batch_id, offsets, applied, dead_letters, updated_at
        in rows]


_PARTITION_COUNTS = sql.Identifier("ktable_partitions")


def note_partitions(conn: psycopg.Connection, topic: str, topic_id: str, partitions: int
                    ) -> tuple[int, ...]:
    """The KTable ``topic`` (the one with ``topic_id``) has ``partitions`` now (recorded if it
    never had): every count it has had, oldest first."""
    with conn.transaction():
        conn.execute(sql.SQL("INSERT INTO {} (topic, topic_id, partitions) VALUES "
                             "(%s, %s, %s) ON CONFLICT DO NOTHING").format(_PARTITION_COUNTS),
                     (topic, topic_id, partitions))
    return partition_history(conn, [topic]).get((topic, topic_id), (partitions,))


def partition_history(conn: psycopg.Connection, topics: Sequence[str]
                      ) -> dict[tuple[str, str], tuple[int, ...]]:
    """Every partition count each of ``topics`` has had (those recorded), oldest first, by
    topic and topic id."""
    rows = conn.execute(sql.SQL(
        "SELECT topic, topic_id, array_agg(partitions ORDER BY seen_at, partitions) FROM {} "
        "WHERE topic = ANY(%s) GROUP BY topic, topic_id").format(_PARTITION_COUNTS),
        (list(topics),)).fetchall()
    return {(topic, topic_id): tuple(counts) for topic, topic_id, counts in rows}


def builds(conn: psycopg.Connection) -> dict[str, int]:
    """The version a replay is building, per projection that has one under way."""
    rows = conn.execute(sql.SQL("SELECT projection, building_version FROM {} "
                                "WHERE building_version IS NOT NULL").format(_TABLE)).fetchall()
    return {name: int(version) for name, version in rows}
