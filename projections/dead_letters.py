"""A projection's dead letters: reading them back (what failed, where it came from, the event
as it was published), retrying a parked key once its fold is fixed, discarding a letter.

``sinks.TopicSink`` writes each letter as one JSON object: the projection and version, the
error, the source topic, partition, offset and key, the key it was folded by, and the
message's value. Which letters hold a key back is in Postgres (``parking``), written with the
batch that dead-lettered them."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from eventfold.contract import EventEnvelope, MalformedEvent, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import iter_messages, read_message, read_messages
from eventfold.outbox.topics import Replication
from eventfold.projections.definition.projection import Event, Projection, State
from eventfold.projections.execution.fold import (
    EMIT_ALL,
    KeyFolder,
    event_from_envelope,
    lookup_keys,
)
from eventfold.projections.outcome import DeadLetter, FoldOutcome, SourceRecord
from eventfold.projections.plan import compile_projection
from eventfold.projections.state.catalog import ProjectionCatalog, add_live_rows, lock_registry
from eventfold.projections.state.parking import (
    HeldEvent,
    Resolution,
    held_events,
    release,
    resolutions,
    resolve,
)
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore, lookup_rows
from eventfold.projections.state.topics import OutputTopicConfigs, TopicSink

RETRY_IDLE_TIMEOUT = "30s"
"""The longest a retry may go without a statement while it holds the registry row (reading
letters, producing the key's record): past it the server ends its session, and the retry
changes nothing."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetterRecord:
    dead_letter_offset: int
    error: str
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None
    version: int | None = None
    """The projection version that wrote it (None: a letter from before versions were kept)."""
    fold_key: str | None = None

    @property
    def source(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def event(self) -> dict[str, Any] | None:
        """The event the letter holds, decoded (None when the message is not an event)."""
        try:
            envelope = EventEnvelope.decode(self.key, self.value)
        except MalformedEvent:
            return None
        return {"event_id": envelope.event_id, "event_type": envelope.event_type,
                "stream_id": envelope.stream_id, "stream_version": envelope.stream_version,
                "global_position": envelope.global_position,
                "recorded_at": envelope.recorded_at, "data": envelope.data,
                "metadata": envelope.metadata}

    def as_json(self, with_event: bool = False) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "dead_letter_offset": self.dead_letter_offset, "error": self.error,
            "source": self.source, "key": self.key}
        if with_event:
            shown["event"] = self.event()
            shown["value"] = self.value if shown["event"] is None else None
        return shown


def read_dead_letters(kafka: KafkaConnection, topic: str,
                      last: int | None = None) -> list[DeadLetterRecord]:
    """The letters on ``topic`` (with ``last``: the newest ones), oldest first."""
    return [_letter(offset, value)
            for _, offset, _, value in read_messages(kafka, topic, timeout_s=30, last=last)]


def find_dead_letter(kafka: KafkaConnection, topic: str, offset: int) -> DeadLetterRecord:
    """The letter at ``offset`` of ``topic``, read at that offset; LookupError when there is
    none."""
    found = read_message(kafka, topic, offset)
    if found is None:
        raise LookupError(f"no dead letter at offset {offset} of {topic}")
    return _letter(offset, found[3])


def _letter(offset: int, value: str | None) -> DeadLetterRecord:
    body = json.loads(value or "{}")
    return DeadLetterRecord(
        offset, str(body.get("error", "")), str(body.get("topic", "")),
        int(body.get("partition", -1)), int(body.get("offset", -1)), body.get("key"),
        body.get("value"), body.get("version"), body.get("fold_key"))


# -- acting on them: retry a parked key, discard a letter ---------------------------------------

class RetryFailed(RuntimeError):
    """A retry that changed nothing: the fold still raises, or a letter cannot be folded."""


@dataclass(frozen=True)
class RetryResult:
    key: str
    version: int
    folded: int
    """Events folded onto the key's state, in order."""
    letters: tuple[int, ...]
    """The dead letters it resolved (offsets in the dead-letter topic)."""
    state: State | None


LETTER_CLOCK_SKEW = timedelta(minutes=2)
"""How far the clocks of the tasks that write dead letters, the brokers and the database may
disagree: a retry reads this much more of the dead-letter topic on either side."""

def retry_key(database_url: str, kafka: KafkaConnection, projection: Projection, key: str,
              by: str, replication: Replication | None = None,
              configs: OutputTopicConfigs | None = None) -> RetryResult:
    """Fold the events ``key`` of ``projection``'s active version holds, in order, onto its
    state; write the row and its KTable record, unpark the key and record the letters as
    retried, all or nothing.

    The letters are read first, from the dead-letter topic around the time they were
    written; then the retry holds the projection's registry row for its own commit only (and
    the letters of events parked meanwhile, the newest), so no batch of the active version
    commits meanwhile, and a batch that held the key's events back while it ran folds again
    (``ParkedKeysReleased``). Raises ``RetryFailed`` (and changes nothing) when the fold still
    raises."""
    if not compile_projection(projection).parks:
        raise RetryFailed(f"projection {projection.name} does not park keys (only a fold "
                          "projection with park_on_failure does): its letters were folded past; "
                          "replay it after fixing the fold, or discard them")
    catalog = ProjectionCatalog(database_url)
    try:
        version = catalog.active(projection.name)
    finally:
        catalog.close()
    name = projection.name
    topic = projection.dead_letter_topic
    sink = TopicSink(kafka, projection, version, configs, replication)
    catalog = ProjectionCatalog(database_url)
    try:
        if (shape := sink.ktable_shape()) is not None:
            sink.output.partition_history = catalog.partition_history(
                projection.ktable_topic_for(version), shape.topic_id)
    finally:
        catalog.close()
    try:
        with ReadModelStore(database_url, projection, version) as store:
            # A letter a batch's commit decided may not be in the topic yet.
            store.produce_pending_letters(lambda pending: _produce(sink, pending))
            with store.conn.transaction():
                read_ahead = held_events(store.conn, name, version, key)
            if not read_ahead:
                raise RetryFailed(f"key {key!r} of {name} v{version} is not parked")
            letters = _by_source(read_ahead, held_letters(kafka, topic, version, read_ahead))
            with store.conn.transaction():
                # A retry frozen here (Ctrl-Z) would keep every commit and takeover of the
                # projection waiting on the row: the server ends its session instead.
                store.conn.execute(sql.SQL(
                    "SET LOCAL idle_in_transaction_session_timeout = {}").format(
                    sql.Literal(RETRY_IDLE_TIMEOUT)))
                if lock_registry(store.conn, name) != version:
                    raise RetryFailed(f"projection {name} switched versions; "
                                      "run the retry again")
                held = held_events(store.conn, name, version, key)
                if not held:
                    raise RetryFailed(f"key {key!r} of {name} v{version} is not parked")
                # Events parked since the letters were read (a live run holds the key's new
                # events back): theirs are the newest letters, read from their time.
                if later := [h for h in held if h.source not in letters]:
                    letters |= _by_source(later, held_letters(kafka, topic, version, later))
                return _retry(store, sink, key, by, [letters[h.source] for h in held])
    finally:
        sink.close()


def _produce(sink: TopicSink, letters: Sequence[DeadLetter]) -> None:
    sink.output.dead_letters(letters)
    sink.output.flush()


def _by_source(held: list[HeldEvent], letters: list[list[DeadLetterRecord]]
               ) -> dict[tuple[str, int, int], list[DeadLetterRecord]]:
    return {h.source: copies for h, copies in zip(held, letters, strict=True)}


def _retry(store: ReadModelStore, sink: TopicSink, key: str, by: str,
           letters: list[list[DeadLetterRecord]]) -> RetryResult:
    """In the transaction that holds the registry row: fold the letters (each held event's
    copies, in order) onto the key's state and commit it."""
    name, version = store.projection.name, store.version
    items = [(_source_record(copies[-1]), _event(copies[-1])) for copies in letters]
    stored = store.load([key]).get(key)
    outcome = FoldOutcome()
    if stored is not None and not store.plan.rekeyed:
        outcome.see(key, stored.version)  # what the row holds counts once, whatever happened
    rows = lookup_rows(store.conn, store.projection.lookup.projection,
                       lookup_keys(store.projection, (event for _, event in items))
                       ) if store.projection.lookup is not None else None
    KeyFolder(store.plan, outcome, EMIT_ALL).fold(key, stored, items, rows)
    if outcome.dead_letters:
        failed = outcome.dead_letters[0].record
        raise RetryFailed(f"the fold still fails on {failed.topic}[{failed.partition}]"
                          f"@{failed.offset}: {outcome.dead_letters[0].reason}; "
                          "nothing was changed")
    sink.ensure_outputs(emission.topic for emission in outcome.emissions)
    sink.output.emissions(outcome.emissions)
    # Through a stage of its own, merged as a batch's is, in this transaction.
    stage = store.stage(f"retry-{uuid.uuid4().hex}")
    new, known, live = stage.rows(outcome.changed.items(), {} if stored is None else {
        key: stored.state is not None})
    marks = stage.watermarks(outcome.watermarks) if not store.plan.watermarks_in_rows else 0
    store.merge(StagedBatch(stage.attempt, new_rows=new, known_rows=known, marks=marks))
    add_live_rows(store.conn, name, version, live)
    store.unstage(stage.attempt)
    sink.output.states((changed, outcome.changed[changed]) for changed in outcome.published)
    sink.output.flush()
    release(store.conn, name, version, [(c[-1].topic, c[-1].partition, c[-1].offset)
                                        for c in letters])
    offsets = tuple(letter.dead_letter_offset for copies in letters for letter in copies)
    resolve(store.conn, name, offsets, "retried", by)
    log.info("dlq retry %s key %r: %d event(s) folded by %s", name, key, outcome.applied, by)
    after = outcome.changed.get(key) or stored
    return RetryResult(key, version, outcome.applied, offsets,
                       after.state if after is not None else None)


def held_letters(kafka: KafkaConnection, topic: str, version: int, held: list[HeldEvent]
                 ) -> list[list[DeadLetterRecord]]:
    """The dead letters of each held event, in order (more than one when a batch that wrote
    them ran again after a crash), read from the dead-letter topic between when they were
    written and when their batch committed (the whole topic for events parked before that
    was kept)."""
    since = [h.letters_after for h in held]
    until = [h.parked_at for h in held]
    since_ms = (None if None in since
                else _ms(min(t for t in since if t is not None) - LETTER_CLOCK_SKEW))
    until_ms = (None if None in until
                else _ms(max(t for t in until if t is not None) + LETTER_CLOCK_SKEW))
    wanted = {h.source for h in held}
    by_source: dict[tuple[str, int, int], list[DeadLetterRecord]] = {}
    for _, offset, _, value in iter_messages(kafka, topic, timeout_s=30, since_ms=since_ms,
                                             until_ms=until_ms):
        letter = _letter(offset, value)
        source = (letter.topic, letter.partition, letter.offset)
        if source in wanted and letter.version in (None, version):
            by_source.setdefault(source, []).append(letter)
    missing = [h for h in held if h.source not in by_source]
    if missing:
        first = missing[0]
        raise RetryFailed(f"{len(missing)} held event(s) have no dead letter left in "
                          f"{topic} (first: {first.topic}"
                          f"[{first.partition}]@{first.offset}); did the topic's retention "
                          "drop it, or was the topic truncated?")
    return [by_source[h.source] for h in held]


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _source_record(letter: DeadLetterRecord) -> SourceRecord:
    return SourceRecord(letter.topic, letter.partition, letter.offset, letter.key, letter.value)


def _event(letter: DeadLetterRecord) -> Event:
    try:
        return event_from_envelope(EventEnvelope.decode(letter.key, letter.value))
    except MalformedEvent as exc:
        raise RetryFailed(f"dead letter {letter.dead_letter_offset} holds no event it can fold "
                          f"({exc}); discard it") from None


@dataclass(frozen=True)
class Discarded:
    letter: DeadLetterRecord
    key: str | None
    """The key it was held for (None: it held no key back)."""
    still_held: int
    """Events the key still waits on (0: it is no longer parked)."""


def discard(database_url: str, kafka: KafkaConnection, projection: Projection,
            dead_letter_offset: int, by: str, reason: str) -> Discarded:
    """Record that a letter will never be folded, by whom and why. A held event stops holding
    its key; the key stays parked while it holds others (``retry_key`` folds them)."""
    letter = find_dead_letter(kafka, projection.dead_letter_topic, dead_letter_offset)
    catalog = ProjectionCatalog(database_url)
    try:
        with catalog.locked(projection.name) as conn:
            version = letter.version or catalog.active(projection.name)
            key = release(conn, projection.name, version,
                          [(letter.topic, letter.partition, letter.offset)])
            resolve(conn, projection.name, [dead_letter_offset], "discarded", by, reason)
            left = len(held_events(conn, projection.name, version, key)) if key else 0
    finally:
        catalog.close()
    log.info("dlq discard %s letter %d by %s: %s", projection.name, dead_letter_offset, by,
             reason)
    return Discarded(letter, key, left)


def resolutions_of(database_url: str, name: str,
                   offsets: Sequence[int]) -> dict[int, Resolution]:
    """What was done with those of ``name``'s dead letters, by dead-letter offset."""
    with psycopg.connect(libpq_url(database_url)) as conn:
        return resolutions(conn, name, offsets)
