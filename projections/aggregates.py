"""Aggregate functions: each one class carrying every form the engine computes it in.

An aggregation's column is folded in four places, and each needs the function in its own
language: the plain-Python reference fold (``step``), a task's partial aggregate of its
partition in Arrow (``arrow_partial``, merged on the driver with ``arrow_merge``), Spark's
aggregate after a shuffle (``spark``) and the merge of a batch's partial into the stored row in
SQL (``sql_merge``). Keeping them side by side is what keeps them equal; the parity tests fold
random batches through all of them.

A function fits when a batch's partial is one value per key that merges associatively with
the stored one (sum, count, min, max), or one value whose newest occurrence wins (latest:
set ``newest_wins`` and the engine tracks the position of each value). Add one by subclassing
``AggregateFunction``; ``Avg`` is ``Sum`` and ``Count`` columns divided when read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F


@dataclass(frozen=True, slots=True)
class AggregateFunction(ABC):
    """One natively computed column of an aggregation projection, over the payload field
    ``field`` (dotted paths reach into nested objects). A null or missing value is skipped,
    as SQL aggregates skip nulls."""

    field: str | None = None

    arrow_partial: ClassVar[str]
    """The Arrow hash aggregate of a task's events (``sum``, ``min``, ``last``...)."""
    arrow_merge: ClassVar[str]
    """The Arrow hash aggregate merging partials; ignored when ``newest_wins``."""
    sql_merge: ClassVar[str]
    """The stored value merged with a batch's partial: SQL over ``{t}.{c}`` (stored) and
    ``excluded.{c}`` (the batch's), where ``excluded._position`` is the batch's last position."""
    newest_wins: ClassVar[bool] = False
    """The value of the newest event that has one wins: partials carry its position."""
    reads_field: ClassVar[bool] = True
    """Whether the function aggregates a payload field (``Count`` does not)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.reads_field and not self.field:
            raise TypeError(f"{name} needs the payload field it aggregates, e.g. {name}('value')")
        if not self.reads_field and self.field is not None:
            raise TypeError(f"{name} counts events and takes no field")

    @abstractmethod
    def step(self, current: Any, value: Any) -> Any:
        """The column after one more event whose field holds ``value`` (in position order)."""

    @abstractmethod
    def spark(self, value: Column, position: Column) -> Column:
        """Spark's aggregate of a key's events (``value``: the field's column)."""

    def partial_type(self, field_type: pa.DataType) -> pa.DataType:
        """The Arrow type of the partial, given the field's decoded type."""
        return field_type


class Sum(AggregateFunction):
    arrow_partial = "sum"
    arrow_merge = "sum"
    sql_merge = ("CASE WHEN excluded.{c} IS NULL THEN {t}.{c} "
                 "ELSE coalesce({t}.{c}, 0) + excluded.{c} END")

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else (current or 0) + value

    def spark(self, value: Column, position: Column) -> Column:
        return F.sum(value)


class Count(AggregateFunction):
    """The number of events (of the handled types) per key."""

    reads_field = False
    arrow_partial = "count"
    arrow_merge = "sum"
    sql_merge = "{t}.{c} + excluded.{c}"

    def step(self, current: Any, value: Any) -> Any:
        return (current or 0) + 1

    def spark(self, value: Column, position: Column) -> Column:
        return F.count(F.lit(1))

    def partial_type(self, field_type: pa.DataType) -> pa.DataType:
        return pa.int64()


class Min(AggregateFunction):
    arrow_partial = "min"
    arrow_merge = "min"
    sql_merge = "least({t}.{c}, excluded.{c})"

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else value if current is None else min(current, value)

    def spark(self, value: Column, position: Column) -> Column:
        return F.min(value)


class Max(AggregateFunction):
    arrow_partial = "max"
    arrow_merge = "max"
    sql_merge = "greatest({t}.{c}, excluded.{c})"

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else value if current is None else max(current, value)

    def spark(self, value: Column, position: Column) -> Column:
        return F.max(value)


class Latest(AggregateFunction):
    """The field's value in the newest event that has one."""

    arrow_partial = "last"
    arrow_merge = "last"
    sql_merge = ("CASE WHEN excluded._position > {t}._position AND excluded.{c} IS NOT NULL "
                 "THEN excluded.{c} ELSE {t}.{c} END")
    newest_wins = True

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else value

    def spark(self, value: Column, position: Column) -> Column:
        return F.max_by(value, F.when(value.isNotNull(), position))
