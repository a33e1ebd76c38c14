"""Typed events: how a fold, reaction or process that names event types as classes receives
each event as an instance of its class, lifted to the class's current schema version."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from eventfold.contract import RECORDED_ATTRIBUTE


class RecordedEvent(Protocol):
    """What a typed function's event is built from (``projection.Event`` is one)."""

    @property
    def type(self) -> str: ...
    @property
    def data(self) -> Mapping[str, Any]: ...
    @property
    def schema_version(self) -> int: ...


__all__ = ["Build", "Typed", "TypedFold", "built", "typed_builders"]

def built(build: Build, event: RecordedEvent) -> Any:
    """``event`` as an instance of its class, knowing where it was recorded."""
    instance = build(event.data, event.schema_version)
    try:  # noqa: SIM105 (suppress() costs a context manager per event on the hot path)
        object.__setattr__(instance, RECORDED_ATTRIBUTE, event)
    except AttributeError:  # a class with __slots__ and no room for it: it goes without
        pass
    return instance

Build = Callable[[Mapping[str, Any], int], Any]
"""How an event type given as a class is built from an event's data and the schema version
it was recorded at."""


def typed_builders(event_types: Iterable[Any]) -> dict[str, Build]:
    # Any: a ``projection.EventType``, a name or a class with ``event_type`` and ``from_data``
    """How each event type given as a class is built from an event's data. A class past its
    first schema version lifts older events itself (``from_stored(data, schema_version)``,
    as a ``DomainEvent`` does with the upcasters registered for it)."""
    builders: dict[str, Build] = {}
    for event_type in event_types:
        if isinstance(event_type, str):
            continue
        builders[event_type.event_type] = _builder(event_type)
    return builders


def _builder(event_class: Any) -> Build:
    current = getattr(event_class, "schema_version", 1)
    from_stored = getattr(event_class, "from_stored", None)
    if from_stored is not None:
        from_data = event_class.from_data

        def lifted_if_older(data: Mapping[str, Any], schema_version: int) -> Any:
            # the current version skips the registry: the hot path of every typed fold
            return (from_data(data) if schema_version == current
                    else from_stored(data, schema_version))

        return lifted_if_older
    if current != 1:
        raise ValueError(
            f"{event_class.__name__} is at schema version {current} and has no "
            f"from_stored(data, schema_version) to lift its older events: make it a "
            f"DomainEvent (its upcasters do it), or name it {event_class.event_type!r} to "
            f"receive the raw Event and upcast in the function")
    return _at_first_version(event_class)


def _at_first_version(event_class: Any) -> Build:
    from_data = event_class.from_data

    def built(data: Mapping[str, Any], schema_version: int) -> Any:
        if schema_version != 1:
            raise LookupError(f"{event_class.event_type} v{schema_version} is newer than "
                              f"this code (v1)")
        return from_data(data)

    return built


class Typed:
    """The events of the types given as classes, as instances of them (others as the
    ``Event``): what a typed fold or reaction receives."""

    def __init__(self, function: Callable[..., Any], event_types: Iterable[Any]) -> None:
        self.function = function
        self.builders = typed_builders(event_types)
        self.__doc__ = function.__doc__

    def typed(self, event: RecordedEvent) -> Any:
        build = self.builders.get(event.type)
        return event if build is None else built(build, event)


class TypedFold(Typed):
    """A fold that receives the domain's own event classes."""

    def __call__(self, state: dict[str, Any] | None, event: RecordedEvent) -> dict[str, Any] | None:
        return self.function(state, self.typed(event))  # type: ignore[no-any-return]
