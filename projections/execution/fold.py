"""The fold core: apply events to per-key state, in plain Python, without Spark.

A Spark executor task runs a ``BatchFold`` over the records of its partition; ``fold_records``
runs the very same code over a list of topic records, for tests and for a reference fold.

Delivery upstream is at-least-once, so every event is guarded: a record below the committed
offset of its partition was applied before; an event whose (stream, version) is at or below
the stream's watermark, or was seen earlier in the batch, is a duplicate (Debezium re-sends
after a crash, at new offsets). Watermarks are per source stream, so the guard holds for
re-keyed projections too, where one key gathers the events of many streams.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from itertools import groupby
from types import MappingProxyType

import orjson

from eventfold.contract import EventEnvelope, MalformedEvent, PartitionKey, derived_value
from eventfold.projections.definition.projection import Derived, Event, Projection, State
from eventfold.projections.outcome import (
    NO_PARKED_KEYS,
    PARKED_BEHIND,
    DeadLetter,
    Emission,
    FoldOutcome,
    KeyState,
    ParkedKey,
    RawRecords,
    SourceRecord,
)
from eventfold.projections.plan import Plan, as_plan

log = logging.getLogger(__name__)

EMIT_ALL: Mapping[PartitionKey, int] = MappingProxyType({})
DERIVED_NAMESPACE = uuid.UUID("6f1d8a52-7c1e-4d55-9a55-1f0f9a0c2b10")
KEY_NOT_UTF8 = "message key (aggregate id) is not UTF-8 text"
VALUE_NOT_UTF8 = "message value is not UTF-8 text"


def encode_derived(name: str, event: Event, index: int, derived: Derived) -> Emission:
    event_id = uuid.uuid5(DERIVED_NAMESPACE, f"{name}:{event.event_id}:{index}")
    return Emission(derived.topic, derived.key, derived_value(
        str(event_id), derived.type, derived.data, name, event.event_id, event.global_position))


class KeyFolder:
    """Folds the events of one key after another onto their stored states."""

    def __init__(self, plan: Plan, outcome: FoldOutcome,
                 emit_from: Mapping[PartitionKey, int] | None,
                 parked: Mapping[str, ParkedKey] = NO_PARKED_KEYS) -> None:
        self.plan = plan
        self.outcome = outcome
        self.emit_from = emit_from  # None: this run emits nothing (a replay behind the live one)
        self.parked = parked  # keys parked before this batch
        self._seen: set[tuple[str, int]] = set()
        # What ``fold`` asks of the plan, asked once: it runs once per key.
        self._lookup = plan.projection.lookup
        self._step, self._rekeyed = plan.step, plan.rekeyed
        self._in_rows, self._parks = plan.watermarks_in_rows, plan.parks
        self._derive_step = self._derive if plan.emits and emit_from is not None else None

    def fold(self, key: str, stored: KeyState | None,
             items: Iterable[tuple[SourceRecord, Event]],
             lookup_rows: Mapping[str, State] | None = None) -> None:
        """Fold ``items`` (in position order) onto the key's state, each event joined with its
        row of ``lookup_rows`` when the projection looks one up.

        A (stream, version) met twice counts once. When the key is the aggregate id, its
        stream's versions rise with position, so that takes one comparison with the last
        version; a re-keyed key gathers many streams and remembers each event it met."""
        # The per-event loop of every fold, run once per key: lookups are hoisted into locals
        # on purpose.
        outcome, seen = self.outcome, self._seen
        if self._lookup is not None:
            rows = lookup_rows or {}
            projection = self.plan.projection
            items = [(record, joined(projection, event, rows)) for record, event in items]
        marks, step, rekeyed, in_rows = outcome.watermarks, self._step, self._rekeyed, self._in_rows
        derive = self._derive_step
        if stored is None:
            state, version, position = None, 0, 0
        else:
            state, version, position = stored.state, stored.version, stored.position
        last = 0 if rekeyed else marks.get(key, 0)  # the stream's last version met
        skipped = 0  # the last version dead-lettered for good (a projection that folds on)
        applied = 0
        had_state = False
        head = self.parked.get(key)
        if head is not None:
            outcome.held.add(key)
        else:
            head = outcome.parked.get(key)  # parked by an earlier chunk of this batch
        for record, event in items:
            stream_version = event.stream_version
            if rekeyed:
                identity = (event.stream_id, stream_version)
                if identity in seen:
                    outcome.duplicates += 1
                    continue
                seen.add(identity)
                if stream_version > marks.get(identity[0], 0):
                    marks[identity[0]] = stream_version
            elif stream_version <= last:
                outcome.duplicates += 1
                continue
            else:
                last = stream_version
            if head is not None:
                outcome.dead_letters.append(DeadLetter(
                    with_value(record, event), f"{PARKED_BEHIND}{head}", key, event.event_id,
                    event.global_position, parks=True))
                continue
            try:
                after = step(state, event) if step is not None else None
                emissions = derive(record, event, state, after) if derive else None
            except Exception as exc:  # a fold's bug must not stop the projection
                reason = f"fold raised {exc!r}"
                outcome.dead_letters.append(DeadLetter(
                    with_value(record, event), reason, key, event.event_id,
                    event.global_position, parks=self._parks))
                if self._parks:
                    head = outcome.parked[key] = ParkedKey(
                        record.topic, record.partition, record.offset, event.event_id, reason)
                else:
                    skipped = stream_version
                continue
            if not rekeyed:
                version = stream_version
            elif after is not None or had_state or stored is not None:
                # Counts the events folded into a key that has, or had, a state: one whose
                # events made no state yet leaves no row, however its events were batched.
                version += 1
            state = after
            if event.global_position > position:  # re-keyed, the newest of many streams'
                position = event.global_position
            applied += 1
            had_state = had_state or after is not None
            if emissions:
                outcome.emissions.extend(emissions)
        if not rekeyed and last > marks.get(key, 0):
            marks[key] = last
        outcome.applied += applied
        if step is None:
            return
        # Keyed by aggregate id, the row holds the stream's watermark: the last version that
        # no longer waits, applied or dead-lettered for good. Events held behind a parked key
        # wait: the retry folds them onto the row.
        settled = max(version, skipped) if in_rows else version
        if not applied and settled == (stored.version if stored else 0):
            return
        published = applied and (stored is not None or had_state)
        if not published and not in_rows:
            return  # never had a state: nothing to store, no tombstone to send
        if published:
            outcome.published.add(key)
        outcome.changed[key] = KeyState(state, settled, position)

    def _derive(self, record: SourceRecord, event: Event, before: State | None,
                after: State | None) -> list[Emission]:
        derive = self.plan.projection.derive
        if derive is None or self.emit_from is None:
            return []
        if record.offset < self.emit_from.get((record.topic, record.partition), 0):
            return []  # emitted by the run that applied it first
        return [encode_derived(self.plan.name, event, i, derived)
                for i, derived in enumerate(derive(event, before, after))]


def with_value(record: SourceRecord, event: Event) -> SourceRecord:
    """``record`` with its value for a dead letter: readers keep no text of records that
    decoded, so the event is written back as the envelope it came in."""
    if record.value is not None:
        return record
    return record._replace(value=envelope_of(event))


def envelope_of(event: Event) -> str:
    """The envelope the connector would have written for ``event`` (without metadata)."""
    return EventEnvelope(
        event_id=event.event_id, event_type=event.type, stream_id=event.stream_id,
        stream_version=event.stream_version, global_position=event.global_position,
        recorded_at=event.recorded_at, data=dict(event.data),
        schema_version=event.schema_version).encode()[1]


def event_from_envelope(envelope: EventEnvelope, joined: State | None = None) -> Event:
    return Event(type=envelope.event_type, data=envelope.data, stream_id=envelope.stream_id,
                 stream_version=envelope.stream_version, event_id=envelope.event_id,
                 global_position=envelope.global_position, recorded_at=envelope.recorded_at,
                 joined=joined, schema_version=envelope.schema_version)


loads_json = orjson.loads
new_tuple = tuple.__new__  # builds a named tuple without its Python-level __new__


def _parse_event(key: str | bytes | None, value: bytes | str | None) -> Event | None:
    """The event of a well-formed envelope, parsed fast; None for anything else (which
    ``EventEnvelope.decode`` then judges, with the reason)."""
    try:
        outer = loads_json(value)  # type: ignore[arg-type]
        data = loads_json(outer["payload"])
        event_type, event_id = outer["eventType"], outer["eventId"]
        version, position = outer["streamVersion"], outer["globalPosition"]
        recorded_at = outer.get("recordedAt", "")
        schema_version = outer.get("schemaVersion", 1)
    except Exception:  # the slow path names the problem
        return None
    # Checked as locals, before the tuple exists: a field of a named tuple costs a lookup.
    if (type(data) is dict and type(version) is int and type(position) is int
            and type(event_type) is str and type(event_id) is str
            and type(recorded_at) is str and type(key) is str
            and type(schema_version) is int):
        return new_tuple(Event, (event_type, data, key, version, event_id, position,
                                  recorded_at, None, schema_version))
    return None


def _text(value: bytes | str | None) -> str | None:
    """Text for a dead letter, whatever the bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _by_position(item: tuple[SourceRecord, Event]) -> int:
    return item[1].global_position


class BatchFold:
    """One batch of a plain-Python fold: records are decoded, guarded and routed to their
    keys as they come (``add``), then each key's events are folded onto its state (``fold``).

    Every Python fold runs this, on Spark and off it, so the per-event work is kept to
    parsing the envelope and its payload, two guards and the fold itself: records below the
    committed offsets were applied before, and events at or below their stream's watermark
    were delivered again. A record that does not decode, or has no key to fold by, is a dead
    letter.
    """

    def __init__(self, definition: Plan | Projection,
                 committed_offsets: Mapping[PartitionKey, int] | None = None,
                 watermarks: Mapping[str, int] | None = None,
                 emit_from: Mapping[PartitionKey, int] | None = EMIT_ALL,
                 parked: Mapping[str, ParkedKey] = NO_PARKED_KEYS) -> None:
        self.plan = as_plan(definition)
        self.folder = KeyFolder(self.plan, FoldOutcome(), emit_from, parked)
        self.outcome = self.folder.outcome
        self.committed = committed_offsets or {}
        self.watermarks = watermarks if watermarks is not None else {}
        self._pending: dict[str, list[tuple[SourceRecord, Event]]] = {}
        self._unsorted: set[str] = set()

    def add(self, records: RawRecords) -> None:
        """Decode, guard and route one partition's records (in offset order)."""
        projection, outcome, marks = self.plan.projection, self.outcome, self.watermarks
        pending, unsorted = self._pending, self._unsorted
        topic, partition = records.topic, records.partition
        start = self.committed.get((topic, partition), 0)
        types, rekeyed = projection.event_types, self.plan.rekeyed
        last = -1
        events = (map(_parse_event, records.keys, records.values) if records.events is None
                  else records.events)
        for offset, key, value, event in zip(records.offsets, records.keys, records.values,
                                             events, strict=True):
            if offset < start:
                outcome.skipped += 1
                continue
            last = offset
            if event is None:
                event = self._decode_slowly(SourceRecord(topic, partition, offset, _text(key),
                                                         _text(value)), key, value)
                if event is None:
                    continue
            if types is not None and event.type not in types:
                continue
            if event.stream_version <= marks.get(event.stream_id, 0):
                outcome.duplicates += 1
                continue
            fold_by = (projection.fold_key(event.stream_id, event.data) if rekeyed
                       else event.stream_id)  # the record's key, decoded
            if fold_by is None:
                outcome.dead_letters.append(DeadLetter(
                    SourceRecord(topic, partition, offset, _text(key), _text(value)),
                    missing_key_reason(projection)))
                continue
            item = (new_tuple(SourceRecord, (topic, partition, offset, key, None)), event)
            items = pending.get(fold_by)
            if items is None:
                pending[fold_by] = [item]
                continue
            if event.global_position < items[-1][1].global_position:
                unsorted.add(fold_by)
            items.append(item)
        if last >= 0:
            outcome.next_offsets[(topic, partition)] = last + 1

    def _decode_slowly(self, record: SourceRecord, key: bytes | str | None,
                       value: bytes | str | None) -> Event | None:
        """The event, or None when the record is a dead letter (recorded with the reason).
        ``record`` holds text fit for a dead letter; ``key`` and ``value`` are as read."""
        try:
            if isinstance(key, bytes):
                raise MalformedEvent(KEY_NOT_UTF8)
            if isinstance(value, bytes) and not is_utf8(value):
                raise MalformedEvent(VALUE_NOT_UTF8)
            envelope = EventEnvelope.decode(record.key, record.value, with_metadata=False)
        except MalformedEvent as exc:
            self.outcome.dead_letters.append(DeadLetter(record, str(exc)))
            return None
        return event_from_envelope(envelope)

    def lookup_keys(self) -> set[str]:
        """The keys of the looked-up table the routed events join with."""
        return lookup_keys(self.plan.projection, (event for items in self._pending.values()
                                                  for _, event in items))

    def fold(self, stored: Mapping[str, KeyState],
             lookup_rows: Mapping[str, State] | None = None) -> FoldOutcome:
        """Fold the routed events of each key onto its state: this batch's newest, else
        ``stored``. Later ``add`` calls start afresh; the outcome carries over."""
        outcome = self.outcome
        for key, items in self._pending.items():
            if key in self._unsorted:
                items.sort(key=_by_position)
            self.folder.fold(key, outcome.changed.get(key) or stored.get(key), items,
                             lookup_rows)
        self._pending, self._unsorted = {}, set()
        return outcome


def by_partition(records: Iterable[SourceRecord]) -> list[RawRecords]:
    """``records`` as runs of one partition each, in their order."""
    runs: list[RawRecords] = []
    for (topic, partition), grouped in groupby(records, key=lambda r: (r.topic, r.partition)):
        run = list(grouped)
        runs.append(RawRecords(topic, partition, [r.offset for r in run], [r.key for r in run],
                               [r.value for r in run]))
    return runs


def lookup_keys(projection: Projection, events: Iterable[Event]) -> set[str]:
    """The keys of the looked-up table ``events`` join with."""
    if projection.lookup is None:
        return set()
    keys = {projection.lookup_key(event.data) for event in events}
    return {key for key in keys if key is not None}


def joined(projection: Projection, event: Event, rows: Mapping[str, State]) -> Event:
    """``event`` with the looked-up row it joins with (None: a miss, or no key to look up)."""
    key = projection.lookup_key(event.data)
    return event._replace(joined=None if key is None else rows.get(key))


def fold_records(
    projection: Projection | Plan,
    stored: Mapping[str, KeyState],
    records: Iterable[SourceRecord],
    committed_offsets: Mapping[PartitionKey, int] | None = None,
    watermarks: Mapping[str, int] | None = None,
    lookup_rows: Mapping[str, State] | None = None,
    emit_from: Mapping[PartitionKey, int] | None = EMIT_ALL,
    parked: Mapping[str, ParkedKey] = NO_PARKED_KEYS,
) -> FoldOutcome:
    """Fold topic ``records`` onto ``stored`` states, exactly as one Spark batch would.

    ``watermarks`` are the source streams' last applied versions (by default the stored
    versions, which they equal unless the projection re-keys), ``lookup_rows`` the table a
    ``lookup`` joins with, ``emit_from`` the offsets from which derived events are emitted
    (None: emit nothing), ``parked`` the keys parked before the batch.
    """
    plan = as_plan(projection)
    if watermarks is None and not plan.rekeyed:
        watermarks = {key: ks.version for key, ks in stored.items()}  # the same thing here
    batch = BatchFold(plan, committed_offsets, watermarks, emit_from, parked)
    for run in by_partition(records):
        batch.add(run)
    return batch.fold(stored, lookup_rows)


def missing_key_reason(projection: Projection) -> str:
    return f"re-key field {projection.key_by!r} is missing from the event"


def fold_in_memory(projection: Projection, records: Iterable[SourceRecord],
                   lookup_rows: Mapping[str, State] | None = None) -> dict[str, State]:
    """A reference fold of ``records`` from empty state: the live keys and their states."""
    outcome = fold_records(projection, {}, records, lookup_rows=lookup_rows)
    declared = projection.columns
    return {key: {c: v for c, v in ks.state.items() if c in declared}
            for key, ks in outcome.changed.items() if ks.state is not None}
