"""CDC's Prometheus metrics, computed when scraped: the outbox connector's and its tasks'
states (from the Connect REST API) and its replication slot's retained WAL (from Postgres).
Whichever process serves them asks at most every ``refresh_s``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from eventfold.outbox.operations import ConnectorOperations, ConnectorStatus

log = logging.getLogger(__name__)

CONNECTOR_STATES = ("RUNNING", "PAUSED", "FAILED", "UNASSIGNED", "RESTARTING", "STOPPED",
                    "ABSENT", "UNREACHABLE")
"""Connect's states, plus ABSENT (no such connector) and UNREACHABLE (no answer)."""


class ConnectorMetrics(Collector):
    def __init__(self, operations: ConnectorOperations, refresh_s: float = 5.0) -> None:
        self._operations = operations
        self._refresh_s = refresh_s
        self._status: ConnectorStatus | None = None
        self._asked_at = float("-inf")
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = self.status()
        name = self._operations.spec.name
        state = GaugeMetricFamily("eventfold_connector_state", "1 for the outbox connector's "
                                  "current state, 0 for the others", labels=["connector", "state"])
        current = status.connector_state if status else "UNREACHABLE"
        for candidate in CONNECTOR_STATES:
            state.add_metric([name, candidate], 1 if candidate == current else 0)
        tasks = GaugeMetricFamily("eventfold_connector_tasks", "The connector's tasks by state",
                                  labels=["connector", "state"])
        for candidate in CONNECTOR_STATES[:6]:
            tasks.add_metric([name, candidate], sum(
                1 for t in (status.tasks if status else []) if t["state"] == candidate))
        yield from (state, tasks)
        if status is not None and status.slot is not None:
            slot = status.slot
            retained = GaugeMetricFamily(
                "eventfold_replication_slot_retained_wal_bytes",
                "WAL the slot keeps on the database's disk (from its restart LSN)", labels=["slot"])
            retained.add_metric([slot.name], slot.retained_wal_bytes)
            active = GaugeMetricFamily("eventfold_replication_slot_active",
                                       "1 while a CDC task streams from the slot", labels=["slot"])
            active.add_metric([slot.name], 1 if slot.active else 0)
            yield from (retained, active)

    def status(self) -> ConnectorStatus | None:
        with self._lock:
            if time.monotonic() - self._asked_at >= self._refresh_s:
                try:
                    self._status = self._operations.status(settle_s=0)
                except Exception as exc:  # Connect or Postgres away: say so, do not fail
                    log.warning("connector status for metrics: %s", exc)
                    self._status = None
                self._asked_at = time.monotonic()
            return self._status
