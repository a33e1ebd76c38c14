"""Reading Kafka topics: partitions, their offset ranges, whole-topic reads.

Offsets of compacted or transactional topics have gaps, so a range is read until its end
offset or the partition's end, never for end-start messages.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import TopicMetadata

from eventfold.contract import PartitionKey
from eventfold.outbox.connection import KafkaConnection

log = logging.getLogger(__name__)



RANGE_READ_FETCH_WAIT_MS = 10
TAILING_FETCH_WAIT_MS = 500
GROUP_PROGRESS_EVERY_S = 1.0
"""How stale the progress standard lag tools show of a streaming reader may get."""


def consumer_config(kafka: KafkaConnection, **overrides: Any) -> dict[str, Any]:
    """Settings for assign()-based readers: no group membership, no offset commits."""
    return kafka.client_config(**{
        "group.id": f"eventfold-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "log.connection.close": False,
        # A reader is re-assigned for every range it reads. With the default (1 s), a range
        # read after one that filled the prefetch queue waited a second for its first fetch
        # (docs/benchmarks.md, "Range readers' fetch settings").
        "fetch.queue.backoff.ms": 10,
        # A consumer has one fetch in flight per broker, and a re-assigned one waits for it:
        # with the default 500 ms long poll, each range read after the first waited out the
        # fetch still parked at the previous range's end (docs/benchmarks.md). A long poll
        # never delays data (fetch.min.bytes answers as soon as there is any); only readers
        # that tail one assignment for long (KTable views) restore it.
        "fetch.wait.max.ms": RANGE_READ_FETCH_WAIT_MS,
        **overrides,
    })


def consume_available(consumer: Consumer, max_messages: int, wait_s: float) -> list[Message]:
    """Up to ``max_messages`` messages, returning as soon as any are there.

    ``Consumer.consume(n, timeout)`` blocks for the whole timeout unless ``n`` messages arrive,
    which would add the timeout to every small read; poll for the first one instead.
    """
    first = consumer.poll(wait_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(num_messages=max_messages - 1, timeout=0)]


class GroupProgress:
    """A reader's progress committed to a Kafka consumer group it never joins, so that
    standard lag tools (``kafka-consumer-groups --describe --group G``, exporters that read
    group offsets) show how far behind it is. Advisory only: the reader's own checkpoint, kept
    elsewhere, is what it resumes from; so it is committed at most every ``every_s`` seconds
    and when the reader closes, not a round trip at every batch."""

    def __init__(self, kafka: KafkaConnection, group_id: str,
                 every_s: float = GROUP_PROGRESS_EVERY_S) -> None:
        self.group_id = group_id
        self._consumer = Consumer(consumer_config(kafka, **{"group.id": group_id}))
        self._every_s = every_s
        self._due = 0.0
        self._pending: dict[PartitionKey, int] = {}

    def commit(self, offsets: Mapping[PartitionKey, int]) -> None:
        """Note ``offsets``; commit what is noted if the last commit is ``every_s`` old."""
        self._pending.update(offsets)
        if time.monotonic() >= self._due:
            self._commit_pending()

    def _commit_pending(self) -> None:
        """One round trip; a failure is logged and never fails the reader."""
        if not self._pending:
            return
        self._due = time.monotonic() + self._every_s
        offsets, self._pending = self._pending, {}
        try:
            self._consumer.commit(offsets=[TopicPartition(t, p, o)
                                           for (t, p), o in sorted(offsets.items())],
                                  asynchronous=False)
        except KafkaException as exc:
            log.warning("committing progress to group %s: %s", self.group_id, exc)

    def close(self) -> None:
        try:
            self._commit_pending()
        finally:
            self._consumer.close()


_ELECTION_ERRORS = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE})
"""What a partition answers while its leader is being elected (a broker restarted, a leader
moved; a restarted broker behind the client's metadata answers with the epoch errors):
asked again, not failed on."""
_RETRY_PAUSE_S = 0.1
_EARLIEST, _LATEST = -2, -1
"""ListOffsets' special timestamps."""
T = TypeVar("T")


class OffsetPlanner:
    """Lists partitions of topics and their first and end offsets, asking again while a
    partition's leader is being elected (up to ``timeout_s``)."""

    def __init__(self, kafka: KafkaConnection, timeout_s: float = 10) -> None:
        # read_uncommitted: ListOffsets answers the high watermark, not the last stable offset
        self._consumer = Consumer(consumer_config(kafka, **{
            "isolation.level": "read_uncommitted"}))
        self._timeout_s = timeout_s

    def partitions(self, topics: Iterable[str]) -> list[PartitionKey]:
        found: list[PartitionKey] = []
        for topic in topics:
            try:
                metadata = self._while_electing(partial(self._metadata, topic))
            except KafkaException:
                metadata = None  # still electing at the timeout: nothing to read now
            if metadata is None:
                continue  # not created yet: it has nothing to read
            found.extend((topic, p) for p in sorted(metadata.partitions))
        return found

    def beginning_offsets(self, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        return self._list_offsets(partitions, _EARLIEST)

    def offsets_at(self, partitions: Iterable[PartitionKey], timestamp_ms: int
                   ) -> dict[PartitionKey, int]:
        """Each partition's first offset whose timestamp is ``timestamp_ms`` or later (by the
        broker's time index), its end offset where there is none."""
        partitions = list(partitions)
        found = self._list_offsets(partitions, max(0, timestamp_ms))
        ends = self.end_offsets(key for key, offset in found.items() if offset < 0)
        return {key: ends.get(key, offset) for key, offset in found.items()}

    def end_offsets(self, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """The high watermarks: the offset the next message of each partition will have."""
        return self._list_offsets(partitions, _LATEST)

    def _list_offsets(self, partitions: Iterable[PartitionKey], which: int
                      ) -> dict[PartitionKey, int]:
        """Every partition's earliest or latest offset, in one ListOffsets request per broker
        (the client groups the partitions by leader)."""
        wanted = [TopicPartition(topic, partition, which) for topic, partition in partitions]
        if not wanted:
            return {}

        def ask() -> dict[PartitionKey, int]:
            found = self._consumer.offsets_for_times(wanted, timeout=self._timeout_s)
            for answer in found:
                if answer.error is not None:
                    raise KafkaException(answer.error)
            return {(answer.topic, answer.partition): answer.offset for answer in found}
        return self._while_electing(ask)

    def _metadata(self, topic: str) -> TopicMetadata | None:
        metadata: TopicMetadata | None = self._consumer.list_topics(
            topic, timeout=self._timeout_s).topics.get(topic)
        if metadata is None or metadata.error is None:
            return metadata
        if metadata.error.code() in _ELECTION_ERRORS:
            raise KafkaException(metadata.error)
        return None

    def _while_electing(self, ask: Callable[[], T]) -> T:
        """``ask()``, asked again while the answer is an election error, up to the timeout."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                return ask()
            except KafkaException as exc:
                if (exc.args[0].code() not in _ELECTION_ERRORS
                        or time.monotonic() > deadline):
                    raise
                time.sleep(_RETRY_PAUSE_S)

    def close(self) -> None:
        self._consumer.close()


def read_messages(kafka: KafkaConnection, topic: str, timeout_s: float = 120,
                  last: int | None = None) -> list[tuple[int, int, str | None, str | None]]:
    """Every message on ``topic`` now (with ``last``: only those among each partition's
    ``last`` offsets), as (partition, offset, key, value), in offset order per partition: what
    a consumer from the beginning sees."""
    return list(iter_messages(kafka, topic, timeout_s, last))


def iter_messages(kafka: KafkaConnection, topic: str, timeout_s: float = 120,
                  last: int | None = None, since_ms: int | None = None,
                  until_ms: int | None = None
                  ) -> Iterator[tuple[int, int, str | None, str | None]]:
    """``read_messages``, a chunk at a time: for topics larger than memory. With
    ``since_ms``, each partition is read from its first message of that time or later (found
    by the broker's time index, not by reading); with ``until_ms``, up to its first message
    past that time."""
    planner = OffsetPlanner(kafka)
    try:
        partitions = planner.partitions([topic])
        begin = (planner.beginning_offsets(partitions) if since_ms is None
                 else planner.offsets_at(partitions, since_ms))
        end = planner.end_offsets(partitions)
    finally:
        planner.close()
    if last is not None:
        begin = {key: max(first, end[key] - last) for key, first in begin.items()}
    # A bounded prefetch (librdkafka's default queues up to 64 MB): the caller streams.
    consumer = Consumer(consumer_config(kafka, **{"queued.max.messages.kbytes": 16 * 1024}))
    try:
        for key in partitions:
            if end[key] > begin[key]:
                yield from _partition_messages(consumer, key, begin[key], end[key], timeout_s,
                                               until_ms)
    finally:
        consumer.close()


def _partition_messages(consumer: Consumer, partition: PartitionKey, start: int, end: int,
                        timeout_s: float, until_ms: int | None
                        ) -> Iterator[tuple[int, int, str | None, str | None]]:
    for chunk in iter_range(consumer, partition, start, end, timeout_s):
        for message in chunk:
            if until_ms is not None and message.timestamp()[1] > until_ms:
                return
            yield partition[1], offset_of(message), _text(message.key()), _text(message.value())


def read_message(kafka: KafkaConnection, topic: str, offset: int, partition: int = 0,
                 timeout_s: float = 30) -> tuple[int, int, str | None, str | None] | None:
    """The message at ``offset`` of one partition, as ``read_messages`` gives it, read from
    there and nowhere else; None when there is none (before the partition's first offset,
    past its end, or compacted away)."""
    consumer = Consumer(consumer_config(kafka))
    try:
        first, end = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                    timeout=timeout_s)
        if not first <= offset < end:
            return None
        for chunk in iter_range(consumer, (topic, partition), offset, offset + 1, timeout_s):
            for message in chunk:
                if offset_of(message) == offset:
                    return partition, offset, _text(message.key()), _text(message.value())
        return None
    finally:
        consumer.close()


def partition_ends(consumer: Consumer, timeout_s: float = 10.0) -> dict[PartitionKey, int]:
    """Where each partition assigned to ``consumer`` ends now, as the broker answers (one
    request per partition: for a look now and then, not for every message)."""
    return {(tp.topic, tp.partition): consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=timeout_s)[1]
            for tp in consumer.assignment()}


def offset_of(message: Message) -> int:
    """A consumed message's offset (the client's type says optional: only a message being
    produced has none)."""
    return cast(int, message.offset())


def _text(raw: bytes | None) -> str | None:
    """Text of a key or value; bytes that are not UTF-8 (a poison message) keep replacement
    characters, so a reader of the whole topic sees them instead of failing."""
    return raw.decode("utf-8", "replace") if raw is not None else None


def _end_of_partition(messages: list[Message], partition: PartitionKey) -> int:
    """The offset a partition-EOF event among ``messages`` reports; any other error raises."""
    position = 0
    for message in messages:
        error = message.error()
        if error is None:
            continue
        if error.code() != KafkaError._PARTITION_EOF:
            raise RuntimeError(f"reading {partition}: {error}")
        position = max(position, offset_of(message))
    return position


def iter_range(consumer: Consumer, partition: PartitionKey, start: int, end: int,
               stuck_timeout_s: float = 120, chunk: int = 10_000) -> Iterator[list[Message]]:
    """The messages of offsets [start, end) of one partition, in chunks.

    Offsets may have gaps (compaction, transaction markers), so the read ends at ``end`` or at
    partition EOF past it, never after end-start messages. Fails if no progress is made for
    ``stuck_timeout_s``.
    """
    consumer.assign([TopicPartition(partition[0], partition[1], start)])
    position, deadline = start, time.monotonic() + stuck_timeout_s
    while position < end:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{partition}: no progress at offset {position} of {end} "
                               f"for {stuck_timeout_s:.0f} s")
        batch = consume_available(consumer, max(1, min(chunk, end - position)), 1.0)
        found = [message for message in batch if message.error() is None]
        if len(found) < len(batch):
            position = max(position, _end_of_partition(batch, partition))
        if found:
            # One partition's messages come in offset order: its ends tell whether any is
            # outside the range (prefetched for an earlier assignment, or past ``end``).
            first, last = offset_of(found[0]), offset_of(found[-1])
            if first < start or last >= end:
                found = [m for m in found if start <= offset_of(m) < end]
            position = max(position, last + 1)
        if found:
            deadline = time.monotonic() + stuck_timeout_s
            yield found
