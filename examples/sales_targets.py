"""Sales targets, end to end: a notification sent once per crossing.

    POST /commands/RecordSale {"product": "product1", "value": 1500}
    eventfold projection run --all     # sales_totals and notify_target_reached in one process

``sales_totals`` (``examples/sales.py``) derives a ``SalesTargetReached`` event to
``eventfold.notifications.sales`` the first time a product's total reaches the target, and
again only after the product was delisted (its total deleted) and crossed anew. The
``notify_target_reached`` reaction reads those derived events and sends each one as a
``NotifyTargetReached`` command to the product's ``TargetNotices``, whose stream is the record
of every notification sent (hand it to a mailer with an ``@effect`` to send e-mail).

Once per crossing, through crashes: the projection decides a crossing from the state before
and after the sale that made it, and remembers what it emitted, so a batch folded again does
not derive a second crossing; the derived event's id comes from the sale's, and the
command's id from the derived event's, so a reaction that acts on a batch again (its process
killed after sending, before saving where it was) sends a command the command log answers
with its first result.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from eventfold import (
    Aggregate,
    Command,
    DerivedEvents,
    DomainEvent,
    Eventfold,
    handles,
    reaction,
)
from examples.sales import NOTIFICATIONS_TOPIC, ProductSales, SalesTargetReached, sales_totals


@dataclass(frozen=True)
class TargetNotified(DomainEvent):
    total: int
    target: int


class NotifyTargetReached(Command):
    """Notify that ``product``'s sales reached ``target`` (sent by ``notify_target_reached``)."""

    product: str = Field(min_length=1, max_length=200)
    total: int
    target: int

    def stream_id(self) -> str:
        return f"{self.product}/notices"  # stream ids are one namespace across aggregate types


class TargetNotices(Aggregate):
    """The notifications sent for one product's sales."""

    sent: int = 0

    @handles(NotifyTargetReached)
    def notify(self, total: int, target: int) -> None:
        self.record(TargetNotified(total=total, target=target))

    def apply(self, event: DomainEvent) -> None:
        self.sent += 1


@reaction("notify_target_reached", sources=[DerivedEvents(NOTIFICATIONS_TOPIC)],
          event_types=[SalesTargetReached], start="earliest")
def notify_target_reached(crossing: SalesTargetReached) -> NotifyTargetReached:
    """Every crossing the projection derived, notified once."""
    return NotifyTargetReached(product=crossing.product, total=crossing.total,
                               target=crossing.target)


app = Eventfold("sales_targets", aggregates=[ProductSales, TargetNotices],
                projections=[sales_totals], reactions=[notify_target_reached])
