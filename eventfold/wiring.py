"""Settings translated into what each package takes: the outbox connector's spec and
operations, a Spark session and its configuration, a runner's settings, the projections'
topic configs. Functions of the settings alone, so that the runtime (``runtime``) and the
operators' views (``status``, ``dashboard``, ``run_observer``) share them without importing
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventfold.config import ConfigError, Settings
from eventfold.contract import retention_ms, split_password
from eventfold.loading import app_directories, python_path
from eventfold.outbox.connector import ConnectClient, OutboxConnectorSpec
from eventfold.outbox.design import OutboxDesign
from eventfold.outbox.operations import ConnectorOperations
from eventfold.outbox.topics import TopicAdmin, parse_topic_config
from eventfold.projections.state.topics import OutputTopicConfigs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.projections.run_settings import RunnerSettings

EXECUTOR_PYTHONPATH = "spark.executorEnv.PYTHONPATH"


def connector_spec(settings: Settings) -> OutboxConnectorSpec:
    """One outbox table, one connector: every app on a database applies the same one."""
    return OutboxConnectorSpec(database_url=settings.database_url_for_connect,
                               name=settings.connector_name,
                               slot_name=settings.connector_name.replace("-", "_"),
                               password_ref=settings.connect_database_password,
                               design=OutboxDesign(settings.outbox_design))


def connector_operations(settings: Settings) -> ConnectorOperations:
    return ConnectorOperations(ConnectClient(settings.connect_url), connector_spec(settings),
                               TopicAdmin(settings.kafka, settings.replication))


def spark_session(settings: Settings, app_name: str) -> SparkSession:
    from eventfold.projections.execution.spark import spark_session as start

    return start(settings.spark_master, app_name=app_name, extra_conf=spark_conf(settings))


def spark_conf(settings: Settings) -> dict[str, str]:
    """``EVENTFOLD_SPARK_CONF``; the app's directories on the Python workers' path (on the
    hosts of a cluster, ship the app with ``--py-files`` too: docs/deployment.md); the
    database password for executors in their environment (``PGPASSWORD``, which libpq reads
    and Spark's UI masks), so that task closures carry the URL without it."""
    from eventfold.projections.run_settings import EXECUTOR_PASSWORD

    conf = dict(settings.spark_settings)
    # Python workers import the app's module to run its folds (pickled by reference).
    conf[EXECUTOR_PYTHONPATH] = python_path(app_directories(settings.app_dir),
                                            conf.get(EXECUTOR_PYTHONPATH))
    _, password = split_password(settings.database_url) if settings.database_url else ("", "")
    if password:
        conf.setdefault(EXECUTOR_PASSWORD, password)
    return conf


def runner_settings(settings: Settings, max_rows: int | None = None) -> RunnerSettings:
    """What a projection runner or a replay (``max_rows``: its batch bound) runs with."""
    from eventfold.projections.run_settings import RunnerSettings

    return settings.fill(
        RunnerSettings, max_rows_per_batch=max_rows or settings.max_rows_per_batch,
        topic_configs=output_topic_configs(settings),
        deleted_key_retention_s=_seconds_or_forever(settings.deleted_key_retention))


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
