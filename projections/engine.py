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

import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

import orjson
import pyarrow as pa
from pyarrow import json as pa_json
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.fold import (
    DeadLetter,
    Decoded,
    Emission,
    FoldOutcome,
    KeyFolder,
    KeyState,
    PartitionKey,
    SourceRecord,
    decode_records,
    fold_decoded,
    missing_key_reason,
)
from projections.projection import Event, Projection

ENVELOPE_DDL = ("payload STRING, eventId STRING, eventType STRING, streamVersion BIGINT, "
                "globalPosition BIGINT, recordedAt STRING")
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value")
FOLD_INPUT = ("topic", "partition", "offset", "key", "value", "reason", "fold_key", "eventId",
              "eventType", "streamVersion", "globalPosition", "recordedAt", "payload")
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
    committed: Mapping[PartitionKey, int]


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
    # The raw value only travels for dead letters: the fold needs the decoded fields.
    ordered = (events.repartition("fold_key")
               .sortWithinPartitions("fold_key", "globalPosition")
               .withColumn("value", F.when(F.col("reason").isNotNull(), F.col("value")))
               .select(*FOLD_INPUT))
    results = ordered.mapInArrow(lambda batches: fold_task(batches, context), OUTPUT_DDL)
    return gather(results.toArrow())


def fold_task(batches: Iterator[pa.RecordBatch], context: BatchContext) -> Iterator[pa.RecordBatch]:
    """One executor task after the shuffle: fold the keys of this partition (rows arrive
    sorted by key)."""
    rows = _columns(pa.Table.from_batches(list(batches)))
    if not rows or not rows["key"]:
        return
    projection = context.projection
    keys = {k for k, r in zip(rows["fold_key"], rows["reason"], strict=True) if r is None}
    lookup_keys: set[str] = set()
    if projection.lookup is not None:
        on = projection.lookup.on
        lookup_keys = {str(orjson.loads(p).get(on))
                       for p, r in zip(rows["payload"], rows["reason"], strict=True) if r is None}
    stored, _, joined = _load(context, keys, lookup_keys, with_watermarks=False)
    outcome = FoldOutcome()
    folder = KeyFolder(projection, outcome, context.emit_from)
    for key, items in _events_by_key(rows, outcome, joined, projection):
        folder.fold(key, stored.get(key), items)
    yield _to_output(outcome)


def folds_in_place(projection: Projection) -> bool:
    """A Python fold keyed by aggregate id over one topic needs no shuffle (see below), as
    long as every producer partitions by key the same way; ``gather`` checks that."""
    return projection.kind != "aggregation" and projection.key_by is None \
        and len(projection.sources) == 1


def run_fold_in_place(batch: DataFrame, context: BatchContext) -> FoldOutcome:
    """Fold where the data is: the key is the aggregate id, so every event of a key sits in
    one partition of the (single) source topic, and each Kafka partition is one Spark
    partition. No shuffle, no sort (offset order is stream order); the task decodes itself."""
    results = batch.select(*RECORD_COLUMNS).mapInArrow(
        lambda batches: in_place_task(batches, context), OUTPUT_DDL)
    return gather(results.toArrow())


def in_place_task(batches: Iterator[pa.RecordBatch],
                  context: BatchContext) -> Iterator[pa.RecordBatch]:
    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    decoded = decode_arrow(table)
    if decoded is None:  # something Arrow's reader would not take: one record at a time
        decoded = list(decode_records(SourceRecord(*row) for row in zip(
            *(table.column(c).to_pylist() for c in RECORD_COLUMNS), strict=True)))
    projection = context.projection
    keys = {record.key for record, _, _ in decoded if record.key is not None}
    lookup_keys: set[str] = set()
    if projection.lookup is not None:
        on = projection.lookup.on
        lookup_keys = {str(event.data.get(on)) for _, event, _ in decoded if event is not None}
    stored, watermarks, joined = _load(context, keys, lookup_keys, with_watermarks=True)
    yield _to_output(fold_decoded(projection, stored, decoded, context.committed, watermarks,
                                  joined, context.emit_from))


ENVELOPE_ARROW = pa.schema([
    ("eventId", pa.string()), ("eventType", pa.string()), ("streamVersion", pa.int64()),
    ("globalPosition", pa.int64()), ("recordedAt", pa.string()), ("payload", pa.string()),
])
_REQUIRED = ("eventId", "eventType", "streamVersion", "globalPosition", "payload")


def decode_arrow(table: pa.Table) -> list[Decoded] | None:
    """Parse a task's envelopes in one call of Arrow's JSON reader (C++) instead of one
    ``json.loads`` each; only the event data is parsed per event. None when any record does
    not fit that mould (null, pretty-printed, missing fields), for the per-record decoder."""
    keys, values = table.column("key"), table.column("value")
    if keys.null_count or values.null_count:
        return None
    texts = values.to_pylist()
    options = pa_json.ParseOptions(explicit_schema=ENVELOPE_ARROW,
                                   unexpected_field_behavior="ignore")
    try:
        parsed = pa_json.read_json(io.BytesIO("\n".join(texts).encode()),
                                   parse_options=options)
    except pa.ArrowInvalid:
        return None
    if parsed.num_rows != table.num_rows or any(parsed.column(c).null_count
                                                 for c in _REQUIRED):
        return None
    columns = [table.column(c).to_pylist() for c in ("topic", "partition", "offset")]
    columns += [keys.to_pylist(), texts]
    columns += [parsed.column(c).to_pylist() for c in ENVELOPE_ARROW.names]
    return [_decoded(*row) for row in zip(*columns, strict=True)]


def _decoded(topic: str, partition: int, offset: int, key: str, value: str, event_id: str,
             event_type: str, version: int, position: int, recorded_at: str | None,
             payload: str) -> Decoded:
    record = SourceRecord(topic, partition, offset, key, value)
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return record, None, f"undecodable event payload: {exc}"
    if not isinstance(data, dict):
        return record, None, "event payload is not a JSON object"
    return record, Event(event_type, data, key, version, event_id, position,
                         recorded_at or ""), None


def _load(context: BatchContext, keys: set[str], lookup_keys: set[str],
          with_watermarks: bool) -> tuple[dict[str, KeyState], dict[str, int], dict[str, Any]]:
    """Stored states, source watermarks and looked-up rows of one task's keys."""
    from projections.sinks import ReadModelStore, lookup_rows  # executor side: import here

    store = ReadModelStore(context.database_url, context.projection, context.version)
    try:
        stored = store.load(keys)
        watermarks = store.watermarks(keys) if with_watermarks else {}
        joined = (lookup_rows(store.conn, context.projection.lookup.projection, lookup_keys)
                  if context.projection.lookup is not None else {})
    finally:
        store.close()
    return stored, watermarks, joined


def _columns(table: pa.Table) -> dict[str, list[Any]]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


KeyedEvents = tuple[str, list[tuple[SourceRecord, Event]]]


def _events_by_key(rows: dict[str, list[Any]], outcome: FoldOutcome, joined: Mapping[str, Any],
                   projection: Projection) -> Iterator[KeyedEvents]:
    on = projection.lookup.on if projection.lookup is not None else None
    current_key: str | None = None
    items: list[tuple[SourceRecord, Event]] = []
    for (topic, partition, offset, stream_id, value, reason, key, event_id, event_type,
         stream_version, position, recorded_at, payload) in zip(
            *(rows[c] for c in FOLD_INPUT), strict=True):
        if reason is None:
            record, event, reason = _decoded(topic, partition, offset, stream_id, value,
                                             event_id, event_type, stream_version, position,
                                             recorded_at, payload)
        else:
            record, event = SourceRecord(topic, partition, offset, stream_id, value), None
        if event is None:
            outcome.dead_letters.append(DeadLetter(record, reason or "undecodable"))
            continue
        if on is not None:
            event = event._replace(joined=joined.get(str(event.data.get(on))))
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


class KeySplitAcrossPartitions(RuntimeError):
    """Two tasks folded the same key: its events were not all in one partition."""


def gather(table: pa.Table) -> FoldOutcome:
    """The driver's side: merge the tasks' outputs into one outcome."""
    outcome = FoldOutcome()
    rows = _columns(table)
    for i, kind in enumerate(rows["kind"]):
        key, version, position = rows["key"][i], rows["version"][i], rows["position"][i]
        if kind == "state":
            if key in outcome.changed:
                raise KeySplitAcrossPartitions(key)
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
    """Partial aggregates per key for this batch, computed by Spark in one job; the store
    merges them into the stored rows. Dead letters ride along as groups of their own."""
    assert projection.aggregates is not None
    letter = F.col("reason").isNotNull()
    group = F.when(letter, F.concat_ws("/", F.lit("\u0000dlq"), "topic", "partition", "offset")
                   ).otherwise(F.col("fold_key"))
    columns = [_aggregate_column(projection, name) for name in projection.aggregates]
    version = F.max("streamVersion") if projection.key_by is None else F.count(F.lit(1))
    # A (stream, version) twice in one batch counts once; every dead letter stays.
    identity = F.when(letter, F.concat_ws("/", "topic", "partition", "offset")).otherwise(
        F.concat_ws("#", "key", "streamVersion"))
    partial = (events.withColumn("_identity", identity).dropDuplicates(["_identity"])
               .withColumn("_group", group)
               .groupBy("_group").agg(
                   *columns, version.alias("_version"),
                   F.max("globalPosition").alias("_position"),
                   F.count(F.lit(1)).alias("_events"),
                   F.first("fold_key").alias("fold_key"), F.first("reason").alias("reason"),
                   *(F.first(c).alias(f"_{c}") for c in RECORD_COLUMNS))
               .toArrow())
    outcome = FoldOutcome()
    for row in partial.to_pylist():
        if row["reason"] is not None:
            record = SourceRecord(*(row[f"_{c}"] for c in RECORD_COLUMNS))
            outcome.dead_letters.append(DeadLetter(record, row["reason"]))
            continue
        outcome.changed[row["fold_key"]] = KeyState(
            {name: row[name] for name in projection.aggregates}, row["_version"],
            row["_position"])
        outcome.applied += row["_events"]
        if projection.key_by is None:
            outcome.see(row["fold_key"], row["_version"])  # the key is the stream
    if projection.key_by is not None:
        # Re-keyed: a key gathers many streams, so their watermarks take a job of their own.
        marks = (events.where(~letter).groupBy("key")
                 .agg(F.max("streamVersion").alias("v")).toArrow().to_pylist())
        for mark in marks:
            outcome.see(mark["key"], mark["v"])
    return outcome


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
