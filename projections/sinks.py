"""Sinks of a projection: its Postgres read model (the state store) and its Kafka topics.

The read model table holds every key the projection has seen with its last applied stream
version, deleted keys included (``_deleted``), so the version guard survives a delete. Users
query the view named after the projection, which shows live rows only. The batch checkpoint
(offsets, batch id) commits in the same transaction as the rows it describes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.types import JSON

from outbox import TopicAdmin
from outbox.kafka import flatten_offsets, nest_offsets
from outbox.topics import COMPACTED_TOPIC_CONFIG, EVENT_TOPIC_CONFIG
from projections.fold import DeadLetter, FoldOutcome, KeyState, PartitionKey
from projections.projection import Projection
from write_model.schema import PROJECTION_CHECKPOINTS_TABLE

log = logging.getLogger(__name__)

SYSTEM_COLUMNS = ("_version", "_position", "_deleted")


def libpq_url(database_url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as a libpq connection string."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(
        hide_password=False)


def physical_table(projection: Projection) -> str:
    return f"{projection.table}__state"


class ReadModelStore:
    """The projection's state in Postgres: load by key, upsert with a version guard."""

    def __init__(self, database_url: str, projection: Projection) -> None:
        self.projection = projection
        self.conn = psycopg.connect(libpq_url(database_url))
        self._columns = list(projection.columns)
        self._json_columns = {
            name for name, col_type in projection.columns.items() if isinstance(col_type, JSON)
        }

    def ensure_schema(self) -> None:
        table, view = sql.Identifier(physical_table(self.projection)), sql.Identifier(
            self.projection.table)
        dialect = postgresql.dialect()
        column_defs = [
            sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(col.compile(dialect=dialect)))
            for name, col in self.projection.columns.items()
        ]
        with self.conn.transaction():
            self.conn.execute(sql.SQL("""
                CREATE TABLE IF NOT EXISTS {table} (
                    key TEXT PRIMARY KEY, {columns},
                    _version BIGINT NOT NULL, _position BIGINT NOT NULL,
                    _deleted BOOLEAN NOT NULL DEFAULT false,
                    _updated_at TIMESTAMPTZ NOT NULL DEFAULT now())
            """).format(table=table, columns=sql.SQL(", ").join(column_defs)))
            self.conn.execute(sql.SQL("""
                CREATE OR REPLACE VIEW {view} AS
                SELECT key, {columns}, _version, _position, _updated_at
                FROM {table} WHERE NOT _deleted
            """).format(view=view, table=table, columns=self._column_list(self._columns)))

    @staticmethod
    def _column_list(names: Iterable[str]) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(n) for n in names)

    def load(self, keys: Iterable[str]) -> dict[str, KeyState]:
        keys = list(keys)
        if not keys:
            return {}
        query = sql.SQL(
            "SELECT key, _version, _position, _deleted, {columns} FROM {table} "
            "WHERE key = ANY(%s)"
        ).format(columns=self._column_list(self._columns),
                 table=sql.Identifier(physical_table(self.projection)))
        states: dict[str, KeyState] = {}
        with self.conn.transaction():
            for key, version, position, deleted, *values in self.conn.execute(query, (keys,)):
                state = None if deleted else dict(zip(self._columns, values, strict=True))
                states[key] = KeyState(state, version, position)
        return states

    def live_rows(self) -> int | None:
        """Rows in the read model's view; None before the projection first ran."""
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
        if checkpoint is None:
            return {}
        return flatten_offsets(checkpoint["offsets"])

    def checkpoint(self) -> dict[str, Any] | None:
        with self.conn.transaction():
            row = self.conn.execute(
                sql.SQL("SELECT batch_id, offsets, events_applied, dead_letters, updated_at "
                        "FROM {} WHERE projection = %s").format(
                    sql.Identifier(PROJECTION_CHECKPOINTS_TABLE)),
                (self.projection.name,),
            ).fetchone()
        if row is None:
            return None
        return dict(zip(("batch_id", "offsets", "events_applied", "dead_letters", "updated_at"),
                        row, strict=True))

    def commit(self, batch_id: int, outcome: FoldOutcome,
               previous_offsets: Mapping[PartitionKey, int]) -> None:
        """Upsert changed keys and the checkpoint in one transaction."""
        offsets = nest_offsets({**previous_offsets, **outcome.next_offsets})
        with self.conn.transaction():
            if outcome.changed:
                self._upsert(outcome.changed)
            self.conn.execute(
                sql.SQL("""
                    INSERT INTO {table} (projection, batch_id, offsets, events_applied,
                                         dead_letters, updated_at)
                    VALUES (%s, %s, %s, %s, %s, now())
                    ON CONFLICT (projection) DO UPDATE SET
                        batch_id = excluded.batch_id, offsets = excluded.offsets,
                        events_applied = {table}.events_applied + excluded.events_applied,
                        dead_letters = {table}.dead_letters + excluded.dead_letters,
                        updated_at = now()
                """).format(table=sql.Identifier(PROJECTION_CHECKPOINTS_TABLE)),
                (self.projection.name, batch_id, Jsonb(offsets), outcome.applied,
                 len(outcome.dead_letters)),
            )

    def _upsert(self, changed: Mapping[str, KeyState]) -> None:
        table = sql.Identifier(physical_table(self.projection))
        stage = sql.Identifier(f"stage_{self.projection.name}")
        all_columns = ["key", *self._columns, *SYSTEM_COLUMNS]
        self.conn.execute(sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {stage} "
            "(LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        ).format(stage=stage, table=table))
        copy_sql = sql.SQL("COPY {stage} ({columns}) FROM STDIN").format(
            stage=stage, columns=self._column_list(all_columns))
        with self.conn.cursor().copy(copy_sql) as copy:
            for key, key_state in changed.items():
                copy.write_row(self._row(key, key_state))
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = excluded.{c}").format(c=sql.Identifier(c))
            for c in [*self._columns, *SYSTEM_COLUMNS]
        )
        # The guard: a stale or replayed state never overwrites a newer one.
        self.conn.execute(sql.SQL("""
            INSERT INTO {table} ({columns}) SELECT {columns} FROM {stage}
            ON CONFLICT (key) DO UPDATE SET {updates}, _updated_at = now()
            WHERE {table}._version < excluded._version
        """).format(table=table, stage=stage, columns=self._column_list(all_columns),
                    updates=updates))

    def _row(self, key: str, key_state: KeyState) -> list[Any]:
        state = key_state.state or {}
        values = [
            Jsonb(state.get(c)) if c in self._json_columns and state.get(c) is not None
            else state.get(c)
            for c in self._columns
        ]
        return [key, *values, key_state.version, key_state.position, key_state.state is None]

    def close(self) -> None:
        self.conn.close()


def ensure_projection_topics(admin: TopicAdmin, projection: Projection) -> None:
    admin.ensure([projection.ktable_topic], COMPACTED_TOPIC_CONFIG)
    admin.ensure([projection.dead_letter_topic], EVENT_TOPIC_CONFIG)


class TopicSink:
    """Writes a projection's KTable (latest state per key, tombstones) and its dead letters."""

    def __init__(self, bootstrap_servers: str, projection: Projection) -> None:
        self.projection = projection
        self.producer = Producer({
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            "log.connection.close": False,
        })
        self._admin = TopicAdmin(bootstrap_servers)

    def ensure_topics(self) -> None:
        ensure_projection_topics(self._admin, self.projection)

    def write(self, outcome: FoldOutcome) -> None:
        """Produce and flush; the caller commits the read model only after this returns."""
        for key, key_state in outcome.changed.items():
            value = None if key_state.state is None else json.dumps(key_state.state)
            self.producer.produce(
                self.projection.ktable_topic, key=key, value=value,
                headers={"eventfold.version": str(key_state.version),
                         "eventfold.position": str(key_state.position)},
            )
            self.producer.poll(0)
        for letter in outcome.dead_letters:
            self._dead_letter(letter)
        remaining = self.producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} KTable/DLQ messages not delivered in 60 s")

    def close(self) -> None:
        self.producer.flush(10)
        # Spark's callback server keeps the runner alive; let the clients go now.
        del self.producer, self._admin

    def _dead_letter(self, letter: DeadLetter) -> None:
        record = letter.record
        log.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition,
                    record.offset, letter.reason)
        self.producer.produce(
            self.projection.dead_letter_topic, key=record.key,
            value=json.dumps({
                "projection": self.projection.name, "error": letter.reason,
                "topic": record.topic, "partition": record.partition, "offset": record.offset,
                "key": record.key, "value": record.value,
            }),
        )
