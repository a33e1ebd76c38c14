"""The services of one app in one process, made from one ``Settings``: the composition root.

    runtime = app.runtime(Settings.from_env())
    runtime.setup()
    bus = runtime.command_bus()

An app (``app.Eventfold``) declares its commands and projections; the runtime is built once
per process from the settings and makes what the process serves: the command and read APIs,
a command bus, projection runners, replays, a projection host, the CDC connector's
operations. Each package receives what it needs, translated from the settings by
``wiring``; no package reads the settings itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI

from eventfold.config import Settings
from eventfold.contract import event_topic, interval_seconds
from eventfold.declared import DeclaredApp
from eventfold.logs import CorrelationIds
from eventfold.metrics import PROCESS_COLLECTORS, HttpMetrics, metrics_endpoint
from eventfold.outbox.kafka import iter_messages
from eventfold.outbox.operations import ConnectorOperations
from eventfold.outbox.switch import switch_design
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.outbox.verify import LoggedEvent, LogReport, verify_topic
from eventfold.projections.state.topics import ensure_projection_topics
from eventfold.request_log import RequestLog
from eventfold.wiring import (
    connector_operations,
    output_topic_configs,
    runner_settings,
    spark_session,
)
from eventfold.write_model import (
    AsyncCommandBus,
    AsyncEventStore,
    AsyncRepository,
    CommandBus,
    EventStore,
    Repository,
)
from eventfold.write_model.http import bearer_auth, create_command_app, header_check

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.projections.host import ProjectionHost
    from eventfold.projections.progress import Progress
    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.state.lease import WriterLease
    from eventfold.reactions.runner import ReactionRunner
    from eventfold.run_observer import RunObserver

# Spark, pandas, pyarrow and the read API are imported by the services that use them, so
# that a command such as verify-log starts without them (about 120 MB of a process).

log = logging.getLogger(__name__)


class Runtime:
    def __init__(self, app: DeclaredApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    # -- infrastructure -------------------------------------------------------------------
    def setup(self, fix_topics: bool = False) -> None:
        """Migrate the database, install the outbox design, create event topics, apply the
        CDC connector (idempotent). Topics that exist are checked against the configs they
        need; ``fix_topics`` alters them instead of refusing. A database on another outbox
        design is switched over with its connector (``outbox.switch.switch_design``)."""
        from eventfold import migrations  # Alembic: only the processes that set up load it

        settings = self.settings
        migrations.upgrade(settings.database_url)
        log.info("database migrated")
        admin = TopicAdmin(settings.kafka, settings.replication)
        admin.ensure([event_topic(t) for t in self.app.aggregate_types], EVENT_TOPIC_CONFIG,
                     partitions=settings.event_topic_partitions, check=True, fix=fix_topics)
        configs = output_topic_configs(settings)
        for projection in self.app.projections:
            ensure_projection_topics(admin, projection, configs=configs, fix=fix_topics)
        # Made here as the projection's tasks would make them on first emitting: a reaction
        # reading one can start before anything crossed.
        if derived := sorted({t for r in self.app.reactions for t in r.derived_topics}):
            admin.ensure(derived, configs.derived_config(), kind="derived")
        connector = self.connector()
        switch_design(settings.database_url, connector.spec.design, connector)
        connector.apply()

    def connector(self) -> ConnectorOperations:
        return connector_operations(self.settings)

    def verify_log(self, aggregate_type: str, stream_prefix: str = "") -> LogReport:
        """Compare the event store with the aggregate type's topic (missing, duplicated,
        out-of-order events per aggregate)."""
        stored = (LoggedEvent(*identity) for identity in
                  self.event_store().event_identities(aggregate_type))
        messages = ((key, value) for _, _, key, value in
                    iter_messages(self.settings.kafka, event_topic(aggregate_type)))
        return verify_topic(stored, messages, include=lambda s: s.startswith(stream_prefix))

    # -- the write side -----------------------------------------------------------------------
    def event_store(self) -> EventStore:
        return EventStore.from_url(self.settings.database_url)

    def command_bus(self) -> CommandBus:
        return CommandBus(Repository(self.event_store()), self.app.commands)

    def async_command_bus(self, **store_options: Any) -> AsyncCommandBus:
        """The bus for asyncio code; its store opens with ``async with bus.repository.store``."""
        store = AsyncEventStore.from_url(self.settings.database_url, **store_options)
        return AsyncCommandBus(AsyncRepository(store), self.app.commands)

    def command_api(self) -> FastAPI:
        settings = self.settings
        # One commit slot unless configured: the server's event loop parses requests while a
        # batch commits, so a second batch in flight adds database work, not overlap
        # (docs/benchmarks.md, "Commit slots").
        bus = self.async_command_bus(concurrent_commits=settings.command_commit_slots)
        app = create_command_app(bus, title=f"{self.app.name} commands",
                                 api_token=settings.api_token or None,
                                 max_body_bytes=settings.max_body_bytes,
                                 command_id_retention_s=interval_seconds(
                                     settings.command_id_retention))
        return self._observed(app, "commands", request_log=False)

    # -- the read side ------------------------------------------------------------------------
    def read_api(self, skip_router: bool = True) -> FastAPI:
        """Queries run as ``reader_role`` on ``read_database_url`` (default: the main one).
        ``skip_router`` off: KTable gets go through the router too (what the bypass is tested
        against)."""
        from eventfold.dashboard import add_dashboard
        from eventfold.read_api import ReadApiOptions, StoreConfig, create_read_app
        from eventfold.read_api.metrics import register_ktable_metrics
        from eventfold.serving import workers_dir

        settings = self.settings
        register_ktable_metrics(PROCESS_COLLECTORS)
        options = settings.fill(
            ReadApiOptions, database_url=settings.read_database_url or settings.database_url,
            pool_size=settings.per_http_worker(settings.read_pool_size),
            title=f"{self.app.name} reads",
            ktable_store=StoreConfig(Path(settings.state_dir),
                                     settings.per_http_worker(settings.ktable_cache_mb)),
            workers_dir=workers_dir(), skip_router=skip_router)
        auth = [Depends(bearer_auth(settings.api_token))] if settings.api_token else []
        app = create_read_app(self.app.projections, options, auth=auth,
                              authorize=header_check(settings.api_token or None))
        add_dashboard(app, self.app, settings)
        return self._observed(app, "reads", request_log=settings.request_log)

    # -- projections --------------------------------------------------------------------------
    def projection_runner(self, name: str, progress: Progress | None = None,
                          spark: SparkSession | None = None,
                          lease: WriterLease | None = None) -> ProjectionRunner:
        """The active version of projection ``name``, ready to start (in ``spark``, the
        session of a host running several, else one of its own; ``lease``: the writer lease
        its caller holds or will have it take)."""
        from eventfold.projections.runner import ProjectionRunner

        return ProjectionRunner(spark or self.spark_session(f"eventfold-{name}"),
                                self.app.projections.get(name), runner_settings(self.settings),
                                progress=progress, lease=lease)

    def replay(self, name: str, source: ReplaySource = "auto",
               spark: SparkSession | None = None,
               listener: ProgressListener | None = None) -> ReplayResult:
        """Rebuild projection ``name`` from the beginning (the topics, or the event store when
        they no longer hold it) beside the live version, then switch. ``spark``: a host's
        session; ``listener``: told the progress (``projections.replay.replay``)."""
        from eventfold.projections.replay import replay

        return replay(spark or self.spark_session(f"eventfold-{name}"),
                      self.app.projections.get(name),
                      runner_settings(self.settings, self.settings.replay_max_rows_per_batch),
                      source, listener)

    def projection_host(self, names: Sequence[str], once: bool = False,
                        standby: bool = False, holder: str | None = None) -> ProjectionHost:
        """A host running ``names`` in one Spark application (``projections.host``), wired to
        this runtime's runners, replays and metrics; ``holder``: the writer leases' holder
        it takes them as (None: this process)."""
        from eventfold.projections.host import ProjectionHost
        from eventfold.projections.host_wiring import HostWiring

        settings = self.settings

        def observer(watched: Sequence[str]) -> RunObserver | None:
            from eventfold.run_observer import RunObserver

            return (RunObserver(self.app, settings, watched)
                    if settings.metrics and settings.metrics_port else None)

        wiring = HostWiring(
            app_name=self.app.name, projections=self.app.projections,
            database_url=settings.database_url, kafka=settings.kafka,
            writer_lease_s=settings.writer_lease_s, spark_session=self.spark_session,
            runner=lambda name, progress, spark, lease: self.projection_runner(
                name, progress, spark=spark, lease=lease),
            replay=lambda name, source, spark, listener: self.replay(
                name, source, spark=spark, listener=listener),
            observer=observer, holder=holder)
        return ProjectionHost(wiring, names, once, standby)

    def spark_session(self, app_name: str) -> SparkSession:
        return spark_session(self.settings, app_name)

    # -- reactions ----------------------------------------------------------------------------
    def run_reactions(self, names: Sequence[str], stopping: threading.Event,
                      actor: str | None = None) -> None:
        """Run the reactions ``names`` in this thread until ``stopping`` is set: one event
        loop, one command bus (and pool of connections) for all of them; ``actor``: who
        their runners are to fault points (None: this process)."""

        async def run_all() -> None:
            bus = self.async_command_bus()
            async with bus.repository.store:
                await asyncio.gather(*(self.reaction_runner(name, bus, actor).run(stopping)
                                       for name in names))

        asyncio.run(run_all())

    def reaction_runner(self, name: str, bus: AsyncCommandBus,
                        actor: str | None = None) -> ReactionRunner:
        """The runner of reaction ``name``, sending through ``bus`` (one bus, and one pool of
        connections, for every reaction of a process; opened by the caller)."""
        from eventfold.reactions.runner import ReactionOptions, ReactionRunner

        return ReactionRunner(self.app.reactions.get(name), bus, self.settings.kafka,
                              self.settings.database_url, self.settings.fill(ReactionOptions),
                              actor=actor)

    def _observed(self, app: FastAPI, api: str, request_log: bool) -> FastAPI:
        """The request log, then Prometheus metrics at ``/metrics`` (``EVENTFOLD_METRICS``),
        outermost so that they time everything."""
        if request_log:
            app.add_middleware(RequestLog)
        app.add_middleware(CorrelationIds)
        if self.settings.metrics:
            app.add_route("/metrics", metrics_endpoint, include_in_schema=False)
            app.add_middleware(HttpMetrics, api=api)
        return app
