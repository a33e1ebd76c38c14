"""A live projection's loop on the driver, as a Kafka Streams stream thread runs its tasks:
look at the source partitions' end offsets, fold what the store has not committed as one batch
of Spark jobs (``ProjectionRunner.fold_batch_up_to``), and look again at once; when there is
nothing new, look again after a short pause.

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
from typing import TYPE_CHECKING

from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.execution import worker
from pyspark import InheritableThread

from eventfold.contract import PartitionKey

if TYPE_CHECKING:
    from eventfold.projections.runner import ProjectionRunner

log = logging.getLogger(__name__)

PARTITIONS_REFRESH_S = 5.0
"""How old the source topics' partition list may get before a look asks for it again."""


class StreamThread:
    """Runs a runner's batches on a thread of its own until stopped, or with ``once`` until it
    has folded up to the end offsets it found at its start.

    Its methods are those of Spark's ``StreamingQuery`` that Eventfold uses (``isActive``,
    ``awaitTermination``, ``exception``, ``stop``), so that a caller runs either alike; unlike
    Spark's, ``awaitTermination`` does not raise: ``exception()`` says why it ended. The thread
    inherits the caller's Spark local properties (its scheduler pool).
    """

    def __init__(self, runner: ProjectionRunner, idle_wait_s: float, once: bool = False
                 ) -> None:
        self._runner = runner
        self._idle_wait_s = idle_wait_s
        self._once = once
        self._stopping = threading.Event()
        self._ended = threading.Event()
        self._error: BaseException | None = None
        self._partitions: list[PartitionKey] = []
        self._partitions_due = 0.0
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

    def stop(self, timeout_s: float = 60) -> None:
        """Stop after the batch under way, waiting up to ``timeout_s`` for it."""
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        runner = self._runner
        planner = OffsetPlanner(runner.settings.kafka)
        try:
            batch_id = runner.next_batch_id()
            target = self._end_offsets(planner) if self._once else None
            while not self._stopping.is_set():
                ending = target if target is not None else self._end_offsets(planner)
                if runner.fold_batch_up_to(batch_id, ending):
                    batch_id += 1
                elif self._once:
                    return
                else:
                    self._stopping.wait(self._idle_wait_s)
        except BaseException as exc:
            log.debug("projection %s: its stream thread failed", runner.projection.name,
                      exc_info=True)
            self._error = exc
        finally:
            planner.close()
            worker.release()
            self._ended.set()

    def _end_offsets(self, planner: OffsetPlanner) -> dict[PartitionKey, int]:
        """Every source partition's end. The partitions are asked for again every few
        seconds, not at every look: they change rarely, and partitions added since the start
        are read too."""
        now = time.monotonic()
        if now >= self._partitions_due:
            self._partitions = planner.partitions(self._runner.projection.source_topics)
            self._partitions_due = now + PARTITIONS_REFRESH_S
        return planner.end_offsets(self._partitions)
