"""A KTable materialized in memory from its compacted topic, and kept live.

Restore reads the topic from the beginning up to the end offsets seen at start (the way a
Kafka Streams store restores from its changelog); last value per key wins, a null value
deletes. After that the same consumer keeps following new records.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from outbox.kafka import OffsetPlanner, consume_available, consumer_config

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KTableEntry:
    value: Any
    version: int


class KTableView:
    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._entries: dict[str, KTableEntry] = {}
        self._restored = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ktable-{topic}", daemon=True)
        self.records_read = 0

    def start(self) -> KTableView:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @property
    def restored(self) -> bool:
        return self._restored.is_set()

    def wait_restored(self, timeout_s: float) -> bool:
        return self._restored.wait(timeout_s)

    def get(self, key: str) -> KTableEntry | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)

    def _run(self) -> None:
        planner = OffsetPlanner(self.bootstrap_servers)
        try:
            partitions = planner.partitions([self.topic])
            while not partitions and not self._stop.wait(1.0):
                # The projection has not created its topic yet: an empty table is up to date.
                self._mark_restored()
                partitions = planner.partitions([self.topic])
            restore_end = planner.end_offsets(partitions)
        finally:
            planner.close()
        consumer = Consumer(consumer_config(self.bootstrap_servers))
        consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
        pending = {key for key, end in restore_end.items() if end > 0}
        if not pending:
            self._mark_restored()
        try:
            while not self._stop.is_set():
                for message in consume_available(consumer, 10_000, wait_s=0.2):
                    self._handle(message, restore_end, pending)
        finally:
            consumer.close()

    def _handle(self, message: Any, restore_end: dict[tuple[str, int], int],
                pending: set[tuple[str, int]]) -> None:
        partition = (message.topic(), message.partition())
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("ktable %s: %s", self.topic, error)
                return
        else:
            self._apply(message)
        position = message.offset() if error is not None else message.offset() + 1
        if partition in pending and position >= restore_end[partition]:
            pending.discard(partition)
            if not pending:
                self._mark_restored()

    def _apply(self, message: Any) -> None:
        self.records_read += 1
        key = message.key().decode()
        value = message.value()
        if value is None:
            self._entries.pop(key, None)
            return
        headers = dict(message.headers() or [])
        version = int(headers.get("eventfold.version", b"0"))
        self._entries[key] = KTableEntry(json.loads(value), version)

    def _mark_restored(self) -> None:
        if self._restored.is_set():
            return
        log.info("ktable %s restored: %d keys from %d records", self.topic, len(self._entries),
                 self.records_read)
        self._restored.set()
