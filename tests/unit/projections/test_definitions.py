"""Projection definitions: checked when defined, compiled into one plan."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import BigInteger, Float, String

from eventfold.projections import (
    Avg,
    Count,
    Derived,
    Dispatch,
    Event,
    FoldProjection,
    Latest,
    Lookup,
    Projection,
    State,
    Sum,
    aggregation,
    on_crossing,
    projection,
    stream,
)
from eventfold.projections.definition.fields import coerce, key_text, path_value
from eventfold.projections.plan import Pipeline, compile_projection
from eventfold.write_model import DomainEvent, default_registry


def event(event_type: str, **data: object) -> Event:
    return Event(event_type, data, "s1", 1, "e1", 1)


@dataclass(frozen=True)
class ItemAdded:
    """Shaped as a write_model DomainEvent is: a type name and ``from_data``."""

    quantity: int
    event_type = "ItemAdded"

    @classmethod
    def from_data(cls, data: dict) -> ItemAdded:
        return cls(**data)


def test_the_base_type_is_not_a_projection_of_its_own() -> None:
    with pytest.raises(TypeError, match="projection\\(\\), aggregation\\(\\) or stream\\(\\)"):
        Projection(name="p", sources=("A",))


def test_an_aggregation_needs_aggregate_functions_of_one_type_per_field() -> None:
    with pytest.raises(TypeError, match="needs an AggregateFunction"):
        aggregation("p", sources=["A"], aggregates={"n": "count"},  # type: ignore[dict-item]
                    columns={"n": BigInteger()})
    with pytest.raises(ValueError, match="field 'value' is aggregated as bigint and as string"):
        aggregation("p", sources=["A"], aggregates={"n": Sum("value"), "s": Latest("value")},
                    columns={"n": BigInteger(), "s": String()})
    with pytest.raises(ValueError, match="one column per aggregate"):
        aggregation("p", sources=["A"], aggregates={"n": Count()}, columns={})


def test_a_composite_column_has_its_type_and_hidden_components() -> None:
    with pytest.raises(ValueError, match="Avg column 'mean' must be of a double type"):
        aggregation("p", sources=["A"], aggregates={"mean": Avg("price")},
                    columns={"mean": BigInteger()})
    stats = aggregation("p", sources=["A"], columns={"mean": Float(), "n": BigInteger()},
                        aggregates={"mean": Avg("price"), "n": Count()})
    assert list(stats.stored_columns) == ["mean", "n", "_mean__sum", "_mean__count"]
    plan = compile_projection(stats)
    assert plan.payload_fields == {"price": "double"}
    step = plan.step
    assert step is not None
    state = None
    for price in (3, None, "x", 4):
        state = step(state, event("Sold", price=price))
    assert state == {"mean": 3.5, "n": 4, "_mean__sum": 7.0, "_mean__count": 2}


def test_paths_must_be_paths() -> None:
    with pytest.raises(ValueError, match=r"'a\.\.b' is not a field path"):
        projection("p", sources=["A"], columns={}, key_by="a..b")(lambda s, e: s)


def test_dispatch_by_class_and_by_name() -> None:
    levels = Dispatch()

    @levels.on(ItemAdded)
    def added(state, added: ItemAdded):
        return {"quantity": (state or {"quantity": 0})["quantity"] + added.quantity}

    @levels.on("ItemRemoved")
    def removed(state, removed: Event):
        return None

    defined = projection("levels", sources=["Item"], columns={"quantity": BigInteger()})(levels)
    assert defined.event_types == {"ItemAdded", "ItemRemoved"}
    assert levels({"quantity": 1}, event("ItemAdded", quantity=2)) == {"quantity": 3}
    assert levels({"quantity": 1}, event("ItemRemoved")) is None
    assert levels({"quantity": 1}, event("Other")) == {"quantity": 1}
    with pytest.raises(ValueError, match="already has a handler"):
        levels.on("ItemAdded")(removed)


@pytest.mark.parametrize(("definition", "pipeline", "fallback"), [
    (projection("a", sources=["A"], columns={})(lambda s, e: s),
     Pipeline.FOLD_IN_PLACE, Pipeline.FOLD_AFTER_SHUFFLE),
    (projection("b", sources=["A"], columns={}, key_by="x")(lambda s, e: s),
     Pipeline.FOLD_AFTER_SHUFFLE, None),
    (projection("c", sources=["A", "B"], columns={})(lambda s, e: s),
     Pipeline.FOLD_AFTER_SHUFFLE, None),
    (aggregation("d", sources=["A"], aggregates={"n": Count()}, columns={"n": BigInteger()}),
     Pipeline.AGGREGATE_IN_PLACE, Pipeline.AGGREGATE_AFTER_SHUFFLE),
    (stream("e", sources=["A"])(lambda e: []), Pipeline.FOLD_IN_PLACE,
     Pipeline.FOLD_AFTER_SHUFFLE),
])
def test_the_plan_of_each_kind(definition: Projection, pipeline: Pipeline,
                               fallback: Pipeline | None) -> None:
    plan = compile_projection(definition)
    assert (plan.pipeline, plan.fallback) == (pipeline, fallback)
    assert plan.stateful == definition.has_state
    assert isinstance(definition, FoldProjection) == (definition.kind == "fold")


def test_keys_and_fields_read_the_same_in_every_engine() -> None:
    data = {"where": {"store": 7}, "where.store": "flat", "ok": True}
    assert path_value(data, "where.store") == 7  # a path, never the dotted name
    assert path_value(data, "where.store.deeper") is None
    assert [key_text(v) for v in (7, True, 1.5, {"a": 1}, "x", None)] == [
        "7", "true", "1.5", '{"a":1}', "x", None]
    assert [coerce(v, "bigint") for v in (3, 2.0, True, "3", None, 2**63, -(2**63))] == [
        3, 2, None, None, None, None, -(2**63)]
    assert [coerce(v, "double") for v in (3, 2.5, False)] == [3.0, 2.5, None]
    looked_up = projection("p", sources=["A"], columns={},
                           lookup=Lookup("other", on="where.store"))(lambda s, e: s)
    assert looked_up.lookup_key(data) == "7"
    assert looked_up.lookup_key({}) is None  # no key: no join, rather than a row keyed "None"


@dataclass(frozen=True)
class ItemRemoved:
    quantity: int
    event_type = "ItemRemoved"
    schema_version = 1

    @classmethod
    def from_data(cls, data: dict) -> ItemRemoved:
        return cls(**data)


class Item:
    """Shaped as a write_model Aggregate is: its stream type."""

    stream_type = "Item"


def test_a_fold_receives_the_classes_it_names_and_the_event_for_names() -> None:
    seen: list[object] = []

    @projection("typed", sources=[Item], columns={"quantity": BigInteger()},
                event_types=[ItemAdded, ItemRemoved, "ItemRenamed"])
    def typed(state, event):
        """Quantity per item."""
        seen.append(event)
        match event:
            case ItemAdded(quantity=q):
                return {"quantity": (state or {"quantity": 0})["quantity"] + q}
            case ItemRemoved(quantity=q):
                return {"quantity": state["quantity"] - q}
        return state

    assert typed.sources == ("Item",)
    assert typed.event_types == {"ItemAdded", "ItemRemoved", "ItemRenamed"}
    assert typed.description == "Quantity per item."
    state = typed.apply(None, event("ItemAdded", quantity=5))
    state = typed.apply(state, event("ItemRemoved", quantity=2))
    renamed = event("ItemRenamed", name="x")
    assert typed.apply(state, renamed) == {"quantity": 3}
    assert seen == [ItemAdded(5), ItemRemoved(2), renamed]


def test_a_class_past_its_first_schema_version_that_cannot_lift_older_events_is_refused(
        ) -> None:
    @dataclass(frozen=True)
    class ItemMoved:
        event_type = "ItemMoved"
        schema_version = 2

        @classmethod
        def from_data(cls, data: dict) -> ItemMoved:
            return cls()

    with pytest.raises(ValueError, match="schema version 2 and has no from_stored"):
        projection("p", sources=["Item"], columns={}, event_types=[ItemMoved])(
            lambda s, e: s)


@dataclass(frozen=True)
class ShelfMoved(DomainEvent):
    """At version 2 ``aisle`` became ``location``; version 1's events are lifted."""

    event_type = "TestShelfMovedReadSide"
    schema_version = 2
    location: str


@default_registry.upcaster("TestShelfMovedReadSide", from_version=1)
def _aisle_to_location(data: dict) -> dict:
    return {"location": f"aisle {data['aisle']}"}


def test_a_typed_fold_receives_events_of_every_schema_version_at_the_current_one() -> None:
    seen: list[ShelfMoved] = []

    @projection("shelves", sources=["Shelf"], columns={}, event_types=[ShelfMoved])
    def shelves(state: State | None, moved: ShelfMoved) -> State | None:
        seen.append(moved)
        return {"location": moved.location}

    stored_v1 = Event("TestShelfMovedReadSide", {"aisle": 4}, "s1", 1, "e1", 1,
                      schema_version=1)
    current = Event("TestShelfMovedReadSide", {"location": "back"}, "s1", 2, "e2", 2,
                    schema_version=2)
    assert shelves.apply(shelves.apply(None, stored_v1), current) == {"location": "back"}
    assert seen == [ShelfMoved(location="aisle 4"), ShelfMoved(location="back")]
    newer = Event("TestShelfMovedReadSide", {"where": "?"}, "s1", 3, "e3", 3, schema_version=3)
    with pytest.raises(LookupError, match="v3 is newer than this code"):
        shelves.apply(None, newer)


@dataclass(frozen=True)
class ShelfFilled(DomainEvent):
    event_type = "TestShelfFilledRecorded"
    quantity: int


@dataclass(frozen=True)
class ShelfFull(DomainEvent):
    event_type = "TestShelfFull"
    shelf: str
    quantity: int


def test_a_typed_event_knows_where_it_was_recorded_and_what_its_lookup_joined() -> None:
    received: list[ShelfFilled] = []

    @projection("filled", sources=["Shelf"], columns={}, event_types=[ShelfFilled],
                lookup=Lookup("aisles", on="aisle"))
    def filled(state: State | None, event: ShelfFilled) -> State | None:
        received.append(event)
        return {"aisle": (event.recorded.joined or {}).get("name")}

    stored = Event("TestShelfFilledRecorded", {"quantity": 3}, "shelf-7", 4, "e9", 41,
                   "2026-12-08T03:00:00Z", {"name": "back"})
    assert filled.apply(None, stored) == {"aisle": "back"}
    [event] = received
    assert event == ShelfFilled(quantity=3)  # where it was recorded is no part of its value
    assert (event.recorded.stream_id, event.recorded.stream_version, event.recorded.event_id,
            event.recorded.global_position) == ("shelf-7", 4, "e9", 41)
    with pytest.raises(AttributeError, match="made here, not received from the store"):
        _ = ShelfFilled(quantity=3).recorded


def test_a_stream_and_a_folds_derive_receive_typed_events_and_derive_typed_ones() -> None:
    @stream("filled_log", sources=["Shelf"], event_types=[ShelfFilled])
    def filled_log(event: ShelfFilled):
        yield Derived("log", event.recorded.stream_id, "Filled", {"quantity": event.quantity})

    def full(event: ShelfFilled, state: State) -> Derived:
        return Derived.of("full", event.recorded.stream_id, ShelfFull(
            shelf=event.recorded.stream_id, quantity=state["quantity"]))

    @projection("levels", sources=["Shelf"], columns={}, event_types=[ShelfFilled],
                derive=on_crossing(lambda state: state["quantity"] >= 5, full))
    def levels(state: State | None, event: ShelfFilled) -> State | None:
        return {"quantity": (state or {"quantity": 0})["quantity"] + event.quantity}

    stored = Event("TestShelfFilledRecorded", {"quantity": 6}, "shelf-7", 1, "e1", 1)
    assert list(filled_log.derive(stored, None, None)) == [  # type: ignore[misc]
        Derived("log", "shelf-7", "Filled", {"quantity": 6})]
    assert levels.derive is not None
    assert list(levels.derive(stored, None, levels.apply(None, stored))) == [
        Derived("full", "shelf-7", "TestShelfFull", {"shelf": "shelf-7", "quantity": 6})]
