"""The Spark plan of one micro-batch: read and decode per partition, guard, re-key, fold.

The streaming query plans the micro-batches (offset ranges, checkpoint, trigger). Each batch's
records are read by Spark tasks, at most one per core, that decode them in Arrow
(``decode``), so raw JSON never crosses into the JVM. The watermark guard, re-keying and the
shuffle by key are native Spark. Then, per kind:

- fold: each executor task sorts its keys' events by position, loads their stored states
  (and looked-up rows) from Postgres, runs the plain-Python ``KeyFolder`` and returns only the
  changed states, dead letters, derived events and watermarks: O(keys), not O(events), reach
  the driver. A fold keyed by aggregate id over one topic skips the shuffle: the task that
  reads a partition folds it from the raw records (``run_fold_in_place``);
- aggregation: each task that reads a partition aggregates it per key in Arrow
  (``partial``) and the driver merges the partials; a batch with a stream in two partitions
  is aggregated by Spark after a shuffle instead. The store merges the result in SQL.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from eventfold.projections.definition.aggregates import AggregateFunction
from eventfold.projections.definition.projection import Event
from eventfold.projections.execution import task_output
from eventfold.projections.execution.decode import (
    decode_events,
    decoded_event,
    decoded_schema,
    field_column,
    records_table,
    spark_ddl,
    spark_records_table,
)
from eventfold.projections.execution.fold import BatchFold, KeyFolder, lookup_keys
from eventfold.projections.execution.guard import EVENT_IDENTITY, drop_applied
from eventfold.projections.execution.partial import (
    DEAD_LETTER_COLUMNS,
    PartitionAggregate,
    merge_partials,
    partial_schema,
    slot,
    stream_marks,
)
from eventfold.projections.outcome import (
    DeadLetter,
    FoldOutcome,
    KeyState,
    ParkedKey,
    RawRecords,
    SourceRecord,
)
from eventfold.projections.plan import Plan
from eventfold.projections.state.store import ReadModelStore, lookup_rows
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from eventfold.contract import PartitionKey

RECORD_COLUMNS = SourceRecord._fields
TASK_CHUNK_ROWS = 50_000
FOLD_INPUT = ("topic", "partition", "offset", "key", "value", "reason", "fold_key", "eventId",
              "eventType", "streamVersion", "globalPosition", "recordedAt", "payload")
OUTPUT_DDL = spark_ddl(task_output.SCHEMA)


class SourceSlice(Protocol):
    """One source partition's records of a batch: a Kafka offset range, a slice of the event
    store. Picklable; runs on an executor, where ``record_chunks`` yields them as Python lists
    (a fold in Python takes them so, Arrow decoding as ``records_table``)."""

    @property
    def rows(self) -> int:
        """At most how many records it holds: what tasks are balanced by."""

    def record_chunks(self, rows: int) -> Iterator[RawRecords]: ...


@dataclass(frozen=True)
class BatchContext:
    """What an executor task needs besides its rows: picklable, no connections."""

    plan: Plan
    version: int
    database_url: str
    emit_from: Mapping[PartitionKey, int] | None
    committed: Mapping[PartitionKey, int]
    parked: Mapping[str, ParkedKey] = field(default_factory=dict)
    """Keys parked behind an event their fold could not apply: their events are held."""


def read_events(spark: SparkSession, slices: Sequence[SourceSlice],
                context: BatchContext) -> DataFrame:
    """The batch's decoded events not applied before, as a DataFrame, read by at most one task
    per core."""
    schema = decoded_schema(context.plan)
    if not slices:
        return spark.createDataFrame([], spark_ddl(schema))
    rows, tasks = _per_task(spark, slices)
    return rows.mapInArrow(lambda batches: decode_task(batches, tasks, context),
                           spark_ddl(schema))


Tasks = list[list[SourceSlice]]


def _per_task(spark: SparkSession, slices: Sequence[SourceSlice]) -> tuple[DataFrame, Tasks]:
    """The slices shared out over at most one task per core, and a DataFrame of one row per
    task (its index), one Spark partition each. Each task has a start-up cost on a Python
    worker (docs/benchmarks.md, "One task per core"), and more tasks than cores only run in
    waves."""
    tasks = share_out(slices, max(spark.sparkContext.defaultParallelism, 1))
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


def _slices_of_task(batches: Iterator[pa.RecordBatch], tasks: Tasks) -> Iterator[SourceSlice]:
    for batch in batches:
        for index in batch.column("id").to_pylist():
            yield from tasks[index]


def _chunks(source_slice: SourceSlice, rows: int = TASK_CHUNK_ROWS) -> Iterator[pa.Table]:
    """A slice's records in tables of about ``rows``: what a task decodes at once."""
    for records in source_slice.record_chunks(rows):
        yield records_table(records)


def decode_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc(), _store(context) as store:
        for source_slice in _slices_of_task(batches, tasks):
            for records in _chunks(source_slice):
                events = decode_events(records, context.plan)
                yield from drop_applied(events, store.watermarks).to_batches()


def decode_records(records: DataFrame, context: BatchContext) -> DataFrame:
    """Records another reader gave Spark (its own Kafka source: ``topic, partition, offset``,
    binary ``key, value``), decoded like ``read_events``' and guarded the same way, less what
    the store committed before (a batch run again after a crash)."""
    columns = records.select("topic", "partition", "offset", "key", "value")
    return columns.mapInArrow(lambda batches: decode_records_task(batches, context),
                              spark_ddl(decoded_schema(context.plan)))


def decode_records_task(batches: Iterator[pa.RecordBatch],
                        context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc(), _store(context) as store:
        for batch in batches:
            records = unapplied(spark_records_table(batch), context.committed)
            if records.num_rows:
                events = decode_events(records, context.plan)
                yield from drop_applied(events, store.watermarks).to_batches()


def unapplied(records: pa.Table, committed: Mapping[PartitionKey, int]) -> pa.Table:
    """The records at or after the offset the store committed for their partition."""
    if not committed:
        return records
    names = [f"{topic}\x00{partition}" for topic, partition in committed]
    at = pc.index_in(pc.binary_join_element_wise(
        records.column("topic"), pc.cast(records.column("partition"), pa.string()), "\x00"),
        value_set=pa.array(names, pa.string()))
    first = pc.fill_null(pc.take(pa.array(list(committed.values()), pa.int64()), at), 0)
    return records.filter(pc.greater_equal(records.column("offset"), first))


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


# -- fold projections --------------------------------------------------------------------------

def run_fold(events: DataFrame, context: BatchContext) -> FoldOutcome:
    """Shuffle by key, fold on the executors, gather the O(keys) results on the driver."""
    ordered = (events.repartition("fold_key")
               .sortWithinPartitions("fold_key", "globalPosition")
               .select(*FOLD_INPUT))
    results = ordered.mapInArrow(lambda batches: fold_task(batches, context), OUTPUT_DDL)
    return task_output.decode(results.toArrow())


def fold_task(batches: Iterator[pa.RecordBatch], context: BatchContext) -> Iterator[pa.RecordBatch]:
    """One executor task after the shuffle: fold the keys of this partition (rows arrive
    sorted by key)."""
    with paused_gc():
        rows = columns(pa.Table.from_batches(list(batches)))
        if rows and rows["key"]:
            yield _fold_sorted(rows, context)


def _fold_sorted(rows: dict[str, list[Any]], context: BatchContext) -> pa.RecordBatch:
    plan, outcome = context.plan, FoldOutcome()
    keyed = list(decoded_rows(rows, outcome))
    with _store(context) as store:
        known = KnownKeys(store)
        known.load({key for key, _ in keyed}, with_watermarks=False)  # the decode task guarded
        known.load_lookups(lookup_keys(plan.projection, (event for _, (_, event) in keyed)))
    fold_keyed(plan, keyed, known.stored, known.joined, context, outcome)
    return task_output.encode(outcome)


def fold_keyed(plan: Plan, keyed: Sequence[tuple[str, tuple[SourceRecord, Event]]],
               stored: Mapping[str, KeyState], rows: Mapping[str, Any],
               context: BatchContext, outcome: FoldOutcome) -> None:
    """Fold events grouped by key (each key's events in position order) onto ``stored``,
    joined with the looked-up ``rows``."""
    folder = KeyFolder(plan, outcome, context.emit_from, context.parked)
    for key, group in groupby(keyed, key=itemgetter(0)):
        folder.fold(key, stored.get(key), [item for _, item in group], rows)


def _store(context: BatchContext) -> ReadModelStore:
    return ReadModelStore(context.database_url, context.plan.projection, context.version)


def run_fold_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                      context: BatchContext) -> FoldOutcome:
    """Fold where the data is, as a Kafka Streams task does: the key is the aggregate id, so
    every event of a key sits in one source partition. The task that reads a partition folds
    it: no shuffle, no sort (offset order is stream order)."""
    if not slices:
        return FoldOutcome()
    rows, tasks = _per_task(spark, slices)
    results = rows.mapInArrow(lambda batches: read_and_fold_task(batches, tasks, context),
                              OUTPUT_DDL)
    return task_output.decode(results.toArrow())


def read_and_fold_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                       context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc():
        for source_slice in _slices_of_task(batches, tasks):
            yield fold_slice(source_slice, context)


def fold_slice(source_slice: SourceSlice, context: BatchContext) -> pa.RecordBatch:
    """Read, decode and fold one partition's records chunk by chunk (the states carry over);
    the task's output rows."""
    with _store(context) as store:
        known = KnownKeys(store)
        batch = BatchFold(context.plan, context.committed, known.watermarks,
                          context.emit_from, context.parked)
        for records in source_slice.record_chunks(TASK_CHUNK_ROWS):
            known.load(records.stream_ids(), with_watermarks=True)
            batch.add(records)
            known.load_lookups(batch.lookup_keys())
            batch.fold(known.stored, known.joined)
    return task_output.encode(batch.outcome)


class KnownKeys:
    """The stored states, watermarks and looked-up rows of the keys a task has met so far:
    each chunk loads only the keys it brings new."""

    def __init__(self, store: ReadModelStore) -> None:
        self.store = store
        self.stored: dict[str, KeyState] = {}
        self.watermarks: dict[str, int] = {}
        self.joined: dict[str, Any] = {}
        self._loaded: set[str] = set()

    def load(self, keys: set[str], with_watermarks: bool) -> None:
        keys = keys - self._loaded
        if keys:
            self.stored.update(self.store.load(keys))
            if with_watermarks:
                self.watermarks.update(self.store.watermarks(keys))
        self._loaded |= keys

    def load_lookups(self, keys: set[str]) -> None:
        lookup = self.store.projection.lookup
        keys = keys - self.joined.keys()
        if lookup is not None and keys:
            self.joined.update(lookup_rows(self.store.conn, lookup.projection, keys))


def columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def decoded_rows(rows: Mapping[str, Sequence[Any]], outcome: FoldOutcome
             ) -> Iterator[tuple[str, tuple[SourceRecord, Event]]]:
    """The shuffled rows' events with their keys, in row order; the rows that do not decode
    go to ``outcome`` as dead letters."""
    for (topic, partition, offset, stream_id, value, reason, key, event_id, event_type,
         stream_version, position, recorded_at, payload) in zip(
            *(rows[c] for c in FOLD_INPUT), strict=True):
        if reason is None:
            record, event, reason = decoded_event(topic, partition, offset, stream_id, value,
                                                  event_id, event_type, stream_version,
                                                  position, recorded_at, payload)
        else:
            record, event = SourceRecord(topic, partition, offset, stream_id, value), None
        if event is None:
            outcome.dead_letters.append(DeadLetter(record, reason or "undecodable"))
            continue
        yield key, (record, event)


# -- aggregation projections -------------------------------------------------------------------

def run_aggregation_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                             context: BatchContext) -> FoldOutcome | None:
    """Aggregate where the data is: each task reads, decodes, dedupes and aggregates its
    partition in Arrow (``partial``), and the driver merges the O(keys) partials. None when
    a stream was split across partitions: then only ``run_aggregation`` is exact."""
    plan = context.plan
    if not slices:
        return FoldOutcome()
    schema = partial_schema(plan, decoded_schema(plan))
    rows, tasks = _per_task(spark, slices)
    partials = rows.mapInArrow(lambda batches: aggregate_task(batches, tasks, context, schema),
                               spark_ddl(schema)).toArrow()
    return aggregation_outcome(partials, plan)


def aggregation_outcome(partials: pa.Table, plan: Plan) -> FoldOutcome | None:
    """The tasks' partials merged into the batch's outcome (None: see ``merge_partials``)."""
    merged = merge_partials(partials, plan)
    if merged is None:
        return None
    return _aggregation_outcome(
        merged.to_pylist(), partials.filter(pc.equal(partials.column("kind"), "dlq")),
        stream_marks(partials, plan), plan)


def aggregate_task(batches: Iterator[pa.RecordBatch], tasks: Tasks, context: BatchContext,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    with paused_gc(), _store(context) as store:
        for source_slice in _slices_of_task(batches, tasks):
            partition = PartitionAggregate(context.plan, schema)
            for records in _chunks(source_slice):
                partition.add(drop_applied(decode_events(records, context.plan),
                                           store.watermarks))
            yield from partition.result().to_batches()


def _aggregation_outcome(groups: list[dict[str, Any]], letters: pa.Table,
                         marks: Mapping[str, int], plan: Plan) -> FoldOutcome:
    """A batch's merged partial aggregates (``fold_key``, its columns, ``_version``,
    ``_position``, ``_events``), dead letters and stream marks as an outcome."""
    outcome = FoldOutcome()
    for row in letters.to_pylist():
        outcome.dead_letters.append(DeadLetter(
            SourceRecord(*(row[c] for c in RECORD_COLUMNS)), row["reason"]))
    for row in groups:
        outcome.changed[row["fold_key"]] = KeyState(
            plan.finish({name: row[slot(name)] for name in plan.aggregates}), row["_version"],
            row["_position"])
        outcome.applied += row["_events"]
    for stream, version in marks.items():
        outcome.see(stream, version)
    return outcome


def run_aggregation(events: DataFrame, plan: Plan) -> FoldOutcome:
    """Partial aggregates per key for this batch, computed by Spark in one job; the store
    merges them into the stored rows. Dead letters ride along as groups of their own."""
    letter = F.col("reason").isNotNull()
    group = F.when(letter, F.concat_ws("/", F.lit("\u0000dlq"), "topic", "partition", "offset")
                   ).otherwise(F.col("fold_key"))
    position = F.col("globalPosition")
    columns = [function.spark(_value(function), position).alias(slot(name))
               for name, function in plan.aggregates.items()]
    version = F.count(F.lit(1)) if plan.rekeyed else F.max("streamVersion")
    # A (stream, version) twice in one batch counts once; every dead letter is a group of its
    # own. Both copies of an event have one key, so one shuffle by group serves the dedupe and
    # the aggregation.
    partial = (events.withColumn("_group", group).repartition("_group")
               .dropDuplicates(["_group", *EVENT_IDENTITY])
               .groupBy("_group").agg(
                   *columns, version.alias("_version"),
                   F.max("globalPosition").alias("_position"),
                   F.count(F.lit(1)).alias("_events"),
                   F.first("fold_key").alias("fold_key"), F.first("reason").alias("reason"),
                   *(F.first(c).alias(f"_{c}") for c in RECORD_COLUMNS))
               .toArrow())
    groups = partial.filter(pc.is_null(partial.column("reason")))
    letters = partial.filter(pc.is_valid(partial.column("reason")))
    letters = letters.select([f"_{c}" for c in RECORD_COLUMNS] + ["reason"]).rename_columns(
        DEAD_LETTER_COLUMNS)
    if not plan.rekeyed:
        marks = dict(zip(groups.column("fold_key").to_pylist(),
                         groups.column("_version").to_pylist(), strict=True))
    else:
        # Re-keyed: a key gathers many streams, so their watermarks take a job of their own.
        marks = {row["key"]: row["v"] for row in events.where(~letter).groupBy("key")
                 .agg(F.max("streamVersion").alias("v")).toArrow().to_pylist()}
    return _aggregation_outcome(groups.to_pylist(), letters, marks, plan)


def _value(function: AggregateFunction) -> Column:
    """The decoded column a function aggregates (its field's, or a constant to count)."""
    return F.lit(1) if function.field is None else F.col(field_column(function.field))
