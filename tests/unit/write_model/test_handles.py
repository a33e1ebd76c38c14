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
