"""Repository: load aggregates (snapshot + newer events), save their pending events.

Recently saved aggregates are kept in a cache, so a command to a hot aggregate skips the read.
That is safe because every append names the version it expects: a cached aggregate another
writer moved on fails with ConcurrencyError, and the command bus reloads and retries. An
aggregate is checked out of the cache exclusively, so two threads never share one.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from eventfold.write_model.domain.aggregate import Aggregate
from eventfold.write_model.domain.events import EventRegistry, NewEvent, default_registry
from eventfold.write_model.persistence.store import (
    AppendResult,
    EventStore,
    Snapshot,
    StoredEvent,
    StreamOwnedByAnotherType,
)

if TYPE_CHECKING:
    from eventfold.write_model.persistence.async_store import AsyncEventStore

A = TypeVar("A", bound=Aggregate)


class AggregateCache:
    """A bounded LRU of aggregates at their last saved version, checked out exclusively."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[type[Aggregate], str], Aggregate] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, aggregate_class: type[A], stream_id: str) -> A | None:
        with self._lock:
            found = self._entries.pop((aggregate_class, stream_id), None)
        return found if isinstance(found, aggregate_class) else None

    def put(self, aggregate: Aggregate) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._entries[(type(aggregate), aggregate.id)] = aggregate
            self._entries.move_to_end((type(aggregate), aggregate.id))
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)


class Repository:
    def __init__(self, store: EventStore, registry: EventRegistry = default_registry,
                 cache_size: int = 10_000) -> None:
        self.store = store
        self.registry = registry
        self.cache = AggregateCache(cache_size)

    def load(self, aggregate_class: type[A], stream_id: str) -> A:
        """The aggregate as stored now (version 0 if the stream has no events)."""
        snapshot, stored = self.store.load(stream_id, snapshot_of=snapshot_of(aggregate_class))
        return rehydrate(self.registry, aggregate_class, stream_id, snapshot, stored)

    def save(self, aggregate: Aggregate, metadata: Mapping[str, Any] | None = None,
             command_id: uuid.UUID | None = None, fingerprint: str | None = None,
             ) -> AppendResult:
        """Append the pending events, expecting the version the aggregate was loaded at."""
        result = self.store.append(*pending_append(aggregate, metadata), command_id=command_id,
                                   fingerprint=fingerprint)
        if mark_saved(aggregate):
            self.store.save_snapshot(*snapshot_row(aggregate))
        return result


class AsyncRepository:
    """``Repository`` over an ``AsyncEventStore``."""

    def __init__(self, store: AsyncEventStore, registry: EventRegistry = default_registry,
                 cache_size: int = 10_000) -> None:
        self.store = store
        self.registry = registry
        self.cache = AggregateCache(cache_size)

    async def load(self, aggregate_class: type[A], stream_id: str) -> A:
        snapshot, stored = await self.store.load(stream_id,
                                                 snapshot_of=snapshot_of(aggregate_class))
        return rehydrate(self.registry, aggregate_class, stream_id, snapshot, stored)

    async def save(self, aggregate: Aggregate, metadata: Mapping[str, Any] | None = None,
                   command_id: uuid.UUID | None = None, fingerprint: str | None = None,
                   ) -> AppendResult:
        result = await self.store.append(*pending_append(aggregate, metadata),
                                         command_id=command_id, fingerprint=fingerprint)
        if mark_saved(aggregate):
            await self.store.save_snapshot(*snapshot_row(aggregate))
        return result


def snapshot_of(aggregate_class: type[Aggregate]) -> tuple[str, int] | None:
    """What a snapshot must match to be used: the aggregate type and its state version."""
    if not aggregate_class.snapshot_every:
        return None
    return aggregate_class.stream_type, aggregate_class.state_version


def rehydrate(registry: EventRegistry, aggregate_class: type[A], stream_id: str,
              snapshot: Snapshot | None, stored: Sequence[StoredEvent]) -> A:
    if snapshot is not None:
        aggregate = aggregate_class.from_snapshot(stream_id, snapshot.stream_version,
                                                  snapshot.state)
    else:
        aggregate = aggregate_class(stream_id)
    foreign = next((e.stream_type for e in stored
                    if e.stream_type != aggregate_class.stream_type), None)
    if foreign is not None:
        raise StreamOwnedByAnotherType(stream_id, foreign, aggregate_class.stream_type)
    aggregate.apply_all(registry.decode(e.event_type, e.data, e.schema_version) for e in stored)
    return aggregate


def pending_append(aggregate: Aggregate, metadata: Mapping[str, Any] | None,
                   ) -> tuple[str, str, int, list[NewEvent]]:
    """(stream type, stream id, expected version, events) of the aggregate's pending events."""
    return (aggregate.stream_type, aggregate.id, aggregate.loaded_version,
            [NewEvent.of(event, metadata) for event in aggregate.pending_events])


def mark_saved(aggregate: Aggregate) -> bool:
    """Clear the pending events; True when a snapshot is due."""
    snapshot_due = aggregate.snapshot_due()
    aggregate.mark_saved()
    return snapshot_due


def snapshot_row(aggregate: Aggregate) -> tuple[str, str, int, int, dict[str, Any]]:
    return (aggregate.id, aggregate.stream_type, aggregate.state_version, aggregate.version,
            aggregate.snapshot_state())
