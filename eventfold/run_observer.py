"""What a ``projection run`` or ``replay`` process shows while it works, on
``EVENTFOLD_METRICS_PORT``: ``/metrics`` (its batches, its lag per source partition, its parked
keys and the outbox connector's state and slot) and ``/health`` (200 while its query runs,
else 503 with what it is doing)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import psycopg
from prometheus_client.registry import Collector

from eventfold.config import ConfigError, Settings
from eventfold.contract import PartitionKey, libpq_url
from eventfold.metrics import PROCESS_COLLECTORS, MetricsServer
from eventfold.outbox.metrics import ConnectorMetrics
from eventfold.projections.metrics import ParkedKeys, ProjectionLag
from eventfold.projections.state.parking import parked_counts

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from eventfold.app import Eventfold
    from eventfold.projections.runner import ProjectionRunner


class RunObserver:
    def __init__(self, app: Eventfold, settings: Settings, name: str,
                 with_lag: bool = True) -> None:
        self.name = name
        self.state = "starting"
        self._runner: ProjectionRunner | None = None
        self._query: StreamingQuery | None = None
        self._since = time.time()
        self._database_url = settings.database_url
        self._collectors: list[Collector] = [ConnectorMetrics(app.connector(settings)),
                                             ParkedKeys(name, self._parked)]
        if with_lag:
            self._collectors.append(ProjectionLag(
                settings.kafka, name, app.projections.get(name).source_topics, self._committed))
        try:
            self._server = MetricsServer(settings.http_host, settings.metrics_port,
                                         self.health).start()
        except OSError as exc:
            raise ConfigError(f"EVENTFOLD_METRICS_PORT: cannot listen on {settings.http_host}:"
                              f"{settings.metrics_port} ({exc.strerror}); another process "
                              "may use it") from None
        for collector in self._collectors:
            PROCESS_COLLECTORS.register(collector)

    @property
    def url(self) -> str:
        return self._server.url

    def running(self, runner: ProjectionRunner, query: StreamingQuery) -> None:
        self._runner, self._query, self.state, self._since = runner, query, "running", time.time()

    def stopped(self, state: str) -> None:
        """``state`` says what comes next: "starting again in 4 s", "stopped", ..."""
        self._query, self.state, self._since = None, state, time.time()

    def replaying(self) -> None:
        """A replay runs batch by batch without a streaming query: healthy while it does."""
        self.state, self._since = "replaying", time.time()

    def health(self) -> tuple[bool, str]:
        query = self._query
        healthy = self.state == "replaying" or (query is not None and query.isActive)
        runner = self._runner
        return healthy, json.dumps({
            "projection": self.name, "state": self.state if healthy or query is None
            else "query ended", "since": self._since,
            "version": runner.version if runner else None,
            "batches": runner.batches if runner else 0})

    def _committed(self) -> dict[PartitionKey, int] | None:
        return dict(self._runner.offsets) if self._runner else None

    def _parked(self) -> tuple[int, int] | None:
        runner = self._runner
        if runner is None or not runner.plan.parks:
            return None
        with psycopg.connect(libpq_url(self._database_url), connect_timeout=5) as conn:
            return parked_counts(conn, {self.name: runner.version}).get(self.name, (0, 0))

    def close(self) -> None:
        self._server.stop()
        for collector in self._collectors:
            PROCESS_COLLECTORS.unregister(collector)
