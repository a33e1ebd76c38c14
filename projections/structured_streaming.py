"""The second way of driving a streaming run (``EVENTFOLD_STREAMING_DRIVER=
structured_streaming``): a Spark Structured Streaming query over Spark's built-in Kafka source
(``spark-sql-kafka-0-10`` on the classpath), whose micro-batches the runner folds
(``ProjectionRunner.process_records``). It keeps a Spark checkpoint of its own; the store's
checkpoint still decides what is folded. ``stream_thread`` is the default driver."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from eventfold.contract import PartitionKey, nest_offsets
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.definition.projection import Projection
from eventfold.projections.run_settings import RunnerSettings


class MicroBatches(Protocol):
    """What the query feeds: a projection's runner (``runner.ProjectionRunner``)."""

    @property
    def spark(self) -> SparkSession: ...
    @property
    def projection(self) -> Projection: ...
    @property
    def version(self) -> int: ...
    @property
    def settings(self) -> RunnerSettings: ...
    @property
    def checkpoint_dir(self) -> Path: ...
    @property
    def process_records(self) -> Callable[[DataFrame, int], None]: ...


def start_query(runner: MicroBatches, committed: Mapping[PartitionKey, int], once: bool
                ) -> StreamingQuery:
    """The query, started from ``committed`` (the store's offsets), each micro-batch folded by
    ``runner.process_records``."""
    writer = (
        _kafka_source(runner, committed).writeStream
        .queryName(f"{runner.projection.name}_v{runner.version}")
        .option("checkpointLocation", str(runner.checkpoint_dir))
        .foreachBatch(runner.process_records)
    )
    return (writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=runner.settings.trigger_interval)).start()


def _kafka_source(runner: MicroBatches, committed: Mapping[PartitionKey, int]) -> DataFrame:
    """Spark's built-in Kafka source: each batch's rows are its records."""
    kafka, projection = runner.settings.kafka, runner.projection
    planner = OffsetPlanner(kafka)
    try:
        partitions = planner.partitions(projection.source_topics)
    finally:
        planner.close()
    # Spark wants every partition named: -2 is "earliest" in its offsets JSON.
    starting = nest_offsets({key: committed.get(key, -2) for key in partitions})
    return (
        runner.spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .options(**{f"kafka.{k}": v for k, v in kafka.java_config().items()})
        .option("subscribe", ",".join(projection.source_topics))
        .option("startingOffsets", json.dumps(starting))
        .option("maxOffsetsPerTrigger", str(runner.settings.max_rows_per_batch))
        .option("failOnDataLoss", str(not runner.settings.allow_data_loss).lower())
        .load()
    )
