"""Fulfilment: a reaction turns each placed purchase into a stock reservation, and a process
manager cancels a purchase not paid in time.

    POST /commands/StockShelf    {"shelf_id": "apples", "quantity": 100}
    POST /commands/PlacePurchase {"purchase_id": "p1", "shelf_id": "apples", "quantity": 2}
    POST /commands/PayPurchase   {"purchase_id": "p1"}

``reserve_stock`` reacts to every ``PurchasePlaced`` by sending ``ReserveStock`` to the
purchase's shelf. A shelf does not remember which purchases it reserved for: what keeps a
purchase from being reserved twice, through crashes and restarts, is the id the reaction
gives the command (the same every time it acts on the event), which the command log
answers with the first result. A shelf without enough stock refuses; the refusal is
recorded with the purchase's event (``eventfold reaction refusals reserve_stock``) and the
reaction goes on.

``payment_deadline`` is a process per purchase: placed, it schedules a ``payment_due`` timer
``pay_within_s`` later; paid, it ends; if the timer fires first, it sends ``CancelPurchase``
and ends. The timer is kept in Postgres and fires once, also when it fell due while no runner
was up. Run both with ``eventfold reaction run``, or ``eventfold projection run --all``: the
``shelf_stock`` projection (stocked and reserved per shelf) and both reactions in one
process.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pydantic import Field
from sqlalchemy import BigInteger

from eventfold import (
    Aggregate,
    Command,
    DomainError,
    DomainEvent,
    Event,
    Eventfold,
    ProcessContext,
    State,
    TargetId,
    handles,
    process,
    projection,
    reaction,
)


@dataclass(frozen=True)
class ShelfStocked(DomainEvent):
    quantity: int


@dataclass(frozen=True)
class StockReserved(DomainEvent):
    purchase_id: str
    quantity: int


@dataclass(frozen=True)
class PurchasePlaced(DomainEvent):
    shelf_id: str
    quantity: int
    pay_within_s: int = 3600


@dataclass(frozen=True)
class PurchasePaid(DomainEvent):
    pass


@dataclass(frozen=True)
class PurchaseCancelled(DomainEvent):
    reason: str


class StockShelf(Command):
    """Put stock on a shelf."""

    shelf_id: str = TargetId(min_length=1, max_length=100)
    quantity: int = Field(gt=0)


class PlacePurchase(Command):
    """Buy from a shelf; the stock is reserved by the reaction."""

    purchase_id: str = TargetId(min_length=1, max_length=100)
    shelf_id: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0)
    pay_within_s: int = Field(default=3600, gt=0)


class PayPurchase(Command):
    """Pay for a purchase (before its deadline, or it is cancelled)."""

    purchase_id: str = TargetId(min_length=1, max_length=100)


class CancelPurchase(Command):
    """Cancel an unpaid purchase (sent by ``payment_deadline``)."""

    purchase_id: str = TargetId(min_length=1, max_length=100)
    reason: str = Field(min_length=1, max_length=200)


class ReserveStock(Command):
    """Reserve a purchase's quantity on its shelf (sent by ``reserve_stock``)."""

    shelf_id: str = TargetId(min_length=1, max_length=100)
    purchase_id: str = Field(min_length=1, max_length=100)
    quantity: int = Field(gt=0)


class Shelf(Aggregate):
    available: int = 0

    @handles(StockShelf)
    def stock(self, quantity: int) -> None:
        self.record(ShelfStocked(quantity=quantity))

    @handles(ReserveStock, requires_existing=True)
    def reserve(self, purchase_id: str, quantity: int) -> None:
        if quantity > self.available:
            raise DomainError(f"shelf {self.id} has {self.available} available, purchase "
                              f"{purchase_id} asks for {quantity}")
        self.record(StockReserved(purchase_id=purchase_id, quantity=quantity))

    def apply(self, event: DomainEvent) -> None:
        if isinstance(event, ShelfStocked):
            self.available += event.quantity
        elif isinstance(event, StockReserved):
            self.available -= event.quantity


class Purchase(Aggregate):
    paid: bool = False
    cancelled: bool = False

    @handles(PlacePurchase, creates=True)
    def place(self, shelf_id: str, quantity: int, pay_within_s: int) -> None:
        self.record(PurchasePlaced(shelf_id=shelf_id, quantity=quantity,
                                   pay_within_s=pay_within_s))

    @handles(PayPurchase, requires_existing=True)
    def pay(self) -> None:
        if self.cancelled:
            raise DomainError(f"purchase {self.id} was cancelled")
        self.record(PurchasePaid())

    @handles(CancelPurchase, requires_existing=True)
    def cancel(self, reason: str) -> None:
        if self.paid:
            raise DomainError(f"purchase {self.id} is paid")
        self.record(PurchaseCancelled(reason=reason))

    def apply(self, event: DomainEvent) -> None:
        if isinstance(event, PurchasePaid):
            self.paid = True
        elif isinstance(event, PurchaseCancelled):
            self.cancelled = True


@projection("shelf_stock", sources=["Shelf"], event_types=[ShelfStocked, StockReserved],
            columns={"stocked": BigInteger(), "reserved": BigInteger()})
def shelf_stock(state: State | None, event: ShelfStocked | StockReserved) -> State | None:
    """What each shelf was stocked with and what purchases reserved of it."""
    current = state or {"stocked": 0, "reserved": 0}
    match event:
        case ShelfStocked(quantity=quantity):
            return {**current, "stocked": current["stocked"] + quantity}
        case StockReserved(quantity=quantity):
            return {**current, "reserved": current["reserved"] + quantity}
    return current


@reaction("reserve_stock", sources=[Purchase], event_types=[PurchasePlaced])
def reserve_stock(placed: PurchasePlaced) -> ReserveStock:
    """Every placed purchase reserves its quantity on its shelf."""
    return ReserveStock(shelf_id=placed.shelf_id, purchase_id=placed.recorded.stream_id,
                        quantity=placed.quantity)


@process("payment_deadline", sources=[Purchase],
         event_types=[PurchasePlaced, PurchasePaid, PurchaseCancelled])
def payment_deadline(purchase: ProcessContext,
                     event: PurchasePlaced | PurchasePaid | PurchaseCancelled | Event) -> None:
    """A purchase not paid within its ``pay_within_s`` is cancelled."""
    match event:
        case PurchasePlaced(pay_within_s=pay_within_s):
            purchase.state["placed"] = purchase.now.isoformat()
            purchase.schedule("payment_due", after=timedelta(seconds=pay_within_s))
        case PurchasePaid() | PurchaseCancelled():
            purchase.done()
        case Event(type="payment_due"):
            purchase.send(CancelPurchase(purchase_id=purchase.key, reason="not paid in time"))
            purchase.done()


app = Eventfold("fulfilment", aggregates=[Shelf, Purchase], projections=[shelf_stock],
                reactions=[reserve_stock, payment_deadline])
