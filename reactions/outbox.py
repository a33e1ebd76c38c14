"""A process manager's outbox (``process_commands``, migration 0024): the commands its steps
decided, saved in the transaction that saves their states, sent once it has committed.

A step that loses to another runner (``StateConflict``) rolls back with its commands, so
none of them was sent: the step is taken again on the newer state. A runner that dies after
the commit leaves its commands here, and the next batch of any runner of the process sends
those left for longer than a runner takes to send its own (``leftover_commands``), with the
ids they were saved with: the command log answers a repeat with the first result. One key's
commands go in the order they were saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from eventfold.reactions.sending import Outgoing
from eventfold.write_model import Command

DecodeCommand = Callable[[str, dict[str, Any]], Command]
"""A command of the app's by its name and its fields as JSON."""


def save_commands(conn: psycopg.Connection, process: str, outgoing: Sequence[Outgoing]
                  ) -> list[Outgoing]:
    """In the caller's transaction (the one that saves the steps' states): the commands, in
    order; as saved (with their rows' ``seq``), to send once it commits."""
    if not outgoing:
        return []
    rows = [(process, item.group, item.command.command_id, item.command.command_name,
             Jsonb(item.command.model_dump(mode="json")), item.event_id, item.index,
             item.event_type, item.stream_id, item.correlation_id) for item in outgoing]
    seqs: list[int] = []
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO process_commands (process, key, command_id, command, payload, "
            "event_id, command_index, event_type, stream_id, correlation_id) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING seq", rows, returning=True)
        while True:
            row = cursor.fetchone()
            assert row is not None
            seqs.append(int(row[0]))
            if not cursor.nextset():
                break
    return [dataclasses.replace(item, seq=seq)
            for item, seq in zip(outgoing, seqs, strict=True)]


def leftover_commands(conn: psycopg.Connection, process: str, older_than_s: float,
                      limit: int, decode: DecodeCommand) -> list[Outgoing]:
    """Commands saved more than ``older_than_s`` ago and still here (their runner died, or
    the domain was away when it sent them), oldest keys first, each key's in order."""
    rows = conn.execute(
        "SELECT key, seq, command, payload, event_id, command_index, event_type, stream_id, "
        "correlation_id FROM process_commands WHERE process = %s AND created_at < now() - "
        "make_interval(secs => %s) ORDER BY key, seq LIMIT %s",
        (process, older_than_s, limit)).fetchall()
    return [Outgoing(str(key), decode(str(name), dict(payload)), str(event_id), int(index),
                     str(event_type), str(stream_id), correlation_id, int(seq))
            for key, seq, name, payload, event_id, index, event_type, stream_id, correlation_id
            in rows]


def commands_answered(conn: psycopg.Connection, process: str,
                      answered: Sequence[Outgoing]) -> None:
    """``answered`` went out and were answered (executed, repeated or refused): gone."""
    if answered:
        conn.execute("DELETE FROM process_commands WHERE process = %s AND (key, seq) IN "
                     "(SELECT * FROM unnest(%s::text[], %s::bigint[]))",
                     (process, [c.group for c in answered], [c.seq for c in answered]))


def pending_count(conn: psycopg.Connection, process: str) -> int:
    row = conn.execute("SELECT count(*) FROM process_commands WHERE process = %s",
                       (process,)).fetchone()
    return int(row[0]) if row else 0
