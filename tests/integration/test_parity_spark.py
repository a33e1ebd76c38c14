"""Parity of the plain-Python harness with Spark: random logs (hypothesis) folded by every
pipeline Spark runs, in two batches through the real read model store (its SQL merge of
aggregates, its per-key guard, its watermarks), come out as the reference fold of the whole
log: the same states, versions and positions per key, emissions and dead letters.

The records reach the tasks from memory instead of Kafka (the sources are tested elsewhere),
so each example costs a few Spark jobs, not a topic.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count

import psycopg
import pytest
from eventfold.projections import Pipeline, Plan, compile_projection, fold_records
from eventfold.projections.execution.engine import (
    BatchContext,
    read_events,
    run_aggregation,
    run_aggregation_in_place,
    run_fold,
    run_fold_in_place,
)
from eventfold.projections.execution.fold import by_partition
from eventfold.projections.outcome import FoldOutcome, KeyState, RawRecords, SourceRecord
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from hypothesis import HealthCheck, given, settings
from psycopg import sql

from eventfold import migrations
from eventfold.contract import PartitionKey, libpq_url
from tests.parity import LOOKUP_ROWS, Step, comparable, kinds, long_logs, records_of

_examples = count()
EXAMPLES = int(os.environ.get("EVENTFOLD_PARITY_EXAMPLES", "3"))
"""Random logs per pipeline: each costs a few Spark jobs, so CI runs a few; set more to hunt."""


@dataclass(frozen=True)
class MemorySlice:
    """One partition's records of a batch, from memory: a ``SourceSlice`` for tests."""

    records: tuple[SourceRecord, ...]

    @property
    def rows(self) -> int:
        return len(self.records)

    def record_chunks(self, rows: int) -> Iterator[RawRecords]:
        for start in range(0, len(self.records), rows):
            yield from by_partition(self.records[start:start + rows])


def run_pipeline(spark, pipeline: Pipeline, slices: Sequence[MemorySlice],
                 context: BatchContext) -> FoldOutcome:
    if pipeline is Pipeline.FOLD_IN_PLACE:
        return run_fold_in_place(spark, slices, context)
    if pipeline is Pipeline.AGGREGATE_IN_PLACE:
        outcome = run_aggregation_in_place(spark, slices, context)
        assert outcome is not None, "every stream is in one partition"
        return outcome
    events = read_events(spark, slices, context)
    if pipeline is Pipeline.AGGREGATE_AFTER_SHUFFLE:
        return run_aggregation(events, context.plan)
    return run_fold(events, context)


def create_lookup_table(database_url: str, name: str) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (key TEXT PRIMARY KEY, region TEXT)").format(
            sql.Identifier(name)))
        for key, row in LOOKUP_ROWS.items():
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(name)),
                         (key, row["region"]))


def fold_in_two_batches(spark, database_url: str, plan: Plan, pipeline: Pipeline,
                        log: list[Step]) -> tuple[dict[str, KeyState], FoldOutcome]:
    """Fold the log's records in two batches on Spark, each committed to the store; the
    stored rows, and the batches' emissions and dead letters together."""
    versions = ProjectionCatalog(database_url)
    versions.register(plan.name)
    versions.close()
    both = FoldOutcome()
    committed: dict[PartitionKey, int] = {}
    with ReadModelStore(database_url, plan.projection, 1) as store:
        store.ensure_schema()
        for batch_id, half in enumerate(_in_two_batches(log)):
            context = BatchContext(plan, 1, database_url, {}, dict(committed),
                                   store.parked_keys())  # as the runner does
            slices = [MemorySlice(tuple(run)) for run in _partitions(half)]
            outcome = run_pipeline(spark, pipeline, slices, context)
            outcome.next_offsets = {(r.topic, r.partition): r.offset + 1 for r in half}
            store.commit(batch_id, outcome, committed, publish=lambda _states: None)
            committed.update(outcome.next_offsets)
            both.emissions += outcome.emissions
            both.dead_letters += outcome.dead_letters
        keys = [key for (key,) in store.conn.execute(sql.SQL("SELECT key FROM {}").format(
            sql.Identifier(f"{plan.projection.table}__v1")))] if plan.stateful else []
        rows = store.load(keys)
    return rows, both


def _in_two_batches(log: list[Step]) -> list[list[SourceRecord]]:
    """The log's records as two batches in the order they were appended: what a stream
    reads in its first batch, then the rest. (Halves of each partition would not do: a key
    that gathers several partitions' events would see them in another order than appended.)"""
    first = records_of(log[:len(log) // 2])
    return [first, _after(records_of(log), first)]


def _after(records: list[SourceRecord], first: list[SourceRecord]) -> list[SourceRecord]:
    done = set(first)
    return [record for record in records if record not in done]


def _partitions(records: list[SourceRecord]) -> list[list[SourceRecord]]:
    runs: dict[int, list[SourceRecord]] = {}
    for record in records:
        runs.setdefault(record.partition, []).append(record)
    return [runs[p] for p in sorted(runs)]


KINDS = kinds()
PIPELINES = [(kind, pipeline) for kind, projection in sorted(KINDS.items())
             for pipeline in sorted({compile_projection(projection).pipeline,
                                     compile_projection(projection).fallback} - {None})]


@pytest.mark.parametrize(("kind", "pipeline"), PIPELINES,
                         ids=[f"{k}-{p.name.lower()}" for k, p in PIPELINES])
def test_spark_pipelines_fold_as_the_python_harness(spark, stack_settings, kind: str,
                                                    pipeline: Pipeline) -> None:
    database_url = stack_settings.database_url
    migrations.upgrade(database_url)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(log=long_logs)
    def check(log) -> None:
        suffix = f"_{uuid.uuid4().hex[:8]}_{next(_examples)}"
        definition = kinds(suffix)[kind]
        if definition.lookup is not None:
            create_lookup_table(database_url, definition.lookup.projection)
        plan = compile_projection(definition)
        records = records_of(log)
        reference = comparable(fold_records(plan, {}, records, lookup_rows=LOOKUP_ROWS))
        rows, outcome = fold_in_two_batches(spark, database_url, plan, pipeline, log)
        got = comparable(FoldOutcome(changed=rows, emissions=outcome.emissions,
                                     dead_letters=outcome.dead_letters))
        assert got["changed"] == reference["changed"]
        assert got["emissions"] == reference["emissions"]
        assert got["dead_letters"] == reference["dead_letters"]

    check()
