"""The jobs of an aggregation projection's batch: aggregated in Arrow where it is read, or
re-keyed and aggregated by Spark after a shuffle; the task holding a key merges it into the
stored row and writes it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from eventfold.projections.definition.aggregates import AggregateFunction
from eventfold.projections.execution import task_output
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.decode import (
    decode_events,
    decoded_schema,
    field_column,
    records_table,
)
from eventfold.projections.execution.executor import executor_task
from eventfold.projections.execution.guard import EVENT_IDENTITY, drop_applied
from eventfold.projections.execution.jobs import (
    RECORD_COLUMNS,
    SUMMARY_DDL,
    KnownKeys,
    SourceSlice,
    Tasks,
    collect,
    paused_gc,
    per_task,
    record_chunks,
    slices_of_task,
    task_store,
)
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
    SourceRecord,
)
from eventfold.projections.plan import Plan
from eventfold.projections.state.stage import StagedBatch


def run_aggregation_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                             context: BatchContext) -> StagedBatch:
    """Aggregate where the data is: each task reads, decodes, dedupes and aggregates its
    partition in Arrow (``partial``), merges that into the stored rows and writes them."""
    plan = context.plan
    if not slices:
        return StagedBatch(context.attempt)
    schema = partial_schema(plan, decoded_schema(plan))
    rows, tasks = per_task(spark, slices, context.tasks)
    return collect(rows.mapInArrow(
        lambda batches: aggregate_task(batches, tasks, context, schema), SUMMARY_DDL), context)


@executor_task
def aggregate_task(batches: Iterator[pa.RecordBatch], tasks: Tasks, context: BatchContext,
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    with paused_gc():
        yield task_output.encode(aggregate_slices(slices_of_task(batches, tasks), context,
                                                  schema))


def aggregate_slices(slices: Iterable[SourceSlice], context: BatchContext,
                     schema: pa.Schema) -> StagedBatch:
    """One task's work: read, aggregate and write ``slices``; its counts."""
    with task_store(context) as store:
        writer = TaskWriter(store, context)
        for source_slice in slices:
            # A key is its stream here: the rows loaded for the duplicate guard, chunk by
            # chunk, are the rows the partials merge into (one query per key, not two).
            known = KnownKeys(store, context, writer.clock)
            partition = PartitionAggregate(context.plan, schema)
            for raw in record_chunks(source_slice, writer.clock):
                writer.clock.saw(raw)
                events = decode_events(records_table(raw), context.plan)
                events = drop_applied(events, known.watermarks_for)
                with writer.clock.phase("fold"):
                    partition.add(events)
            partials = partition.result()
            writer.add(*_merged(partials, partials.filter(
                pc.equal(partials.column("kind"), "dlq")), known.stored, context.plan,
                writer.clock))
        return writer.finish()


def _merged(partials: pa.Table, letters: pa.Table, loaded: Mapping[str, KeyState], plan: Plan,
            clock: TaskClock) -> tuple[FoldOutcome, dict[str, bool]]:
    """A task's partials merged into the stored rows of their keys (of ``loaded``), and its
    dead letters, as an outcome; and the keys that had a row."""
    keys = partials.filter(pc.equal(partials.column("kind"), "partial")).column(GROUP)
    stored = {key: loaded[key] for key in keys.to_pylist() if key in loaded}
    with clock.phase("fold"):
        return aggregate_outcome(partials, letters, stored, plan), {
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
            known = KnownKeys(store, context, writer.clock)
            known.load(set(groups.column(GROUP).to_pylist()), with_watermarks=False)
            writer.add(*_merged(partials, letters, known.stored, context.plan, writer.clock))
        yield task_output.encode(writer.finish())


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
        yield task_output.encode(writer.finish())


def _value(function: AggregateFunction) -> Column:
    """The decoded column a function aggregates (its field's, or a constant to count)."""
    return F.lit(1) if function.field is None else F.col(field_column(function.field))
