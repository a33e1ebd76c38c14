"""Who is alive: the one membership mechanism of every process that must know which others
run (the ``members`` table and its ``live_members`` view, migration 0020).

A member is a row of a ``kind``: a projection host (``PROJECTION_HOST``), a read API
instance holding a KTable topic open (``KTABLE_READER``, one row per topic), a read API
instance dividing KTable partitions with the others (``KTABLE_MEMBER``). It joins with how
long it lives unrenewed (``ttl_s``, as a Kafka consumer states its session timeout), renews
its row while it runs (``renew``; ``join`` again to change what it reports) and leaves as it
stops. The rule is one and lives in the database: a member is alive while its last renewal
is younger than its ``ttl_s`` (the view). A row expired ``GONE_AFTER`` times over belongs
to a process that died and is deleted by the next member of its kind to join.

Callers pass a psycopg connection (autocommit or within their own transaction: ``join``
inside a transaction commits with it); this module imports nothing of psycopg, so that the
contract stays importable where psycopg is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import psycopg

PROJECTION_HOST = "projection_host"
KTABLE_READER = "ktable_reader"
KTABLE_MEMBER = "ktable_member"

GONE_AFTER = 6
"""A row not renewed for this many times its ``ttl_s`` is deleted by the next joiner."""

LIVE = "live_members"
"""The view of the members alive now: the only place their expiry is decided."""


@dataclass(frozen=True)
class LiveMember:
    member_id: str
    detail: dict[str, Any]
    started_at: datetime
    seen_at: datetime
    ttl_s: float


def join(conn: psycopg.Connection, kind: str, member_id: str, ttl_s: float,
         detail: Mapping[str, Any] | None = None) -> None:
    """``member_id`` is alive, for ``ttl_s`` from now, reporting ``detail`` (replacing what
    it reported before; a member joining again keeps its ``started_at``)."""
    conn.execute("DELETE FROM members WHERE kind = %s AND seen_at < now() - "
                 "make_interval(secs => ttl_s * %s)", (kind, GONE_AFTER))
    conn.execute(
        "INSERT INTO members (kind, member_id, ttl_s, detail) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT (kind, member_id) DO UPDATE SET seen_at = now(), ttl_s = excluded.ttl_s, "
        "detail = excluded.detail",
        (kind, member_id, ttl_s, orjson.dumps(dict(detail or {})).decode()))


def renew(conn: psycopg.Connection, kind: str, member_id: str) -> bool:
    """The member is still alive; False if it has no row (it left, or was deleted as gone:
    join again)."""
    cursor = conn.execute("UPDATE members SET seen_at = now() WHERE kind = %s AND "
                          "member_id = %s", (kind, member_id))
    return cursor.rowcount > 0


def leave(conn: psycopg.Connection, kind: str, member_id: str) -> None:
    conn.execute("DELETE FROM members WHERE kind = %s AND member_id = %s", (kind, member_id))


def leave_where(conn: psycopg.Connection, kind: str, field: str, value: str) -> None:
    """Every member of ``kind`` whose detail has ``field`` = ``value`` leaves (the rows one
    process holds under several ids)."""
    conn.execute("DELETE FROM members WHERE kind = %s AND detail ->> %s = %s",
                 (kind, field, value))


def live(conn: psycopg.Connection, kind: str) -> list[LiveMember]:
    """The live members of ``kind``, by id."""
    rows = conn.execute(f"SELECT member_id, detail, started_at, seen_at, ttl_s FROM {LIVE} "
                        "WHERE kind = %s ORDER BY member_id", (kind,)).fetchall()
    return [LiveMember(*row) for row in rows]


def forget_gone(conn: psycopg.Connection, kind: str) -> None:
    """Delete the rows of ``kind`` no longer alive: their processes are gone."""
    conn.execute(f"DELETE FROM members m WHERE kind = %s AND NOT EXISTS (SELECT 1 FROM {LIVE} "
                 "l WHERE l.kind = m.kind AND l.member_id = m.member_id)", (kind,))
