"""KTables materialized in memory from their compacted topics, and kept live.

``KTableStore`` is the local state store: last value per key in key order (for range queries),
a null value deletes. ``KTableView`` restores a store by reading its topic from the beginning
up to the end offsets seen at start (the way a Kafka Streams store restores from its
changelog), reports restore progress, then keeps following new records. ``KTableHost`` serves
the projection's active version: when a replay switches versions it restores the new topic
beside the old one and swaps when it is ready.

Every read API instance assigns itself all partitions (no consumer group), so several
instances each hold the full table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import (
    TAILING_FETCH_WAIT_MS,
    OffsetPlanner,
    consume_available,
    consumer_config,
    offset_of,
)
from sortedcontainers import SortedDict

from eventfold.contract import KTABLE_VERSION_HEADER, PartitionKey

if TYPE_CHECKING:
    from eventfold.read_api.presence import ReaderPresence

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 5.0


class KTableEntry(NamedTuple):
    """A key's current value as the record carried it. Decoded when read, not when restored:
    a restore builds one per record and most are never asked for."""

    raw: bytes
    headers: list[tuple[str, bytes | None]] | None = None

    @property
    def value(self) -> Any:
        try:
            return orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            log.warning("ktable value is not JSON: %r", self.raw[:100])
            return None

    @property
    def version(self) -> int:
        """The version the projection wrote the value at (its ``eventfold.version`` header)."""
        for name, header in self.headers or ():
            if name == KTABLE_VERSION_HEADER and header:
                return int(header)
        return 0


class KTableStore:
    """Key-ordered entries; safe to read from request handlers while the consumer writes."""

    def __init__(self) -> None:
        self._entries: SortedDict = SortedDict()
        self._lock = threading.Lock()

    def put(self, key: str, entry: KTableEntry | None) -> None:
        with self._lock:
            if entry is None:
                self._entries.pop(key, None)
            else:
                self._entries[key] = entry

    def get(self, key: str) -> KTableEntry | None:
        entry: KTableEntry | None = self._entries.get(key)
        return entry

    def load(self, entries: dict[str, KTableEntry]) -> None:
        """Replace everything with ``entries`` (a restore: one bulk sort, not n inserts)."""
        loaded = SortedDict(entries)
        with self._lock:
            self._entries = loaded

    def __len__(self) -> int:
        return len(self._entries)

    def range(self, start: str | None = None, end: str | None = None, after: str | None = None,
              limit: int | None = None) -> list[tuple[str, KTableEntry]]:
        """Entries with start <= key <= end (either bound optional) and key > after, in key
        order, at most ``limit`` of them."""
        low, inclusive_low = start, True
        if after is not None and (low is None or after >= low):
            low, inclusive_low = after, False
        with self._lock:
            keys = self._entries.irange(low, end, inclusive=(inclusive_low, True))
            found = []
            for key in keys:
                found.append((key, self._entries[key]))
                if limit is not None and len(found) >= limit:
                    break
        return found

    def scan(self, start: str | None = None, end: str | None = None, chunk: int = 1000
             ) -> Iterator[tuple[str, KTableEntry]]:
        """All entries in range, a chunk at a time (the lock is never held across a yield)."""
        after: str | None = None
        while True:
            batch = self.range(start, end, after, chunk)
            yield from batch
            if len(batch) < chunk:
                return
            after = batch[-1][0]


@dataclass(frozen=True)
class RestoreProgress:
    records: int
    total: int
    restored: bool
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"records": self.records, "total": self.total, "restored": self.restored,
                "seconds": round(self.seconds, 3), "records_per_s": round(self.records_per_s)}


class KTableView:
    """One KTable topic, restored into a store and followed by a consumer thread."""

    def __init__(self, kafka: KafkaConnection, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self.store = KTableStore()
        self._restore_total = 0
        self._restore_records = 0
        self._started_at = 0.0
        self._restore_seconds: float | None = None
        self._positions: dict[PartitionKey, int] = {}
        self._high_watermarks: dict[PartitionKey, int] = {}
        self._restored = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ktable-{topic}", daemon=True)

    def start(self) -> KTableView:
        self._started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop following; True once the consumer has closed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return not self._thread.is_alive()

    @property
    def restored(self) -> bool:
        return self._restored.is_set()

    def get(self, key: str) -> KTableEntry | None:
        return self.store.get(key)

    def __len__(self) -> int:
        return len(self.store)

    @property
    def progress(self) -> RestoreProgress:
        elapsed = (self._restore_seconds if self._restore_seconds is not None
                   else time.monotonic() - self._started_at)
        return RestoreProgress(self._restore_records, self._restore_total, self.restored,
                               elapsed)

    @property
    def lag(self) -> int:
        """Records in the topic not yet applied, from the high watermarks of recent fetches."""
        return sum(max(high - self._positions.get(tp, 0), 0)
                   for tp, high in list(self._high_watermarks.items()))

    # -- the consumer thread ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            partitions, restore_end = self._plan_restore()
            if partitions:
                self._follow(partitions, restore_end)
        except KafkaException:
            log.exception("ktable %s: consumer failed", self.topic)

    def _plan_restore(self) -> tuple[list[PartitionKey], dict[PartitionKey, int]]:
        planner = OffsetPlanner(self.kafka)
        try:
            partitions = planner.partitions([self.topic])
            while not partitions and not self._stop.wait(1.0):
                # The projection has not created its topic yet: an empty table is up to date.
                self._mark_restored()
                partitions = planner.partitions([self.topic])
            restore_end = planner.end_offsets(partitions) if partitions else {}
        finally:
            planner.close()
        self._restore_total = sum(restore_end.values())
        return partitions, restore_end

    def _follow(self, partitions: list[PartitionKey], restore_end: dict[PartitionKey, int]
                ) -> None:
        consumer = Consumer(consumer_config(self.kafka,
                                            **{"fetch.max.bytes": 64 * 1024 * 1024,
                                               "max.partition.fetch.bytes": 16 * 1024 * 1024,
                                               "fetch.wait.max.ms": TAILING_FETCH_WAIT_MS}))
        consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
        try:
            self._restore(consumer, restore_end)
            while not self._stop.is_set():
                messages = consume_available(consumer, 10_000, wait_s=0.2)
                for message in messages:
                    self._apply_live(message)
                if messages:
                    self._note_high_watermarks(consumer, partitions)
        finally:
            consumer.close()

    def _restore(self, consumer: Consumer, restore_end: dict[PartitionKey, int]) -> None:
        """Read every partition up to its restore end into a plain dict (no lock, no ordering:
        nobody reads it yet), then load the store in one sorted bulk build."""
        ends = {partition: end for (_, partition), end in restore_end.items()}
        pending = {partition for partition, end in ends.items() if end > 0}
        entries: dict[str, KTableEntry | None] = {}
        entry = self._entry
        next_report = time.monotonic() + _PROGRESS_EVERY_S
        while pending and not self._stop.is_set():
            reached: dict[int, int] = {}
            records = 0
            for message in consume_available(consumer, 10_000, wait_s=0.2):
                error = message.error()
                if error is None:
                    key = message.key()
                    if key is not None:
                        entries[key.decode()] = entry(message)
                    records += 1
                    reached[cast(int, message.partition())] = offset_of(message) + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    reached[cast(int, message.partition())] = offset_of(message)
                else:
                    log.warning("ktable %s: %s", self.topic, error)
            self._restore_records += records
            for partition, position in reached.items():
                self._positions[(self.topic, partition)] = position
                if position >= ends.get(partition, 0):
                    pending.discard(partition)
            if time.monotonic() >= next_report:
                next_report += _PROGRESS_EVERY_S
                self._report_progress()
        self.store.load({k: e for k, e in entries.items() if e is not None})
        self._mark_restored()

    def _apply_live(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("ktable %s: %s", self.topic, error)
            return
        self._positions[(cast(str, message.topic()), cast(int, message.partition()))] = (
            offset_of(message) + 1)
        key = message.key()
        if key is not None:
            self.store.put(key.decode(), self._entry(message))

    @staticmethod
    def _entry(message: Message) -> KTableEntry | None:
        """The record as an entry; None for a tombstone."""
        value = message.value()
        if value is None:
            return None
        return KTableEntry(value, cast(list[tuple[str, bytes | None]] | None, message.headers()))

    def _note_high_watermarks(self, consumer: Consumer, partitions: list[PartitionKey]) -> None:
        for topic, partition in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                     cached=True)
            if high >= 0:
                self._high_watermarks[(topic, partition)] = high

    def _report_progress(self) -> None:
        progress = self.progress
        log.info("ktable %s restoring: %d of %d records (%.0f/s)", self.topic,
                 progress.records, progress.total, progress.records_per_s)

    def _mark_restored(self) -> None:
        if self._restored.is_set():
            return
        self._restore_seconds = time.monotonic() - self._started_at
        log.info("ktable %s restored: %d keys from %d records in %.2f s", self.topic,
                 len(self.store), self._restore_records, self._restore_seconds)
        self._restored.set()


class KTableHost:
    """Serves a projection's KTable at its active version, restoring the next version's topic
    in the background when a replay switches and swapping once it is restored.

    With ``presence``, every topic is registered before its consumer assigns it and
    unregistered once that consumer has closed, so that a replay deletes the old topic only
    after this instance has moved off it."""

    def __init__(self, kafka: KafkaConnection, projection: str,
                 topic_for: Callable[[int], str], version: int,
                 presence: ReaderPresence | None = None) -> None:
        self.kafka = kafka
        self.projection = projection
        self.topic_for = topic_for
        self.presence = presence
        while (moved_to := self._register(version)) is not None:
            version = moved_to  # a switch came between reading the registry and registering
        self.version = version
        self.view = KTableView(kafka, topic_for(version))
        self._next: tuple[int, KTableView] | None = None
        self._lock = threading.Lock()

    def start(self) -> KTableHost:
        self.view.start()
        return self

    def stop(self) -> None:
        with self._lock:
            views = [self.view] + ([self._next[1]] if self._next else [])
        for view in views:
            self._close(view)

    def follow(self, version: int) -> None:
        """Called when the registry shows ``version`` active; cheap when nothing changed."""
        with self._lock:
            if version == self.version:
                return
            if self._next is None or self._next[0] != version:
                if self._next is not None:
                    self._close(self._next[1])
                    self._next = None
                if self._register(version) is not None:
                    return  # switched again meanwhile: the registry's next answer says to what
                topic = self.topic_for(version)
                log.info("ktable %s: version %d is active, restoring %s", self.view.topic,
                         version, topic)
                self._next = (version, KTableView(self.kafka, topic).start())
            next_version, next_view = self._next
            if not next_view.restored:
                return
            old, self.view, self.version, self._next = self.view, next_view, next_version, None
        self._close(old)
        log.info("ktable now served from %s (version %d)", self.view.topic, self.version)

    def _register(self, version: int) -> int | None:
        """Register ``version``'s topic before a consumer assigns it; None if registered (or
        nothing registers), else the version active instead."""
        if self.presence is None:
            return None
        return self.presence.opening(self.projection, version, self.topic_for(version))

    def _close(self, view: KTableView) -> None:
        if view.stop() and self.presence is not None:
            self.presence.closed(view.topic)
