"""What a reaction is: a name, the aggregate types whose events it reads, and a function of
one event that returns the commands to send."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from eventfold.projections.definition.projection import Event
from eventfold.write_model import Aggregate, Command

React = Callable[[Event], Iterable[Command] | Command | None]
"""The commands one event asks for: one, several, or none."""

Start = Literal["latest", "earliest"]
R = TypeVar("R", bound="Declared")

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
class Reaction:
    """``react`` runs once per event of ``sources`` (aggregate types, or aggregate classes),
    in each stream's order. ``start``: where a reaction that never ran begins; ``latest``
    (the default) acts only on events from now on, since acting on every past event is a
    decision, not a default (``earliest`` does it)."""

    name: str
    sources: tuple[str, ...]
    react: React
    start: Start = "latest"

    def __post_init__(self) -> None:
        check_name(self.name, self.sources)

    def commands_for(self, event: Event) -> list[Command]:
        """What ``react`` asks for ``event``, each with the id it always has for it (an id
        the function set itself is kept)."""
        asked = self.react(event)
        commands = [] if asked is None else [asked] if isinstance(asked, Command) else list(asked)
        return with_ids(self.name, event.event_id, commands)


def check_name(name: str, sources: Sequence[str]) -> None:
    """A reaction's name is part of table rows, a consumer group and command ids."""
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"reaction name {name!r}: use letters, digits and _")
    if not sources:
        raise ValueError(f"reaction {name!r} names no sources")


def source_names(sources: Sequence[str | type[Aggregate]]) -> tuple[str, ...]:
    """Aggregate types, named or given as aggregate classes."""
    return tuple(s if isinstance(s, str) else s.stream_type for s in sources)


def reaction(name: str, sources: Sequence[str | type[Aggregate]],
             start: Start = "latest") -> Callable[[React], Reaction]:
    """Decorator: the function of one event becomes a ``Reaction``."""

    def define(react: React) -> Reaction:
        return Reaction(name, source_names(sources), react, start)

    return define


Call = Callable[[Event, str], None]
"""A side effect outside Eventfold: called with the event and its idempotency key."""


@dataclass(frozen=True)
class Effect:
    """``call`` runs once per event of ``sources`` at least, with an idempotency key that is
    the same every time it is called for the event (hand it to the service you call: a
    payment provider's, an e-mail API's). A call that raises is tried again after a pause
    that doubles each time (``first_pause_s`` up to 30 s), ``max_attempts`` times in all;
    then it is given up and recorded (``failed``), and the effect goes on."""

    name: str
    sources: tuple[str, ...]
    call: Call
    max_attempts: int = 5
    first_pause_s: float = 0.5
    start: Start = "latest"

    def __post_init__(self) -> None:
        check_name(self.name, self.sources)
        if self.max_attempts < 1:
            raise ValueError(f"effect {self.name!r}: max_attempts must be at least 1")

    def idempotency_key(self, event: Event) -> str:
        return str(command_id_for(self.name, event.event_id, 0))


def effect(name: str, sources: Sequence[str | type[Aggregate]], max_attempts: int = 5,
           first_pause_s: float = 0.5, start: Start = "latest") -> Callable[[Call], Effect]:
    """Decorator: a function of an event and an idempotency key becomes an ``Effect``."""

    def define(call: Call) -> Effect:
        return Effect(name, source_names(sources), call, max_attempts, first_pause_s, start)

    return define


class Declared(Protocol):
    """What the runner and the operations read of a reaction or a process manager."""

    @property
    def name(self) -> str: ...
    @property
    def sources(self) -> tuple[str, ...]: ...
    @property
    def start(self) -> Start: ...


class ReactionRegistry:
    """The app's reactions and process managers, by name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Declared] = {}

    def add(self, reaction: R) -> R:
        if reaction.name in self._by_name:
            raise ValueError(f"reaction {reaction.name!r} is already registered")
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
