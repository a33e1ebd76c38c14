"""Event-sourced aggregates: command methods record events, ``apply`` folds them into state."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Self

from write_model.events import DomainEvent


class DomainError(ValueError):
    """A command broke a business rule; nothing was recorded."""


class Aggregate:
    """Base class of event-sourced aggregates.

    Subclasses implement ``apply`` (mutate state from one event, never fail) and command
    methods that validate and call ``record``. ``stream_type`` names the aggregate type in the
    store and routes its events to one topic; it defaults to the class name.
    """

    stream_type: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "stream_type" not in cls.__dict__:
            cls.stream_type = cls.__name__

    def __init__(self, id: str) -> None:
        self.id = id
        self.version = 0
        self._pending: list[DomainEvent] = []

    def apply(self, event: DomainEvent) -> None:
        raise NotImplementedError(f"{type(self).__name__}.apply must handle {event.event_type}")

    def record(self, event: DomainEvent) -> None:
        self.apply(event)
        self.version += 1
        self._pending.append(event)

    @classmethod
    def replay(cls, id: str, events: Iterable[DomainEvent], version: int = 0) -> Self:
        aggregate = cls(id)
        for event in events:
            aggregate.apply(event)
            version += 1
        aggregate.version = version
        return aggregate

    @property
    def pending_events(self) -> list[DomainEvent]:
        return list(self._pending)

    @property
    def loaded_version(self) -> int:
        """The version the aggregate had before its pending events: the expected version."""
        return self.version - len(self._pending)

    def mark_saved(self) -> None:
        self._pending.clear()
