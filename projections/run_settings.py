"""What one projection's run is configured with (``RunnerSettings``: the composition root
makes it from the app's ``Settings``), and how the executors reach the database."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from eventfold.contract import split_password
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.topics import Replication
from eventfold.projections.execution.limits import (
    DRIVER_BATCH_MAX_ROWS,
    FAIR_BATCH_ROWS,
    REPLAY_REST_RATIO,
    STREAMING_MAX_ROWS,
)
from eventfold.projections.state.lease import LEASE_S
from eventfold.projections.state.topics import OutputTopicConfigs

log = logging.getLogger(__name__)

EXECUTOR_PASSWORD = "spark.executorEnv.PGPASSWORD"
"""The Spark setting that gives executors the database password (libpq reads ``PGPASSWORD``);
Spark masks it in its UI and logs."""
_EXECUTOR_CREDENTIALS = (EXECUTOR_PASSWORD, "spark.executorEnv.PGPASSFILE",
                         "spark.executorEnv.PGSERVICEFILE")


@dataclass(frozen=True)
class RunnerSettings:
    kafka: KafkaConnection
    database_url: str
    trigger_interval: str = "100 milliseconds"
    max_rows_per_batch: int = STREAMING_MAX_ROWS
    fair_batch_rows: int = FAIR_BATCH_ROWS
    """The most records a live batch takes while another live projection of the process
    follows its topics closely (``execution.turns``; 0: no limit)."""
    replay_rest_ratio: float = REPLAY_REST_RATIO
    """How long a replay's tasks rest for each second they work while a live projection of the
    process follows its topics (``execution.turns``; 0: never)."""
    driver_batch_max_rows: int = DRIVER_BATCH_MAX_ROWS
    """A batch of at most this many records, of a fold or aggregation in place, runs on the
    driver instead of as a Spark job (0: every batch is a Spark job)."""
    topic_configs: OutputTopicConfigs = field(default_factory=OutputTopicConfigs)
    """Of the KTable topics beyond ``cleanup.policy=compact`` (segment size, dirty ratio,
    compaction lag...), and the retention of dead letters and derived events."""
    replication: Replication = field(default_factory=Replication)
    """Replication of the KTable, dead-letter and derived-event topics this projection
    creates."""
    allow_data_loss: bool = False
    """Go on when retention deleted events this projection never read (else it stops)."""
    metrics: bool = True
    """Record each batch in the Prometheus metrics (``projections.metrics``)."""
    ktable_retire_wait_s: float = 60.0
    """How long a replay waits for read APIs to leave the old KTable topic before deleting
    it (later runs delete it once they have)."""
    projection_stall_s: float = 120.0
    """A stream thread whose look or batch goes on longer than this (plus three times its
    longest batch) is stalled: its host cancels its jobs and starts it again."""
    writer_lease_s: float = LEASE_S
    """How long the active version's writer lease lasts unrenewed (``state.lease``)."""
    deleted_key_retention_s: float | None = None
    """How long the row of a deleted key stays (with its version guard) before the active
    version prunes it (None: forever; an app's ``Settings.deleted_key_retention`` holds the
    default)."""


def executor_database_url(spark: SparkSession, database_url: str) -> str:
    """The URL tasks connect with: without its password when executors get credentials from
    their environment (``EXECUTOR_PASSWORD``, or a libpq password or service file), so that
    the password is not inside every pickled task."""
    url, password = split_password(database_url)
    if not password:
        return url
    conf = spark.sparkContext.getConf()
    if any(conf.contains(key) for key in _EXECUTOR_CREDENTIALS):
        return url
    log.warning("the database password reaches executors inside each task; set %s (the CLI "
                "does) or a libpq password file on executor hosts", EXECUTOR_PASSWORD)
    return database_url
