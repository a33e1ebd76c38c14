"""The jobs of a fold projection's batch: folded where it is read (a fold keyed by aggregate
id over one topic) or after a shuffle by key; each task folds its keys and writes them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from eventfold.projections.definition.projection import Event
from eventfold.projections.execution import task_output
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.decode import (
    decode_events,
    decoded_event,
    decoded_schema,
    spark_ddl,
)
from eventfold.projections.execution.executor import executor_task
from eventfold.projections.execution.fold import BatchFold, KeyFolder, lookup_keys
from eventfold.projections.execution.guard import drop_applied
from eventfold.projections.execution.jobs import (
    FOLD_INPUT,
    SUMMARY_DDL,
    KnownKeys,
    SourceSlice,
    Tasks,
    chunks,
    collect,
    paused_gc,
    per_task,
    record_chunks,
    slices_of_task,
    task_store,
    watermarks_of,
)
from eventfold.projections.execution.writes import TaskClock, TaskWriter
from eventfold.projections.outcome import (
    DeadLetter,
    FoldOutcome,
    SourceRecord,
)
from eventfold.projections.plan import Plan
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore


def run_fold_in_place(spark: SparkSession, slices: Sequence[SourceSlice],
                      context: BatchContext) -> StagedBatch:
    """Fold where the data is, as a Kafka Streams task does: the key is the aggregate id, so
    every event of a key sits in one source partition. The task that reads a partition folds
    it and writes it: no shuffle, no sort (offset order is stream order)."""
    if not slices:
        return StagedBatch(context.attempt)
    rows, tasks = per_task(spark, slices, context.tasks)
    return collect(rows.mapInArrow(lambda batches: read_and_fold_task(batches, tasks, context),
                                   SUMMARY_DDL), context)


@executor_task
def read_and_fold_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                       context: BatchContext) -> Iterator[pa.RecordBatch]:
    with paused_gc():
        yield task_output.encode(fold_slices(slices_of_task(batches, tasks), context))


def fold_slices(slices: Iterable[SourceSlice], context: BatchContext) -> StagedBatch:
    """One task's work: read, fold and write ``slices``; its counts."""
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
    for records in record_chunks(source_slice, clock):
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
    rows, tasks = per_task(spark, slices, context.tasks)
    return rows.mapInArrow(lambda batches: decode_task(batches, tasks, context),
                           spark_ddl(schema))


@executor_task
def decode_task(batches: Iterator[pa.RecordBatch], tasks: Tasks,
                context: BatchContext) -> Iterator[pa.RecordBatch]:
    clock = TaskClock(context.rest_ratio)
    with paused_gc(), task_store(context) as store:
        watermarks = watermarks_of(store, context)
        for source_slice in slices_of_task(batches, tasks):
            for records in chunks(source_slice, clock):
                events = decode_events(records, context.plan)
                yield from drop_applied(events, watermarks).to_batches()


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
        yield task_output.encode(writer.finish())


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
         stream_version, position, recorded_at, schema_version, payload) in zip(
            *(rows[c] for c in FOLD_INPUT), strict=True):
        if reason is None:
            record, event, reason = decoded_event(topic, partition, offset, stream_id, value,
                                                  event_id, event_type, stream_version,
                                                  position, recorded_at, schema_version,
                                                  payload)
        else:
            record, event = SourceRecord(topic, partition, offset, stream_id, value), None
        if event is None:
            outcome.dead_letters.append(DeadLetter(record, reason or "undecodable"))
            continue
        yield key, (record, event)


