"""The Spark plan of one micro-batch: decode, guard, re-key, fold on the executors.

Decoding the envelope, the offset and watermark guards, re-keying and the shuffle by key are
native Spark. Then, per kind:

- fold: each executor task sorts its keys' events by position, loads their stored states
  (and looked-up rows) from Postgres, runs the plain-Python ``KeyFolder`` and returns only the
  changed states, dead letters, derived events and watermarks: O(keys), not O(events), reach
  the driver;
- aggregation: Spark computes a partial aggregate per key; the store merges it in SQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.fold import (
    DeadLetter,
    FoldOutcome,
    KeyFolder,
    KeyState,
    PartitionKey,
    SourceRecord,
    missing_key_reason,
)
from projections.projection import Event, Projection

ENVELOPE_DDL = ("payload STRING, eventId STRING, eventType STRING, streamVersion BIGINT, "
                "globalPosition BIGINT, recordedAt STRING")
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value")
OUTPUT_SCHEMA = pa.schema([
    ("kind", pa.string()), ("key", pa.string()), ("state", pa.string()),
    ("version", pa.int64()), ("position", pa.int64()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.string()),
    ("reason", pa.string()),
])
OUTPUT_DDL = ("kind STRING, key STRING, state STRING, version BIGINT, position BIGINT, "
              "topic STRING, partition INT, offset BIGINT, value STRING, reason STRING")


@dataclass(frozen=True)
class BatchContext:
    """What an executor task needs besides its rows: picklable, no connections."""

    projection: Projection
    version: int
    database_url: str
    emit_from: Mapping[PartitionKey, int] | None


def plan_batch(spark: SparkSession, batch: DataFrame, projection: Projection,
               committed: Mapping[PartitionKey, int], watermarks: Mapping[str, int]) -> DataFrame:
    """Decoded, guarded, keyed events; undecodable ones keep a ``reason`` (dead letters)."""
    events = batch.where(_not_committed(committed)).select(
        *RECORD_COLUMNS, F.from_json("value", ENVELOPE_DDL).alias("e"))
    events = events.select(*RECORD_COLUMNS, "e.*").withColumn("fold_key", _fold_key(projection))
    events = events.withColumn("reason", _dead_letter_reason(projection))
    if projection.event_types is not None:
        events = events.where(F.col("reason").isNotNull()
                              | F.col("eventType").isin(sorted(projection.event_types)))
    if watermarks:
        marks = spark.createDataFrame(
            pa.table({"stream_id": list(watermarks), "_mark": list(watermarks.values())}))
        events = events.join(F.broadcast(marks), events["key"] == marks["stream_id"], "left")
        events = events.where(F.col("reason").isNotNull()
                              | (F.col("streamVersion") > F.coalesce("_mark", F.lit(0))))
    return events


def _not_committed(committed: Mapping[PartitionKey, int]) -> Column:
    """Records a Spark re-run of an already committed batch would bring again."""
    done = [(F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < o)
            for (t, p), o in committed.items() if o > 0]
    return ~reduce(lambda a, b: a | b, done) if done else F.lit(True)


def _fold_key(projection: Projection) -> Column:
    if projection.key_by is None:
        return F.col("key")
    return F.get_json_object("payload", f"$.{projection.key_by}")


def _dead_letter_reason(projection: Projection) -> Column:
    undecodable = reduce(lambda a, b: a | b, [
        F.col(c).isNull() for c in ("eventId", "eventType", "streamVersion", "globalPosition",
                                    "payload")])
    not_object = (F.get_json_object("payload", "$").isNull()
                  | ~F.ltrim("payload").startswith("{"))
    reason = (F.when(F.col("value").isNull(), "null value (tombstone) on an event topic")
              .when(F.col("key").isNull(), "message without a key (aggregate id)")
              .when(undecodable, "undecodable event envelope")
              .when(not_object, "event payload is not a JSON object"))
    if projection.key_by is not None:
        reason = reason.when(F.col("fold_key").isNull(), missing_key_reason(projection))
    return reason


# -- fold projections --------------------------------------------------------------------------

def run_fold(events: DataFrame, context: BatchContext) -> FoldOutcome:
    """Shuffle by key, fold on the executors, gather the O(keys) results on the driver."""
    ordered = (events.repartition("fold_key")
               .sortWithinPartitions("fold_key", "globalPosition")
               .select(*RECORD_COLUMNS, "reason", "fold_key", "eventId", "eventType",
                       "streamVersion", "globalPosition", "recordedAt", "payload"))
    results = ordered.mapInArrow(lambda batches: fold_task(batches, context), OUTPUT_DDL)
    return gather(results.toArrow())


def fold_task(batches: Iterator[pa.RecordBatch], context: BatchContext) -> Iterator[pa.RecordBatch]:
    """One executor task: fold the keys of this partition (rows arrive sorted by key)."""
    from projections.sinks import ReadModelStore, lookup_rows  # executor side: import here

    rows = _columns(pa.Table.from_batches(list(batches)))
    outcome = FoldOutcome()
    if not rows["key"]:
        return
    projection = context.projection
    store = ReadModelStore(context.database_url, projection, context.version)
    try:
        keys = {k for k, r in zip(rows["fold_key"], rows["reason"], strict=True) if r is None}
        stored = store.load(keys)
        joined: dict[str, Any] = {}
        if projection.lookup is not None:
            on = projection.lookup.on
            wanted = set()
            for payload, reason in zip(rows["payload"], rows["reason"], strict=True):
                if reason is None:
                    wanted.add(str(json.loads(payload).get(on)))
            joined = lookup_rows(store.conn, projection.lookup.projection, wanted)
    finally:
        store.close()
    folder = KeyFolder(projection, outcome, context.emit_from)
    for key, items in _events_by_key(rows, outcome, joined, projection):
        folder.fold(key, stored.get(key), items)
    yield _to_output(outcome)


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


KeyedEvents = tuple[str, list[tuple[SourceRecord, Event]]]


def _events_by_key(rows: dict[str, list[Any]], outcome: FoldOutcome, joined: Mapping[str, Any],
                   projection: Projection) -> Iterator[KeyedEvents]:
    on = projection.lookup.on if projection.lookup is not None else None
    current_key: str | None = None
    items: list[tuple[SourceRecord, Event]] = []
    for i in range(len(rows["key"])):
        record = SourceRecord(rows["topic"][i], rows["partition"][i], rows["offset"][i],
                              rows["key"][i], rows["value"][i])
        if rows["reason"][i] is not None:
            outcome.dead_letters.append(DeadLetter(record, rows["reason"][i]))
            continue
        data = json.loads(rows["payload"][i])
        event = Event(type=rows["eventType"][i], data=data, stream_id=rows["key"][i],
                      stream_version=rows["streamVersion"][i], event_id=rows["eventId"][i],
                      global_position=rows["globalPosition"][i],
                      recorded_at=rows["recordedAt"][i] or "",
                      joined=joined.get(str(data.get(on))) if on is not None else None)
        key = rows["fold_key"][i]
        if key != current_key and items:
            yield current_key, items  # type: ignore[misc]
            items = []
        current_key = key
        items.append((record, event))
    if items and current_key is not None:
        yield current_key, items


def _to_output(outcome: FoldOutcome) -> pa.RecordBatch:
    out: dict[str, list[Any]] = {name: [] for name in OUTPUT_SCHEMA.names}

    def row(kind: str, **values: Any) -> None:
        for name in OUTPUT_SCHEMA.names:
            out[name].append(kind if name == "kind" else values.get(name))

    for key, ks in outcome.changed.items():
        row("state", key=key, version=ks.version, position=ks.position,
            state=None if ks.state is None else json.dumps(ks.state, default=str))
    for letter in outcome.dead_letters:
        r = letter.record
        row("dlq", key=r.key, topic=r.topic, partition=r.partition, offset=r.offset,
            value=r.value, reason=letter.reason)
    for emission in outcome.emissions:
        row("derived", topic=emission.topic, key=emission.key, value=emission.value)
    for stream_id, version in outcome.watermarks.items():
        row("source", key=stream_id, version=version)
    row("stats", version=outcome.applied, position=outcome.duplicates)
    return pa.RecordBatch.from_pydict(out, schema=OUTPUT_SCHEMA)


def gather(table: pa.Table) -> FoldOutcome:
    """The driver's side: merge the tasks' outputs into one outcome."""
    from projections.fold import Emission

    outcome = FoldOutcome()
    rows = _columns(table)
    for i, kind in enumerate(rows["kind"]):
        key, version, position = rows["key"][i], rows["version"][i], rows["position"][i]
        if kind == "state":
            state = rows["state"][i]
            outcome.changed[key] = KeyState(None if state is None else json.loads(state),
                                            version, position)
        elif kind == "dlq":
            outcome.dead_letters.append(DeadLetter(SourceRecord(
                rows["topic"][i], rows["partition"][i], rows["offset"][i], key,
                rows["value"][i]), rows["reason"][i]))
        elif kind == "derived":
            outcome.emissions.append(Emission(rows["topic"][i], key, rows["value"][i]))
        elif kind == "source":
            outcome.see(key, version)
        else:
            outcome.applied += version
            outcome.duplicates += position
    return outcome


# -- aggregation projections -------------------------------------------------------------------

def run_aggregation(events: DataFrame, projection: Projection) -> FoldOutcome:
    """Partial aggregates per key for this batch, computed by Spark; the store merges them."""
    assert projection.aggregates is not None
    events = events.persist()
    try:
        outcome = FoldOutcome()
        good = events.where(F.col("reason").isNull()).dropDuplicates(["key", "streamVersion"])
        for row in events.where(F.col("reason").isNotNull()).select(
                *RECORD_COLUMNS, "reason").collect():
            outcome.dead_letters.append(DeadLetter(SourceRecord(*row[:5]), row["reason"]))
        columns = [_aggregate_column(projection, name) for name in projection.aggregates]
        version = (F.max("streamVersion") if projection.key_by is None else F.count(F.lit(1)))
        partial = good.groupBy("fold_key").agg(
            *columns, version.alias("_version"), F.max("globalPosition").alias("_position"),
            F.count(F.lit(1)).alias("_events")).toArrow()
        for row in partial.to_pylist():
            outcome.changed[row["fold_key"]] = KeyState(
                {name: row[name] for name in projection.aggregates}, row["_version"],
                row["_position"])
            outcome.applied += row["_events"]
        for row in good.groupBy("key").agg(F.max("streamVersion").alias("v")).toArrow().to_pylist():
            outcome.see(row["key"], row["v"])
        return outcome
    finally:
        events.unpersist()


def _aggregate_column(projection: Projection, name: str) -> Column:
    assert projection.aggregates is not None
    agg = projection.aggregates[name]
    if agg.function == "count":
        return F.count(F.lit(1)).alias(name)
    value = F.get_json_object("payload", f"$.{agg.field}").cast(projection.spark_type(name))
    functions = {"sum": F.sum, "min": F.min, "max": F.max}
    if agg.function == "latest":
        return F.max_by(value, F.col("globalPosition")).alias(name)
    return functions[agg.function](value).alias(name)
