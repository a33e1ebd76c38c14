"""The fulfilment and sales examples in memory (``eventfold.testing``): a reaction reserving
stock once per purchase (refusals recorded), a process manager cancelling an unpaid purchase
at its deadline, and a projection's crossing of a target notified once per crossing."""

from __future__ import annotations

from datetime import timedelta

from eventfold.testing import InMemoryApp
from examples import fulfilment, sales, sales_targets


def test_a_purchase_reserves_stock_and_an_unpaid_one_is_cancelled_at_its_deadline() -> None:
    shop = InMemoryApp(fulfilment.app)
    shop.execute(fulfilment.StockShelf(shelf_id="apples", quantity=3))
    shop.execute(fulfilment.PlacePurchase(purchase_id="p1", shelf_id="apples", quantity=2,
                                          pay_within_s=60))
    shop.execute(fulfilment.PlacePurchase(purchase_id="p2", shelf_id="apples", quantity=2,
                                          pay_within_s=60))
    assert [c.purchase_id for c in shop.sent("reserve_stock")] == ["p1", "p2"]
    [(refused, reason)] = shop.refused("reserve_stock")
    assert refused.purchase_id == "p2" and "1 available" in reason
    assert shop.state("shelf_stock", "apples") == {"stocked": 3, "reserved": 2}

    shop.execute(fulfilment.PayPurchase(purchase_id="p1"))
    shop.advance(timedelta(seconds=61))
    assert shop.sent("payment_deadline") == [
        fulfilment.CancelPurchase(purchase_id="p2", reason="not paid in time")]
    assert shop.timers("payment_deadline") == {}
    assert [e.type for e in shop.events("p2")][-1] == "PurchaseCancelled"


def test_a_target_crossed_is_notified_once_per_crossing() -> None:
    shop = InMemoryApp(sales_targets.app)
    for value in (1500, 600, 900):  # crosses 2000 at 2100, then stays above
        shop.execute(sales.RecordSale(product="tea", value=value))
    shop.execute(sales.DelistProduct(product="tea"))
    shop.execute(sales.RecordSale(product="tea", value=2500))  # crosses anew
    assert [(c.total, c.target) for c in shop.sent("notify_target_reached")] == [
        (2100, sales.SALES_TARGET), (2500, sales.SALES_TARGET)]
    assert shop.state("sales_totals", "tea") == {"total": 2500}
