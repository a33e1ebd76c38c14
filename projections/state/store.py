"""Sinks of a projection: its Postgres state store (the read model) and its Kafka topics.

Each version of a projection has a state table ``<table>__v<N>`` holding every key it has seen
with its version, deleted keys included (``_deleted``), so the version guard survives a delete,
and a watermark table ``<table>__v<N>_sources`` (last applied version per source stream, the
duplicate guard). Users query the view named after the projection: live rows of the active
version. A batch commits its rows, watermarks, held (parked) events, offsets and batch id in
one transaction, after its KTable rows, dead letters and derived events were produced and
flushed inside it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config, iter_range, offset_of
from eventfold.outbox.topics import (
    COMPACTED_TOPIC_CONFIG,
    EVENT_TOPIC_CONFIG,
    Replication,
    TopicAdmin,
)
from eventfold.projections.definition.projection import Projection
from eventfold.projections.outcome import DeadLetter, FoldOutcome, KeyState, ParkedKey
from eventfold.projections.plan import compile_projection
from eventfold.projections.state.catalog import (
    READER_ROLE,
    Checkpoint,
    claim_batch,
    delete_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from eventfold.projections.state.parking import (
    ParkedKeysReleased,
    drop_parked,
    park,
    parked_counts,
    parked_keys,
    still_parked,
)
from eventfold.projections.state.schema import migrate, sources_table, state_table
from psycopg import sql
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from eventfold.contract import (
    KTABLE_POSITION_HEADER,
    KTABLE_VERSION_HEADER,
    PartitionKey,
    libpq_url,
    trace_of,
)

log = logging.getLogger(__name__)

_MAX_ORIGINALS_SPAN = 100_000
"""Dead letters of one partition further apart than this keep the values the fold rebuilt
(reading the whole span back would cost more than the metadata is worth)."""

SYSTEM_COLUMNS = ("_version", "_position", "_deleted")
Publish = Callable[[Mapping[str, KeyState]], None]


class DeliveryFailed(RuntimeError):
    """A KTable row, dead letter or derived event was refused by the broker: the batch must
    not commit."""


def _names(names: Iterable[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


class ReadModelStore:
    """One version of a projection's state in Postgres: load, guarded upsert, checkpoint."""

    def __init__(self, database_url: str, projection: Projection, version: int) -> None:
        self.projection = projection
        self.plan = compile_projection(projection)
        self.version = version
        self.database_url = database_url
        self.conn = psycopg.connect(libpq_url(database_url))
        self._columns = list(projection.stored_columns)  # declared, and hidden components
        self._table = sql.Identifier(state_table(projection, version))
        self._sources = sql.Identifier(sources_table(projection, version))

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
        with self.conn.transaction():
            # the read API waits on these watermarks for read-your-writes
            self.conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
                self._sources, sql.Identifier(READER_ROLE)))

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
        """).format(view=view, table=self._table, columns=_names(self.projection.columns)))
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(view, sql.Identifier(READER_ROLE)))

    def drop(self, conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(self._table, self._sources))
        delete_checkpoint(conn, self.projection.name, self.version)
        drop_parked(conn, self.projection.name, self.version)

    # -- reads ------------------------------------------------------------------------------
    def load(self, keys: Iterable[str]) -> dict[str, KeyState]:
        keys = list(keys)
        if not keys or not self.projection.has_state:
            return {}
        query = sql.SQL(
            "SELECT key, _version, _position, _deleted, {columns} FROM {table} "
            "WHERE key = ANY(%s)"
        ).format(columns=_names(self._columns), table=self._table)
        states: dict[str, KeyState] = {}
        with self.conn.transaction():
            for key, version, position, deleted, *values in self.conn.execute(query, (keys,)):
                state = None if deleted else dict(zip(self._columns, values, strict=True))
                states[key] = KeyState(state, version, position)
        return states

    def watermarks(self, streams: Iterable[str] | None = None) -> dict[str, int]:
        """Last applied version per source stream: all of them, or those of ``streams``."""
        query = sql.SQL("SELECT stream_id, version FROM {}").format(self._sources)
        with self.conn.transaction():
            if streams is None:
                return dict(self.conn.execute(query).fetchall())
            return dict(self.conn.execute(query + sql.SQL(" WHERE stream_id = ANY(%s)"),
                                          (list(streams),)).fetchall())

    def live_rows(self) -> int | None:
        """Rows in the read model's view; None before the projection first ran."""
        if not self.projection.has_state:
            return None
        with self.conn.transaction():
            exists = self.conn.execute("SELECT to_regclass(%s)", (
                sql.Identifier(self.projection.table).as_string(self.conn),)).fetchone()
            if exists is None or exists[0] is None:
                return None
            row = self.conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(self.projection.table))).fetchone()
        return int(row[0]) if row else 0

    def committed_offsets(self) -> dict[PartitionKey, int]:
        checkpoint = self.checkpoint()
        return checkpoint.offsets if checkpoint else {}

    def checkpoint(self) -> Checkpoint | None:
        return read_checkpoint(self.conn, self.projection.name, self.version)

    def parked_keys(self) -> dict[str, ParkedKey]:
        return parked_keys(self.conn, self.projection.name, self.version)

    def parked_counts(self) -> tuple[int, int]:
        """(keys parked, events they hold)."""
        with self.conn.transaction():
            return parked_counts(self.conn, {self.projection.name: self.version}).get(
                self.projection.name, (0, 0))

    # -- the batch commit -------------------------------------------------------------------
    def commit(self, batch_id: int, outcome: FoldOutcome,
               previous_offsets: Mapping[PartitionKey, int], publish: Publish,
               produce: Callable[[FoldOutcome], None] = lambda _: None) -> None:
        """Rows, watermarks, parked keys and checkpoint in one transaction. ``produce`` sends
        the dead letters and derived events, ``publish`` the final states (KTable), both
        before it commits, so a crash re-runs the batch instead of losing them.

        Raises ``ParkedKeysReleased``, producing nothing, when a key whose events the batch
        held back was retried meanwhile (the retry holds the registry row this claims)."""
        offsets = {**previous_offsets, **outcome.next_offsets}
        name = self.projection.name
        with self.conn.transaction():
            claim_batch(self.conn, name, self.version, offsets)
            if outcome.held:
                released = outcome.held - still_parked(self.conn, name, self.version,
                                                       outcome.held)
                if released:
                    raise ParkedKeysReleased(released)
            produce(outcome)
            final = self.write_states(outcome.changed)
            if outcome.watermarks:
                self.save_watermarks(outcome.watermarks)
            if self.plan.parks and outcome.dead_letters:
                park(self.conn, name, self.version, outcome.dead_letters)
            publish(final)
            save_checkpoint(self.conn, name, self.version, batch_id, offsets, outcome.applied,
                            len(outcome.dead_letters))

    def write_states(self, changed: Mapping[str, KeyState]) -> Mapping[str, KeyState]:
        """In the caller's transaction: the keys' states, guarded; the rows as stored."""
        return self._upsert(changed) if changed else {}

    def save_watermarks(self, watermarks: Mapping[str, int]) -> None:
        stage = sql.Identifier(f"stage_sources_{self.projection.name}")
        self.conn.execute(sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} (stream_id TEXT, version BIGINT) "
            "ON COMMIT DELETE ROWS").format(stage))
        with self.conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(stage)) as copy:
            for stream_id, version in watermarks.items():
                copy.write_row((stream_id, version))
        self.conn.execute(sql.SQL("""
            INSERT INTO {sources} SELECT stream_id, version FROM {stage}
            ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version
            WHERE {sources}.version < excluded.version
        """).format(sources=self._sources, stage=stage))

    def _upsert(self, changed: Mapping[str, KeyState]) -> dict[str, KeyState]:
        """Write the batch's states (a fold) or merge its partial aggregates (an aggregation);
        returns the rows as stored."""
        stage = sql.Identifier(f"stage_{self.projection.name}")
        all_columns = ["key", *self._columns, *SYSTEM_COLUMNS]
        self.conn.execute(sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {stage} "
            "(LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        ).format(stage=stage, table=self._table))
        copy_sql = sql.SQL("COPY {stage} ({columns}) FROM STDIN").format(
            stage=stage, columns=_names(all_columns))
        with self.conn.cursor().copy(copy_sql) as copy:
            for key, key_state in changed.items():
                copy.write_row(self._row(key, key_state))
        updates: sql.Composable
        if not self.plan.aggregates:
            # The guard: a stale or replayed state never overwrites a newer one.
            updates = sql.SQL(", ").join(
                sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c))
                for c in [*self._columns, *SYSTEM_COLUMNS])
            tail = sql.SQL("WHERE {table}._version < excluded._version").format(
                table=self._table)
        else:
            # Every merged row comes back: the KTable gets the stored totals, not the partials.
            updates = self._merge_updates()
            tail = sql.SQL("RETURNING key, _version, _position, {}").format(
                _names(self._columns))
        rows = self.conn.execute(sql.SQL("""
            INSERT INTO {table} ({columns}) SELECT {columns} FROM {stage}
            ON CONFLICT (key) DO UPDATE SET {updates}, _updated_at = now() {tail}
        """).format(table=self._table, stage=stage, columns=_names(all_columns),
                    updates=updates, tail=tail))
        if not self.plan.aggregates:
            return dict(changed)
        declared = self.projection.columns
        return {key: KeyState({c: v for c, v in zip(self._columns, values, strict=True)
                               if c in declared}, version, position)
                for key, version, position, *values in rows}

    def _merge_updates(self) -> sql.Composable:
        """How a batch's partial aggregate merges into the stored one, per column."""
        merges = {column: sql.SQL(function.sql_merge).format(c=sql.Identifier(column),
                                                              t=self._table)
                  for column, function in self.plan.aggregates.items()}
        parts = [sql.SQL("{} = {}").format(sql.Identifier(column), merge)
                 for column, merge in merges.items()]
        # A composite column is finished from its components' merged values (SET expressions
        # read the row as it was, so the merges are spelled out again).
        parts += [sql.SQL("{} = {}").format(sql.Identifier(column), sql.SQL(
            function.finish_sql).format(**{part: sql.SQL("({})").format(merges[stored])
                                           for part, stored in stored_parts.items()}))
                  for column, (function, stored_parts) in self.plan.composites.items()]
        version = ("{t}._version + excluded._version" if self.plan.rekeyed
                   else "greatest({t}._version, excluded._version)")
        parts.append(sql.SQL("_version = " + version).format(t=self._table))
        parts.append(sql.SQL("_position = greatest({t}._position, excluded._position)").format(
            t=self._table))
        return sql.SQL(", ").join(parts)

    def _row(self, key: str, key_state: KeyState) -> list[Any]:
        state = key_state.state or {}
        values = [
            Jsonb(state.get(c)) if c in self.projection.json_columns and state.get(c) is not None
            else state.get(c)
            for c in self._columns
        ]
        return [key, *values, key_state.version, key_state.position, key_state.state is None]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ReadModelStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def lookup_rows(conn: psycopg.Connection, table: str, keys: Iterable[str]) -> dict[str, Any]:
    """Rows of another projection's view by key, as dicts: the table side of a lookup."""
    query = sql.SQL("SELECT key, to_jsonb(t) - 'key' - '_version' - '_position' - "
                    "'_updated_at' FROM {} t WHERE key = ANY(%s)").format(sql.Identifier(table))
    with conn.transaction():
        try:
            return dict(conn.execute(query, (list(keys),)).fetchall())
        except psycopg.errors.UndefinedTable:
            return {}  # the other projection has not run yet: every lookup misses


def ensure_projection_topics(admin: TopicAdmin, projection: Projection, version: int = 1,
                             ktable_config: Mapping[str, str] | None = None,
                             fix: bool = False) -> None:
    """The KTable and dead-letter topics, created if missing and their configs checked:
    a KTable topic that is not compacted would grow forever and restore ever slower."""
    if projection.has_state:
        admin.ensure([projection.ktable_topic_for(version)],
                     {**COMPACTED_TOPIC_CONFIG, **(ktable_config or {})}, kind="ktables",
                     check=True, fix=fix)
    admin.ensure([projection.dead_letter_topic], EVENT_TOPIC_CONFIG, kind="dead_letters",
                 check=True, fix=fix)


class TopicSink:
    """Writes a projection's KTable (latest state per key, tombstones), dead letters and
    derived events."""

    def __init__(self, kafka: KafkaConnection, projection: Projection, version: int,
                 ktable_config: Mapping[str, str] | None = None,
                 replication: Replication | None = None) -> None:
        self.projection = projection
        self.ktable_config = dict(ktable_config or {})
        self.ktable_topic = projection.ktable_topic_for(version)
        self.version = version
        self.kafka = kafka
        self.producer = Producer(kafka.client_config(**{
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "log.connection.close": False,
        }))
        self._admin = TopicAdmin(kafka, replication)
        self._output_topics: set[str] = set()
        self._failures: list[str] = []

    def ensure_topics(self) -> None:
        ensure_projection_topics(self._admin, self.projection, self.version,
                                 self.ktable_config)

    def delete_topics(self, topics: list[str]) -> None:
        self._admin.delete(topics)

    def ensure_outputs(self, outcome: FoldOutcome) -> set[str]:
        """Create the derived-event topics ``outcome`` writes to on first use; returns those
        this sink had not written to before."""
        new_topics = {e.topic for e in outcome.emissions} - self._output_topics
        if new_topics:
            self._admin.ensure(new_topics, EVENT_TOPIC_CONFIG, kind="derived")
            self._output_topics |= new_topics
        return new_topics

    def write_events(self, outcome: FoldOutcome) -> None:
        """Dead letters and derived events (their topics made by ``ensure_outputs``)."""
        originals = self._originals(outcome.dead_letters) if outcome.dead_letters else {}
        for letter in outcome.dead_letters:
            record = letter.record
            original = originals.get((record.topic, record.partition, record.offset))
            self._dead_letter(letter if original is None else DeadLetter(
                record._replace(value=original), letter.reason, letter.fold_key))
        for emission in outcome.emissions:
            self._produce(emission.topic, emission.key, emission.value)

    def write_states(self, states: Mapping[str, KeyState]) -> None:
        """The KTable rows, then a flush of everything: the caller commits only after this."""
        for key, key_state in states.items():
            value = None if key_state.state is None else json.dumps(key_state.state, default=str)
            self._produce(self.ktable_topic, key, value,
                          {KTABLE_VERSION_HEADER: str(key_state.version),
                           KTABLE_POSITION_HEADER: str(key_state.position)})
        remaining = self.producer.flush(60)
        if remaining:
            raise DeliveryFailed(f"{remaining} KTable/DLQ/derived messages not delivered in 60 s")
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryFailed(
                f"projection {self.projection.name}: {len(failures)} message(s) were not "
                f"delivered, so this batch is not committed (it runs again): "
                + "; ".join(failures[:5]))

    def _produce(self, topic: str, key: str | None, value: str | None,
                 headers: dict[str, str | bytes | None] | None = None) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, headers=headers,
                                      on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain, then retry
                self.producer.poll(0.05)
        self.producer.poll(0)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        """The delivery report of every message: a failure fails the batch at its flush."""
        if error is not None:
            self._failures.append(f"{message.topic()} key {message.key()!r}: {error.str()}")

    def close(self) -> None:
        self.producer.flush(10)
        # Spark's callback server keeps the runner alive; let the clients go now.
        del self.producer, self._admin

    def _originals(self, letters: Sequence[DeadLetter]) -> dict[tuple[str, int, int], str]:
        """The dead letters' messages as they are in their topics, metadata included (the
        fold kept only what it decodes): one read per partition over the letters' offsets.
        Best effort: what cannot be read keeps the value the fold rebuilt."""
        spans: dict[PartitionKey, tuple[int, int]] = {}
        for letter in letters:
            key, offset = (letter.record.topic, letter.record.partition), letter.record.offset
            low, high = spans.get(key, (offset, offset))
            spans[key] = (min(low, offset), max(high, offset))
        wanted = {(r.topic, r.partition, r.offset) for r in (letter.record for letter in letters)}
        found: dict[tuple[str, int, int], str] = {}
        consumer = Consumer(consumer_config(self.kafka))
        try:
            for (topic, partition), (low, high) in spans.items():
                if high - low >= _MAX_ORIGINALS_SPAN:
                    continue
                for chunk in iter_range(consumer, (topic, partition), low, high + 1,
                                        stuck_timeout_s=10):
                    for message in chunk:
                        where = (topic, partition, offset_of(message))
                        if where in wanted and (value := message.value()) is not None:
                            found[where] = value.decode("utf-8", "replace")
        except (KafkaException, TimeoutError) as exc:
            log.warning("projection %s: reading dead letters' messages back: %s",
                        self.projection.name, exc)
        finally:
            consumer.close()
        return found

    def _dead_letter(self, letter: DeadLetter) -> None:
        record = letter.record
        event_id, correlation_id = trace_of(record.key, record.value)
        log.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition,
                    record.offset, letter.reason, extra={
                        "projection": self.projection.name, "event_id": event_id,
                        "correlation_id": correlation_id})
        self._produce(
            self.projection.dead_letter_topic, record.key,
            json.dumps({
                "projection": self.projection.name, "version": self.version,
                "error": letter.reason, "topic": record.topic, "partition": record.partition,
                "offset": record.offset, "key": record.key, "fold_key": letter.fold_key,
                "value": record.value,
            }),
        )
