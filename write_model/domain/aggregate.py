"""Event-sourced aggregates: command methods record events, ``apply`` folds them into state."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from typing import Any, ClassVar, Self

from eventfold.write_model.domain.events import DomainEvent


class DomainError(ValueError):
    """A command broke a business rule; nothing was recorded."""


class Aggregate:
    """Base class of event-sourced aggregates.

    Subclasses declare their state as annotated class attributes with their starting values
    (``available: int = 0``; each instance gets a copy of a mutable one, as ``set()``),
    implement ``apply`` (mutate state from one event, never fail) and command methods that
    validate and call ``record``. ``stream_type`` names the aggregate type in the store and
    routes its events to one topic; it defaults to the class name.

    Snapshots: set ``snapshot_every = N`` to store the state every N events; loading then starts
    from the latest snapshot. Bump ``state_version`` whenever the state's shape changes:
    snapshots of other state versions are ignored, never trusted. ``snapshot_state`` and
    ``restore_state`` default to the public instance attributes; override them for state that
    is not plain JSON.
    """

    stream_type: ClassVar[str]
    snapshot_every: ClassVar[int] = 0
    state_version: ClassVar[int] = 1
    _starting_state: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "stream_type" not in cls.__dict__:
            cls.stream_type = cls.__name__
        cls._starting_state = {**cls._starting_state, **_declared_state(cls)}

    def __init__(self, id: str) -> None:
        self.id = id
        self.version = 0
        self._pending: list[DomainEvent] = []
        for name, value in self._starting_state.items():
            setattr(self, name, copy.copy(value))

    def apply(self, event: DomainEvent) -> None:
        raise NotImplementedError(f"{type(self).__name__}.apply must handle {event.event_type}")

    def record(self, event: DomainEvent) -> None:
        self.apply(event)
        self.version += 1
        self._pending.append(event)

    @classmethod
    def replay(cls, id: str, events: Iterable[DomainEvent], version: int = 0) -> Self:
        aggregate = cls(id)
        aggregate.version = version
        aggregate.apply_all(events)
        return aggregate

    def apply_all(self, events: Iterable[DomainEvent]) -> None:
        for event in events:
            self.apply(event)
            self.version += 1

    @property
    def pending_events(self) -> list[DomainEvent]:
        return list(self._pending)

    @property
    def loaded_version(self) -> int:
        """The version the aggregate had before its pending events: the expected version."""
        return self.version - len(self._pending)

    def mark_saved(self) -> None:
        self._pending.clear()

    def snapshot_state(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()
                if not k.startswith("_") and k not in ("id", "version")}

    def restore_state(self, state: dict[str, Any]) -> None:
        vars(self).update(state)

    @classmethod
    def from_snapshot(cls, id: str, version: int, state: dict[str, Any]) -> Self:
        aggregate = cls(id)
        aggregate.restore_state(state)
        aggregate.version = version
        return aggregate

    def snapshot_due(self) -> bool:
        """True when the pending events cross a multiple of ``snapshot_every``."""
        every = self.snapshot_every
        return every > 0 and self.version // every > self.loaded_version // every


def _declared_state(cls: type) -> dict[str, Any]:
    """The state ``cls`` itself declares: its annotated class attributes with a value, but
    for class variables (``ClassVar[...]``)."""
    annotations = inspect.get_annotations(cls)
    return {name: cls.__dict__[name] for name, annotation in annotations.items()
            if name in cls.__dict__ and "ClassVar" not in str(annotation)}
