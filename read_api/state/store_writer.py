"""A KTable view as its store's writer (``StoreWriter``, mixed into ``view.KTableView``): it
consumes the partitions it holds, restores each from its checkpoint up to the end offsets seen
when it opened, then follows it, writing every poll's records to the store with their offsets
and saying now and then that an idle partition is read to its end."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import (
    TAILING_FETCH_WAIT_MS,
    consume_available,
    consumer_config,
    offset_of,
)
from eventfold.outbox.topics import TopicShape
from eventfold.read_api.state.entry import KTableEntry
from eventfold.read_api.state.heap import HeapTrimmer
from eventfold.read_api.state.restore import Restoration
from eventfold.read_api.state.stores import Change, StateStore, TopicOffsets
from eventfold.read_api.state.topic_watch import TopicWatch

# The view's logger: a writer's lines are its view's, and operators filter on its name.
log = logging.getLogger("eventfold.read_api.state.view")

PROGRESS_EVERY_S = 5.0
CATCH_UP_EVERY_S = 0.1
SYNC_EVERY_S = 30.0
"""How often a partition read to its end says so in its store (``StateStore.synced``) when no
record comes: a store whose last such time is older than the topic keeps tombstones is
restored from the beginning at its next start."""


class StoreWriter:
    """The writer's side of a view, for a view that has these."""

    kafka: KafkaConnection
    topic: str
    store: StateStore
    partition_count: int | None
    _heap: HeapTrimmer
    _ready: frozenset[int]
    _restoration: Restoration
    _positions: dict[int, int]
    _high_watermarks: dict[int, int]
    _synced_at: dict[int, float]
    _restored: threading.Event
    _stop: threading.Event
    _watch: TopicWatch

    def _recreated(self, shape: TopicShape) -> None:
        raise NotImplementedError

    def _wanted_now(self) -> frozenset[int] | None:
        raise NotImplementedError

    def _offsets(self, partitions: Collection[int], shape: TopicShape) -> TopicOffsets:
        raise NotImplementedError

    def _report_progress(self) -> None:
        raise NotImplementedError

    def _mark_restored(self) -> None:
        raise NotImplementedError

    def _follow(self, shape: TopicShape, continuing: frozenset[int]) -> None:
        # Small fetches and a small prefetch queue: a restore is bound by applying records,
        # not by fetching them, and every byte librdkafka prefetches is held (and fragments
        # the heap) while it waits. 2 MB fetches restore as fast as 8 MB ones, for much
        # less memory (docs/benchmarks.md, "Restores give their memory back").
        consumer = Consumer(consumer_config(self.kafka, **{
            "fetch.max.bytes": 2 * 1024 * 1024, "max.partition.fetch.bytes": 512 * 1024,
            "queued.max.messages.kbytes": 2 * 1024, "queued.min.messages": 5_000,
            "fetch.wait.max.ms": TAILING_FETCH_WAIT_MS}))
        self._restoration = Restoration(self.topic)
        held: frozenset[int] = frozenset()
        next_report = time.monotonic() + PROGRESS_EVERY_S
        try:
            while not self._stop.is_set():
                self._recreated(shape)
                wanted = self._wanted_now()
                if wanted is not None and wanted != held:
                    self._rebalance(consumer, held, wanted, shape, continuing)
                    held, continuing = wanted, frozenset()
                if not held:
                    self._stop.wait(CATCH_UP_EVERY_S)
                    continue
                polled_at_ms = int(time.time() * 1000)
                records = self._apply(consumer, consume_available(consumer, 10_000, wait_s=0.2),
                                      polled_at_ms)
                self._heap.applied(records)
                self._sync_idle(consumer, held, polled_at_ms)
                if self._restoration.restoring and time.monotonic() >= next_report:
                    next_report = time.monotonic() + PROGRESS_EVERY_S
                    self._report_progress()
        finally:
            consumer.close()

    def _rebalance(self, consumer: Consumer, held: frozenset[int], wanted: frozenset[int],
                   shape: TopicShape, continuing: frozenset[int]) -> None:
        """Let go of the partitions no longer wanted; open the new ones from their
        checkpoints, to restore up to their end offsets now (``continuing``: served restored
        by this process as a reader, they stay so)."""
        # a reader that took the writer's place may still hold partitions no longer wanted
        gone, added = (held | self.store.partitions) - wanted, wanted - held
        self._ready = self._ready - gone  # no longer answered here before they close
        self.store.close_partitions(gone)
        self._restoration.forget(gone)
        for partition in gone:
            self._positions.pop(partition, None)
        if added:
            offsets = self._offsets(added, shape)
            self.store.open_partitions(added, offsets, continuing)
            stored = self.store.positions()
            for partition in sorted(added):
                start = max(stored.get(partition, offsets.begin[partition]),
                            offsets.begin[partition])
                self._positions[partition] = start
                self._restoration.register(partition, start, offsets.end[partition],
                                           restored=(partition in continuing
                                                     and partition in stored))
            self._log_restores(added, offsets, stored, continuing, bool(held))
            newly = self._restoration.restored & added - continuing
            if newly:
                self.store.restored(newly)
        if held or len(wanted) != self.partition_count:
            log.info("ktable %s: holds partitions %s (%d to restore)", self.topic,
                     sorted(wanted), len(self._restoration.restoring))
        consumer.assign([TopicPartition(self.topic, p, self._positions[p]) for p in wanted])
        self._ready = self._restoration.restored
        if not self._restoration.restoring and wanted <= self._ready:
            self._mark_restored()

    def _log_restores(self, added: frozenset[int], offsets: TopicOffsets,
                      stored: Mapping[int, int], continuing: frozenset[int],
                      held_before: bool) -> None:
        targets = self._restoration.targets()
        resumed = {p: self._positions[p] for p in added
                   if self._positions[p] > offsets.begin[p]}
        if resumed:
            log.info("ktable %s: restoring %d records after the store's checkpoint "
                     "(offsets %s)", self.topic,
                     sum(targets.get(p, o) - o for p, o in resumed.items()), resumed)
        if continuing & added:
            log.info("ktable %s: this process writes partitions %s from where the writer "
                     "before it stopped, serving them meanwhile", self.topic,
                     sorted(continuing & added & stored.keys()))
        fresh = sorted(added - resumed.keys())
        if fresh and (resumed or held_before):
            log.info("ktable %s: restoring partitions %s from their beginning", self.topic,
                     fresh)

    def _apply(self, consumer: Consumer, messages: Sequence[Message], polled_at_ms: int
               ) -> int:
        """Write a poll's records to the store, one batch per partition with its offset;
        how many records there were. Records of a partition let go since, or before its
        position (fetched before a rebalance assigned it again), are skipped; an end of
        partition before the position makes the watch look at the topic at once (it may
        have been made again)."""
        changes: dict[int, list[Change]] = {}
        reached: dict[int, int] = {}
        counted: dict[int, int] = {}
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
                counted[partition] = counted.get(partition, 0) + 1
                reached[partition] = offset + 1
            elif error.code() == KafkaError._PARTITION_EOF:
                end = offset_of(message)
                if end < positions[partition]:
                    self._watch.check_now()
                    continue
                reached[partition] = max(reached.get(partition, 0), end)
            else:
                log.warning("ktable %s: %s", self.topic, error)
        for partition, position in reached.items():
            high = self._note_high_watermark(consumer, partition)
            synced = polled_at_ms if position >= high else None
            self.store.write(partition, changes.get(partition, []), position, high, synced)
            positions[partition] = position
            if synced is not None:
                self._synced_at[partition] = time.monotonic()
            if self._restoration.advance(partition, position, counted.get(partition, 0)):
                self.store.restored([partition])
                self._ready = self._restoration.restored
        if reached and not self._restoration.restoring and not self._restored.is_set() and (
                self._wanted_now() or frozenset()) <= self._ready:
            self._mark_restored()
        return sum(counted.values())

    def _sync_idle(self, consumer: Consumer, held: frozenset[int], polled_at_ms: int) -> None:
        """Partitions read to their end with nothing new say so now and then (four times
        within the topic's delete retention at least)."""
        retention_s = self._watch.delete_retention_ms / 1000
        due = time.monotonic() - min(SYNC_EVERY_S, retention_s / 4)
        for partition in held:
            position = self._positions.get(partition)
            if (position is None or self._synced_at.get(partition, 0.0) > due
                    or self._restoration.state(partition) is None):
                continue
            if position >= self._note_high_watermark(consumer, partition):
                self.store.synced(partition, polled_at_ms)
                self._synced_at[partition] = time.monotonic()

    def _note_high_watermark(self, consumer: Consumer, partition: int) -> int:
        _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                 cached=True)
        if high >= 0:
            self._high_watermarks[partition] = high
        return max(high, 0)
