"""The application entry point: one object that knows an app's commands and projections.

    app = Eventfold("inventory")
    app.projections.add(inventory_totals)

    @app.commands.handler(ReceiveStock, Product)
    def receive_stock(product: Product, command: ReceiveStock) -> None: ...

The CLI loads it from ``EVENTFOLD_APP`` (``module:attribute``) and builds every service from it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI

from eventfold.config import ConfigError, Settings
from eventfold.contract import event_topic, interval_seconds, retention_ms, split_password
from eventfold.loading import AppNotFound, app_directories, import_app_module, python_path
from eventfold.local_stack.java import spark_kafka_jars
from eventfold.logs import CorrelationIds
from eventfold.metrics import PROCESS_COLLECTORS, HttpMetrics, metrics_endpoint
from eventfold.outbox.connector import ConnectClient, OutboxConnectorSpec
from eventfold.outbox.design import OutboxDesign
from eventfold.outbox.kafka import iter_messages
from eventfold.outbox.operations import ConnectorOperations
from eventfold.outbox.switch import switch_design
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin, parse_topic_config
from eventfold.outbox.verify import LoggedEvent, LogReport, verify_topic
from eventfold.projections import ProjectionRegistry
from eventfold.projections.state.topics import OutputTopicConfigs, ensure_projection_topics
from eventfold.request_log import RequestLog
from eventfold.write_model import (
    AsyncCommandBus,
    AsyncEventStore,
    AsyncRepository,
    CommandBus,
    CommandRegistry,
    EventStore,
    Repository,
)
from eventfold.write_model.http import bearer_auth, create_command_app, header_check

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.projections.host import ProjectionHost
    from eventfold.projections.progress import Progress
    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource
    from eventfold.projections.run_settings import RunnerSettings
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.state.lease import WriterLease
    from eventfold.run_observer import RunObserver

# Spark, pandas, pyarrow and the read API are imported by the services that use them, so
# that a command such as verify-log starts without them (about 120 MB of a process).

log = logging.getLogger(__name__)


class Eventfold:
    def __init__(self, name: str) -> None:
        self.name = name
        self.commands = CommandRegistry()
        self.projections = ProjectionRegistry()

    @property
    def aggregate_types(self) -> list[str]:
        return sorted(set(self.commands.aggregate_types)
                      | set(self.projections.source_aggregate_types))

    # -- infrastructure -------------------------------------------------------------------
    @staticmethod
    def connector_spec(settings: Settings) -> OutboxConnectorSpec:
        """One outbox table, one connector: every app on a database applies the same one."""
        return OutboxConnectorSpec(database_url=settings.database_url_for_connect,
                                   name=settings.connector_name,
                                   slot_name=settings.connector_name.replace("-", "_"),
                                   password_ref=settings.connect_database_password,
                                   design=OutboxDesign(settings.outbox_design))

    def setup(self, settings: Settings, fix_topics: bool = False) -> None:
        """Migrate the database, install the outbox design, create event topics, apply the
        CDC connector (idempotent). Topics that exist are checked against the configs they
        need; ``fix_topics`` alters them instead of refusing. A database on another outbox
        design is switched over with its connector (``outbox.switch.switch_design``)."""
        from eventfold import migrations  # Alembic: only the processes that set up load it

        migrations.upgrade(settings.database_url)
        log.info("database migrated")
        admin = TopicAdmin(settings.kafka, settings.replication)
        admin.ensure([event_topic(t) for t in self.aggregate_types], EVENT_TOPIC_CONFIG,
                     partitions=settings.event_topic_partitions, check=True, fix=fix_topics)
        for projection in self.projections:
            ensure_projection_topics(admin, projection, configs=output_topic_configs(settings),
                                     fix=fix_topics)
        connector = self.connector(settings)
        switch_design(settings.database_url, connector.spec.design, connector)
        connector.apply()

    def connector(self, settings: Settings) -> ConnectorOperations:
        return ConnectorOperations(ConnectClient(settings.connect_url),
                                   self.connector_spec(settings),
                                   TopicAdmin(settings.kafka, settings.replication))

    def verify_log(self, settings: Settings, aggregate_type: str,
                   stream_prefix: str = "") -> LogReport:
        """Compare the event store with the aggregate type's topic (missing, duplicated,
        out-of-order events per aggregate)."""
        stored = (LoggedEvent(*identity) for identity in
                  self.event_store(settings).event_identities(aggregate_type))
        messages = ((key, value) for _, _, key, value in
                    iter_messages(settings.kafka, event_topic(aggregate_type)))
        return verify_topic(stored, messages, include=lambda s: s.startswith(stream_prefix))

    # -- services ---------------------------------------------------------------------------
    def event_store(self, settings: Settings) -> EventStore:
        return EventStore.from_url(settings.database_url)

    def command_bus(self, settings: Settings) -> CommandBus:
        return CommandBus(Repository(self.event_store(settings)), self.commands)

    def async_command_bus(self, settings: Settings, **store_options: Any) -> AsyncCommandBus:
        """The bus for asyncio code; its store opens with ``async with bus.repository.store``."""
        store = AsyncEventStore.from_url(settings.database_url, **store_options)
        return AsyncCommandBus(AsyncRepository(store), self.commands)

    def command_api(self, settings: Settings) -> FastAPI:
        # One commit slot unless configured: the server's event loop parses requests while a
        # batch commits, so a second batch in flight adds database work, not overlap
        # (docs/benchmarks.md, "Commit slots").
        bus = self.async_command_bus(settings,
                                     concurrent_commits=settings.command_commit_slots)
        app = create_command_app(bus, title=f"{self.name} commands",
                                 api_token=settings.api_token or None,
                                 max_body_bytes=settings.max_body_bytes,
                                 command_id_retention_s=interval_seconds(
                                     settings.command_id_retention))
        return _with_observability(app, settings, "commands", request_log=False)

    def read_api(self, settings: Settings, skip_router: bool = True) -> FastAPI:
        """Queries run as ``reader_role`` on ``read_database_url`` (default: the main one).
        ``skip_router`` off: KTable gets go through the router too (what the bypass is tested
        against)."""
        from eventfold.dashboard import add_dashboard
        from eventfold.read_api import ReadApiOptions, StoreConfig, create_read_app
        from eventfold.read_api.metrics import register_ktable_metrics
        from eventfold.serving import workers_dir

        register_ktable_metrics(PROCESS_COLLECTORS)
        options = settings.fill(
            ReadApiOptions, database_url=settings.read_database_url or settings.database_url,
            pool_size=settings.per_http_worker(settings.read_pool_size),
            title=f"{self.name} reads",
            ktable_store=StoreConfig(Path(settings.state_dir),
                                     settings.per_http_worker(settings.ktable_cache_mb)),
            workers_dir=workers_dir(), skip_router=skip_router)
        auth = [Depends(bearer_auth(settings.api_token))] if settings.api_token else []
        app = create_read_app(self.projections, options, auth=auth,
                              authorize=header_check(settings.api_token or None))
        add_dashboard(app, self, settings)
        return _with_observability(app, settings, "reads", request_log=settings.request_log)

    def projection_runner(self, settings: Settings, name: str,
                          progress: Progress | None = None,
                          spark: SparkSession | None = None,
                          lease: WriterLease | None = None) -> ProjectionRunner:
        """The active version of projection ``name``, ready to start (in ``spark``, the
        session of a host running several, else one of its own; ``lease``: the writer lease
        its caller holds or will have it take)."""
        from eventfold.projections.runner import ProjectionRunner

        return ProjectionRunner(spark or self.spark_session(settings, f"eventfold-{name}"),
                                self.projections.get(name), self._runner_settings(settings),
                                progress=progress, lease=lease)

    def replay(self, settings: Settings, name: str, source: ReplaySource = "auto",
               spark: SparkSession | None = None,
               listener: ProgressListener | None = None) -> ReplayResult:
        """Rebuild projection ``name`` from the beginning (the topics, or the event store when
        they no longer hold it) beside the live version, then switch. ``spark``: a host's
        session; ``listener``: told the progress (``projections.replay.replay``)."""
        from eventfold.projections.replay import replay

        return replay(spark or self.spark_session(settings, f"eventfold-{name}"),
                      self.projections.get(name),
                      self._runner_settings(settings, settings.replay_max_rows_per_batch),
                      source, listener)

    def projection_host(self, settings: Settings, names: Sequence[str], once: bool = False,
                        standby: bool = False) -> ProjectionHost:
        """A host running ``names`` in one Spark application (``projections.host``), wired to
        this app's runners, replays and metrics."""
        from eventfold.projections.host import HostWiring, ProjectionHost

        def observer(watched: Sequence[str]) -> RunObserver | None:
            from eventfold.run_observer import RunObserver

            return (RunObserver(self, settings, watched)
                    if settings.metrics and settings.metrics_port else None)

        wiring = HostWiring(
            app_name=self.name, projections=self.projections,
            database_url=settings.database_url, kafka=settings.kafka,
            writer_lease_s=settings.writer_lease_s,
            spark_session=lambda app_name: self.spark_session(settings, app_name),
            runner=lambda name, progress, spark, lease: self.projection_runner(
                settings, name, progress, spark=spark, lease=lease),
            replay=lambda name, source, spark, listener: self.replay(
                settings, name, source, spark=spark, listener=listener),
            observer=observer)
        return ProjectionHost(wiring, names, once, standby)

    @staticmethod
    def spark_session(settings: Settings, app_name: str) -> SparkSession:
        from eventfold.projections.execution.spark import spark_session

        return spark_session(settings.spark_master, app_name=app_name,
                             extra_conf=spark_conf(settings))

    @staticmethod
    def _runner_settings(settings: Settings, max_rows: int | None = None) -> RunnerSettings:
        from eventfold.projections.run_settings import RunnerSettings

        return settings.fill(
            RunnerSettings, max_rows_per_batch=max_rows or settings.max_rows_per_batch,
            topic_configs=output_topic_configs(settings),
            deleted_key_retention_s=_seconds_or_forever(settings.deleted_key_retention))


EXECUTOR_PYTHONPATH = "spark.executorEnv.PYTHONPATH"


def spark_conf(settings: Settings) -> dict[str, str]:
    """``EVENTFOLD_SPARK_CONF``; the app's directories on the Python workers' path (on the
    hosts of a cluster, ship the app with ``--py-files`` too: docs/deployment.md); the
    database password for executors in their environment (``PGPASSWORD``, which libpq reads
    and Spark's UI masks), so that task closures carry the URL without it; and Spark's Kafka
    source from the jars setup fetched, when the settings name no jars or packages of their
    own."""
    from eventfold.projections.run_settings import EXECUTOR_PASSWORD

    conf = dict(settings.spark_settings)
    # Python workers import the app's module to run its folds (pickled by reference).
    conf[EXECUTOR_PYTHONPATH] = python_path(app_directories(settings.app_dir),
                                            conf.get(EXECUTOR_PYTHONPATH))
    _, password = split_password(settings.database_url) if settings.database_url else ("", "")
    if password:
        conf.setdefault(EXECUTOR_PASSWORD, password)
    local_jars = spark_kafka_jars()
    if local_jars and not {"spark.jars", "spark.jars.packages"} & conf.keys():
        conf["spark.jars"] = ",".join(str(jar) for jar in local_jars)
    return conf


def _seconds_or_forever(retention: str) -> float | None:
    milliseconds = retention_ms(retention)
    return None if milliseconds < 0 else milliseconds / 1000


def output_topic_configs(settings: Settings) -> OutputTopicConfigs:
    """``EVENTFOLD_KTABLE_TOPIC_CONFIG``, ``EVENTFOLD_DEAD_LETTER_RETENTION`` and
    ``EVENTFOLD_DERIVED_EVENT_RETENTION``, as the projections' topics take them."""
    try:
        ktable = parse_topic_config(settings.ktable_topic_config)
    except ValueError as exc:
        raise ConfigError(f"EVENTFOLD_KTABLE_TOPIC_CONFIG: {exc}") from None
    return OutputTopicConfigs(ktable, retention_ms(settings.dead_letter_retention),
                              retention_ms(settings.derived_event_retention))


def _with_observability(app: FastAPI, settings: Settings, api: str,
                        request_log: bool) -> FastAPI:
    """The request log, then Prometheus metrics at ``/metrics`` (``EVENTFOLD_METRICS``),
    outermost so that they time everything."""
    if request_log:
        app.add_middleware(RequestLog)
    app.add_middleware(CorrelationIds)
    if settings.metrics:
        app.add_route("/metrics", metrics_endpoint, include_in_schema=False)
        app.add_middleware(HttpMetrics, api=api)
    return app


def app_of(settings: Settings) -> Eventfold:
    """The application ``EVENTFOLD_APP`` names, from ``EVENTFOLD_APP_DIR`` or the working
    directory first."""
    return load_app(settings.app, settings.app_dir)


def load_app(spec: str, app_dir: str | Path = "") -> Eventfold:
    """Import ``module:attribute`` (from the working directory and ``app_dir`` first, as
    uvicorn does: ``eventfold.loading``) and check that it is an Eventfold application."""
    try:
        module, attribute = import_app_module(spec, app_dir)
        app = getattr(module, attribute)
    except AppNotFound as exc:
        raise ConfigError(f"cannot load the application: {exc}") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load EVENTFOLD_APP={spec!r}: {exc}") from exc
    if not isinstance(app, Eventfold):
        raise ConfigError(f"EVENTFOLD_APP={spec!r} is a {type(app).__name__}, not an Eventfold")
    return app
