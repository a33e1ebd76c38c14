"""A lending library: books with copies, a read model of what each has on its shelf, a
reaction that orders another copy when the last one is lent, and a process per loan that fines
a member who has not returned the book by its due date.

    POST /commands/AddCopies   {"book": "dune", "copies": 2}
    POST /commands/LendBook    {"book": "dune", "loan": "l1", "member": "ann", "days": 14}
    POST /commands/ReturnBook  {"book": "dune", "loan": "l1"}

``shelf`` folds each book's events into the copies on its shelf and out on loan. The decision
"this was the last copy" is made by the aggregate, where it is true, and carried in the
event: ``reorder_last_copy`` reacts to it by ordering a copy (``AddCopies``), once per lending,
through crashes too (the command's id follows from the event). ``loan_due`` is a process per
loan: lent, it schedules ``due`` ``days`` after the lending was recorded; returned, it ends;
due first, it fines the member (``FineMember``) and ends. Its test runs the whole app in
memory (``tests/unit/examples/test_library.py``: ``eventfold.testing.InMemoryApp``).
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

FINE = 5
"""What a member is fined for a book not returned in time."""


@dataclass(frozen=True)
class CopiesAdded(DomainEvent):
    copies: int


@dataclass(frozen=True)
class BookLent(DomainEvent):
    book: str
    loan: str
    member: str
    days: int
    last_copy: bool


@dataclass(frozen=True)
class BookReturned(DomainEvent):
    loan: str


@dataclass(frozen=True)
class MemberFined(DomainEvent):
    loan: str
    amount: int


class AddCopies(Command):
    book: str = TargetId(min_length=1)
    copies: int = Field(gt=0)


class LendBook(Command):
    book: str = TargetId(min_length=1)
    loan: str = Field(min_length=1)
    member: str = Field(min_length=1)
    days: int = Field(default=14, gt=0)


class ReturnBook(Command):
    book: str = TargetId(min_length=1)
    loan: str = Field(min_length=1)


class FineMember(Command):
    member: str = TargetId(min_length=1)
    loan: str = Field(min_length=1)
    amount: int = Field(gt=0)


class Book(Aggregate):
    on_shelf: int = 0
    loans: frozenset[str] = frozenset()

    @handles(AddCopies)
    def add_copies(self, copies: int) -> None:
        self.record(CopiesAdded(copies=copies))

    @handles(LendBook, requires_existing=True)
    def lend(self, loan: str, member: str, days: int) -> None:
        if self.on_shelf == 0:
            raise DomainError(f"no copy of {self.id} is on the shelf")
        if loan in self.loans:
            raise DomainError(f"loan {loan} was made already")
        self.record(BookLent(book=self.id, loan=loan, member=member, days=days,
                             last_copy=self.on_shelf == 1))

    @handles(ReturnBook, requires_existing=True)
    def return_(self, loan: str) -> None:
        if loan not in self.loans:
            raise DomainError(f"{self.id} is not out on loan {loan}")
        self.record(BookReturned(loan=loan))

    def apply(self, event: DomainEvent) -> None:
        match event:
            case CopiesAdded(copies=copies):
                self.on_shelf += copies
            case BookLent(loan=loan):
                self.on_shelf -= 1
                self.loans |= {loan}
            case BookReturned(loan=loan):
                self.on_shelf += 1
                self.loans -= {loan}


class Member(Aggregate):
    fined: int = 0

    @handles(FineMember)
    def fine(self, loan: str, amount: int) -> None:
        self.record(MemberFined(loan=loan, amount=amount))

    def apply(self, event: DomainEvent) -> None:
        if isinstance(event, MemberFined):
            self.fined += event.amount


@projection("shelf", sources=[Book], event_types=[CopiesAdded, BookLent, BookReturned],
            columns={"on_shelf": BigInteger(), "lent": BigInteger()})
def shelf(state: State | None, event: CopiesAdded | BookLent | BookReturned) -> State | None:
    """Each book's copies on the shelf and out on loan."""
    current = state or {"on_shelf": 0, "lent": 0}
    match event:
        case CopiesAdded(copies=copies):
            return {**current, "on_shelf": current["on_shelf"] + copies}
        case BookLent():
            return {"on_shelf": current["on_shelf"] - 1, "lent": current["lent"] + 1}
        case BookReturned():
            return {"on_shelf": current["on_shelf"] + 1, "lent": current["lent"] - 1}
    return current


@reaction("reorder_last_copy", sources=[Book], event_types=[BookLent])
def reorder_last_copy(event: BookLent) -> AddCopies | None:
    """The last copy lent: one more ordered for the shelf."""
    return AddCopies(book=event.book, copies=1) if event.last_copy else None


@process("loan_due", sources=[Book], key_by="loan", event_types=[BookLent, BookReturned])
def loan_due(loan: ProcessContext, event: BookLent | BookReturned | Event) -> None:
    """A loan not returned within its days fines its member."""
    match event:
        case BookLent(member=member, days=days):
            loan.state["member"] = member
            loan.schedule("due", after=timedelta(days=days))
        case BookReturned():
            loan.done()
        case Event(type="due"):
            loan.send(FineMember(member=loan.state["member"], loan=loan.key, amount=FINE))
            loan.done()


app = Eventfold("library", aggregates=[Book, Member], projections=[shelf],
                reactions=[reorder_last_copy, loan_due])
