"""The SparkSession for projection jobs: any master, our Kafka data source registered."""

from __future__ import annotations

import os
import sys

from eventfold.projections.kafka_source import KafkaDataSource
from pyspark.sql import SparkSession


def spark_session(master: str = "local[2]", app_name: str = "eventfold",
                  extra_conf: dict[str, str] | None = None,
                  log_level: str = "ERROR") -> SparkSession:
    """Build (or get) the session. Under spark-submit the submitted master wins."""
    # Executors must run the interpreter that has Eventfold and its dependencies installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(log_level)
    session.dataSource.register(KafkaDataSource)
    return session
