"""Reading topics whole in tests: the broker never compacts, so last value per key wins."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Producer

from projections.kafka_offsets import OffsetPlanner
from projections.kafka_source import OffsetRange, read_range


def read_topic(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    planner = OffsetPlanner(bootstrap)
    try:
        partitions = planner.partitions([topic])
        begin, end = planner.beginning_offsets(partitions), planner.end_offsets(partitions)
    finally:
        planner.close()
    rows: list[dict[str, Any]] = []
    for t, p in partitions:
        for batch in read_range(bootstrap, OffsetRange(t, p, begin[(t, p)], end[(t, p)])):
            rows.extend(batch.to_pylist())
    return rows


def read_table(bootstrap: str, topic: str) -> dict[str, Any]:
    """Latest value per key, tombstones removing keys, as a compacted topic means it."""
    table: dict[str, Any] = {}
    for row in sorted(read_topic(bootstrap, topic), key=lambda r: (r["partition"], r["offset"])):
        if row["value"] is None:
            table.pop(row["key"], None)
        else:
            table[row["key"]] = json.loads(row["value"])
    return table


def produce(bootstrap: str, topic: str, key: str | None, value: str | None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=key, value=value)
    assert producer.flush(10) == 0
