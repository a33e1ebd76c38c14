"""Map-side partial aggregation without Spark: tasks' partials, each aggregated chunk by chunk,
then merged per key and into stored rows, equal the plain-Python fold of the same records,
duplicates and dead letters included."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, String

from eventfold.contract import EventEnvelope
from eventfold.projections import Count, Latest, Max, Min, Sum, aggregation
from eventfold.projections.execution.decode import decode_events, decoded_schema, records_table
from eventfold.projections.execution.fold import by_partition, fold_records
from eventfold.projections.execution.guard import drop_below
from eventfold.projections.execution.partial import (
    PartitionAggregate,
    merge_into_stored,
    partial_schema,
    slot,
    stream_marks,
)
from eventfold.projections.outcome import SourceRecord
from eventfold.projections.plan import Plan, compile_projection

TOPIC = "eventfold.events.Sale"
AGGREGATES = {"revenue": Sum("total"), "sales": Count(), "smallest": Min("total"),
              "largest": Max("total"), "last_city": Latest("city")}
COLUMNS = {"revenue": BigInteger(), "sales": BigInteger(), "smallest": BigInteger(),
           "largest": BigInteger(), "last_city": String()}
per_stream = compile_projection(aggregation("per_stream", sources=["Sale"],
                                           aggregates=AGGREGATES, columns=COLUMNS))
per_store = compile_projection(aggregation("per_store", sources=["Sale"], key_by="store",
                                          aggregates=AGGREGATES, columns=COLUMNS))

sale = st.fixed_dictionaries({"store": st.sampled_from(["north", "south"])}, optional={
    "total": st.integers(-10**9, 10**9), "city": st.text(alphabet="xyz", max_size=3)})


@st.composite
def partitioned_records(draw: st.DrawFn) -> list[list[SourceRecord]]:
    """Records of up to 3 partitions; each stream in one, its events in version order, some
    delivered twice further on, some records not decodable."""
    partitions: list[list[SourceRecord]] = [[] for _ in range(3)]
    position = 0
    for stream in range(draw(st.integers(1, 6))):
        records = partitions[stream % 3]
        for version in range(1, draw(st.integers(1, 6)) + 1):
            position += 1
            key, value = EventEnvelope(
                event_id=f"s{stream}-{version}", event_type="SaleRecorded",
                stream_id=f"s{stream}", stream_version=version, global_position=position,
                recorded_at="", data=draw(sale)).encode()
            copies = 2 if draw(st.booleans()) else 1
            for _ in range(copies):
                records.append(SourceRecord(TOPIC, stream % 3, len(records), key, value))
        if draw(st.booleans()):
            records.append(SourceRecord(TOPIC, stream % 3, len(records), f"s{stream}", "{bad"))
    return [records for records in partitions if records]


def task_partials(projection: Plan, records: list[SourceRecord], chunk: int = 1_000,
                  watermarks: dict[str, int] | None = None) -> pa.Table:
    """What a task aggregates of one partition, read ``chunk`` records at a time, less what
    the ``watermarks`` of earlier batches say was applied."""
    partition = PartitionAggregate(projection,
                                   partial_schema(projection, decoded_schema(projection)))
    for start in range(0, len(records), chunk):
        for run in by_partition(records[start:start + chunk]):
            partition.add(drop_below(decode_events(records_table(run), projection),
                                     watermarks or {}))
    return partition.result()


def merged_states(projection: Plan, partitions: list[list[SourceRecord]], chunk: int
                  ) -> tuple[dict[str, Any], int, dict[str, int]]:
    partials = pa.concat_tables(task_partials(projection, p, chunk) for p in partitions)
    merged = merge_into_stored(only_partials(partials), {}, projection)
    states = {row["fold_key"]: ({name: row[slot(name)] for name in AGGREGATES}, row["_version"],
                                row["_position"]) for row in merged.to_pylist()}
    letters = sum(1 for kind in partials.column("kind").to_pylist() if kind == "dlq")
    return states, letters, stream_marks(partials, projection)


@settings(deadline=None, max_examples=80)
@given(partitioned_records(), st.integers(1, 12))
def test_merged_partials_equal_the_python_fold(partitions, chunk) -> None:
    """Whatever the chunks, copies in two of them count once."""
    for projection in (per_stream, per_store):
        reference = fold_records(projection, {}, [r for p in partitions for r in p])
        states, letters, marks = merged_states(projection, partitions, chunk)
        expected = {key: ({name: (ks.state or {}).get(name) for name in AGGREGATES},
                          ks.version, ks.position) for key, ks in reference.changed.items()}
        assert states == expected
        assert letters == len(reference.dead_letters)
        assert marks == reference.watermarks


def _appended(record: SourceRecord) -> tuple[int, int]:
    """Where a record was appended: its event's position (a broken record, its offset)."""
    try:
        return json.loads(record.value)["globalPosition"], record.offset
    except (ValueError, KeyError, TypeError):
        return 0, record.offset


def only_partials(partials: pa.Table) -> pa.Table:
    return partials.filter(pc.equal(partials.column("kind"), "partial"))


@settings(deadline=None, max_examples=80)
@given(partitioned_records())
def test_partials_merged_into_stored_rows_equal_the_fold_of_everything(partitions) -> None:
    """A batch's partials merged into what earlier batches stored: as if one fold had seen
    every event (the task of a later batch merges its keys so). The batches split the log
    where it was appended, as a stream reads it."""
    records = sorted((r for p in partitions for r in p), key=_appended)
    first, later = records[:len(records) // 2], records[len(records) // 2:]
    for projection in (per_stream, per_store):
        stored = fold_records(projection, {}, first)
        partials = pa.concat_tables(
            task_partials(projection, [r for r in later if r.partition == p],
                          watermarks=stored.watermarks)
            for p in {r.partition for r in later})
        merged = merge_into_stored(only_partials(partials), {
            key: ks for key, ks in stored.changed.items()
            if key in only_partials(partials).column("fold_key").to_pylist()}, projection)
        reference = fold_records(projection, stored.changed, later,
                                 watermarks=stored.watermarks)
        assert {row["fold_key"]: ({name: row[slot(name)] for name in AGGREGATES},
                                  row["_version"], row["_position"])
                for row in merged.to_pylist()} == {
            key: ({name: (ks.state or {}).get(name) for name in AGGREGATES}, ks.version,
                  ks.position) for key, ks in reference.changed.items()}


def test_a_task_with_only_dead_letters_hands_over_only_those() -> None:
    for projection in (per_stream, per_store):
        partials = task_partials(projection, [SourceRecord(TOPIC, 0, 0, "s1", "{bad")])
        assert partials.column("kind").to_pylist() == ["dlq"]
        assert merge_into_stored(only_partials(partials), {}, projection).num_rows == 0
