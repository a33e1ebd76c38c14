"""Which streaming host runs which projections, and the replays handed to them: hosts are
members of kind ``PROJECTION_HOST`` (``contract.members``), requests rows of the
``projection_requests`` table (migration 0012).

A request is a row the host polls: the requester and the host share nothing but the database,
which both have already (a host's HTTP port may not be reachable from where an operator runs
the CLI, and it would need its own authentication). The host claims it, reports progress in
it and finishes it; the requester reads it and may set its cancel flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg

from eventfold.contract import libpq_url
from eventfold.contract.members import LIVE, PROJECTION_HOST, join, leave, renew

ALIVE_S = 10.0
"""A host not renewed for this long is taken for dead (its ``ttl_s`` as a member)."""

RequestState = Literal["pending", "running", "done", "failed", "cancelled"]
ENDED: frozenset[str] = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True)
class Request:
    id: int
    host_id: str
    projection: str
    action: str
    source: str
    state: RequestState
    cancel: bool
    done: int
    total: int
    result: dict[str, Any] | None
    error: str | None
    host_alive: bool


_HOSTS = (f"(SELECT member_id AS host_id, detail, started_at, seen_at FROM {LIVE} "
          f"WHERE kind = '{PROJECTION_HOST}')")
"""The live hosts, as a relation to join."""
_REQUEST = ("SELECT r.id, r.host_id, r.projection, r.action, r.source, r.state, r.cancel, "
            "r.done, r.total, r.result, r.error, h.host_id IS NOT NULL FROM "
            f"projection_requests r LEFT JOIN {_HOSTS} h USING (host_id) WHERE r.id = %s")


@dataclass(frozen=True)
class LiveHost:
    host_id: str
    projections: list[str]
    started_at: datetime
    heartbeat_at: datetime
    replays: list[str]
    """The replays it runs now: ``name done/total``."""


def live_hosts(conn: psycopg.Connection) -> list[LiveHost]:
    """The live hosts, with the replays they run."""
    rows = conn.execute(
        "SELECT h.host_id, array(SELECT jsonb_array_elements_text(h.detail -> 'projections')), "
        "h.started_at, h.seen_at, coalesce(array_agg(r.projection || ' ' || r.done || '/' || "
        "r.total ORDER BY r.id) FILTER (WHERE r.id IS NOT NULL), '{}') FROM " + _HOSTS +
        " h LEFT JOIN projection_requests r ON r.host_id = h.host_id AND r.state = 'running' "
        "GROUP BY h.host_id, h.detail, h.started_at, h.seen_at ORDER BY h.host_id").fetchall()
    return [LiveHost(*row) for row in rows]


class HostDirectory:
    """The two tables, through one autocommit connection (opened on first use)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._connection: psycopg.Connection | None = None
        self._projections: list[str] = []

    def _conn(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(libpq_url(self.database_url), autocommit=True,
                                               connect_timeout=10)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    # -- the host's side -------------------------------------------------------------------
    def register(self, host_id: str, projections: list[str]) -> None:
        """This host runs ``projections``."""
        with self._conn().transaction():
            join(self._conn(), PROJECTION_HOST, host_id, ALIVE_S,
                 {"projections": projections})
        self._projections = projections

    def heartbeat(self, host_id: str) -> None:
        """The host lives; its row, deleted as gone while the database could not be reached
        for long, comes back."""
        if not renew(self._conn(), PROJECTION_HOST, host_id):
            join(self._conn(), PROJECTION_HOST, host_id, ALIVE_S,
                 {"projections": self._projections})

    def unregister(self, host_id: str) -> None:
        """The host stops: its requests not yet claimed fail, so that nobody waits for them."""
        with self._conn().transaction():
            self._conn().execute(
                "UPDATE projection_requests SET state = 'failed', error = 'the host stopped "
                "before it started the request', updated_at = now() WHERE host_id = %s AND "
                "state = 'pending'", (host_id,))
            leave(self._conn(), PROJECTION_HOST, host_id)

    def claim(self, host_id: str) -> Request | None:
        """The oldest request waiting for this host, now running."""
        row = self._conn().execute(
            "UPDATE projection_requests SET state = 'running', updated_at = now() WHERE id = ("
            "SELECT id FROM projection_requests WHERE host_id = %s AND state = 'pending' "
            "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id", (host_id,)).fetchone()
        return self.request(row[0]) if row else None

    def report(self, request_id: int, done: int, total: int) -> bool:
        """Progress; whether the requester asked to cancel."""
        row = self._conn().execute(
            "UPDATE projection_requests SET done = %s, total = %s, updated_at = now() "
            "WHERE id = %s RETURNING cancel", (done, total, request_id)).fetchone()
        return bool(row and row[0])

    def finish(self, request_id: int, state: RequestState,
               result: dict[str, Any] | None = None, error: str | None = None) -> None:
        self._conn().execute(
            "UPDATE projection_requests SET state = %s, result = %s, error = %s, "
            "updated_at = now() WHERE id = %s",
            (state, json.dumps(result) if result is not None else None, error, request_id))

    # -- the requester's side --------------------------------------------------------------
    def host_running(self, projection: str) -> str | None:
        """The live host that runs ``projection``, if any: the one that writes it (holds its
        writer lease) before one standing by for it."""
        row = self._conn().execute(
            "SELECT h.host_id FROM " + _HOSTS + " h LEFT JOIN projection_versions v ON "
            "v.projection = %s WHERE h.detail -> 'projections' ? %s ORDER BY "
            "h.host_id = v.writer DESC NULLS LAST, h.seen_at DESC LIMIT 1",
            (projection, projection)).fetchone()
        return str(row[0]) if row else None

    def submit(self, host_id: str, projection: str, action: str, source: str) -> int:
        row = self._conn().execute(
            "INSERT INTO projection_requests (host_id, projection, action, source) VALUES "
            "(%s, %s, %s, %s) RETURNING id", (host_id, projection, action, source)).fetchone()
        assert row is not None
        return int(row[0])

    def reroute(self, request_id: int, projection: str) -> str | None:
        """Hand a request its host died before claiming to the live host that runs
        ``projection`` now (a host started again after a crash, say); that host, or None."""
        host_id = self.host_running(projection)
        if host_id is None:
            return None
        row = self._conn().execute(
            "UPDATE projection_requests SET host_id = %s, updated_at = now() WHERE id = %s "
            "AND state = 'pending' RETURNING id", (host_id, request_id)).fetchone()
        return host_id if row else None

    def request(self, request_id: int) -> Request:
        row = self._conn().execute(_REQUEST, (request_id,)).fetchone()
        if row is None:
            raise LookupError(f"no projection request {request_id}")
        return Request(*row)

    def cancel(self, request_id: int) -> None:
        self._conn().execute("UPDATE projection_requests SET cancel = true WHERE id = %s",
                             (request_id,))
