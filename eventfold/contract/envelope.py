"""The message format on event topics, as the outbox EventRouter writes it.

Key: the aggregate id (stream id), a string. Value: a JSON object

    {"payload": "<event data as a JSON string>", "eventId": "...", "eventType": "...",
     "streamVersion": 3, "globalPosition": 1042, "recordedAt": "2026-11-21T22:14:00.1Z",
     "schemaVersion": 1, "metadata": "<JSON string: correlation_id, causation_id, ...>"}

The payload stays a string on the wire (``table.expand.json.payload=false``): Debezium never has
to infer a Connect schema from user data, so no event shape can fail the connector.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

# A tuple, not ``str | bytes``: the union is rebuilt on every call of a hot path.
_TEXT = (str, bytes)


RECORDED_ATTRIBUTE = "_recorded"
"""The attribute of a typed event a fold, reaction or process receives that holds the event it
was built from (``projections.definition.typed`` sets it, ``DomainEvent.recorded`` reads it)."""


class Recorded(Protocol):
    """Where an event a fold, reaction or process receives was recorded."""

    @property
    def stream_id(self) -> str: ...
    @property
    def stream_version(self) -> int: ...
    @property
    def event_id(self) -> str: ...
    @property
    def global_position(self) -> int: ...
    @property
    def recorded_at(self) -> str: ...
    @property
    def joined(self) -> Mapping[str, Any] | None:
        """The row a projection's ``lookup`` joined (None: none, or no lookup)."""


class MalformedEvent(ValueError):
    """A message on an event topic that is not a valid Eventfold envelope."""


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    event_id: str
    event_type: str
    stream_id: str
    stream_version: int
    global_position: int
    recorded_at: str
    data: dict[str, Any]
    schema_version: int = 1
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def decode(cls, key: str | bytes | None, value: str | bytes | None,
               with_metadata: bool = True) -> EventEnvelope:
        """Parse one message; projections skip the metadata they never read (hot path)."""
        if value is None:
            raise MalformedEvent("null value (tombstone) on an event topic")
        if key is None:
            raise MalformedEvent("message without a key (aggregate id)")
        try:
            outer = orjson.loads(value)
            payload = outer["payload"]
            data = orjson.loads(payload) if isinstance(payload, _TEXT) else payload
            envelope = cls(
                event_id=str(outer["eventId"]),
                event_type=str(outer["eventType"]),
                stream_id=key.decode() if isinstance(key, bytes) else key,
                stream_version=int(outer["streamVersion"]),
                global_position=int(outer["globalPosition"]),
                recorded_at=str(outer.get("recordedAt") or ""),
                data=data,
                schema_version=int(outer.get("schemaVersion", 1)),
                metadata=_json_object(outer.get("metadata")) if with_metadata else {},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedEvent(f"undecodable event envelope: {exc!r}") from exc
        if not isinstance(envelope.data, dict):
            raise MalformedEvent("event payload is not a JSON object")
        return envelope

    @classmethod
    def decode_derived(cls, key: str | bytes | None, value: str | bytes | None) -> EventEnvelope:
        """Parse one message a projection derived (``derived_value``): its key is the stream
        id, its position the source event's, its version 0."""
        if value is None or key is None:
            raise MalformedEvent("a derived event without a key or a value")
        try:
            outer = orjson.loads(value)
            envelope = cls(
                event_id=str(outer["eventId"]), event_type=str(outer["eventType"]),
                stream_id=key.decode() if isinstance(key, bytes) else key, stream_version=0,
                global_position=int(outer.get("sourcePosition") or 0), recorded_at="",
                data=outer["data"],
                metadata={"projection": outer.get("projection"),
                          "source_event_id": outer.get("sourceEventId")})
        except (ValueError, KeyError, TypeError) as exc:
            raise MalformedEvent(f"undecodable derived event: {exc!r}") from exc
        if not isinstance(envelope.data, dict):
            raise MalformedEvent("derived event data is not a JSON object")
        return envelope

    @property
    def correlation_id(self) -> str | None:
        return self.metadata.get("correlation_id")

    def encode(self) -> tuple[str, str]:
        """The (key, value) pair the connector would produce: used by tests and tools."""
        return self.stream_id, envelope_value(
            self.event_id, self.event_type, self.stream_version, self.global_position,
            self.recorded_at, json.dumps(self.data), self.schema_version,
            json.dumps(self.metadata))


def envelope_value(event_id: str, event_type: str, stream_version: int, global_position: int,
                   recorded_at: str, payload: str, schema_version: int = 1,
                   metadata: str = "{}") -> str:
    """The value the connector writes for an event whose payload column holds ``payload``
    (JSON text, not necessarily an object: a tool may need the envelope of a bad one)."""
    return json.dumps({
        "payload": payload, "eventId": event_id, "eventType": event_type,
        "streamVersion": stream_version, "globalPosition": global_position,
        "recordedAt": recorded_at, "schemaVersion": schema_version, "metadata": metadata,
    })


def derived_value(event_id: str, event_type: str, data: Mapping[str, Any], projection: str,
                  source_event_id: str, source_position: int) -> str:
    """The value of an event projection ``projection`` derived from event
    ``source_event_id``, on the topic it names (``EventEnvelope.decode_derived`` reads it)."""
    return json.dumps({
        "eventId": event_id, "eventType": event_type, "data": dict(data),
        "projection": projection, "sourceEventId": source_event_id,
        "sourcePosition": source_position,
    }, default=str)


def _json_object(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    parsed = orjson.loads(value) if isinstance(value, _TEXT) else value
    if not isinstance(parsed, dict):
        raise ValueError("metadata is not a JSON object")
    return parsed


def trace_of(key: str | bytes | None, value: str | bytes | None) -> tuple[str | None, str | None]:
    """(event id, correlation id) of a message, as far as it can be read: for log lines about
    a message that may be malformed (a dead letter)."""
    try:
        envelope = EventEnvelope.decode(key, value)
    except MalformedEvent:
        return None, None
    return envelope.event_id, envelope.correlation_id
