"""One look at the source partitions' end offsets per interval for every idle stream thread of
a process, as one Kafka Streams consumer serves all the tasks of its stream thread.

Each idle stream thread used to ask the brokers for its partitions' ends every trigger
interval: a host of many projections sent that many ListOffsets requests each interval, even
with nothing new anywhere (docs/benchmarks.md, "One look for every idle projection"). A
``SourceWatch`` asks once per interval for the union of the partitions its threads watch and
wakes them after each look; a thread takes the shared answer only if that look started after
its last batch ended, and asks for itself otherwise (right after a batch, so that records that
came during it are read at once, as before).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import KafkaException

from eventfold.contract import PartitionKey
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner

log = logging.getLogger(__name__)

STALE_LOOKS = 5
"""Intervals after which a look's answer is too old to be taken for a newer one."""


class SourceWatch:
    """The latest ends of the partitions its watchers name, looked at every ``interval_s``
    by a thread of its own while any watcher is registered."""

    def __init__(self, kafka: KafkaConnection, interval_s: float,
                 open_planner: Callable[[KafkaConnection], OffsetPlanner] = OffsetPlanner
                 ) -> None:
        self._kafka = kafka
        self._open_planner = open_planner
        self._interval_s = interval_s
        self._changed = threading.Condition()
        self._watched: dict[object, frozenset[PartitionKey]] = {}
        self._ends: dict[PartitionKey, int] = {}
        self._looked_at = float("-inf")
        """When the last successful look started (``time.monotonic()``)."""
        self._looks = 0
        # A look older than this is not taken (the watch's thread stuck on a broker that
        # does not answer, say): the threads ask for themselves, as they did before.
        self._stale_after_s = STALE_LOOKS * interval_s + 1.0
        self._thread: threading.Thread | None = None

    def watch(self, watcher: object, partitions: Iterable[PartitionKey]) -> None:
        """Look at ``partitions`` for ``watcher`` from the next look on (replacing what it
        named before)."""
        with self._changed:
            self._watched[watcher] = frozenset(partitions)
            if self._thread is None:
                self._thread = threading.Thread(target=self._look_while_watched,
                                                name="source-watch", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def unwatch(self, watcher: object) -> None:
        with self._changed:
            self._watched.pop(watcher, None)

    def ends(self, partitions: Iterable[PartitionKey], looked_after: float
             ) -> dict[PartitionKey, int] | None:
        """The ends of ``partitions`` from the last look, if it started after
        ``looked_after`` (``time.monotonic()``), is recent and answered for each of them;
        None otherwise (the caller asks for itself)."""
        with self._changed:
            if not looked_after <= self._looked_at > time.monotonic() - self._stale_after_s:
                return None
            try:
                return {key: self._ends[key] for key in partitions}
            except KeyError:
                return None

    def wait_for_look(self, timeout_s: float) -> None:
        """Until the next look has answered, or ``timeout_s`` has passed."""
        with self._changed:
            looks = self._looks
            self._changed.wait_for(lambda: self._looks != looks, timeout_s)

    def _look_while_watched(self) -> None:
        planner: OffsetPlanner | None = None
        while True:
            with self._changed:
                idle = not self._watched
            if idle and planner is not None:
                planner.close()  # no connection kept while no projection streams
                planner = None
            with self._changed:
                self._changed.wait_for(lambda: bool(self._watched))
                partitions = set().union(*self._watched.values())
            started = time.monotonic()
            try:
                if planner is None:
                    planner = self._open_planner(self._kafka)
                self._note(started, self._look(planner, partitions))
            except Exception:
                log.warning("the source watch's look failed; each stream thread looks for "
                            "itself until one answers", exc_info=True)
                self._note(started, None)
            time.sleep(max(0.0, started + self._interval_s - time.monotonic()))

    @staticmethod
    def _look(planner: OffsetPlanner, partitions: set[PartitionKey]
              ) -> Mapping[PartitionKey, int] | None:
        try:
            return planner.end_offsets(partitions)
        except KafkaException as exc:
            # A topic deleted under one projection fails the look for all: each thread asks
            # for its own partitions until a look answers again, and the one whose topic is
            # gone says so (``StreamThread``).
            log.debug("looking at %d source partitions: %s", len(partitions), exc)
            return None

    def _note(self, started: float, ends: Mapping[PartitionKey, int] | None) -> None:
        with self._changed:
            if ends is not None:
                # Replaced, not updated: a partition no look names any more (its watcher
                # gone) must not answer for a thread that watches it again later.
                self._ends = dict(ends)
                self._looked_at = started
            else:
                self._looked_at = float("-inf")
            self._looks += 1
            self._changed.notify_all()


_watches: dict[tuple[KafkaConnection, float], SourceWatch] = {}
_watches_lock = threading.Lock()


def source_watch(kafka: KafkaConnection, interval_s: float) -> SourceWatch:
    """The process's watch of ``kafka``'s partitions every ``interval_s``: one for all of its
    stream threads with that interval (a host's projections share the trigger interval)."""
    with _watches_lock:
        watch = _watches.get((kafka, interval_s))
        if watch is None:
            watch = _watches[(kafka, interval_s)] = SourceWatch(kafka, interval_s)
        return watch
