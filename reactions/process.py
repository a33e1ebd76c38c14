"""Process managers: reactions with state per correlation key, and timers.

``@process("payment_deadline", sources=[Purchase], key_by="purchase_id")`` declares a function
of a ``ProcessContext`` and one event. The context holds the key's state (a JSON object, kept
in ``process_states``), and the function sends commands (``send``), asks to be called again
for the key at a time (``schedule``: a ``Timer`` event then arrives, durably kept in
``process_timers`` and fired once, after restarts too; one timer per name: scheduling a name
again moves it, ``cancel`` drops it), or ends the process (``done``: its state and pending
timers go). ``now`` is when the event was recorded (a timer's: when it fell due), so a
deadline counts from the event, however late a runner handles it, and a step taken again
decides the same.

A step's state, timers and commands commit together with the runner's positions, and the
commands are sent only after that (``outbox``): a step whose state another runner changed
meanwhile sends nothing and is taken again on the newer state, and a crash after the commit
sends the saved commands again, with the same ids, which the command log answers. A command
the domain refuses comes back to its key as a ``command_refused`` event.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from eventfold.projections.definition.fields import key_text, path_value
from eventfold.projections.definition.projection import (
    Event,
    EventType,
    FoldProjection,
    event_type_names,
)
from eventfold.projections.definition.typed import Typed
from eventfold.reactions.definition import (
    Source,
    Start,
    check_name,
    subscription,
    typed,
    with_ids,
)
from eventfold.reactions.process_view import StreamMoved, record_changes, state_projection
from eventfold.write_model import Command

TIMER_EVENT_PREFIX = "timer-"
REFUSAL_EVENT_PREFIX = "refused-"
COMMAND_REFUSED = "command_refused"
"""The type of the event that tells a process the domain refused one of its commands."""
_TIMER_IDS = uuid.UUID("0d3f3b8e-5a0e-4a55-8f0f-9b7e1c2a6d41")


@dataclass(frozen=True)
class Timer:
    """A timer asked for by ``ProcessContext.schedule``: ``name`` at ``at``."""

    name: str
    at: datetime


class ProcessContext:
    """One key's process while its events (or a timer) are handled: its state, the commands
    it sends and the timers it asks for."""

    def __init__(self, key: str, state: Mapping[str, Any] | None, now: datetime) -> None:
        self.key = key
        self.state: dict[str, Any] = dict(state or {})
        self.now = now
        """When the event being handled was recorded (a timer's: when it fell due)."""
        self.existed = state is not None
        self.commands: list[Command] = []
        self.timers: list[Timer] = []
        self.cancelled: set[str] = set()
        """Names of timers scheduled before this batch that go."""
        self.finished = False
        self.cleared = False
        """Ended at least once in this batch: its timers of before go."""

    def send(self, command: Command) -> None:
        """Send ``command`` once this step is saved (with the id it always has for the
        event)."""
        self.commands.append(command)

    def schedule(self, name: str, *, at: datetime | None = None,
                 after: timedelta | None = None) -> None:
        """Be called again for this key with an event of type ``name``: at ``at``, or
        ``after`` from ``now`` (when the event was recorded). One timer per name: a name
        scheduled again is moved."""
        if (at is None) == (after is None):
            raise ValueError("schedule takes either at= or after=")
        when = at if at is not None else self.now + after  # type: ignore[operator]
        self.timers = [timer for timer in self.timers if timer.name != name]
        self.timers.append(Timer(name, when))
        self.cancelled.discard(name)

    def cancel(self, name: str) -> None:
        """Drop the timer ``name`` of this key, if one is pending."""
        self.timers = [timer for timer in self.timers if timer.name != name]
        self.cancelled.add(name)

    def done(self) -> None:
        """The process of this key is over: its state and pending timers go (an event of the
        key after this starts a new one)."""
        self.finished = self.cleared = True
        self.timers.clear()
        self.cancelled.clear()


@dataclass(frozen=True)
class Process:
    """``handle`` runs once per event of ``sources`` and per timer, for the key ``key_by``
    names in the event's data (a dotted path reaches into it: ``order.id``; its stream id
    without one), one event of a key after another. Events that name their process by
    different fields map each type to its own (``{"PaymentTaken": "order.id", ...}``), as a
    saga's handlers each name their association property."""

    name: str
    sources: tuple[str, ...]
    handle: Callable[[ProcessContext, Event], None]
    key_by: str | Mapping[str, str] | None = None
    start: Start = "latest"
    derived_topics: tuple[str, ...] = ()
    event_types: frozenset[str] | None = None
    """The events it is called for (None: all); timers always."""

    def __post_init__(self) -> None:
        check_name(self)
        if isinstance(self.key_by, Mapping):
            unkeyed = (self.event_types or frozenset({"(any type)"})) - self.key_by.keys()
            if unkeyed:
                raise ValueError(f"process {self.name!r}: key_by names no field for "
                                 f"{', '.join(sorted(unkeyed))} (with key_by by event type, "
                                 f"name event_types and a field for each)")

    def read_model(self) -> FoldProjection:
        """The projection of its running keys (``<name>_processes``): a read model and a
        KTable of each key's state and pending timers (``process_view``)."""
        return state_projection(self.name)

    def key_of(self, event: Event) -> str:
        if self.key_by is None or event.event_id.startswith(_OWN_EVENTS):
            return event.stream_id  # a timer's or a refusal's: its key
        path = self.key_by if isinstance(self.key_by, str) else self.key_by[event.type]
        # A projection's rule, so one field keys a process and a re-keyed projection alike
        key = key_text(path_value(event.data, path))
        if key is None:
            raise KeyError(f"{event.type} has no {path!r} to key the process by")
        return key

    def step(self, context: ProcessContext, event: Event) -> list[Command]:
        """Handle ``event``; the commands it sent, each with the id it always has for the
        event. A handler that raises leaves the context as it found it."""
        if context.finished:  # ended earlier in the batch: this event starts a new one
            context.state, context.finished = {}, False
        before = (copy.deepcopy(context.state), len(context.commands), list(context.timers),
                  context.finished, context.cleared, set(context.cancelled))
        try:
            self.handle(context, event)
        except Exception:
            context.state, context.finished, context.cleared = before[0], before[3], before[4]
            context.timers, context.cancelled = before[2], before[5]
            del context.commands[before[1]:]
            raise
        return with_ids(self.name, event.event_id, context.commands[before[1]:])


class TypedHandle(Typed):
    def __call__(self, context: ProcessContext, event: Event) -> None:
        self.function(context, self.typed(event))


def process(name: str, sources: Sequence[Source],
            key_by: str | Mapping[EventType, str] | None = None, start: Start = "latest",
            event_types: Sequence[EventType] | None = None
            ) -> Callable[[Callable[[ProcessContext, Any], None]], Process]:
    """Decorator: a function of a ``ProcessContext`` and an event becomes a ``Process``
    (``event_types`` as ``reaction``'s; a timer comes as the ``Event`` named after it).
    ``key_by``: one field of every event's data, or a field per event type (by class or
    name)."""
    paths = key_by if key_by is None or isinstance(key_by, str) else {
        next(iter(event_type_names([event_type]))): path
        for event_type, path in key_by.items()}

    def define(handle: Callable[[ProcessContext, Any], None]) -> Process:
        return Process(name=name, handle=typed(TypedHandle, handle, event_types),
                       key_by=paths, start=start, **subscription(sources, event_types))

    return define


_OWN_EVENTS = (TIMER_EVENT_PREFIX, REFUSAL_EVENT_PREFIX)


def timer_event(key: str, name: str, at: datetime) -> Event:
    """The event a due timer is handled as: its type the timer's name, its id the same for
    the same timer (key, name and time), whoever fires it and however often: its commands'
    ids follow from it."""
    event_id = uuid.uuid5(_TIMER_IDS, f"{key}\n{name}\n{at.isoformat()}")
    return Event(name, {"timer": name, "at": at.isoformat()}, key, 0,
                 f"{TIMER_EVENT_PREFIX}{event_id}", 0, at.isoformat())


def refusal_event(key: str, command: str, command_id: uuid.UUID, reason: str,
                  caused_by: str, at: datetime) -> Event:
    """The event that tells a process one of its commands was refused (``COMMAND_REFUSED``;
    its id follows from the command's)."""
    return Event(COMMAND_REFUSED, {"command": command, "command_id": str(command_id),
                                   "reason": reason, "caused_by": caused_by}, key, 0,
                 f"{REFUSAL_EVENT_PREFIX}{command_id}", 0, at.isoformat())


def recorded_time(recorded_at: str) -> datetime | None:
    """An event's ``recorded_at`` as a time (None when it does not say: a derived event)."""
    try:
        at = datetime.fromisoformat(recorded_at)
    except (TypeError, ValueError):
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# -- state and timers in Postgres -----------------------------------------------------------
class StateConflict(RuntimeError):
    """A key's state changed since the batch loaded it (another runner of the process acted
    on it meanwhile): the batch is read again."""


@dataclass
class KeyStates:
    """The states of a batch's keys as loaded (with their versions), and the contexts that
    changed them."""

    loaded: dict[str, tuple[dict[str, Any], int]]
    contexts: dict[str, ProcessContext] = field(default_factory=dict)

    def context(self, key: str, now: datetime) -> ProcessContext:
        """The key's context, at ``now`` (the time of the event about to be handled)."""
        if key not in self.contexts:
            state = self.loaded.get(key)
            self.contexts[key] = ProcessContext(key, state[0] if state else None, now)
        context = self.contexts[key]
        context.now = now
        return context


def load_states(conn: psycopg.Connection, process: str, keys: Sequence[str]) -> KeyStates:
    rows = conn.execute("SELECT key, state, version FROM process_states WHERE process = %s "
                        "AND key = ANY(%s)", (process, list(keys))).fetchall()
    return KeyStates({str(key): (dict(state), int(version)) for key, state, version in rows})


def save_states(conn: psycopg.Connection, process: str, states: KeyStates) -> None:
    """Each changed key's state, its pending timers and the event that shows the change
    (``process_view``): inside the caller's transaction. Raises ``StateConflict`` when a
    key's state is no longer the version the batch loaded."""
    changes: dict[str, dict[str, Any] | None] = {}
    for key, context in states.contexts.items():
        if _save_state(conn, process, key, context, states.loaded.get(key)):
            changes[key] = None if context.finished else context.state
    try:
        record_changes(conn, process, changes)
    except StreamMoved as exc:
        raise StateConflict(f"process {process}: {exc}") from exc


def _save_state(conn: psycopg.Connection, process: str, key: str, context: ProcessContext,
                loaded: tuple[dict[str, Any], int] | None) -> bool:
    """Whether the key's process changed (a process the event did not start did not)."""
    version = loaded[1] if loaded else None
    if context.cleared:
        conn.execute("DELETE FROM process_timers WHERE process = %s AND key = %s",
                     (process, key))
    elif context.cancelled:
        conn.execute("DELETE FROM process_timers WHERE process = %s AND key = %s AND "
                     "name = ANY(%s)", (process, key, sorted(context.cancelled)))
    if context.finished:
        changed = conn.execute("DELETE FROM process_states WHERE process = %s AND key = %s "
                               "AND version = %s", (process, key, version)).rowcount
        if version is not None and changed != 1:
            raise StateConflict(f"process {process}: key {key!r} changed meanwhile")
        return version is not None
    if version is None and not context.state and not context.timers:
        return False  # an event the process ignored: no process starts for the key
    if version is None:
        changed = conn.execute(
            "INSERT INTO process_states (process, key, state, version) VALUES "
            "(%s, %s, %s, 1) ON CONFLICT DO NOTHING",
            (process, key, Jsonb(context.state))).rowcount
    else:
        changed = conn.execute(
            "UPDATE process_states SET state = %s, version = version + 1, "
            "updated_at = now() WHERE process = %s AND key = %s AND version = %s",
            (Jsonb(context.state), process, key, version)).rowcount
    if changed != 1:
        raise StateConflict(f"process {process}: key {key!r} changed meanwhile")
    if context.timers:
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO process_timers (process, key, name, fire_at) VALUES "
                "(%s, %s, %s, %s) ON CONFLICT (process, key, name) DO UPDATE SET "
                "fire_at = EXCLUDED.fire_at", [(process, key, t.name, t.at)
                                               for t in context.timers])
    return True


@dataclass(frozen=True)
class DueTimer:
    id: int
    key: str
    name: str
    at: datetime


def take_due_timers(conn: psycopg.Connection, process: str, limit: int,
                    sources: Sequence[str], grace_s: float) -> list[DueTimer]:
    """Due timers, locked until the caller's transaction ends (another runner skips them),
    except those of parked keys: a timer waits behind its key's held events as they do.

    Due by the process's stream time, not only the clock: a timer fires once every
    partition of ``sources`` has been stepped ``grace_s`` past its due time (events reach
    Kafka a moment after they are recorded), so the events recorded before it are stepped
    first, however far behind the runner is."""
    rows = conn.execute(
        "WITH stream AS (SELECT min(COALESCE(stepped_through, '-infinity')) AS through "
        "FROM reaction_positions WHERE reaction = %(p)s AND topic = ANY(%(sources)s)) "
        "SELECT t.id, t.key, t.name, t.fire_at FROM process_timers t, stream "
        "WHERE t.process = %(p)s AND t.fire_at <= now() "
        "AND t.fire_at + make_interval(secs => %(grace)s) <= stream.through "
        "AND NOT EXISTS (SELECT 1 FROM reaction_parked p WHERE p.reaction = t.process "
        "AND p.key = t.key) ORDER BY t.fire_at, t.id LIMIT %(limit)s "
        "FOR UPDATE OF t SKIP LOCKED",
        {"p": process, "sources": list(sources), "grace": grace_s, "limit": limit}
    ).fetchall()
    return [DueTimer(int(i), str(k), str(n), a) for i, k, n, a in rows]


def due_by_the_clock(conn: psycopg.Connection, process: str, grace_s: float) -> bool:
    """Whether a timer of a key not parked is ``grace_s`` past its due time: only then is it
    worth finding which partitions are stepped to their end."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM process_timers t WHERE t.process = %s AND t.fire_at + "
        "make_interval(secs => %s) <= now() AND NOT EXISTS (SELECT 1 FROM reaction_parked p "
        "WHERE p.reaction = t.process AND p.key = t.key))", (process, grace_s)).fetchone()
    return bool(row and row[0])


def save_fired(conn: psycopg.Connection, process: str, states: KeyStates,
               fired: Sequence[DueTimer]) -> None:
    """The states after ``fired`` timers were handled, inside the caller's transaction. The
    fired timers go first (a timer its step scheduled again stays, moved): the event that
    shows a key's change lists only what is still pending."""
    conn.execute("DELETE FROM process_timers WHERE id = ANY(%s)", ([t.id for t in fired],))
    save_states(conn, process, states)


def clear_process(conn: psycopg.Connection, process: str) -> tuple[int, int]:
    """Every key's state and pending timer of ``process`` gone (a reset to the beginning
    steps every event again from no state); how many states and timers went."""
    keys = [str(key) for (key,) in conn.execute(
        "DELETE FROM process_states WHERE process = %s RETURNING key", (process,))]
    timers = conn.execute("DELETE FROM process_timers WHERE process = %s", (process,)).rowcount
    record_changes(conn, process, dict.fromkeys(keys))
    return len(keys), timers


def database_now(conn: psycopg.Connection) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    return row[0] if row else datetime.now(UTC)


@dataclass(frozen=True)
class RunningProcess:
    """One key's process as an operator sees it: its state and its pending timers."""

    key: str
    state: dict[str, Any]
    updated_at: str
    timers: list[tuple[str, str]]
    """Each pending timer's name and when it falls due."""


def running_processes(conn: psycopg.Connection, process: str, limit: int,
                      key_prefix: str = "") -> list[RunningProcess]:
    """The process's running keys (those starting with ``key_prefix``), in key order."""
    rows = conn.execute(
        "SELECT s.key, s.state, s.updated_at, coalesce((SELECT json_agg(json_build_array("
        "t.name, t.fire_at) ORDER BY t.fire_at) FROM process_timers t WHERE t.process = "
        "s.process AND t.key = s.key), '[]') FROM process_states s WHERE s.process = %s AND "
        "s.key LIKE %s ORDER BY s.key LIMIT %s",
        (process, key_prefix.replace("%", r"\%").replace("_", r"\_") + "%", limit)).fetchall()
    return [RunningProcess(str(key), dict(state), updated.isoformat(timespec="seconds"),
                           [(str(name), str(at)) for name, at in timers])
            for key, state, updated, timers in rows]


def process_counts(conn: psycopg.Connection, process: str) -> tuple[int, int]:
    """How many keys of the process are running, and how many timers are pending."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM process_states WHERE process = %s), "
        "(SELECT count(*) FROM process_timers WHERE process = %s)", (process, process)
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)
