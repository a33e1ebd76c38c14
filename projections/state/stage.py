"""What a batch's tasks write before its commit: each task (``Stage``) stages the rows it
changed, the watermarks it met and the letters that park a key into the version's UNLOGGED
stage tables, or, for a fresh version no reader sees, writes its rows straight into the state
table; it reports its counts to the driver (``StagedBatch``), which commits them
(``store.ReadModelStore.commit``)."""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from eventfold.contract import PartitionKey
from eventfold.projections.definition.projection import Projection
from eventfold.projections.outcome import DeadLetter, KeyState
from eventfold.projections.state.parking import (
    stage_letters,
)
from eventfold.projections.state.producer import LetterNote
from eventfold.projections.state.schema import (
    stage_sources_table,
    stage_table,
    state_table,
)
from eventfold.projections.task_errors import TaskError

SYSTEM_COLUMNS = ("_version", "_position", "_deleted")
TASK_PHASES = ("read", "load", "fold", "stage", "produce", "flush", "rest")
"""Where a task's time goes: reading and decoding its records, loading its keys' states,
folding, staging the rows, handing records to the producer, waiting for their delivery."""
TRANSACTION_TIME = "now"
"""A timestamp as COPY writes it that Postgres reads as its transaction's time, ``now()``: a
deleted row written straight into the table is dated by the database's clock, as the merge
dates the rows it deletes."""
NOTED_LETTERS = 20
"""Dead letters a task describes to the driver for its log (a flood of letters is counted,
not carried: ``eventfold dlq list`` shows them all)."""


class KeySplitAcrossPartitions(TaskError):
    """Two tasks folded the same key: its events were not all in one partition."""

    code = "key_split_across_partitions"


class StageLost(RuntimeError):
    """The server restarted between a batch's tasks and its commit: its UNLOGGED stage may be
    empty, so the batch must run again."""


def column_list(names: Iterable[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


@dataclass
class StagedBatch:
    """What the tasks of one batch attempt staged, as they report it to the driver: counts,
    never keys (but for the few a batch held back as parked)."""

    attempt: str
    new_rows: int = 0
    """Staged rows of keys that had no row (inserted by the commit)."""
    direct_rows: int = 0
    """Rows written straight into the table (a fresh version no reader sees)."""
    known_rows: int = 0
    """Staged rows of keys that had one (updated by the commit)."""
    live_rows_delta: int = 0
    """Live rows the batch adds to the version's (new and revived keys, less deleted ones):
    the checkpoint keeps the sum, so that an unfiltered count reads one row."""
    marks: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    held: set[str] = field(default_factory=set)
    """Keys parked before the batch whose events it held back."""
    topics: set[str] = field(default_factory=set)
    """Derived-event topics written."""
    servers: set[datetime] = field(default_factory=set)
    """The start time of the server each task staged on (one, unless it restarted)."""
    notes: list[LetterNote] = field(default_factory=list)
    """Log lines of the batch's dead letters, up to ``NOTED_LETTERS`` per task."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Where the tasks' time went, summed over them, by phase (``TASK_PHASES``)."""
    next_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    first_append_ms: int | None = None
    """When the earliest record the tasks read was appended to Kafka, if they know."""

    def add(self, other: StagedBatch) -> None:
        """``other``'s counts (another job of the same attempt) added to these."""
        for name in ("new_rows", "direct_rows", "known_rows", "live_rows_delta", "marks",
                     "applied", "duplicates", "dead_letters"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.held |= other.held
        self.topics |= other.topics
        self.servers |= other.servers
        self.notes += other.notes
        for phase, seconds in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.first_append_ms = min((ms for ms in (self.first_append_ms, other.first_append_ms)
                                    if ms is not None), default=None)


class Stage:
    """What one task (or a retry) stages for one batch attempt, on its own connection: rows,
    watermarks, parking letters. Each call commits what it wrote, unless the connection is in
    a transaction of the caller's (a retry stages and merges in one)."""

    def __init__(self, conn: psycopg.Connection, projection: Projection, version: int,
                 attempt: str) -> None:
        self.conn = conn
        self.projection = projection
        self.version = version
        self.attempt = attempt
        self._columns = list(projection.stored_columns)
        self._json = projection.json_columns
        self._stage = sql.Identifier(stage_table(projection, version))
        self._stage_sources = sql.Identifier(stage_sources_table(projection, version))
        self._table = sql.Identifier(state_table(projection, version))

    def rows(self, changed: Iterable[tuple[str, KeyState]],
             known: Mapping[str, bool]) -> tuple[int, int, int]:
        """Stage ``changed``; (new, known) counts and the live rows they add (less those
        they delete). ``known``: the keys that had a row, and whether it was live."""
        new = old = live = 0
        stored = self._columns
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self._stage, column_list(["_attempt", "_known", "key", *stored, *SYSTEM_COLUMNS]))
        attempt, as_stored = self.attempt, self._as_stored
        with self.conn.transaction(), self.conn.cursor().copy(copy_sql) as copy:
            for key, key_state in changed:
                was_live = known.get(key)
                state = key_state.state or {}
                copy.write_row((attempt, was_live is not None, key,
                                *as_stored([state.get(c) for c in stored]),
                                key_state.version, key_state.position, key_state.state is None))
                live += (key_state.state is not None) - bool(was_live)
                if was_live is None:
                    new += 1
                else:
                    old += 1
        return new, old, live

    def direct(self, changed: Iterable[tuple[str, KeyState]]) -> tuple[int, int]:
        """Write ``changed`` straight into the state table (``BatchContext.direct``); how
        many, and how many of them live. A key another task wrote too fails the write: its
        events were in two partitions."""
        count = live = 0
        stored = self._columns
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self._table, column_list(["key", *stored, *SYSTEM_COLUMNS, "_deleted_at"]))
        as_stored = self._as_stored
        try:
            with self.conn.transaction(), self.conn.cursor().copy(copy_sql) as copy:
                for key, key_state in changed:
                    state = key_state.state or {}
                    deleted = key_state.state is None
                    copy.write_row((key, *as_stored([state.get(c) for c in stored]),
                                    key_state.version, key_state.position, deleted,
                                    TRANSACTION_TIME if deleted else None))
                    count += 1
                    live += not deleted
        except psycopg.errors.UniqueViolation as exc:
            raise KeySplitAcrossPartitions(str(exc).splitlines()[0]) from None
        return count, live

    def _as_stored(self, values: list[Any]) -> list[Any]:
        """Values as COPY writes them: JSON columns' values as JSON."""
        if not self._json:
            return values
        return [Jsonb(value) if column in self._json and value is not None else value
                for column, value in zip(self._columns, values, strict=True)]

    def watermarks(self, marks: Mapping[str, int]) -> int:
        """Stage the last version met of each source stream; how many."""
        if not marks:
            return 0
        copy_sql = sql.SQL("COPY {} (_attempt, stream_id, version) FROM STDIN").format(
            self._stage_sources)
        with self.conn.transaction(), self.conn.cursor().copy(copy_sql) as copy:
            for stream_id, version in marks.items():
                copy.write_row((self.attempt, stream_id, version))
        return len(marks)

    def letters(self, letters: Sequence[DeadLetter], held: Container[str]) -> int:
        """Stage the letters that park a key; ``held``: the keys parked before the batch."""
        with self.conn.transaction():
            return stage_letters(self.conn, self.projection.name, self.version, self.attempt,
                                 letters, held)
