"""What a runner looks after besides its batches, each at its own pace: the KTable topic's
partition count (partitions added under a running projection move keys), and, between two
batches of the active version, the retired KTable topics readers have left and the rows past
their retention."""

from __future__ import annotations

import logging
import time

from eventfold.projections.definition.projection import Projection
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore
from eventfold.projections.state.topics import TopicSink

log = logging.getLogger(__name__)

CLEANUP_EVERY_S = 30.0
"""How often an active runner deletes retired KTable topics that readers have left."""
LOOK_AT_PARTITIONS_EVERY_S = 5.0
"""How often the KTable topic's partition count is asked for."""


class Upkeep:
    """One runner's upkeep of its version's topics and tables."""

    def __init__(self, projection: Projection, version: int, settings: RunnerSettings,
                 store: ReadModelStore, topics: TopicSink, versions: ProjectionCatalog) -> None:
        self.projection, self.version, self.settings = projection, version, settings
        self.store, self.topics, self.versions = store, topics, versions
        self._next_cleanup = 0.0
        self._partitions_seen_at = 0.0

    def look_at_partitions(self) -> None:
        """The KTable topic's partition count now, recorded with those it had before: once
        partitions were added, keys move (``OutputProducer``)."""
        self._partitions_seen_at = time.monotonic()
        if not self.projection.has_state:
            return
        topic = self.projection.ktable_topic_for(self.version)
        shape = self.topics.ktable_shape()
        if shape is None:
            return
        before = self.topics.output.partition_history
        history = self.versions.note_partitions(topic, shape.topic_id, shape.partitions)
        if before and history != before and history[:-1] == before:
            log.warning("projection %s: its KTable topic %s has %d partitions now (%d "
                        "before); each key written from now on goes where the new count puts "
                        "it and is deleted from where the old one did", self.projection.name,
                        topic, history[-1], before[-1])
        self.topics.output.partition_history = history

    def before_attempt(self) -> None:
        """Before an attempt at a batch: the partition count, if it was last asked for a
        while ago."""
        if time.monotonic() - self._partitions_seen_at >= LOOK_AT_PARTITIONS_EVERY_S:
            self.look_at_partitions()

    def between_batches(self) -> None:
        """After a batch of the active version committed, every ``CLEANUP_EVERY_S``: retired
        KTable topics that readers have left are deleted, and rows past their retention
        pruned, a bounded amount each time (deleted keys, resolutions of letters the
        dead-letter topic no longer holds)."""
        if time.monotonic() < self._next_cleanup:
            return
        self._next_cleanup = time.monotonic() + CLEANUP_EVERY_S
        name = self.projection.name
        self.versions.delete_retired_topics(self.topics.delete_topics)
        retention = self.settings.deleted_key_retention_s
        if retention is not None and (forgotten := self.store.forget_deleted(retention)):
            log.info("projection %s: %d deleted key(s) older than %.0f s forgotten", name,
                     forgotten, retention)
        first = self.topics.first_dead_letter_offset()
        if first > 0 and (forgotten := self.store.forget_resolutions_before(first)):
            log.info("projection %s: %d resolution(s) of dead letters the topic no longer "
                     "holds (below offset %d) forgotten", name, forgotten, first)
