"""Event topic naming and idempotent topic creation, with the configs of existing topics
checked (and, on request, fixed) against what Eventfold needs of them."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

log = logging.getLogger(__name__)

DEFAULT_TOPIC_PREFIX = "eventfold.events."
# The event log is the source of truth for replays from offset 0: keep it forever.
EVENT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
COMPACTED_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1",
                          "retention.bytes": "-1"}


class TopicConfigMismatch(RuntimeError):
    """Existing topics whose configs differ from what Eventfold needs of them."""

    def __init__(self, mismatches: list[tuple[str, str, str | None, str]]) -> None:
        self.mismatches = mismatches
        lines = [f"topic {topic}: {key} is {actual!r}, needs {wanted!r}"
                 for topic, key, actual, wanted in mismatches]
        super().__init__("; ".join(lines) + " (`eventfold setup --fix-topics` alters them)")


def parse_topic_config(text: str) -> dict[str, str]:
    """``"segment.ms=600000,min.cleanable.dirty.ratio=0.1"`` as a dict; '' is {}."""
    config: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"topic config {item!r} is not key=value")
        config[key.strip()] = value.strip()
    return config


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
        replication_factor: int = 1, check: bool = False, fix: bool = False,
    ) -> None:
        """Create the topics that are missing. With ``check``, the configs of those that
        exist are read back: a difference raises TopicConfigMismatch, or with ``fix`` is
        altered in place."""
        wanted = sorted(set(topics))
        existing = set(self._admin.list_topics(timeout=self._timeout_s).topics)
        missing = [t for t in wanted if t not in existing]
        if check:
            self._check([t for t in wanted if t in existing], config, fix)
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

    def configs(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        future = self._admin.describe_configs([resource])[resource]
        return {k: v.value for k, v in future.result(timeout=self._timeout_s).items()}

    def _check(self, topics: list[str], config: Mapping[str, str], fix: bool) -> None:
        mismatches = [(topic, key, actual.get(key), value)
                      for topic in topics for actual in [self.configs(topic)]
                      for key, value in config.items() if actual.get(key) != value]
        if not mismatches:
            return
        if not fix:
            raise TopicConfigMismatch(mismatches)
        by_topic: dict[str, list[ConfigEntry]] = {}
        for topic, key, _, value in mismatches:
            by_topic.setdefault(topic, []).append(ConfigEntry(
                key, value, incremental_operation=AlterConfigOpType.SET))
        resources = [ConfigResource(ResourceType.TOPIC, t, incremental_configs=entries)
                     for t, entries in by_topic.items()]
        for future in self._admin.incremental_alter_configs(resources).values():
            future.result(timeout=self._timeout_s)
        for topic, key, actual, value in mismatches:
            log.warning("topic %s: %s altered from %r to %r", topic, key, actual, value)

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
