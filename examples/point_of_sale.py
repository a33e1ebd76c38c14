"""Point of sale: invoices keyed by store, three streams derived from them.

    POST /commands/IssueInvoice {"invoice_no": "INV-1", "store_id": "STR-1", ...}

- ``shipments``: HOME-DELIVERY invoices -> ``eventfold.pos.shipments`` (a filtered stream);
- ``loyalty_points``: re-keyed by customer, so a customer who buys in two stores accumulates
  in one place; each PRIME invoice -> ``eventfold.pos.loyalty`` with the points it earned
  (``POINTS_PER_100`` whole points per 100 spent) and the customer's accumulated points;
- ``invoice_analytics``: every invoice with the customer's PII masked, flattened into one
  record per line item -> ``eventfold.pos.analytics`` (a flat-mapped stream).

Money is integer cents and points are whole points: integers add up exactly wherever they are
folded, where floats drift by a cent now and then.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import BigInteger

from eventfold.app import Eventfold
from eventfold.projections import Derived, State, projection, stream
from eventfold.write_model import Aggregate, Command, DomainEvent

SHIPMENTS_TOPIC = "eventfold.pos.shipments"
LOYALTY_TOPIC = "eventfold.pos.loyalty"
ANALYTICS_TOPIC = "eventfold.pos.analytics"
POINTS_PER_100 = 2


@dataclass(frozen=True)
class InvoiceIssued(DomainEvent):
    invoice_no: str
    store_id: str
    customer_id: str
    customer_type: str
    delivery_type: str
    total_cents: int
    items: list[dict[str, Any]]
    customer_name: str
    customer_phone: str
    delivery_address: str


class Store(Aggregate):
    invoices: int = 0

    def issue(self, invoice: IssueInvoice) -> None:
        self.record(InvoiceIssued(**invoice.model_dump(exclude={"command_id",
                                                                "expected_version"})))

    def apply(self, event: DomainEvent) -> None:
        self.invoices += 1


class LineItem(BaseModel):
    item_code: str = Field(min_length=1, max_length=50)
    item_name: str = Field(min_length=1, max_length=200)
    price_cents: int = Field(ge=0)
    quantity: int = Field(gt=0)


class IssueInvoice(Command):
    """Issue an invoice at a store."""

    invoice_no: str = Field(min_length=1, max_length=50)
    store_id: str = Field(min_length=1, max_length=50)
    customer_id: str = Field(min_length=1, max_length=50)
    customer_type: str = Field(pattern="^(PRIME|NON-PRIME)$")
    delivery_type: str = Field(pattern="^(HOME-DELIVERY|TAKEAWAY)$")
    total_cents: int = Field(ge=0)
    items: list[LineItem] = Field(min_length=1, max_length=500)
    customer_name: str = Field(min_length=1, max_length=200)
    customer_phone: str = Field(min_length=1, max_length=50)
    delivery_address: str = Field(default="", max_length=500)

    def stream_id(self) -> str:
        return self.store_id


@stream("shipments", sources=[Store], event_types=[InvoiceIssued])
def shipments(invoice: InvoiceIssued) -> Iterator[Derived]:
    """HOME-DELIVERY invoices, for the shipping service."""
    if invoice.delivery_type == "HOME-DELIVERY":
        yield Derived(SHIPMENTS_TOPIC, invoice.invoice_no, "ShipmentRequested", {
            "invoice_no": invoice.invoice_no, "store_id": invoice.store_id,
            "customer_name": invoice.customer_name, "customer_phone": invoice.customer_phone,
            "delivery_address": invoice.delivery_address, "items": invoice.items})


def points_notification(invoice: InvoiceIssued, _before: State | None,
                        after: State | None) -> Iterator[Derived]:
    if invoice.customer_type == "PRIME" and after is not None:
        yield Derived(LOYALTY_TOPIC, invoice.customer_id, "LoyaltyPointsEarned", {
            "customer_id": invoice.customer_id, "invoice_no": invoice.invoice_no,
            "store_id": invoice.store_id, "points_earned": earned(invoice),
            "total_points": after["points"]})


def earned(invoice: InvoiceIssued) -> int:
    """Whole points for the invoice; a part of 100 spent earns nothing, as at the till."""
    return invoice.total_cents * POINTS_PER_100 // 10_000


@projection("loyalty_points", sources=[Store], event_types=[InvoiceIssued],
            key_by="customer_id", derive=points_notification,
            columns={"points": BigInteger(), "prime_invoices": BigInteger()})
def loyalty_points(state: State | None, invoice: InvoiceIssued) -> State | None:
    """Loyalty points per PRIME customer, whichever store they buy in."""
    if invoice.customer_type != "PRIME":
        return state
    current = state or {"points": 0, "prime_invoices": 0}
    return {"points": current["points"] + earned(invoice),
            "prime_invoices": current["prime_invoices"] + 1}


def mask(value: str, keep: int = 2) -> str:
    """At most ``keep`` leading characters and never more than half of the value show: a
    short name is masked too."""
    shown = min(keep, len(value) // 2)
    return value[:shown] + "*" * (len(value) - shown)


@stream("invoice_analytics", sources=[Store], event_types=[InvoiceIssued])
def invoice_analytics(invoice: InvoiceIssued) -> Iterator[Derived]:
    """One record per line item, the customer's name, phone and address masked."""
    for line, item in enumerate(invoice.items):
        yield Derived(ANALYTICS_TOPIC, invoice.invoice_no, "InvoiceLineSold", {
            "invoice_no": invoice.invoice_no, "line": line, "store_id": invoice.store_id,
            "customer_id": invoice.customer_id, "customer_type": invoice.customer_type,
            "delivery_type": invoice.delivery_type, **item,
            "customer_name": mask(invoice.customer_name),
            "customer_phone": mask(invoice.customer_phone[::-1])[::-1],
            "delivery_address": "***" if invoice.delivery_address else ""})


app = Eventfold("point_of_sale", projections=[shipments, loyalty_points, invoice_analytics])


@app.commands.handler(IssueInvoice, Store)
def issue_invoice(store: Store, command: IssueInvoice) -> None:
    store.issue(command)
