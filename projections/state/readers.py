"""Which read API instance has which KTable topic open: members of kind ``KTABLE_READER``
(``contract.members``), one per instance and topic, and the only code that writes them.

An instance registers a topic before its consumer assigns it (refused when a switch made
another version active meanwhile: ``note_reader``), renews the row every
``READER_HEARTBEAT_S`` while it has the topic open and deletes it once closed; a row not
renewed for ``READER_TTL_S`` (its ``ttl_s``) is a reader gone. A replay deletes a replaced
version's KTable topic only once no live reader has it
(``catalog.ProjectionCatalog.delete_retired_topics``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from eventfold.contract.members import KTABLE_READER, LIVE, forget_gone, join, leave, leave_where
from eventfold.projections.state.lease import VERSIONS_TABLE

READER_TTL_S = 15.0
"""A reader whose heartbeat is older than this is gone (crashed or stopped)."""
READER_HEARTBEAT_S = 3.0
"""How often a read API instance renews its rows: well inside ``READER_TTL_S``."""
SWITCH_LOCK = "eventfold.switch:"
"""Per projection, an advisory lock a switch takes exclusively as it retires the old topic,
and a reader shares while it checks the active version and registers that version's topic."""

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
    join(conn, KTABLE_READER, _member_id(instance_id, topic), READER_TTL_S,
         {"instance_id": instance_id, "topic": topic, "projection": projection,
          "version": version})


def forget_reader(conn: psycopg.Connection, instance_id: str, topic: str | None = None) -> None:
    """The instance closed ``topic`` (None: all of its topics, as it stops)."""
    if topic is None:
        leave_where(conn, KTABLE_READER, "instance_id", instance_id)
    else:
        leave(conn, KTABLE_READER, _member_id(instance_id, topic))


def _member_id(instance_id: str, topic: str) -> str:
    return f"{instance_id} {topic}"


@dataclass(frozen=True)
class LiveReader:
    instance_id: str
    projection: str
    version: int
    topic: str
    seen_at: datetime


def live_readers(conn: psycopg.Connection) -> list[LiveReader]:
    """The KTable topics live read API instances have open."""
    rows = conn.execute(
        f"SELECT detail ->> 'instance_id', detail ->> 'projection', "
        f"(detail ->> 'version')::int, detail ->> 'topic', seen_at FROM {LIVE} "
        f"WHERE kind = %s ORDER BY 1, 4", (KTABLE_READER,)).fetchall()
    return [LiveReader(*row) for row in rows]


LIVE_READER_OF_TOPIC = (f"SELECT 1 FROM {LIVE} WHERE kind = '{KTABLE_READER}' AND "
                        "detail ->> 'topic' = {topic}")
"""A condition for SQL that asks for a topic's live readers (``{topic}``: the column or
placeholder naming it)."""


def forget_gone_readers(conn: psycopg.Connection) -> None:
    """Delete the rows of instances that crashed: they hold no topic, and would stay
    forever."""
    forget_gone(conn, KTABLE_READER)
