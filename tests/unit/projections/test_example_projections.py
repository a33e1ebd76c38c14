"""The worked examples' projections in the plain-Python harness: the same definitions Spark
runs, checked without Spark."""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from typing import Any

import pytest

from eventfold.projections import EventLog, fold_in_memory
from eventfold.projections.execution.fold import fold_records
from eventfold.projections.outcome import SourceRecord
from examples import orders, point_of_sale, sales

_positions = itertools.count(1)


def Log(topic: str) -> EventLog:
    """One partition of ``topic`` whose positions follow every other log's of this module."""
    return EventLog(topic.removeprefix("eventfold.events."), positions=_positions)


def emitted(outcome) -> list[dict[str, Any]]:
    return [json.loads(e.value) for e in outcome.emissions]


def sales_log(*sales_made: tuple[str, int]) -> EventLog:
    log = Log("eventfold.events.ProductSales")
    for product, value in sales_made:
        log.append(product, "SaleRecorded", product=product, value=value)
    return log


def test_sales_target_notifies_each_product_once() -> None:
    log = sales_log(("product2", 1000), ("product1", 1500), ("product1", 1000),
                    ("product2", 1300), ("product5", 1000))
    outcome = fold_records(sales.sales_totals, {}, log.records)
    notified = {e["data"]["product"]: e["data"]["total"] for e in emitted(outcome)}
    assert notified == {"product1": 2500, "product2": 2300}
    assert len(emitted(outcome)) == 2
    later_sale = log.append("product1", "SaleRecorded", product="product1", value=10)
    more = fold_records(sales.sales_totals, outcome.changed, [later_sale])
    assert emitted(more) == []  # already above the target: no second notification


def test_delisted_product_is_deleted_and_may_reach_the_target_again() -> None:
    log = sales_log(("p", 2500))
    log.append("p", "ProductDelisted", product="p")
    log.append("p", "SaleRecorded", product="p", value=2000)
    outcome = fold_records(sales.sales_totals, {}, log.records)
    assert [e["data"]["total"] for e in emitted(outcome)] == [2500, 2000]
    assert outcome.changed["p"].state == {"total": 2000}
    tombstone = fold_records(sales.sales_totals, {}, log.records[:2])
    assert tombstone.changed["p"].state is None


def test_derived_event_ids_are_stable_and_suppressed_below_the_emission_mark() -> None:
    log = sales_log(("a", 3000), ("b", 3000))
    first, again = (fold_records(sales.sales_totals, {}, log.records) for _ in range(2))
    assert [e["eventId"] for e in emitted(first)] == [e["eventId"] for e in emitted(again)]
    behind = fold_records(sales.sales_totals, {}, log.records,
                          emit_from={(log.topic, 0): 1})
    assert [e["data"]["product"] for e in emitted(behind)] == ["b"]


def test_aggregation_runs_in_python_too() -> None:
    log = sales_log(("a", 5), ("a", 7), ("b", 1))
    assert fold_in_memory(sales.sales_stats, log.records) == {
        "a": {"revenue": 12, "sales": 2, "largest_sale": 7},
        "b": {"revenue": 1, "sales": 1, "largest_sale": 1}}


def invoice(log: EventLog, number: int, store: str, customer: str, customer_type: str,
            delivery: str, total_cents: int, items: int = 2) -> None:
    log.append(store, "InvoiceIssued", invoice_no=f"INV-{number}", store_id=store,
               customer_id=customer, customer_type=customer_type, delivery_type=delivery,
               total_cents=total_cents, customer_name="Ada Lovelace",
               customer_phone="555-123-4567", delivery_address="12 Analytical Street",
               items=[{"item_code": f"I{i}", "item_name": f"item {i}", "price_cents": 150,
                       "quantity": i + 1} for i in range(items)])


def test_point_of_sale_streams() -> None:
    log = Log("eventfold.events.Store")
    invoice(log, 1, "STR-1", "C1", "PRIME", "HOME-DELIVERY", 100_000)
    invoice(log, 2, "STR-2", "C1", "PRIME", "TAKEAWAY", 50_000)
    invoice(log, 3, "STR-1", "C2", "NON-PRIME", "HOME-DELIVERY", 10_000, items=3)

    shipped = emitted(fold_records(point_of_sale.shipments, {}, log.records))
    assert [e["data"]["invoice_no"] for e in shipped] == ["INV-1", "INV-3"]

    loyalty = fold_records(point_of_sale.loyalty_points, {}, log.records)
    assert {k: ks.state for k, ks in loyalty.changed.items()} == {
        "C1": {"points": 30, "prime_invoices": 2}}
    points = [(e["data"]["points_earned"], e["data"]["total_points"]) for e in emitted(loyalty)]
    assert points == [(20, 20), (10, 30)]
    assert {type(p) for pair in points for p in pair} == {int}  # whole points, never 20.0

    lines = emitted(fold_records(point_of_sale.invoice_analytics, {}, log.records))
    assert len(lines) == 7
    assert {line["data"]["customer_name"] for line in lines} == {"Ad**********"}
    assert {line["data"]["customer_phone"] for line in lines} == {"**********67"}
    assert all("Analytical" not in json.dumps(line) for line in lines)


def test_orders_left_join_counts_unknown_customers() -> None:
    log = Log("eventfold.events.Order")
    for order, customer in enumerate(["c1", "c2", "c1", "ghost"]):
        log.append(f"o{order}", "OrderPlaced", customer_id=customer, amount=10.0)
    counts = fold_in_memory(orders.orders_per_customer, log.records,
                            lookup_rows={"c1": {"name": "Ada"}, "c2": {"name": "Grace"}})
    assert counts == {
        "c1": {"orders": 2, "amount": 20.0, "customer_name": "Ada"},
        "c2": {"orders": 1, "amount": 10.0, "customer_name": "Grace"},
        "ghost": {"orders": 1, "amount": 10.0, "customer_name": None}}


def test_rekeyed_duplicates_count_once() -> None:
    log = Log("eventfold.events.Store")
    invoice(log, 1, "STR-1", "C1", "PRIME", "TAKEAWAY", 10_000)
    invoice(log, 2, "STR-2", "C1", "PRIME", "TAKEAWAY", 10_000)
    again = [SourceRecord(r.topic, 0, 10 + i, r.key, r.value) for i, r in enumerate(log.records)]
    outcome = fold_records(point_of_sale.loyalty_points, {}, log.records + again)
    assert outcome.changed["C1"].state == {"points": 4, "prime_invoices": 2}
    assert outcome.duplicates == 2
    later = fold_records(point_of_sale.loyalty_points, outcome.changed, again,
                         watermarks=outcome.watermarks)
    assert later.changed == {} and later.duplicates == 2


@pytest.mark.parametrize(("value", "masked"), [
    ("Ada Lovelace", "Ad**********"), ("Bo", "B*"), ("X", "*"), ("", ""), ("Ann", "A**")])
def test_mask_never_shows_a_short_value_in_full(value: str, masked: str) -> None:
    assert point_of_sale.mask(value) == masked


def test_loyalty_points_add_up_exactly_over_many_invoices() -> None:
    """27 customers with odd totals: integer cents and whole points never drift. The expected
    points come another way (exact fractions of dollars, floored), and a few by hand."""
    by_hand = {4_999: 0, 5_000: 1, 9_999: 1, 10_000: 2, 123_456: 24}
    log = Log("eventfold.events.Store")
    expected: dict[str, int] = {}
    for n, cents in enumerate(by_hand):
        invoice(log, n, "STR-0", f"hand{n}", "PRIME", "TAKEAWAY", cents, items=1)
        expected[f"hand{n}"] = by_hand[cents]
    for n in range(27 * 7):
        customer, cents = f"C{n % 27}", 1_999 + 7_919 * n % 100_003
        invoice(log, 100 + n, f"STR-{n % 3}", customer, "PRIME", "TAKEAWAY", cents, items=1)
        dollars = Fraction(cents, 100)
        expected[customer] = expected.get(customer, 0) + math.floor(dollars / 100 * 2)
    loyalty = fold_records(point_of_sale.loyalty_points, {}, log.records)
    found = {k: ks.state["points"] for k, ks in loyalty.changed.items()}
    assert found == expected
    assert {type(points) for points in found.values()} == {int}


def test_a_fold_that_overflows_to_infinity_dead_letters_that_event() -> None:
    """Two orders of 1e308 sum to inf: not JSON, so never a state, a row or a KTable value.
    The second order is a dead letter with the reason; the customer keeps the first."""
    log = Log("eventfold.events.Order")
    log.append("o1", "OrderPlaced", customer_id="c1", amount=1e308)
    log.append("o2", "OrderPlaced", customer_id="c1", amount=1e308)
    log.append("o3", "OrderPlaced", customer_id="c2", amount=5.0)
    outcome = fold_records(orders.orders_per_customer, {}, log.records)
    assert outcome.changed["c1"].state == {"orders": 1, "amount": 1e308, "customer_name": None}
    assert outcome.changed["c2"].state["amount"] == 5.0
    (letter,) = outcome.dead_letters
    assert letter.record.key == "o2" and "not finite" in letter.reason
