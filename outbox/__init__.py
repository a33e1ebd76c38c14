"""Outbox: change data capture from the Postgres outbox into Kafka, and the wire format.

Owns: the declarative Debezium connector spec and its Kafka Connect configuration, the Connect
REST client (``requests``), event topic naming and creation, the envelope of the messages
on those topics (what downstream consumers decode), and the event store's log rendered in that
envelope (``history``), for consumers that must start before the topics' retained head.

May import: ``write_model.schema`` (table and publication names), ``eventfold.contract``,
confluent-kafka, requests.
It never imports projections or read_api.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from eventfold.outbox.envelope import EventEnvelope, MalformedEvent
from eventfold.outbox.topics import TopicAdmin, event_topic
from eventfold.outbox.verify import LogReport, compare, verify_topic

if TYPE_CHECKING:
    from eventfold.outbox.connector import ConnectClient, ConnectError, OutboxConnectorSpec
    from eventfold.outbox.operations import ConnectorOperations, ConnectorStatus, config_diff

# The connector's side (requests, and the write model for its table names) loads on first use:
# every Spark worker of a projection imports this package for the envelope and the topics, and
# would otherwise spend part of its start on code it never runs (docs/benchmarks.md).
_CONNECTOR_SIDE = {
    "ConnectClient": "eventfold.outbox.connector",
    "ConnectError": "eventfold.outbox.connector",
    "OutboxConnectorSpec": "eventfold.outbox.connector",
    "ConnectorOperations": "eventfold.outbox.operations",
    "ConnectorStatus": "eventfold.outbox.operations",
    "config_diff": "eventfold.outbox.operations",
}


def __getattr__(name: str) -> Any:
    module = _CONNECTOR_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
