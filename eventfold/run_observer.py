"""What a ``projection run`` (one projection or a host of several) or ``replay`` process shows
while it works, on ``EVENTFOLD_METRICS_PORT``: ``/metrics`` (its batches, its lag per source
partition, its parked keys and the outbox connector's state and slot, labelled by projection)
and ``/health`` (200 while every query runs, else 503; the body says what each projection is
doing)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import psycopg
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from eventfold.config import ConfigError, Settings
from eventfold.contract import PartitionKey, libpq_url
from eventfold.metrics import PROCESS_COLLECTORS, MetricsServer
from eventfold.outbox.metrics import ConnectorMetrics
from eventfold.projections.metrics import ParkedKeys, ProjectionLag
from eventfold.projections.state.parking import parked_counts
from eventfold.wiring import connector_operations

if TYPE_CHECKING:
    from eventfold.declared import DeclaredApp
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.running_query import RunningQuery


class Watched:
    """One projection of the process: what it is doing, and since when."""

    def __init__(self, name: str, database_url: str) -> None:
        self.name = name
        self.state = "starting"
        self._database_url = database_url
        self._runner: ProjectionRunner | None = None
        self._query: RunningQuery | None = None
        self._since = time.time()

    def running(self, runner: ProjectionRunner, query: RunningQuery) -> None:
        self._runner, self._query, self.state, self._since = runner, query, "running", time.time()

    def stopped(self, state: str) -> None:
        """``state`` says what comes next: "starting again in 4 s", "stopped", ..."""
        self._query, self.state, self._since = None, state, time.time()

    def replaying(self) -> None:
        """A replay runs batch by batch: healthy while it does (and a standby while it
        waits to take a projection over)."""
        self.state, self._since = "replaying", time.time()

    def health(self) -> tuple[bool, dict[str, object]]:
        query, runner = self._query, self._runner
        healthy = self.state in ("replaying", "standing by") or (
            query is not None and query.isActive)
        return healthy, {
            "state": self.state if healthy or query is None else "ended",
            "since": self._since, "version": runner.version if runner else None,
            "batches": runner.batches if runner else 0}

    def committed(self) -> dict[PartitionKey, int] | None:
        return dict(self._runner.offsets) if self._runner else None

    def parked(self) -> tuple[int, int] | None:
        runner = self._runner
        if runner is None or not runner.plan.parks:
            return None
        with psycopg.connect(libpq_url(self._database_url), connect_timeout=5) as conn:
            return parked_counts(conn, {self.name: runner.version}).get(self.name, (0, 0))


class Merged(Collector):
    """Several collectors of the same metric families (one per projection) as one: a registry
    takes each family name once."""

    def __init__(self, collectors: Iterable[Collector]) -> None:
        self._collectors = list(collectors)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for collector in self._collectors:
            for family in collector.collect():
                if (known := families.get(family.name)) is None:
                    families[family.name] = family
                else:
                    known.samples.extend(family.samples)
        yield from families.values()


class RunObserver:
    def __init__(self, app: DeclaredApp, settings: Settings, names: Sequence[str],
                 with_lag: bool = True) -> None:
        self.projections = {name: Watched(name, settings.database_url) for name in names}
        watched = self.projections.values()
        self._collectors: list[Collector] = [
            ConnectorMetrics(connector_operations(settings)),
            Merged(ParkedKeys(w.name, w.parked) for w in watched)]
        if with_lag:
            self._collectors.append(Merged(
                ProjectionLag(settings.kafka, w.name, app.projections.get(w.name).source_topics,
                              w.committed) for w in watched))
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

    def health(self) -> tuple[bool, str]:
        """Healthy while every projection is; the body has each one's state."""
        answers = {name: watched.health() for name, watched in self.projections.items()}
        return all(healthy for healthy, _ in answers.values()), json.dumps(
            {"projections": {name: detail for name, (_, detail) in answers.items()}})

    def close(self) -> None:
        self._server.stop()
        for collector in self._collectors:
            PROCESS_COLLECTORS.unregister(collector)
