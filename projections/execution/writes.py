"""What a task does with what it folded: it writes it, on the executor.

``TaskWriter`` stages the rows of the keys the task changed (and the streams' watermarks, and
the letters that park a key) for the batch's commit, and produces the KTable records, derived
events and dead letters itself, each with a delivery report; ``finish`` waits for them all
(a refused record fails the task, so the batch does not commit and runs again) and hands the
driver the task's counts. The one exception: a letter held behind a key parked before the
batch is produced after the commit, which decides whether the key is still parked.

A task of the active version produces in a Kafka transaction of its slot's id, taken only
while the writer lease is at the runner's epoch, and committed only under the projection's
fence lock with the epoch checked again (``lease.guard_kafka_commit``): a runner that lost
its lease while it was frozen commits nothing after the new holder took over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from eventfold.projections.execution import worker
from eventfold.projections.execution.context import BatchContext
from eventfold.projections.faults import crash_point
from eventfold.projections.outcome import FoldOutcome, RawRecords
from eventfold.projections.state.lease import epoch_is, guard_kafka_commit
from eventfold.projections.state.producer import LetterNote, OutputProducer
from eventfold.projections.state.stage import NOTED_LETTERS, StagedBatch
from eventfold.projections.state.store import ReadModelStore, server_started
from eventfold.projections.state.transactions import TransactionalWrites


class TaskClock:
    """Where a task's time goes (``TASK_PHASES``): each ``phase`` adds its time; what no
    phase claimed was spent reading and decoding records. A task whose batch asks it to
    (``BatchContext.rest_ratio``: a replay's beside live projections) rests between its
    chunks of records ``rest_ratio`` times as long as it worked since the last rest."""

    def __init__(self, rest_ratio: float = 0.0) -> None:
        self.started = self._rested_at = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.first_append_ms: int | None = None
        self._rest_ratio = rest_ratio
        self._chunks = 0

    def next_chunk(self) -> None:
        """Before the task's next chunk of records: a rest, if its batch asks for one, before
        every chunk but the first (a batch of one chunk, as the driver folds, never rests)."""
        self._chunks += 1
        if self._chunks == 1 or self._rest_ratio <= 0:
            return
        worked = time.perf_counter() - self._rested_at
        with self.phase("rest"):
            time.sleep(self._rest_ratio * worked)
        self._rested_at = time.perf_counter()

    def saw(self, records: RawRecords) -> None:
        """Note when the earliest of ``records`` was appended to Kafka: the batch's driver
        measures from it how long records waited for their batch."""
        first = records.first_append_ms
        if first is not None and (self.first_append_ms is None or first < self.first_append_ms):
            self.first_append_ms = first

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def total(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self.started
        return {**self.seconds, "read": max(elapsed - sum(self.seconds.values()), 0.0)}


class TaskWriter:
    def __init__(self, store: ReadModelStore, context: BatchContext) -> None:
        self.context = context
        self.store = store
        self.stage = store.stage(context.attempt)
        self.transaction = self._begin_transaction()
        self.output = OutputProducer(
            worker.producer(context.kafka) if self.transaction is None
            else self.transaction.producer, context.kafka, context.plan.projection,
            context.version, context.ktable_partitions)
        self.counts = StagedBatch(context.attempt)
        self.clock = TaskClock(context.rest_ratio)
        self._staged = False

    def _begin_transaction(self) -> TransactionalWrites | None:
        """The slot's transactional producer, in a transaction begun (None: the batch's
        version produces plainly). Taking the slot's id fences whoever had it, so a task
        whose runner lost the lease takes none."""
        context = self.context
        if context.writer is None:
            return None
        with self.store.conn.transaction():
            epoch_is(self.store.conn, context.plan.projection.name, context.writer_epoch)
        transaction = worker.transactional_writes(context.kafka, context.writer)
        transaction.begin()
        return transaction

    def add(self, outcome: FoldOutcome, existing: Mapping[str, bool]) -> None:
        """Write ``outcome``, the fold of some of the task's keys; ``existing``: those of its
        keys that had a row when the task loaded them, and whether it was live."""
        counts, plan = self.counts, self.context.plan
        changed = outcome.changed
        clock = self.clock
        if changed:
            self._staged = True
            with clock.phase("stage"):
                if self.context.direct:
                    direct, live = self.stage.direct(changed.items())
                    counts.direct_rows += direct
                else:
                    new, known, live = self.stage.rows(changed.items(), existing)
                    counts.new_rows += new
                    counts.known_rows += known
                counts.live_rows_delta += live
            with clock.phase("produce"):
                self.output.states((key, changed[key]) for key in outcome.published)
        if outcome.watermarks and not plan.watermarks_in_rows:
            self._staged = True
            with clock.phase("stage"):
                counts.marks += self.stage.watermarks(outcome.watermarks)
        if outcome.emissions:
            topics = {emission.topic for emission in outcome.emissions}
            worker.ensure_derived_topics(self.context.kafka, self.context.replication, topics,
                                         self.context.derived_topic_config)
            counts.topics |= topics
            with clock.phase("produce"):
                self.output.emissions(outcome.emissions)
        letters = outcome.dead_letters
        if letters:
            held = outcome.held
            if plan.parks:
                self._staged = self.stage.letters(letters, held) > 0 or self._staged
            with clock.phase("produce"):
                written = self.output.dead_letters([letter for letter in letters if not (
                    letter.parks and letter.fold_key in held)])
            room = NOTED_LETTERS - len(counts.notes)
            counts.notes += [LetterNote.of(letter) for letter in written[:max(room, 0)]]
        counts.held |= outcome.held
        counts.applied += outcome.applied
        counts.duplicates += outcome.duplicates
        counts.dead_letters += len(letters)

    def finish(self) -> StagedBatch:
        """Wait for every record's delivery report (raises ``DeliveryFailed``); the task's
        counts for the driver (a Spark task hands them over as ``task_output.encode``s
        them)."""
        crash_point("task.produced")
        with self.clock.phase("flush"):
            self.output.flush()
            if self.transaction is not None:
                self._commit_transaction(self.transaction)
        crash_point("task.written")
        self.counts.seconds = self.clock.total()
        self.counts.first_append_ms = self.clock.first_append_ms
        # What was staged lives in UNLOGGED tables: the commit checks the server that holds
        # them is the one they were written to.
        if self._staged:
            self.counts.servers.add(server_started(self.store.conn))
        self.store.conn.rollback()
        return self.counts

    def _commit_transaction(self, transaction: TransactionalWrites) -> None:
        """Commit the task's Kafka transaction while holding the fence lock with the lease
        checked; aborted if the lease is lost (its records are never read)."""
        context, conn = self.context, self.store.conn
        try:
            with conn.transaction():
                guard_kafka_commit(conn, context.plan.projection.name, context.writer_epoch,
                                   context.writer_lease_s)
                crash_point("task.committing")
                transaction.commit()
        except BaseException:
            transaction.abort_quietly()
            raise
