"""A process manager's step: state, timers and commands per key, undone when it raises."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from eventfold.projections import Event
from eventfold.reactions import Process, ProcessContext, command_id_for
from eventfold.reactions.process import refusal_event, timer_event
from examples.fulfilment import CancelPurchase, payment_deadline

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _event(type_: str, data: dict | None = None, event_id: str = "e1") -> Event:
    return Event(type_, data or {}, "p1", 1, event_id, 9, "2026-11-28T12:00:00Z")


def test_a_placed_purchase_waits_for_its_payment_and_a_paid_one_ends() -> None:
    context = ProcessContext("p1", None, NOW)
    placed = _event("PurchasePlaced", {"shelf_id": "s1", "quantity": 1, "pay_within_s": 60})
    assert payment_deadline.step(context, placed) == []
    assert [(t.name, t.at) for t in context.timers] == [("payment_due",
                                                          NOW + timedelta(seconds=60))]
    assert context.state == {"placed": NOW.isoformat()}
    payment_deadline.step(context, _event("PurchasePaid", event_id="e2"))
    assert context.finished and context.cleared and context.timers == []


def test_a_due_timer_cancels_with_the_id_it_always_has() -> None:
    context = ProcessContext("p1", {"placed": "x"}, NOW)
    fired = timer_event("p1", "payment_due", NOW)
    assert fired == timer_event("p1", "payment_due", NOW)  # whoever fires it, however often
    assert fired.event_id != timer_event("p2", "payment_due", NOW).event_id
    assert fired.event_id != timer_event("p1", "payment_due", NOW + timedelta(1)).event_id
    [cancel] = payment_deadline.step(context, fired)
    assert cancel == CancelPurchase(purchase_id="p1", reason="not paid in time",
                                    command_id=command_id_for("payment_deadline",
                                                              fired.event_id, 0))
    assert context.finished


def test_one_name_is_one_timer_moved_by_scheduling_it_again_or_cancelled() -> None:
    context = ProcessContext("p1", None, NOW)
    context.schedule("due", after=timedelta(seconds=60))
    context.schedule("nudge", after=timedelta(seconds=5))
    context.schedule("due", after=timedelta(seconds=90))
    assert [(t.name, t.at) for t in context.timers] == [
        ("nudge", NOW + timedelta(seconds=5)), ("due", NOW + timedelta(seconds=90))]
    context.cancel("nudge")
    assert [t.name for t in context.timers] == ["due"] and context.cancelled == {"nudge"}
    context.schedule("nudge", at=NOW)
    assert context.cancelled == set()


def test_a_timer_and_a_refusal_reach_the_process_of_their_key_whatever_it_is_keyed_by() -> None:
    manager = Process("keyed", ("Purchase",), lambda c, e: None, key_by="order")
    assert manager.key_of(timer_event("o-7", "due", NOW)) == "o-7"
    refused = refusal_event("o-7", "CancelPurchase", command_id_for("keyed", "e", 0), "paid",
                            "e", NOW)
    assert manager.key_of(refused) == "o-7" and refused.type == "command_refused"
    assert refused.data["reason"] == "paid"


def test_a_handler_that_raises_leaves_the_context_as_it_was() -> None:
    def handle(context: ProcessContext, event: Event) -> None:
        context.state["seen"] = context.state.get("seen", 0) + 1
        context.schedule("later", after=timedelta(seconds=1))
        if event.type == "Bad":
            raise ValueError("no")

    manager = Process("counting", ("Purchase",), handle)
    context = ProcessContext("p1", None, NOW)
    manager.step(context, _event("Good"))
    with pytest.raises(ValueError, match="no"):
        manager.step(context, _event("Bad", event_id="e2"))
    assert context.state == {"seen": 1} and len(context.timers) == 1


def test_an_event_after_the_end_starts_a_new_process_and_keys_come_from_the_data() -> None:
    manager = Process("keyed", ("Purchase",), lambda c, e: c.state.update(n=1), key_by="order")
    assert manager.key_of(Event("X", {"order": 5}, "s", 1, "e", 1)) == "5"
    with pytest.raises(KeyError, match="has no 'order'"):
        manager.key_of(Event("X", {}, "s", 1, "e", 1))
    context = ProcessContext("5", {"n": 0}, NOW)
    context.done()
    manager.step(context, _event("Again"))
    assert not context.finished and context.cleared and context.state == {"n": 1}
    with pytest.raises(ValueError, match="either at= or after="):
        context.schedule("t")


def test_a_process_is_keyed_by_a_dotted_path_as_a_projection_is() -> None:
    manager = Process("by_order", ("Purchase",), lambda c, e: None, key_by="order.id")
    placed = Event("PurchasePlaced", {"order": {"id": 7}}, "p1", 1, "e1", 1)
    assert manager.key_of(placed) == "7"
    with pytest.raises(KeyError, match=r"has no 'order\.id'"):
        manager.key_of(Event("PurchasePlaced", {"order": {}}, "p1", 1, "e2", 2))
