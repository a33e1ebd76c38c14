"""What a reaction is: a name, the aggregate types whose events it reads, and a function of
one event that returns the commands to send."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from eventfold.contract import event_topic
from eventfold.projections.definition.projection import (
    Event,
    EventType,
    Projection,
    event_type_names,
    source_names,
)
from eventfold.projections.definition.registry import ProjectionRegistry
from eventfold.projections.definition.typed import Typed, typed_builders
from eventfold.write_model import Aggregate, Command

React = Callable[[Event], Iterable[Command] | Command | None]
"""The commands one event asks for: one, several, or none."""

Start = Literal["latest", "earliest"]
R = TypeVar("R", bound="Declared")
F = TypeVar("F", bound=Callable[..., Any])

_COMMAND_IDS = uuid.UUID("5b0c6e2e-3f7a-4c55-9d1e-6f4a0e8b7c21")
"""The namespace of the ids reactions give their commands (``command_id_for``)."""


def command_id_for(reaction: str, event_id: str, index: int) -> uuid.UUID:
    """The id of the ``index``-th command ``reaction`` sends for event ``event_id``: the same
    every time the event is acted on, so that the command log answers a repeat with the first
    result instead of executing it again."""
    return uuid.uuid5(_COMMAND_IDS, f"{reaction}\n{event_id}\n{index}")


def with_ids(reaction: str, event_id: str, commands: Sequence[Command]) -> list[Command]:
    """``commands`` asked for by event ``event_id``, each with the id it always has for it
    (``command_id_for``; an id the function set itself is kept)."""
    return [command if command.command_id is not None else command.model_copy(
                update={"command_id": command_id_for(reaction, event_id, index)})
            for index, command in enumerate(commands)]


@dataclass(frozen=True)
class DerivedEvents:
    """A reaction's source: the events projections derive to ``topic`` (an ``on_crossing``
    notification, a stream's output), read like an aggregate type's events."""

    topic: str


Source = str | type[Aggregate] | DerivedEvents
"""What a reaction reads: an aggregate type (by name or class) or a derived-event topic."""


@dataclass(frozen=True)
class Reaction:
    """``react`` runs once per event of ``sources`` (aggregate types, or aggregate classes),
    in each stream's order, and of ``derived_topics``. ``start``: where a reaction that never
    ran begins; ``latest`` (the default) acts only on events from now on, since acting on
    every past event is a decision, not a default (``earliest`` does it). ``event_types``
    (None: all) are the events it is called for; the others pass by."""

    name: str
    sources: tuple[str, ...]
    react: React
    start: Start = "latest"
    derived_topics: tuple[str, ...] = ()
    event_types: frozenset[str] | None = None

    def __post_init__(self) -> None:
        check_name(self)

    def commands_for(self, event: Event) -> list[Command]:
        """What ``react`` asks for ``event``, each with the id it always has for it (an id
        the function set itself is kept); nothing for an event of a type it did not name."""
        if not wants(self, event.type):
            return []
        asked = self.react(event)
        commands = [] if asked is None else [asked] if isinstance(asked, Command) else list(asked)
        return with_ids(self.name, event.event_id, commands)


def check_name(declared: Declared) -> None:
    """A reaction's name is part of table rows, a consumer group and command ids."""
    name = declared.name
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"reaction name {name!r}: use letters, digits and _")
    if not declared.sources and not declared.derived_topics:
        raise ValueError(f"reaction {name!r} names no sources")


def topics_of(declared: Declared) -> list[str]:
    """The topics a reaction reads: its aggregate types' event topics, then derived ones."""
    return [event_topic(source) for source in declared.sources] + list(declared.derived_topics)


def wants(declared: Declared, event_type: str) -> bool:
    return declared.event_types is None or event_type in declared.event_types


def subscription(sources: Sequence[Source], event_types: Sequence[EventType] | None
                 ) -> dict[str, Any]:
    """A declaration's sources split into aggregate types and derived topics, and its event
    types by name."""
    return {"sources": source_names(s for s in sources if not isinstance(s, DerivedEvents)),
            "derived_topics": tuple(s.topic for s in sources if isinstance(s, DerivedEvents)),
            "event_types": None if event_types is None else event_type_names(event_types)}


class TypedReact(Typed):
    def __call__(self, event: Event) -> Any:
        return self.function(self.typed(event))


def typed(wrapper: type[Typed], function: F, event_types: Sequence[EventType] | None) -> F:
    """``function``, receiving the event types given as classes as instances of them."""
    if event_types is None or not typed_builders(event_types):
        return function
    return wrapper(function, event_types)  # type: ignore[return-value]


def reaction(name: str, sources: Sequence[Source], start: Start = "latest",
             event_types: Sequence[EventType] | None = None
             ) -> Callable[[Callable[[Any], Iterable[Command] | Command | None]], Reaction]:
    """Decorator: the function of one event becomes a ``Reaction``. ``event_types`` given as
    classes reach it as instances of them (``match event: case PurchasePlaced(...)``); by
    name, as the ``Event`` (its stream id and position)."""

    def define(react: Callable[[Any], Iterable[Command] | Command | None]) -> Reaction:
        return Reaction(name=name, react=typed(TypedReact, react, event_types), start=start,
                        **subscription(sources, event_types))

    return define


Call = Callable[[Event, str], None]
"""A side effect outside Eventfold: called with the event and its idempotency key."""


@dataclass(frozen=True)
class Effect:
    """``call`` runs once per event of ``sources`` at least, with an idempotency key that is
    the same every time it is called for the event (hand it to the service you call: a
    payment provider's, an e-mail API's). A call that raises is tried again after a pause
    that doubles each time (``first_pause_s`` up to 30 s), ``max_attempts`` times in all;
    then it is given up and recorded (``failed``), and its stream parked (its later events
    held until ``eventfold dlq retry``); the other streams go on."""

    name: str
    sources: tuple[str, ...]
    call: Call
    max_attempts: int = 5
    first_pause_s: float = 0.5
    start: Start = "latest"
    derived_topics: tuple[str, ...] = ()
    event_types: frozenset[str] | None = None

    def __post_init__(self) -> None:
        check_name(self)
        if self.max_attempts < 1:
            raise ValueError(f"effect {self.name!r}: max_attempts must be at least 1")

    def idempotency_key(self, event: Event) -> str:
        return str(command_id_for(self.name, event.event_id, 0))


class TypedCall(Typed):
    def __call__(self, event: Event, idempotency_key: str) -> None:
        self.function(self.typed(event), idempotency_key)


def effect(name: str, sources: Sequence[Source], max_attempts: int = 5,
           first_pause_s: float = 0.5, start: Start = "latest",
           event_types: Sequence[EventType] | None = None
           ) -> Callable[[Callable[[Any, str], None]], Effect]:
    """Decorator: a function of an event and an idempotency key becomes an ``Effect``
    (``event_types`` as ``reaction``'s)."""

    def define(call: Callable[[Any, str], None]) -> Effect:
        return Effect(name=name, call=typed(TypedCall, call, event_types),
                      max_attempts=max_attempts, first_pause_s=first_pause_s, start=start,
                      **subscription(sources, event_types))

    return define


class Declared(Protocol):
    """What the runner and the operations read of a reaction or a process manager."""

    @property
    def name(self) -> str: ...
    @property
    def sources(self) -> tuple[str, ...]: ...
    @property
    def derived_topics(self) -> tuple[str, ...]: ...
    @property
    def event_types(self) -> frozenset[str] | None: ...
    @property
    def start(self) -> Start: ...


@runtime_checkable
class WithReadModel(Protocol):
    """A process manager: its running keys are a projection of their own."""

    def read_model(self) -> Projection: ...


class ReactionRegistry:
    """The app's reactions and process managers, by name; a process manager's read model
    joins ``projections`` (the app's) when it is added."""

    def __init__(self, projections: ProjectionRegistry | None = None) -> None:
        self._by_name: dict[str, Declared] = {}
        self._projections = projections

    def add(self, reaction: R) -> R:
        if reaction.name in self._by_name:
            raise ValueError(f"reaction {reaction.name!r} is already registered")
        if isinstance(reaction, WithReadModel) and self._projections is not None:
            self._projections.add(reaction.read_model())
        self._by_name[reaction.name] = reaction
        return reaction

    def get(self, name: str) -> Declared:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise LookupError(f"unknown reaction {name!r}; known: {known}") from None

    def __iter__(self) -> Iterator[Declared]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def source_aggregate_types(self) -> list[str]:
        return sorted({source for r in self for source in r.sources})
