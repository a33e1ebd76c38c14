"""Local stack: starts and stops the real components Eventfold runs against on one machine.

Owns: a PostgreSQL cluster of its own (``wal_level=logical``), Apache Kafka (KRaft: one broker,
or a cluster of three), Kafka Connect (distributed mode: one worker, or two in one group) with
Debezium's Postgres connector, and on request a Spark standalone master with two workers from
the installed pyspark, each on loopback ports under one data directory that survives restarts,
with readiness checks and clean shutdown by PID. The Java side's jars come from Maven Central
at set-up (``local_stack/pom.xml``).

May import: ``eventfold.contract`` (the JVMs' class-data archives), the standard library,
psycopg, requests and pyspark's Spark home only. Nothing of the pipeline imports it except the
composition root (``eventfold``) and tests; production points the same code at real Kafka, a
Connect cluster and a Postgres server through configuration.
"""

from eventfold.local_stack.stack import CLUSTER, LocalStack, Shape, StackEndpoints, StackError

__all__ = ["CLUSTER", "LocalStack", "Shape", "StackEndpoints", "StackError"]
