"""Testing an app in memory: its commands, projections, reactions and process managers run
together with no Postgres, Kafka or Spark, on a clock the test moves.

    system = InMemoryApp(app)
    system.execute(LendBook(book="dune", member="ann", due_in_days=14))
    system.advance(timedelta(days=15))                 # due timers fire, in order
    assert system.state("books", "dune") == {"available": 2, "lent": 1}
    assert system.sent("loan_due") == [Fine(member="ann", book="dune", amount=5)]

Everything goes through the code the stack runs: commands through the command bus (its
validation, handlers and command log, in an event store in memory), projections through the
fold the executors run (``fold_records``, from the envelopes the connector publishes),
reactions and process managers through their own ``commands_for`` and ``step`` (a step saved
before its commands go, timers one per name, a refused command coming back as
``command_refused``). What only the stack has is not here: concurrency, delivery twice,
parking (a function that raises fails the test instead, which is what a test wants).

``AggregateFixture`` tests one aggregate given its past events; ``InMemoryApp`` the rest.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from eventfold.app import Eventfold
from eventfold.contract import EventEnvelope, event_topic
from eventfold.projections.definition.projection import Event, Projection, State
from eventfold.projections.execution.fold import EMIT_ALL, fold_records
from eventfold.projections.outcome import KeyState, SourceRecord
from eventfold.reactions.definition import Effect, Reaction, topics_of, wants
from eventfold.reactions.process import (
    COMMAND_REFUSED,
    Process,
    ProcessContext,
    refusal_event,
    timer_event,
)
from eventfold.write_model import (
    Command,
    CommandBus,
    CommandIdReused,
    CommandResult,
    ConcurrencyError,
    DomainError,
    DomainEvent,
    Repository,
    StreamNotFound,
    StreamOwnedByAnotherType,
    default_registry,
)
from eventfold.write_model.domain.events import NewEvent, RecordedEvent
from eventfold.write_model.persistence.store import (
    AppendResult,
    DuplicateCommand,
    Snapshot,
    StoredEvent,
)

REFUSED = (DomainError, StreamNotFound, ConcurrencyError, CommandIdReused,
           StreamOwnedByAnotherType)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    """The time an in-memory app records events at and fires timers by."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start

    def advance(self, by: timedelta) -> None:
        self.now += by


class InMemoryEventStore:
    """The event store's contract (what the command bus asks of it) in memory: streams with
    versions checked on append, one global order, the command log, snapshots."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.recorded: list[RecordedEvent] = []
        self._streams: dict[str, list[RecordedEvent]] = defaultdict(list)
        self._owners: dict[str, str] = {}
        self._results: dict[uuid.UUID, AppendResult] = {}
        self._snapshots: dict[str, tuple[str, int, Snapshot]] = {}
        self._positions = itertools.count(1)

    def append(self, stream_type: str, stream_id: str, expected_version: int,
               events: Sequence[NewEvent], command_id: uuid.UUID | None = None,
               fingerprint: str | None = None) -> AppendResult:
        if not events:
            return AppendResult(stream_id, expected_version, [], [])
        if command_id is not None and command_id in self._results:
            raise DuplicateCommand(command_id, self._results[command_id])
        owner = self._owners.setdefault(stream_id, stream_type)
        if owner != stream_type:
            raise StreamOwnedByAnotherType(stream_id, owner, stream_type)
        stream = self._streams[stream_id]
        if len(stream) != expected_version:
            raise ConcurrencyError(stream_id, expected_version, len(stream))
        for event in events:
            recorded = RecordedEvent(event.event_id, stream_id, stream_type, len(stream) + 1,
                                     next(self._positions), event.event_type,
                                     event.schema_version, dict(event.data),
                                     dict(event.metadata), self.clock.now)
            stream.append(recorded)
            self.recorded.append(recorded)
        result = AppendResult(stream_id, len(stream), [e.event_id for e in events],
                              [e.global_position for e in stream[-len(events):]],
                              fingerprint)
        if command_id is not None:
            self._results[command_id] = result
        return result

    def command_result(self, command_id: uuid.UUID) -> AppendResult | None:
        return self._results.get(command_id)

    def current_version(self, stream_id: str) -> int:
        return len(self._streams.get(stream_id, ()))

    def load(self, stream_id: str, after_version: int = 0,
             snapshot_of: tuple[str, int] | None = None,
             ) -> tuple[Snapshot | None, list[StoredEvent]]:
        snapshot = None
        kept = self._snapshots.get(stream_id)
        if snapshot_of is not None and kept is not None and kept[:2] == snapshot_of:
            snapshot = kept[2]
            after_version = max(after_version, snapshot.stream_version)
        return snapshot, [StoredEvent(e.stream_version, e.event_type, e.schema_version,
                                      dict(e.data), e.stream_type)
                          for e in self._streams.get(stream_id, ())[after_version:]]

    def save_snapshot(self, stream_id: str, aggregate_type: str, schema_version: int,
                      stream_version: int, state: dict[str, Any]) -> None:
        self._snapshots[stream_id] = (aggregate_type, schema_version,
                                      Snapshot(stream_version, json.loads(json.dumps(state))))


@dataclass
class Sent:
    """A command a reaction or process manager sent, and what came of it."""

    command: Command
    result: CommandResult | None
    refused: str | None = None


@dataclass
class _ProcessKeys:
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    timers: dict[tuple[str, str], datetime] = field(default_factory=dict)


class InMemoryApp:
    """``app`` in memory: commands executed, and every event they record delivered at once,
    in order, to the app's projections, reactions and process managers (and the commands
    those send executed, and their events delivered, until nothing is left)."""

    def __init__(self, app: Eventfold, clock: FakeClock | None = None) -> None:
        self.app = app
        self.clock = clock or FakeClock()
        self.store = InMemoryEventStore(self.clock)
        self.bus = CommandBus(Repository(self.store), app.commands)  # type: ignore[arg-type]
        self._delivered = 0
        self._offsets: dict[str, int] = defaultdict(int)
        self._states: dict[str, dict[str, KeyState]] = {p.name: {} for p in app.projections}
        self._sent: dict[str, list[Sent]] = defaultdict(list)
        self._processes: dict[str, _ProcessKeys] = defaultdict(_ProcessKeys)
        self.calls: dict[str, list[tuple[Event, str]]] = defaultdict(list)
        """What each effect was called with: the event and its idempotency key."""

    # -- acting ------------------------------------------------------------------------------
    def execute(self, command: Command) -> CommandResult:
        """Execute ``command`` as the command API does, then deliver what it recorded."""
        result = self.bus.execute(command)
        self._deliver()
        return result

    def advance(self, by: timedelta) -> None:
        """Move the clock on by ``by``: the timers due by then fire, earliest first (each
        delivered with what it caused before the next)."""
        until = self.clock.now + by
        while (due := self._next_due(until)) is not None:
            at, process, key, name = due
            self.clock.now = max(self.clock.now, at)
            del self._processes[process.name].timers[(key, name)]
            self._step(process, key, timer_event(key, name, at), at)
            self._deliver()
        self.clock.now = until

    # -- looking ----------------------------------------------------------------------------
    def events(self, stream_id: str | None = None) -> list[Event]:
        """The events recorded (of one stream), as projections and reactions see them."""
        return [_event(e) for e in self.store.recorded
                if stream_id is None or e.stream_id == stream_id]

    def states(self, projection: str) -> dict[str, State]:
        """A projection's live keys and their states (its read model; its KTable)."""
        declared = self.app.projections.get(projection).columns
        return {key: {c: v for c, v in ks.state.items() if c in declared}
                for key, ks in self._states[projection].items() if ks.state is not None}

    def state(self, projection: str, key: str) -> State | None:
        return self.states(projection).get(key)

    def sent(self, reaction: str) -> list[Command]:
        """The commands ``reaction`` (or a process manager) sent, in order, ids left out."""
        return [s.command.model_copy(update={"command_id": None})
                for s in self._sent[reaction]]

    def refused(self, reaction: str) -> list[tuple[Command, str]]:
        """The commands of ``reaction`` the domain refused, and why."""
        return [(s.command.model_copy(update={"command_id": None}), s.refused)
                for s in self._sent[reaction] if s.refused is not None]

    def process_state(self, process: str, key: str) -> dict[str, Any] | None:
        return self._processes[process].states.get(key)

    def timers(self, process: str) -> dict[tuple[str, str], datetime]:
        """A process manager's pending timers: (key, name) -> when due."""
        return dict(self._processes[process].timers)

    # -- delivering ---------------------------------------------------------------------------
    def _deliver(self) -> None:
        """Every event recorded since the last delivery, in order, to everything that reads
        it; derived events to what reads their topics. Until nothing new was recorded."""
        while self._delivered < len(self.store.recorded):
            recorded = self.store.recorded[self._delivered]
            self._delivered += 1
            record = self._record(event_topic(recorded.stream_type), *_envelope(recorded))
            for derived in self._fold(record):
                self._react(derived, derived_topic=True)
            self._react(record, derived_topic=False)

    def _record(self, topic: str, key: str, value: str) -> SourceRecord:
        offset = self._offsets[topic]
        self._offsets[topic] += 1
        return SourceRecord(topic, 0, offset, key, value)

    def _fold(self, record: SourceRecord) -> list[SourceRecord]:
        """The record through every projection reading its topic; the events they derived."""
        derived = []
        for projection in self.app.projections:
            if record.topic not in projection.source_topics:
                continue
            stored = self._states[projection.name]
            outcome = fold_records(projection, stored, [record], emit_from=EMIT_ALL,
                                   lookup_rows=self._lookup_rows(projection))
            if outcome.dead_letters:
                raise AssertionError(f"projection {projection.name}: "
                                     f"{outcome.dead_letters[0].reason}")
            stored.update(outcome.changed)
            derived += [self._record(e.topic, e.key, e.value) for e in outcome.emissions]
        return derived

    def _lookup_rows(self, projection: Projection) -> Mapping[str, State] | None:
        return None if projection.lookup is None else self.states(projection.lookup.projection)

    def _react(self, record: SourceRecord, derived_topic: bool) -> None:
        decode = EventEnvelope.decode_derived if derived_topic else EventEnvelope.decode
        envelope = decode(record.key, record.value)
        event = Event(envelope.event_type, envelope.data, envelope.stream_id,
                      envelope.stream_version, envelope.event_id, envelope.global_position,
                      envelope.recorded_at, schema_version=envelope.schema_version)
        for declared in self.app.reactions:
            if record.topic not in topics_of(declared) or not wants(declared,
                                                                    event.type):
                continue
            if isinstance(declared, Process):
                self._step(declared, declared.key_of(event), event, self.clock.now)
            elif isinstance(declared, Reaction):
                for command in declared.commands_for(event):
                    self._send(declared.name, command)
            elif isinstance(declared, Effect):
                declared.call(event, declared.idempotency_key(event))
                self.calls[declared.name].append((event, declared.idempotency_key(event)))

    def _step(self, process: Process, key: str, event: Event, at: datetime) -> None:
        """One event of ``key`` through its process; its state and timers saved, then its
        commands sent (a refused one stepped back as ``command_refused``)."""
        keys = self._processes[process.name]
        context = ProcessContext(key, keys.states.get(key), at)
        commands = process.step(context, event)
        if context.cleared:
            keys.timers = {k: v for k, v in keys.timers.items() if k[0] != key}
        for name in context.cancelled:
            keys.timers.pop((key, name), None)
        for timer in context.timers:
            keys.timers[(key, timer.name)] = timer.at
        if context.finished:
            keys.states.pop(key, None)
        elif context.existed or context.state or context.timers:
            keys.states[key] = context.state
        for command in commands:
            refused = self._send(process.name, command)
            if refused is not None and event.type != COMMAND_REFUSED:
                assert command.command_id is not None
                self._step(process, key, refusal_event(
                    key, command.command_name, command.command_id, refused, event.event_id,
                    self.clock.now), self.clock.now)

    def _send(self, sender: str, command: Command) -> str | None:
        """Execute a reaction's command (delivered later, in order); why it was refused."""
        try:
            result = self.bus.execute(command, metadata={"reaction": sender})
        except REFUSED as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self._sent[sender].append(Sent(command, None, reason))
            return reason
        self._sent[sender].append(Sent(command, result))
        return None

    def _next_due(self, until: datetime) -> tuple[datetime, Process, str, str] | None:
        due = [(at, process, key, name) for process in self.app.reactions
               if isinstance(process, Process)
               for (key, name), at in self._processes[process.name].timers.items()
               if at <= until]
        return min(due, key=lambda d: (d[0], d[2], d[3])) if due else None


class AggregateFixture:
    """One aggregate, given its past events, when a command: then the events it records, or
    its refusal. ``app`` (or its commands) says which handler a command goes to.

        (AggregateFixture(app, "dune").given(BookAdded(copies=2))
            .when(LendBook(book="dune", member="ann"))
            .then(BookLent(member="ann")))
    """

    def __init__(self, app: Eventfold, stream_id: str) -> None:
        self.app, self.stream_id = app, stream_id
        self.store = InMemoryEventStore(FakeClock())
        self.bus = CommandBus(Repository(self.store), app.commands)  # type: ignore[arg-type]
        self._given: list[DomainEvent] = []
        self._recorded: list[DomainEvent] | None = None
        self._refused: Exception | None = None

    def given(self, *events: DomainEvent) -> AggregateFixture:
        self._given += events
        return self

    def when(self, command: Command) -> AggregateFixture:
        aggregate = self.app.commands.get(command.command_name).aggregate
        if self._given:
            self.store.append(aggregate.stream_type, self.stream_id, 0,
                              [NewEvent.of(e) for e in self._given])
        before = len(self.store.recorded)
        try:
            self.bus.execute(command)
        except REFUSED as exc:
            self._refused = exc
            return self
        self._recorded = _domain_events(self.store.recorded[before:])
        return self

    def then(self, *events: DomainEvent) -> None:
        assert self._refused is None, f"the command was refused: {self._refused}"
        assert self._recorded == list(events), f"recorded {self._recorded}"

    def then_refused(self, kind: type[Exception] = DomainError, match: str = "") -> None:
        assert isinstance(self._refused, kind), (
            f"not refused with {kind.__name__}: recorded {self._recorded}, "
            f"refused {self._refused!r}")
        assert match in str(self._refused), str(self._refused)


def _domain_events(recorded: Iterable[RecordedEvent]) -> list[DomainEvent]:
    return [default_registry.decode(e.event_type, e.data, e.schema_version) for e in recorded]


def _envelope(recorded: RecordedEvent) -> tuple[str, str]:
    return EventEnvelope(
        event_id=str(recorded.event_id), event_type=recorded.event_type,
        stream_id=recorded.stream_id, stream_version=recorded.stream_version,
        global_position=recorded.global_position,
        recorded_at=recorded.recorded_at.isoformat(), data=dict(recorded.data),
        schema_version=recorded.schema_version, metadata=dict(recorded.metadata)).encode()


def _event(recorded: RecordedEvent) -> Event:
    return Event(recorded.event_type, dict(recorded.data), recorded.stream_id,
                 recorded.stream_version, str(recorded.event_id), recorded.global_position,
                 recorded.recorded_at.isoformat(), schema_version=recorded.schema_version)
