"""Domain events: typed, versioned, JSON-serializable, registered so stored events decode.

Every event class has a type name (default: the class name) and a schema version (default 1).
When a class's fields change, bump ``schema_version`` and register an upcaster that lifts the
stored data of the previous version; stored events are never rewritten.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self, TypeVar

from eventfold.contract import RECORDED_ATTRIBUTE, Recorded
from eventfold.write_model.domain.ids import uuid7

EventData = dict[str, Any]
E = TypeVar("E", bound="DomainEvent")
Upcaster = Callable[[EventData], EventData]


class EventRegistry:
    """Maps stored (type name, schema version) to current event classes."""

    def __init__(self) -> None:
        self._by_type: dict[str, type[DomainEvent]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}

    def register(self, event_class: type[DomainEvent]) -> None:
        name = event_class.event_type
        known = self._by_type.get(name)
        if known is not None and known.__qualname__ != event_class.__qualname__:
            raise ValueError(f"event type {name!r} is already registered to {known.__qualname__}")
        self._by_type[name] = event_class

    def upcaster(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator: ``fn(data_of_from_version) -> data_of_from_version_plus_1``."""

        def register(upcast: Upcaster) -> Upcaster:
            key = (event_type, from_version)
            if key in self._upcasters:
                raise ValueError(f"{event_type} v{from_version} already has an upcaster")
            self._upcasters[key] = upcast
            return upcast

        return register

    def upcast(self, event_type: str, schema_version: int, data: Mapping[str, Any]) -> EventData:
        """Lift stored ``data`` to the current schema version of its class."""
        current = self.event_class(event_type).schema_version
        lifted = dict(data)
        for version in range(schema_version, current):
            try:
                lifted = self._upcasters[(event_type, version)](lifted)
            except KeyError:
                raise LookupError(
                    f"no upcaster for {event_type} v{version} -> v{version + 1}") from None
        return lifted

    def event_class(self, event_type: str) -> type[DomainEvent]:
        try:
            return self._by_type[event_type]
        except KeyError:
            raise LookupError(f"unknown event type {event_type!r}") from None

    def decode(self, event_type: str, data: Mapping[str, Any],
               schema_version: int | None = None) -> DomainEvent:
        event_class = self.event_class(event_type)
        if schema_version is None:
            return event_class.from_data(data)
        return self.lift(event_class, data, schema_version)

    def lift(self, event_class: type[E], data: Mapping[str, Any], schema_version: int) -> E:
        """An ``event_class`` from ``data`` stored at ``schema_version``, upcast to the class's
        current version."""
        if schema_version != event_class.schema_version:
            if schema_version > event_class.schema_version:
                raise LookupError(f"{event_class.event_type} v{schema_version} is newer than "
                                  f"this code (v{event_class.schema_version})")
            data = self.upcast(event_class.event_type, schema_version, data)
        return event_class.from_data(data)


default_registry = EventRegistry()


@dataclass(frozen=True)
class DomainEvent:
    """Base of all domain events: frozen dataclasses of JSON-serializable fields.

    Set ``event_type`` to keep a stable stored name across class renames, and bump
    ``schema_version`` (with an upcaster) when the fields change.
    """

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "event_type" not in cls.__dict__:
            cls.event_type = cls.__name__
        default_registry.register(cls)

    def to_data(self) -> EventData:
        # Shallow on purpose: field values are JSON values already, and asdict's recursive
        # copy costs more than the rest of an append on the client.
        return {name: getattr(self, name) for name in _field_names(type(self))}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Self:
        return cls(**data)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any], schema_version: int) -> Self:
        """One from ``data`` recorded at ``schema_version``, lifted by the upcasters registered
        with ``default_registry``: what a typed fold, reaction or process receives."""
        return default_registry.lift(cls, data, schema_version)

    @property
    def recorded(self) -> Recorded:
        """Where this event was recorded (its stream id, version, position and time, and the
        row a projection's lookup joined), when a fold, reaction or process received it."""
        recorded: Recorded | None = self.__dict__.get(RECORDED_ATTRIBUTE)
        if recorded is None:
            raise AttributeError(f"this {type(self).__name__} was made here, not received from "
                                 "the store: only a received event knows where it was recorded")
        return recorded


_FIELD_NAMES: dict[type[DomainEvent], tuple[str, ...]] = {}


def _field_names(event_class: type[DomainEvent]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(event_class)
    if names is None:
        names = _FIELD_NAMES[event_class] = tuple(f.name for f in dataclasses.fields(event_class))
    return names


@dataclass(frozen=True)
class NewEvent:
    """An event on its way into the store: what the aggregate recorded, not yet positioned."""

    event_type: str
    data: EventData
    metadata: dict[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid7)
    schema_version: int = 1

    @classmethod
    def of(cls, event: DomainEvent, metadata: Mapping[str, Any] | None = None) -> NewEvent:
        return cls(event.event_type, event.to_data(), dict(metadata or {}),
                   schema_version=event.schema_version)


@dataclass(frozen=True)
class RecordedEvent:
    """An event as stored: identity, position in its stream and in the whole store."""

    event_id: uuid.UUID
    stream_id: str
    stream_type: str
    stream_version: int
    global_position: int
    event_type: str
    schema_version: int
    data: EventData
    metadata: dict[str, Any]
    recorded_at: datetime

    @property
    def correlation_id(self) -> str | None:
        return self.metadata.get("correlation_id")

    @property
    def causation_id(self) -> str | None:
        return self.metadata.get("causation_id")
