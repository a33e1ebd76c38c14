"""A process whose events name it by different fields: each event type maps to its own path,
as each of a saga's handlers names its association property."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from pydantic import Field

from eventfold import (
    Aggregate,
    Command,
    DomainEvent,
    Eventfold,
    ProcessContext,
    TargetId,
    handles,
    process,
)
from eventfold.projections import Event
from eventfold.testing import InMemoryApp


@dataclass(frozen=True)
class KeyedOrderPlaced(DomainEvent):
    order_id: str


@dataclass(frozen=True)
class KeyedPaymentTaken(DomainEvent):
    order: dict[str, str]


class PlaceKeyedOrder(Command):
    order_id: str = TargetId(min_length=1)


class TakeKeyedPayment(Command):
    payment_id: str = TargetId(min_length=1)
    order_id: str = Field(min_length=1)


class CancelKeyedOrder(Command):
    order_id: str = TargetId(min_length=1)


class KeyedOrder(Aggregate):
    @handles(PlaceKeyedOrder)
    def place(self) -> None:
        self.record(KeyedOrderPlaced(order_id=self.id))

    @handles(CancelKeyedOrder)
    def cancel(self) -> None:
        pass

    def apply(self, event: DomainEvent) -> None:
        pass


class KeyedPayment(Aggregate):
    @handles(TakeKeyedPayment)
    def take(self, order_id: str) -> None:
        self.record(KeyedPaymentTaken(order={"id": order_id}))

    def apply(self, event: DomainEvent) -> None:
        pass


@process("unpaid_orders", sources=[KeyedOrder, KeyedPayment],
         key_by={KeyedOrderPlaced: "order_id", KeyedPaymentTaken: "order.id"},
         event_types=[KeyedOrderPlaced, KeyedPaymentTaken])
def unpaid_orders(order: ProcessContext, event: KeyedOrderPlaced | KeyedPaymentTaken | Event
                  ) -> None:
    match event:
        case KeyedOrderPlaced():
            order.schedule("unpaid", after=timedelta(hours=1))
        case KeyedPaymentTaken():
            order.done()
        case Event(type="unpaid"):
            order.send(CancelKeyedOrder(order_id=order.key))
            order.done()


app = Eventfold("orders_and_payments", aggregates=[KeyedOrder, KeyedPayment],
                reactions=[unpaid_orders])


def test_events_of_two_streams_meet_in_one_process_by_their_own_fields() -> None:
    shop = InMemoryApp(app)
    shop.execute(PlaceKeyedOrder(order_id="o1"))
    shop.execute(PlaceKeyedOrder(order_id="o2"))
    shop.execute(TakeKeyedPayment(payment_id="pay-9", order_id="o1"))  # another stream, o1's
    assert sorted(key for key, _ in shop.timers("unpaid_orders")) == ["o2"]
    shop.advance(timedelta(hours=2))
    assert shop.sent("unpaid_orders") == [CancelKeyedOrder(order_id="o2")]


def test_a_process_keyed_by_type_names_a_field_for_every_type_it_handles() -> None:
    with pytest.raises(ValueError, match="key_by names no field for KeyedPaymentTaken"):
        process("half_keyed", sources=[KeyedOrder], key_by={KeyedOrderPlaced: "order_id"},
                event_types=[KeyedOrderPlaced, KeyedPaymentTaken])(lambda context, event: None)
    with pytest.raises(ValueError, match="name event_types and a field for each"):
        process("untyped", sources=[KeyedOrder], key_by={KeyedOrderPlaced: "order_id"})(
            lambda context, event: None)
