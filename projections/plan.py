"""Compiling a projection's definition into the plan its batches run.

``compile_projection`` is the one place that looks at what kind of projection it is, whether
it re-keys and what it looks up; everything after it (the Python fold, the Arrow decoder and
partial aggregates, the Spark jobs, the store's merge) reads the ``Plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from math import isfinite
from types import MappingProxyType
from typing import Any

from eventfold.projections.definition.aggregates import AggregateFunction, CompositeAggregate
from eventfold.projections.definition.fields import coerce, path_value
from eventfold.projections.definition.projection import (
    AggregationProjection,
    Event,
    FoldProjection,
    Projection,
    State,
    component_column,
)

StateStep = Callable[[State | None, Event], State | None]
_MIN_INT, _MAX_INT = -(2**63), 2**63 - 1


class Pipeline(StrEnum):
    """How a batch runs on Spark."""

    FOLD_IN_PLACE = "fold in place"
    """The task that reads a source partition folds it: the key is the aggregate id and there
    is one source topic, so every event of a key is in one partition (no shuffle)."""
    FOLD_AFTER_SHUFFLE = "fold after a shuffle"
    """Decode, shuffle by key, fold each key's events in position order."""
    AGGREGATE_IN_PLACE = "aggregate in place"
    """Each reading task aggregates its partition in Arrow and merges it into the stored rows:
    the key is the aggregate id, so every event of a key is in that partition."""
    AGGREGATE_AFTER_SHUFFLE = "aggregate after a shuffle"
    """Decode, shuffle by key, aggregate in Spark; the task holding a key merges it into the
    stored row."""


@dataclass(frozen=True)
class Plan:
    """A compiled projection: picklable, what every executor task gets."""

    projection: Projection
    pipeline: Pipeline
    fallback: Pipeline | None
    """Where a batch goes when the pipeline's assumption fails (a key in two partitions)."""
    step: StateStep | None
    """One event onto a key's state (None: no state, a stream)."""
    aggregates: Mapping[str, AggregateFunction] = field(default_factory=dict)
    """The functions whose values are stored, by stored column (composites' components under
    their hidden columns)."""
    payload_fields: Mapping[str, str] = field(default_factory=dict)
    """Payload paths decoded into columns of their own, with their SQL types."""
    composites: Mapping[str, tuple[CompositeAggregate, Mapping[str, str]]] = field(
        default_factory=dict)
    """Composite columns: each function, and its components' stored columns by name."""

    def finish(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` of the stored columns with the composite columns finished from them."""
        for column, (function, parts) in self.composites.items():
            values[column] = function.finish({part: values[stored]
                                              for part, stored in parts.items()})
        return values

    @property
    def name(self) -> str:
        return self.projection.name

    @property
    def parks(self) -> bool:
        """Whether a key whose event the fold could not apply waits for it (``FoldProjection``).
        """
        return isinstance(self.projection, FoldProjection) and self.projection.park_on_failure

    @property
    def for_rows(self) -> Pipeline | None:
        """The pipeline of a batch that arrives as rows another reader read (Spark's Kafka
        source), not as partitions a task reads itself: the in-place pipelines need the
        latter."""
        if self.pipeline in (Pipeline.FOLD_IN_PLACE, Pipeline.AGGREGATE_IN_PLACE):
            return self.fallback
        return self.pipeline

    @property
    def rekeyed(self) -> bool:
        """Keys gather the events of many streams: a key's version counts its events, and
        duplicates are told apart per stream instead of per key."""
        return self.projection.key_by is not None

    @property
    def stateful(self) -> bool:
        return self.step is not None

    @property
    def watermarks_in_rows(self) -> bool:
        """Each key is one stream (a stateful projection keyed by aggregate id): the row's
        ``_version`` is the stream's watermark, the last version met, so the duplicate guard
        needs no table of its own. Re-keyed and stateless projections keep a watermark per
        source stream in the sources table."""
        return self.stateful and not self.rekeyed

    @property
    def emits(self) -> bool:
        return self.projection.derive is not None


def compile_projection(projection: Projection) -> Plan:
    """The plan of ``projection``'s batches."""
    if isinstance(projection, AggregationProjection):
        return _aggregation_plan(projection)
    step = checked_fold(projection) if isinstance(projection, FoldProjection) else None
    if projection.key_by is None and len(projection.sources) == 1:
        return Plan(projection, Pipeline.FOLD_IN_PLACE, Pipeline.FOLD_AFTER_SHUFFLE, step)
    return Plan(projection, Pipeline.FOLD_AFTER_SHUFFLE, None, step)


def as_plan(definition: Projection | Plan) -> Plan:
    return definition if isinstance(definition, Plan) else compile_projection(definition)


def _aggregation_plan(projection: AggregationProjection) -> Plan:
    """In place when a key is its stream (the task that reads a partition holds all of a
    key's events); re-keyed, after Spark's shuffle, so that one task holds each key."""
    stored = projection.stored_functions()
    composites = {column: (function, MappingProxyType({
        part: component_column(column, part) for part in function.components()}))
        for column, function in projection.aggregates.items()
        if isinstance(function, CompositeAggregate)}
    in_place = projection.key_by is None
    plan = Plan(projection,
                Pipeline.AGGREGATE_IN_PLACE if in_place else Pipeline.AGGREGATE_AFTER_SHUFFLE,
                Pipeline.AGGREGATE_AFTER_SHUFFLE if in_place else None,
                None, MappingProxyType({column: f for column, (f, _) in stored.items()}),
                MappingProxyType({f.field: kind for f, kind in stored.values()
                                  if f.field is not None}),
                MappingProxyType(composites))
    return replace(plan, step=aggregate_step(plan, stored))


def aggregate_step(plan: Plan, stored: Mapping[str, tuple[AggregateFunction, str]]
                   ) -> StateStep:
    """The aggregation's columns stepped one event at a time: the reference the Arrow and
    Spark forms are held to."""
    columns = [(column, f, f.field, kind) for column, (f, kind) in stored.items()]

    def step(state: State | None, event: Event) -> State:
        current = state or {}
        return plan.finish({column: f.step(current.get(column), None if path is None
                                           else coerce(path_value(event.data, path), kind))
                            for column, f, path, kind in columns})

    return step


def checked_fold(projection: FoldProjection) -> StateStep:
    """``projection.apply`` with its result checked, the column names looked up once."""
    fold, columns = projection.apply, frozenset(projection.columns)

    def step(state: State | None, event: Event) -> State | None:
        after = fold(state, event)
        if after is not None:
            if type(after) is not dict or not after.keys() <= columns:
                check_state(projection, after)  # raises, with the reason
            for value in after.values():
                if (type(value) is float and not isfinite(value)) or (
                        type(value) is int and not _MIN_INT <= value <= _MAX_INT):
                    check_state(projection, after)
        return after

    return step


def check_state(projection: Projection, state: Any) -> None:
    if state is None:
        return
    if not isinstance(state, dict):
        raise TypeError(f"fold returned {type(state).__name__}, expected dict or None")
    if not state.keys() <= projection.columns.keys():
        unknown = sorted(set(state) - set(projection.columns))
        raise ValueError(f"state fields {unknown} are not read model columns")
    # Not JSON: a KTable record must parse, and the read model would hold a value no
    # reader can take.
    not_finite = sorted(column for column, value in state.items()
                        if isinstance(value, float) and not isfinite(value))
    if not_finite:
        raise ValueError(f"state fields {not_finite} are not finite numbers")
    too_big = sorted(column for column, value in state.items()
                     if type(value) is int and not _MIN_INT <= value <= _MAX_INT)
    if too_big:
        # No column, JSON encoder or consumer here holds an integer beyond 64 bits.
        raise ValueError(f"state fields {too_big} are integers beyond 64 bits")
