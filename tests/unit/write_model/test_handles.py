"""A command handler declared on the aggregate method it calls (``@handles``)."""

from __future__ import annotations

import pytest

from eventfold import Aggregate, Command, handles
from eventfold.write_model import CommandRegistry
from examples.inventory import Product, ReceiveStock, ShipStock, StockReceived


def test_the_registry_calls_the_method_with_the_fields_it_names() -> None:
    registry = CommandRegistry()
    registry.add(Product)
    receive, ship = registry.get("ReceiveStock"), registry.get("ShipStock")
    assert (receive.aggregate, receive.requires_existing) == (Product, False)
    assert (ship.command, ship.requires_existing) == (ShipStock, True)
    product = Product("apples")
    receive.handle(product, ReceiveStock(product="apples", quantity=5))
    assert product.on_hand == 5
    assert product.pending_events == [StockReceived("apples", 5)]


def test_a_method_parameter_no_command_field_fills_is_refused_when_added() -> None:
    class Rename(Command):
        name: str

        def stream_id(self) -> str:
            return self.name

    class Thing(Aggregate):
        @handles(Rename)
        def rename(self, title: str) -> None: ...

    class Plain(Aggregate):
        pass

    with pytest.raises(ValueError, match=r"Thing\.rename takes title, which Rename has no field"):
        CommandRegistry().add(Thing)
    with pytest.raises(ValueError, match="Plain has no method marked @handles"):
        CommandRegistry().add(Plain)


def test_a_target_field_names_the_aggregate_and_a_creating_handler_refuses_an_existing_one(
) -> None:
    """``TargetId`` stands for a ``stream_id`` method; ``creates=True`` for the check that the
    aggregate does not exist yet. Both through the command bus, in memory."""
    from dataclasses import dataclass

    from pydantic import Field

    from eventfold import Aggregate, Command, DomainError, DomainEvent, Eventfold, TargetId
    from eventfold.testing import AggregateFixture

    @dataclass(frozen=True)
    class TicketOpened(DomainEvent):
        title: str

    class OpenTicket(Command):
        ticket: str = TargetId(min_length=1)
        title: str = Field(min_length=1)

    class Ticket(Aggregate):
        @handles(OpenTicket, creates=True)
        def open(self, title: str) -> None:
            self.record(TicketOpened(title=title))

        def apply(self, event: DomainEvent) -> None:
            pass

    app = Eventfold("tickets")
    app.commands.add(Ticket)
    assert OpenTicket(ticket="t-1", title="x").stream_id() == "t-1"
    (AggregateFixture(app, "t-1").when(OpenTicket(ticket="t-1", title="x"))
     .then(TicketOpened(title="x")))
    (AggregateFixture(app, "t-1").given(TicketOpened(title="x"))
     .when(OpenTicket(ticket="t-1", title="y"))
     .then_refused(DomainError, "Ticket t-1 exists already"))
    with pytest.raises(TypeError, match="one field names the aggregate"):
        class Twice(Command):
            a: str = TargetId()
            b: str = TargetId()
    with pytest.raises(ValueError, match="creates an aggregate or requires one"):
        handles(OpenTicket, creates=True, requires_existing=True)


def test_state_declared_on_the_class_starts_each_aggregate_afresh() -> None:
    from typing import ClassVar

    class Basket(Aggregate):
        snapshot_every: ClassVar[int] = 10
        items: set[str] = set()  # noqa: RUF012 (each basket gets a copy)
        total: int = 0

    class GiftBasket(Basket):
        wrapped: bool = False

    one, two = GiftBasket("b1"), GiftBasket("b2")
    one.items.add("tea")
    one.total = 5
    assert (two.items, two.total, two.wrapped) == (set(), 0, False)
    assert one.snapshot_state() == {"items": {"tea"}, "total": 5, "wrapped": False}
    assert "snapshot_every" not in vars(one) and Basket.items == set()
