"""A reaction's commands and their ids: the same event always asks for the same ids."""

from __future__ import annotations

import uuid

import pytest

from eventfold.projections import Event
from eventfold.reactions import Reaction, ReactionRegistry, command_id_for, reaction
from examples.fulfilment import Purchase, ReserveStock, reserve_stock


def _placed(event_id: str = "e1", purchase: str = "p1") -> Event:
    return Event("PurchasePlaced", {"shelf_id": "apples", "quantity": 2}, purchase, 1,
                 event_id, 7)


def test_an_event_acted_on_again_asks_for_the_same_command_ids() -> None:
    first = reserve_stock.commands_for(_placed())
    again = reserve_stock.commands_for(_placed())
    assert [c.command_id for c in first] == [c.command_id for c in again]
    assert first[0].command_id == command_id_for("reserve_stock", "e1", 0)
    assert first[0] == ReserveStock(shelf_id="apples", purchase_id="p1", quantity=2,
                                    command_id=first[0].command_id)


def test_ids_differ_by_event_by_index_and_by_reaction() -> None:
    ids = {command_id_for("a", "e1", 0), command_id_for("a", "e1", 1),
           command_id_for("a", "e2", 0), command_id_for("b", "e1", 0)}
    assert len(ids) == 4


def test_one_command_several_or_none_and_an_id_the_function_set_is_kept() -> None:
    mine = uuid.uuid4()

    def react(event: Event) -> list[ReserveStock]:
        return [ReserveStock(shelf_id="a", purchase_id=event.stream_id, quantity=1),
                ReserveStock(shelf_id="b", purchase_id=event.stream_id, quantity=1,
                             command_id=mine)]

    several = Reaction("two", ("Purchase",), react).commands_for(_placed())
    assert [c.command_id for c in several] == [command_id_for("two", "e1", 0), mine]
    assert reserve_stock.commands_for(Event("Other", {}, "p1", 2, "e2", 8)) == []


def test_sources_take_aggregate_classes_and_names_are_checked() -> None:
    assert reaction("r", sources=[Purchase, "Shelf"])(lambda e: None).sources == (
        "Purchase", "Shelf")
    with pytest.raises(ValueError, match="use letters, digits and _"):
        Reaction("no spaces", ("Purchase",), lambda e: None)
    with pytest.raises(ValueError, match="names no sources"):
        Reaction("r", (), lambda e: None)
    registry = ReactionRegistry()
    registry.add(reserve_stock)
    with pytest.raises(ValueError, match="already registered"):
        registry.add(reserve_stock)
    with pytest.raises(LookupError, match="known: reserve_stock"):
        registry.get("nope")


def test_a_typed_reaction_gets_its_classes_and_skips_other_types() -> None:
    from eventfold.reactions import DerivedEvents
    from eventfold.reactions.definition import topics_of, wants
    from examples.fulfilment import PurchasePlaced

    @reaction("typed", sources=[Purchase, DerivedEvents("eventfold.notifications.x")],
              event_types=[PurchasePlaced])
    def typed(event: PurchasePlaced) -> ReserveStock:
        return ReserveStock(shelf_id=event.shelf_id, purchase_id="p", quantity=event.quantity)

    assert typed.sources == ("Purchase",)
    assert topics_of(typed) == ["eventfold.events.Purchase", "eventfold.notifications.x"]
    assert wants(typed, "PurchasePlaced") and not wants(typed, "PurchasePaid")
    (command,) = typed.commands_for(_placed())
    assert (command.shelf_id, command.quantity) == ("apples", 2)
    with pytest.raises(ValueError, match="names no sources"):
        reaction("none", sources=[])(lambda e: None)
