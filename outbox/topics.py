"""Event topic naming and idempotent topic creation, with the configs of existing topics
checked (and, on request, fixed) against what Eventfold needs of them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
    TopicMetadata,
)

from eventfold.outbox.connection import KafkaConnection, parse_key_values

log = logging.getLogger(__name__)

# The event log is the source of truth for replays from offset 0: keep it forever.
EVENT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
COMPACTED_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1",
                          "retention.bytes": "-1"}


class ReplicationUnavailable(RuntimeError):
    """Topics would need more replicas than the cluster has brokers, or more in sync than
    they have."""


TopicKind = Literal["events", "ktables", "dead_letters", "derived"]
TOPIC_KINDS: tuple[TopicKind, ...] = ("events", "ktables", "dead_letters", "derived")


@dataclass(frozen=True)
class Replication:
    """Replication factor and ``min.insync.replicas`` per kind of topic. A kind not given
    gets what the cluster can hold: min(3, brokers) replicas, and all but one of them in sync
    (at least 1), so that one broker can fail without stopping writes."""

    factors: tuple[tuple[str, int], ...] = ()
    min_insync: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, factors: str = "", min_insync: str = "") -> Replication:
        """Each of ``"3"`` (every kind) or ``"events=3,ktables=2"`` (per kind); '' is the
        default."""
        return cls(_per_kind(factors, "replication factor"),
                   _per_kind(min_insync, "min.insync.replicas"))

    def for_kind(self, kind: TopicKind, brokers: int) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) of a new topic of ``kind``."""
        factor = dict(self.factors).get(kind) or min(3, max(brokers, 1))
        return factor, self.min_insync_for(kind, factor)

    def min_insync_for(self, kind: TopicKind, factor: int) -> int:
        """``min.insync.replicas`` of a topic of ``kind`` with ``factor`` replicas."""
        insync = dict(self.min_insync).get(kind) or max(1, factor - 1)
        if insync > factor:
            raise ReplicationUnavailable(f"{kind} topics: min.insync.replicas {insync} is more "
                                         f"than their replication factor {factor}")
        return insync


def _per_kind(text: str, what: str) -> tuple[tuple[str, int], ...]:
    text = text.strip()
    if not text:
        return ()
    pairs = ({kind: text for kind in TOPIC_KINDS} if "=" not in text
             else parse_key_values(text, what))
    unknown = set(pairs) - set(TOPIC_KINDS)
    if unknown:
        raise ValueError(f"{what}: unknown topic kind(s) {', '.join(sorted(unknown))}; "
                         f"kinds are {', '.join(TOPIC_KINDS)}")
    try:
        numbers = {kind: int(value) for kind, value in pairs.items()}
    except ValueError:
        raise ValueError(f"{what} must be whole numbers: {text!r}") from None
    if any(n < 1 for n in numbers.values()):
        raise ValueError(f"{what} must be at least 1: {text!r}")
    return tuple(sorted(numbers.items()))


@dataclass(frozen=True)
class TopicShape:
    """What a reader of a topic must notice change under it: a topic deleted and made again
    has another id; partitions may be added."""

    topic_id: str
    partitions: int


class TopicConfigMismatch(RuntimeError):
    """Existing topics whose configs differ from what Eventfold needs of them."""

    def __init__(self, mismatches: list[tuple[str, str, str | None, str]]) -> None:
        self.mismatches = mismatches
        lines = [f"topic {topic}: {key} is {actual!r}, needs {wanted!r}"
                 for topic, key, actual, wanted in mismatches]
        super().__init__("; ".join(lines) + " (`eventfold setup --fix-topics` alters them)")



def parse_topic_config(text: str) -> dict[str, str]:
    """``"segment.ms=600000,min.cleanable.dirty.ratio=0.1"`` as a dict; '' is {}."""
    return parse_key_values(text, "topic config")


_NOTICE = 5
"""syslog's level, above which librdkafka logs nothing."""


class TopicAdmin:
    """Creates topics with explicit configs (read back by DescribeConfigs) if they are missing,
    replicated as ``replication`` says for their kind."""

    def __init__(self, kafka: KafkaConnection, replication: Replication | None = None,
                 timeout_s: float = 30) -> None:
        config = kafka.client_config()
        # librdkafka's info lines (a closing admin purging its background queue) are not
        # the application's; notices and worse still reach stderr
        config.setdefault("log_level", _NOTICE)
        self._admin = AdminClient(config)
        self._replication = replication or Replication()
        self._timeout_s = timeout_s

    def ensure(
        self, topics: Iterable[str], config: Mapping[str, str], partitions: int = 1,
        kind: TopicKind = "events", check: bool = False, fix: bool = False,
    ) -> None:
        """Create the topics that are missing. With ``check``, the configs of those that
        exist are read back: a difference raises TopicConfigMismatch, or with ``fix`` is
        altered in place."""
        wanted = sorted(set(topics))
        metadata = self._admin.list_topics(timeout=self._timeout_s)
        if check:
            # What an existing topic needs follows from its own replicas, not from the brokers
            # alive now: with one of three down, its min.insync.replicas is still 2.
            existing = {t: metadata.topics[t] for t in wanted if t in metadata.topics}
            self._check({t: {**config, "min.insync.replicas": self._insync_of(kind, described)}
                         for t, described in existing.items()}, fix)
        missing = [t for t in wanted if t not in metadata.topics]
        if not missing:
            return
        factor, insync = self._replication.for_kind(kind, len(metadata.brokers))
        config = {**config, "min.insync.replicas": str(insync)}
        if factor > len(metadata.brokers):
            raise ReplicationUnavailable(
                f"cannot create {kind} topic(s) {', '.join(missing)} with replication factor "
                f"{factor}: the cluster has {len(metadata.brokers)} broker(s) (see "
                "EVENTFOLD_REPLICATION_FACTOR)")
        futures = self._admin.create_topics(
            [NewTopic(t, num_partitions=partitions, replication_factor=factor,
                      config=config) for t in missing],
            operation_timeout=self._timeout_s,
        )
        created = []
        for topic, future in futures.items():
            try:
                future.result(timeout=self._timeout_s)
                created.append(topic)
                log.info("created %s topic %s (%d partitions, %d replicas, %s)", kind, topic,
                         partitions, factor, config)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        self._await_created(created, partitions)

    def _await_created(self, topics: list[str], partitions: int) -> None:
        # A creation is acknowledged once the controller has it; a broker's metadata may not
        # show the topic, or its leaders, for a moment more, and a caller that counts its
        # partitions right after (a KTable sized by its new source) must see them all.
        self._await(lambda: [t for t in topics if not self._usable(t, partitions)],
                    f"created topics without leaders for all {partitions} partitions")

    def _usable(self, topic: str, partitions: int) -> bool:
        metadata = self._admin.list_topics(topic, timeout=self._timeout_s).topics.get(topic)
        return (metadata is not None and metadata.error is None
                and len(metadata.partitions) == partitions
                and all(p.leader >= 0 for p in metadata.partitions.values()))

    def _insync_of(self, kind: TopicKind, topic: TopicMetadata) -> str:
        replicas = max((len(p.replicas) for p in topic.partitions.values()), default=1)
        return str(self._replication.min_insync_for(kind, replicas))

    def configs(self, topic: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        future = self._admin.describe_configs([resource])[resource]
        return {k: v.value for k, v in future.result(timeout=self._timeout_s).items()}

    def _check(self, wanted: Mapping[str, Mapping[str, str]], fix: bool) -> None:
        mismatches = self._differences(wanted)
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
        self._await_configs({topic: {entry.name: str(entry.value) for entry in entries}
                             for topic, entries in by_topic.items()})

    def _await_configs(self, wanted: Mapping[str, Mapping[str, str]]) -> None:
        # An alteration is acknowledged once the controller has it; a broker answering
        # describe_configs may still hold the old value for a moment, and a caller that
        # reads the topic back must see what it was told was applied.
        self._await(lambda: self._differences(wanted), "altered topic configs not visible")

    def _await(self, pending: Callable[[], Sequence[object]], what: str) -> None:
        """Until ``pending`` finds nothing left; TimeoutError naming ``what`` and what was
        left after the admin's timeout."""
        deadline = time.monotonic() + self._timeout_s
        while left := pending():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} after {self._timeout_s:.0f} s: {left}")
            time.sleep(0.05)

    def _differences(self, wanted: Mapping[str, Mapping[str, str]]
                     ) -> list[tuple[str, str, str | None, str]]:
        """(topic, key, actual, wanted) for each config that differs from what is wanted."""
        return [(topic, key, actual.get(key), value)
                for topic, config in wanted.items() for actual in [self.configs(topic)]
                for key, value in config.items() if actual.get(key) != value]

    def topic_id(self, topic: str) -> str | None:
        """The id the cluster gave the topic when it was created (a topic deleted and made
        again has another); None when it does not exist."""
        found = self.describe(topic)
        return None if found is None else found.topic_id

    def describe(self, topic: str) -> TopicShape | None:
        """The topic's id and partition count; None when it does not exist."""
        return self.describe_all([topic])[topic]

    def describe_all(self, topics: Iterable[str]) -> dict[str, TopicShape | None]:
        """``describe`` of each topic, in one request."""
        futures = self._admin.describe_topics(TopicCollection(list(topics)))
        return {topic: self._shape(future) for topic, future in futures.items()}

    def _shape(self, future: Future[Any]) -> TopicShape | None:
        try:
            described = future.result(timeout=self._timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise
        return TopicShape(str(described.topic_id), len(described.partitions))

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
