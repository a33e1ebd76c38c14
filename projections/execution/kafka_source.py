"""A Spark Python Data Source over Kafka topics, reading through confluent-kafka.

Format name ``eventfold-kafka``. Options:

- ``bootstrap.servers`` (required), ``topics`` (comma-separated, required), ``kafka.*``:
  client settings (``kafka.security.protocol``...; see ``outbox.connection``)
- ``max_rows_per_batch``: cap on rows in one micro-batch (default: no cap)
- ``starting_offsets``: ``earliest`` (default), ``latest``, or offsets as JSON
- ``ending_offsets``: offsets as JSON at which an ``availableNow`` run stops (a replay catching
  up to the live version's position); partitions not named are read to their end
- ``rows``: ``records`` (default): one row per message; ``ranges``: the source is an offset
  planner: each planned range (``topic, partition, start, end``) is repeated once per record
  it covers, so Spark's query progress counts records, and the reader of the batch reads the
  ranges itself (the projection runner: its tasks read and fold a range in one pass, where
  the records handed over by Spark would cross into the JVM and back)

Each micro-batch covers one offset range per partition, and each range is one Spark input
partition. Offsets are ``{"topic": {"partition": next_offset}}``; Spark keeps them in its
checkpoint, so a restarted query resumes where the last committed batch ended. Batch reads
(``spark.read``) cover everything from the beginning to the current end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
from confluent_kafka import Message
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner, iter_range
from eventfold.projections.execution.executor import executor_task
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eventfold.contract import PartitionKey, flatten_offsets, nest_offsets

if TYPE_CHECKING:
    from eventfold.projections.outcome import RawRecords

# What tasks read with (decoding, the worker's consumer) is imported where they read, not
# here: Spark runs this module in a planner process per streaming query too, which plans
# offset ranges only and need not load pandas, SQLAlchemy and psycopg.

FORMAT_NAME = "eventfold-kafka"
SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("key", StringType(), True),
    StructField("value", StringType(), True),
    StructField("timestamp", TimestampType(), True),
])
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("key", pa.string()),
    pa.field("value", pa.string()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])
RANGE_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("start", LongType(), False),
    StructField("end", LongType(), False),
])
RANGE_ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("start", pa.int64(), nullable=False),
    pa.field("end", pa.int64(), nullable=False),
])
READ_CHUNK = 5_000
RANGE_ROWS_CHUNK = 100_000
READ_TIMEOUT_S = 120.0



@dataclass(frozen=True)
class OffsetRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class KafkaSlice:
    """One partition's offset range of a micro-batch, read by the executor task that decodes
    (or folds) it."""

    kafka: KafkaConnection
    range: OffsetRange

    @property
    def rows(self) -> int:
        return self.range.end - self.range.start

    def record_chunks(self, rows: int) -> Iterator[RawRecords]:
        """The range's records, about ``rows`` at a time, for a fold in Python."""
        topic, partition = self.range.topic, self.range.partition
        pending: list[Message] = []
        for messages in _messages(self.kafka, self.range):
            pending.extend(messages)
            if len(pending) >= rows:
                yield _raw(topic, partition, pending)
                pending = []
        if pending:
            yield _raw(topic, partition, pending)


def _raw(topic: str, partition: int, messages: list[Message]) -> RawRecords:
    from eventfold.projections.outcome import RawRecords

    return RawRecords(topic, partition, cast(list[int], [m.offset() for m in messages]),
                      _keys([m.key() for m in messages]), [m.value() for m in messages])


def _keys(keys: list[bytes | None]) -> list[str | bytes | None]:
    """The keys as text; one that is not UTF-8 stays bytes (its record is a dead letter)."""
    try:
        return [None if key is None else key.decode() for key in keys]
    except UnicodeDecodeError:
        return [None if key is None else _utf8_or_bytes(key) for key in keys]


def _utf8_or_bytes(key: bytes) -> str | bytes:
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key


def read_partition(kafka: KafkaConnection, partition: InputPartition,
                   ranges: bool) -> Iterator[pa.RecordBatch]:
    """An input partition's rows: its range, or the range's messages."""
    assert isinstance(partition, OffsetRange)
    if not ranges:
        return read_range(kafka, partition)
    return range_rows(partition)


def range_rows(rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The range as one row per record it covers, every row naming the whole range: Spark's
    query progress counts a batch's input rows, so it counts its records. No record is read,
    and a row is a few bytes of Arrow."""
    columns = (pa.scalar(rng.topic, pa.string()), pa.scalar(rng.partition, pa.int32()),
               pa.scalar(rng.start, pa.int64()), pa.scalar(rng.end, pa.int64()))
    for first in range(rng.start, rng.end, RANGE_ROWS_CHUNK):
        rows = min(RANGE_ROWS_CHUNK, rng.end - first)
        yield pa.RecordBatch.from_arrays([pa.repeat(value, rows) for value in columns],
                                         schema=RANGE_ARROW_SCHEMA)


def planned_ranges(batch: DataFrame) -> list[OffsetRange]:
    """The ranges a ``rows=ranges`` batch's DataFrame holds (each once)."""
    rows = batch.distinct().collect()
    return [OffsetRange(r["topic"], r["partition"], r["start"], r["end"]) for r in rows]


def read_range(kafka: KafkaConnection, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Every message of ``rng`` as Arrow batches."""
    for messages in _messages(kafka, rng):
        yield _to_arrow(messages, rng)


def _messages(kafka: KafkaConnection, rng: OffsetRange) -> Iterator[list[Message]]:
    from eventfold.projections.execution.worker import consumer, drop_consumer

    if rng.end <= rng.start:
        return
    reader = consumer(kafka)
    try:
        yield from iter_range(reader, (rng.topic, rng.partition), rng.start, rng.end,
                              READ_TIMEOUT_S, chunk=READ_CHUNK)
    except BaseException:
        drop_consumer(kafka)
        raise
    reader.unassign()


def _to_arrow(messages: list[Message], rng: OffsetRange) -> pa.RecordBatch:
    # Bytes go to Arrow as they are and are validated as UTF-8 there, in C, not per message;
    # bytes that are not UTF-8 are read with replacement characters rather than fail the job.
    from eventfold.projections.execution.decode import text_column

    count = len(messages)
    return pa.RecordBatch.from_arrays([
        pa.array([rng.topic] * count, pa.string()),
        pa.array([rng.partition] * count, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        text_column([m.key() for m in messages])[0],
        text_column([m.value() for m in messages])[0],
        pa.array([m.timestamp()[1] * 1000 for m in messages], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA)


class KafkaDataSource(DataSource):
    format_name = FORMAT_NAME

    @classmethod
    def name(cls) -> str:
        return cls.format_name

    @classmethod
    def registered_for(cls, spark: SparkSession, query: str) -> str:
        """Register this source under a format name of one streaming query's own, and return
        it for the query to read. Spark's runner of a Python streaming source writes into the
        registered function's environment map whenever a query starts; another query whose
        task holding that same map is being serialized at that moment fails with
        ``java.io.OptionalDataException`` (queries started together in a host kept failing
        so). A registration per query gives each query a map of its own."""
        name = f"{FORMAT_NAME}-{re.sub(r'[^a-z0-9]+', '-', query.lower())}"
        spark.dataSource.register(type(f"{cls.__name__}ForQuery", (cls,), {"format_name": name}))
        return name

    def schema(self) -> StructType:
        return RANGE_SCHEMA if self._ranges() else SCHEMA

    def _ranges(self) -> bool:
        rows = str(self.options.get("rows", "records"))
        if rows not in ("records", "ranges"):
            raise ValueError(f"the {FORMAT_NAME} source's option rows is 'records' or "
                             f"'ranges', not {rows!r}")
        return rows == "ranges"

    def _required(self, key: str) -> str:
        value = self.options.get(key)
        if not value:
            raise ValueError(f"the {FORMAT_NAME} source needs the option {key!r}")
        return str(value)

    def _connection(self) -> KafkaConnection:
        self._required("bootstrap.servers")
        return KafkaConnection.from_spark_options(
            {k: str(v) for k, v in self.options.items()})

    def _topics(self) -> list[str]:
        return [t.strip() for t in self._required("topics").split(",") if t.strip()]

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(
            kafka=self._connection(),
            topics=self._topics(),
            max_rows_per_batch=int(self.options.get("max_rows_per_batch", 0)),
            starting_offsets=str(self.options.get("starting_offsets", "earliest")),
            ending_offsets=flatten_offsets(json.loads(self.options.get("ending_offsets", "{}"))),
            ranges=self._ranges(),
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self._connection(), self._topics(), self._ranges())


class KafkaBatchReader(DataSourceReader):
    def __init__(self, kafka: KafkaConnection, topics: list[str], ranges: bool = False) -> None:
        self.kafka = kafka
        self.topics = topics
        self.ranges = ranges

    def partitions(self) -> list[InputPartition]:
        planner = OffsetPlanner(self.kafka)
        try:
            found = planner.partitions(self.topics)
            begin, end = planner.beginning_offsets(found), planner.end_offsets(found)
        finally:
            planner.close()
        ranges = [OffsetRange(t, p, begin[(t, p)], end[(t, p)]) for t, p in found]
        return [r for r in ranges if r.end > r.start] or [OffsetRange("", 0, 0, 0)]

    @executor_task
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.kafka, partition, self.ranges)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self, kafka: KafkaConnection, topics: list[str], max_rows_per_batch: int,
        starting_offsets: str, ending_offsets: Mapping[PartitionKey, int] | None = None,
        ranges: bool = False,
    ) -> None:
        self.kafka = kafka
        self.ranges = ranges
        self.topics = topics
        self.max_rows_per_batch = max_rows_per_batch
        self.starting_offsets = starting_offsets
        self.ending_offsets = dict(ending_offsets or {})
        self._planner: OffsetPlanner | None = None
        self._available_now_end: dict[PartitionKey, int] | None = None

    @property
    def planner(self) -> OffsetPlanner:
        if self._planner is None:
            self._planner = OffsetPlanner(self.kafka)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        found = self.planner.partitions(self.topics)
        if self.starting_offsets.startswith("{"):
            # Resume from offsets a sink committed (its checkpoint outlived Spark's).
            committed = flatten_offsets(json.loads(self.starting_offsets))
            beginning = self.planner.beginning_offsets(found)
            return nest_offsets({k: max(committed.get(k, 0), beginning[k]) for k in found})
        if self.starting_offsets == "latest":
            return nest_offsets(self.planner.end_offsets(found))
        return nest_offsets(self.planner.beginning_offsets(found))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows_per_batch > 0:
            return ReadMaxRows(self.max_rows_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        end = self._current_end()
        self._available_now_end = {k: min(v, self.ending_offsets.get(k, v)) for k, v in end.items()}

    def _current_end(self) -> dict[PartitionKey, int]:
        return self.planner.end_offsets(self.planner.partitions(self.topics))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = flatten_offsets(start)
        end = dict(self._available_now_end) if self._available_now_end else self._current_end()
        for key in end:
            begin.setdefault(key, 0)  # a partition that appeared since the last batch
        if isinstance(limit, ReadMaxRows):
            end = cap_rows(begin, end, limit.max_rows)
        return nest_offsets({k: max(end.get(k, v), v) for k, v in begin.items()})

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return nest_offsets(self._current_end())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = flatten_offsets(start), flatten_offsets(end)
        ranges = [OffsetRange(t, p, begin.get((t, p), 0), off) for (t, p), off in finish.items()]
        return [r for r in ranges if r.end > r.start]

    @executor_task
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.kafka, partition, self.ranges)

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy for read(); the planner's consumer stays on the driver.
        return {**self.__dict__, "_planner": None}

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint and the sinks' own commits."""

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None


def cap_rows(
    begin: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int], max_rows: int
) -> dict[PartitionKey, int]:
    """Share ``max_rows`` fairly over partitions with data; leftovers go to the busier ones."""
    backlog = {k: max(end.get(k, b) - b, 0) for k, b in begin.items()}
    allowed = dict.fromkeys(backlog, 0)
    remaining = max_rows
    while remaining > 0:
        hungry = [k for k in backlog if backlog[k] > allowed[k]]
        if not hungry:
            break
        share = max(remaining // len(hungry), 1)
        for key in hungry:
            take = min(share, backlog[key] - allowed[key], remaining)
            allowed[key] += take
            remaining -= take
            if remaining == 0:
                break
    return {k: begin[k] + allowed[k] for k in begin}
