"""Reading a batch's Kafka offset ranges in the executor tasks that fold them, through
confluent-kafka: each task reads whole partitions' ranges, as a Kafka Streams task does, and
decodes (or folds) the records where it read them, without handing them through the JVM.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from eventfold.contract import PartitionKey
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import iter_range

if TYPE_CHECKING:
    from eventfold.projections.outcome import RawRecords

READ_CHUNK = 5_000
READ_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class OffsetRange:
    """Records ``start`` (inclusive) to ``end`` (exclusive) of one topic partition."""

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

    kind, first_ms = messages[0].timestamp()
    return RawRecords(topic, partition, cast(list[int], [m.offset() for m in messages]),
                      _keys([m.key() for m in messages]), [m.value() for m in messages],
                      None if kind == TIMESTAMP_NOT_AVAILABLE else first_ms)


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
