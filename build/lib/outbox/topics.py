"""Event topic naming and idempotent topic creation."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

log = logging.getLogger(__name__)

DEFAULT_TOPIC_PREFIX = "eventfold.events."
# The event log is the source of truth for replays from offset 0: keep it forever.
EVENT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
COMPACTED_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1",
                          "retention.bytes": "-1"}


def event_topic(aggregate_type: str, prefix: str = DEFAULT_TOPIC_PREFIX) -> str:
    """The topic that carries every event of one aggregate type, keyed by aggregate id."""
    return f"{prefix}{aggregate_type}"


class TopicAdmin:
    """Creates topics with explicit configs (read back by DescribeConfigs) if they are missing."""

    def __init__(self, bootstrap_servers: str, timeout_s: float = 30) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        self._timeout_s = timeout_s

    def ensure(
        self, topics: Iterable[str], config: Mapping[str, str], partitions: int = 1,
        replication_factor: int = 1,
    ) -> None:
        wanted = sorted(set(topics))
        existing = set(self._admin.list_topics(timeout=self._timeout_s).topics)
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return
        futures = self._admin.create_topics(
            [NewTopic(t, num_partitions=partitions, replication_factor=replication_factor,
                      config=dict(config)) for t in missing],
            operation_timeout=self._timeout_s,
        )
        for topic, future in futures.items():
            try:
                future.result(timeout=self._timeout_s)
                log.info("created topic %s (%d partitions, %s)", topic, partitions, dict(config))
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    def partitions(self, topic: str) -> int:
        metadata = self._admin.list_topics(topic, timeout=self._timeout_s).topics.get(topic)
        return 0 if metadata is None or metadata.error else len(metadata.partitions)

    def delete(self, topics: Iterable[str]) -> None:
        """Delete topics that exist (a replaced KTable version); missing ones are fine."""
        existing = set(self._admin.list_topics(timeout=self._timeout_s).topics)
        doomed = sorted(set(topics) & existing)
        if not doomed:
            return
        futures = self._admin.delete_topics(doomed, operation_timeout=self._timeout_s)
        for topic, future in futures.items():
            try:
                future.result(timeout=self._timeout_s)
                log.info("deleted topic %s", topic)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
