"""A batch of a projection version, from its fold to its commit: the runner's side of the
write and commit protocol. Each attempt folds (its tasks, or the driver for a small batch,
write what they fold and stage the rows), then one Postgres transaction commits the staged
rows, watermarks, parked events, offsets and batch id (``state.store``); an attempt whose
commit finds a key retried meanwhile, or a key in two partitions, is folded again (after a
shuffle for the second). ``BatchCommits`` is that protocol, mixed into
``runner.ProjectionRunner``, which holds what it reads."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from eventfold.contract import PartitionKey
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
)
from eventfold.projections.execution.store_source import STORE_PARTITION
from eventfold.projections.execution.turns import TURNS, ReplayTurn
from eventfold.projections.faults import crash_point
from eventfold.projections.outcome import DeadLetter
from eventfold.projections.plan import Pipeline, Plan
from eventfold.projections.progress import WAITED, PhaseClock, Progress
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.lease import LEASE_S, WriterLease
from eventfold.projections.state.parking import ParkedKeysReleased
from eventfold.projections.state.producer import LetterNote
from eventfold.projections.state.stage import NOTED_LETTERS, KeySplitAcrossPartitions, StagedBatch
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink
from eventfold.projections.task_errors import raised_in_task
from eventfold.projections.upkeep import Upkeep

# The runner's logger: a batch's lines are the run's, and operators filter on its name.
log = logging.getLogger("eventfold.projections.runner")


class BatchCommits:
    """The fold and commit of a batch, for a runner that has these."""

    spark: SparkSession
    projection: Projection
    plan: Plan
    settings: RunnerSettings
    versions: ProjectionCatalog
    version: int
    is_active: bool
    store: ReadModelStore
    executor_database_url: str
    topics: TopicSink
    batches: int
    offsets: dict[PartitionKey, int]
    upkeep: Upkeep
    group_progress: GroupProgress | None
    yields_to_live: bool
    progress: Progress
    lease: WriterLease | None
    run_id: str

    @property
    def writer(self) -> str:
        """The prefix of this version's transactional ids (``topics.writer_transactional_id``)."""
        return f"eventfold.{self.projection.name}.v{self.version}"

    def check_writer(self) -> None:
        """Raise ``WriterFenced`` once this runner lost the writer lease."""
        if self.lease is not None and self.is_active:
            self.lease.check()

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


_IN_PLACE = (Pipeline.FOLD_IN_PLACE, Pipeline.AGGREGATE_IN_PLACE)

Fold = Callable[[BatchContext, Pipeline | None], StagedBatch]
"""One attempt at a batch's fold, along a pipeline: its tasks' counts."""
