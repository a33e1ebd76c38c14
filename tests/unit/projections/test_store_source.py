"""The event store's rows as a fold's records: decoded where they are read, they fold as the
connector's envelopes of the same events do, and a row that is no event is a dead letter."""

from __future__ import annotations

import orjson

from eventfold.contract import EventEnvelope, envelope_value
from eventfold.outbox.history import STORE_TOPIC, HistoryRow
from eventfold.projections.execution.decode import decode_events, records_table
from eventfold.projections.execution.fold import BatchFold
from eventfold.projections.execution.store_source import StoreSlice
from eventfold.projections.outcome import RawRecords
from eventfold.projections.plan import as_plan
from examples.inventory import inventory_totals

RECORDED_AT = "2026-11-26T13:11:34.1234Z"


def row(position: int, product: str, version: int, payload: object) -> HistoryRow:
    return (position, product, f"e{position}", "StockReceived", version, RECORDED_AT,
            orjson.dumps(payload).decode(), 1)


ROWS = [row(1, "a", 1, {"product": "a", "quantity": 5}),
        row(2, "b", 1, {"product": "b", "quantity": 3}),
        row(3, "a", 2, [1, 2]),  # the store holds JSON, but not an event's object
        row(4, "a", 3, {"product": "a", "quantity": 7})]


def from_store(rows: list[HistoryRow]) -> RawRecords:
    return StoreSlice("postgresql://unused", ("Product",), 0, 4, 0)._records(rows)


def as_envelopes(rows: list[HistoryRow]) -> RawRecords:
    """The same events as the connector puts them on a topic."""
    values = [EventEnvelope(event_id=event_id, event_type=event_type, stream_id=stream_id,
                            stream_version=version, global_position=position,
                            recorded_at=recorded_at, data=orjson.loads(payload)).encode()[1]
              if payload.startswith("{") else envelope_value(
                  event_id, event_type, version, position, recorded_at, payload)
              for position, stream_id, event_id, event_type, version, recorded_at, payload, _
              in rows]
    return RawRecords(STORE_TOPIC, 0, [r[0] for r in rows], [r[1] for r in rows], values)


def folded(records: RawRecords) -> BatchFold:
    batch = BatchFold(inventory_totals)
    batch.add(records)
    batch.fold({})
    return batch


def test_store_rows_fold_as_the_connectors_envelopes_of_the_same_events() -> None:
    store, topic = folded(from_store(ROWS)).outcome, folded(as_envelopes(ROWS)).outcome
    assert store.changed == topic.changed
    assert store.changed["a"].state == {"quantity": 12}
    assert store.changed["a"].version == 3
    assert [letter.reason for letter in store.dead_letters] == [
        "event payload is not a JSON object"]
    assert store.dead_letters == topic.dead_letters
    letter = store.dead_letters[0].record
    assert (letter.offset, letter.key) == (3, "a")
    assert orjson.loads(letter.value or "")["payload"] == "[1,2]"  # as the store had it


def test_store_rows_decode_into_the_columns_of_the_same_envelopes() -> None:
    plan = as_plan(inventory_totals)
    store = decode_events(records_table(from_store(ROWS)), plan)
    topic = decode_events(records_table(as_envelopes(ROWS)), plan)
    assert store.to_pylist() == topic.to_pylist()
    assert store.column("recordedAt").to_pylist()[0] == RECORDED_AT
