"""Outbox: change data capture from the Postgres outbox into Kafka, and the wire format.

Owns: the declarative Debezium connector spec and its Kafka Connect configuration, the Connect
REST client (``requests``), event topic naming and creation, the envelope of the messages
on those topics (what downstream consumers decode), and the event store's log rendered in that
envelope (``history``), for consumers that must start before the topics' retained head.

May import: ``write_model.schema`` (table and publication names), confluent-kafka, requests.
It never imports projections or read_api.
"""

from outbox.connector import ConnectClient, ConnectError, OutboxConnectorSpec
from outbox.envelope import EventEnvelope, MalformedEvent
from outbox.operations import ConnectorOperations, ConnectorStatus, config_diff
from outbox.topics import TopicAdmin, event_topic
from outbox.verify import LogReport, compare, verify_topic

__all__ = [
    "ConnectClient",
    "ConnectError",
    "ConnectorOperations",
    "ConnectorStatus",
    "EventEnvelope",
    "LogReport",
    "MalformedEvent",
    "OutboxConnectorSpec",
    "TopicAdmin",
    "compare",
    "config_diff",
    "event_topic",
    "verify_topic",
]
