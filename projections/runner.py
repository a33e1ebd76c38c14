"""Running a projection: a stream thread (``stream_thread``) on the driver finds the records the
store has not committed.

Each batch: the runner shares the offset ranges out over Spark tasks; the executors read, fold
and write them (``execution.engine``): each task stages the rows it
changed and produces their KTable records, derived events and dead letters, with delivery
reports; then the runner commits, in one Postgres transaction, the staged rows, watermarks,
parked events, offsets and batch id (``state.store``). The driver handles counts, never keys.
A crash anywhere replays the batch; the offset and watermark guards make the replay a no-op for
what was committed, and KTable re-writes are the same values again (last value wins).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from eventfold.contract import PartitionKey, interval_seconds
from eventfold.outbox.history import count_events
from eventfold.outbox.kafka import GroupProgress
from eventfold.projections import metrics
from eventfold.projections.definition.projection import Projection
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.execution.engine import (
    SourceSlice,
    fold_on_driver,
    read_events,
    run_aggregation,
    run_aggregation_in_place,
    run_fold,
    run_fold_in_place,
    warm_python_workers,
)
from eventfold.projections.execution.kafka_source import KafkaSlice, OffsetRange, cap_rows
from eventfold.projections.execution.store_source import STORE_PARTITION, store_slices
from eventfold.projections.execution.turns import TURNS, ReplayTurn
from eventfold.projections.faults import crash_point
from eventfold.projections.outcome import DeadLetter
from eventfold.projections.plan import Pipeline, compile_projection
from eventfold.projections.progress import WAITED, PhaseClock, Progress, ProgressLog
from eventfold.projections.retention import SourceTopics, check_sources, ends_behind
from eventfold.projections.run_settings import (
    RunnerSettings,
    executor_database_url,
)
from eventfold.projections.running_query import RunningQuery, described
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.lease import LEASE_S, WriterLease
from eventfold.projections.state.parking import ParkedKeysReleased
from eventfold.projections.state.producer import LetterNote
from eventfold.projections.state.stage import NOTED_LETTERS, KeySplitAcrossPartitions, StagedBatch
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink
from eventfold.projections.state.transactions import fence_writers, writer_slots
from eventfold.projections.stream_thread import StreamThread
from eventfold.projections.task_errors import raised_in_task
from eventfold.projections.upkeep import Upkeep

log = logging.getLogger(__name__)

class ProjectionRunner:
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

    @property
    def writer(self) -> str:
        """The prefix of this version's transactional ids (``topics.writer_transactional_id``)."""
        return f"eventfold.{self.projection.name}.v{self.version}"

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

    def check_writer(self) -> None:
        """Raise ``WriterFenced`` once this runner lost the writer lease."""
        if self.lease is not None and self.is_active:
            self.lease.check()

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

    def _apply(self, batch_id: int, committed: dict[PartitionKey, int],
               end: dict[PartitionKey, int], records: int, pipeline: Pipeline | None,
               fold: Fold, clock: PhaseClock | None = None, started: float | None = None
               ) -> None:
        """Fold the batch (its tasks write what they fold), then commit up to ``end``.
        ``clock`` has timed the batch's planning, which began at ``started`` (Unix time)."""
        clock, started = clock or PhaseClock(), started or time.time()
        name = self.projection.name
        emit_from = self.versions.emitted_offsets(name) if self.is_active else None
        if self.is_active:
            self.versions.batch_started(name, self.version, end, self.run_id)
            crash_point("batch.started")
        try:
            staged = self._fold_and_commit(batch_id, committed, end, pipeline, fold,
                                           emit_from, clock)
        except BaseException:
            if self.is_active:  # its commit ends it otherwise (``catalog.claim_batch``)
                self.versions.batch_ended(name, self.run_id)
            raise
        clock.lap("commit")
        for note in staged.notes:
            note.log(name)
        if staged.dead_letters > len(staged.notes):
            log.warning("projection %s batch %d: %d dead letters in all (`eventfold dlq list "
                        "%s`)", name, batch_id, staged.dead_letters, name)
        self.offsets = {**committed, **staged.next_offsets}
        phases = {**clock.laps, **{f"task_{phase}": seconds
                                   for phase, seconds in staged.seconds.items()}}
        waited = None if staged.first_append_ms is None else max(
            started - staged.first_append_ms / 1000, 0.0)
        if self.settings.metrics:
            metrics.batch_committed(self.projection.name, records, staged.applied,
                                    staged.duplicates, staged.dead_letters, phases, waited)
        log.debug("projection %s batch %d: %d records, %d rows written; %s; the tasks' %s",
                  name, batch_id, records,
                  staged.new_rows + staged.known_rows + staged.direct_rows, clock,
                  ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds
                            in sorted(staged.seconds.items())))
        self.batches += 1
        self.progress.add(batch_id, records, staged,
                          phases if waited is None else {**phases, WAITED: waited})
        if self.group_progress is not None:
            self.group_progress.commit({k: o for k, o in staged.next_offsets.items()
                                        if k != STORE_PARTITION})
        if self.is_active:
            self.upkeep.between_batches()

    def _fold_and_commit(self, batch_id: int, committed: dict[PartitionKey, int],
                         end: dict[PartitionKey, int], pipeline: Pipeline | None, fold: Fold,
                         emit_from: Mapping[PartitionKey, int] | None,
                         clock: PhaseClock) -> StagedBatch:
        """Attempts at the batch until one commits: folded again when a key it held back was
        retried meanwhile, after a shuffle when a key turned up in two partitions."""
        name = self.projection.name
        while True:
            context = self._context(emit_from, committed)
            if context.direct:
                self.store.begin_direct()
            try:
                staged = fold(context, pipeline)
            except Exception as exc:
                # A replay that switched versions dropped this one's tables under its tasks; a
                # newer writer fenced its producers.
                self.versions.check_current(name, self.version)
                self.check_writer()
                if raised_in_task(exc, KeySplitAcrossPartitions) and self._can_fall_back(
                        pipeline):
                    log.warning("projection %s batch %d: a key is in more than one partition;"
                                " folding the batch after a shuffle", name, batch_id)
                    pipeline = self.plan.fallback
                    continue
                raise
            if self.is_active:
                self.versions.batch_written(name, self.run_id)
            clock.lap("fold")
            staged.next_offsets = {k: max(o, committed.get(k, 0)) for k, o in end.items()}
            try:
                self._commit(batch_id, committed, staged)
                crash_point("commit.done")
                return staged
            except ParkedKeysReleased as released:
                log.info("projection %s batch %d: %s (%s); folding the batch again", name,
                         batch_id, released, ", ".join(sorted(released.keys)[:5]))
            except KeySplitAcrossPartitions as split:
                if not self._can_fall_back(pipeline):
                    raise
                # Some producer put a key into two partitions: this batch goes after a shuffle.
                log.warning("projection %s batch %d: a key is in more than one partition "
                            "(%s); folding the batch after a shuffle", name, batch_id, split)
                pipeline = self.plan.fallback

    def _can_fall_back(self, pipeline: Pipeline | None) -> bool:
        return self.plan.fallback is not None and pipeline is not self.plan.fallback

    def _context(self, emit_from: Mapping[PartitionKey, int] | None,
                 committed: Mapping[PartitionKey, int]) -> BatchContext:
        """A new attempt at a batch: what its tasks need to know. A version that has
        committed nothing, built beside the active one, takes its tasks' rows directly."""
        fresh = self.store.checkpoint() is None
        self.upkeep.before_attempt()
        turn = TURNS.replay_turn(
            self.spark.sparkContext.defaultParallelism, self.settings.replay_rest_ratio,
            max(self.settings.driver_batch_max_rows, 1)) if self.yields_to_live else ReplayTurn()
        return BatchContext(
            self.plan, self.version, self.executor_database_url, self.settings.kafka,
            uuid.uuid4().hex, emit_from, committed, self.settings.replication,
            self.settings.topic_configs.derived_config(),
            fresh=fresh, direct=fresh and not self.is_active,
            any_parked=self.plan.parks and self.store.any_parked(),
            writer=self.writer if self.is_active and self.lease is not None else None,
            writer_epoch=self.lease.epoch or 0 if self.lease is not None else 0,
            writer_lease_s=self.lease.lease_s if self.lease is not None else LEASE_S,
            tasks=turn.tasks, rest_ratio=turn.rest_ratio,
            ktable_partitions=self.topics.output.partition_history)

    def _commit(self, batch_id: int, committed: dict[PartitionKey, int],
                staged: StagedBatch) -> None:
        """Commit what the batch's tasks staged. Raises ``ParkedKeysReleased`` when a key it
        held back as parked was retried meanwhile, ``KeySplitAcrossPartitions`` when two
        tasks folded one key: nothing was committed, the batch is to be folded again."""
        if new_outputs := self.topics.ensure_outputs(staged.topics):
            self.versions.note_outputs(self.projection.name, new_outputs)
        writing = self.lease if self.is_active else None
        if self.store.commit(batch_id, staged, committed,
                             writer_epoch=writing.epoch if writing else None,
                             writer_lease_s=writing.lease_s if writing else LEASE_S,
                             lease_renewed=writing.renewed_in_commit if writing else None):
            self.store.produce_pending_letters(self._produce_held)

    def _produce_held(self, letters: Sequence[DeadLetter]) -> None:
        """The letters held behind keys parked before their batch, which its commit
        decided."""
        written = self.topics.output.dead_letters(letters)
        self.topics.output.flush()
        for letter in written[:NOTED_LETTERS]:
            LetterNote.of(letter).log(self.projection.name)

    def _slices_fold(self, slices: Sequence[SourceSlice]) -> Fold:
        return lambda context, pipeline: self._fold(slices, context, pipeline)

    def _fold(self, slices: Sequence[SourceSlice], context: BatchContext,
              pipeline: Pipeline | None) -> StagedBatch:
        if pipeline in _IN_PLACE and sum(s.rows for s in slices) <= (
                self.settings.driver_batch_max_rows):
            return fold_on_driver(slices, dataclasses.replace(
                context, database_url=self.settings.database_url), pipeline)
        if pipeline is Pipeline.FOLD_IN_PLACE:
            return run_fold_in_place(self.spark, slices, context)
        if pipeline is Pipeline.AGGREGATE_IN_PLACE:
            return run_aggregation_in_place(self.spark, slices, context)
        return self._fold_events(read_events(self.spark, slices, context), context, pipeline)

    @staticmethod
    def _fold_events(events: DataFrame, context: BatchContext,
                     pipeline: Pipeline | None) -> StagedBatch:
        if pipeline is Pipeline.AGGREGATE_AFTER_SHUFFLE:
            return run_aggregation(events, context)
        return run_fold(events, context)

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.progress.close()
        self.topics.close()
        self.store.close()
        self.versions.close()
        if self.group_progress is not None:
            self.group_progress.close()


_IN_PLACE = (Pipeline.FOLD_IN_PLACE, Pipeline.AGGREGATE_IN_PLACE)

Fold = Callable[[BatchContext, Pipeline | None], StagedBatch]
"""One attempt at a batch's fold, along a pipeline: its tasks' counts."""


def _unread_ranges(committed: Mapping[PartitionKey, int],
                   end: Mapping[PartitionKey, int]) -> list[OffsetRange]:
    """What the store has not applied yet, up to the batch's end: per partition."""
    ranges = [OffsetRange(topic, partition, committed.get((topic, partition), 0), offset)
              for (topic, partition), offset in sorted(end.items())]
    return [r for r in ranges if r.end > r.start]
