"""Reading topics whole in tests: compaction runs when it will, so last value per key wins."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config, read_messages


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
            value: str | bytes | None, timestamp_ms: int = 0,
            partition: int | None = None) -> None:
    """One record, partitioned as Debezium's (Java) producer partitions it (a redelivered
    event lands in its stream's partition again), or into ``partition``. ``timestamp_ms``:
    its time (0: now)."""
    producer = Producer(kafka.client_config(partitioner="murmur2_random"))
    where = {} if partition is None else {"partition": partition}
    producer.produce(topic, key=key, value=value, timestamp=timestamp_ms, **where)
    assert producer.flush(10) == 0


def last_timestamp_ms(kafka: KafkaConnection, topic: str, partition: int = 0) -> int:
    """The broker's timestamp of the newest record of a partition (-1 when it is empty).
    The offsets at the end may be transaction markers, which are no records: the read starts
    a few offsets back and keeps the last record before the end of the partition."""
    consumer = Consumer(consumer_config(kafka))
    try:
        first, end = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                    timeout=10)
        if end <= first:
            return -1
        consumer.assign([TopicPartition(topic, partition, max(first, end - 16))])
        newest = None
        while (message := consumer.poll(10)) is not None:
            if message.error() is None:
                newest = message
            elif message.error().code() == KafkaError._PARTITION_EOF:
                break
        assert newest is not None, f"no record in {topic}[{partition}] before {end}"
        return int(newest.timestamp()[1])
    finally:
        consumer.close()
