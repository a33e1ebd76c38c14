"""Which KTable topics this read API instance has open, told to the database as a heartbeat.

A replay deletes a replaced version's KTable topic only once no instance has it open
(``projections.state.catalog.ProjectionCatalog.delete_retired_topics``), so that no reader
serves from a topic being deleted under it. A worker registers a topic before its consumer
assigns it (refused if a switch has made another version active meanwhile), and removes the
topic's row once its consumer has closed.

The rows are renewed every few seconds by the instance's lead worker (``workers``), for
every worker: each publishes the topics it has open and holds a lock while it lives, so
the lead renews the rows of the living and deletes those of a worker that died (the rows
of an instance that died whole go stale). A worker that does not lead keeps no connection
open: it connects to register or remove a topic.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import orjson
import psycopg

from eventfold.projections.state.readers import (
    READER_HEARTBEAT_S,
    forget_reader,
    note_reader,
    renew_reader,
)
from eventfold.read_api.freshness import connect_as_reader
from eventfold.read_api.state.locks import try_exclusive
from eventfold.read_api.workers import WorkerLead

log = logging.getLogger(__name__)

_KIND = "presence-"
OpenTopics = Mapping[str, tuple[str, int]]
"""topic -> (projection, version)"""


class ReaderPresence:
    def __init__(self, database_url: str, role: str, instance_id: str,
                 lead: WorkerLead | None = None) -> None:
        self.database_url = database_url
        self.role = role
        self.instance_id = instance_id
        self.lead = lead or WorkerLead()
        self._kind = f"{_KIND}{os.getpid()}"
        self._alive: IO[bytes] | None = None
        self._open: dict[str, tuple[str, int]] = {}
        self._conn: psycopg.Connection | None = None
        # guards the connection and the open topics; renewals take it a write at a time,
        # so that a worker opening a KTable never waits for the lead's whole round
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ktable-presence", daemon=True)

    def start(self) -> ReaderPresence:
        if self.lead.directory is not None:
            self._alive = try_exclusive(self._alive_path(self._kind))  # until this exits
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
                self._publish()
            self._release_unless_leading()
            return moved_to

    def closed(self, topic: str) -> None:
        """Call once the consumer of ``topic`` has closed."""
        with self._lock:
            self._open.pop(topic, None)
            self._publish()
            self._execute(forget_reader, self.instance_id, topic)
            self._release_unless_leading()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            self._execute(forget_reader, self.instance_id)
            self.lead.withdraw(self._kind)
            if self._conn is not None:
                self._conn.close()
            if self._alive is not None:
                self._alive_path(self._kind).unlink(missing_ok=True)
                self._alive.close()

    def _beat(self) -> None:
        while not self._stop.wait(READER_HEARTBEAT_S):
            if not self.lead.leads():
                continue
            if self._renew_own():
                self._renew_the_other_workers()

    def _renew_own(self) -> bool:
        with self._lock:
            opened = dict(self._open)
        return self._renew(self.instance_id, opened, still_open=self._open)

    def _renew_the_other_workers(self) -> None:
        for kind, body in self.lead.every(_KIND).items():
            if kind == self._kind:
                continue
            record = orjson.loads(body)
            if self._lives(kind):
                opened = {topic: (projection, version)
                          for topic, projection, version in record["open"]}
                if not self._renew(record["instance_id"], opened):
                    return
            elif self._execute(forget_reader, record["instance_id"]):
                log.info("ktable presence: worker %s is gone; its topics are no longer "
                         "held open", kind.removeprefix(_KIND))
                self.lead.withdraw(kind)
                self._alive_path(kind).unlink(missing_ok=True)

    def _renew(self, instance_id: str, opened: OpenTopics,
               still_open: OpenTopics | None = None) -> bool:
        """Renew the rows of ``opened``, one write at a time (of those ``still_open``, when
        given: a topic closed meanwhile is not brought back); False once one fails."""
        for topic, held in opened.items():
            with self._lock:
                current = held if still_open is None else still_open.get(topic)
                if current is not None and not self._execute(renew_reader, instance_id,
                                                             topic, *current):
                    return False
        return True

    def _lives(self, kind: str) -> bool:
        """Whether the worker that published ``kind`` still holds its lock."""
        probe = try_exclusive(self._alive_path(kind))
        if probe is None:
            return True
        probe.close()
        return False

    def _alive_path(self, kind: str) -> Path:
        assert self.lead.directory is not None
        return self.lead.directory / f"{kind}.lock"

    def _publish(self) -> None:
        self.lead.publish(self._kind, orjson.dumps({
            "instance_id": self.instance_id,
            "open": [[topic, projection, version]
                     for topic, (projection, version) in self._open.items()]}))

    def _release_unless_leading(self) -> None:
        """A worker that does not lead beats for nothing: it keeps no connection open."""
        if self._conn is not None and not self.lead.leads():
            self._conn.close()
            self._conn = None

    def _execute(self, write: Callable[..., None], *args: object) -> bool:
        """Run one catalog write; a database error is logged (the next beat tries again)."""
        with self._lock:
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
