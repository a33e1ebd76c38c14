"""Which read API instance has which KTable topic open: the ``ktable_readers`` table
(migration 0008), and the only code that reads or writes it.

An instance registers a topic before its consumer assigns it (refused when a switch made
another version active meanwhile: ``note_reader``), renews the row every
``READER_HEARTBEAT_S`` while it has the topic open and deletes it once closed; a row not
renewed for ``READER_TTL_S`` is a reader gone. A replay deletes a replaced version's KTable
topic only once no live reader has it (``catalog.ProjectionCatalog.delete_retired_topics``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from eventfold.projections.state.lease import VERSIONS_TABLE
from psycopg import sql

KTABLE_READERS_TABLE = "ktable_readers"
READER_TTL_S = 15.0
"""A reader whose heartbeat is older than this is gone (crashed or stopped)."""
READER_HEARTBEAT_S = 3.0
"""How often a read API instance renews its rows: well inside ``READER_TTL_S``."""
SWITCH_LOCK = "eventfold.switch:"
"""Per projection, an advisory lock a switch takes exclusively as it retires the old topic,
and a reader shares while it checks the active version and registers that version's topic."""

_READERS = sql.Identifier(KTABLE_READERS_TABLE)
_TABLE = sql.Identifier(VERSIONS_TABLE)


def note_reader(conn: psycopg.Connection, instance_id: str, topic: str, projection: str,
                version: int) -> int | None:
    """A read API instance is about to open ``topic``, the KTable of ``version``: registered
    if that version is still the active one (or the projection has none yet), and None; else
    nothing is registered, and the version a switch made active meanwhile is returned.

    Both happen under a lock the switch takes as it retires the old topic (``retire_topic``),
    so either the reader's row is there before the switch commits, and the old topic is not
    deleted under it, or the reader sees the switch: no wait is needed for readers that saw
    the old version just before the switch."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock_shared(hashtext(%s))",
                     (SWITCH_LOCK + projection,))
        row = conn.execute(sql.SQL("SELECT active_version FROM {} WHERE projection = %s")
                           .format(_TABLE), (projection,)).fetchone()
        if row is not None and row[0] is not None and int(row[0]) != version:
            return int(row[0])
        renew_reader(conn, instance_id, topic, projection, version)
    return None


def renew_reader(conn: psycopg.Connection, instance_id: str, topic: str, projection: str,
                 version: int) -> None:
    """A read API instance still has ``topic`` open: its heartbeat."""
    conn.execute(sql.SQL("""
        INSERT INTO {} (instance_id, topic, projection, version) VALUES (%s, %s, %s, %s)
        ON CONFLICT (instance_id, topic) DO UPDATE SET seen_at = now()
    """).format(_READERS), (instance_id, topic, projection, version))


def forget_reader(conn: psycopg.Connection, instance_id: str, topic: str | None = None) -> None:
    """The instance closed ``topic`` (None: all of its topics, as it stops)."""
    if topic is None:
        conn.execute(sql.SQL("DELETE FROM {} WHERE instance_id = %s").format(_READERS),
                     (instance_id,))
    else:
        conn.execute(sql.SQL("DELETE FROM {} WHERE instance_id = %s AND topic = %s")
                     .format(_READERS), (instance_id, topic))


@dataclass(frozen=True)
class LiveReader:
    instance_id: str
    projection: str
    version: int
    topic: str
    seen_at: datetime


def live_readers(conn: psycopg.Connection) -> list[LiveReader]:
    """The KTable topics read API instances have open, by heartbeats younger than
    ``READER_TTL_S``."""
    rows = conn.execute(sql.SQL(
        "SELECT instance_id, projection, version, topic, seen_at FROM {} "
        "WHERE seen_at > now() - make_interval(secs => %s) ORDER BY instance_id, topic")
        .format(_READERS), (READER_TTL_S,)).fetchall()
    return [LiveReader(*row) for row in rows]


def forget_gone_readers(conn: psycopg.Connection) -> None:
    """Delete the rows of instances that crashed: they hold no topic, and would stay
    forever."""
    conn.execute(sql.SQL("DELETE FROM {} WHERE seen_at <= now() - make_interval(secs => %s)")
                 .format(_READERS), (READER_TTL_S,))
