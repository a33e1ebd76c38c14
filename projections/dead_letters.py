"""Reading a projection's dead-letter topic back: what failed, where it came from, and the
event as it was published. ``sinks.TopicSink`` writes each letter as one JSON object: the
projection, the error, the source topic, partition, offset and key, and the message's value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import read_messages

from eventfold.contract import EventEnvelope, MalformedEvent


@dataclass(frozen=True)
class DeadLetterRecord:
    dead_letter_offset: int
    error: str
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None

    @property
    def source(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def event(self) -> dict[str, Any] | None:
        """The event the letter holds, decoded (None when the message is not an event)."""
        try:
            envelope = EventEnvelope.decode(self.key, self.value)
        except MalformedEvent:
            return None
        return {"event_id": envelope.event_id, "event_type": envelope.event_type,
                "stream_id": envelope.stream_id, "stream_version": envelope.stream_version,
                "global_position": envelope.global_position,
                "recorded_at": envelope.recorded_at, "data": envelope.data,
                "metadata": envelope.metadata}

    def as_json(self, with_event: bool = False) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "dead_letter_offset": self.dead_letter_offset, "error": self.error,
            "source": self.source, "key": self.key}
        if with_event:
            shown["event"] = self.event()
            shown["value"] = self.value if shown["event"] is None else None
        return shown


def read_dead_letters(kafka: KafkaConnection, topic: str,
                      last: int | None = None) -> list[DeadLetterRecord]:
    """The letters on ``topic`` (with ``last``: the newest ones), oldest first."""
    letters = []
    for _, offset, _, value in read_messages(kafka, topic, timeout_s=30, last=last):
        body = json.loads(value or "{}")
        letters.append(DeadLetterRecord(
            offset, str(body.get("error", "")), str(body.get("topic", "")),
            int(body.get("partition", -1)), int(body.get("offset", -1)), body.get("key"),
            body.get("value")))
    return letters
