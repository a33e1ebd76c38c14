"""Events put straight into an aggregate type's topic, as Debezium would publish them, for
tests of readers (projections, reactions) that need no write side; and an operator deleting
such a topic and making it again."""

from __future__ import annotations

import itertools

from eventfold.contract import EventEnvelope, event_topic
from eventfold.outbox.topics import TopicAdmin
from tests.kafka_helpers import produce
from tests.pipeline_helpers import wait_for

_positions = itertools.count(1)
_versions: dict[tuple[str, str], int] = {}


def publish(settings, aggregate_type: str, events: list[tuple[str, str, dict]]) -> None:
    """Events as Debezium would publish them: (stream id, event type, data), versions counted
    per stream (on, across a topic made again: every event has an id of its own)."""
    topic = event_topic(aggregate_type)
    TopicAdmin(settings.kafka).ensure([topic], {"cleanup.policy": "delete"})
    for stream_id, event_type, data in events:
        version = _versions[(topic, stream_id)] = _versions.get((topic, stream_id), 0) + 1
        key, value = EventEnvelope(
            event_id=f"{topic}-{stream_id}-{version}", event_type=event_type,
            stream_id=stream_id, stream_version=version,
            global_position=next(_positions), recorded_at="", data=data).encode()
        produce(settings.kafka, topic, key, value)


def made_again(settings, aggregate: str, note: str, events: int) -> None:
    """An operator deletes the aggregate's event topic and makes it again, and ``events``
    events arrive on the new one."""
    topic = event_topic(aggregate)
    admin = TopicAdmin(settings.kafka)
    admin.delete([topic])
    wait_for(lambda: admin.describe(topic) is None, "the topic deleted")
    publish(settings, aggregate, [(f"s{n}", "Counted", {"note": note}) for n in range(events)])
