"""Running a projection as a Spark Structured Streaming query.

Each micro-batch: read offset ranges from the source topics (our Kafka data source), fold the
records per key on the driver against the state loaded from the read model, write the KTable
and dead letters (produce + flush), then commit the read model rows with the offsets and batch
id in one Postgres transaction. A crash anywhere replays the batch; the offset and version
guards make the replay a no-op for what was already committed, and KTable re-writes are the
same values again (last value wins).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from outbox.kafka import nest_offsets
from projections.fold import SourceRecord, fold_records
from projections.kafka_source import FORMAT_NAME
from projections.projection import Projection
from projections.sinks import ReadModelStore, TopicSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerSettings:
    bootstrap_servers: str
    database_url: str
    checkpoint_root: Path
    trigger_interval: str = "500 milliseconds"
    max_rows_per_batch: int = 200_000


class ProjectionRunner:
    """One projection, one streaming query, one driver-side writer of its sinks."""

    def __init__(self, spark: SparkSession, projection: Projection,
                 settings: RunnerSettings) -> None:
        self.spark = spark
        self.projection = projection
        self.settings = settings
        self.store = ReadModelStore(settings.database_url, projection)
        self.topics = TopicSink(settings.bootstrap_servers, projection)
        self.batches = 0
        self._progress = _ProgressLog(projection.name)

    @property
    def checkpoint_dir(self) -> Path:
        return self.settings.checkpoint_root / self.projection.name

    def prepare(self) -> None:
        self.store.ensure_schema()
        self.topics.ensure_topics()

    def start(self, once: bool = False) -> StreamingQuery:
        """Start the query: ``once`` catches up with what is there now and stops."""
        self.prepare()
        committed = self.store.committed_offsets()
        starting = json.dumps(nest_offsets(committed)) if committed else "earliest"
        source = (
            self.spark.readStream.format(FORMAT_NAME)
            .option("bootstrap.servers", self.settings.bootstrap_servers)
            .option("topics", ",".join(self.projection.source_topics))
            .option("max_rows_per_batch", str(self.settings.max_rows_per_batch))
            .option("starting_offsets", starting)
            .load()
        )
        writer = (
            source.writeStream.queryName(self.projection.name)
            .option("checkpointLocation", str(self.checkpoint_dir))
            .foreachBatch(self.process_batch)
        )
        writer = writer.trigger(availableNow=True) if once else writer.trigger(
            processingTime=self.settings.trigger_interval)
        log.info("projection %s: %s from %s", self.projection.name,
                 "catching up" if once else "streaming", ", ".join(self.projection.source_topics))
        return writer.start()

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        table = batch.toArrow()
        if table.num_rows == 0:
            return
        committed = self.store.committed_offsets()
        records = sorted(
            (SourceRecord(*row) for row in zip(
                *(table.column(c).to_pylist()
                  for c in ("topic", "partition", "offset", "key", "value")), strict=True)),
            key=lambda r: (r.topic, r.partition, r.offset),
        )
        keys = {r.key for r in records if r.key is not None}
        outcome = fold_records(self.projection, self.store.load(keys), records, committed)
        self.topics.write(outcome)
        self.store.commit(batch_id, outcome, committed)
        self.batches += 1
        elapsed = time.monotonic() - started
        log.debug(
            "projection %s batch %d: %d records, %d applied, %d duplicates, %d already "
            "committed, %d dead letters, %d keys changed in %.2f s",
            self.projection.name, batch_id, len(records), outcome.applied, outcome.duplicates,
            outcome.skipped, len(outcome.dead_letters), len(outcome.changed), elapsed,
        )
        self._progress.add(batch_id, len(records), outcome.applied, outcome.duplicates,
                           len(outcome.dead_letters))

    def close(self) -> None:
        self.topics.close()
        self.store.close()


class _ProgressLog:
    """One INFO line per interval, not per micro-batch: rates, duplicates, dead letters."""

    def __init__(self, name: str, interval_s: float = 10.0) -> None:
        self.name = name
        self.interval_s = interval_s
        self._since = time.monotonic()
        self._first = True
        self._counts = [0, 0, 0, 0, 0]  # batches, records, applied, duplicates, dead letters

    def add(self, batch_id: int, records: int, applied: int, duplicates: int,
            dead_letters: int) -> None:
        for i, value in enumerate((1, records, applied, duplicates, dead_letters)):
            self._counts[i] += value
        elapsed = time.monotonic() - self._since
        if not self._first and elapsed < self.interval_s:
            return
        batches, records, applied, duplicates, dead = self._counts
        log.info("projection %s: %d batches up to #%d, %d records (%.0f/s), %d applied, "
                 "%d duplicates skipped, %d dead letters", self.name, batches, batch_id,
                 records, records / max(elapsed, 1e-6), applied, duplicates, dead)
        self._since, self._first, self._counts = time.monotonic(), False, [0, 0, 0, 0, 0]


def stop_gracefully(query: StreamingQuery, timeout_s: float = 60) -> None:
    """Stop between micro-batches: cancelling one mid-flight only wastes its work (the guards
    make its replay safe, but there is no reason to pay for it)."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()
