"""Local stack: starts and stops the real components Eventfold runs against on one machine.

Owns: a PostgreSQL cluster of its own (``wal_level=logical``), a single-node Apache Kafka broker
(KRaft), and a Kafka Connect worker (distributed mode) with Debezium's Postgres connector, each
on loopback ports under one data directory that survives restarts, with readiness checks and
clean shutdown by PID. The Java side's jars come from Maven Central at set-up
(``local_stack/pom.xml``).

May import: the standard library, psycopg and requests only. Nothing of the pipeline imports it
except the composition root (``eventfold``) and tests; production points the same code at real
Kafka, a Connect cluster and a Postgres server through configuration instead.
"""

from eventfold.local_stack.stack import LocalStack, StackEndpoints, StackError

__all__ = ["LocalStack", "StackEndpoints", "StackError"]
