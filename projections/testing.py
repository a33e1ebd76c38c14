"""Testing a projection without Spark or Kafka: an event topic in memory.

    log = EventLog("Account")
    log.append("alice", "Deposited", amount=100)
    log.append("alice", "Withdrawn", amount=30)
    assert fold_in_memory(balances, log.records) == {"alice": {"balance": 70}}

The records are what Debezium publishes (``eventfold.contract.EventEnvelope``), so the fold
sees exactly what it sees on Spark: ``fold_records`` and ``fold_in_memory`` run the code the
executor tasks run.
"""

from __future__ import annotations

import itertools
from typing import Any

from eventfold.contract import EventEnvelope, event_topic
from eventfold.projections.outcome import SourceRecord


class EventLog:
    """One partition of an aggregate type's topic: events appended per stream, with stream
    versions, global positions and offsets as the event store and the connector give them."""

    def __init__(self, aggregate_type: str, partition: int = 0,
                 positions: itertools.count[int] | None = None) -> None:
        self.topic = event_topic(aggregate_type)
        self.partition = partition
        self.records: list[SourceRecord] = []
        self.versions: dict[str, int] = {}
        self._positions = positions if positions is not None else itertools.count(1)
        """Shared by the logs of one test to order events across topics."""

    def append(self, stream_id: str, event_type: str, **data: Any) -> SourceRecord:
        """The stream's next event as its topic record."""
        version = self.versions.get(stream_id, 0) + 1
        self.versions[stream_id] = version
        key, value = EventEnvelope(
            event_id=f"{stream_id}-{version}", event_type=event_type, stream_id=stream_id,
            stream_version=version, global_position=next(self._positions), recorded_at="",
            data=data).encode()
        record = SourceRecord(self.topic, self.partition, len(self.records), key, value)
        self.records.append(record)
        return record
