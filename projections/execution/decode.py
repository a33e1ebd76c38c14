"""Decoding a partition's records into typed event columns, on the executors.

A task gets its partition's raw records (a Kafka offset range, or a slice of the event store)
and decodes the envelopes, plus the payload fields the projection needs (what it aggregates,
what it re-keys by), with Arrow's JSON reader: one C++ call per chunk instead of one
``json.loads`` per event, and the JVM then works on plain typed columns. Records that do not fit
that mould (a null value, a pretty-printed payload, a field of another type) send the chunk down
the per-record path, which yields the same columns; a record that cannot be decoded keeps the
reason in ``reason`` and becomes a dead letter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import json as pa_json

from eventfold.contract import EventEnvelope, MalformedEvent
from eventfold.projections.definition.fields import coerce, path_value
from eventfold.projections.definition.projection import Event
from eventfold.projections.execution.fold import (
    KEY_NOT_UTF8,
    VALUE_NOT_UTF8,
    envelope_of,
    is_utf8,
    missing_key_reason,
)
from eventfold.projections.outcome import RawRecords, SourceRecord
from eventfold.projections.plan import Plan

RECORDS_ARROW = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("key", pa.string()), ("value", pa.string()), ("reason", pa.string()),
])
"""A partition's raw records as ``decode_events`` reads them; ``reason`` marks a record that is
a dead letter before decoding (its key or value is not UTF-8)."""
ENVELOPE_ARROW = pa.schema([
    ("eventId", pa.string()), ("eventType", pa.string()), ("streamVersion", pa.int64()),
    ("globalPosition", pa.int64()), ("recordedAt", pa.string()), ("schemaVersion", pa.int64()),
    ("payload", pa.string()),
])
REQUIRED = ("eventId", "eventType", "streamVersion", "globalPosition", "payload")
RECORD_FIELDS = [*zip(RECORDS_ARROW.names, RECORDS_ARROW.types, strict=True),
                 ("fold_key", pa.string())]
EVENT_FIELDS = RECORD_FIELDS + list(zip(ENVELOPE_ARROW.names, ENVELOPE_ARROW.types,
                                        strict=True))
_JSON_READ = pa_json.ReadOptions(use_threads=False)  # a task has its core; threads only contend
_NEWLINE, _NOTHING = pa.scalar("\n"), pa.scalar("")
_LF, _CR = ord("\n"), ord("\r")
_ARROW_TYPES = {"bigint": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
                "string": pa.string()}
_SPARK_DDL = {pa.string(): "STRING", pa.int32(): "INT", pa.int64(): "BIGINT",
              pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}


def field_column(field: str) -> str:
    """The decoded column of a payload field an aggregation reads."""
    return f"data_{field}"


def payload_fields(plan: Plan) -> dict[str, pa.DataType]:
    """The payload fields decoded into columns of their own, with their Arrow types."""
    return {path: _ARROW_TYPES[kind] for path, kind in plan.payload_fields.items()}


def decoded_schema(plan: Plan) -> pa.Schema:
    """What a batch's events carry into Spark: an aggregation needs no payload (its fields have
    columns of their own), nor the event's id, type or time."""
    if plan.aggregates:
        return with_fields([*RECORD_FIELDS, ("streamVersion", pa.int64()),
                             ("globalPosition", pa.int64())], plan)
    return with_fields(EVENT_FIELDS, plan)


def with_fields(columns: list[tuple[str, pa.DataType]], plan: Plan) -> pa.Schema:
    return pa.schema([*columns, *((field_column(name), arrow_type) for name, arrow_type
                                  in payload_fields(plan).items())])


def spark_ddl(schema: pa.Schema) -> str:
    return ", ".join(f"`{f.name}` {_SPARK_DDL[f.type]}" for f in schema)


def records_table(raw: RawRecords) -> pa.Table:
    """``raw`` as ``RECORDS_ARROW`` columns. Keys and values are checked as UTF-8 by Arrow, in
    C; one that is not keeps its text with replacement characters, and the reason."""
    count = len(raw.offsets)
    values = raw.values if raw.events is None else [
        value if event is None else envelope_of(event)
        for value, event in zip(raw.values, raw.events, strict=True)]
    return _records(pa.array([raw.topic] * count, pa.string()),
                    pa.array([raw.partition] * count, pa.int32()),
                    pa.array(raw.offsets, pa.int64()),
                    pa.array(raw.keys, pa.binary()), pa.array(values, pa.binary()))


def _records(topics: pa.Array, partitions: pa.Array, offsets: pa.Array, keys: pa.Array,
             values: pa.Array) -> pa.Table:
    key_text, bad_keys = binary_text(keys)
    value_text, bad_values = binary_text(values)
    reasons: pa.Array = pa.nulls(len(offsets), pa.string())
    if bad_keys or bad_values:
        reasons = pa.array([KEY_NOT_UTF8 if i in bad_keys else VALUE_NOT_UTF8
                            if i in bad_values else None for i in range(len(offsets))],
                           pa.string())
    return pa.table([topics, partitions, offsets, key_text, value_text, reasons],
                    schema=RECORDS_ARROW)


def text_column(items: Sequence[str | bytes | None]) -> tuple[pa.Array, set[int]]:
    """``items`` as a string column, and the indexes of those that were not UTF-8."""
    return binary_text(pa.array(items, pa.binary()))


def binary_text(column: pa.Array) -> tuple[pa.Array, set[int]]:
    """A binary column as text, and the indexes of the values that were not UTF-8 (kept with
    replacement characters)."""
    try:
        return column.cast(pa.string()), set()
    except pa.ArrowInvalid:
        items = column.to_pylist()
        bad = {i for i, item in enumerate(items) if item is not None and not is_utf8(item)}
        return pa.array([None if item is None else item.decode("utf-8", "replace")
                         for item in items], pa.string()), bad


def decode_events(records: pa.Table, plan: Plan) -> pa.Table:
    """The events the projection handles, decoded; dead letters keep their raw value."""
    projection = plan.projection
    schema = decoded_schema(plan)
    full = with_fields(EVENT_FIELDS, plan)
    table = _decode_columnar(records, plan, full)
    if table is None:
        table = _decode_per_record(records, plan, full)
    if projection.event_types is not None:
        handled = pc.or_(pc.is_valid(table.column("reason")),
                         pc.is_in(table.column("eventType"),
                                  pa.array(sorted(projection.event_types))))
        table = table.filter(handled)
    return table.select(schema.names)


def _read_lines(lines: pa.ChunkedArray, schema: pa.Schema) -> pa.Table | None:
    """Each line a JSON object, read with an explicit schema; None when any line is not one
    object's text on a line of its own, which the per-record decoder then takes. Arrow's
    reader must not see such a line: a line ``null`` crashes the process (pyarrow 26), and a
    line break inside a value would shift the rows."""
    if len(lines) == 0:
        return schema.empty_table()
    if not pc.all(pc.and_(pc.starts_with(lines, "{"), pc.ends_with(lines, "}"))).as_py():
        return None
    text = _newline_ended(lines)
    raw = np.frombuffer(text, np.uint8)  # the bytes in place: no copy
    if np.count_nonzero(raw == _LF) != len(lines) or np.count_nonzero(raw == _CR):
        return None
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        parsed = pa_json.read_json(pa.BufferReader(text), read_options=_JSON_READ,
                                   parse_options=options)
    except pa.ArrowInvalid:
        return None
    return parsed if parsed.num_rows == len(lines) else None


def _newline_ended(lines: pa.ChunkedArray) -> pa.Buffer:
    """The lines' text, each followed by a newline, as one buffer: the data buffer of the
    lines with a newline appended, so no line becomes a Python string."""
    ended = pc.binary_join_element_wise(lines.combine_chunks(), _NEWLINE, _NOTHING)
    offsets = memoryview(ended.buffers()[1]).cast("i")  # int32, as a string array's are
    start, end = offsets[ended.offset], offsets[ended.offset + len(ended)]
    return ended.buffers()[2].slice(start, end - start)


def _read_envelopes(records: pa.Table) -> pa.Table | None:
    """The records' envelopes as columns; None when a record has no key or value, or an
    envelope is not one line of JSON with every required field."""
    if records.column("key").null_count or records.column("value").null_count \
            or records.column("reason").null_count < records.num_rows:
        return None
    envelopes = _read_lines(records.column("value"), ENVELOPE_ARROW)
    if envelopes is None or any(envelopes.column(c).null_count for c in REQUIRED):
        return None
    return envelopes


def _decode_columnar(records: pa.Table, plan: Plan, schema: pa.Schema) -> pa.Table | None:
    envelopes = _read_envelopes(records)
    if envelopes is None:
        return None
    projection = plan.projection
    keys, values = records.column("key"), records.column("value")
    fields = payload_fields(plan)
    wanted = dict(fields)
    if projection.key_by is not None:
        wanted.setdefault(projection.key_by, pa.string())
    data: pa.Table | None = None
    if wanted:
        if any("." in name for name in wanted):
            return None  # a nested path: the per-record decoder walks it
        data = _read_lines(envelopes.column("payload"), pa.schema(list(wanted.items())))
        if data is None or (projection.key_by is not None and wanted[projection.key_by]
                            != pa.string()):
            return None
    rows = records.num_rows
    fold_key = keys if projection.key_by is None else data.column(projection.key_by)  # type: ignore[union-attr]
    reason = pc.if_else(pc.is_null(fold_key), pa.scalar(missing_key_reason(projection)),
                        pa.nulls(rows, pa.string()))
    columns: dict[str, Any] = {
        "topic": records.column("topic"), "partition": records.column("partition"),
        "offset": records.column("offset"), "key": keys,
        "value": pc.if_else(pc.is_valid(reason), values, pa.nulls(rows, pa.string())),
        "reason": reason, "fold_key": fold_key,
        **{name: envelopes.column(name) for name in ENVELOPE_ARROW.names},
        **{field_column(name): data.column(name) for name in fields},  # type: ignore[union-attr]
    }
    return pa.table([columns[f.name] for f in schema], schema=schema)


def _decode_per_record(records: pa.Table, plan: Plan, schema: pa.Schema) -> pa.Table:
    projection = plan.projection
    fields = plan.payload_fields
    out: dict[str, list[Any]] = {f.name: [] for f in schema}
    for topic, partition, offset, key, value, reason in zip(
            *(records.column(c).to_pylist() for c in RECORDS_ARROW.names), strict=True):
        row: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset,
                               "key": key}
        try:
            if reason is not None:
                raise MalformedEvent(reason)
            envelope = EventEnvelope.decode(key, value, with_metadata=False)
        except MalformedEvent as exc:
            row.update(value=value, reason=str(exc))
            _append(out, row)
            continue
        row.update(eventId=envelope.event_id, eventType=envelope.event_type,
                   streamVersion=envelope.stream_version,
                   globalPosition=envelope.global_position, recordedAt=envelope.recorded_at,
                   schemaVersion=envelope.schema_version,
                   payload=orjson.dumps(envelope.data).decode())
        fold_key = projection.fold_key(envelope.stream_id, envelope.data)
        row["fold_key"] = fold_key
        if fold_key is None:
            row.update(value=value, reason=missing_key_reason(projection))
        for name, sql_type in fields.items():
            row[field_column(name)] = coerce(path_value(envelope.data, name), sql_type)
        _append(out, row)
    return pa.table({f.name: pa.array(out[f.name], f.type) for f in schema}, schema=schema)


def _append(out: dict[str, list[Any]], row: dict[str, Any]) -> None:
    for name, values in out.items():
        values.append(row.get(name))


def decoded_event(topic: str, partition: int, offset: int, key: str, value: str | None,
                  event_id: str, event_type: str, version: int, position: int,
                  recorded_at: str | None, schema_version: int | None, payload: str
                  ) -> tuple[SourceRecord, Event | None, str | None]:
    """A row Spark decoded as a record with its event, or with the reason it is a dead
    letter."""
    record = SourceRecord(topic, partition, offset, key, value)
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return record, None, f"undecodable event payload: {exc}"
    if not isinstance(data, dict):
        return record, None, "event payload is not a JSON object"
    return record, Event(event_type, data, key, version, event_id, position,
                         recorded_at or "", None, schema_version or 1), None
