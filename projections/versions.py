"""Which version of each projection serves reads, and the one a replay is building.

Version 1 is registered when a projection first runs. A replay builds version N+1 beside the
active one; the switch (view, registry row, old tables) is one Postgres transaction taken while
holding the registry row, which is also what every batch of the active version locks to
commit, so no batch of the old version can land after the switch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import psycopg
from eventfold.outbox.kafka import flatten_offsets, nest_offsets
from eventfold.projections.catalog import (
    KTABLE_READERS_TABLE,
    READER_HEARTBEAT_S,
    READER_TTL_S,
    RETIRED_TOPICS_TABLE,
    VERSIONS_TABLE,
)
from psycopg import sql
from psycopg.types.json import Jsonb

from eventfold.contract import PartitionKey, libpq_url

_TABLE = sql.Identifier(VERSIONS_TABLE)
_RETIRED = sql.Identifier(RETIRED_TOPICS_TABLE)
# A retired topic nobody reads: no fresh heartbeat for it, and retired long enough that a
# reader who saw the old version just before the switch has registered itself by now.
_UNREAD_RETIRED = sql.SQL("""
    SELECT r.topic FROM {retired} r
    WHERE r.retired_at < now() - make_interval(secs => %s)
      AND NOT EXISTS (SELECT 1 FROM {readers} k WHERE k.topic = r.topic
                      AND k.seen_at > now() - make_interval(secs => %s))
""").format(retired=_RETIRED, readers=sql.Identifier(KTABLE_READERS_TABLE))

log = logging.getLogger(__name__)


class ProjectionVersions:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._connection: psycopg.Connection | None = None

    def _conn(self) -> psycopg.Connection:
        """One autocommit connection, opened on first use: a runner asks every batch."""
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(libpq_url(self.database_url), autocommit=True)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def register(self, name: str) -> int:
        """The active version, registering version 1 on a projection's first run."""
        self._conn().execute(sql.SQL("INSERT INTO {} (projection, active_version) VALUES "
                                     "(%s, 1) ON CONFLICT (projection) DO NOTHING")
                             .format(_TABLE), (name,))
        return self.active(name)

    def active(self, name: str) -> int:
        row = self._conn().execute(sql.SQL("SELECT active_version FROM {} WHERE projection = %s")
                           .format(_TABLE), (name,)).fetchone()
        if row is None:
            raise LookupError(f"projection {name!r} has never run")
        return int(row[0])

    def emitted_offsets(self, name: str) -> dict[PartitionKey, int]:
        row = self._conn().execute(sql.SQL("SELECT emitted_offsets FROM {} WHERE projection = %s")
                                   .format(_TABLE), (name,)).fetchone()
        return flatten_offsets(row[0]) if row else {}

    def note_outputs(self, name: str, topics: Iterable[str]) -> None:
        """Record derived-event topics the projection has written to."""
        self._conn().execute(sql.SQL("""
            UPDATE {} SET output_topics = (
                SELECT coalesce(jsonb_agg(DISTINCT topic ORDER BY topic), '[]')
                FROM (SELECT jsonb_array_elements_text(output_topics) AS topic
                      UNION SELECT unnest(%s::text[])) AS known)
            WHERE projection = %s""").format(_TABLE), (sorted(topics), name))

    def outputs(self, name: str) -> tuple[int, list[str]]:
        """(active version, derived-event topics written so far); (1, []) before a first run."""
        row = self._conn().execute(sql.SQL(
            "SELECT active_version, output_topics FROM {} WHERE projection = %s")
            .format(_TABLE), (name,)).fetchone()
        return (int(row[0]), list(row[1])) if row else (1, [])

    def begin_build(self, name: str) -> int:
        """The version a replay builds: a new one, or the unfinished one of an earlier replay
        (its checkpoints are consistent, so it resumes)."""
        row = self._conn().execute(sql.SQL(
            "UPDATE {} SET building_version = coalesce(building_version, active_version + 1)"
            " WHERE projection = %s RETURNING building_version").format(_TABLE),
            (name,)).fetchone()
        if row is None:
            raise LookupError(f"projection {name!r} has never run")
        return int(row[0])

    @contextmanager
    def locked(self, name: str) -> Iterator[psycopg.Connection]:
        """A transaction holding the registry row: the active version cannot commit meanwhile."""
        with psycopg.connect(libpq_url(self.database_url)) as conn, conn.transaction():
            conn.execute(sql.SQL("SELECT 1 FROM {} WHERE projection = %s FOR UPDATE")
                         .format(_TABLE), (name,))
            yield conn

    @staticmethod
    def activate(conn: psycopg.Connection, name: str, version: int,
                 reached: dict[PartitionKey, int]) -> None:
        """Make ``version`` active. It did not emit derived events while it was building, and
        nothing it already applied will emit later: the emission mark moves up to ``reached``."""
        row = conn.execute(sql.SQL("SELECT emitted_offsets FROM {} WHERE projection = %s")
                           .format(_TABLE), (name,)).fetchone()
        emitted = flatten_offsets(row[0]) if row else {}
        for key, offset in reached.items():
            emitted[key] = max(emitted.get(key, 0), offset)
        conn.execute(sql.SQL("UPDATE {} SET active_version = %s, building_version = NULL, "
                             "emitted_offsets = %s, switched_at = now() WHERE projection = %s")
                     .format(_TABLE), (version, Jsonb(nest_offsets(emitted)), name))

    @staticmethod
    def retire_topic(conn: psycopg.Connection, name: str, version: int, topic: str) -> None:
        """Queue a replaced version's KTable topic for deletion (in the switch's transaction).
        It is deleted once no read API instance has it open, so that no reader serves from
        a topic being deleted under it."""
        conn.execute(sql.SQL("INSERT INTO {} (topic, projection, version) VALUES (%s, %s, %s) "
                             "ON CONFLICT (topic) DO NOTHING").format(_RETIRED),
                     (topic, name, version))

    def delete_retired_topics(self, delete: Callable[[list[str]], None],
                              wait_s: float = 0.0) -> list[str]:
        """Delete every retired topic no live reader has open, waiting up to ``wait_s`` for
        readers to move off. The topics still read are left for a later call (the next
        replay, or a streaming run, which calls this as it goes)."""
        deadline = time.monotonic() + wait_s
        deleted: list[str] = []
        while True:
            topics = [row[0] for row in self._conn().execute(
                _UNREAD_RETIRED, (2 * READER_HEARTBEAT_S, READER_TTL_S)).fetchall()]
            if topics:
                delete(topics)
                self._conn().execute(sql.SQL("DELETE FROM {} WHERE topic = ANY(%s)")
                                     .format(_RETIRED), (topics,))
                deleted += topics
                log.info("deleted retired KTable topics %s (no reader has them open)", topics)
            waiting = self._conn().execute(sql.SQL("SELECT count(*) FROM {}").format(_RETIRED)
                                           ).fetchone()
            if not waiting or not waiting[0] or time.monotonic() >= deadline:
                if waiting and waiting[0]:
                    log.info("%d retired KTable topic(s) still open in a read API; deleted once "
                             "its instances move to the active version", waiting[0])
                return deleted
            time.sleep(1.0)
