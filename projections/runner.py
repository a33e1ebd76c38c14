"""Running a projection version: its tables and topics, its writer lease, its live run (a
stream thread, ``stream_thread``, on the driver finds the records the store has not
committed) and its bounded catch-ups (a replay's, from the topics or the event store). What one
batch does is ``batch.BatchCommits``, mixed in.

Each batch: the runner shares the offset ranges out over Spark tasks; the executors read, fold
and write them (``execution.engine``): each task stages the rows it
changed and produces their KTable records, derived events and dead letters, with delivery
reports; then the runner commits, in one Postgres transaction, the staged rows, watermarks,
parked events, offsets and batch id (``state.store``). The driver handles counts, never keys.
A crash anywhere replays the batch; the offset and watermark guards make the replay a no-op for
what was committed, and KTable re-writes are the same values again (last value wins).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping

from pyspark.sql import SparkSession

from eventfold.contract import PartitionKey, interval_seconds
from eventfold.outbox.history import count_events
from eventfold.outbox.kafka import GroupProgress
from eventfold.projections.batch import BatchCommits
from eventfold.projections.definition.projection import Projection
from eventfold.projections.execution.engine import (
    warm_python_workers,
)
from eventfold.projections.execution.kafka_source import KafkaSlice, OffsetRange, cap_rows
from eventfold.projections.execution.store_source import STORE_PARTITION, store_slices
from eventfold.projections.execution.turns import TURNS
from eventfold.projections.plan import compile_projection
from eventfold.projections.progress import PhaseClock, Progress, ProgressLog
from eventfold.projections.retention import SourceTopics, check_sources, ends_behind
from eventfold.projections.run_settings import (
    RunnerSettings,
    executor_database_url,
)
from eventfold.projections.running_query import RunningQuery, described
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.lease import WriterLease
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink
from eventfold.projections.state.transactions import fence_writers, writer_slots
from eventfold.projections.stream_thread import StreamThread
from eventfold.projections.upkeep import Upkeep

log = logging.getLogger(__name__)

class ProjectionRunner(BatchCommits):
    """One version of one projection: its live run, its catch-ups and replays.

    Without ``version`` it runs the active version (registering version 1 on a first run) and
    emits derived events; with a version a replay is building, it emits nothing. The active
    version's run holds the projection's writer lease (``lease``, taken at ``start`` unless
    the caller took it, as a standby does) and produces in Kafka transactions named for it.
    """

    def __init__(self, spark: SparkSession, projection: Projection,
                 settings: RunnerSettings, version: int | None = None,
                 progress: Progress | None = None, lease: WriterLease | None = None) -> None:
        self.spark = spark
        self.projection = projection
        self.plan = compile_projection(projection)
        self.settings = settings
        self.versions = ProjectionCatalog(settings.database_url)
        active = self.versions.register(projection.name)
        self.version = version or active
        self.is_active = self.version == active
        self.store = ReadModelStore(settings.database_url, projection, self.version)
        self.executor_database_url = executor_database_url(spark, settings.database_url)
        self.topics = TopicSink(settings.kafka, projection, self.version,
                                settings.topic_configs, settings.replication)
        self.batches = 0
        self.offsets: dict[PartitionKey, int] = {}
        """What the store has committed, as of the last batch (or the start)."""
        self._prepared = self._tables_ready = False
        self.upkeep = Upkeep(projection, self.version, settings, self.store, self.topics,
                             self.versions)
        # The active version's progress also shows in Kafka, as group
        # eventfold.projection.<name> (a replay's build does not report).
        group = f"eventfold.projection.{projection.name}"
        self.group_progress = GroupProgress(settings.kafka, group) if self.is_active else None
        self.yields_to_live = not self.is_active  # a build's batches give live ones a turn
        self.progress: Progress = progress or ProgressLog(projection.name)
        self.lease = lease
        self.run_id = uuid.uuid4().hex
        """This run, as its batch under way is recorded (``catalog.batch_started``)."""
        self._sources: SourceTopics | None = None

    def prepare(self) -> None:
        """Tables, topics and (the active version) the view: once per runner, as a replay's
        last catch-up runs while it holds the lock every live commit waits for."""
        if self._prepared:
            return
        self._ensure_tables()
        if self.is_active:
            with self.store.conn.transaction():
                self.store.publish_view(self.store.conn)
        self._prepared = True

    def _ensure_tables(self) -> None:
        if not self._tables_ready:
            self.store.ensure_schema()
            self.topics.ensure_topics()
            self.upkeep.look_at_partitions()
            self._tables_ready = True

    def warm_up(self) -> None:
        """What a standby does while it waits for the lease, so that it writes soon after
        taking it: tables and topics made sure of, and Spark's Python workers started with
        the fold's modules loaded (the view is the writer's to publish)."""
        self._ensure_tables()
        warm_python_workers(self.spark, self.plan)

    def start(self, once: bool = False) -> RunningQuery:
        """Start streaming: ``once`` catches up with what is there now and stops."""
        what = f"projection {self.projection.name} v{self.version}"
        clock = PhaseClock(watching=f"{what}: starting")
        with clock.phase("tables, topics and view"):
            self.prepare()
        if self.is_active:
            with clock.phase("writer lease"):
                self._take_writer_lease()
        with clock.phase("checkpoint"):
            committed = self.offsets = self.store.committed_offsets()
            if self.plan.parks:  # letters a commit decided before its process died
                self.store.produce_pending_letters(self._produce_held)
        with clock.phase("source check"):
            self._sources = check_sources(self.projection, self.version, self.settings,
                                          committed)
        with clock.phase("query"):
            query: RunningQuery = StreamThread(
                self, interval_seconds(self.settings.trigger_interval), once).start()
        log.info("%s: %s from %s; started in %s", what, "catching up" if once else "streaming",
                 ", ".join(self.projection.source_topics), clock)
        return query

    @property
    def actor(self) -> str:
        """Who this runner's threads work for, as fault points are told
        (``faults.acting_as``): its lease's holder, or the version it builds."""
        if self.lease is not None:
            return self.lease.holder
        return f"{self.projection.name}.v{self.version}"

    def _take_writer_lease(self) -> None:
        """Hold the projection's writer lease (raises ``WriterBusy`` naming a live holder),
        then fence at the broker every producer an older writer of this version may still
        have: its transactions open now are aborted and it can commit none after."""
        if self.lease is None:
            self.lease = WriterLease(self.settings.database_url, self.projection.name,
                                     lease_s=self.settings.writer_lease_s)
        if not self.lease.held:
            self.lease.take()
        tasks = max(self.spark.sparkContext.defaultParallelism,
                    int(self.spark.conf.get("spark.sql.shuffle.partitions") or 1))
        self.lease.renewing()
        # Every slot any holder's tasks said they write from: one it never said is one a
        # task of an older holder could still hold a transaction open on.
        fence_writers(self.settings.kafka, self.writer, writer_slots(self.lease.widen(tasks)))

    def catch_up(self, timeout_s: float = 3600) -> None:
        query = self.start(once=True)
        if not query.awaitTermination(int(timeout_s)):
            query.stop()
            raise TimeoutError(f"projection {self.projection.name} v{self.version} had not "
                               f"caught up after {timeout_s:.0f} s")
        if (error := query.exception()) is not None:
            raise RuntimeError(f"projection {self.projection.name} v{self.version} failed: "
                               f"{described(error)}") from error

    # -- bounded catch-ups (a replay): batches up to fixed ends, no stream thread ------------
    # The store's checkpoint says where each starts, so an interrupted replay resumes from what
    # the store committed.

    def fold_topics_up_to(self, ending: Mapping[PartitionKey, int]) -> None:
        """Fold the source topics up to ``ending``, at most ``max_rows_per_batch`` a batch."""
        self.prepare()
        batch_id = self.next_batch_id()
        self._sources = check_sources(self.projection, self.version, self.settings,
                                      self.store.committed_offsets())
        while self.fold_batch_up_to(batch_id, ending):
            batch_id += 1

    def fold_batch_up_to(self, batch_id: int, ending: Mapping[PartitionKey, int]) -> int:
        """Fold one batch of the records the store has not committed below ``ending``, at
        most ``max_rows_per_batch`` of them; how many it folded (0: none were left)."""
        started, clock = time.time(), PhaseClock()
        committed = self.store.committed_offsets()
        begin = {k: committed.get(k, 0) for k in ending}
        end = cap_rows(begin, ending, self._batch_rows())
        records = sum(end[k] - begin[k] for k in end)
        if records <= 0 and not ends_behind(committed, ending):
            return 0
        self.check_sources()
        if records <= 0:
            return 0  # a new leader's high watermark trailing the old one's
        if self.is_active:
            TURNS.worked(self.projection.name, records)
        slices = [KafkaSlice(self.settings.kafka, r) for r in _unread_ranges(committed, end)]
        clock.lap("plan")
        self._apply(batch_id, committed, end, records, self.plan.pipeline,
                    self._slices_fold(slices), clock, started)
        return records

    def fold_store_up_to(self, upto: int) -> None:
        """Fold the event store's log up to global position ``upto``, in windows of
        ``max_rows_per_batch`` positions, each read as its stream buckets."""
        self.prepare()
        sources = tuple(self.projection.sources)
        batch_id = self.next_batch_id()
        while True:
            committed = self.store.committed_offsets()
            after = committed.get(STORE_PARTITION, 0)
            if after >= upto:
                return
            end = min(after + max(self.settings.max_rows_per_batch, 1), upto)
            with self.store.conn.transaction():
                records = count_events(self.store.conn, sources, after, end)
            slices = store_slices(self.executor_database_url, sources, after, end)
            self._apply(batch_id, committed, {STORE_PARTITION: end}, records,
                        self.plan.pipeline, self._slices_fold(slices))
            batch_id += 1

    def check_sources(self) -> None:
        """Stop if a source topic was deleted or made again since the run started."""
        if self._sources is not None:
            self._sources.check()

    def _batch_rows(self) -> int:
        """The most records the next batch takes: for the active version, fewer while
        another live projection of the process follows its topics closely
        (``execution.turns``)."""
        if not self.is_active:
            return max(self.settings.max_rows_per_batch, 1)
        return TURNS.batch_rows(self.projection.name, self.settings.max_rows_per_batch,
                                self.settings.fair_batch_rows,
                                max(self.settings.driver_batch_max_rows, 1))

    def next_batch_id(self) -> int:
        checkpoint = self.store.checkpoint()
        return checkpoint.batch_id + 1 if checkpoint else 0

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.progress.close()
        self.topics.close()
        self.store.close()
        self.versions.close()
        if self.group_progress is not None:
            self.group_progress.close()


def _unread_ranges(committed: Mapping[PartitionKey, int],
                   end: Mapping[PartitionKey, int]) -> list[OffsetRange]:
    """What the store has not applied yet, up to the batch's end: per partition."""
    ranges = [OffsetRange(topic, partition, committed.get((topic, partition), 0), offset)
              for (topic, partition), offset in sorted(end.items())]
    return [r for r in ranges if r.end > r.start]
