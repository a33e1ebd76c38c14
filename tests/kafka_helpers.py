"""Reading topics whole in tests: compaction runs when it will, so last value per key wins."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import read_messages


def read_topic(kafka: KafkaConnection, topic: str) -> list[dict[str, Any]]:
    return [{"partition": p, "offset": o, "key": k, "value": v}
            for p, o, k, v in read_messages(kafka, topic)]


def read_table(kafka: KafkaConnection, topic: str) -> dict[str, Any]:
    """Latest value per key, tombstones removing keys, as a compacted topic means it."""
    table: dict[str, Any] = {}
    for _, _, key, value in read_messages(kafka, topic):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = json.loads(value)
    return table


def produce(kafka: KafkaConnection, topic: str, key: str | None,
            value: str | bytes | None) -> None:
    producer = Producer(kafka.client_config())
    producer.produce(topic, key=key, value=value)
    assert producer.flush(10) == 0
