"""A KTable topic restored into a state store and followed, as a Kafka Streams store restores
from its changelog: from the store's checkpoint (or the beginning) up to the end offsets seen
at start, with progress reported, then live."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import (
    TAILING_FETCH_WAIT_MS,
    OffsetPlanner,
    consume_available,
    consumer_config,
    offset_of,
)
from eventfold.outbox.topics import TopicAdmin
from eventfold.read_api.state.entry import KTableEntry
from eventfold.read_api.state.stores import (
    Change,
    MemoryStore,
    RocksDBStore,
    StateStore,
    StoreClosed,
    StoreConfig,
)

log = logging.getLogger(__name__)

_PROGRESS_EVERY_S = 5.0
_CATCH_UP_EVERY_S = 0.1
_PROMOTE_EVERY_S = 1.0
_RETRY_S = 1.0


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


@dataclass(frozen=True)
class _Offsets:
    """A topic's partitions as the view found them at start."""

    partitions: list[int]
    begin: dict[int, int]
    end: dict[int, int]
    topic_id: str


class KTableView:
    """One KTable topic, restored into a store and followed by a thread: the store's writer
    consumes the topic; a reader of a store another process writes catches up with it."""

    def __init__(self, kafka: KafkaConnection, topic: str,
                 config: StoreConfig | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.config = config or StoreConfig()
        self.store: StateStore = MemoryStore()  # until the topic's own store opens
        self._restore_total = 0
        self._restore_records = 0
        self._started_at = 0.0
        self._restore_seconds: float | None = None
        self._positions: dict[int, int] = {}
        self._high_watermarks: dict[int, int] = {}
        self._restored = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ktable-{topic}", daemon=True)

    def start(self) -> KTableView:
        self._started_at = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop following; True once the consumer has closed and the store is let go."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return not self._thread.is_alive()

    def retire(self) -> bool:
        """Stop, and delete the store's files: its topic is no longer served."""
        stopped = self.stop()
        if stopped:
            self.store.destroy()
        return stopped

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
        return sum(max(high - self._positions.get(p, 0), 0)
                   for p, high in list(self._high_watermarks.items()))

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        """Open the store and restore or read behind, until stopped; after a failure (the
        broker, a store another process wiped under this one), again from the store."""
        while not self._stop.is_set():
            try:
                self._serve()
                return
            except StoreClosed:
                return
            # rocksdict raises a plain Exception for any failure of a database (one another
            # process wiped, say); the broker, KafkaException: the view must not die of either.
            except Exception as exc:
                log.warning("ktable %s: %s; opening its store again in %.0f s", self.topic,
                            exc, _RETRY_S, exc_info=True)
                self._stop.wait(_RETRY_S)

    def _serve(self) -> None:
        offsets = self._offsets()
        if offsets is None:
            return
        self.store = self._open(offsets)
        try:
            if not self.store.writer:
                offsets = self._read_behind(offsets)
            if offsets is not None and not self._stop.is_set():
                self._follow(offsets)
        finally:
            self.store.close()

    def _offsets(self) -> _Offsets | None:
        """The topic's partitions and offsets, once it exists (None: stopped before)."""
        planner = OffsetPlanner(self.kafka)
        try:
            partitions = planner.partitions([self.topic])
            while not partitions:
                # The projection has not created its topic yet: an empty table is up to date.
                self._mark_restored()
                if self._stop.wait(1.0):
                    return None
                partitions = planner.partitions([self.topic])
            begin, end = planner.beginning_offsets(partitions), planner.end_offsets(partitions)
        finally:
            planner.close()
        topic_id = (TopicAdmin(self.kafka).topic_id(self.topic) or ""
                    if self.config.kind == "rocksdb" else "")
        return _Offsets([p for _, p in partitions], {p: o for (_, p), o in begin.items()},
                        {p: o for (_, p), o in end.items()}, topic_id)

    def _open(self, offsets: _Offsets) -> StateStore:
        if self.config.kind == "memory":
            return MemoryStore()
        return RocksDBStore(self.config, self.topic, offsets.partitions, offsets.topic_id,
                            offsets.begin, offsets.end, self._stop)

    def _read_behind(self, offsets: _Offsets) -> _Offsets | None:
        """Serve what the writing process applies, until told to stop (None) or until the
        writer is gone and this process has taken its place (the topic's offsets now)."""
        store = cast(RocksDBStore, self.store)
        self._restore_total = sum(offsets.end.values())
        next_promotion = time.monotonic() + _PROMOTE_EVERY_S
        while not self._stop.wait(_CATCH_UP_EVERY_S):
            store.catch_up()
            self._positions = store.positions()
            self._high_watermarks = store.high_watermarks()
            self._restore_records = sum(self._positions.values())
            if store.was_restored():
                self._mark_restored()
            if time.monotonic() >= next_promotion:
                next_promotion = time.monotonic() + _PROMOTE_EVERY_S
                if store.take_writer_lock():
                    fresh = self._offsets()
                    if fresh is None:
                        return None
                    store.become_writer(fresh.topic_id, fresh.begin, fresh.end)
                    return fresh
        return None

    def _follow(self, offsets: _Offsets) -> None:
        start = {p: max(self.store.positions().get(p, offsets.begin[p]), offsets.begin[p])
                 for p in offsets.partitions}
        self._positions = dict(start)
        self._restore_total = sum(max(offsets.end[p] - start[p], 0) for p in start)
        if any(start.values()):
            log.info("ktable %s: restoring %d records after the store's checkpoint (offsets "
                     "%s)", self.topic, self._restore_total, start)
        # Small fetches and a small prefetch queue: with 64 MB fetches (16 MB a partition)
        # and librdkafka's 64 MB queue, consuming alone held about 490 MB while a 5M-record
        # topic restored (docs/benchmarks.md, "KTables in RocksDB state stores").
        consumer = Consumer(consumer_config(self.kafka, **{
            "fetch.max.bytes": 8 * 1024 * 1024, "max.partition.fetch.bytes": 2 * 1024 * 1024,
            "queued.max.messages.kbytes": 8 * 1024,
            "fetch.wait.max.ms": TAILING_FETCH_WAIT_MS}))
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in start.items()])
        try:
            self._restore(consumer, offsets.end)
            while not self._stop.is_set():
                self._apply(consumer, consume_available(consumer, 10_000, wait_s=0.2))
        finally:
            consumer.close()

    def _restore(self, consumer: Consumer, ends: Mapping[int, int]) -> None:
        pending = {p for p, end in ends.items() if end > self._positions.get(p, 0)}
        next_report = time.monotonic() + _PROGRESS_EVERY_S
        while pending and not self._stop.is_set():
            self._restore_records += self._apply(
                consumer, consume_available(consumer, 10_000, wait_s=0.2))
            pending = {p for p in pending if self._positions.get(p, 0) < ends[p]}
            if time.monotonic() >= next_report:
                next_report += _PROGRESS_EVERY_S
                self._report_progress()
        if not self._stop.is_set():
            self.store.restored()
            self._mark_restored()

    def _apply(self, consumer: Consumer, messages: Sequence[Message]) -> int:
        """Write a poll's records to the store, one batch per partition with its offset;
        how many records there were."""
        changes: dict[int, list[Change]] = {}
        reached: dict[int, int] = {}
        records = 0
        of_record = KTableEntry.of_record
        for message in messages:
            error = message.error()
            partition = cast(int, message.partition())
            if error is None:
                key = message.key()
                if key is not None:
                    changes.setdefault(partition, []).append((key.decode(), of_record(
                        message.value(),
                        cast(list[tuple[str, bytes | None]] | None, message.headers()))))
                records += 1
                reached[partition] = offset_of(message) + 1
            elif error.code() == KafkaError._PARTITION_EOF:
                reached[partition] = max(reached.get(partition, 0), offset_of(message))
            else:
                log.warning("ktable %s: %s", self.topic, error)
        for partition, position in reached.items():
            high = self._note_high_watermark(consumer, partition)
            self.store.write(partition, changes.get(partition, []), position, high)
            self._positions[partition] = position
        return records

    def _note_high_watermark(self, consumer: Consumer, partition: int) -> int:
        _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                 cached=True)
        if high >= 0:
            self._high_watermarks[partition] = high
        return max(high, 0)

    def _report_progress(self) -> None:
        progress = self.progress
        log.info("ktable %s restoring: %d of %d records (%.0f/s)", self.topic,
                 progress.records, progress.total, progress.records_per_s)

    def _mark_restored(self) -> None:
        if self._restored.is_set():
            return
        self._restore_seconds = time.monotonic() - self._started_at
        log.info("ktable %s restored: %d keys, %d records applied in %.2f s", self.topic,
                 len(self.store), self._restore_records, self._restore_seconds)
        self._restored.set()

