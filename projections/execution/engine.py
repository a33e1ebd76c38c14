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

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from eventfold.projections.execution.aggregate_jobs import (
    aggregate_slices,
    run_aggregation,
    run_aggregation_in_place,
)
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.decode import (
    decoded_schema,
)
from eventfold.projections.execution.fold_jobs import (
    fold_slices,
    read_events,
    run_fold,
    run_fold_in_place,
)
from eventfold.projections.execution.jobs import SourceSlice
from eventfold.projections.execution.partial import (
    partial_schema,
)
from eventfold.projections.plan import Pipeline, Plan
from eventfold.projections.state.stage import StagedBatch

__all__ = ["SourceSlice", "fold_on_driver", "read_events", "run_aggregation",
           "run_aggregation_in_place", "run_fold", "run_fold_in_place"]


def fold_on_driver(slices: Sequence[SourceSlice], context: BatchContext,
                   pipeline: Pipeline) -> StagedBatch:
    """A small batch of a pipeline that folds where it reads, as one task on the driver's
    thread: a Spark job has a fixed price (docs/benchmarks.md) above a few hundred records'
    fold. What it stages and produces, and the commit after it, are those of Spark's tasks."""
    if pipeline is Pipeline.AGGREGATE_IN_PLACE:
        return aggregate_slices(slices, context,
                                partial_schema(context.plan, decoded_schema(context.plan)))
    return fold_slices(slices, context)


def warm_python_workers(spark: SparkSession, plan: Plan) -> None:
    """Start a Python worker per core with what a batch's tasks load (the fold's modules,
    and the app's, by unpickling ``plan``): a standby does so while it waits, so that its
    first batch after a takeover meets warm workers (the first use of a worker costs
    seconds)."""
    cores = max(spark.sparkContext.defaultParallelism, 1)

    def touch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        assert plan.projection is not None and fold_slices is not None
        yield from batches

    spark.range(0, cores, 1, numPartitions=cores).mapInArrow(touch, "id long").collect()
