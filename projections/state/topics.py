"""A projection version's Kafka outputs: its KTable (latest state per key, tombstones), its
dead letters and its derived events.

``ensure_projection_topics`` creates the topics and checks their configs. ``OutputProducer``
writes records, each with a delivery report: ``flush`` raises ``DeliveryFailed`` if the broker
refused any, so that the batch which produced them does not commit and runs again. The tasks
of a batch produce what they fold; the batch's commit produces only the letters it must decide
on (those of keys parked before the batch, ``store.ReadModelStore.commit``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from eventfold.contract import (
    DEFAULT_DEAD_LETTER_RETENTION,
    DEFAULT_DERIVED_EVENT_RETENTION,
    KTABLE_MOVED_HEADER,
    KTABLE_POSITION_HEADER,
    KTABLE_VERSION_HEADER,
    PartitionKey,
    retention_ms,
    trace_of,
)
from eventfold.contract.partitioner import partition_for
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner, consumer_config, iter_range, offset_of
from eventfold.outbox.topics import (
    COMPACTED_TOPIC_CONFIG,
    EVENT_TOPIC_CONFIG,
    Replication,
    TopicAdmin,
    TopicShape,
)
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


@dataclass(frozen=True)
class OutputTopicConfigs:
    """How a projection's output topics are configured: a KTable topic is compacted (plus
    ``ktable``); dead letters and derived events are kept for their retention (-1: forever)."""

    ktable: Mapping[str, str] = field(default_factory=dict)
    dead_letter_retention_ms: int = retention_ms(DEFAULT_DEAD_LETTER_RETENTION)
    derived_retention_ms: int = retention_ms(DEFAULT_DERIVED_EVENT_RETENTION)

    def ktable_config(self) -> dict[str, str]:
        return {**COMPACTED_TOPIC_CONFIG, **self.ktable}

    def dead_letter_config(self) -> dict[str, str]:
        return {**EVENT_TOPIC_CONFIG, "retention.ms": str(self.dead_letter_retention_ms)}

    def derived_config(self) -> dict[str, str]:
        return {**EVENT_TOPIC_CONFIG, "retention.ms": str(self.derived_retention_ms)}


def ensure_projection_topics(admin: TopicAdmin, projection: Projection, version: int = 1,
                             configs: OutputTopicConfigs | None = None,
                             fix: bool = False) -> None:
    """The KTable and dead-letter topics, created if missing and their configs checked:
    a KTable topic that is not compacted would grow forever and restore ever slower."""
    configs = configs or OutputTopicConfigs()
    if projection.has_state:
        topic = projection.ktable_topic_for(version)
        partitions = ktable_partitions(admin, projection)
        admin.ensure([topic], configs.ktable_config(), partitions=partitions, kind="ktables",
                     check=True, fix=fix)
        if (found := admin.partitions(topic)) != partitions:
            level = logging.WARNING if projection.ktable_partitions else logging.INFO
            log.log(level, "projection %s: its KTable topic %s has %d partition(s), %s %d; a "
                        "replay (`eventfold projection replay %s`) builds the next version's "
                        "topic with them", projection.name, topic, found,
                        "it declares" if projection.ktable_partitions else "its sources have",
                        partitions, projection.name)
    admin.ensure([projection.dead_letter_topic], configs.dead_letter_config(),
                 kind="dead_letters", check=True, fix=fix)


def ktable_partitions(admin: TopicAdmin, projection: Projection) -> int:
    """How many partitions the KTable topic of a new version gets: as declared, else as many
    as the most of its source topics have (1 before they exist)."""
    if projection.ktable_partitions is not None:
        return projection.ktable_partitions
    return max((admin.partitions(topic) for topic in projection.source_topics), default=1) or 1


def new_producer(kafka: KafkaConnection) -> Producer:
    """An idempotent producer for a projection's outputs."""
    return Producer(kafka.client_config(**PRODUCER_SETTINGS))


DRIVER_SLOT = "driver"
"""The transactional id's slot of the batches a runner folds on its driver; a Spark task's is
``task-<its partition>``."""


def writer_transactional_id(writer: str, slot: str) -> str:
    """The transactional id of one slot of a projection version's writer (``writer``: the
    version's prefix, ``eventfold.<projection>.v<version>``): stable across runs, so that a
    newer runner's producer fences an older one's at the broker."""
    return f"{writer}.{slot}"


def writer_slots(tasks: int) -> list[str]:
    """Every slot a runner with at most ``tasks`` tasks per job writes from."""
    return [DRIVER_SLOT, *(f"task-{index}" for index in range(tasks))]


class WritesFenced(RuntimeError):
    """A newer runner's producer took this transactional id over: this runner's writes are
    refused by the broker, and it must stop."""


class TransactionalWrites:
    """A transactional producer of one writer slot: ``begin`` before a task produces,
    ``commit`` once it has (its records become visible to read-committed consumers
    together, or never, if a newer producer fenced this one meanwhile)."""

    def __init__(self, kafka: KafkaConnection, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.producer = Producer(kafka.client_config(**PRODUCER_SETTINGS, **{
            "transactional.id": transactional_id, "transaction.timeout.ms": 60_000}))
        self._open = False
        self.fenced = False
        self._call(self.producer.init_transactions, FLUSH_TIMEOUT_S)

    def begin(self) -> None:
        """A new transaction; one a failed attempt left open is aborted first."""
        if self._open:
            self._call(self.producer.abort_transaction, FLUSH_TIMEOUT_S)
            self._open = False
        self._call(self.producer.begin_transaction)
        self._open = True

    def commit(self) -> None:
        self._call(self.producer.commit_transaction, FLUSH_TIMEOUT_S)
        self._open = False

    def abort_quietly(self) -> None:
        """Abort the open transaction, if any (a task that failed or was fenced): left open,
        it would hold back read-committed readers of its partitions until it timed out. A
        producer fenced meanwhile has nothing left to abort."""
        if not self._open:
            return
        try:
            self._call(self.producer.abort_transaction, FLUSH_TIMEOUT_S)
        except (KafkaException, WritesFenced) as exc:
            log.debug("aborting %s: %s", self.transactional_id, exc)
        self._open = False

    def _call(self, action: Callable[..., object], *args: float) -> None:
        try:
            action(*args)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or error.code() in _FENCED_CODES:
                self.fenced = True
                raise WritesFenced(f"the producer {self.transactional_id} was fenced by a "
                                   f"newer one: {error.str()}") from None
            if error.txn_requires_abort():
                self._open = True  # the next begin aborts it
            raise


_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                           KafkaError.INVALID_PRODUCER_EPOCH})


def fence_writers(kafka: KafkaConnection, writer: str, slots: Sequence[str]) -> None:
    """Take every slot's transactional id, all at once: whatever an older runner of the
    version still has open is aborted, and its producers are refused from now on."""
    with ThreadPoolExecutor(max_workers=min(len(slots), 16) or 1) as pool:
        for fenced in pool.map(lambda slot: TransactionalWrites(
                kafka, writer_transactional_id(writer, slot)), slots):
            fenced.producer.flush(0)


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


class TopicSink:
    """A projection version's topics from the runner's side: created and checked, derived
    topics made on first use, retired versions' topics deleted; and a producer for what the
    commit itself writes."""

    def __init__(self, kafka: KafkaConnection, projection: Projection, version: int,
                 configs: OutputTopicConfigs | None = None,
                 replication: Replication | None = None) -> None:
        self.projection = projection
        self.configs = configs or OutputTopicConfigs()
        self.version = version
        self.kafka = kafka
        self.output = OutputProducer(new_producer(kafka), kafka, projection, version)
        self._admin = TopicAdmin(kafka, replication)
        self._output_topics: set[str] = set()

    def ensure_topics(self) -> None:
        ensure_projection_topics(self._admin, self.projection, self.version, self.configs)

    def ktable_shape(self) -> TopicShape | None:
        """The version's KTable topic's id and partition count now (None: not there)."""
        return self._admin.describe(self.projection.ktable_topic_for(self.version))

    def delete_topics(self, topics: list[str]) -> None:
        self._admin.delete(topics)

    def first_dead_letter_offset(self) -> int:
        """The dead-letter topic's first offset: letters below it are gone (its retention)."""
        planner = OffsetPlanner(self.kafka)
        try:
            partition = (self.projection.dead_letter_topic, 0)
            return planner.beginning_offsets([partition]).get(partition, 0)
        finally:
            planner.close()

    def ensure_outputs(self, topics: Iterable[str]) -> set[str]:
        """Create the derived-event ``topics`` on first use; returns those this sink had not
        written to before."""
        new_topics = set(topics) - self._output_topics
        if new_topics:
            self._admin.ensure(new_topics, self.configs.derived_config(), kind="derived")
            self._output_topics |= new_topics
        return new_topics

    def close(self) -> None:
        self.output.producer.flush(10)
        # Spark's callback server keeps the runner alive; let the clients go now.
        del self.output, self._admin
