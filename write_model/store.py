"""The Postgres event store: atomic appends with optimistic concurrency, and reads.

An append is one call of the ``eventfold_append`` function (migration 0002) in autocommit
mode: one round trip, one transaction. It checks the expected version, inserts the events and
their outbox rows, deletes the outbox rows (Debezium reads the inserts from the WAL, so the
table stays empty) and records the command's result for idempotent retries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors
from sqlalchemy import Engine, create_engine

from write_model.events import NewEvent, RecordedEvent

CONFLICT_SQLSTATE = "EF409"


class ConcurrencyError(Exception):
    """The stream moved on since it was loaded; nothing was written."""

    def __init__(self, stream_id: str, expected_version: int, current_version: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {current_version}, expected {expected_version}"
        )
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.current_version = current_version


class StreamNotFound(LookupError):
    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} does not exist")
        self.stream_id = stream_id


class DuplicateCommand(Exception):
    """The command id was already executed; ``result`` is what it returned then."""

    def __init__(self, command_id: uuid.UUID, result: AppendResult) -> None:
        super().__init__(f"command {command_id} was already executed")
        self.command_id = command_id
        self.result = result


class StoreUnavailable(Exception):
    """The database cannot be reached; nothing was written. Retrying later is safe."""


@dataclass(frozen=True)
class AppendResult:
    stream_id: str
    version: int
    event_ids: list[uuid.UUID]
    global_positions: list[int]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppendResult:
        return cls(data["stream_id"], int(data["version"]),
                   [uuid.UUID(str(e)) for e in data["event_ids"]],
                   [int(p) for p in data["global_positions"]])


@dataclass(frozen=True)
class StreamAppend:
    """One stream's part of a unit of work."""

    stream_type: str
    stream_id: str
    expected_version: int
    events: Sequence[NewEvent]


@dataclass(frozen=True)
class StoredEvent:
    """The minimum needed to rebuild an aggregate: version, type, schema version, data."""

    stream_version: int
    event_type: str
    schema_version: int
    data: dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    stream_version: int
    state: dict[str, Any]


@dataclass(frozen=True)
class EventPage:
    events: list[RecordedEvent]
    cursor: str
    """Pass back to ``read_all`` for the next page; opaque (transaction id and position)."""


_APPEND = "SELECT eventfold_append(%s, %s, %s, %s::jsonb, %s)"
_LOAD = ("SELECT stream_version, event_type, schema_version, data FROM events "
         "WHERE stream_id = %s AND stream_version > %s ORDER BY stream_version")
_RECORDED_COLUMNS = ("event_id, stream_id, stream_type, stream_version, global_position, "
                     "event_type, schema_version, data, metadata, recorded_at")
_READ_STREAM = (f"SELECT {_RECORDED_COLUMNS} FROM events "
                "WHERE stream_id = %s AND stream_version > %s ORDER BY stream_version")
# Only transactions older than every running one are read, in (transaction, position) order:
# a transaction still running can commit only after them, so a page never skips an event.
_READ_ALL = (f"SELECT tx_id::text::bigint, {_RECORDED_COLUMNS} FROM events "
             "WHERE (tx_id::text::bigint, global_position) > (%s, %s) "
             "AND tx_id < pg_snapshot_xmin(pg_current_snapshot()) "
             "ORDER BY tx_id, global_position LIMIT %s")
_CURRENT_VERSION = "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = %s"
_COMMAND_RESULT = "SELECT result FROM command_log WHERE command_id = %s"
_LOAD_SNAPSHOT = ("SELECT stream_version, state FROM snapshots "
                  "WHERE stream_id = %s AND aggregate_type = %s AND schema_version = %s")
_SAVE_SNAPSHOT = """
INSERT INTO snapshots (stream_id, aggregate_type, schema_version, stream_version, state)
VALUES (%s, %s, %s, %s, %s::jsonb)
ON CONFLICT (stream_id) DO UPDATE SET
    aggregate_type = excluded.aggregate_type, schema_version = excluded.schema_version,
    stream_version = excluded.stream_version, state = excluded.state, recorded_at = now()
WHERE snapshots.stream_version < excluded.stream_version
   OR snapshots.schema_version <> excluded.schema_version
"""


class EventStore:
    """Append-only event storage on Postgres with optimistic concurrency."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(cls, database_url: str, pool_size: int = 10) -> EventStore:
        # Autocommit: an append is one function call, so one statement is one transaction.
        return cls(create_engine(database_url, pool_size=pool_size, max_overflow=pool_size,
                                 isolation_level="AUTOCOMMIT"))

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled psycopg connection; one that lost the server is discarded, not reused."""
        try:
            pooled = self.engine.raw_connection()
        except Exception as exc:
            if _is_unavailable(exc):
                raise StoreUnavailable(f"database unavailable: {_first_line(exc)}") from exc
            raise
        try:
            yield pooled.driver_connection
        except psycopg.OperationalError as exc:
            pooled.invalidate()
            raise StoreUnavailable(f"database unavailable: {_first_line(exc)}") from exc
        finally:
            pooled.close()

    # -- writing ----------------------------------------------------------------------------
    def append(
        self, stream_type: str, stream_id: str, expected_version: int,
        events: Sequence[NewEvent], command_id: uuid.UUID | None = None,
    ) -> AppendResult:
        """Append ``events`` after ``expected_version``; raise ConcurrencyError if it moved on,
        DuplicateCommand (with the first result) if ``command_id`` was executed before."""
        if not events:
            return AppendResult(stream_id, expected_version, [], [])
        with self.connection() as conn:
            return self._append_on(conn, StreamAppend(stream_type, stream_id, expected_version,
                                                      events), command_id)

    def append_many(self, appends: Sequence[StreamAppend],
                    command_id: uuid.UUID | None = None) -> list[AppendResult]:
        """Append to several streams in one transaction: all of them or none."""
        with self.connection() as conn, conn.transaction():
            return [self._append_on(conn, append, command_id if i == 0 else None)
                    for i, append in enumerate(appends)]

    def _append_on(self, conn: psycopg.Connection[Any], append: StreamAppend,
                   command_id: uuid.UUID | None) -> AppendResult:
        payload = json.dumps([
            {"event_id": str(e.event_id), "stream_version": append.expected_version + i,
             "event_type": e.event_type, "schema_version": e.schema_version, "data": e.data,
             "metadata": e.metadata}
            for i, e in enumerate(append.events, start=1)
        ])
        try:
            row = conn.execute(_APPEND, (append.stream_type, append.stream_id,
                                         append.expected_version, payload, command_id)).fetchone()
        except errors.UniqueViolation as exc:
            constraint = exc.diag.constraint_name
            if constraint == "command_log_pkey" and command_id is not None:
                raise DuplicateCommand(command_id, self._command_result(command_id)) from None
            if constraint == "events_stream_id_stream_version_key":
                raise ConcurrencyError(append.stream_id, append.expected_version,
                                       self.current_version(append.stream_id)) from None
            raise
        except psycopg.Error as exc:
            if exc.sqlstate == CONFLICT_SQLSTATE:
                raise ConcurrencyError(append.stream_id, append.expected_version,
                                       int(exc.diag.message_detail or 0)) from None
            raise
        assert row is not None
        return AppendResult.from_json(row[0])

    def save_snapshot(self, stream_id: str, aggregate_type: str, schema_version: int,
                      stream_version: int, state: dict[str, Any]) -> None:
        with self.connection() as conn:
            conn.execute(_SAVE_SNAPSHOT, (stream_id, aggregate_type, schema_version,
                                          stream_version, json.dumps(state)))

    # -- reading ----------------------------------------------------------------------------
    def current_version(self, stream_id: str) -> int:
        with self.connection() as conn:
            row = conn.execute(_CURRENT_VERSION, (stream_id,)).fetchone()
        return int(row[0]) if row else 0

    def command_result(self, command_id: uuid.UUID) -> AppendResult | None:
        with self.connection() as conn:
            row = conn.execute(_COMMAND_RESULT, (command_id,)).fetchone()
        return AppendResult.from_json(row[0]) if row else None

    def _command_result(self, command_id: uuid.UUID) -> AppendResult:
        result = self.command_result(command_id)
        assert result is not None, "a unique violation on the command log means a row exists"
        return result

    def load(self, stream_id: str, after_version: int = 0,
             snapshot_of: tuple[str, int] | None = None,
             ) -> tuple[Snapshot | None, list[StoredEvent]]:
        """What rebuilds an aggregate: its snapshot (if ``snapshot_of`` = (aggregate type,
        state version) matches one) and the events after it."""
        with self.connection() as conn:
            snapshot = None
            if snapshot_of is not None:
                row = conn.execute(_LOAD_SNAPSHOT, (stream_id, *snapshot_of)).fetchone()
                if row and row[0] > after_version:
                    snapshot = Snapshot(int(row[0]), row[1])
                    after_version = snapshot.stream_version
            rows = conn.execute(_LOAD, (stream_id, after_version)).fetchall()
        return snapshot, [StoredEvent(*row) for row in rows]

    def event_identities(self, stream_type: str) -> list[tuple[str, str, int]]:
        """(event id, stream id, stream version) of every event of one aggregate type."""
        with self.connection() as conn:
            rows = conn.execute(
                "SELECT event_id::text, stream_id, stream_version FROM events "
                "WHERE stream_type = %s ORDER BY global_position", (stream_type,)).fetchall()
        return [(str(a), str(b), int(c)) for a, b, c in rows]

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[RecordedEvent]:
        with self.connection() as conn:
            rows = conn.execute(_READ_STREAM, (stream_id, after_version)).fetchall()
        return [RecordedEvent(*row) for row in rows]

    def read_all(self, cursor: str = "", limit: int = 1000) -> EventPage:
        """A page of all events in commit-safe order, from ``cursor`` ("" = the beginning)."""
        tx_id, position = (int(part) for part in cursor.split(":")) if cursor else (0, 0)
        with self.connection() as conn:
            rows = conn.execute(_READ_ALL, (tx_id, position, limit)).fetchall()
        if rows:
            tx_id, position = rows[-1][0], rows[-1][5]
        return EventPage([RecordedEvent(*row[1:]) for row in rows], f"{tx_id}:{position}")


def _is_unavailable(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, psycopg.OperationalError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
