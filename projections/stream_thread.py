"""A live projection's loop on the driver, as a Kafka Streams stream thread runs its tasks:
look at the source partitions' end offsets, fold what the store has not committed as one batch
of Spark jobs (``ProjectionRunner.fold_batch_up_to``), and look again at once; when there is
nothing new, take the process's next shared look, which every idle thread takes
(``source_watch``).

It replaces a Spark Structured Streaming query for Eventfold's own source: the read model's
store holds the only checkpoint a projection resumes from, so the query's offset and commit
logs, its planner process and the job that collected each batch's planned ranges cost every
batch time and every projection memory while deciding nothing (docs/benchmarks.md). Spark still
runs every fold: the loop only decides when.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaException
from pyspark import InheritableThread
from pyspark.sql import SparkSession

from eventfold.contract import PartitionKey
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.definition.projection import Projection
from eventfold.projections.execution import worker
from eventfold.projections.faults import acting_as
from eventfold.projections.source_watch import SourceWatch, source_watch

if TYPE_CHECKING:
    from eventfold.projections.run_settings import RunnerSettings

log = logging.getLogger(__name__)

PARTITIONS_REFRESH_S = 5.0
"""How old the source topics' partition list may get before a look asks for it again."""
STALL_LONGEST_BATCHES = 3
"""A thread is stalled once a look or batch has gone on for its setting's floor plus this many
times the longest batch it has committed."""


class BatchRunner(Protocol):
    """What a stream thread drives: a projection's runner (``runner.ProjectionRunner``, which
    makes the thread; named here by what the loop asks of it, so the loop imports no runner)."""

    @property
    def spark(self) -> SparkSession: ...
    @property
    def projection(self) -> Projection: ...
    @property
    def settings(self) -> RunnerSettings: ...
    def next_batch_id(self) -> int: ...
    def check_writer(self) -> None: ...
    def check_sources(self) -> None: ...
    def fold_batch_up_to(self, batch_id: int, ending: Mapping[PartitionKey, int]) -> int: ...
    @property
    def actor(self) -> str: ...


class StreamThread:
    """Runs a runner's batches on a thread of its own until stopped, or with ``once`` until it
    has folded up to the end offsets it found at its start.

    Its methods are named as Spark's ``StreamingQuery``'s (``isActive``, ``awaitTermination``,
    ``exception``, ``stop``); unlike Spark's, ``awaitTermination`` does not raise:
    ``exception()`` says why it ended. The thread
    inherits the caller's Spark local properties (its scheduler pool), and runs its jobs in a
    job group of its own (``job_group``), which a watchdog cancels when ``stalled_for`` says
    a look or batch has gone on too long.
    """

    def __init__(self, runner: BatchRunner, idle_wait_s: float, once: bool = False) -> None:
        self._runner = runner
        self._idle_wait_s = idle_wait_s
        self._once = once
        self.job_group = f"eventfold-{runner.projection.name}-{uuid.uuid4().hex[:8]}"
        self._step_started = time.monotonic()
        self._longest_batch_s = 0.0
        self._stopping = threading.Event()
        self._ended = threading.Event()
        self._error: BaseException | None = None
        self._partitions: list[PartitionKey] = []
        self._partitions_due = 0.0
        # Idle, the thread takes the process's shared look at the ends (``source_watch``);
        # right after a batch, and catching up ``once``, it asks for itself.
        self._watch: SourceWatch | None = None
        self._looked_after = time.monotonic()
        self._nothing_below: Mapping[PartitionKey, int] | None = None
        """The ends at the last look that found nothing to fold, until the partitions are
        listed again: the same ends again need no batch (nor the checkpoint read it starts
        with)."""
        self._thread = InheritableThread(self._run, name=f"stream-{runner.projection.name}",
                                         daemon=True)

    def start(self) -> StreamThread:
        self._thread.start()
        return self

    @property
    def isActive(self) -> bool:
        return not self._ended.is_set()

    def awaitTermination(self, timeout: float | None = None) -> bool:
        """Whether it has ended, waiting up to ``timeout`` seconds (None: until it has)."""
        return self._ended.wait(timeout)

    def exception(self) -> BaseException | None:
        """What ended it, if it failed."""
        return self._error

    def stalled_for(self, floor_s: float) -> float | None:
        """How long the look or batch under way has gone on, once that is past the bound
        (``floor_s``, the watchdog's, plus ``STALL_LONGEST_BATCHES`` times the longest batch
        so far); None while it is within it, or the thread has ended."""
        if self._ended.is_set():
            return None
        running = time.monotonic() - self._step_started
        bound = floor_s + STALL_LONGEST_BATCHES * self._longest_batch_s
        return running if running > bound else None

    def stop(self, timeout_s: float = 60) -> None:
        """Stop after the batch under way, waiting up to ``timeout_s`` for it."""
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        runner = self._runner
        acting_as(runner.actor)
        runner.spark.sparkContext.setJobGroup(
            self.job_group, f"projection {runner.projection.name}", interruptOnCancel=True)
        planner = OffsetPlanner(runner.settings.kafka)
        if not self._once:
            self._watch = source_watch(runner.settings.kafka, self._idle_wait_s)
        try:
            batch_id = runner.next_batch_id()
            target = self._end_offsets(planner) if self._once else None
            while not self._stopping.is_set():
                self._step_started = started = time.monotonic()
                runner.check_writer()  # a runner that lost its lease folds nothing more
                try:
                    ending = target if target is not None else self._end_offsets(planner)
                except KafkaException:
                    runner.check_sources()  # a source topic deleted under the run says so
                    raise
                if ending != self._nothing_below and runner.fold_batch_up_to(batch_id, ending):
                    batch_id += 1
                    self._looked_after = time.monotonic()
                    self._longest_batch_s = max(self._longest_batch_s,
                                                self._looked_after - started)
                elif self._once:
                    return
                else:
                    self._nothing_below = ending
                    self._step_started = time.monotonic()
                    self._wait_for_look()
        except BaseException as exc:
            log.debug("projection %s: its stream thread failed", runner.projection.name,
                      exc_info=True)
            self._error = exc
        finally:
            try:
                if self._watch is not None:
                    self._watch.unwatch(self)
                planner.close()
                worker.release()
            except Exception as exc:  # what ended must still say so: the host waits on it
                log.warning("projection %s: letting its clients go: %s",
                            runner.projection.name, exc)
            finally:
                self._ended.set()

    def _end_offsets(self, planner: OffsetPlanner) -> dict[PartitionKey, int]:
        """Every source partition's end. The partitions are asked for again every few
        seconds, not at every look: they change rarely, and partitions added since the start
        are read too."""
        now = time.monotonic()
        if now >= self._partitions_due:
            self._partitions = planner.partitions(self._runner.projection.source_topics)
            self._partitions_due = now + PARTITIONS_REFRESH_S
            self._nothing_below = None
            if self._watch is not None:
                self._watch.watch(self, self._partitions)
        if self._watch is not None and (shared := self._watch.ends(
                self._partitions, looked_after=self._looked_after)) is not None:
            return shared
        return planner.end_offsets(self._partitions)

    def _wait_for_look(self) -> None:
        """Until the next shared look (or the idle pause, without one), or a stop."""
        if self._watch is None:
            self._stopping.wait(self._idle_wait_s)
        else:
            self._watch.wait_for_look(self._idle_wait_s)
