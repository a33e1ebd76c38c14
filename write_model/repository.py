"""Repository: load an aggregate by replaying its stream, save its pending events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from write_model.aggregate import Aggregate
from write_model.events import EventRegistry, NewEvent, default_registry
from write_model.store import AppendResult, EventStore

A = TypeVar("A", bound=Aggregate)


class Repository:
    def __init__(self, store: EventStore, registry: EventRegistry = default_registry) -> None:
        self.store = store
        self.registry = registry

    def load(self, aggregate_class: type[A], stream_id: str) -> A:
        """The aggregate at its current version; version 0 if the stream has no events yet."""
        recorded = self.store.read_stream(stream_id)
        events = [self.registry.decode(r.event_type, r.data) for r in recorded]
        return aggregate_class.replay(stream_id, events)

    def save(
        self, aggregate: Aggregate, metadata: Mapping[str, Any] | None = None
    ) -> AppendResult:
        """Append the aggregate's pending events, expecting the version it was loaded at."""
        result = self.store.append(
            aggregate.stream_type,
            aggregate.id,
            aggregate.loaded_version,
            [NewEvent.of(event, metadata) for event in aggregate.pending_events],
        )
        aggregate.mark_saved()
        return result
