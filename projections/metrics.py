"""The projection runner's Prometheus metrics: batches, records, dead letters, parked keys, lag
per source partition and replay progress. A process serves them with ``eventfold.metrics``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

import psycopg
from confluent_kafka import KafkaException
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from eventfold.contract import PartitionKey
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner

log = logging.getLogger(__name__)
T = TypeVar("T")

BATCH_SECONDS = Histogram(
    "eventfold_projection_batch_duration_seconds",
    "Time to fold a micro-batch and commit its rows, KTable records and checkpoint",
    ["projection"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
PHASE_SECONDS = Histogram(
    "eventfold_projection_batch_phase_seconds",
    "Time a micro-batch spent in each phase: on the driver (plan: its offset ranges; fold: "
    "the tasks' job, or the driver's own fold, end to end; commit), and in its tasks, "
    "summed over them (task_read, task_load, task_fold, task_stage, task_produce, "
    "task_flush)",
    ["projection", "phase"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                      10, 30, 60))
RECORD_WAIT_SECONDS = Histogram(
    "eventfold_projection_record_wait_seconds",
    "From the append to Kafka of a batch's earliest record to the batch's start (the broker's "
    "clock against the driver's; batches that read Kafka in place)",
    ["projection"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
RECORDS = Counter("eventfold_projection_records", "Source records read by batches",
                  ["projection"])
APPLIED = Counter("eventfold_projection_applied_events",
                  "Events folded into state (duplicates and dead letters not counted)",
                  ["projection"])
DUPLICATES = Counter("eventfold_projection_duplicate_events",
                     "Events skipped as already applied (at-least-once delivery)",
                     ["projection"])
DEAD_LETTERS = Counter("eventfold_projection_dead_letters",
                       "Events sent to the projection's dead-letter topic", ["projection"])
LAST_BATCH = Gauge("eventfold_projection_last_batch_timestamp_seconds",
                   "When the last batch committed (Unix time)", ["projection"])
STALLED = Gauge("eventfold_projection_stalled",
                "1 while a projection's stream thread is stalled (a look or batch past its "
                "bound, EVENTFOLD_PROJECTION_STALL_S) and until its next run commits a batch",
                ["projection"])
REPLAY_EVENTS = Gauge("eventfold_replay_events", "Events a running replay has folded so far, "
                      "and the total it folds", ["projection", "of"])


def batch_committed(projection: str, records: int, applied: int, duplicates: int,
                    dead_letters: int, phases: Mapping[str, float],
                    waited_s: float | None) -> None:
    BATCH_SECONDS.labels(projection).observe(sum(
        seconds for phase, seconds in phases.items() if not phase.startswith("task_")))
    for phase, seconds in phases.items():
        PHASE_SECONDS.labels(projection, phase).observe(seconds)
    if waited_s is not None:
        RECORD_WAIT_SECONDS.labels(projection).observe(waited_s)
    RECORDS.labels(projection).inc(records)
    APPLIED.labels(projection).inc(applied)
    DUPLICATES.labels(projection).inc(duplicates)
    DEAD_LETTERS.labels(projection).inc(dead_letters)
    LAST_BATCH.labels(projection).set(time.time())


def replay_progress(projection: str, done: int, total: int) -> None:
    REPLAY_EVENTS.labels(projection, "done").set(done)
    REPLAY_EVENTS.labels(projection, "total").set(total)


class Throttled(Generic[T]):
    """What ``fetch`` returned last, fetched again at most every ``refresh_s`` (so frequent
    scrapes cost the source nothing more). A failure of one of ``errors`` is logged as
    ``what`` and the last value stands until the source answers."""

    def __init__(self, fetch: Callable[[], T], initial: T, refresh_s: float,
                 errors: tuple[type[Exception], ...], what: str) -> None:
        self._fetch = fetch
        self._value = initial
        self._refresh_s = refresh_s
        self._errors = errors
        self._what = what
        self._asked_at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if time.monotonic() - self._asked_at >= self._refresh_s:
                try:
                    self._value = self._fetch()
                except self._errors as exc:
                    log.warning("%s: %s", self._what, str(exc).strip().splitlines()[0])
                self._asked_at = time.monotonic()
            return self._value


class ProjectionLag(Collector):
    """``eventfold_projection_lag_events`` per source partition: its end offset less what the
    projection committed, computed when scraped. End offsets are asked of Kafka at most every
    ``refresh_s``."""

    def __init__(self, kafka: KafkaConnection, projection: str, topics: list[str],
                 committed: Callable[[], Mapping[PartitionKey, int] | None],
                 refresh_s: float = 2.0) -> None:
        self._kafka = kafka
        self._projection = projection
        self._topics = topics
        self._committed = committed
        self._ends: Throttled[dict[PartitionKey, int]] = Throttled(
            self._ask_end_offsets, {}, refresh_s, (KafkaException,),
            f"projection {projection}: end offsets for its lag")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "eventfold_projection_lag_events",
            "Events in a source partition the projection has not committed yet",
            labels=["projection", "topic", "partition"])
        committed = self._committed()
        if committed is None:  # not started yet: no figure rather than a wrong one
            yield family
            return
        for (topic, partition), end in sorted(self.end_offsets().items()):
            family.add_metric([self._projection, topic, str(partition)],
                              max(end - committed.get((topic, partition), 0), 0))
        yield family

    def end_offsets(self) -> dict[PartitionKey, int]:
        return dict(self._ends.get())

    def _ask_end_offsets(self) -> dict[PartitionKey, int]:
        planner = OffsetPlanner(self._kafka, timeout_s=5)
        try:
            return planner.end_offsets(planner.partitions(self._topics))
        finally:
            planner.close()


class ParkedKeys(Collector):
    """``eventfold_projection_parked_keys`` and ``eventfold_projection_parked_events``: the
    running version's keys waiting behind a dead letter, and the events they hold. Read when
    scraped, at most every ``refresh_s``: a retry or discard in another process changes them
    between batches."""

    def __init__(self, projection: str, counts: Callable[[], tuple[int, int] | None],
                 refresh_s: float = 5.0) -> None:
        self._projection = projection
        self._counts: Throttled[tuple[int, int] | None] = Throttled(
            counts, None, refresh_s, (psycopg.Error,), f"projection {projection}: parked keys")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        keys = GaugeMetricFamily("eventfold_projection_parked_keys",
                                 "Keys waiting behind a dead letter for a retry or discard",
                                 labels=["projection"])
        events = GaugeMetricFamily("eventfold_projection_parked_events",
                                   "Dead-lettered events the parked keys hold",
                                   labels=["projection"])
        if (counts := self._counts.get()) is not None:  # None: not started, or no answer yet
            keys.add_metric([self._projection], counts[0])
            events.add_metric([self._projection], counts[1])
        yield keys
        yield events
