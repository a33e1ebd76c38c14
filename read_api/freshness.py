"""How fresh each projection's read model is: active version, last batch, lag in events.

A background thread polls the projection registry and checkpoints (as the read-only role)
and the source topics' end offsets, so a response carries freshness without any query of
its own. It also tells each KTable host which version is active. Of an instance's HTTP
workers only the lead polls (``read_api.workers``); the others read what it publishes.
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

import orjson
import psycopg

from eventfold.contract import PartitionKey, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections import Projection
from eventfold.projections.state.catalog import active_checkpoints, partition_history
from eventfold.projections.status import projection_outputs
from eventfold.read_api.read_models import reader_session
from eventfold.read_api.workers import FOLLOW_S, WorkerLead

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


    def as_record(self) -> dict[str, Any]:
        """All of it, as JSON (what the lead worker publishes to the others)."""
        return {**self._json, "applied_offsets": [[t, p, o] for (t, p), o
                                                  in self.applied_offsets.items()]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Freshness:
        def moment(value: str | None) -> datetime | None:
            return datetime.fromisoformat(value) if value else None

        return cls(record["projection_version"], record["batch_id"],
                   moment(record["last_batch_at"]),
                   {(t, p): o for t, p, o in record["applied_offsets"]},
                   record["lag_events"], datetime.fromisoformat(record["checked_at"]))


NEVER_RAN = Freshness(None, None, None, {}, None, datetime.fromtimestamp(0, UTC))


def connect_as_reader(database_url: str, role: str, read_only: bool = True, purpose: str = ""
                      ) -> psycopg.Connection:
    """``purpose`` names the connection in ``pg_stat_activity`` (application_name)."""
    conn = psycopg.connect(libpq_url(database_url), autocommit=True,
                           application_name=f"eventfold read API {purpose}".strip())
    for statement in reader_session(role, read_only):
        conn.execute(statement)
    return conn


class FreshnessMonitor:
    def __init__(self, projections: Iterable[Projection], database_url: str,
                 kafka: KafkaConnection, role: str, interval_s: float = 1.0,
                 end_offsets_every_s: float = 2.0, lead: WorkerLead | None = None) -> None:
        self.projections = {p.name: p for p in projections}
        self.lead = lead or WorkerLead()
        self.database_url = database_url
        self.kafka = kafka
        self.role = role
        self.interval_s = interval_s
        self.end_offsets_every_s = end_offsets_every_s
        self._listeners: list[VersionListener] = []
        self._snapshots: dict[str, Freshness] = {}
        self._derived_topics: dict[str, list[str]] = {}
        self._partition_histories: dict[tuple[str, str], tuple[int, ...]] = {}
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

    def partition_history(self, topic: str, topic_id: str) -> tuple[int, ...]:
        """Every partition count the KTable ``topic`` (the one with ``topic_id``) has had,
        oldest first (empty: none recorded)."""
        return self._partition_histories.get((topic, topic_id), ())

    def outputs(self, name: str) -> dict[str, object]:
        """Where the projection's output goes at its active version."""
        return projection_outputs(self.projections[name], self.active_version(name) or 1,
                                  self._derived_topics.get(name, []))

    def poll(self, conn: psycopg.Connection, planner: OffsetPlanner) -> None:
        """One round: registry and checkpoints, end offsets when due, then listeners."""
        rows = active_checkpoints(conn, list(self.projections))
        self._partition_histories = partition_history(conn, [
            self.projections[row.projection].ktable_topic_for(version) for row in rows
            for version in (row.version - 1, row.version) if version > 0])
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
        if not self.lead.alone:
            self.lead.publish("freshness", self.publication(
                self._snapshots, self._derived_topics, self._partition_histories))
        self._told_listeners()

    @staticmethod
    def publication(snapshots: Mapping[str, Freshness],
                    derived_topics: Mapping[str, list[str]],
                    partition_histories: Mapping[tuple[str, str], tuple[int, ...]] | None = None
                    ) -> bytes:
        """What the lead worker publishes after each poll."""
        return orjson.dumps({"snapshots": {n: f.as_record() for n, f in snapshots.items()},
                             "derived_topics": derived_topics,
                             "partition_histories": [[topic, topic_id, counts] for (
                                 topic, topic_id), counts in (partition_histories or {})
                                 .items()]})

    def follow(self) -> None:
        """A worker that does not lead: take what the lead last published, if anything new."""
        body = self.lead.latest("freshness")
        if body is None:
            return
        published = orjson.loads(body)
        self._snapshots = {name: Freshness.from_record(record)
                           for name, record in published["snapshots"].items()}
        self._derived_topics = published["derived_topics"]
        self._partition_histories = {(topic, topic_id): tuple(counts) for topic, topic_id,
                                     counts in published.get("partition_histories", [])}
        self._told_listeners()

    def _told_listeners(self) -> None:
        for name, snapshot in list(self._snapshots.items()):
            if snapshot.version is not None:
                for listener in self._listeners:
                    listener(name, snapshot.version)
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
        planner: OffsetPlanner | None = None
        try:
            while not self._stop.is_set():
                if not self.lead.leads():
                    self.follow()
                    self._stop.wait(FOLLOW_S)
                    continue
                try:
                    if conn is None or conn.closed:
                        conn = connect_as_reader(self.database_url, self.role, purpose="freshness")
                    planner = planner or OffsetPlanner(self.kafka)
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
            if planner is not None:
                planner.close()
            if conn is not None:
                conn.close()
