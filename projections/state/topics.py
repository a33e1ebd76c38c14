"""A projection version's Kafka topics: its KTable (latest state per key, tombstones), its
dead letters and its derived events, created and checked (``ensure_projection_topics``), and
``TopicSink``, the runner's side of them. What writes to them: ``producer`` (records with
delivery reports) and ``transactions`` (exactly-once writer slots).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from eventfold.contract import (
    DEFAULT_DEAD_LETTER_RETENTION,
    DEFAULT_DERIVED_EVENT_RETENTION,
    retention_ms,
)
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.outbox.topics import (
    COMPACTED_TOPIC_CONFIG,
    EVENT_TOPIC_CONFIG,
    Replication,
    TopicAdmin,
    TopicShape,
)
from eventfold.projections.definition.projection import Projection
from eventfold.projections.state.producer import OutputProducer, new_producer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputTopicConfigs:
    """How a projection's output topics are configured: a KTable topic is compacted (plus
    ``ktable``); dead letters and derived events are kept for their retention (-1: forever)."""

    ktable: Mapping[str, str] = field(default_factory=dict)
    dead_letter_retention_ms: int = retention_ms(DEFAULT_DEAD_LETTER_RETENTION)
    derived_retention_ms: int = retention_ms(DEFAULT_DERIVED_EVENT_RETENTION)

    def ktable_config(self) -> dict[str, str]:
        return {**COMPACTED_TOPIC_CONFIG, **self.ktable}

    def dead_letter_config(self) -> dict[str, str]:
        return {**EVENT_TOPIC_CONFIG, "retention.ms": str(self.dead_letter_retention_ms)}

    def derived_config(self) -> dict[str, str]:
        return {**EVENT_TOPIC_CONFIG, "retention.ms": str(self.derived_retention_ms)}


def ensure_projection_topics(admin: TopicAdmin, projection: Projection, version: int = 1,
                             configs: OutputTopicConfigs | None = None,
                             fix: bool = False) -> None:
    """The KTable and dead-letter topics, created if missing and their configs checked:
    a KTable topic that is not compacted would grow forever and restore ever slower."""
    configs = configs or OutputTopicConfigs()
    if projection.has_state:
        topic = projection.ktable_topic_for(version)
        partitions = ktable_partitions(admin, projection)
        admin.ensure([topic], configs.ktable_config(), partitions=partitions, kind="ktables",
                     check=True, fix=fix)
        if (found := admin.partitions(topic)) != partitions:
            level = logging.WARNING if projection.ktable_partitions else logging.INFO
            log.log(level, "projection %s: its KTable topic %s has %d partition(s), %s %d; a "
                        "replay (`eventfold projection replay %s`) builds the next version's "
                        "topic with them", projection.name, topic, found,
                        "it declares" if projection.ktable_partitions else "its sources have",
                        partitions, projection.name)
    admin.ensure([projection.dead_letter_topic], configs.dead_letter_config(),
                 kind="dead_letters", check=True, fix=fix)


def ktable_partitions(admin: TopicAdmin, projection: Projection) -> int:
    """How many partitions the KTable topic of a new version gets: as declared, else as many
    as the most of its source topics have (1 before they exist)."""
    if projection.ktable_partitions is not None:
        return projection.ktable_partitions
    return max((admin.partitions(topic) for topic in projection.source_topics), default=1) or 1


class TopicSink:
    """A projection version's topics from the runner's side: created and checked, derived
    topics made on first use, retired versions' topics deleted; and a producer for what the
    commit itself writes."""

    def __init__(self, kafka: KafkaConnection, projection: Projection, version: int,
                 configs: OutputTopicConfigs | None = None,
                 replication: Replication | None = None) -> None:
        self.projection = projection
        self.configs = configs or OutputTopicConfigs()
        self.version = version
        self.kafka = kafka
        self.output = OutputProducer(new_producer(kafka), kafka, projection, version)
        self._admin = TopicAdmin(kafka, replication)
        self._output_topics: set[str] = set()

    def ensure_topics(self) -> None:
        ensure_projection_topics(self._admin, self.projection, self.version, self.configs)

    def ktable_shape(self) -> TopicShape | None:
        """The version's KTable topic's id and partition count now (None: not there)."""
        return self._admin.describe(self.projection.ktable_topic_for(self.version))

    def delete_topics(self, topics: list[str]) -> None:
        self._admin.delete(topics)

    def first_dead_letter_offset(self) -> int:
        """The dead-letter topic's first offset: letters below it are gone (its retention)."""
        planner = OffsetPlanner(self.kafka)
        try:
            partition = (self.projection.dead_letter_topic, 0)
            return planner.beginning_offsets([partition]).get(partition, 0)
        finally:
            planner.close()

    def ensure_outputs(self, topics: Iterable[str]) -> set[str]:
        """Create the derived-event ``topics`` on first use; returns those this sink had not
        written to before."""
        new_topics = set(topics) - self._output_topics
        if new_topics:
            self._admin.ensure(new_topics, self.configs.derived_config(), kind="derived")
            self._output_topics |= new_topics
        return new_topics

    def close(self) -> None:
        self.output.producer.flush(10)
        # Spark's callback server keeps the runner alive; let the clients go now.
        del self.output, self._admin
