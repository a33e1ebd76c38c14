"""A batch's view of parked keys: a parked key's events are held in order; an event that
raises parks its key and is held first of its later ones."""

from __future__ import annotations

from eventfold.projections import Event
from eventfold.reactions.parking import Parking


def _event(n: int, stream: str) -> Event:
    return Event("PurchasePlaced", {}, stream, n, f"e{n}", n)


def test_a_parked_key_holds_its_events_and_others_pass() -> None:
    parking = Parking(parked={"p1"})
    assert parking.holds("p1", _event(1, "p1"), "c1")
    assert not parking.holds("p2", _event(2, "p2"), None)
    assert [(k, e.event_id, c) for k, e, c in parking.held] == [("p1", "e1", "c1")]
    assert parking.newly == {}


def test_an_event_that_raises_parks_its_key_and_is_held_before_the_later_ones() -> None:
    parking = Parking()
    parking.park("p1", _event(1, "p1"), None, "RuntimeError: a bug")
    assert parking.holds("p1", _event(2, "p1"), None)
    parking.park("p1", _event(3, "p1"), None, "again")  # the first reason stays
    assert [e.event_id for _, e, _ in parking.held] == ["e1", "e2", "e3"]
    assert parking.newly == {"p1": ("e1", "RuntimeError: a bug")}
