"""A KTable topic restored into a state store and followed, as a Kafka Streams store restores
from its changelog: from the store's checkpoint (or the beginning) up to the end offsets seen
at start, with progress reported, then live."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
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
from eventfold.read_api.state.heap import PROCESS_HEAP, UNTRIMMED
from eventfold.read_api.state.stores import (
    IN_MEMORY,
    Change,
    MemoryStore,
    RocksDBStore,
    StateStore,
    StoreClosed,
    StoreConfig,
    stored_partitions,
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
    """Some of a topic's partitions, as the view found them."""

    partitions: list[int]
    begin: dict[int, int]
    end: dict[int, int]
    topic_id: str


class KTableView:
    """The partitions of one KTable topic this process holds, restored into a store and
    followed by a thread: the store's writer consumes them; a reader of a store another
    process writes catches up with it. Which partitions: ``assign`` (until then, none), or
    every one (``hold_all``, and always with the memory store)."""

    def __init__(self, kafka: KafkaConnection, topic: str,
                 config: StoreConfig | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.config = config or IN_MEMORY
        self.store: StateStore = MemoryStore()  # until the topic's own store opens
        self.partition_count: int | None = None
        self.on_partitions: Callable[[KTableView], None] | None = None
        """Called once the topic's partition count is known (to assign the view some)."""
        self._wanted: frozenset[int] | None = None
        self._hold_all = self.config.kind == "memory"
        # the memory store stands for the design before on-disk stores (benchmarks compare
        # against it): it keeps its heap as that design did
        self._heap = PROCESS_HEAP if self.config.kind == "rocksdb" else UNTRIMMED
        self._ready: frozenset[int] = frozenset()
        self._targets: dict[int, int] = {}  # partitions restoring: the end offset to reach
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

    def assign(self, partitions: Collection[int]) -> None:
        """Hold exactly ``partitions`` from now on (the thread opens and restores the new
        ones, and lets go of the others)."""
        self._wanted = frozenset(partitions)

    def hold_all(self) -> None:
        """Hold every partition of the topic (an instance alone)."""
        self._hold_all = True

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
        """Whether every partition this view holds is restored (a topic not created yet
        is: it is empty)."""
        if self.partition_count is None:
            return self._restored.is_set()
        wanted = self._wanted_now()
        return wanted is not None and wanted <= self._ready

    @property
    def ready_partitions(self) -> frozenset[int]:
        """The partitions held and restored: their reads are served here."""
        return self._ready

    @property
    def held_partitions(self) -> frozenset[int]:
        """The partitions assigned to this view, restored or restoring."""
        return self._wanted_now() or frozenset()

    def stored_partitions(self) -> frozenset[int]:
        """The partitions this instance has a store of on disk, held or not."""
        if self.config.kind != "rocksdb":
            return frozenset()
        return stored_partitions(self.config, self.topic)

    def partition_lags(self) -> dict[int, int]:
        """Each ready partition's lag in records."""
        return {p: lag for p in self._ready if (lag := self.partition_lag(p)) is not None}

    def partition_lag(self, partition: int) -> int | None:
        """The partition's lag in records if it is ready here, else None."""
        if partition not in self._ready:
            return None
        return max(self._high_watermarks.get(partition, 0) - self._positions.get(partition, 0),
                   0)

    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        return self.store.get(key, partition)

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
                   for p, high in list(self._high_watermarks.items())
                   if p in self._positions)

    def _wanted_now(self) -> frozenset[int] | None:
        if self._hold_all and self.partition_count is not None:
            return frozenset(range(self.partition_count))
        return self._wanted

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
                self._ready = frozenset()
                self._stop.wait(_RETRY_S)

    def _serve(self) -> None:
        topic_id = self._topic_id()
        if topic_id is None:
            return
        self.store = (MemoryStore() if self.config.kind == "memory"
                      else RocksDBStore(self.config, self.topic, self._stop))
        try:
            if self.store.writer or self._read_behind(topic_id):
                self._follow(topic_id)
        finally:
            self.store.close()
            self._ready = frozenset()

    def _topic_id(self) -> str | None:
        """The topic's id (and its partition count noted), once it exists (None: stopped
        before)."""
        planner = OffsetPlanner(self.kafka)
        try:
            partitions = planner.partitions([self.topic])
            while not partitions:
                # The projection has not created its topic yet: an empty table is up to date.
                self._mark_restored()
                if self._stop.wait(1.0):
                    return None
                partitions = planner.partitions([self.topic])
        finally:
            planner.close()
        self.partition_count = len(partitions)
        if self.on_partitions is not None:
            self.on_partitions(self)
        return (TopicAdmin(self.kafka).topic_id(self.topic) or ""
                if self.config.kind == "rocksdb" else "")

    def _offsets(self, partitions: Collection[int], topic_id: str) -> _Offsets:
        planner = OffsetPlanner(self.kafka)
        try:
            keys = [(self.topic, p) for p in sorted(partitions)]
            begin, end = planner.beginning_offsets(keys), planner.end_offsets(keys)
        finally:
            planner.close()
        return _Offsets([p for _, p in keys], {p: o for (_, p), o in begin.items()},
                        {p: o for (_, p), o in end.items()}, topic_id)

    def _read_behind(self, topic_id: str) -> bool:
        """Serve what the writing process applies, holding the partitions assigned, until
        told to stop (False) or until the writer is gone and this process has taken its place
        (True)."""
        store = cast(RocksDBStore, self.store)
        next_promotion = time.monotonic() + _PROMOTE_EVERY_S
        while not self._stop.wait(_CATCH_UP_EVERY_S):
            wanted = self._wanted_now()
            if wanted is not None and wanted != store.partitions:
                store.close_partitions(store.partitions - wanted)
                store.open_partitions(wanted, topic_id, {}, {})
            if store.writer or (time.monotonic() >= next_promotion and store.take_writer_lock()):
                store.become_writer()
                return True
            if time.monotonic() >= next_promotion:
                next_promotion = time.monotonic() + _PROMOTE_EVERY_S
            store.catch_up()
            self._positions = store.positions()
            self._high_watermarks = store.high_watermarks()
            self._restore_records = sum(self._positions.values())
            self._restore_total = sum(self._high_watermarks.values())
            self._ready = store.restored_partitions()
            if wanted is not None and wanted <= self._ready:
                self._mark_restored()
        return False

    def _follow(self, topic_id: str) -> None:
        # Small fetches and a small prefetch queue: a restore is bound by applying records,
        # not by fetching them, and every byte librdkafka prefetches is held (and fragments
        # the heap) while it waits. 2 MB fetches restore as fast as 8 MB ones, for much
        # less memory (docs/benchmarks.md, "Restores give their memory back").
        consumer = Consumer(consumer_config(self.kafka, **{
            "fetch.max.bytes": 2 * 1024 * 1024, "max.partition.fetch.bytes": 512 * 1024,
            "queued.max.messages.kbytes": 2 * 1024, "queued.min.messages": 5_000,
            "fetch.wait.max.ms": TAILING_FETCH_WAIT_MS}))
        held: frozenset[int] = frozenset()
        next_report = time.monotonic() + _PROGRESS_EVERY_S
        try:
            while not self._stop.is_set():
                wanted = self._wanted_now()
                if wanted is not None and wanted != held:
                    self._rebalance(consumer, held, wanted, topic_id)
                    held = wanted
                if not held:
                    self._stop.wait(_CATCH_UP_EVERY_S)
                    continue
                records = self._apply(consumer, consume_available(consumer, 10_000, wait_s=0.2))
                self._heap.applied(records)
                if self._targets:
                    self._restore_records += records
                    self._note_restored()
                    if time.monotonic() >= next_report:
                        next_report = time.monotonic() + _PROGRESS_EVERY_S
                        self._report_progress()
        finally:
            consumer.close()

    def _rebalance(self, consumer: Consumer, held: frozenset[int], wanted: frozenset[int],
                   topic_id: str) -> None:
        """Let go of the partitions no longer wanted; open the new ones from their
        checkpoints, to restore up to their end offsets now."""
        gone, added = held - wanted, wanted - held
        self.store.close_partitions(gone)
        for partition in gone:
            self._positions.pop(partition, None)
            self._targets.pop(partition, None)
        self._ready = self._ready - gone
        if added:
            offsets = self._offsets(added, topic_id)
            self.store.open_partitions(added, topic_id, offsets.begin, offsets.end)
            stored = self.store.positions()
            start = {p: max(stored.get(p, offsets.begin[p]), offsets.begin[p]) for p in added}
            self._positions.update(start)
            restoring = {p: offsets.end[p] for p in added if offsets.end[p] > start[p]}
            self._targets.update(restoring)
            self._restore_total += sum(end - start[p] for p, end in restoring.items())
            resumed = {p: o for p, o in start.items() if o > offsets.begin[p]}
            if resumed:
                log.info("ktable %s: restoring %d records after the store's checkpoint "
                         "(offsets %s)", self.topic,
                         sum(restoring.get(p, o) - o for p, o in resumed.items()), resumed)
            if len(resumed) < len(start) and (resumed or held):
                log.info("ktable %s: restoring partitions %s from their beginning", self.topic,
                         sorted(start.keys() - resumed.keys()))
        if held or len(wanted) != self.partition_count:
            log.info("ktable %s: holds partitions %s (%d to restore)", self.topic,
                     sorted(wanted), len(self._targets))
        consumer.assign([TopicPartition(self.topic, p, self._positions[p]) for p in wanted])
        self._note_restored()

    def _note_restored(self) -> None:
        done = [p for p, end in self._targets.items() if self._positions.get(p, 0) >= end]
        for partition in done:
            del self._targets[partition]
        wanted = self._wanted_now() or frozenset()
        newly = wanted - self._targets.keys() - self._ready
        if newly:
            self.store.restored(newly)
            self._ready = self._ready | newly
        if not self._targets and wanted <= self._ready:
            self._mark_restored()

    def _apply(self, consumer: Consumer, messages: Sequence[Message]) -> int:
        """Write a poll's records to the store, one batch per partition with its offset;
        how many records there were. Records of a partition let go since, or before its
        position (fetched before a rebalance assigned it again), are skipped."""
        changes: dict[int, list[Change]] = {}
        reached: dict[int, int] = {}
        records = 0
        of_record = KTableEntry.of_record
        positions = self._positions
        for message in messages:
            error = message.error()
            partition = cast(int, message.partition())
            if partition not in positions:
                continue
            if error is None:
                offset = offset_of(message)
                if offset < positions[partition]:
                    continue
                key = message.key()
                if key is not None:
                    changes.setdefault(partition, []).append((key.decode(), of_record(
                        message.value(),
                        cast(list[tuple[str, bytes | None]] | None, message.headers()))))
                records += 1
                reached[partition] = offset + 1
            elif error.code() == KafkaError._PARTITION_EOF:
                reached[partition] = max(reached.get(partition, 0), offset_of(message))
            else:
                log.warning("ktable %s: %s", self.topic, error)
        for partition, position in reached.items():
            high = self._note_high_watermark(consumer, partition)
            self.store.write(partition, changes.get(partition, []), position, high)
            positions[partition] = position
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
        self._heap.trim()
