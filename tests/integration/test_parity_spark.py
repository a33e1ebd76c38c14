"""Parity of the plain-Python harness with Spark: random logs (hypothesis), produced to a real
topic of two partitions, folded by every pipeline Spark runs (and, for the pipelines that fold
where they read, as one task on the driver, as a small batch is) in two batches, each written by
its tasks (stage, KTable records, derived events, dead letters) and committed through the real
store, come out as the reference fold of the whole log: the same rows (states, versions,
positions) per key, the same KTable, the same derived events and dead letters in their topics.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

import psycopg
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from psycopg import sql
from sqlalchemy import Text

from eventfold import migrations
from eventfold.contract import EventEnvelope, PartitionKey, event_topic, libpq_url
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.projections import State, projection
from eventfold.projections.execution import worker
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.engine import (
    SourceSlice,
    fold_on_driver,
    read_events,
    run_aggregation,
    run_aggregation_in_place,
    run_fold,
    run_fold_in_place,
)
from eventfold.projections.execution.fold import EMIT_ALL, fold_records
from eventfold.projections.execution.kafka_source import KafkaSlice, OffsetRange
from eventfold.projections.outcome import FoldOutcome, KeyState, SourceRecord
from eventfold.projections.plan import Pipeline, Plan, compile_projection
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink
from eventfold.write_model import DomainEvent, default_registry
from tests.kafka_helpers import read_table, read_topic
from tests.parity import LOOKUP_ROWS, PARTITIONS, Step, comparable, kinds, long_logs, records_of

_examples = count()
EXAMPLES = int(os.environ.get("EVENTFOLD_PARITY_EXAMPLES", "3"))
"""Random logs per pipeline: each costs a topic and a few Spark jobs, so CI runs a few; set
more to hunt."""


def run_pipeline(spark, pipeline: Pipeline, slices: Sequence[SourceSlice],
                 context: BatchContext, on_driver: bool) -> StagedBatch:
    if on_driver:
        return fold_on_driver(slices, context, pipeline)
    if pipeline is Pipeline.FOLD_IN_PLACE:
        return run_fold_in_place(spark, slices, context)
    if pipeline is Pipeline.AGGREGATE_IN_PLACE:
        return run_aggregation_in_place(spark, slices, context)
    events = read_events(spark, slices, context)
    if pipeline is Pipeline.AGGREGATE_AFTER_SHUFFLE:
        return run_aggregation(events, context)
    return run_fold(events, context)


def create_lookup_table(database_url: str, name: str) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (key TEXT PRIMARY KEY, region TEXT)").format(
            sql.Identifier(name)))
        for key, row in LOOKUP_ROWS.items():
            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(sql.Identifier(name)),
                         (key, row["region"]))


def produce_log(settings, topic: str, records: list[SourceRecord]) -> None:
    """The records, in their partitions at their offsets (a topic of their own)."""
    TopicAdmin(settings.kafka).ensure([topic], EVENT_TOPIC_CONFIG, partitions=PARTITIONS)
    producer = Producer(settings.kafka.client_config(**{"enable.idempotence": True}))
    for record in records:
        value = record.value.encode() if isinstance(record.value, str) else record.value
        producer.produce(topic, key=record.key, value=value, partition=record.partition)
    assert producer.flush(30) == 0


def fold_in_two_batches(spark, settings, plan: Plan, pipeline: Pipeline, on_driver: bool,
                        topic: str, batches: list[list[SourceRecord]]) -> dict[str, KeyState]:
    """Fold the batches' records from the topic on Spark (or as one task on the driver, as a
    small batch is), each batch written by its tasks and committed as the runner commits it;
    the stored rows."""
    versions = ProjectionCatalog(settings.database_url)
    versions.register(plan.name)
    versions.close()
    committed: dict[PartitionKey, int] = {}
    sink = TopicSink(settings.kafka, plan.projection, 1)
    with ReadModelStore(settings.database_url, plan.projection, 1) as store:
        store.ensure_schema()
        sink.ensure_topics()
        for batch_id, records in enumerate(batches):
            ends = {}
            for record in records:
                ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
            slices = [KafkaSlice(settings.kafka, OffsetRange(
                topic, partition, committed.get((topic, partition), 0), end))
                for partition, end in sorted(ends.items())]
            context = BatchContext(  # as the runner makes them
                plan, 1, settings.database_url, settings.kafka, uuid.uuid4().hex, EMIT_ALL,
                dict(committed), fresh=store.checkpoint() is None,
                any_parked=plan.parks and store.any_parked())
            staged = run_pipeline(spark, pipeline, slices, context, on_driver)
            staged.next_offsets = {(topic, p): end for p, end in ends.items()}
            sink.ensure_outputs(staged.topics)

            def produce_held(letters) -> None:
                sink.output.dead_letters(letters)
                sink.output.flush()

            if store.commit(batch_id, staged, committed):
                store.produce_pending_letters(produce_held)
            committed.update(staged.next_offsets)
        worker.release()  # what the driver's folds held, on this thread
        keys = [key for (key,) in store.conn.execute(sql.SQL("SELECT key FROM {}").format(
            sql.Identifier(f"{plan.projection.table}__v1")))] if plan.stateful else []
        rows = store.load(keys)
    sink.close()
    return rows


def _in_two_batches(log: list[Step], topic: str) -> list[list[SourceRecord]]:
    """The log's records as two batches in the order they were appended: what a stream
    reads in its first batch, then the rest. (Halves of each partition would not do: a key
    that gathers several partitions' events would see them in another order than appended.)"""
    first = records_of(log[:len(log) // 2], topic)
    done = set(first)
    return [first, [record for record in records_of(log, topic) if record not in done]]


KINDS = kinds()
PIPELINES = [(kind, pipeline, on_driver) for kind, projection in sorted(KINDS.items())
             for pipeline in sorted({compile_projection(projection).pipeline,
                                     compile_projection(projection).fallback} - {None})
             for on_driver in (False, True)
             if not on_driver or pipeline in (Pipeline.FOLD_IN_PLACE,
                                              Pipeline.AGGREGATE_IN_PLACE)]


@pytest.mark.parametrize(("kind", "pipeline", "on_driver"), PIPELINES,
                         ids=[f"{k}-{p.name.lower()}{'-on-the-driver' if d else ''}"
                              for k, p, d in PIPELINES])
def test_spark_pipelines_fold_as_the_python_harness(spark, stack_settings, kind: str,
                                                    pipeline: Pipeline,
                                                    on_driver: bool) -> None:
    database_url = stack_settings.database_url
    migrations.upgrade(database_url)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(log=long_logs)
    def check(log) -> None:
        suffix = f"_{uuid.uuid4().hex[:8]}_{next(_examples)}"
        source = f"Till{suffix}"
        topic = event_topic(source)
        definition = kinds(suffix, source)[kind]
        if definition.lookup is not None:
            create_lookup_table(database_url, definition.lookup.projection)
        plan = compile_projection(definition)
        records = records_of(log, topic)
        produce_log(stack_settings, topic, records)
        reference = fold_records(plan, {}, records, lookup_rows=LOOKUP_ROWS)
        expected = comparable(reference)
        rows = fold_in_two_batches(spark, stack_settings, plan, pipeline, on_driver, topic,
                                   _in_two_batches(log, topic))
        assert comparable(FoldOutcome(changed=rows))["changed"] == expected["changed"]
        if plan.stateful:
            declared = plan.projection.columns
            assert read_table(stack_settings.kafka, plan.projection.ktable_topic_for(1)) == {
                key: json.loads(json.dumps({c: v for c, v in ks.state.items() if c in declared},
                                           default=str))
                for key, ks in reference.changed.items() if ks.state is not None}
        emitted = {e.topic for e in reference.emissions}
        assert sorted({(topic, m["key"], json.dumps(json.loads(m["value"]), sort_keys=True))
                       for topic in emitted for m in read_topic(stack_settings.kafka, topic)}
                      ) == expected["emissions"]
        letters = [json.loads(m["value"]) for m in read_topic(stack_settings.kafka,
                                                              plan.projection.dead_letter_topic)]
        assert sorted((d["partition"], d["offset"], d["error"]) for d in letters) == \
            expected["dead_letters"]

    check()


@dataclass(frozen=True)
class ShelfRelocated(DomainEvent):
    """At version 2 ``aisle`` became ``location``: version 1's events are lifted."""

    event_type = "TestShelfRelocatedOnSpark"
    schema_version = 2
    location: str


@default_registry.upcaster("TestShelfRelocatedOnSpark", from_version=1)
def _aisle_to_location(data: dict) -> dict:
    return {"location": f"aisle {data['aisle']}"}


def test_a_typed_fold_on_spark_receives_events_of_every_schema_version_lifted(
        spark, stack_settings) -> None:
    """Envelopes recorded at version 1 and 2 of one class, on a topic: every pipeline a typed
    fold runs in hands the function the class at version 2."""
    migrations.upgrade(stack_settings.database_url)
    suffix = uuid.uuid4().hex[:8]
    topic = event_topic(f"Shelf_{suffix}")

    def envelope(offset: int, key: str, version: int, data: dict) -> SourceRecord:
        return SourceRecord(topic, 0, offset, key, EventEnvelope(
            event_id=f"e{offset}", event_type=ShelfRelocated.event_type, stream_id=key,
            stream_version=offset + 1, global_position=offset + 1, recorded_at="",
            data=data, schema_version=version).encode()[1])

    records = [envelope(0, "s1", 1, {"aisle": 4}), envelope(1, "s2", 2, {"location": "back"}),
               envelope(2, "s1", 2, {"location": "front"}), envelope(3, "s3", 1, {"aisle": 9})]
    produce_log(stack_settings, topic, records)
    for pipeline, on_driver in [(Pipeline.FOLD_AFTER_SHUFFLE, False),
                                (Pipeline.FOLD_IN_PLACE, False), (Pipeline.FOLD_IN_PLACE, True)]:
        @projection(f"shelves_{suffix}_{pipeline.name.lower()}_{on_driver}",
                    sources=[f"Shelf_{suffix}"], columns={"location": Text()},
                    event_types=[ShelfRelocated])
        def shelves(state: State | None, moved: ShelfRelocated) -> State | None:
            return {"location": moved.location}

        rows = fold_in_two_batches(spark, stack_settings, compile_projection(shelves), pipeline,
                                   on_driver, topic, [records[:2], records[2:]])
        assert {key: ks.state for key, ks in rows.items()} == {
            "s1": {"location": "front"}, "s2": {"location": "back"},
            "s3": {"location": "aisle 9"}}, (pipeline, on_driver)
