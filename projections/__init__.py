"""Projections: fold event topics into KTables and SQL read models, on Spark.

Layers, each importing only those above it:

- ``definition/`` (what a projection is; plain Python, no engine): ``projection`` (the three
  kinds, fold, aggregation and stream, with re-keying, lookups and derived events, and typed
  event dispatch), ``aggregates`` (aggregate functions, each with every form the engine runs
  it in), ``fields`` (how keys and fields are read out of a payload), ``registry``;
- ``plan``: ``compile_projection`` turns a definition into the ``Plan`` its batches run, the
  one place that branches on kind, re-keying and lookups;
- ``outcome``: what a batch moves (source records, key states, dead letters, derived events);
- ``state/``: where a version's state lives and how a batch commits: ``store`` (the state
  table, the stage tasks write to, the merge and checkpoint), ``schema``, ``catalog``
  (versions, checkpoints, emission marks, batches under way), ``parking``, ``topics`` (its
  KTable, dead-letter and derived-event topics), ``hosts`` (the streaming hosts and the
  replays handed to them);
- ``execution/``: ``fold`` (the per-key fold and its duplicate guard, in plain Python: what a
  task runs, and the reference harness ``fold_records``), ``decode`` (records into Arrow
  columns), ``partial`` (per-partition aggregates in Arrow), ``engine`` (the Spark jobs),
  ``writes`` (what a task writes), ``task_output`` (the counts tasks hand the driver), the
  sources (``kafka_source``, ``store_source``);
- what runs them: ``runner``, ``replay``, ``status``, ``dead_letters``, ``metrics``, and
  ``testing`` (an event topic in memory, for users' tests).

May import: ``outbox`` (Kafka connections and readers, topic admin), ``eventfold.contract``,
pyspark, pyarrow, confluent-kafka, psycopg, SQLAlchemy types, prometheus-client, rich (progress
bars). Never ``write_model`` or ``read_api``.
"""

from eventfold.projections.definition.aggregates import (
    AggregateFunction,
    Avg,
    CompositeAggregate,
    Count,
    Latest,
    Max,
    Min,
    Sum,
)
from eventfold.projections.definition.projection import (
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
from eventfold.projections.definition.registry import ProjectionRegistry
from eventfold.projections.execution.fold import fold_in_memory, fold_records
from eventfold.projections.outcome import KeyState, SourceRecord
from eventfold.projections.plan import Pipeline, Plan, compile_projection
from eventfold.projections.testing import EventLog

__all__ = [
    "AggregateFunction",
    "AggregationProjection",
    "Avg",
    "CompositeAggregate",
    "Count",
    "Derived",
    "Dispatch",
    "Event",
    "EventLog",
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
