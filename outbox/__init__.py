"""Outbox: change data capture from the event store into Kafka, and Kafka's client side.

Owns, one module each:

- ``design``: the outbox design of a database (the events table captured directly, or an
  outbox table);
- ``connector``: the declarative Debezium connector spec and its Kafka Connect configuration,
  and the Connect REST client (``requests``);
- ``operations``: applying, diffing, pausing and checking the connector;
- ``switch``: moving a database to another design, its running connector drained first;
- ``connection``: the settings every Kafka client of Eventfold connects with (SASL, TLS,
  Java translation for Connect and Spark);
- ``topics``: creating and checking topics (configs, replication);
- ``kafka``: offset planning, range reads and group progress, for projections and the read API;
- ``history``: the event store's log rendered as topic records, for consumers that must start
  before the topics' retained head;
- ``verify``: checking a topic against the event store's log.

The envelope of event-topic messages and the topic names are ``eventfold.contract``'s. This
package exports nothing itself: a Spark worker that needs ``kafka`` loads neither ``requests``
nor the connector's side.

May import: ``write_model.persistence.schema`` (table, publication and lock names),
``eventfold.contract``, confluent-kafka, requests, prometheus-client. It never imports
projections or read_api.
"""
