"""A KTable topic watched from a thread of its own, without trusting the view's thread to be
well: every ``MEASURE_EVERY_S`` the end offsets of the partitions the view holds (the lag an
answer carries is measured against them), and every ``CHECK_TOPIC_EVERY_S``, or at once when
asked, the topic's shape (its id and partition count) and how long it keeps tombstones."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime

from confluent_kafka import KafkaException

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.outbox.topics import TopicAdmin, TopicShape

log = logging.getLogger(__name__)

MEASURE_EVERY_S = 1.0
"""How often the held partitions' end offsets are asked for."""
CHECK_TOPIC_EVERY_S = 2.0
"""How often the topic's id and partition count are asked for."""
DEFAULT_DELETE_RETENTION_MS = 86_400_000
"""Kafka's default ``delete.retention.ms``, for a topic whose config cannot be read."""


class TopicWatch:
    """What is known of one KTable topic, looked at until ``stop`` is set: ``shape`` (None
    until the topic exists), ``delete_retention_ms``, and the held partitions' ``ends``,
    ``measured_at``. ``on_shape`` is called with each shape seen."""

    def __init__(self, kafka: KafkaConnection, topic: str, stop: threading.Event,
                 held: Callable[[], Collection[int]],
                 on_shape: Callable[[TopicShape], None]) -> None:
        self.kafka, self.topic = kafka, topic
        self.shape: TopicShape | None = None
        self.delete_retention_ms = DEFAULT_DELETE_RETENTION_MS
        self.ends: dict[int, int] = {}
        self.measured_at: str | None = None
        self.looked = threading.Event()
        """Set once the topic was looked at (whether or not it exists)."""
        self._held, self._on_shape, self._stop = held, on_shape, stop
        self._asked = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ktable-watch-{topic}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def check_now(self) -> None:
        """Look at the topic's shape at once, not at the next ``CHECK_TOPIC_EVERY_S``."""
        self._asked.set()

    def _run(self) -> None:
        planner: OffsetPlanner | None = None
        admin: TopicAdmin | None = None
        next_check = 0.0
        try:
            while not self._stop.is_set():
                try:
                    planner = planner or OffsetPlanner(self.kafka)
                    admin = admin or TopicAdmin(self.kafka, timeout_s=10)
                    if time.monotonic() >= next_check or self._asked.is_set():
                        self._asked.clear()
                        self._look(admin)
                        next_check = time.monotonic() + CHECK_TOPIC_EVERY_S
                    self._measure(planner)
                except (KafkaException, TimeoutError, RuntimeError) as exc:
                    log.warning("ktable %s: could not look at the topic (will retry): %s",
                                self.topic, exc)
                    if planner is not None:  # its metadata may not know new partitions
                        planner.close()
                        planner = None
                self._asked.wait(MEASURE_EVERY_S)
                if self._stop.is_set():
                    return
        finally:
            if planner is not None:
                planner.close()

    def _look(self, admin: TopicAdmin) -> None:
        shape = admin.describe(self.topic)
        self.looked.set()
        if shape is None:
            return
        # asked each time: a config altered while the view runs counts from its next look
        self.delete_retention_ms = _delete_retention_ms(admin, self.topic)
        before, self.shape = self.shape, shape
        if before is not None and before.topic_id != shape.topic_id:
            log.warning("ktable %s: the topic was deleted and made again (id %s, was %s)",
                        self.topic, shape.topic_id, before.topic_id)
        self._on_shape(shape)

    def _measure(self, planner: OffsetPlanner) -> None:
        held = sorted(self._held())
        if not held:
            return
        ends = planner.end_offsets([(self.topic, p) for p in held])
        self.ends = {p: end for (_, p), end in ends.items()}
        self.measured_at = datetime.now(UTC).isoformat()


def _delete_retention_ms(admin: TopicAdmin, topic: str) -> int:
    """How long the topic keeps a tombstone after its log is cleaned (Kafka's default if the
    config cannot be read: an ACL may not allow it)."""
    try:
        return int(admin.configs(topic).get("delete.retention.ms")
                   or DEFAULT_DELETE_RETENTION_MS)
    except (KafkaException, ValueError) as exc:
        log.warning("ktable %s: its delete.retention.ms cannot be read (%s); taking Kafka's "
                    "default, %d ms", topic, exc, DEFAULT_DELETE_RETENTION_MS)
        return DEFAULT_DELETE_RETENTION_MS
