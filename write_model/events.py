"""Domain events: typed, JSON-serializable, registered by type name so stored events decode."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self


class EventRegistry:
    """Maps stored event type names to their classes."""

    def __init__(self) -> None:
        self._by_type: dict[str, type[DomainEvent]] = {}

    def register(self, event_class: type[DomainEvent]) -> None:
        name = event_class.event_type
        known = self._by_type.get(name)
        if known is not None and known.__qualname__ != event_class.__qualname__:
            raise ValueError(f"event type {name!r} is already registered to {known.__qualname__}")
        self._by_type[name] = event_class

    def decode(self, event_type: str, data: Mapping[str, Any]) -> DomainEvent:
        try:
            event_class = self._by_type[event_type]
        except KeyError:
            raise LookupError(f"unknown event type {event_type!r}") from None
        return event_class.from_data(data)


default_registry = EventRegistry()


@dataclass(frozen=True)
class DomainEvent:
    """Base of all domain events. Subclasses are frozen dataclasses of JSON-serializable fields.

    The type name stored with the event defaults to the class name; set ``event_type`` on the
    class to keep a stable name across renames.
    """

    event_type: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "event_type" not in cls.__dict__:
            cls.event_type = cls.__name__
        default_registry.register(cls)

    def to_data(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Self:
        return cls(**data)


@dataclass(frozen=True)
class NewEvent:
    """An event on its way into the store: what the aggregate recorded, not yet positioned."""

    event_type: str
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)

    @classmethod
    def of(cls, event: DomainEvent, metadata: Mapping[str, Any] | None = None) -> NewEvent:
        return cls(event.event_type, event.to_data(), dict(metadata or {}))


@dataclass(frozen=True)
class RecordedEvent:
    """An event as stored: identity, position in its stream and in the whole store."""

    event_id: uuid.UUID
    stream_id: str
    stream_type: str
    stream_version: int
    global_position: int
    event_type: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    recorded_at: datetime
