"""Which KTable topics this read API instance has open, told to the database as a heartbeat.

A replay deletes a replaced version's KTable topic only once no instance has it open
(``projections.catalog.ProjectionCatalog.delete_retired_topics``), so that no reader
serves from a topic being deleted under it. An instance registers a topic
before its consumer assigns it (refused if a switch has made another version active
meanwhile), renews its rows every few seconds, and removes a topic's row once its consumer has
closed; the rows of an instance that died simply go stale.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from eventfold.projections.state.catalog import (
    READER_HEARTBEAT_S,
    forget_reader,
    note_reader,
    renew_reader,
)
from eventfold.read_api.freshness import connect_as_reader

log = logging.getLogger(__name__)


class ReaderPresence:
    def __init__(self, database_url: str, role: str, instance_id: str) -> None:
        self.database_url = database_url
        self.role = role
        self.instance_id = instance_id
        self._open: dict[str, tuple[str, int]] = {}  # topic -> (projection, version)
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ktable-presence", daemon=True)

    def start(self) -> ReaderPresence:
        self._thread.start()
        return self

    def opening(self, projection: str, version: int, topic: str) -> int | None:
        """Call before a consumer assigns ``topic``, the KTable of ``version``: None when from
        now on no replay deletes it; else the version a switch made active meanwhile (open
        that one's instead). With the database unreachable it answers None, and the
        heartbeat registers the topic once it can."""
        with self._lock:
            try:
                moved_to = note_reader(self._connection(), self.instance_id, topic,
                                       projection, version)
            except psycopg.Error as exc:
                self._failed(exc)
                moved_to = None
            if moved_to is None:
                self._open[topic] = (projection, version)
            return moved_to

    def closed(self, topic: str) -> None:
        """Call once the consumer of ``topic`` has closed."""
        with self._lock:
            self._open.pop(topic, None)
            self._execute(forget_reader, self.instance_id, topic)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            self._execute(forget_reader, self.instance_id)
            if self._conn is not None:
                self._conn.close()

    def _beat(self) -> None:
        while not self._stop.wait(READER_HEARTBEAT_S):
            with self._lock:
                for topic, (projection, version) in self._open.items():
                    if not self._execute(renew_reader, self.instance_id, topic, projection,
                                         version):
                        break

    def _execute(self, write: Callable[..., None], *args: object) -> bool:
        """Run one catalog write; a database error is logged (the next beat tries again)."""
        try:
            write(self._connection(), *args)
            return True
        except psycopg.Error as exc:
            self._failed(exc)
            return False

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect_as_reader(self.database_url, self.role, read_only=False,
                                           purpose="presence")
        return self._conn

    def _failed(self, error: psycopg.Error) -> None:
        log.warning("ktable presence: %s (will retry)", error)
        if self._conn is not None:
            self._conn.close()
        self._conn = None
