"""Inventory: products receive and ship stock; a projection keeps the quantity per product.

    POST /commands/ReceiveStock {"product": "apples", "quantity": 5}
    POST /commands/ShipStock    {"product": "apples", "quantity": 2}
    GET  /read-models/inventory_totals/rows/apples  ->  {"row": {"key": "apples", "quantity": 3,
                                                         ...}, "freshness": {...}}
    GET  /read-models/inventory_totals/rows?quantity.gte=10&sort=-quantity   (indexed: sorts)
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field
from sqlalchemy import BigInteger

from eventfold import (
    Aggregate,
    Command,
    DomainError,
    DomainEvent,
    Eventfold,
    State,
    TargetId,
    handles,
    projection,
)


@dataclass(frozen=True)
class StockReceived(DomainEvent):
    product: str
    quantity: int


@dataclass(frozen=True)
class StockShipped(DomainEvent):
    product: str
    quantity: int


class ReceiveStock(Command):
    """Record a delivery of ``quantity`` units of ``product``."""

    product: str = TargetId(min_length=1, max_length=200)
    quantity: int = Field(gt=0, le=1_000_000)


class ShipStock(Command):
    """Ship ``quantity`` units of a known ``product``; fails if fewer are on hand."""

    product: str = TargetId(min_length=1, max_length=200)
    quantity: int = Field(gt=0, le=1_000_000)


class Product(Aggregate):
    snapshot_every = 100
    on_hand: int = 0

    @handles(ReceiveStock)
    def receive_stock(self, quantity: int) -> None:
        if quantity <= 0:
            raise DomainError(f"quantity must be positive, got {quantity}")
        self.record(StockReceived(product=self.id, quantity=quantity))

    @handles(ShipStock, requires_existing=True)
    def ship(self, quantity: int) -> None:
        if quantity > self.on_hand:
            raise DomainError(f"cannot ship {quantity} of {self.id}: {self.on_hand} on hand")
        self.record(StockShipped(product=self.id, quantity=quantity))

    def apply(self, event: DomainEvent) -> None:
        match event:
            case StockReceived(quantity=quantity):
                self.on_hand += quantity
            case StockShipped(quantity=quantity):
                self.on_hand -= quantity


@projection("inventory_totals", sources=[Product], columns={"quantity": BigInteger()},
            event_types=[StockReceived, StockShipped], indexes=["quantity"])
def inventory_totals(state: State | None, event: StockReceived | StockShipped) -> State | None:
    """Quantity on hand per product."""
    quantity = (state or {"quantity": 0})["quantity"]
    match event:
        case StockReceived(quantity=received):
            return {"quantity": quantity + received}
        case StockShipped(quantity=shipped):
            return {"quantity": quantity - shipped}


app = Eventfold("inventory", aggregates=[Product], projections=[inventory_totals])
