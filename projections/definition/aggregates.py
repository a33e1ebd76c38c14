"""Aggregate functions: each one class carrying every form the engine computes it in.

An aggregation's column is folded in three places, and each needs the function in its own
language: the plain-Python reference fold (``step``), a task's partial aggregate of its
partition in Arrow (``arrow_partial``, merged per key, and into the stored row, with
``arrow_merge``), and Spark's aggregate after a shuffle (``spark``). Keeping them side by side
is what keeps them equal; the parity tests fold random batches through all of them.

A function fits when a batch's partial is one value per key that merges associatively with
the stored one (sum, count, min, max), or one value whose newest occurrence wins (latest:
set ``newest_wins`` and the engine tracks the position of each value). Add one by subclassing
``AggregateFunction``. A column computed from several such values (``Avg``: a sum and a
count) is a ``CompositeAggregate``: its components are stored beside it, in hidden columns,
and it is finished from them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column

# pyarrow and Spark's functions are imported where a fold is planned, not where an aggregate
# is declared: an app module is imported by every command, most of which run no Spark.


@dataclass(frozen=True, slots=True)
class AggregateFunction(ABC):
    """One natively computed column of an aggregation projection, over the payload field
    ``field`` (dotted paths reach into nested objects). A null or missing value is skipped,
    as SQL aggregates skip nulls."""

    field: str | None = None

    arrow_partial: ClassVar[str]
    """The Arrow hash aggregate of a task's events (``sum``, ``min``, ``last``...)."""
    arrow_merge: ClassVar[str]
    """The Arrow hash aggregate merging partials (and a partial into the stored value);
    ignored when ``newest_wins``."""
    newest_wins: ClassVar[bool] = False
    """The value of the newest event that has one wins: partials carry its position."""
    needs_field: ClassVar[bool] = True
    """Whether the function must be given a payload field (``Count`` need not)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.needs_field and not self.field:
            raise TypeError(f"{name} needs the payload field it aggregates, e.g. {name}('value')")

    @abstractmethod
    def step(self, current: Any, value: Any) -> Any:
        """The column after one more event whose field holds ``value`` (in position order)."""

    @abstractmethod
    def spark(self, value: Column, position: Column) -> Column:
        """Spark's aggregate of a key's events (``value``: the field's column)."""

    def partial_type(self, field_type: pa.DataType) -> pa.DataType:
        """The Arrow type of the partial, given the field's decoded type."""
        return field_type

    def result_type(self, field_type: str) -> str:
        """The SQL type (``fields.SQL_TYPES``) of the value, given the field's."""
        return field_type


class Sum(AggregateFunction):
    arrow_partial = "sum"
    arrow_merge = "sum"

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else (current or 0) + value

    def spark(self, value: Column, position: Column) -> Column:
        from pyspark.sql import functions as F

        return F.sum(value)


class Count(AggregateFunction):
    """``Count()``: the events (of the handled types) per key; ``Count("field")``: those whose
    field has a value (of the column's type), as SQL's ``count(field)``."""

    needs_field = False
    arrow_partial = "count"
    arrow_merge = "sum"

    def step(self, current: Any, value: Any) -> Any:
        return (current or 0) + (self.field is None or value is not None)

    def spark(self, value: Column, position: Column) -> Column:
        from pyspark.sql import functions as F

        return F.count(value)

    def partial_type(self, field_type: pa.DataType) -> pa.DataType:
        import pyarrow as pa

        return pa.int64()

    def result_type(self, field_type: str) -> str:
        return "bigint"


class _Extreme(AggregateFunction):
    """The smallest or largest value: the same in every form but for which one wins."""

    smallest: ClassVar[bool]

    def step(self, current: Any, value: Any) -> Any:
        if value is None or current is None:
            return current if value is None else value
        return min(current, value) if self.smallest else max(current, value)

    def spark(self, value: Column, position: Column) -> Column:
        from pyspark.sql import functions as F

        return F.min(value) if self.smallest else F.max(value)


class Min(_Extreme):
    arrow_partial = "min"
    arrow_merge = "min"
    smallest = True


class Max(_Extreme):
    arrow_partial = "max"
    arrow_merge = "max"
    smallest = False


class Latest(AggregateFunction):
    """The field's value in the newest event that has one."""

    arrow_partial = "last"
    arrow_merge = "last"
    newest_wins = True

    def step(self, current: Any, value: Any) -> Any:
        return current if value is None else value

    def spark(self, value: Column, position: Column) -> Column:
        from pyspark.sql import functions as F

        return F.max_by(value, F.when(value.isNotNull(), position))


@dataclass(frozen=True, slots=True)
class CompositeAggregate(ABC):
    """A column finished from the values of other aggregate functions, its components, which
    are stored beside it (hidden from readers) so that every batch merges into them."""

    field: str

    result_type: ClassVar[str]
    """The SQL type its column must have (``fields.SQL_TYPES``)."""

    @abstractmethod
    def components(self) -> Mapping[str, AggregateFunction]:
        """The functions it is finished from, by name."""

    @abstractmethod
    def finish(self, parts: Mapping[str, Any]) -> Any:
        """The column from its components' values, in Python."""


class Avg(CompositeAggregate):
    """The mean of the field's values per key (a Float column); null before any value."""

    result_type = "double"

    def components(self) -> Mapping[str, AggregateFunction]:
        return {"sum": Sum(self.field), "count": Count(self.field)}

    def finish(self, parts: Mapping[str, Any]) -> Any:
        count = parts["count"]
        return parts["sum"] / count if count else None
