"""The app a fault campaign runs: tills rung up, folded into totals (a KTable and a read
model); a reaction that stamps a card for every round amount; and a process per tab that
expires a tab not closed by its deadline. Each schedule names its projection, reaction
and process after itself, so that it starts from nothing on the shared stack.

Every function is defined here, at module level: Spark's Python workers import them by
reference to run the fold."""

from __future__ import annotations

import dataclasses
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
    handles,
    process,
    projection,
    reaction,
)

BROKEN_DEADLINES: set[str] = set()
"""Tabs whose deadline handler raises, while they are here (a bug an operator fixes, then
retries the parked key)."""


@dataclass(frozen=True)
class Rung(DomainEvent):
    amount: int


class Ring(Command):
    till: str = Field(min_length=1)
    amount: int = Field(gt=0)

    def stream_id(self) -> str:
        return self.till


class Till(Aggregate):
    @handles(Ring)
    def ring(self, amount: int) -> None:
        self.record(Rung(amount=amount))

    def apply(self, event: DomainEvent) -> None:
        pass  # a till rings anything up


@dataclass(frozen=True)
class Stamped(DomainEvent):
    rung: str
    """The id of the ``Rung`` event it stamps for."""


class Stamp(Command):
    card: str = Field(min_length=1)
    rung: str = Field(min_length=1)

    def stream_id(self) -> str:
        return self.card


class Card(Aggregate):
    @handles(Stamp)
    def stamp(self, rung: str) -> None:
        self.record(Stamped(rung=rung))

    def apply(self, event: DomainEvent) -> None:
        pass  # a card takes any stamp


@dataclass(frozen=True)
class TabOpened(DomainEvent):
    due_ms: int


@dataclass(frozen=True)
class TabClosed(DomainEvent):
    pass


@dataclass(frozen=True)
class TabExpired(DomainEvent):
    pass


class OpenTab(Command):
    tab: str = Field(min_length=1)
    due_ms: int = Field(gt=0)

    def stream_id(self) -> str:
        return self.tab


class CloseTab(Command):
    tab: str = Field(min_length=1)

    def stream_id(self) -> str:
        return self.tab


class ExpireTab(Command):
    tab: str = Field(min_length=1)

    def stream_id(self) -> str:
        return self.tab


class Tab(Aggregate):
    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.ended = False

    @handles(OpenTab)
    def open(self, due_ms: int) -> None:
        if self.version > 0:
            raise DomainError(f"tab {self.id} is open already")
        self.record(TabOpened(due_ms=due_ms))

    @handles(CloseTab, requires_existing=True)
    def close(self) -> None:
        if self.ended:
            raise DomainError(f"tab {self.id} has ended")
        self.record(TabClosed())

    @handles(ExpireTab, requires_existing=True)
    def expire(self) -> None:
        if self.ended:
            raise DomainError(f"tab {self.id} has ended")
        self.record(TabExpired())

    def apply(self, event: DomainEvent) -> None:
        if isinstance(event, TabClosed | TabExpired):
            self.ended = True


def fold_totals(state: State | None, event: Event) -> State | None:
    current = state or {"total": 0, "count": 0}
    return {"total": current["total"] + int(event.data["amount"]),
            "count": current["count"] + 1}


def stamp_round_amounts(event: Event) -> Stamp | None:
    if int(event.data["amount"]) % 5:
        return None
    return Stamp(card=f"card-{event.stream_id}", rung=event.event_id)


def expire_late(tab: ProcessContext, event: Event) -> None:
    match event.type:
        case "TabOpened":
            tab.state["opened"] = True
            tab.schedule("deadline", after=timedelta(milliseconds=event.data["due_ms"]))
        case "TabClosed" | "TabExpired":
            tab.done()
        case "deadline":
            if tab.key in BROKEN_DEADLINES:
                raise RuntimeError(f"the deadline of {tab.key} cannot be handled")
            tab.send(ExpireTab(tab=tab.key))
            tab.state["sent"] = "expire"
        case "command_refused":  # the tab ended before its expiry got there
            tab.done()


totals = projection("campaign_totals", sources=[Till], event_types=["Rung"],
                    columns={"total": BigInteger(), "count": BigInteger()})(fold_totals)
stamps = reaction("campaign_stamps", sources=[Till], event_types=["Rung"],
                  start="earliest")(stamp_round_amounts)
deadlines = process("campaign_deadlines", sources=[Tab],
                    start="earliest")(expire_late)


@dataclass(frozen=True)
class Names:
    """What one schedule's app is called."""

    suffix: str

    @property
    def projection(self) -> str:
        return f"campaign_totals_{self.suffix}"

    @property
    def reaction(self) -> str:
        return f"campaign_stamps_{self.suffix}"

    @property
    def process(self) -> str:
        return f"campaign_deadlines_{self.suffix}"


def campaign_app(names: Names) -> Eventfold:
    """The campaign's app with one schedule's names."""
    app = Eventfold(f"campaign_{names.suffix}")
    for aggregate in (Till, Card, Tab):
        app.commands.add(aggregate)
    app.projections.add(dataclasses.replace(totals, name=names.projection, table="",
                                            ktable_topic=""))
    app.reactions.add(dataclasses.replace(stamps, name=names.reaction))
    app.reactions.add(dataclasses.replace(deadlines, name=names.process))
    return app
