"""The fold core: apply events to per-key state, in plain Python, without Spark.

A Spark executor task runs ``KeyFolder`` over the keys of its partition; ``fold_records`` runs
the very same code over a list of topic records, for tests and for a reference fold.

Delivery upstream is at-least-once, so every event is guarded: a record below the committed
offset of its partition was applied before; an event whose (stream, version) is at or below
the stream's watermark, or was seen earlier in the batch, is a duplicate (Debezium re-sends
after a crash, at new offsets). Watermarks are per source stream, so the guard holds for
re-keyed projections too, where one key gathers the events of many streams.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

from outbox import EventEnvelope, MalformedEvent
from projections.projection import Derived, Event, Projection, State

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
EMIT_ALL: Mapping[PartitionKey, int] = MappingProxyType({})
DERIVED_NAMESPACE = uuid.UUID("6f1d8a52-7c1e-4d55-9a55-1f0f9a0c2b10")


class SourceRecord(NamedTuple):
    """One message of a source topic (a named tuple: one is built per event)."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


@dataclass(slots=True)
class KeyState:
    """A key's state (None once deleted), its version and the last applied global position.

    The version is the last applied stream version when the key is the aggregate id (so a
    client can wait for the version a command returned); for a re-keyed projection it counts
    the events folded into the key.
    """

    state: State | None
    version: int
    position: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: SourceRecord
    reason: str


@dataclass(frozen=True, slots=True)
class Emission:
    """A derived event ready to produce: its id is a function of its source event, so a
    re-sent emission is recognisable downstream."""

    topic: str
    key: str
    value: str


@dataclass
class FoldOutcome:
    changed: dict[str, KeyState] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    emissions: list[Emission] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)
    next_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0

    def see(self, stream_id: str, version: int) -> None:
        if version > self.watermarks.get(stream_id, 0):
            self.watermarks[stream_id] = version


def apply_event(projection: Projection, state: State | None, event: Event) -> State | None:
    """One step of the projection's fold; aggregations step their columns in Python here."""
    if projection.apply is not None:
        new_state = projection.apply(state, event)
        check_state(projection, new_state)
        return new_state
    if projection.aggregates is not None:
        current = state or {}
        return {column: agg.python_step(current.get(column),
                                        event.data.get(agg.field) if agg.field else None)
                for column, agg in projection.aggregates.items()}
    return None


def _checked_fold(projection: Projection) -> Callable[[State | None, Event], State | None]:
    """``projection.apply`` with its result checked, the column names looked up once."""
    fold, columns = projection.apply, frozenset(projection.columns)
    assert fold is not None

    def step(state: State | None, event: Event) -> State | None:
        after = fold(state, event)
        if after is not None and (type(after) is not dict or not after.keys() <= columns):
            check_state(projection, after)  # raises, with the reason
        return after

    return step


def check_state(projection: Projection, state: State | None) -> None:
    if state is None:
        return
    if not isinstance(state, dict):
        raise TypeError(f"fold returned {type(state).__name__}, expected dict or None")
    if not state.keys() <= projection.columns.keys():
        unknown = sorted(set(state) - set(projection.columns))
        raise ValueError(f"state fields {unknown} are not read model columns")


def encode_derived(projection: Projection, event: Event, index: int, derived: Derived) -> Emission:
    event_id = uuid.uuid5(DERIVED_NAMESPACE, f"{projection.name}:{event.event_id}:{index}")
    return Emission(derived.topic, derived.key, json.dumps({
        "eventId": str(event_id), "eventType": derived.type, "data": dict(derived.data),
        "projection": projection.name, "sourceEventId": event.event_id,
        "sourcePosition": event.global_position,
    }, default=str))


class KeyFolder:
    """Folds the events of one key after another onto their stored states."""

    def __init__(self, projection: Projection, outcome: FoldOutcome,
                 emit_from: Mapping[PartitionKey, int] | None) -> None:
        self.projection = projection
        self.outcome = outcome
        self.emit_from = emit_from  # None: this run emits nothing (a replay behind the live one)
        self._seen: set[tuple[str, int]] = set()
        self._step = (_checked_fold(projection) if projection.apply is not None
                      else partial(apply_event, projection))

    def fold(self, key: str, stored: KeyState | None,
             items: Iterable[tuple[SourceRecord, Event]]) -> None:
        # The per-event loop of every fold: lookups are hoisted into locals on purpose.
        projection, outcome, seen = self.projection, self.outcome, self._seen
        marks, step, rekeyed = outcome.watermarks, self._step, projection.key_by is not None
        derive = self._derive if projection.derive is not None and self.emit_from is not None \
            else None
        state = stored.state if stored else None
        version = stored.version if stored else 0
        position = stored.position if stored else 0
        applied = 0
        had_state = False
        for record, event in items:
            identity = (event.stream_id, event.stream_version)
            if identity in seen:
                outcome.duplicates += 1
                continue
            seen.add(identity)
            if identity[1] > marks.get(identity[0], 0):
                marks[identity[0]] = identity[1]
            try:
                after = step(state, event)
                emissions = derive(record, event, state, after) if derive else None
            except Exception as exc:  # a fold's bug must not stop the projection
                outcome.dead_letters.append(DeadLetter(record, f"fold raised {exc!r}"))
                continue
            version = version + 1 if rekeyed else event.stream_version
            position, state = event.global_position, after
            applied += 1
            had_state = had_state or after is not None
            if emissions:
                outcome.emissions.extend(emissions)
        outcome.applied += applied
        if not applied or not projection.has_state:
            return
        if stored is None and not had_state:
            return  # never had a state: nothing to store, no tombstone to send
        outcome.changed[key] = KeyState(state, version, position)

    def _derive(self, record: SourceRecord, event: Event, before: State | None,
                after: State | None) -> list[Emission]:
        if self.projection.derive is None or self.emit_from is None:
            return []
        if record.offset < self.emit_from.get((record.topic, record.partition), 0):
            return []  # emitted by the run that applied it first
        return [encode_derived(self.projection, event, i, derived)
                for i, derived in enumerate(self.projection.derive(event, before, after))]


def event_from_envelope(envelope: EventEnvelope, joined: State | None = None) -> Event:
    return Event(type=envelope.event_type, data=envelope.data, stream_id=envelope.stream_id,
                 stream_version=envelope.stream_version, event_id=envelope.event_id,
                 global_position=envelope.global_position, recorded_at=envelope.recorded_at,
                 joined=joined)


Decoded = tuple[SourceRecord, Event | None, str | None]
"""A record with its event, or with the reason it is a dead letter."""


def decode_records(records: Iterable[SourceRecord]) -> Iterator[Decoded]:
    for record in records:
        try:
            envelope = EventEnvelope.decode(record.key, record.value, with_metadata=False)
        except MalformedEvent as exc:
            yield record, None, str(exc)
            continue
        yield record, event_from_envelope(envelope), None


def fold_records(
    projection: Projection,
    stored: Mapping[str, KeyState],
    records: Iterable[SourceRecord],
    committed_offsets: Mapping[PartitionKey, int] | None = None,
    watermarks: Mapping[str, int] | None = None,
    lookup_rows: Mapping[str, State] | None = None,
    emit_from: Mapping[PartitionKey, int] | None = EMIT_ALL,
) -> FoldOutcome:
    """Fold topic ``records`` onto ``stored`` states, exactly as one Spark batch would.

    ``watermarks`` are the source streams' last applied versions (by default the stored
    versions, which they equal unless the projection re-keys), ``lookup_rows`` the table a
    ``lookup`` joins with, ``emit_from`` the offsets from which derived events are emitted
    (None: emit nothing).
    """
    return fold_decoded(projection, stored, decode_records(records), committed_offsets,
                        watermarks, lookup_rows, emit_from)


def fold_decoded(
    projection: Projection,
    stored: Mapping[str, KeyState],
    decoded: Iterable[Decoded],
    committed_offsets: Mapping[PartitionKey, int] | None = None,
    watermarks: Mapping[str, int] | None = None,
    lookup_rows: Mapping[str, State] | None = None,
    emit_from: Mapping[PartitionKey, int] | None = EMIT_ALL,
    folder: KeyFolder | None = None,
) -> FoldOutcome:
    """``fold_records`` for records already decoded (by whichever decoder is fastest).

    Records may come in chunks: pass the ``folder`` of the first chunk's call to the next ones
    and their states, duplicates guard and outcome carry over."""
    committed = committed_offsets or {}
    if watermarks is None and projection.key_by is None:
        watermarks = {key: ks.version for key, ks in stored.items()}  # the same thing here
    marks = watermarks or {}
    folder = folder or KeyFolder(projection, FoldOutcome(), emit_from)
    outcome = folder.outcome
    by_key: dict[str, list[tuple[SourceRecord, Event]]] = defaultdict(list)
    for record, event, error in decoded:
        partition = (record.topic, record.partition)
        if record.offset < committed.get(partition, 0):
            outcome.skipped += 1
            continue
        outcome.next_offsets[partition] = record.offset + 1
        if event is None:
            outcome.dead_letters.append(DeadLetter(record, error or "undecodable"))
            continue
        routed = _route(projection, record, event, marks, lookup_rows or {}, outcome)
        if routed is not None:
            by_key[routed[0]].append((record, routed[1]))
    for key, items in by_key.items():
        items.sort(key=lambda item: item[1].global_position)
        folder.fold(key, outcome.changed.get(key) or stored.get(key), items)
    return outcome


def _route(projection: Projection, record: SourceRecord, event: Event,
           watermarks: Mapping[str, int], lookup_rows: Mapping[str, State],
           outcome: FoldOutcome) -> tuple[str, Event] | None:
    """Filter, dedupe and key one event; None when it is not for the fold."""
    if not projection.handles(event.type):
        return None
    if event.stream_version <= watermarks.get(event.stream_id, 0):
        outcome.duplicates += 1
        return None
    key = fold_key(projection, event.stream_id, event.data)
    if key is None:
        outcome.dead_letters.append(DeadLetter(record, missing_key_reason(projection)))
        return None
    if projection.lookup is not None:
        event = event._replace(joined=lookup_rows.get(str(event.data.get(projection.lookup.on))))
    return key, event


def fold_key(projection: Projection, stream_id: str, data: Mapping[str, Any]) -> str | None:
    if projection.key_by is None:
        return stream_id
    value = data.get(projection.key_by)
    return None if value is None else str(value)


def missing_key_reason(projection: Projection) -> str:
    return f"re-key field {projection.key_by!r} is missing from the event"


def fold_in_memory(projection: Projection, records: Iterable[SourceRecord],
                   lookup_rows: Mapping[str, State] | None = None) -> dict[str, State]:
    """A reference fold of ``records`` from empty state: the live keys and their states."""
    outcome = fold_records(projection, {}, records, lookup_rows=lookup_rows)
    return {key: ks.state for key, ks in outcome.changed.items() if ks.state is not None}
