"""The fold engine: apply a batch of source records to per-key state, without Spark.

The same code folds a Spark micro-batch (on the driver) and runs in plain-Python tests.
Delivery upstream is at-least-once, so every record is guarded: a record at or below the
committed offset of its partition was applied before; an event at or below the last applied
stream version of its key is a duplicate (Debezium re-sends after a crash at new offsets).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from outbox import EventEnvelope, MalformedEvent
from projections.projection import Event, Projection, State

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


@dataclass(slots=True)
class KeyState:
    """A key's state (None once deleted) and the last stream version folded into it."""

    state: State | None
    version: int
    position: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: SourceRecord
    reason: str


@dataclass
class FoldOutcome:
    changed: dict[str, KeyState] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0


def fold_records(
    projection: Projection,
    stored: Mapping[str, KeyState],
    records: Iterable[SourceRecord],
    committed_offsets: Mapping[PartitionKey, int] | None = None,
) -> FoldOutcome:
    """Fold ``records`` (in offset order per partition) onto ``stored`` states."""
    committed = committed_offsets or {}
    outcome = FoldOutcome()
    for record in records:
        partition = (record.topic, record.partition)
        if record.offset < committed.get(partition, 0):
            outcome.skipped += 1
            continue
        outcome.next_offsets[partition] = record.offset + 1
        _fold_one(projection, stored, record, outcome)
    return outcome


def _fold_one(
    projection: Projection, stored: Mapping[str, KeyState], record: SourceRecord,
    outcome: FoldOutcome,
) -> None:
    try:
        envelope = EventEnvelope.decode(record.key, record.value)
    except MalformedEvent as exc:
        outcome.dead_letters.append(DeadLetter(record, str(exc)))
        return
    current = outcome.changed.get(envelope.stream_id) or stored.get(envelope.stream_id)
    if current is not None and envelope.stream_version <= current.version:
        outcome.duplicates += 1
        return
    if not projection.handles(envelope.event_type):
        # Keep the version moving so a later duplicate of this event is still recognised.
        outcome.changed[envelope.stream_id] = KeyState(
            current.state if current else None, envelope.stream_version, envelope.global_position
        )
        return
    event = Event(
        type=envelope.event_type, data=envelope.data, stream_id=envelope.stream_id,
        stream_version=envelope.stream_version, event_id=envelope.event_id,
        global_position=envelope.global_position, recorded_at=envelope.recorded_at,
    )
    try:
        new_state = projection.apply(current.state if current else None, event)
        _check_state(projection, new_state)
    except Exception as exc:  # a fold's bug must not stop the projection: dead-letter it
        outcome.dead_letters.append(DeadLetter(record, f"fold raised {exc!r}"))
        return
    outcome.changed[envelope.stream_id] = KeyState(
        new_state, envelope.stream_version, envelope.global_position
    )
    outcome.applied += 1


def _check_state(projection: Projection, state: State | None) -> None:
    if state is None:
        return
    if not isinstance(state, dict):
        raise TypeError(f"fold returned {type(state).__name__}, expected dict or None")
    unknown = set(state) - set(projection.columns)
    if unknown:
        raise ValueError(f"state fields {sorted(unknown)} are not read model columns")


def fold_in_memory(
    projection: Projection, records: Iterable[SourceRecord]
) -> dict[str, State]:
    """A reference fold of ``records`` from empty state: the live keys and their states."""
    outcome = fold_records(projection, {}, records)
    return {key: ks.state for key, ks in outcome.changed.items() if ks.state is not None}
