"""Sales targets: a running total per product, and a notification when it reaches the target.

    POST /commands/RecordSale     {"product": "product1", "value": 1500}
    POST /commands/DelistProduct  {"product": "product1"}

``sales_totals`` folds sales into a total per product (a KTable and a read model); the first
time a product's total reaches ``SALES_TARGET`` (default 2000), a ``SalesTargetReached``
event goes to ``eventfold.notifications.sales``, once per crossing, also across replays. A
delisted product's key is deleted (a tombstone) and it may reach the target again.
``sales_stats`` is the same data as a Spark-native aggregation. ``examples/sales_targets.py``
turns each crossing into a notification, once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pydantic import Field
from sqlalchemy import BigInteger

from eventfold import (
    Aggregate,
    Command,
    Count,
    Derived,
    DomainError,
    DomainEvent,
    Eventfold,
    Max,
    State,
    Sum,
    aggregation,
    handles,
    on_crossing,
    projection,
)

SALES_TARGET = int(os.environ.get("SALES_TARGET", "2000"))
NOTIFICATIONS_TOPIC = "eventfold.notifications.sales"


@dataclass(frozen=True)
class SaleRecorded(DomainEvent):
    product: str
    value: int


@dataclass(frozen=True)
class ProductDelisted(DomainEvent):
    product: str


@dataclass(frozen=True)
class SalesTargetReached(DomainEvent):
    """Derived by ``sales_totals``, once each time a product's total reaches the target."""

    product: str
    total: int
    target: int


class RecordSale(Command):
    """Record a sale of ``product`` worth ``value``."""

    product: str = Field(min_length=1, max_length=200)
    value: int = Field(gt=0, le=10_000_000)

    def stream_id(self) -> str:
        return self.product


class DelistProduct(Command):
    """Take ``product`` off the list: its total starts again from zero."""

    product: str = Field(min_length=1, max_length=200)

    def stream_id(self) -> str:
        return self.product


class ProductSales(Aggregate):
    listed: bool = True

    @handles(RecordSale)
    def record_sale(self, value: int) -> None:
        self.listed = True
        self.record(SaleRecorded(product=self.id, value=value))

    @handles(DelistProduct, requires_existing=True)
    def delist(self) -> None:
        if not self.listed:
            raise DomainError(f"{self.id} is not listed")
        self.record(ProductDelisted(product=self.id))

    def apply(self, event: DomainEvent) -> None:
        self.listed = not isinstance(event, ProductDelisted)


def target_reached(sale: SaleRecorded, state: State) -> Derived:
    return Derived.of(NOTIFICATIONS_TOPIC, sale.product, SalesTargetReached(
        product=sale.product, total=state["total"], target=SALES_TARGET))


@projection("sales_totals", sources=[ProductSales], columns={"total": BigInteger()},
            event_types=[SaleRecorded, ProductDelisted],
            derive=on_crossing(lambda state: state["total"] >= SALES_TARGET, target_reached))
def sales_totals(state: State | None, event: SaleRecorded | ProductDelisted) -> State | None:
    """Running sales total per product; delisting deletes the product's row."""
    match event:
        case SaleRecorded(value=value):
            return {"total": (state or {"total": 0})["total"] + value}
        case ProductDelisted():
            return None


sales_stats = aggregation(
    "sales_stats", sources=[ProductSales], event_types=[SaleRecorded],
    aggregates={"revenue": Sum("value"), "sales": Count(), "largest_sale": Max("value")},
    columns={"revenue": BigInteger(), "sales": BigInteger(), "largest_sale": BigInteger()},
    description="Revenue, number of sales and largest sale per product, computed by Spark.",
)

app = Eventfold("sales", aggregates=[ProductSales], projections=[sales_totals, sales_stats])
