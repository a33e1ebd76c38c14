"""How fresh each projection's read model is: active version, last batch, lag in events.

A background thread polls the projection registry and checkpoints (as the read-only role)
and the source topics' end offsets, so a response carries freshness without any query of
its own. It also tells each KTable host which version is active.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import psycopg
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections import Projection
from eventfold.projections.state.catalog import active_checkpoints
from eventfold.projections.status import projection_outputs
from eventfold.read_api.read_models import reader_session

from eventfold.contract import PartitionKey, libpq_url

log = logging.getLogger(__name__)

VersionListener = Callable[[str, int], None]


@dataclass(frozen=True)
class Freshness:
    """What a response says about how up to date the data behind it is."""

    version: int | None
    batch_id: int | None
    last_batch_at: datetime | None
    applied_offsets: Mapping[PartitionKey, int]
    lag_events: int | None
    checked_at: datetime

    def as_json(self) -> dict[str, Any]:
        return self._json

    @cached_property
    def _json(self) -> dict[str, Any]:
        return {
            "projection_version": self.version,
            "batch_id": self.batch_id,
            "last_batch_at": self.last_batch_at.isoformat() if self.last_batch_at else None,
            "lag_events": self.lag_events,
            "checked_at": self.checked_at.isoformat(),
        }


NEVER_RAN = Freshness(None, None, None, {}, None, datetime.fromtimestamp(0, UTC))


def connect_as_reader(database_url: str, role: str, read_only: bool = True
                      ) -> psycopg.Connection:
    conn = psycopg.connect(libpq_url(database_url), autocommit=True)
    for statement in reader_session(role, read_only):
        conn.execute(statement)
    return conn


class FreshnessMonitor:
    def __init__(self, projections: Iterable[Projection], database_url: str,
                 kafka: KafkaConnection, role: str, interval_s: float = 1.0,
                 end_offsets_every_s: float = 2.0) -> None:
        self.projections = {p.name: p for p in projections}
        self.database_url = database_url
        self.kafka = kafka
        self.role = role
        self.interval_s = interval_s
        self.end_offsets_every_s = end_offsets_every_s
        self._listeners: list[VersionListener] = []
        self._snapshots: dict[str, Freshness] = {}
        self._derived_topics: dict[str, list[str]] = {}
        self._end_offsets: dict[PartitionKey, int] = {}
        self._ends_at = 0.0
        self._stop = threading.Event()
        self._polled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness", daemon=True)

    def on_version(self, listener: VersionListener) -> None:
        self._listeners.append(listener)

    def start(self) -> FreshnessMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def wait_first_poll(self, timeout_s: float) -> bool:
        return self._polled.wait(timeout_s)

    def get(self, name: str) -> Freshness:
        return self._snapshots.get(name, NEVER_RAN)

    def active_version(self, name: str) -> int | None:
        return self.get(name).version

    def outputs(self, name: str) -> dict[str, object]:
        """Where the projection's output goes at its active version."""
        return projection_outputs(self.projections[name], self.active_version(name) or 1,
                                  self._derived_topics.get(name, []))

    def poll(self, conn: psycopg.Connection, planner: OffsetPlanner) -> None:
        """One round: registry and checkpoints, end offsets when due, then listeners."""
        rows = active_checkpoints(conn, list(self.projections))
        if time.monotonic() >= self._ends_at:
            self._end_offsets = self._source_end_offsets(planner)
            self._ends_at = time.monotonic() + self.end_offsets_every_s
        now = datetime.now(UTC)
        for row in rows:
            name, version, checkpoint = row.projection, row.version, row.checkpoint
            self._derived_topics[name] = row.derived_topics
            applied = checkpoint.offsets if checkpoint else {}
            self._snapshots[name] = Freshness(
                version, checkpoint.batch_id if checkpoint else None,
                checkpoint.updated_at if checkpoint else None, applied,
                self._lag(self.projections[name], applied), now)
            for listener in self._listeners:
                listener(name, version)
        self._polled.set()

    def _source_end_offsets(self, planner: OffsetPlanner) -> dict[PartitionKey, int]:
        topics = sorted({t for p in self.projections.values() for t in p.source_topics})
        return planner.end_offsets(planner.partitions(topics))

    def _lag(self, projection: Projection, applied: Mapping[PartitionKey, int]) -> int:
        topics = set(projection.source_topics)
        return sum(max(end - applied.get(tp, 0), 0)
                   for tp, end in self._end_offsets.items() if tp[0] in topics)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        planner = OffsetPlanner(self.kafka)
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = connect_as_reader(self.database_url, self.role)
                    self.poll(conn, planner)
                except psycopg.Error as exc:
                    log.warning("freshness poll failed (will retry): %s", exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                except Exception:
                    log.exception("freshness poll failed (will retry)")
                self._stop.wait(self.interval_s)
        finally:
            planner.close()
            if conn is not None:
                conn.close()
