"""Reading a projection's sources from the event store in Postgres instead of the topics.

A replay starts here when the topics no longer hold every event from the beginning (their
retention dropped the head): it folds the event store's log up to its newest event, in windows
of global positions, then goes on from the topics (``outbox.history`` explains why that join
needs nothing but the usual duplicate guard).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from eventfold.contract import PartitionKey, envelope_value
from eventfold.outbox.history import STORE_TOPIC, STREAM_BUCKETS, HistoryRow, read_history
from eventfold.projections.definition.projection import Event
from eventfold.projections.execution import worker
from eventfold.projections.execution.fold import loads_json, new_tuple
from eventfold.projections.outcome import RawRecords

STORE_PARTITION: PartitionKey = (STORE_TOPIC, 0)
"""Where a version's checkpoint keeps the last global position it applied from the store."""


@dataclass(frozen=True)
class StoreSlice:
    """One stream bucket of the log over the positions (after, upto]: what a task reads, by
    the bucket's index, disjoint from every other slice."""

    database_url: str
    stream_types: tuple[str, ...]
    after: int
    upto: int
    bucket: int

    @property
    def rows(self) -> int:
        """At most how many events it holds: its share of the window, the buckets being alike."""
        return (self.upto - self.after) // STREAM_BUCKETS + 1

    def record_chunks(self, rows: int) -> Iterator[RawRecords]:
        """The slice's events as records, decoded, about ``rows`` at a time."""
        with worker.connection(self.database_url, "history") as conn:
            for chunk in read_history(conn, self.stream_types, self.after, self.upto,
                                      self.bucket, chunk=rows):
                yield self._records(chunk)

    def _records(self, rows: list[HistoryRow]) -> RawRecords:
        positions: list[int] = []
        keys: list[str] = []
        values: list[str | None] = []
        events: list[Event | None] = []
        for row in rows:
            (position, stream_id, event_id, event_type, version, recorded_at, payload,
             schema_version) = row
            data = loads_json(payload)
            positions.append(position)
            keys.append(stream_id)
            if type(data) is dict:
                values.append(None)
                events.append(new_tuple(Event, (event_type, data, stream_id, version,
                                                event_id, position, recorded_at, None,
                                                schema_version)))
            else:  # for the decoder to name as a dead letter, as it came in
                values.append(envelope_value(event_id, event_type, version, position,
                                             recorded_at, payload, schema_version))
                events.append(None)
        return RawRecords(STORE_TOPIC, self.bucket, positions, keys, values, events=events)


def store_slices(database_url: str, stream_types: tuple[str, ...], after: int,
                 upto: int) -> list[StoreSlice]:
    """The window (after, upto] of the log, one slice per stream bucket."""
    return [StoreSlice(database_url, stream_types, after, upto, bucket)
            for bucket in range(STREAM_BUCKETS)]
