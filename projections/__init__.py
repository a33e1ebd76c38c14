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

from eventfold.projections.aggregates import AggregateFunction, Count, Latest, Max, Min, Sum
from eventfold.projections.fold import KeyState, SourceRecord, fold_in_memory, fold_records
from eventfold.projections.plan import Pipeline, Plan, compile_projection
from eventfold.projections.projection import (
    AggregationProjection,
    Derived,
    Dispatch,
    Event,
    FoldProjection,
    Kind,
    Lookup,
    Projection,
    State,
    StreamProjection,
    aggregation,
    on_crossing,
    projection,
    stream,
)
from eventfold.projections.registry import ProjectionRegistry

__all__ = [
    "AggregateFunction",
    "AggregationProjection",
    "Count",
    "Derived",
    "Dispatch",
    "Event",
    "FoldProjection",
    "KeyState",
    "Kind",
    "Latest",
    "Lookup",
    "Max",
    "Min",
    "Pipeline",
    "Plan",
    "Projection",
    "ProjectionRegistry",
    "SourceRecord",
    "State",
    "StreamProjection",
    "Sum",
    "aggregation",
    "compile_projection",
    "fold_in_memory",
    "fold_records",
    "on_crossing",
    "projection",
    "stream",
]
