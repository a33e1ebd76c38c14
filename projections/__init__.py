"""Projections: fold event topics into KTables and SQL read models, on Spark.

Owns: projection definitions (a per-key fold plus its read model columns), the fold engine
(plain Python, also used by tests), the Spark Kafka data source, the streaming runner, and the
sinks (Postgres read model with checkpoint, KTable and dead-letter topics).

May import: ``outbox`` (topic names, the event envelope), ``write_model.schema`` (the checkpoint
table name), pyspark, confluent-kafka, psycopg, SQLAlchemy types. Never ``read_api``.
"""

from projections.fold import KeyState, SourceRecord, fold_in_memory, fold_records
from projections.projection import Event, Projection, State, projection
from projections.registry import ProjectionRegistry

__all__ = [
    "Event",
    "KeyState",
    "Projection",
    "ProjectionRegistry",
    "SourceRecord",
    "State",
    "fold_in_memory",
    "fold_records",
    "projection",
]
