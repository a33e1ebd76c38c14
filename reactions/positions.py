"""Where a reaction is (the next offset of each partition it reads) and what it could not
do, in Postgres: a batch's refusals and its new positions commit in one transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import psycopg

from eventfold.contract import PartitionKey
from eventfold.projections.state.source_ids import reaction_reader, record_ids

RefusalKind = Literal["refused", "raised", "undecodable", "failed"]


@dataclass(frozen=True)
class Refusal:
    """One thing a batch could not do: a command the domain refused, an event the reaction's
    function raised on (``command_index`` -1), or a message that is no event."""

    event_id: str
    command_index: int
    kind: RefusalKind
    event_type: str
    stream_id: str
    reason: str
    command: str | None = None
    command_id: uuid.UUID | None = None


def load_positions(conn: psycopg.Connection, reaction: str) -> dict[PartitionKey, int]:
    rows = conn.execute("SELECT topic, partition, next_offset FROM reaction_positions "
                        "WHERE reaction = %s", (reaction,)).fetchall()
    return {(str(topic), int(partition)): int(offset) for topic, partition, offset in rows}


class PositionsMoved(RuntimeError):
    """Another runner of the reaction saved a partition's position after this batch read from
    it (it took the partition over while this runner was frozen or cut off): the batch is
    read again, and what it would have saved, states included, is not."""


def save_batch(conn: psycopg.Connection, reaction: str, positions: Mapping[PartitionKey, int],
               refusals: Sequence[Refusal], read_from: Mapping[PartitionKey, int]) -> None:
    """The batch's refusals and its new positions, in one transaction, if each of
    its partitions is still where the batch read from (``read_from``; 0 for a partition with
    no position yet). Raises ``PositionsMoved`` otherwise: a batch commits once, by the
    runner that read it from the saved positions. A position never moves back here: only
    ``move_to`` moves it back, on purpose."""
    with conn.transaction():
        _claim(conn, reaction, positions, read_from)
        if refusals:
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO reaction_refusals (reaction, event_id, command_index, kind, "
                    "command, command_id, event_type, stream_id, reason) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (reaction, event_id, "
                    "command_index) DO UPDATE SET reason = EXCLUDED.reason, "
                    "recorded_at = now()",
                    [(reaction, r.event_id, r.command_index, r.kind, r.command, r.command_id,
                      r.event_type, r.stream_id, r.reason) for r in refusals])
        _upsert(conn, reaction, positions,
                "GREATEST(reaction_positions.next_offset, EXCLUDED.next_offset)")


def _claim(conn: psycopg.Connection, reaction: str, positions: Mapping[PartitionKey, int],
           read_from: Mapping[PartitionKey, int]) -> None:
    """Lock the rows of the batch's partitions (made at 0 where there were none, so that two
    runners' first batches of a new partition meet on one row too); raise ``PositionsMoved``
    if one is no longer where the batch read from."""
    if not positions:
        return
    keys = sorted(positions)
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO reaction_positions (reaction, topic, partition, next_offset) "
            "VALUES (%s, %s, %s, 0) ON CONFLICT (reaction, topic, partition) DO NOTHING",
            [(reaction, topic, partition) for topic, partition in keys])
    rows = conn.execute(
        "SELECT topic, partition, next_offset FROM reaction_positions WHERE reaction = %s "
        "AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[])) "
        "ORDER BY topic, partition FOR UPDATE",
        (reaction, [topic for topic, _ in keys], [partition for _, partition in keys]))
    moved = []
    for topic, partition, offset in rows:
        expected = read_from.get((str(topic), int(partition)), 0)
        if int(offset) != expected:
            moved.append(f"{topic}[{partition}] is at offset {offset}, not {expected}")
    if moved:
        raise PositionsMoved(f"another runner saved positions since this batch read from "
                             f"them ({'; '.join(moved)})")


def move_to(conn: psycopg.Connection, reaction: str, positions: Mapping[PartitionKey, int],
            topic_ids: Mapping[str, str]) -> None:
    """Set the reaction's positions, back or forth (``reaction reset``, a first run), and the
    ids of the topics whose offsets they count (``source_ids``)."""
    with conn.transaction():
        _upsert(conn, reaction, positions, "EXCLUDED.next_offset")
        record_ids(conn, reaction_reader(reaction), topic_ids)


def _upsert(conn: psycopg.Connection, reaction: str, positions: Mapping[PartitionKey, int],
            new_offset: str) -> None:
    if not positions:
        return
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO reaction_positions (reaction, topic, partition, next_offset) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (reaction, topic, partition) DO UPDATE SET "
            f"next_offset = {new_offset}, saved_at = now()",
            [(reaction, topic, partition, offset)
             for (topic, partition), offset in sorted(positions.items())])


def save_stepped_through(conn: psycopg.Connection, reaction: str,
                         recorded: Mapping[PartitionKey, datetime]) -> None:
    """A process's stream time, inside its batch's transaction: each partition stepped
    through the recorded time of its last event in the batch (never moving back)."""
    _step_through(conn, reaction, [(at, topic, partition, 0)
                                   for (topic, partition), at in sorted(recorded.items())])


def save_at_end(conn: psycopg.Connection, reaction: str, ends: Mapping[PartitionKey, int],
                observed_at: datetime) -> None:
    """Partitions whose saved position is at or past ``ends``, their ends as a look that
    began at ``observed_at`` found them, were stepped through ``observed_at``: every event
    appended before it is behind the saved position. Which runner looks does not matter:
    a position saved by any runner is stepped."""
    _step_through(conn, reaction, [(observed_at, topic, partition, end)
                                   for (topic, partition), end in sorted(ends.items())])


def _step_through(conn: psycopg.Connection, reaction: str,
                  rows: Sequence[tuple[datetime, str, int, int]]) -> None:
    if not rows:
        return
    with conn.cursor() as cursor:
        cursor.executemany(
            "UPDATE reaction_positions SET stepped_through = GREATEST(COALESCE("
            "stepped_through, '-infinity'), %s) WHERE reaction = %s AND topic = %s AND "
            "partition = %s AND next_offset >= %s",
            [(at, reaction, topic, partition, end) for at, topic, partition, end in rows])


@dataclass(frozen=True)
class RefusalRow:
    event_id: str
    kind: str
    command: str | None
    event_type: str
    stream_id: str
    reason: str
    recorded_at: str


def refusals_of(conn: psycopg.Connection, reaction: str, limit: int = 100) -> list[RefusalRow]:
    """The latest of what the reaction could not do, newest first."""
    rows = conn.execute(
        "SELECT event_id, kind, command, event_type, stream_id, reason, recorded_at::text "
        "FROM reaction_refusals WHERE reaction = %s ORDER BY recorded_at DESC LIMIT %s",
        (reaction, limit)).fetchall()
    return [RefusalRow(*row) for row in rows]


def refusal_count(conn: psycopg.Connection, reaction: str) -> int:
    row = conn.execute("SELECT count(*) FROM reaction_refusals WHERE reaction = %s",
                       (reaction,)).fetchone()
    return int(row[0]) if row else 0
