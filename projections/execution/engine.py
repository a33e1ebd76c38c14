"""The Spark jobs of one micro-batch: read and decode per partition, guard, re-key, fold, and
write where it was folded.

The streaming query plans the micro-batches (offset ranges, checkpoint, trigger). Each batch's
records are read by Spark tasks, at most one per core, that decode them (``decode``), so raw
JSON never crosses into the JVM. Then, per pipeline (``plan.Pipeline``):

- a fold keyed by aggregate id over one topic: the task that reads a partition folds it from
  the raw records (``run_fold_in_place``), every event of a key being in that partition;
- any other fold: Spark shuffles the decoded events by key, and each task folds its keys
  (``run_fold``);
- an aggregation keyed by aggregate id: the reading task aggregates its partition in Arrow
  (``partial``) and merges that into the stored rows; re-keyed, Spark aggregates after a
  shuffle and the task holding a key merges it (``run_aggregation``).

Every task loads the stored states (with their watermarks, and whether their keys are parked)
of the keys it meets, one query per chunk, and writes what it folded (``writes.TaskWriter``):
it stages the changed rows for the batch's commit and produces the KTable records, derived
events and dead letters itself. The driver gets each task's counts: O(tasks), whatever the
number of keys.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import groupby
from operator import itemgetter
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from eventfold.projections.definition.aggregates import AggregateFunction
from eventfold.projections.definition.projection import Event
from eventfold.projections.execution import task_output, worker
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.decode import (
    decode_events,
    decoded_event,
    decoded_schema,
    field_column,
    records_table,
    spark_ddl,
    spark_records_table,
)
from eventfold.projections.execution.executor import executor_task
from eventfold.projections.execution.fold import BatchFold, KeyFolder, lookup_keys
from eventfold.projections.execution.guard import EVENT_IDENTITY, drop_applied
from eventfold.projections.execution.partial import (
    DEAD_LETTER_COLUMNS,
    GROUP,
    PartitionAggregate,
    merge_into_stored,
    partial_schema,
    slot,
    stream_marks,
)
from eventfold.projections.execution.writes import TaskClock, TaskWriter
from eventfold.projections.outcome import (
    DeadLetter,
    FoldOutcome,
    KeyState,
    ParkedKey,
    RawRecords,
    SourceRecord,
)
from eventfold.projections.plan import Pipeline, Plan
from eventfold.projections.state.store import ReadModelStore, StagedBatch, lookup_rows
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from eventfold.contract import PartitionKey

RECORD_COLUMNS = SourceRecord._fields
TASK_CHUNK_ROWS = 50_000
FOLD_INPUT = ("topic", "partition", "offset", "key", "value", "reason", "fold_key", "eventId",
              "eventType", "streamVersion", "globalPosition", "recordedAt", "payload")
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


def _per_task(spark: SparkSession, slices: Sequence[SourceSlice], limit: int | None = None
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


def _slices_of_task(batches: Iterator[pa.RecordBatch], tasks: Tasks) -> Iterator[SourceSlice]:
    for batch in batches:
        for index in batch.column("id").to_pylist():
            yield from tasks[index]


def _chunks(source_slice: SourceSlice, rows: int = TASK_CHUNK_ROWS) -> Iterator[pa.Table]:
    """A slice's records in tables of about ``rows``: what a task decodes at once."""
    for records in source_slice.record_chunks(rows):
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


def fold_on_driver(slices: Sequence[SourceSlice], context: BatchContext,
                   pipeline: Pipeline) -> StagedBatch:
    """A small batch of a pipeline that folds where it reads, as one task on the driver's
    thread: a Spark job has a fixed price (docs/benchmarks.md) above a few hundred records'
    fold. What it stages and produces, and the commit after it, are those of Spark's tasks."""
    if pipeline is Pipeline.AGGREGATE_IN_PLACE:
        summary = aggregate_slices(slices, context,
                                   partial_schema(context.plan, decoded_schema(context.plan)))
    else:
        summary = fold_slices(slices, context)
    return task_output.decode(pa.Table.from_batches([summary]), context.attempt)


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


# -- fold projections ----------------------------------------------------------------------

def run_fold_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                      context: BatchContext) -> StagedBatch:
    """Fold where the data is, as a Kafka Streams task does: the key is the aggregate id, so
    every event of a key sits in one source partition. The task that reads a partition folds
    it and writes it: no shuffle, no sort (offset order is stream order)."""
    if not slices:
        return StagedBatch(context.attempt)
    rows, tasks = _per_task(spark, slices, context.tasks)
    return collect(rows.mapInArrow(lambda batches: read_and_fold_task(batches, tasks, context),
                                   SUMMARY_DDL), context)


@executor_task
def read_and_fold_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                       context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc():
        yield fold_slices(_slices_of_task(batches, tasks), context)


def fold_slices(slices: Iterable[SourceSlice], context: BatchContext) -> pa.RecordBatch:
    """One task's work: read, fold and write ``slices``; its summary."""
    with task_store(context) as store:
        writer = TaskWriter(store, context)
        for source_slice in slices:
            writer.add(*fold_slice(source_slice, store, context, writer.clock))
        return writer.finish()


def fold_slice(source_slice: SourceSlice, store: ReadModelStore, context: BatchContext,
               clock: TaskClock) -> tuple[FoldOutcome, dict[str, bool]]:
    """Read, decode and fold one partition's records chunk by chunk (the states carry over);
    the outcome and the keys that had a row."""
    known = KnownKeys(store, context, clock)
    batch = BatchFold(context.plan, context.committed, known.watermarks, context.emit_from,
                      known.parked)
    for records in source_slice.record_chunks(TASK_CHUNK_ROWS):
        clock.saw(records)
        known.load(records.stream_ids())
        with clock.phase("fold"):
            batch.add(records)
        known.load_lookups(batch.lookup_keys())
        with clock.phase("fold"):
            batch.fold(known.stored, known.joined)
    return batch.outcome, known.existing


def read_events(spark: SparkSession, slices: Sequence[SourceSlice],
                context: BatchContext) -> DataFrame:
    """The batch's decoded events not applied before, as a DataFrame, read by at most one task
    per core."""
    schema = decoded_schema(context.plan)
    if not slices:
        return spark.createDataFrame([], spark_ddl(schema))
    rows, tasks = _per_task(spark, slices, context.tasks)
    return rows.mapInArrow(lambda batches: decode_task(batches, tasks, context),
                           spark_ddl(schema))


@executor_task
def decode_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc(), task_store(context) as store:
        watermarks = watermarks_of(store, context)
        for source_slice in _slices_of_task(batches, tasks):
            for records in _chunks(source_slice):
                events = decode_events(records, context.plan)
                yield from drop_applied(events, watermarks).to_batches()


def decode_records(records: DataFrame, context: BatchContext) -> DataFrame:
    """Records another reader gave Spark (its own Kafka source: ``topic, partition, offset``,
    binary ``key, value``), decoded like ``read_events``' and guarded the same way, less what
    the store committed before (a batch Spark runs again after a crash)."""
    columns = records.select("topic", "partition", "offset", "key", "value")
    return columns.mapInArrow(lambda batches: decode_records_task(batches, context),
                              spark_ddl(decoded_schema(context.plan)))


@executor_task
def decode_records_task(batches: Iterator[pa.RecordBatch],
                        context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc(), task_store(context) as store:
        watermarks = watermarks_of(store, context)
        for batch in batches:
            records = unapplied(spark_records_table(batch), context.committed)
            if records.num_rows:
                events = decode_events(records, context.plan)
                yield from drop_applied(events, watermarks).to_batches()


def unapplied(records: pa.Table, committed: dict[PartitionKey, int] | Any) -> pa.Table:
    """The records at or after the offset the store committed for their partition."""
    if not committed:
        return records
    names = [f"{topic}\x00{partition}" for topic, partition in committed]
    at = pc.index_in(pc.binary_join_element_wise(
        records.column("topic"), pc.cast(records.column("partition"), pa.string()), "\x00"),
        value_set=pa.array(names, pa.string()))
    first = pc.fill_null(pc.take(pa.array(list(committed.values()), pa.int64()), at), 0)
    return records.filter(pc.greater_equal(records.column("offset"), first))


def run_fold(events: DataFrame, context: BatchContext) -> StagedBatch:
    """Shuffle by key; each task folds and writes its keys."""
    ordered = (events.repartition("fold_key")
               .sortWithinPartitions("fold_key", "globalPosition")
               .select(*FOLD_INPUT))
    return collect(ordered.mapInArrow(lambda batches: fold_task(batches, context),
                                      SUMMARY_DDL), context)


@executor_task
def fold_task(batches: Iterator[pa.RecordBatch], context: BatchContext
              ) -> Iterator[pa.RecordBatch]:
    """One executor task after the shuffle: fold the keys of this partition (rows arrive
    sorted by key) and write them."""
    with paused_gc(), task_store(context) as store:
        writer = TaskWriter(store, context)
        rows = columns(pa.Table.from_batches(list(batches)))
        if rows and rows["key"]:
            writer.add(*_fold_sorted(rows, store, context, writer.clock))
        yield writer.finish()


def _fold_sorted(rows: dict[str, list[Any]], store: ReadModelStore, context: BatchContext,
                 clock: TaskClock) -> tuple[FoldOutcome, dict[str, bool]]:
    plan, outcome = context.plan, FoldOutcome()
    keyed = list(decoded_rows(rows, outcome))
    known = KnownKeys(store, context, clock)
    # the decode task guarded the streams; parked heads and states come per key
    known.load({key for key, _ in keyed}, with_watermarks=False)
    known.load_lookups(lookup_keys(plan.projection, (event for _, (_, event) in keyed)))
    with clock.phase("fold"):
        fold_keyed(plan, keyed, known, context, outcome)
    return outcome, known.existing


def fold_keyed(plan: Plan, keyed: Sequence[tuple[str, tuple[SourceRecord, Event]]],
               known: KnownKeys, context: BatchContext, outcome: FoldOutcome) -> None:
    """Fold events grouped by key (each key's events in position order) onto their stored
    states, joined with the looked-up rows."""
    folder = KeyFolder(plan, outcome, context.emit_from, known.parked)
    for key, group in groupby(keyed, key=itemgetter(0)):
        folder.fold(key, known.stored.get(key), [item for _, item in group], known.joined)


def columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


def decoded_rows(rows: dict[str, list[Any]], outcome: FoldOutcome
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


# -- aggregation projections -----------------------------------------------------------------

def run_aggregation_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                             context: BatchContext) -> StagedBatch:
    """Aggregate where the data is: each task reads, decodes, dedupes and aggregates its
    partition in Arrow (``partial``), merges that into the stored rows and writes them."""
    plan = context.plan
    if not slices:
        return StagedBatch(context.attempt)
    schema = partial_schema(plan, decoded_schema(plan))
    rows, tasks = _per_task(spark, slices, context.tasks)
    return collect(rows.mapInArrow(
        lambda batches: aggregate_task(batches, tasks, context, schema), SUMMARY_DDL), context)


@executor_task
def aggregate_task(batches: Iterator[pa.RecordBatch], tasks: Tasks, context: BatchContext,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    with paused_gc():
        yield aggregate_slices(_slices_of_task(batches, tasks), context, schema)


def aggregate_slices(slices: Iterable[SourceSlice], context: BatchContext,
                     schema: pa.Schema) -> pa.RecordBatch:
    """One task's work: read, aggregate and write ``slices``; its summary."""
    with task_store(context) as store:
        writer = TaskWriter(store, context)
        watermarks = watermarks_of(store, context)
        for source_slice in slices:
            partition = PartitionAggregate(context.plan, schema)
            for raw in source_slice.record_chunks(TASK_CHUNK_ROWS):
                writer.clock.saw(raw)
                events = decode_events(records_table(raw), context.plan)
                with writer.clock.phase("load"):
                    events = drop_applied(events, watermarks)
                with writer.clock.phase("fold"):
                    partition.add(events)
            partials = partition.result()
            writer.add(*_merged(partials, partials.filter(
                pc.equal(partials.column("kind"), "dlq")), store, context, writer.clock))
        return writer.finish()


def _merged(partials: pa.Table, letters: pa.Table, store: ReadModelStore,
            context: BatchContext, clock: TaskClock) -> tuple[FoldOutcome, dict[str, bool]]:
    """A task's partials merged into the stored rows of their keys, and its dead letters, as
    an outcome; and the keys that had a row."""
    rows = partials.filter(pc.equal(partials.column("kind"), "partial"))
    keys = rows.column(GROUP).to_pylist()
    stored: dict[str, KeyState] = {}
    if not context.fresh:
        with clock.phase("load"):
            for start in range(0, len(keys), TASK_CHUNK_ROWS):
                stored.update(store.load(keys[start:start + TASK_CHUNK_ROWS]))
    with clock.phase("fold"):
        return aggregate_outcome(partials, letters, stored, context.plan), {
            key: known.state is not None for key, known in stored.items()}


def aggregate_outcome(partials: pa.Table, letters: pa.Table, stored: Mapping[str, KeyState],
                      plan: Plan) -> FoldOutcome:
    """Partials (``partial`` rows, and ``mark`` rows of a re-keyed aggregation's streams)
    merged into the ``stored`` rows of their keys, and dead letters, as an outcome."""
    outcome = FoldOutcome()
    for row in letters.to_pylist():
        outcome.dead_letters.append(DeadLetter(
            SourceRecord(*(row[c] for c in RECORD_COLUMNS)), row["reason"]))
    kinds = partials.column("kind")
    merged = merge_into_stored(partials.filter(pc.equal(kinds, "partial")), stored, plan)
    for row in merged.to_pylist():
        outcome.changed[row[GROUP]] = KeyState(
            plan.finish({name: row[slot(name)] for name in plan.aggregates}), row["_version"],
            row["_position"])
        outcome.applied += row["_events"]
    outcome.published.update(outcome.changed)
    for stream, version in stream_marks(partials, plan).items():
        outcome.see(stream, version)
    return outcome


def run_aggregation(events: DataFrame, context: BatchContext) -> StagedBatch:
    """Partial aggregates per key for this batch, computed by Spark after one shuffle; the
    task that holds a key merges it into the stored row and writes it. Dead letters ride
    along as groups of their own. A re-keyed aggregation's streams' watermarks are staged by
    a job of their own."""
    plan = context.plan
    letter = F.col("reason").isNotNull()
    group = F.when(letter, F.concat_ws("/", F.lit("\u0000dlq"), "topic", "partition", "offset")
                   ).otherwise(F.col("fold_key"))
    position = F.col("globalPosition")
    aggregates = [function.spark(_value(function), position).alias(slot(name))
                  for name, function in plan.aggregates.items()]
    version = F.count(F.lit(1)) if plan.rekeyed else F.max("streamVersion")
    # A (stream, version) twice in one batch counts once; every dead letter is a group of its
    # own. Both copies of an event have one key, so one shuffle by group serves the dedupe and
    # the aggregation.
    partial = (events.withColumn("_group", group).repartition("_group")
               .dropDuplicates(["_group", *EVENT_IDENTITY])
               .groupBy("_group").agg(
                   *aggregates, version.alias("_version"),
                   F.max("globalPosition").alias("_position"),
                   F.count(F.lit(1)).alias("_events"),
                   F.first("fold_key").alias(GROUP), F.first("reason").alias("reason"),
                   *(F.first(c).alias(f"_{c}") for c in RECORD_COLUMNS)))
    staged = collect(partial.mapInArrow(lambda batches: merge_task(batches, context),
                                        SUMMARY_DDL), context)
    if plan.rekeyed:
        # Re-keyed: a key gathers many streams, so their watermarks take a job of their own.
        marks = (events.where(~letter).groupBy("key").agg(F.max("streamVersion").alias("v"))
                 .mapInArrow(lambda batches: marks_task(batches, context), SUMMARY_DDL))
        staged.add(collect(marks, context))
    return staged


@executor_task
def merge_task(batches: Iterator[pa.RecordBatch], context: BatchContext
               ) -> Iterator[pa.RecordBatch]:
    """One task after Spark's aggregation: its keys' partials merged into the stored rows,
    written."""
    with paused_gc(), task_store(context) as store:
        writer = TaskWriter(store, context)
        table = pa.Table.from_batches(list(batches))
        if table.num_rows:
            groups = table.filter(pc.is_null(table.column("reason")))
            letters = table.filter(pc.is_valid(table.column("reason")))
            letters = letters.select([f"_{c}" for c in RECORD_COLUMNS] + ["reason"]
                                     ).rename_columns(DEAD_LETTER_COLUMNS)
            partials = groups.append_column("kind", pa.array(["partial"] * groups.num_rows))
            writer.add(*_merged(partials, letters, store, context, writer.clock))
        yield writer.finish()


@executor_task
def marks_task(batches: Iterator[pa.RecordBatch], context: BatchContext
               ) -> Iterator[pa.RecordBatch]:
    """Stage the streams' watermarks (``key``, ``v``) a re-keyed aggregation met."""
    with task_store(context) as store:
        writer = TaskWriter(store, context)
        outcome = FoldOutcome()
        for batch in batches:
            for stream, version in zip(batch.column("key").to_pylist(),
                                       batch.column("v").to_pylist(), strict=True):
                outcome.see(stream, version)
        writer.add(outcome, {})
        yield writer.finish()


def _value(function: AggregateFunction) -> Column:
    """The decoded column a function aggregates (its field's, or a constant to count)."""
    return F.lit(1) if function.field is None else F.col(field_column(function.field))
