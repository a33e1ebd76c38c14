"""The producer of a projection version's records (KTable rows, dead letters, derived
events): each with a delivery report, so that ``flush`` raises ``DeliveryFailed`` if the broker
refused any, and the batch which produced them does not commit and runs again. The tasks of a
batch produce what they fold; the batch's commit produces only the letters it must decide on
(those of keys parked before the batch, ``store.ReadModelStore.commit``)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from eventfold.contract import (
    KTABLE_MOVED_HEADER,
    KTABLE_POSITION_HEADER,
    KTABLE_VERSION_HEADER,
    PartitionKey,
    trace_of,
)
from eventfold.contract.partitioner import partition_for
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config, iter_range, offset_of
from eventfold.projections.definition.projection import Projection
from eventfold.projections.outcome import DeadLetter, Emission, KeyState

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 60.0
_POLL_EVERY = 1_000
_MAX_ORIGINALS_SPAN = 100_000
"""Dead letters of one partition further apart than this keep the values the fold rebuilt
(reading the whole span back would cost more than the metadata is worth)."""
PRODUCER_SETTINGS = {"enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4",
                     "log.connection.close": False,
                     # Java's partitioner (murmur2), as Debezium's and Kafka Streams' clients
                     # use: a key lands where a Java consumer of the topic expects it
                     # (co-partitioned joins, interactive queries' key routing).
                     "partitioner": "murmur2_random",
                     # The callback of each record runs only for a failure: a Python call per
                     # delivered record cost more than producing it.
                     "delivery.report.only.error": True}


class DeliveryFailed(RuntimeError):
    """A KTable row, dead letter or derived event was refused by the broker: the batch must
    not commit."""


def new_producer(kafka: KafkaConnection) -> Producer:
    """An idempotent producer for a projection's outputs."""
    return Producer(kafka.client_config(**PRODUCER_SETTINGS))


class OutputProducer:
    """Produces one projection version's records through ``producer`` (kept open by its
    owner: a task's Python worker, or the runner), tracking every delivery report.

    ``partition_history``: every partition count the KTable topic has had, oldest first
    (``catalog.note_partitions``). Once partitions were added, a key written is placed by the
    current count explicitly (whatever the client's metadata says) and deleted (a tombstone)
    from the partition each older count put it in, saying where it went (its
    ``KTABLE_MOVED_HEADER``): the read API, which looks a key up under the old counts when its
    partition has none, then never finds a value a key no longer has, and while the key's new
    partition has not yet applied its record, it knows the key is moving rather than
    gone."""

    def __init__(self, producer: Producer, kafka: KafkaConnection, projection: Projection,
                 version: int, partition_history: Sequence[int] = ()) -> None:
        self.producer = producer
        self.partition_history = tuple(partition_history)
        self._known_partitions = 0
        self.kafka = kafka
        self.projection = projection
        self.version = version
        self.ktable_topic = projection.ktable_topic_for(version)
        self._hidden = set(projection.stored_columns) - set(projection.columns)
        """Stored columns readers do not see (an average's sum and count)."""
        self._failures: list[str] = []
        self._unpolled = 0

    def states(self, states: Iterable[tuple[str, KeyState]]) -> int:
        """KTable records (a tombstone for a deleted key); how many."""
        count, hidden, topic, produce = 0, self._hidden, self.ktable_topic, self._produce
        moved = len(self.partition_history) > 1
        for key, key_state in states:
            state = key_state.state
            if state is not None and hidden:
                state = {column: value for column, value in state.items()
                         if column not in hidden}
            value = None if state is None else orjson.dumps(state, default=str)
            headers: list[tuple[str, str | bytes | None]] = [
                (KTABLE_VERSION_HEADER, str(key_state.version).encode()),
                (KTABLE_POSITION_HEADER, str(key_state.position).encode())]
            if moved:
                self._moved(key, value, headers)
            else:
                produce(topic, key, value, headers)
            count += 1
        return count

    def _moved(self, key: str, value: bytes | None,
               headers: list[tuple[str, str | bytes | None]]) -> None:
        """A key's record where the current partition count puts it, and a tombstone where
        each older count did (if elsewhere)."""
        *older, now = self.partition_history
        if now > self._known_partitions:
            self._learn_partitions(now)
        partition = partition_for(key, now)
        self._produce(self.ktable_topic, key, value, headers, partition)
        moved = headers if value is None else [
            *headers, (KTABLE_MOVED_HEADER, str(partition).encode())]
        for stale in {partition_for(key, count) for count in older} - {partition}:
            self._produce(self.ktable_topic, key, None, moved, stale)

    def emissions(self, emissions: Iterable[Emission]) -> None:
        for emission in emissions:
            self._produce(emission.topic, emission.key, emission.value)

    def dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """Each letter with its message as published (metadata included) where it can be
        read back, else as the fold rebuilt it; the letters as written."""
        originals = self._originals(letters) if letters else {}
        written = []
        for letter in letters:
            record = letter.record
            original = originals.get((record.topic, record.partition, record.offset))
            if original is not None:
                letter = DeadLetter(record._replace(value=original), letter.reason,
                                    letter.fold_key, letter.event_id, letter.position,
                                    letter.parks)
            self._dead_letter(letter)
            written.append(letter)
        return written

    def _learn_partitions(self, wanted: int) -> None:
        """Have the client's metadata show the topic's ``wanted`` partitions (it refreshes
        them only every few minutes by itself, and refuses a partition it does not know)."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while True:
            topic = self.producer.list_topics(self.ktable_topic, timeout=10).topics.get(
                self.ktable_topic)
            known = 0 if topic is None or topic.error else len(topic.partitions)
            if known >= wanted or time.monotonic() > deadline:
                self._known_partitions = known
                return
            time.sleep(0.1)

    def flush(self) -> None:
        """Wait for every delivery report; raise ``DeliveryFailed`` if any record was
        refused or the flush timed out (the caller must not commit)."""
        remaining = self.producer.flush(FLUSH_TIMEOUT_S)
        if remaining:
            raise DeliveryFailed(f"{remaining} KTable/DLQ/derived messages not delivered in "
                                 f"{FLUSH_TIMEOUT_S:.0f} s")
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryFailed(
                f"projection {self.projection.name}: {len(failures)} message(s) were not "
                f"delivered, so this batch is not committed (it runs again): "
                + "; ".join(failures[:5]))

    def _produce(self, topic: str, key: str | None, value: str | bytes | None,
                 headers: list[tuple[str, str | bytes | None]] | None = None,
                 partition: int | None = None) -> None:
        while True:
            try:
                if partition is None:
                    self.producer.produce(topic, key=key, value=value, headers=headers,
                                          on_delivery=self._delivered)
                else:
                    self.producer.produce(topic, key=key, value=value, headers=headers,
                                          partition=partition, on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain, then retry
                self.producer.poll(0.05)
        self._unpolled += 1
        if self._unpolled >= _POLL_EVERY:  # serve the client's callbacks now and then
            self._unpolled = 0
            self.producer.poll(0)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        """The delivery report of every message: a failure fails the batch at its flush."""
        if error is not None:
            self._failures.append(f"{message.topic()} key {message.key()!r}: {error.str()}")

    def _originals(self, letters: Sequence[DeadLetter]) -> dict[tuple[str, int, int], str]:
        """The dead letters' messages as they are in their topics, metadata included (the
        fold kept only what it decodes): one read per partition over the letters' offsets.
        Best effort: what cannot be read keeps the value the fold rebuilt."""
        spans: dict[PartitionKey, tuple[int, int]] = {}
        for letter in letters:
            key, offset = (letter.record.topic, letter.record.partition), letter.record.offset
            low, high = spans.get(key, (offset, offset))
            spans[key] = (min(low, offset), max(high, offset))
        wanted = {(r.topic, r.partition, r.offset) for r in (letter.record for letter in letters)}
        found: dict[tuple[str, int, int], str] = {}
        consumer = Consumer(consumer_config(self.kafka))
        try:
            for (topic, partition), (low, high) in spans.items():
                if high - low >= _MAX_ORIGINALS_SPAN:
                    continue
                for chunk in iter_range(consumer, (topic, partition), low, high + 1,
                                        stuck_timeout_s=10):
                    for message in chunk:
                        where = (topic, partition, offset_of(message))
                        if where in wanted and (value := message.value()) is not None:
                            found[where] = value.decode("utf-8", "replace")
        except (KafkaException, TimeoutError) as exc:
            log.warning("projection %s: reading dead letters' messages back: %s",
                        self.projection.name, exc)
        finally:
            consumer.close()
        return found

    def _dead_letter(self, letter: DeadLetter) -> None:
        record = letter.record
        self._produce(
            self.projection.dead_letter_topic, record.key,
            json.dumps({
                "projection": self.projection.name, "version": self.version,
                "error": letter.reason, "topic": record.topic, "partition": record.partition,
                "offset": record.offset, "key": record.key, "fold_key": letter.fold_key,
                "value": record.value,
            }),
        )


@dataclass(frozen=True)
class LetterNote:
    """What the log says of a dead letter: the line, and the ids that trace its command."""

    message: str
    event_id: str | None
    correlation_id: str | None

    @classmethod
    def of(cls, letter: DeadLetter) -> LetterNote:
        record = letter.record
        return cls(f"dead-lettering {record.topic}[{record.partition}]@{record.offset}: "
                   f"{letter.reason}", *trace_of(record.key, record.value))

    def log(self, projection: str) -> None:
        log.warning("%s", self.message, extra={"projection": projection,
                                               "event_id": self.event_id,
                                               "correlation_id": self.correlation_id})
