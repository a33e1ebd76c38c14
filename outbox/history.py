"""The event store's global log as the events the outbox connector puts on the event topics.

Kafka topics keep events for their retention period; the event store keeps them forever. A
consumer that must start from the very beginning after the topics dropped their head (a replay
of a projection) reads the head here instead, with the fields of the envelope the connector
writes, and then goes on from the topics: events it sees twice are the same events, with the
same stream versions, so its usual duplicate guard applies.

Records read here come from ``STORE_TOPIC``: the partition is a bucket of stream ids (every
event of a stream in one bucket, as every event of a key is in one Kafka partition; a bucket
is read through an index of its own) and the offset is the event's global position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from eventfold.write_model.persistence.schema import EVENTS_TABLE, STREAM_BUCKET, STREAM_BUCKETS

STORE_TOPIC = "eventfold.event-store"
__all__ = ["STORE_TOPIC", "STREAM_BUCKETS", "HistoryRow", "bucket_query", "count_events",
           "head_position", "read_history"]
_EVENTS = sql.Identifier(EVENTS_TABLE)
# An event's columns, the record time rendered as Debezium's EventRouter renders it: an
# ISO-8601 UTC string without trailing zeros. No envelope: building one in Postgres (JSON with
# the payload as escaped text) cost more than reading the rows, and its reader would parse it
# back (docs/benchmarks.md, "A replay from the event store").
_COLUMNS = sql.SQL("""global_position, stream_id, event_id::text, event_type, stream_version,
    rtrim(rtrim(to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'),
          '.') || 'Z',
    data::text, schema_version""")
_IN_SLICE = sql.SQL("stream_type = ANY(%(types)s) AND global_position > %(after)s "
                    "AND global_position <= %(upto)s")
HistoryRow = tuple[int, str, str, str, int, str, str, int]
"""(global position, stream id, event id, event type, stream version, record time, payload
JSON, schema version): what the connector's envelope carries, less the metadata, which folds
never read."""


def head_position(conn: psycopg.Connection) -> int:
    """The global position of the newest event (0 for an empty store)."""
    row = conn.execute(sql.SQL("SELECT coalesce(max(global_position), 0) FROM {}")
                       .format(_EVENTS)).fetchone()
    return int(row[0]) if row else 0


def count_events(conn: psycopg.Connection, stream_types: Sequence[str], after: int,
                 upto: int) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(_EVENTS, _IN_SLICE),
                       {"types": list(stream_types), "after": after, "upto": upto}).fetchone()
    return int(row[0]) if row else 0


def read_history(conn: psycopg.Connection, stream_types: Sequence[str], after: int, upto: int,
                 bucket: int, chunk: int = 20_000) -> Iterator[list[HistoryRow]]:
    """Events of ``stream_types`` at positions (after, upto] in stream bucket ``bucket``, in
    position order, in chunks: one range of the bucket's index."""
    with conn.transaction(), conn.cursor(name="eventfold_history") as cursor:
        cursor.execute(*bucket_query(stream_types, after, upto, bucket))
        while rows := cursor.fetchmany(chunk):
            yield rows


def bucket_query(stream_types: Sequence[str], after: int, upto: int,
                 bucket: int) -> tuple[sql.Composed, dict[str, Any]]:
    """``read_history``'s query and its parameters."""
    query = sql.SQL("""
        SELECT {columns} FROM {events}
        WHERE {bucket_of_stream} = %(bucket)s AND {in_slice}
        ORDER BY global_position
    """).format(columns=_COLUMNS, events=_EVENTS, in_slice=_IN_SLICE,
                bucket_of_stream=sql.SQL(STREAM_BUCKET.replace("%", "%%")))
    return query, {"types": list(stream_types), "after": after, "upto": upto, "bucket": bucket}
