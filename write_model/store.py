"""The Postgres event store: append with an expected version, events and outbox rows atomically.

One append is one transaction: the events go into ``events`` and, through the same statement,
into ``outbox``; the outbox rows are then deleted before commit. Debezium reads the inserts from
the WAL, so the outbox table stays empty without any cleanup job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import IntegrityError

from write_model.events import NewEvent, RecordedEvent


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


@dataclass(frozen=True)
class AppendResult:
    stream_id: str
    version: int
    event_ids: list[uuid.UUID]
    global_positions: list[int]


# Events and outbox rows in one statement: one round trip, and the expected-version check
# (the WHERE clause) is part of the insert. A concurrent writer that passes the same check
# loses on the unique (stream_id, stream_version) constraint instead.
_APPEND = text("""
WITH new_events AS (
    INSERT INTO events (event_id, stream_id, stream_type, stream_version, event_type, data,
                        metadata)
    SELECT e.event_id, :stream_id, :stream_type, e.stream_version, e.event_type, e.data, e.metadata
    FROM jsonb_to_recordset(CAST(:events AS jsonb))
        AS e(event_id uuid, stream_version bigint, event_type text, data jsonb, metadata jsonb)
    WHERE (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :stream_id)
          = :expected_version
    RETURNING event_id, stream_version, event_type, data, global_position, recorded_at
)
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload,
                    stream_version, global_position, recorded_at)
SELECT event_id, :stream_type, :stream_id, event_type, data,
       stream_version, global_position, recorded_at
FROM new_events
RETURNING id, stream_version, global_position
""")
_CLEAR_OUTBOX = text("DELETE FROM outbox WHERE id = ANY(:ids)")
_CURRENT_VERSION = text(
    "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :stream_id"
)
_READ_STREAM = text("""
SELECT event_id, stream_id, stream_type, stream_version, global_position, event_type,
       data, metadata, recorded_at
FROM events WHERE stream_id = :stream_id AND stream_version > :after_version
ORDER BY stream_version
""")


class EventStore:
    """Append-only event storage on Postgres with optimistic concurrency."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def from_url(cls, database_url: str, pool_size: int = 10) -> EventStore:
        # No pre-ping: it costs a round trip per command. A dead pooled connection fails the
        # command with OperationalError (503 over HTTP) and is discarded by the pool.
        return cls(create_engine(database_url, pool_size=pool_size, max_overflow=pool_size))

    def append(
        self,
        stream_type: str,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
    ) -> AppendResult:
        """Append ``events`` after ``expected_version``; raise ConcurrencyError if it moved on."""
        if not events:
            return AppendResult(stream_id, expected_version, [], [])
        payload = json.dumps([
            {"event_id": str(e.event_id), "stream_version": expected_version + i,
             "event_type": e.event_type, "data": e.data, "metadata": e.metadata}
            for i, e in enumerate(events, start=1)
        ])
        params = {"stream_id": stream_id, "stream_type": stream_type,
                  "expected_version": expected_version, "events": payload}
        try:
            with self.engine.begin() as conn:
                rows = conn.execute(_APPEND, params).all()
                if not rows:
                    conn.rollback()
                    raise ConcurrencyError(stream_id, expected_version,
                                           self.current_version(stream_id))
                conn.execute(_CLEAR_OUTBOX, {"ids": [row.id for row in rows]})
        except IntegrityError as exc:
            if "events_stream_id_stream_version_key" not in str(exc.orig):
                raise
            raise ConcurrencyError(
                stream_id, expected_version, self.current_version(stream_id)
            ) from None
        rows.sort(key=lambda row: row.stream_version)
        return AppendResult(
            stream_id=stream_id,
            version=rows[-1].stream_version,
            event_ids=[row.id for row in rows],
            global_positions=[row.global_position for row in rows],
        )

    def current_version(self, stream_id: str) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(_CURRENT_VERSION, {"stream_id": stream_id}).scalar_one())

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[RecordedEvent]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                _READ_STREAM, {"stream_id": stream_id, "after_version": after_version}
            ).mappings().all()
        return [RecordedEvent(**_as_dict(row)) for row in rows]


def _as_dict(row: Any) -> dict[str, Any]:
    return dict(row)
