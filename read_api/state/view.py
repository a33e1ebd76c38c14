"""A KTable topic restored into a state store and followed, as a Kafka Streams store restores
from its changelog: from the store's checkpoint (or the beginning) up to the end offsets seen
when each partition opened (``restore``), then live.

Two threads per view. The view's own thread applies the topic's records (the store's writer,
``store_writer.StoreWriter``, mixed in), or, in the other HTTP workers of an instance, reads
behind the writer's store and takes its place if it dies (here). The topic's watch
(``topic_watch``) measures what the view is asked about without trusting the first thread to
be well: every second the partitions' end offsets (the lag an answer carries is measured
against them), and every few seconds the topic's id and partition count: a topic deleted and
made again is restored from its new beginning, and partitions added are held and served.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import cast

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import (
    OffsetPlanner,
)
from eventfold.outbox.topics import TopicShape
from eventfold.read_api.state.entry import KTableEntry
from eventfold.read_api.state.heap import PROCESS_HEAP
from eventfold.read_api.state.restore import Restoration, RestoreProgress
from eventfold.read_api.state.rocksdb_store import RocksDBStore, stored_partitions
from eventfold.read_api.state.store_writer import CATCH_UP_EVERY_S, StoreWriter
from eventfold.read_api.state.stores import (
    StateStore,
    StoreClosed,
    StoreConfig,
    TopicOffsets,
    UnopenedStore,
    scratch_store_config,
)
from eventfold.read_api.state.topic_watch import TopicWatch

log = logging.getLogger(__name__)

_PROMOTE_EVERY_S = 1.0
_RETRY_S = 1.0
"""How often the partitions' end offsets are asked for: the lag an answer carries."""


class TopicRecreated(Exception):
    """The topic the view follows was deleted and made again."""


class KTableView(StoreWriter):
    """The partitions of one KTable topic this process holds, restored into a store and
    followed by a thread: the store's writer consumes them; a reader of a store another
    process writes catches up with it. Which partitions: ``assign`` (until then, none), or
    every one (``hold_all``)."""

    def __init__(self, kafka: KafkaConnection, topic: str,
                 config: StoreConfig | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.config = config or scratch_store_config()
        self.store: StateStore = UnopenedStore()
        self.partition_count: int | None = None
        self.on_partitions: Callable[[KTableView], None] | None = None
        """Called once the topic's partition count is known, and when it changes (to
        assign the view some)."""
        self.partition_counts: Callable[[str, str], tuple[int, ...]] = lambda _t, _id: ()
        """Every partition count a topic (by name and id) has had, oldest first, as the
        projection recorded them (``partition_history``)."""
        self._wanted: frozenset[int] | None = None
        self._hold_all = False
        self._heap = PROCESS_HEAP
        self._ready: frozenset[int] = frozenset()
        self._restoration = Restoration(topic)
        self._reading_progress: RestoreProgress | None = None
        self._positions: dict[int, int] = {}
        self._high_watermarks: dict[int, int] = {}
        self._synced_at: dict[int, float] = {}
        self._restored = threading.Event()
        self._restore_seconds: float | None = None
        self._started_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ktable-{topic}", daemon=True)
        self._watch = TopicWatch(kafka, topic, self._stop, held=lambda: list(self._positions),
                                 on_shape=self._shape_seen)

    def start(self) -> KTableView:
        self._started_at = time.monotonic()
        self._watch.start()
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
        self._watch.join(timeout_s=10)
        return not self._thread.is_alive()

    def retire(self) -> bool:
        """Stop, and delete the store's files: its topic is no longer served."""
        stopped = self.stop()
        if stopped:
            self.store.destroy()
        return stopped

    # -- what it says --------------------------------------------------------------------------
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
        return stored_partitions(self.config, self.topic)

    def partition_lags(self) -> dict[int, int]:
        """Each ready partition's lag in records."""
        return {p: lag for p in self._ready if (lag := self.partition_lag(p)) is not None}

    def partition_lag(self, partition: int) -> int | None:
        """The records of the partition not applied here, against its end offset as last
        measured (or as the writer last saw it, if later); None if it is not ready here."""
        if partition not in self._ready:
            return None
        end = max(self._watch.ends.get(partition, 0), self._high_watermarks.get(partition, 0))
        return max(end - self._positions.get(partition, 0), 0)

    @property
    def lag(self) -> int:
        """Records in the topic's held partitions not applied yet."""
        return sum(max(max(self._watch.ends.get(p, 0), self._high_watermarks.get(p, 0)) - position,
                       0) for p, position in list(self._positions.items()))

    @property
    def lag_measured_at(self) -> str | None:
        """When the end offsets the lag is measured against were last read (ISO 8601: every
        answer carries it)."""
        return self._watch.measured_at

    def partition_history(self) -> tuple[int, ...]:
        """Every partition count the topic has had, oldest first (a key written before
        partitions were added is where an older count put it)."""
        shape = self._watch.shape
        return () if shape is None else self.partition_counts(self.topic, shape.topic_id)

    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        return self.store.get(key, partition)

    def __len__(self) -> int:
        return len(self.store)

    @property
    def progress(self) -> RestoreProgress:
        if self.store.writer or self._reading_progress is None:
            return self._restoration.progress(self.restored)
        return self._reading_progress

    def _wanted_now(self) -> frozenset[int] | None:
        if self._hold_all and self.partition_count is not None:
            return frozenset(range(self.partition_count))
        return self._wanted

    def _shape_seen(self, shape: TopicShape) -> None:
        """The watch saw the topic: held partitions follow its partition count."""
        if self.partition_count is not None and shape.partitions != self.partition_count:
            log.warning("ktable %s: the topic has %d partitions now, %d before; holding the "
                        "new ones", self.topic, shape.partitions, self.partition_count)
        if shape.partitions != self.partition_count:
            self.partition_count = shape.partitions
            if self.on_partitions is not None:
                self.on_partitions(self)

    def _topic_now(self) -> TopicShape | None:
        """The topic's shape once the watch has seen it (None: stopped first). A topic not
        created yet is empty, and up to date."""
        while (shape := self._watch.shape) is None:
            if self._watch.looked.is_set():
                self._mark_restored()
                self._watch.check_now()
            if self._stop.wait(0.2):
                return None
        return shape

    def _recreated(self, shape: TopicShape) -> None:
        """Raise ``TopicRecreated`` if the watch has seen another topic by this name."""
        now = self._watch.shape
        if now is not None and now.topic_id != shape.topic_id:
            raise TopicRecreated(f"ktable {self.topic}: the topic was deleted and made again "
                                 f"(id {now.topic_id}, was {shape.topic_id}); restoring it "
                                 "from its new beginning")

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
            except TopicRecreated as exc:
                log.warning("%s", exc)
                self._ready = frozenset()
            # rocksdict raises a plain Exception for any failure of a database (one another
            # process wiped, say); the broker, KafkaException: the view must not die of either.
            except Exception as exc:
                log.warning("ktable %s: %s; opening its store again in %.0f s", self.topic,
                            exc, _RETRY_S, exc_info=True)
                self._ready = frozenset()
                self._stop.wait(_RETRY_S)

    def _serve(self) -> None:
        shape = self._topic_now()
        if shape is None:
            return
        self.store = RocksDBStore(self.config, self.topic, self._stop)
        try:
            continuing = frozenset[int]()
            if not self.store.writer:
                read_behind = self._read_behind(shape)
                if read_behind is None:
                    return
                continuing = read_behind
            self._follow(shape, continuing)
        finally:
            self.store.close()
            self._ready = frozenset()
            self._positions = {}

    def _offsets(self, partitions: Collection[int], shape: TopicShape) -> TopicOffsets:
        planner = OffsetPlanner(self.kafka)
        try:
            keys = [(self.topic, p) for p in sorted(partitions)]
            begin, end = planner.beginning_offsets(keys), planner.end_offsets(keys)
        finally:
            planner.close()
        return TopicOffsets(shape.topic_id, {p: o for (_, p), o in begin.items()},
                            {p: o for (_, p), o in end.items()},
                            self._watch.delete_retention_ms)

    # -- a reader -------------------------------------------------------------------------------
    def _read_behind(self, shape: TopicShape) -> frozenset[int] | None:
        """Serve what the writing process applies, holding the partitions assigned, until
        told to stop (None) or until the writer is gone and this process has taken its place:
        then the partitions it served restored, which stay so."""
        store = cast(RocksDBStore, self.store)
        next_promotion = time.monotonic() + _PROMOTE_EVERY_S
        while not self._stop.wait(CATCH_UP_EVERY_S):
            self._recreated(shape)
            wanted = self._wanted_now()
            if wanted is not None and wanted != store.partitions:
                store.close_partitions(store.partitions - wanted)
                store.open_partitions(wanted, TopicOffsets(shape.topic_id))
            if store.writer or (time.monotonic() >= next_promotion and store.take_writer_lock()):
                continuing = self._ready
                store.become_writer()
                return continuing
            if time.monotonic() >= next_promotion:
                next_promotion = time.monotonic() + _PROMOTE_EVERY_S
                self._reopen_written_before(store, shape)
            store.catch_up()
            self._positions = store.positions()
            self._high_watermarks = store.high_watermarks()
            self._ready = store.restored_partitions(shape.topic_id)
            self._reading_progress = RestoreProgress(
                sum(self._positions.values()), sum(self._high_watermarks.values()),
                self.restored, time.monotonic() - self._started_at)
            if wanted is not None and wanted <= self._ready:
                self._mark_restored()
        return None

    @staticmethod
    def _reopen_written_before(store: RocksDBStore, shape: TopicShape) -> None:
        """A topic made again: partitions still open on what the writer wrote for the one
        before it (it has not wiped them yet, or this secondary has not seen it) open again,
        until they are the new topic's."""
        stale = [p for p in store.partitions if store.written_for(p) not in (None,
                                                                             shape.topic_id)]
        if stale:
            store.close_partitions(stale)
            store.open_partitions(stale, TopicOffsets(shape.topic_id))

    def _report_progress(self) -> None:
        progress = self.progress
        log.info("ktable %s restoring: %d of %d records (%.0f/s)", self.topic,
                 progress.records, progress.total, progress.records_per_s)

    def _mark_restored(self) -> None:
        if self._restored.is_set():
            return
        self._restore_seconds = time.monotonic() - self._started_at
        log.info("ktable %s restored: %d keys, %d records applied in %.2f s", self.topic,
                 len(self.store), self.progress.records, self._restore_seconds)
        self._restored.set()
        self._heap.trim()
