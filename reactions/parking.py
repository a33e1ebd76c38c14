"""Parked keys of a reaction: one whose event the function raised on (or whose side effect
was given up on) holds its later events back, in order, as a projection's parked key does,
until an operator has fixed the cause and asks for them (``eventfold dlq retry``).

A key is what keeps a reaction's order: an event's stream for a reaction and an effect, the
correlation key for a process manager. The runner learns the parked keys at the start of each
batch, holds the events of those keys instead of acting on them, parks a key whose event
raised (holding that event too, so a retry acts on it again), and saves all of it in the
transaction that saves its positions. A retry asked for is taken up by the runner at its next
batch: the held events come first, in order, then the batch's own; a key whose held events
all went through is released, and one that raises again stays parked from that event on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg
from psycopg.types.json import Jsonb

from eventfold.projections.definition.projection import Event

HeldEvent = tuple[str, Event, str | None]
"""A key, an event of it held back, and the event's correlation id."""


@dataclass(frozen=True)
class ParkedKey:
    key: str
    event_id: str
    reason: str
    parked_at: str
    held: int
    retry_requested: bool


@dataclass
class Parking:
    """A batch's view of its reaction's parked keys, and what the batch changes of them."""

    parked: set[str] = field(default_factory=set)
    """Keys whose events are held (those parked before the batch, and by it)."""
    retried: dict[str, int] = field(default_factory=dict)
    """Keys a retry released for this batch: the last held seq it took up."""
    newly: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Keys this batch parked: the event that raised, and why."""
    held: list[HeldEvent] = field(default_factory=list)

    def holds(self, key: str, event: Event, correlation_id: str | None) -> bool:
        """Whether ``event`` waits behind its key (held, then: True)."""
        if key not in self.parked:
            return False
        self.held.append((key, event, correlation_id))
        return True

    def park(self, key: str, event: Event, correlation_id: str | None, reason: str) -> None:
        """``event`` raised: its key is parked, the event held first of its later ones."""
        self.parked.add(key)
        self.newly.setdefault(key, (event.event_id, reason))
        self.held.append((key, event, correlation_id))


def open_parking(conn: psycopg.Connection, reaction: str) -> tuple[Parking, list[HeldEvent]]:
    """The reaction's parked keys, with the held events of those a retry was asked for (in
    order): those keys are released for this batch, their events to be acted on first."""
    parking = Parking()
    rows = conn.execute("SELECT key, retry_requested FROM reaction_parked WHERE reaction = %s",
                        (reaction,)).fetchall()
    retrying = [str(key) for key, retry in rows if retry]
    parking.parked = {str(key) for key, retry in rows if not retry}
    if not retrying:
        return parking, []
    held = conn.execute(
        "SELECT key, seq, event_type, data, stream_id, stream_version, event_id, "
        "global_position, recorded_at, correlation_id FROM reaction_held WHERE reaction = %s "
        "AND key = ANY(%s) ORDER BY key, seq", (reaction, retrying)).fetchall()
    parking.retried = {key: 0 for key in retrying}
    events: list[HeldEvent] = []
    for key, seq, *event, correlation_id in held:
        parking.retried[key] = max(parking.retried[key], int(seq))
        events.append((str(key), Event(*event), correlation_id))
    return parking, events


def save_parking(conn: psycopg.Connection, reaction: str, parking: Parking) -> None:
    """What the batch changed, in the caller's transaction: the retried keys' held events it
    took up gone, the keys it parked parked, the events it held kept, and a retried key
    released unless it holds events still (parked again, or held by another runner
    meanwhile: then it is retried again at the next batch)."""
    for key, last_seq in parking.retried.items():
        conn.execute("DELETE FROM reaction_held WHERE reaction = %s AND key = %s AND seq <= %s",
                     (reaction, key, last_seq))
    for key, (event_id, reason) in parking.newly.items():
        conn.execute(
            "INSERT INTO reaction_parked (reaction, key, event_id, reason) VALUES "
            "(%s, %s, %s, %s) ON CONFLICT (reaction, key) DO UPDATE SET event_id = "
            "EXCLUDED.event_id, reason = EXCLUDED.reason, parked_at = now(), "
            "retry_requested = false", (reaction, key, event_id, reason))
    if parking.held:
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO reaction_held (reaction, key, event_type, data, stream_id, "
                "stream_version, event_id, global_position, recorded_at, correlation_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(reaction, key, e.type, Jsonb(dict(e.data)), e.stream_id, e.stream_version,
                  e.event_id, e.global_position, e.recorded_at, correlation_id)
                 for key, e, correlation_id in parking.held])
    released = [key for key in parking.retried if key not in parking.newly]
    if released:
        conn.execute(
            "DELETE FROM reaction_parked p WHERE reaction = %s AND key = ANY(%s) AND NOT "
            "EXISTS (SELECT 1 FROM reaction_held h WHERE h.reaction = p.reaction AND "
            "h.key = p.key)", (reaction, released))


def request_retry(conn: psycopg.Connection, reaction: str, key: str) -> int | None:
    """Ask the reaction's runner to act on ``key``'s held events at its next batch: how many
    it holds (None: the key is not parked)."""
    with conn.transaction():
        row = conn.execute("UPDATE reaction_parked SET retry_requested = true WHERE "
                           "reaction = %s AND key = %s RETURNING key", (reaction, key)).fetchone()
        if row is None:
            return None
        count = conn.execute("SELECT count(*) FROM reaction_held WHERE reaction = %s AND "
                             "key = %s", (reaction, key)).fetchone()
    return int(count[0]) if count else 0


def parked_keys(conn: psycopg.Connection, reaction: str) -> list[ParkedKey]:
    rows = conn.execute(
        "SELECT p.key, p.event_id, p.reason, p.parked_at, p.retry_requested, "
        "(SELECT count(*) FROM reaction_held h WHERE h.reaction = p.reaction AND "
        "h.key = p.key) FROM reaction_parked p WHERE p.reaction = %s ORDER BY p.parked_at",
        (reaction,)).fetchall()
    return [ParkedKey(str(key), str(event_id), str(reason), str(at), int(held), bool(retry))
            for key, event_id, reason, at, retry, held in rows]


def parked_count(conn: psycopg.Connection, reactions: Iterable[str]) -> dict[str, int]:
    rows = conn.execute("SELECT reaction, count(*) FROM reaction_parked WHERE reaction = "
                        "ANY(%s) GROUP BY reaction", (list(reactions),)).fetchall()
    return {str(reaction): int(n) for reaction, n in rows}
