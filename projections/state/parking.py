"""Parked keys and dead-letter resolutions (migration 0009), and the only code that reads or
writes their tables.

A fold projection parks a key when its fold raises: the event is dead-lettered and so is every
later event of the key, held until ``dead_letters.retry_key`` folds them in order (or the
failing one is discarded). A batch's tasks ask, per key, whether the keys they fold are parked,
and stage the letters that park a key (``staged_letters``); the batch's commit holds them in
its transaction, so ``parked_events`` lists exactly the letters of committed batches. A batch
that held back the events of a key unparked meanwhile does not commit (``ParkedKeysReleased``)
and folds again.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from eventfold.projections.outcome import DeadLetter, ParkedKey, SourceRecord

PARKED_TABLE = "parked_events"
RESOLUTIONS_TABLE = "dead_letter_resolutions"

_PARKED = sql.Identifier(PARKED_TABLE)
_RESOLUTIONS = sql.Identifier(RESOLUTIONS_TABLE)
_OF_VERSION = sql.SQL("projection = %s AND version = %s")
_SOURCE = ("source_topic", "source_partition", "source_offset")


class ParkedKeysReleased(RuntimeError):
    """Keys this batch held back as parked were unparked (retried) while it ran."""

    def __init__(self, keys: set[str]) -> None:
        self.keys = keys
        super().__init__(f"{len(keys)} parked key(s) were retried while the batch ran")


@dataclass(frozen=True)
class HeldEvent:
    """A dead-lettered event its key waits on, by where it is in its source topic."""

    topic: str
    partition: int
    offset: int
    event_id: str
    position: int
    reason: str
    letters_after: datetime | None = None
    """No later than its letter was written (None: unknown, parked before this was kept)."""
    parked_at: datetime | None = None
    """When the batch that wrote its letter committed, or (a letter the commit decided)
    when it was produced: no letter of it comes later."""

    @property
    def source(self) -> tuple[str, int, int]:
        return self.topic, self.partition, self.offset


def parked_keys(conn: psycopg.Connection, name: str, version: int) -> dict[str, ParkedKey]:
    """The keys of ``name`` v``version`` parked now, each with the first event it waits on."""
    query = sql.SQL("""
        SELECT DISTINCT ON (key) key, source_topic, source_partition, source_offset, event_id,
               reason
        FROM {} WHERE {} ORDER BY key, global_position""").format(_PARKED, _OF_VERSION)
    with conn.transaction():
        return {key: ParkedKey(*head) for key, *head in conn.execute(query, (name, version))}


def parked_heads(conn: psycopg.Connection, name: str, version: int, keys: Iterable[str]
                 ) -> dict[str, ParkedKey]:
    """Of ``keys``, those parked now, each with the first event it waits on (one indexed
    probe per key: a task asks for the keys of the records it folds)."""
    query = sql.SQL("""
        SELECT DISTINCT ON (key) key, source_topic, source_partition, source_offset, event_id,
               reason
        FROM {} WHERE {} AND key = ANY(%s) ORDER BY key, global_position""").format(
        _PARKED, _OF_VERSION)
    return {key: ParkedKey(*head) for key, *head in conn.execute(query, (name, version,
                                                                         list(keys)))}


def any_parked(conn: psycopg.Connection, name: str, version: int) -> bool:
    """Whether the version has a parked key at all (else tasks need not ask per key)."""
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {})").format(
        _PARKED, _OF_VERSION), (name, version)).fetchone()
    return bool(row and row[0])


def still_parked(conn: psycopg.Connection, name: str, version: int, keys: Iterable[str]
                 ) -> set[str]:
    rows = conn.execute(sql.SQL("SELECT DISTINCT key FROM {} WHERE {} AND key = ANY(%s)")
                        .format(_PARKED, _OF_VERSION), (name, version, list(keys)))
    return {key for (key,) in rows}


def park(conn: psycopg.Connection, name: str, version: int,
         letters: Iterable[tuple[DeadLetter, bool]], letters_after: datetime | None = None
         ) -> None:
    """In the batch's transaction: hold the letters that park their keys (a batch run again
    after a crash holds the same ones once); ``letters_after``: no later than any of them was
    written. A letter given with True is still to be produced (``pending_letters``): the
    batch held it behind a key parked before it, which only its commit could tell."""
    rows = [(name, version, letter.fold_key, letter.record.topic, letter.record.partition,
             letter.record.offset, letter.event_id, letter.position, letter.reason,
             letters_after, Jsonb(_as_json(letter)) if pending else None)
            for letter, pending in letters if letter.parks]
    if not rows:
        return
    with conn.cursor() as cursor:
        cursor.executemany(sql.SQL(
            "INSERT INTO {} (projection, version, key, source_topic, source_partition, "
            "source_offset, event_id, global_position, reason, letters_after, "
            "letter_pending) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING").format(_PARKED), rows)


def pending_letters(conn: psycopg.Connection, name: str, version: int) -> list[DeadLetter]:
    """The letters committed batches held behind parked keys and did not produce yet: those
    of the last batch, or of one whose process died before it produced them."""
    rows = conn.execute(sql.SQL("SELECT letter_pending FROM {} WHERE {} AND letter_pending "
                                "IS NOT NULL ORDER BY global_position").format(
        _PARKED, _OF_VERSION), (name, version)).fetchall()
    return [_from_json(letter) for (letter,) in rows]


def letters_produced(conn: psycopg.Connection, name: str, version: int,
                     letters: Sequence[DeadLetter]) -> None:
    """``letters`` are in the dead-letter topic now: no longer pending, and their events'
    letters were all written by now (what a retry reads the topic up to)."""
    sources = [(letter.record.topic, letter.record.partition, letter.record.offset)
               for letter in letters]
    conn.execute(sql.SQL(
        "UPDATE {} SET letter_pending = NULL, parked_at = now() WHERE {} AND "
        "(source_topic, source_partition, source_offset) IN "
        "(SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))").format(
        _PARKED, _OF_VERSION), (name, version, *map(list, zip(*sources, strict=True))))


STAGED_TABLE = "staged_letters"
_STAGED = sql.Identifier(STAGED_TABLE)


def stage_letters(conn: psycopg.Connection, name: str, version: int, attempt: str,
                  letters: Iterable[DeadLetter], held: Container[str]) -> int:
    """A task's parking letters of a batch attempt, for its commit (``take_staged``);
    ``held``: the keys that were parked before the batch. How many were staged."""
    staged_at = time.time()  # before the task produces them: the retry reads from here
    rows = [(name, version, attempt, letter.fold_key in held,
             Jsonb({**_as_json(letter), "staged_at": staged_at}))
            for letter in letters if letter.parks]
    if rows:
        with conn.cursor().copy(sql.SQL(
                "COPY {} (projection, version, attempt, held, letter) FROM STDIN")
                .format(_STAGED)) as copy:
            for row in rows:
                copy.write_row(row)
    return len(rows)


def take_staged(conn: psycopg.Connection, name: str, version: int, attempt: str) -> int:
    """In the batch's commit, once it has checked that the keys the batch held back are
    still parked: hold the staged letters' events (``parked_events``; a batch run again
    after a crash holds the same ones once), those of keys parked before the batch with
    their letters pending (produced after the commit). How many are pending."""
    staged = conn.execute(sql.SQL(
        "SELECT letter, held FROM {} WHERE projection = %s AND version = %s AND attempt = %s")
        .format(_STAGED), (name, version, attempt)).fetchall()
    letters = [(_from_json(letter), bool(held)) for letter, held in staged]
    times = [letter.get("staged_at") for letter, _ in staged]
    written_after = (datetime.fromtimestamp(min(times), UTC)
                     if times and None not in times else None)
    park(conn, name, version, letters, written_after)
    return sum(held for _, held in letters)


def clear_staged(conn: psycopg.Connection, name: str, version: int) -> None:
    """Every staged letter of the version (the attempts before this one's included)."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE projection = %s AND version = %s")
                 .format(_STAGED), (name, version))


def _as_json(letter: DeadLetter) -> dict[str, Any]:
    return {"record": list(letter.record), "reason": letter.reason, "fold_key": letter.fold_key,
            "event_id": letter.event_id, "position": letter.position}


def _from_json(data: dict[str, Any]) -> DeadLetter:
    return DeadLetter(SourceRecord(*data["record"]), data["reason"], data["fold_key"],
                      data["event_id"], data["position"], parks=True)


def held_events(conn: psycopg.Connection, name: str, version: int, key: str
                ) -> list[HeldEvent]:
    """In the caller's transaction: ``key``'s held events in position order, their rows
    locked."""
    rows = conn.execute(sql.SQL(
        "SELECT source_topic, source_partition, source_offset, event_id, global_position, "
        "reason, letters_after, parked_at FROM {} WHERE {} AND key = %s "
        "ORDER BY global_position FOR UPDATE")
        .format(_PARKED, _OF_VERSION), (name, version, key))
    return [HeldEvent(*row) for row in rows]


def release(conn: psycopg.Connection, name: str, version: int,
            sources: Iterable[tuple[str, int, int]]) -> str | None:
    """In the caller's transaction: stop holding the events at ``sources``; the key they
    were held for (None: none was held there)."""
    keys = {key for (key,) in conn.execute(sql.SQL(
        "DELETE FROM {} WHERE {} AND (source_topic, source_partition, source_offset) IN "
        "(SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[])) RETURNING key")
        .format(_PARKED, _OF_VERSION), (name, version, *map(list, zip(*sources, strict=True))))}
    return next(iter(keys), None)


def drop_parked(conn: psycopg.Connection, name: str, version: int) -> None:
    """A dropped version's parked keys go with it."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(_PARKED, _OF_VERSION),
                 (name, version))


def parked_counts(conn: psycopg.Connection, versions: Mapping[str, int]
                  ) -> dict[str, tuple[int, int]]:
    """(parked keys, events held) of each projection's given version."""
    if not versions:
        return {}
    rows = conn.execute(sql.SQL(
        "SELECT projection, count(DISTINCT key), count(*) FROM {} "
        "WHERE (projection, version) IN (SELECT * FROM unnest(%s::text[], %s::int[])) "
        "GROUP BY projection").format(_PARKED), (list(versions), list(versions.values())))
    return {name: (int(keys), int(events)) for name, keys, events in rows}


@dataclass(frozen=True)
class Resolution:
    action: str  # retried | discarded
    resolved_by: str
    reason: str
    resolved_at: datetime


def resolve(conn: psycopg.Connection, name: str, dead_letter_offsets: Iterable[int],
            action: str, by: str, reason: str = "") -> None:
    """Record what was done with dead letters (the first resolution of a letter stands)."""
    with conn.cursor() as cursor:
        cursor.executemany(sql.SQL(
            "INSERT INTO {} (projection, dead_letter_offset, action, resolved_by, reason) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING").format(_RESOLUTIONS),
            [(name, offset, action, by, reason) for offset in dead_letter_offsets])


def forget_resolutions_before(conn: psycopg.Connection, name: str, first_offset: int) -> int:
    """What was done with the letters the dead-letter topic no longer holds (its retention
    dropped them, offsets below ``first_offset``), deleted by the key's range; how many."""
    return conn.execute(sql.SQL("DELETE FROM {} WHERE projection = %s AND "
                                "dead_letter_offset < %s").format(_RESOLUTIONS),
                        (name, first_offset)).rowcount


def resolutions(conn: psycopg.Connection, name: str,
                offsets: Sequence[int]) -> dict[int, Resolution]:
    """What was done with those of ``name``'s dead letters, by dead-letter offset (looked
    up by key, however many were resolved before)."""
    query = sql.SQL("SELECT dead_letter_offset, action, resolved_by, reason, resolved_at "
                    "FROM {} WHERE projection = %s AND dead_letter_offset = ANY(%s)"
                    ).format(_RESOLUTIONS)
    with conn.transaction():
        return {offset: Resolution(*rest)
                for offset, *rest in conn.execute(query, (name, list(offsets)))}
