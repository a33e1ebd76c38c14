"""Projections: fold event topics into KTables and SQL read models, on Spark.

Owns: projection definitions (a per-key fold plus its read model columns), the fold engine
(plain Python, also used by tests), decoding records in Arrow, the Spark plan, the sources (the
Kafka data source, and the event store for replays), the streaming runner, the read model
schemas (migrated through Alembic), the sinks (Postgres read model with checkpoint, KTable,
dead-letter and derived-event topics), versions and replay.

May import: ``outbox`` (topic names, the event envelope, Kafka readers),
``eventfold.contract``, pyspark, confluent-kafka, psycopg, SQLAlchemy types. Never
``write_model`` or ``read_api``.
"""

from eventfold.projections.fold import KeyState, SourceRecord, fold_in_memory, fold_records
from eventfold.projections.projection import (
    Count,
    Derived,
    Event,
    Latest,
    Lookup,
    Max,
    Min,
    Projection,
    State,
    Sum,
    aggregation,
    on_crossing,
    projection,
    stream,
)
from eventfold.projections.registry import ProjectionRegistry

__all__ = [
    "Count",
    "Derived",
    "Event",
    "KeyState",
    "Latest",
    "Lookup",
    "Max",
    "Min",
    "Projection",
    "ProjectionRegistry",
    "SourceRecord",
    "State",
    "Sum",
    "aggregation",
    "fold_in_memory",
    "fold_records",
    "on_crossing",
    "projection",
    "stream",
]
