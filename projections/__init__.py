"""Projections: fold event topics into KTables and SQL read models, on Spark.

Layers, each importing only those above it:

- ``definition/`` (what a projection is; plain Python, no engine): ``projection`` (the three
  kinds, fold, aggregation and stream, with re-keying, lookups and derived events, and typed
  event dispatch), ``typed`` (events as the domain's classes, lifted to their current schema
  version), ``aggregates`` (aggregate functions, each with every form the engine runs
  it in), ``fields`` (how keys and fields are read out of a payload), ``registry``;
- ``plan``: ``compile_projection`` turns a definition into the ``Plan`` its batches run, the
  one place that branches on kind, re-keying and lookups;
- ``outcome``: what a batch moves (source records, key states, dead letters, derived events);
- ``state/``: where a version's state lives and how a batch commits: ``store`` (the state
  table, the merge and checkpoint), ``stage`` (what the tasks write before the commit),
  ``schema``, ``catalog`` (versions, checkpoints, emission marks, batches under way),
  ``parking``, ``topics`` (its KTable, dead-letter and derived-event topics), ``hosts`` (the
  streaming hosts and the replays handed to them), ``lease`` (one writer per projection),
  ``readers`` (which read API instance has which KTable topic open), ``source_ids`` (the
  source topics' ids a version's checkpoint, or a reaction's positions, count);
- ``execution/``: ``fold`` (the per-key fold and its duplicate guard, in plain Python: what a
  task runs, and the reference harness ``fold_records``), ``decode`` (records into Arrow
  columns), ``partial`` (per-partition aggregates in Arrow), ``engine`` (the Spark jobs of
  a batch, by pipeline: ``fold_jobs``, ``aggregate_jobs``, over ``jobs``),
  ``writes`` (what a task writes), ``task_output`` (the counts tasks hand the driver),
  ``worker`` (what a Python worker keeps between tasks), ``executor`` (what every task does
  first), the sources (``kafka_source``, ``store_source``);
- what runs them: ``host`` (one Spark application running several, with the replays handed
  to it, ``replay_requests`` being the requester's side; wired by the composition root
  through ``host_wiring.HostWiring``), ``supervision`` (each of them on a thread of its own:
  the writer lease, warm standby, stalls and restarts), ``runner``
  (with its ``run_settings``, ``progress`` and ``retention`` check, driven by a
  ``stream_thread`` (idle, on the process's shared ``source_watch``), seen by callers as a
  ``running_query``),
  ``replay``,
  ``status``, ``dead_letters``, ``metrics``, and ``testing`` (an event topic in memory, for
  users' tests).

``__all__`` below is the user's API (declaring projections and testing their folds); the
engine's names (``Plan``, ``Pipeline``, ``KeyState``, ...) are imported from their modules.
Users import it all from ``eventfold`` too.

May import: ``outbox`` (Kafka connections and readers, topic admin), ``eventfold.contract``,
pyspark, pyarrow, confluent-kafka, psycopg, SQLAlchemy types, prometheus-client, rich (progress
bars). Never ``write_model`` or ``read_api``. The names below load on first use: a process
that needs one module (a Spark Python worker running a task) loads only what it imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventfold.contract.lazy import lazy_exports

if TYPE_CHECKING:
    from eventfold.projections.definition.aggregates import (
        AggregateFunction,
        Avg,
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
        Lookup,
        Projection,
        State,
        StreamProjection,
        aggregation,
        on_crossing,
        projection,
        stream,
    )
    from eventfold.projections.execution.fold import fold_in_memory
    from eventfold.projections.testing import EventLog

_EXPORTED_FROM = {
    "AggregateFunction": "eventfold.projections.definition.aggregates",
    "AggregationProjection": "eventfold.projections.definition.projection",
    "Avg": "eventfold.projections.definition.aggregates",
    "Count": "eventfold.projections.definition.aggregates",
    "Derived": "eventfold.projections.definition.projection",
    "Dispatch": "eventfold.projections.definition.projection",
    "Event": "eventfold.projections.definition.projection",
    "EventLog": "eventfold.projections.testing",
    "FoldProjection": "eventfold.projections.definition.projection",
    "Latest": "eventfold.projections.definition.aggregates",
    "Lookup": "eventfold.projections.definition.projection",
    "Max": "eventfold.projections.definition.aggregates",
    "Min": "eventfold.projections.definition.aggregates",
    "Projection": "eventfold.projections.definition.projection",
    "State": "eventfold.projections.definition.projection",
    "StreamProjection": "eventfold.projections.definition.projection",
    "Sum": "eventfold.projections.definition.aggregates",
    "aggregation": "eventfold.projections.definition.projection",
    "fold_in_memory": "eventfold.projections.execution.fold",
    "on_crossing": "eventfold.projections.definition.projection",
    "projection": "eventfold.projections.definition.projection",
    "stream": "eventfold.projections.definition.projection",
}

__all__ = [
    "AggregateFunction",
    "AggregationProjection",
    "Avg",
    "Count",
    "Derived",
    "Dispatch",
    "Event",
    "EventLog",
    "FoldProjection",
    "Latest",
    "Lookup",
    "Max",
    "Min",
    "Projection",
    "State",
    "StreamProjection",
    "Sum",
    "aggregation",
    "fold_in_memory",
    "on_crossing",
    "projection",
    "stream",
]


# Lazy, so that a process that needs one module of this package (Spark's planner process
# importing our Kafka source) does not load SQLAlchemy, pandas and psycopg with it.
__getattr__ = lazy_exports(globals(), _EXPORTED_FROM)
