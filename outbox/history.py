"""The event store's global log as the events the outbox connector puts on the event topics.

Kafka topics keep events for their retention period; the event store keeps them forever. A
consumer that must start from the very beginning after the topics dropped their head (a replay
of a projection) reads the head here instead, with the fields of the envelope the connector
writes, and then goes on from the topics: events it sees twice are the same events, with the
same stream versions, so its usual duplicate guard applies.

Records read here come from ``STORE_TOPIC``: the partition is a bucket of stream ids (every
event of a stream in one bucket, as every event of a key is in one Kafka partition) and the
offset is the event's global position.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import psycopg
from eventfold.write_model.persistence.schema import EVENTS_TABLE
from psycopg import sql

STORE_TOPIC = "eventfold.event-store"
_EVENTS = sql.Identifier(EVENTS_TABLE)
# An event's columns, the record time rendered as Debezium's EventRouter renders it: an
# ISO-8601 UTC string without trailing zeros. No envelope: building one in Postgres (JSON with
# the payload as escaped text) cost more than reading the rows, and its reader would parse it
# back (docs/benchmarks.md, "A replay from the event store").
_COLUMNS = sql.SQL("""global_position, stream_id, event_id::text, event_type, stream_version,
    rtrim(rtrim(to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), '0'),
          '.') || 'Z',
    data::text""")
_IN_SLICE = sql.SQL("stream_type = ANY(%(types)s) AND global_position > %(after)s "
                    "AND global_position <= %(upto)s")
HistoryRow = tuple[int, str, str, str, int, str, str]
"""(global position, stream id, event id, event type, stream version, record time, payload
JSON): what the connector's envelope carries, less the metadata, which folds never read."""


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
                 bucket: int = 0, buckets: int = 1,
                 chunk: int = 20_000) -> Iterator[list[HistoryRow]]:
    """Events of ``stream_types`` at positions (after, upto] whose stream falls in ``bucket``
    of ``buckets``, in position order, in chunks."""
    query = sql.SQL("""
        SELECT {columns} FROM {events}
        WHERE {in_slice} AND (hashtext(stream_id) & 2147483647) %% %(buckets)s = %(bucket)s
        ORDER BY global_position
    """).format(columns=_COLUMNS, events=_EVENTS, in_slice=_IN_SLICE)
    params = {"types": list(stream_types), "after": after, "upto": upto, "bucket": bucket,
              "buckets": buckets}
    with conn.transaction(), conn.cursor(name="eventfold_history") as cursor:
        cursor.execute(query, params)
        while rows := cursor.fetchmany(chunk):
            yield rows
