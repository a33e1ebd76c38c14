"""The library's whole use case in memory (``eventfold.testing``): no Postgres, Kafka or
Spark. Books lent and returned, the shelf read model, a copy ordered when the last one is
lent, and fines for loans not returned by their due date, on a clock the test moves."""

from __future__ import annotations

from datetime import timedelta

from eventfold.testing import AggregateFixture, InMemoryApp
from eventfold.write_model import DomainError
from examples.library import (
    FINE,
    AddCopies,
    BookLent,
    BookReturned,
    CopiesAdded,
    FineMember,
    LendBook,
    ReturnBook,
    app,
)


def test_a_book_lends_what_is_on_its_shelf_and_says_when_it_was_the_last_copy() -> None:
    (AggregateFixture(app, "dune").given(CopiesAdded(copies=2))
     .when(LendBook(book="dune", loan="l1", member="ann"))
     .then(BookLent(book="dune", loan="l1", member="ann", days=14, last_copy=False)))
    (AggregateFixture(app, "dune")
     .given(CopiesAdded(copies=1), BookLent(book="dune", loan="l1", member="ann", days=14,
                                            last_copy=True))
     .when(LendBook(book="dune", loan="l2", member="bob"))
     .then_refused(DomainError, "no copy of dune is on the shelf"))
    (AggregateFixture(app, "dune").given(CopiesAdded(copies=1))
     .when(ReturnBook(book="dune", loan="l9"))
     .then_refused(DomainError, "not out on loan l9"))


def test_lending_the_last_copy_orders_another_and_a_late_loan_is_fined_once() -> None:
    library = InMemoryApp(app)
    library.execute(AddCopies(book="dune", copies=2))
    library.execute(LendBook(book="dune", loan="l1", member="ann", days=14))
    library.execute(LendBook(book="dune", loan="l2", member="bob", days=7))  # the last copy
    assert library.sent("reorder_last_copy") == [AddCopies(book="dune", copies=1)]
    assert library.state("shelf", "dune") == {"on_shelf": 1, "lent": 2}

    library.advance(timedelta(days=3))
    library.execute(ReturnBook(book="dune", loan="l1"))  # ann returns in time
    assert library.timers("loan_due") == {("l2", "due"): library.clock.now + timedelta(days=4)}
    library.advance(timedelta(days=30))  # bob does not
    assert library.sent("loan_due") == [FineMember(member="bob", loan="l2", amount=FINE)]
    assert library.timers("loan_due") == {} and library.process_state("loan_due", "l2") is None
    library.advance(timedelta(days=30))
    assert len(library.sent("loan_due")) == 1
    assert [e.type for e in library.events("bob")] == ["MemberFined"]
    assert library.state("shelf", "dune") == {"on_shelf": 2, "lent": 1}


def test_a_deadline_counts_from_when_the_lending_was_recorded() -> None:
    library = InMemoryApp(app)
    library.execute(AddCopies(book="dune", copies=5))
    library.execute(LendBook(book="dune", loan="l1", member="ann", days=14))
    lent_at = library.clock.now
    library.advance(timedelta(days=13, hours=23))
    assert library.sent("loan_due") == []
    library.execute(ReturnBook(book="dune", loan="l1"))
    library.advance(timedelta(days=1))
    assert library.sent("loan_due") == [] and library.timers("loan_due") == {}
    assert [e.type for e in library.events("dune")][-1] == BookReturned.event_type
    assert lent_at < library.clock.now
