"""The fold engine without Spark: guards, deletes, poison events."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
from sqlalchemy import BigInteger

from eventfold.contract import EventEnvelope
from eventfold.projections import fold_in_memory, projection
from eventfold.projections.execution import task_output
from eventfold.projections.execution.fold import BatchFold, fold_records
from eventfold.projections.outcome import (
    PARKED_BEHIND,
    KeyState,
    ParkedKey,
    RawRecords,
    SourceRecord,
)
from eventfold.projections.state.stage import StagedBatch
from examples.inventory import inventory_totals

TOPIC = "eventfold.events.Product"


def stock(product: str, version: int, quantity: int, offset: int, partition: int = 0,
          event_type: str = "StockReceived") -> SourceRecord:
    key, value = EventEnvelope(
        event_id=f"{product}-{version}", event_type=event_type, stream_id=product,
        stream_version=version, global_position=offset + 1, recorded_at="",
        data={"product": product, "quantity": quantity},
    ).encode()
    return SourceRecord(TOPIC, partition, offset, key, value)


def test_totals_per_key() -> None:
    records = [stock("a", 1, 5, 0), stock("b", 1, 3, 1), stock("a", 2, 7, 2)]
    assert fold_in_memory(inventory_totals, records) == {"a": {"quantity": 12},
                                                         "b": {"quantity": 3}}


def test_redelivered_event_counts_once() -> None:
    # Debezium re-sends after a crash: same event (same stream version) at a later offset.
    records = [stock("a", 1, 5, 0), stock("a", 2, 7, 1), stock("a", 2, 7, 2), stock("a", 1, 5, 3)]
    outcome = fold_records(inventory_totals, {}, records)
    assert outcome.changed["a"].state == {"quantity": 12}
    assert (outcome.applied, outcome.duplicates) == (2, 2)


def test_stored_version_guards_replayed_batch() -> None:
    stored = {"a": KeyState({"quantity": 12}, version=2)}
    outcome = fold_records(inventory_totals, stored, [stock("a", 2, 7, 5), stock("a", 3, 1, 6)])
    assert outcome.changed["a"].state == {"quantity": 13}
    assert outcome.duplicates == 1


def test_records_below_committed_offsets_are_skipped() -> None:
    records = [stock("a", 1, 5, 0), stock("a", 2, 7, 1)]
    outcome = fold_records(inventory_totals, {}, records, committed_offsets={(TOPIC, 0): 1})
    assert outcome.skipped == 1
    assert outcome.changed["a"].state == {"quantity": 7}
    assert outcome.next_offsets == {(TOPIC, 0): 2}


def test_undecodable_record_is_dead_lettered_and_fold_continues() -> None:
    records = [SourceRecord(TOPIC, 0, 0, "a", "{not json"), SourceRecord(TOPIC, 0, 1, None, "{}"),
               stock("a", 1, 5, 2)]
    outcome = fold_records(inventory_totals, {}, records)
    assert [d.record.offset for d in outcome.dead_letters] == [0, 1]
    assert "undecodable" in outcome.dead_letters[0].reason
    assert outcome.changed["a"].state == {"quantity": 5}


def poisoned(record: SourceRecord) -> SourceRecord:
    """``record`` with a quantity the inventory fold cannot add."""
    return record._replace(value=record.value.replace('\\"quantity\\": 5',
                                                      '\\"quantity\\": \\"many\\"'))


def test_fold_that_raises_is_dead_lettered_with_its_event_and_parks_its_key() -> None:
    bad = poisoned(stock("a", 2, 5, 1))
    outcome = fold_records(inventory_totals, {}, [stock("a", 1, 4, 0), bad, stock("a", 3, 1, 2),
                                                  stock("b", 1, 5, 3)])
    failed, parked = outcome.dead_letters
    assert "fold raised" in failed.reason
    assert EventEnvelope.decode(failed.record.key, failed.record.value) == EventEnvelope.decode(
        bad.key, bad.value, with_metadata=False)
    assert parked.record.offset == 2
    assert parked.reason == f"{PARKED_BEHIND}{TOPIC}[0]@1 (event a-2)"
    assert (failed.fold_key, parked.fold_key) == ("a", "a")
    assert outcome.parked == {"a": ParkedKey(TOPIC, 0, 1, "a-2", failed.reason)}
    # The key keeps what it folded before the failure; other keys fold on.
    assert outcome.changed["a"] == KeyState({"quantity": 4}, 1, 1)
    assert outcome.changed["b"].state == {"quantity": 5}
    assert outcome.watermarks["a"] == 3  # met: a redelivery is a duplicate, not a new letter


def test_a_projection_that_opts_out_folds_on_after_a_failure() -> None:
    folds_on = replace(inventory_totals, park_on_failure=False)
    outcome = fold_records(folds_on, {}, [poisoned(stock("a", 1, 5, 0)), stock("a", 2, 1, 1)])
    assert len(outcome.dead_letters) == 1
    assert outcome.parked == {}
    assert outcome.changed["a"].state == {"quantity": 1}


def test_events_of_a_key_parked_before_the_batch_wait_behind_it() -> None:
    head = ParkedKey(TOPIC, 0, 0, "a-1", "fold raised ValueError()")
    outcome = fold_records(inventory_totals, {}, [stock("a", 2, 1, 1), stock("b", 1, 2, 2)],
                           parked={"a": head})
    assert [(d.record.offset, d.reason) for d in outcome.dead_letters] == [
        (1, f"{PARKED_BEHIND}{head}")]
    assert outcome.held == {"a"}
    assert outcome.parked == {}  # parked already: its head stays the first event
    assert "a" not in outcome.changed and outcome.changed["b"].state == {"quantity": 2}


def test_a_key_parked_in_one_chunk_stays_parked_in_the_next() -> None:
    batch = BatchFold(inventory_totals)
    for record in (poisoned(stock("a", 1, 5, 0)), stock("a", 2, 1, 1)):
        batch.add(RawRecords(TOPIC, 0, [record.offset], [record.key], [record.value]))
        batch.fold({})
    assert [d.record.offset for d in batch.outcome.dead_letters] == [0, 1]
    assert "a" not in batch.outcome.changed


def test_a_tasks_counts_and_held_keys_cross_to_the_driver() -> None:
    """A task hands over counts and the few keys it held back, never the keys it folded."""
    started = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)
    counts = StagedBatch("attempt-1", new_rows=3, known_rows=2, marks=1, applied=9,
                         duplicates=1, dead_letters=2, held={"c"}, topics={"derived"},
                         servers={started})
    summary = pa.Table.from_batches([task_output.encode(counts),
                                     task_output.encode(StagedBatch("attempt-1", applied=1))])
    decoded = task_output.decode(summary, "attempt-1")
    assert (decoded.new_rows, decoded.known_rows, decoded.marks, decoded.applied,
            decoded.duplicates, decoded.dead_letters) == (3, 2, 1, 10, 1, 2)
    assert (decoded.held, decoded.topics, decoded.servers) == ({"c"}, {"derived"}, {started})


def test_envelopes_off_the_usual_shape_fold_like_the_usual_ones() -> None:
    """Records the fast parser declines (bytes, a payload already an object, a version as
    text, a null record time) take the full decoder and fold the same; a key that is not
    UTF-8 is a dead letter, not a crash."""
    usual = stock("a", 1, 5, 0)
    envelope = json.loads(usual.value)
    odd_values: list[str | bytes] = [
        json.dumps({**envelope, "payload": {"product": "a", "quantity": 5}}),
        json.dumps({**envelope, "streamVersion": "1"}),
        json.dumps({**envelope, "recordedAt": None}),
        usual.value.encode(),
    ]
    expected = fold_records(inventory_totals, {}, [usual]).changed
    for value in odd_values:
        outcome = fold_records(inventory_totals, {}, [SourceRecord(TOPIC, 0, 0, "a", value)])
        assert outcome.changed == expected, value
        assert not outcome.dead_letters
    batch = BatchFold(inventory_totals)
    batch.add(RawRecords(TOPIC, 0, [0, 1], [b"\xff", "a"], [usual.value, usual.value]))
    outcome = batch.fold({})
    assert [(d.record.offset, d.record.key) for d in outcome.dead_letters] == [(0, "\ufffd")]
    assert "not UTF-8" in outcome.dead_letters[0].reason
    assert outcome.changed == expected
    no_key = RawRecords(TOPIC, 0, [0, 1, 2], [b"\xff", None, "a"], [None, None, None])
    assert no_key.stream_ids() == {"a"}  # what a task loads states for


def test_events_of_a_key_out_of_position_order_fold_in_position_order() -> None:
    records = [stock("a", 2, 7, 1), stock("a", 1, 5, 0), stock("a", 3, 1, 2)]
    records = [records[0]._replace(offset=0), records[1]._replace(offset=1), records[2]]

    @projection("history", sources=["Product"], columns={"seen": BigInteger()})
    def history(state, event):
        assert event.stream_version == (state or {"seen": 0})["seen"] + 1
        return {"seen": event.stream_version}

    outcome = fold_records(history, {}, records)
    assert outcome.changed["a"] == KeyState({"seen": 3}, 3, 3)
    assert not outcome.dead_letters


def test_none_deletes_and_keeps_the_version_guard() -> None:
    @projection("deletable", sources=["Product"], columns={"quantity": BigInteger()})
    def deletable(state, event):
        if event.type == "Delisted":
            return None
        return {"quantity": (state or {"quantity": 0})["quantity"] + event.data["quantity"]}

    records = [stock("a", 1, 5, 0), stock("a", 2, 0, 1, event_type="Delisted"),
               stock("a", 2, 0, 2, event_type="Delisted")]
    outcome = fold_records(deletable, {}, records)
    assert outcome.changed["a"].state is None
    assert outcome.changed["a"].version == 2
    assert outcome.duplicates == 1
    assert fold_in_memory(deletable, records) == {}


def test_unhandled_event_types_are_skipped_but_advance_the_version() -> None:
    records = [stock("a", 1, 5, 0), stock("a", 2, 9, 1, event_type="PriceChanged"),
               stock("a", 3, 1, 2)]
    outcome = fold_records(inventory_totals, {}, records)
    assert outcome.changed["a"] == KeyState({"quantity": 6}, 3, 3)
    assert not outcome.dead_letters


def test_state_with_unknown_columns_is_rejected() -> None:
    @projection("sloppy", sources=["Product"], columns={"quantity": BigInteger()})
    def sloppy(state, event):
        return {"quantity": 1, "colour": "red"}

    outcome = fold_records(sloppy, {}, [stock("a", 1, 5, 0)])
    assert "not read model columns" in outcome.dead_letters[0].reason


def test_a_fold_that_makes_an_integer_beyond_64_bits_dead_letters_that_event() -> None:
    """No column, JSON encoder or consumer holds it: the event is a dead letter, the key keeps
    its state (and parks), and the batch goes on."""
    @projection("huge", sources=["Product"], columns={"quantity": BigInteger()})
    def huge(state, event):
        return {"quantity": (state or {"quantity": 0})["quantity"] + event.data["quantity"]}

    outcome = fold_records(huge, {}, [stock("a", 1, 2**62, 0), stock("a", 2, 2**62, 1),
                                      stock("b", 1, 5, 2)])
    assert outcome.changed["a"].state == {"quantity": 2**62}
    (letter,) = outcome.dead_letters
    assert letter.record.offset == 1 and "beyond 64 bits" in letter.reason
    assert outcome.changed["b"].state == {"quantity": 5}
