"""Reading a projection's sources from the event store in Postgres instead of the topics.

A replay starts here when the topics no longer hold every event from the beginning (their
retention dropped the head): it folds the event store's log up to its newest event, in windows
of global positions, then goes on from the topics (``outbox.history`` explains why that join
needs nothing but the usual duplicate guard).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pyarrow as pa

from outbox.history import STORE_TOPIC, read_history
from projections.fold import PartitionKey
from projections.kafka_source import ARROW_SCHEMA
from projections.sinks import libpq_url

STORE_PARTITION: PartitionKey = (STORE_TOPIC, 0)
"""Where a version's checkpoint keeps the last global position it applied from the store."""


@dataclass(frozen=True)
class StoreSlice:
    """One bucket of stream ids over the positions (after, upto]: what one task reads."""

    database_url: str
    stream_types: tuple[str, ...]
    after: int
    upto: int
    bucket: int
    buckets: int

    def read(self) -> Iterator[pa.RecordBatch]:
        with psycopg.connect(libpq_url(self.database_url)) as conn:
            for rows in read_history(conn, self.stream_types, self.after, self.upto,
                                     self.bucket, self.buckets):
                positions, keys, values, times = zip(*rows, strict=True)
                count = len(rows)
                yield pa.RecordBatch.from_arrays([
                    pa.array([STORE_TOPIC] * count, pa.string()),
                    pa.array([self.bucket] * count, pa.int32()),
                    pa.array(positions, pa.int64()),
                    pa.array(keys, pa.string()),
                    pa.array(values, pa.string()),
                    pa.array(times, pa.timestamp("us", tz="UTC")),
                ], schema=ARROW_SCHEMA)


def store_slices(database_url: str, stream_types: tuple[str, ...], after: int, upto: int,
                 buckets: int) -> list[StoreSlice]:
    return [StoreSlice(database_url, stream_types, after, upto, bucket, buckets)
            for bucket in range(buckets)]
