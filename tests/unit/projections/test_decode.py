"""Decoding records into typed event columns (what the executors hand to Spark), without Spark:
the Arrow path and the per-record path agree, and bad records become dead letters."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, Float, String

from eventfold.contract import EventEnvelope
from eventfold.projections import Count, Latest, Sum, aggregation
from eventfold.projections.execution.decode import (
    EVENT_FIELDS,
    _decode_columnar,
    _decode_per_record,
    decode_events,
    field_column,
    records_table,
    with_fields,
)
from eventfold.projections.execution.fold import KEY_NOT_UTF8, VALUE_NOT_UTF8, BatchFold
from eventfold.projections.execution.guard import drop_applied
from eventfold.projections.outcome import RawRecords
from eventfold.projections.plan import compile_projection

TOPIC = "eventfold.events.Sale"

per_store = compile_projection(aggregation(
    "per_store", sources=["Sale"], key_by="store",
    aggregates={"revenue": Sum("total"), "sales": Count(), "last_city": Latest("city"),
                "avg_basket": Sum("basket")},
    columns={"revenue": BigInteger(), "sales": BigInteger(), "last_city": String(),
             "avg_basket": Float()},
    event_types=["SaleRecorded"]))


def envelope(offset: int, data: dict[str, Any], event_type: str = "SaleRecorded") -> str:
    return EventEnvelope(event_id=f"e{offset}", event_type=event_type, stream_id=f"s{offset % 3}",
                         stream_version=offset + 1, global_position=offset + 1,
                         recorded_at="2026-11-22T10:00:00Z", data=data).encode()[1]


def records(values: list[str | bytes | None],
            keys: list[str | bytes | None] | None = None) -> pa.Table:
    count = len(values)
    return records_table(RawRecords(
        TOPIC, 0, list(range(count)),
        keys if keys is not None else [f"s{i % 3}" for i in range(count)], values))


sale = st.fixed_dictionaries({
    "store": st.text(alphabet="abc", min_size=1, max_size=3),
    "total": st.integers(-10**12, 10**12),
    "city": st.text(max_size=8),
    "basket": st.floats(allow_nan=False, allow_infinity=False, width=32),
})


@settings(deadline=None)
@given(st.lists(sale, min_size=1, max_size=30))
def test_arrow_and_per_record_paths_agree(sales: list[dict[str, Any]]) -> None:
    table = records([envelope(i, data) for i, data in enumerate(sales)])
    schema = with_fields(EVENT_FIELDS, per_store)
    columnar = _decode_columnar(table, per_store, schema)
    assert columnar is not None
    per_record = _decode_per_record(table, per_store, schema)
    for name in ("key", "fold_key", "eventId", "eventType", "streamVersion", "globalPosition",
                 field_column("total"), field_column("city"), field_column("basket")):
        assert columnar.column(name).to_pylist() == per_record.column(name).to_pylist(), name
    assert columnar.column("reason").null_count == len(sales)


def test_bad_records_become_dead_letters_beside_good_ones() -> None:
    good = envelope(0, {"store": "north", "total": 12, "city": "Oslo", "basket": 1.5})
    table = records(
        [good, None, "not json", envelope(3, {"total": 5}), envelope(4, {"store": 7, "total": 1}),
         envelope(5, {"store": "x"}, event_type="SaleRefunded")],
        keys=["s0", "s1", "s2", "s0", "s1", "s2"])
    decoded = decode_events(table, per_store).to_pylist()
    by_offset = {row["offset"]: row for row in decoded}
    assert 5 not in by_offset  # another event type: skipped, not a dead letter
    assert by_offset[0]["reason"] is None and by_offset[0]["value"] is None
    assert by_offset[0][field_column("total")] == 12 and by_offset[0]["fold_key"] == "north"
    assert by_offset[1]["reason"] == "null value (tombstone) on an event topic"
    assert by_offset[2]["reason"].startswith("undecodable event envelope")
    assert by_offset[2]["value"] == "not json"  # the raw record travels with its dead letter
    assert by_offset[3]["reason"] == "re-key field 'store' is missing from the event"
    assert by_offset[4]["fold_key"] == "7"  # a number keys as its JSON text
    assert by_offset[4]["reason"] is None


def test_lines_that_are_not_one_object_go_the_per_record_way() -> None:
    """Arrow's JSON reader crashes the process on a line ``null`` (pyarrow 26): neither an
    envelope nor a payload that is not one object reaches it."""
    payload_null = envelope(1, {"store": "a"}).replace('"payload": "{\\"store\\": \\"a\\"}"',
                                                        '"payload": "null"')
    assert '"payload": "null"' in payload_null
    table = records(["null", payload_null, '{"a": 1}\nnull', envelope(3, {"store": "b"})],
                    keys=["s0", "s1", "s2", "s0"])
    by_offset = {row["offset"]: row for row in decode_events(table, per_store).to_pylist()}
    assert by_offset[0]["reason"].startswith("undecodable event envelope")
    assert by_offset[1]["reason"] == "event payload is not a JSON object"
    assert by_offset[2]["reason"].startswith("undecodable event envelope")
    assert by_offset[3]["reason"] is None and by_offset[3]["fold_key"] == "b"


def test_a_whole_number_too_large_for_bigint_is_skipped() -> None:
    table = records([envelope(0, {"store": "a", "total": 2**70})])
    row = decode_events(table, per_store).to_pylist()[0]
    assert row["reason"] is None and row[field_column("total")] is None


def test_a_field_of_another_type_is_null_not_a_failure() -> None:
    table = records([envelope(0, {"store": "a", "total": "twelve", "city": 3, "basket": True})])
    row = decode_events(table, per_store).to_pylist()[0]
    assert row["reason"] is None
    assert row[field_column("total")] is None and row[field_column("basket")] is None
    assert row[field_column("city")] == "3"


def test_keys_and_values_that_are_not_utf8_are_dead_letters_with_the_reason() -> None:
    """As the Python fold's reader judges them: Arrow's UTF-8 check must not fail the task,
    and a value whose bad byte sits inside a JSON string must not decode with a replacement
    character."""
    good = envelope(0, {"store": "north", "total": 12})
    bad_value = envelope(1, {"store": "north", "total": 1}).encode().replace(
        b"north", b"n\xe6rth")  # Latin-1, not UTF-8
    keys: list[str | bytes | None] = ["s0", "s1", b"\xffs2"]
    values: list[str | bytes | None] = [good.encode(), bad_value, good.encode()]
    decoded = {row["offset"]: row for row in decode_events(records(values, keys), per_store)
               .to_pylist()}
    assert decoded[0]["reason"] is None and decoded[0][field_column("total")] == 12
    assert decoded[1]["reason"] == VALUE_NOT_UTF8 and "\ufffd" in decoded[1]["value"]
    assert decoded[2]["reason"] == KEY_NOT_UTF8 and decoded[2]["key"] == "\ufffds2"
    batch = BatchFold(per_store)
    batch.add(RawRecords(TOPIC, 0, [0, 1, 2], keys, values))
    assert [(d.record.offset, d.reason) for d in batch.fold({}).dead_letters] == [
        (1, VALUE_NOT_UTF8), (2, KEY_NOT_UTF8)]


class _Watermarks:
    """The one thing ``drop_applied`` asks a store: the watermarks of some streams."""

    def __init__(self, marks: dict[str, int]) -> None:
        self.marks = marks

    def watermarks(self, streams: list[str]) -> dict[str, int]:
        return {s: self.marks[s] for s in streams if s in self.marks}


def test_events_at_or_below_their_stream_watermark_are_dropped_dead_letters_kept() -> None:
    table = records([envelope(i, {"store": "a", "total": i}) for i in range(6)] + [None],
                    keys=["s0", "s1", "s2", "s0", "s1", "s2", "s0"])
    events = decode_events(table, per_store)  # versions are offset + 1
    kept = drop_applied(events, _Watermarks({"s0": 4, "s1": 1}).watermarks)
    assert kept.column("offset").to_pylist() == [1, 2, 4, 5, 6]  # s0 v1 and v4 were applied
    assert kept.column("reason").to_pylist()[-1] is not None
    assert drop_applied(events, _Watermarks({}).watermarks).num_rows == 7
