"""The Postgres event store: atomic appends with optimistic concurrency, and reads.

Appends are group-committed: appends that arrive together from several threads go to the
database as one call of ``eventfold_append_units`` (migration 0006) in autocommit mode, one
round trip and one transaction for all of them. Each append is still checked on its own: its
expected version, its command id (a retry gets the first result). The function inserts the
events and their outbox rows, deletes the outbox rows (Debezium reads the inserts from the
WAL, so the table stays empty) and records each command's result. If the call fails as a
whole (another process won a race on a stream), each append is retried alone, so one
append's error is never another's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import orjson
import psycopg
from psycopg import errors
from sqlalchemy import Engine, create_engine

from eventfold.write_model.domain.events import NewEvent, RecordedEvent
from eventfold.write_model.persistence.group_commit import GroupCommit


class ConcurrencyError(Exception):
    """The stream moved on since it was loaded; nothing was written."""

    def __init__(self, stream_id: str, expected_version: int, current_version: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {current_version}, expected {expected_version}"
        )
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.current_version = current_version


class StreamOwnedByAnotherType(Exception):
    """The stream holds another aggregate type's events: a stream id names one aggregate of
    one type. Nothing was written."""

    def __init__(self, stream_id: str, owner: str, requested: str) -> None:
        super().__init__(f"stream {stream_id!r} belongs to aggregate type {owner!r}; "
                         f"a {requested!r} cannot use it")
        self.stream_id = stream_id
        self.owner = owner
        self.requested = requested


class CommandIdReused(Exception):
    """The command id was executed before with another payload: not a retry. Nothing was
    written."""

    def __init__(self, command_id: uuid.UUID) -> None:
        super().__init__(f"command id {command_id} was already used with a different payload; "
                         "a retry must repeat the same command, a new command needs a new id")
        self.command_id = command_id


class StreamNotFound(LookupError):
    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} does not exist")
        self.stream_id = stream_id


class DuplicateCommand(Exception):
    """The command id was already executed; ``result`` is what it returned then."""

    def __init__(self, command_id: uuid.UUID, result: AppendResult) -> None:
        super().__init__(f"command {command_id} was already executed")
        self.command_id = command_id
        self.result = result


class StoreUnavailable(Exception):
    """The database cannot be reached; nothing was written. Retrying later is safe."""


@dataclass(frozen=True)
class AppendResult:
    stream_id: str
    version: int
    event_ids: list[uuid.UUID]
    global_positions: list[int]
    fingerprint: str | None = None
    """Of the command that appended (logged results only): tells a retry from a reuse."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppendResult:
        return cls(data["stream_id"], int(data["version"]),
                   [uuid.UUID(str(e)) for e in data["event_ids"]],
                   [int(p) for p in data["global_positions"]], data.get("fingerprint"))


@dataclass(frozen=True)
class StreamAppend:
    """One stream's part of a unit of work."""

    stream_type: str
    stream_id: str
    expected_version: int
    events: Sequence[NewEvent]


@dataclass(frozen=True)
class UnitOfWork:
    """What one command appends: one or more streams, all or nothing."""

    parts: tuple[StreamAppend, ...]
    command_id: uuid.UUID | None
    fingerprint: str | None = None
    """The command's payload digest, logged with its result."""

    @classmethod
    def of(cls, appends: Sequence[StreamAppend], command_id: uuid.UUID | None,
           fingerprint: str | None = None) -> UnitOfWork:
        if len({a.stream_id for a in appends}) != len(appends):
            raise ValueError("a unit of work appends to each stream at most once")
        return cls(tuple(appends), command_id, fingerprint)

    def keys(self) -> list[object]:
        """What two appends committed together must not share."""
        streams: list[object] = [part.stream_id for part in self.parts]
        return streams if self.command_id is None else [*streams, self.command_id]

    def as_json(self) -> dict[str, Any]:
        return {"c": self.command_id, "f": self.fingerprint, "p": [
            {"t": part.stream_type, "s": part.stream_id, "e": part.expected_version,
             "v": [{"i": e.event_id, "y": e.event_type, "sv": e.schema_version, "d": e.data,
                    "m": e.metadata} for e in part.events]}
            for part in self.parts]}


UnitOutcome = list[AppendResult] | Exception
RACE_RETRIES = 3


@dataclass(frozen=True)
class StoredEvent:
    """The minimum needed to rebuild an aggregate: version, type, schema version, data."""

    stream_version: int
    event_type: str
    schema_version: int
    data: dict[str, Any]
    stream_type: str


@dataclass(frozen=True)
class Snapshot:
    stream_version: int
    state: dict[str, Any]


@dataclass(frozen=True)
class EventPage:
    events: list[RecordedEvent]
    cursor: str
    """Pass back to ``read_all`` for the next page; opaque (transaction id and position)."""


APPEND_UNITS = "SELECT eventfold_append_units(%s::jsonb)"
LOAD_EVENTS = ("SELECT stream_version, event_type, schema_version, data, stream_type FROM events "
         "WHERE stream_id = %s AND stream_version > %s ORDER BY stream_version")
_RECORDED_COLUMNS = ("event_id, stream_id, stream_type, stream_version, global_position, "
                     "event_type, schema_version, data, metadata, recorded_at")
_READ_STREAM = (f"SELECT {_RECORDED_COLUMNS} FROM events "
                "WHERE stream_id = %s AND stream_version > %s ORDER BY stream_version")
# Only transactions older than every running one are read, in (transaction, position) order:
# a transaction still running can commit only after them, so a page never skips an event.
_READ_ALL = (f"SELECT tx_id::text::bigint, {_RECORDED_COLUMNS} FROM events "
             # the cursor cast to the column's type: a range of the (tx_id, global_position)
             # index, where the column cast to the cursor's would read from the start
             "WHERE (tx_id, global_position) > (%s::text::xid8, %s) "
             "AND tx_id < pg_snapshot_xmin(pg_current_snapshot()) "
             # the column, not the output column of that name (the bigint): the index's order
             "ORDER BY events.tx_id, global_position LIMIT %s")
_CURRENT_VERSION = "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = %s"
_STREAM_VERSIONS = ("SELECT stream_id, max(stream_version) FROM events "
                    "WHERE stream_id = ANY(%s) GROUP BY stream_id")
COMMAND_RESULT = "SELECT result FROM command_log WHERE command_id = %s"
# The oldest results past the retention, a batch at a time (by migration 0014's index): each
# batch a short transaction that locks only rows no append reads any more, and skips those
# another process's pruning holds (each HTTP worker prunes).
PRUNE_COMMAND_RESULTS = """
    DELETE FROM command_log WHERE command_id IN (
        SELECT command_id FROM command_log
        WHERE recorded_at < now() - make_interval(secs => %s)
        ORDER BY recorded_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""
PRUNE_BATCH = 5_000
LOAD_SNAPSHOT = ("SELECT stream_version, state FROM snapshots "
                  "WHERE stream_id = %s AND aggregate_type = %s AND schema_version = %s")
SAVE_SNAPSHOT = """
INSERT INTO snapshots (stream_id, aggregate_type, schema_version, stream_version, state)
VALUES (%s, %s, %s, %s, %s::jsonb)
ON CONFLICT (stream_id) DO UPDATE SET
    aggregate_type = excluded.aggregate_type, schema_version = excluded.schema_version,
    stream_version = excluded.stream_version, state = excluded.state, recorded_at = now()
WHERE snapshots.stream_version < excluded.stream_version
   OR snapshots.schema_version <> excluded.schema_version
"""


class EventStore:
    """Append-only event storage on Postgres with optimistic concurrency.

    Thread-safe. ``max_batch`` bounds the appends one transaction carries and
    ``concurrent_commits`` how many such transactions run at once.
    """

    def __init__(self, engine: Engine, max_batch: int = 256, concurrent_commits: int = 2) -> None:
        self.engine = engine
        self._group: GroupCommit[UnitOfWork, list[AppendResult]] = GroupCommit(
            self._commit_units, UnitOfWork.keys, max_batch=max_batch,
            max_concurrent=concurrent_commits)

    @classmethod
    def from_url(cls, database_url: str, pool_size: int = 10, max_batch: int = 256,
                 concurrent_commits: int = 2) -> EventStore:
        # Autocommit: an append is one function call, so one statement is one transaction.
        engine = create_engine(database_url, pool_size=pool_size, max_overflow=pool_size,
                               isolation_level="AUTOCOMMIT")
        return cls(engine, max_batch, min(concurrent_commits, pool_size))

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled psycopg connection; one that lost the server is discarded, not reused."""
        try:
            pooled = self.engine.raw_connection()
        except Exception as exc:
            if _is_unavailable(exc):
                raise StoreUnavailable(f"database unavailable: {first_line(exc)}") from exc
            raise
        try:
            yield cast(psycopg.Connection[Any], pooled.driver_connection)
        except psycopg.OperationalError as exc:
            pooled.invalidate()
            raise StoreUnavailable(f"database unavailable: {first_line(exc)}") from exc
        finally:
            pooled.close()

    # -- writing ----------------------------------------------------------------------------
    def append(
        self, stream_type: str, stream_id: str, expected_version: int,
        events: Sequence[NewEvent], command_id: uuid.UUID | None = None,
        fingerprint: str | None = None,
    ) -> AppendResult:
        """Append ``events`` after ``expected_version``; raise ConcurrencyError if it moved on,
        StreamOwnedByAnotherType if another aggregate type owns the stream, DuplicateCommand
        (with the first result) if ``command_id`` was executed before."""
        if not events:
            return AppendResult(stream_id, expected_version, [], [])
        part = StreamAppend(stream_type, stream_id, expected_version, events)
        return self._group.submit(UnitOfWork((part,), command_id, fingerprint))[0]

    def append_many(self, appends: Sequence[StreamAppend], command_id: uuid.UUID | None = None,
                    fingerprint: str | None = None) -> list[AppendResult]:
        """Append to several streams in one transaction: all of them or none."""
        return self._group.submit(UnitOfWork.of(appends, command_id, fingerprint))

    def _commit_units(self, units: Sequence[UnitOfWork]) -> list[UnitOutcome]:
        with self.connection() as conn:
            try:
                return _append_units(conn, units)
            except psycopg.Error as exc:
                raise_if_unavailable(exc)  # else one bad unit or a lost race failed them all
            return [self._commit_alone(conn, unit) for unit in units]

    @staticmethod
    def _commit_alone(conn: psycopg.Connection[Any], unit: UnitOfWork) -> UnitOutcome:
        for attempt in range(1, RACE_RETRIES + 1):
            try:
                return _append_units(conn, [unit])[0]
            except psycopg.Error as exc:
                if not check_again(exc, attempt):
                    return exc
        raise AssertionError("unreachable: the last attempt never checks again")

    def save_snapshot(self, stream_id: str, aggregate_type: str, schema_version: int,
                      stream_version: int, state: dict[str, Any]) -> None:
        with self.connection() as conn:
            conn.execute(SAVE_SNAPSHOT, (stream_id, aggregate_type, schema_version,
                                          stream_version, json.dumps(state)))

    # -- reading ----------------------------------------------------------------------------
    def current_version(self, stream_id: str) -> int:
        with self.connection() as conn:
            return _current_version(conn, stream_id)

    def command_result(self, command_id: uuid.UUID) -> AppendResult | None:
        with self.connection() as conn:
            row = conn.execute(COMMAND_RESULT, (command_id,)).fetchone()
        return AppendResult.from_json(row[0]) if row else None

    def load(self, stream_id: str, after_version: int = 0,
             snapshot_of: tuple[str, int] | None = None,
             ) -> tuple[Snapshot | None, list[StoredEvent]]:
        """What rebuilds an aggregate: its snapshot (if ``snapshot_of`` = (aggregate type,
        state version) matches one) and the events after it."""
        with self.connection() as conn:
            snapshot = None
            if snapshot_of is not None:
                row = conn.execute(LOAD_SNAPSHOT, (stream_id, *snapshot_of)).fetchone()
                if row and row[0] > after_version:
                    snapshot = Snapshot(int(row[0]), row[1])
                    after_version = snapshot.stream_version
            rows = conn.execute(LOAD_EVENTS, (stream_id, after_version)).fetchall()
        return snapshot, [StoredEvent(*row) for row in rows]

    def event_identities(self, stream_type: str,
                         chunk: int = 10_000) -> Iterator[tuple[str, str, int]]:
        """(event id, stream id, stream version) of every event of one aggregate type, in log
        order, streamed from a server-side cursor ``chunk`` rows at a time (the log may hold
        more than a process can)."""
        with self.connection() as conn, conn.transaction(), conn.cursor(
                name="event_identities") as cursor:
            cursor.execute("SELECT event_id::text, stream_id, stream_version FROM events "
                           "WHERE stream_type = %s ORDER BY global_position", (stream_type,))
            while rows := cursor.fetchmany(chunk):
                yield from rows

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[RecordedEvent]:
        with self.connection() as conn:
            rows = conn.execute(_READ_STREAM, (stream_id, after_version)).fetchall()
        return [RecordedEvent(*row) for row in rows]

    def read_all(self, cursor: str = "", limit: int = 1000) -> EventPage:
        """A page of all events in commit-safe order, from ``cursor`` ("" = the beginning)."""
        tx_id, position = (int(part) for part in cursor.split(":")) if cursor else (0, 0)
        with self.connection() as conn:
            rows = conn.execute(_READ_ALL, (tx_id, position, limit)).fetchall()
        if rows:
            tx_id, position = rows[-1][0], rows[-1][5]
        return EventPage([RecordedEvent(*row[1:]) for row in rows], f"{tx_id}:{position}")


def raise_if_unavailable(error: psycopg.Error) -> None:
    """A lost connection fails the whole batch; any other error is one unit's."""
    if isinstance(error, psycopg.OperationalError):
        raise error


def check_again(error: psycopg.Error, attempt: int) -> bool:
    """Whether a unit committed alone is tried again after ``error``: yes when another
    process won a race on its stream (checked again, it is a refusal), up to RACE_RETRIES."""
    raise_if_unavailable(error)
    return isinstance(error, errors.UniqueViolation) and attempt < RACE_RETRIES


def _append_units(conn: psycopg.Connection[Any],
                  units: Sequence[UnitOfWork]) -> list[UnitOutcome]:
    row = conn.execute(APPEND_UNITS, (encode_units(units),)).fetchone()
    assert row is not None
    return decode_outcomes(units, row[0])


def append_in_transaction(conn: psycopg.Connection[Any],
                          appends: Sequence[StreamAppend]) -> list[AppendResult]:
    """Append ``appends`` as one unit inside the caller's transaction on ``conn``, so that
    they commit or roll back with what else it writes; raises the refusal (a
    ``ConcurrencyError`` when a stream is not at its expected version)."""
    outcome = _append_units(conn, [UnitOfWork.of(appends, None)])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def stream_versions(conn: psycopg.Connection[Any], stream_ids: Sequence[str]) -> dict[str, int]:
    """Each stream's current version (0 for a stream with no events)."""
    rows = conn.execute(_STREAM_VERSIONS, (list(stream_ids),)).fetchall()
    found = {str(stream): int(version) for stream, version in rows}
    return {stream: found.get(stream, 0) for stream in stream_ids}


def units_json(units: Sequence[UnitOfWork]) -> bytes:
    """The argument of ``eventfold_append_units``: JSON text, UTF-8."""
    return orjson.dumps([unit.as_json() for unit in units])


def encode_units(units: Sequence[UnitOfWork]) -> str:
    return units_json(units).decode()


def decode_outcomes(units: Sequence[UnitOfWork], reply: dict[str, Any]) -> list[UnitOutcome]:
    """Each unit's results, or the refusal its caller gets; positions come in unit order."""
    rejected: dict[str, dict[str, Any]] = reply["rejected"]
    positions: list[int] = reply["positions"]
    outcomes: list[UnitOutcome] = []
    taken = 0
    for n, unit in enumerate(units):
        refusal = rejected.get(str(n))
        if refusal is not None:
            outcomes.append(_refusal_error(unit, refusal))
            continue
        results = []
        for part in unit.parts:
            count = len(part.events)
            results.append(AppendResult(
                part.stream_id, part.expected_version + count,
                [e.event_id for e in part.events], positions[taken:taken + count]))
            taken += count
        outcomes.append(results)
    return outcomes


def _current_version(conn: psycopg.Connection[Any], stream_id: str) -> int:
    row = conn.execute(_CURRENT_VERSION, (stream_id,)).fetchone()
    return int(row[0]) if row else 0


def _refusal_error(unit: UnitOfWork, refusal: dict[str, Any]) -> Exception:
    if "duplicate" in refusal:
        assert unit.command_id is not None
        return DuplicateCommand(unit.command_id, AppendResult.from_json(refusal["duplicate"]))
    if "owned" in refusal:
        owned = refusal["owned"]
        requested = next(p.stream_type for p in unit.parts if p.stream_id == owned["stream_id"])
        return StreamOwnedByAnotherType(owned["stream_id"], owned["owner"], requested)
    conflict = refusal["conflict"]
    expected = next(p.expected_version for p in unit.parts
                    if p.stream_id == conflict["stream_id"])
    return ConcurrencyError(conflict["stream_id"], expected, int(conflict["current"]))


def _is_unavailable(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, psycopg.OperationalError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
