"""What every Spark job of a batch shares: its slices shared out over at most one task per
core, the store a task opens, the known keys it loads chunk by chunk, the summaries the driver
collects."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from eventfold.projections.execution import task_output, worker
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.decode import (
    records_table,
    spark_ddl,
)
from eventfold.projections.execution.writes import TaskClock
from eventfold.projections.outcome import (
    KeyState,
    ParkedKey,
    RawRecords,
    SourceRecord,
)
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore, lookup_rows

RECORD_COLUMNS = SourceRecord._fields
TASK_CHUNK_ROWS = 50_000
FOLD_INPUT = ("topic", "partition", "offset", "key", "value", "reason", "fold_key", "eventId",
              "eventType", "streamVersion", "globalPosition", "recordedAt", "schemaVersion",
              "payload")
SUMMARY_DDL = spark_ddl(task_output.SCHEMA)


class SourceSlice(Protocol):
    """One source partition's records of a batch: a Kafka offset range, a slice of the event
    store. Picklable; runs on an executor, where ``record_chunks`` yields them as Python lists
    (a fold in Python takes them so, Arrow decoding as ``records_table``)."""

    @property
    def rows(self) -> int:
        """At most how many records it holds: what tasks are balanced by."""

    def record_chunks(self, rows: int) -> Iterator[RawRecords]: ...


Tasks = list[list[SourceSlice]]


def per_task(spark: SparkSession, slices: Sequence[SourceSlice], limit: int | None = None
              ) -> tuple[DataFrame, Tasks]:
    """The slices shared out over at most one task per core (or ``limit``), and a DataFrame
    of one row per task (its index), one Spark partition each. Each task has a start-up cost
    on a Python worker (docs/benchmarks.md, "One task per core"), and more tasks than cores
    only run in waves."""
    cores = max(spark.sparkContext.defaultParallelism, 1)
    tasks = share_out(slices, min(cores, limit) if limit else cores)
    return spark.range(0, len(tasks), 1, numPartitions=len(tasks)), tasks


def share_out(slices: Sequence[SourceSlice], cores: int) -> Tasks:
    """``slices`` in at most ``cores`` tasks, the largest first onto the least loaded."""
    tasks: Tasks = [[] for _ in range(min(len(slices), cores))]
    loads = [0] * len(tasks)
    for source_slice in sorted(slices, key=lambda s: s.rows, reverse=True):
        lightest = min(range(len(tasks)), key=lambda i: (loads[i], len(tasks[i])))
        tasks[lightest].append(source_slice)
        loads[lightest] += source_slice.rows
    return tasks


def slices_of_task(batches: Iterator[pa.RecordBatch], tasks: Tasks) -> Iterator[SourceSlice]:
    for batch in batches:
        for index in batch.column("id").to_pylist():
            yield from tasks[index]


def record_chunks(source_slice: SourceSlice, clock: TaskClock,
                  rows: int = TASK_CHUNK_ROWS) -> Iterator[RawRecords]:
    """A slice's records about ``rows`` at a time, what a task folds at once, with the rests
    its batch asks for between them (``TaskClock.next_chunk``)."""
    for records in source_slice.record_chunks(rows):
        clock.next_chunk()
        yield records


def chunks(source_slice: SourceSlice, clock: TaskClock) -> Iterator[pa.Table]:
    """A slice's records in tables: what a task decodes at once."""
    for records in record_chunks(source_slice, clock):
        yield records_table(records)


@contextmanager
def task_store(context: BatchContext) -> Iterator[ReadModelStore]:
    """The batch's version's store, on this Python worker's database connection."""
    with worker.connection(context.database_url) as conn:
        yield ReadModelStore(context.database_url, context.plan.projection, context.version,
                             conn)


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside a task: it builds about a hundred thousand small,
    acyclic objects per partition, which reference counting frees, and each generation-0
    collection would walk all of them (docs/benchmarks.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def collect(results: DataFrame, context: BatchContext) -> StagedBatch:
    """Run the job whose tasks yield their summaries; the batch's counts."""
    return task_output.decode(results.toArrow(), context.attempt)


class KnownKeys:
    """The stored states, watermarks, parked heads and looked-up rows of the keys a task has
    met so far: each chunk loads only the keys it brings new, in one query for states and
    (keyed by aggregate id) watermarks."""

    def __init__(self, store: ReadModelStore, context: BatchContext, clock: TaskClock) -> None:
        self.store = store
        self.context = context
        self.clock = clock
        self.stored: dict[str, KeyState] = {}
        self.watermarks: dict[str, int] = {}
        self.parked: dict[str, ParkedKey] = {}
        self.joined: dict[str, Any] = {}
        self._loaded: set[str] = set()

    @property
    def existing(self) -> dict[str, bool]:
        """The keys that had a row, and whether it was live (not deleted)."""
        return {key: known.state is not None for key, known in self.stored.items()}

    def load(self, keys: set[str], with_watermarks: bool = True) -> None:
        keys = keys - self._loaded
        self._loaded |= keys
        if not keys or self.context.fresh:
            return
        with self.clock.phase("load"):
            self._load(keys, with_watermarks)

    def _load(self, keys: set[str], with_watermarks: bool) -> None:
        states = self.store.load(keys)
        self.stored.update(states)
        if with_watermarks:
            if self.context.plan.watermarks_in_rows:
                self.watermarks.update((key, ks.version) for key, ks in states.items())
            else:
                self.watermarks.update(self.store.watermarks(keys))
        if self.context.any_parked:
            self.parked.update(self.store.parked(keys))

    def watermarks_for(self, streams: list[str]) -> dict[str, int]:
        """The duplicate guard's lookup (``guard.drop_applied``): ``streams``' watermarks,
        loaded with their keys' rows first."""
        self.load(set(streams))
        marks = self.watermarks
        return {stream: marks[stream] for stream in streams if stream in marks}

    def load_lookups(self, keys: set[str]) -> None:
        lookup = self.store.projection.lookup
        keys = keys - self.joined.keys()
        if lookup is not None and keys:
            with self.clock.phase("load"):
                self.joined.update(lookup_rows(self.store.conn, lookup.projection, keys))


def watermarks_of(store: ReadModelStore, context: BatchContext
                  ) -> Callable[[list[str]], dict[str, int]]:
    """The guard's watermark lookup for a task (none to look up in a fresh version)."""
    return (lambda _: {}) if context.fresh else store.watermarks



