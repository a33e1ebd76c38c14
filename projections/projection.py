"""Defining a projection: what it reads, how it folds per key, what it writes.

Three kinds, all declared as ordinary typed Python and testable without Spark:

- a **fold**: ``apply(state, event) -> state | None`` per key (None deletes the key);
- an **aggregation**: columns computed by Spark natively (sum, count, min, max, latest);
- a **stream**: no state, only derived events (filter, map, flat-map into output topics).

Any kind may re-key (``key_by``: fold by an event field instead of the aggregate id, Spark
repartitions), look up another projection's table (``lookup``: a stream-table left join) and
emit derived events (``derive``, e.g. ``on_crossing`` for threshold notifications).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from eventfold.outbox import event_topic
from eventfold.outbox.topics import DEFAULT_TOPIC_PREFIX
from sqlalchemy.types import JSON, Boolean, Float, Integer, Numeric, TypeEngine

State = dict[str, Any]


class Event(NamedTuple):
    """What a fold sees: one decoded event with its identity and position.

    A named tuple rather than a frozen dataclass: it is built once per event on the hot path,
    and a tuple is several times cheaper to create."""

    type: str
    data: Mapping[str, Any]
    stream_id: str
    stream_version: int
    event_id: str
    global_position: int
    recorded_at: str = ""
    joined: State | None = None
    """The looked-up row of the projection's ``lookup`` table (None: no such key)."""


@dataclass(frozen=True, slots=True)
class Derived:
    """An event a projection emits to an output topic, keyed by ``key``."""

    topic: str
    key: str
    type: str
    data: Mapping[str, Any]


Fold = Callable[[State | None, Event], State | None]
Derive = Callable[[Event, State | None, State | None], Iterable[Derived]]
"""``derive(event, state_before, state_after)``: the derived events of one applied event."""


def on_crossing(condition: Callable[[State], bool],
                emit: Callable[[Event, State], Derived]) -> Derive:
    """Emit once each time a key's state starts to satisfy ``condition``.

    The state before and after each event decide, so a key that stays above a target does not
    fire again; a deleted key starts over and may cross again.
    """

    def derive(event: Event, before: State | None, after: State | None) -> Iterator[Derived]:
        was = before is not None and condition(before)
        if after is not None and condition(after) and not was:
            yield emit(event, after)

    return derive


@dataclass(frozen=True, slots=True)
class Lookup:
    """A left join of each event with another projection's current row (GlobalKTable-style).

    ``on`` is the event data field holding the other table's key; the row (or None) is
    ``event.joined``.
    """

    projection: str
    on: str


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One natively computed column of an aggregation projection."""

    function: str  # sum, count, min, max, latest
    field: str | None = None

    def python_step(self, current: Any, value: Any) -> Any:
        if self.function == "count":
            return (current or 0) + 1
        if value is None:
            return current
        if self.function == "sum":
            return (current or 0) + value
        if self.function == "min":
            return value if current is None else min(current, value)
        if self.function == "max":
            return value if current is None else max(current, value)
        return value  # latest: events arrive in position order


def Sum(field_name: str) -> Aggregate:
    return Aggregate("sum", field_name)


def Count() -> Aggregate:
    return Aggregate("count")


def Min(field_name: str) -> Aggregate:
    return Aggregate("min", field_name)


def Max(field_name: str) -> Aggregate:
    return Aggregate("max", field_name)


def Latest(field_name: str) -> Aggregate:
    return Aggregate("latest", field_name)


@dataclass(frozen=True)
class Projection:
    """A projection over the event topics of ``sources`` (aggregate types).

    The key is the aggregate id unless ``key_by`` names an event data field. ``columns``
    declares the read model (each state field is a column of that SQL type); ``event_types``
    limits the events it sees (others are skipped, not dead-lettered).
    """

    name: str
    sources: tuple[str, ...]
    columns: Mapping[str, TypeEngine[Any]] = field(default_factory=dict)
    apply: Fold | None = None
    aggregates: Mapping[str, Aggregate] | None = None
    derive: Derive | None = None
    key_by: str | None = None
    lookup: Lookup | None = None
    event_types: frozenset[str] | None = None
    indexes: tuple[str, ...] = ()
    table: str = ""
    ktable_topic: str = ""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"projection name {self.name!r} must be a Python identifier")
        if not self.sources:
            raise ValueError(f"projection {self.name!r} needs at least one source")
        if self.apply is not None and self.aggregates is not None:
            raise ValueError(f"projection {self.name!r}: a fold or an aggregation, not both")
        if not self.has_state and self.derive is None:
            raise ValueError(f"projection {self.name!r} has no fold, aggregates or derive")
        for column in self.columns:
            if not column.isidentifier() or column.startswith("_") or column == "key":
                raise ValueError(f"column {column!r}: use identifiers; 'key' and _names are ours")
        for column in self.indexes:
            if column not in self.columns:
                raise ValueError(f"projection {self.name!r}: index on unknown column {column!r}")
        if self.aggregates is not None and set(self.aggregates) != set(self.columns):
            raise ValueError(f"projection {self.name!r}: declare one column per aggregate")
        if self.table and not self.table.isidentifier():
            raise ValueError(f"table name {self.table!r} must be an identifier")
        object.__setattr__(self, "table", self.table or self.name)
        ktable_topic = self.ktable_topic or f"eventfold.ktable.{self.name}"
        object.__setattr__(self, "ktable_topic", ktable_topic)

    @property
    def kind(self) -> str:
        if self.apply is not None:
            return "fold"
        return "aggregation" if self.aggregates is not None else "stream"

    @property
    def has_state(self) -> bool:
        return self.apply is not None or self.aggregates is not None

    @property
    def source_topics(self) -> list[str]:
        return [event_topic(source, self.topic_prefix) for source in self.sources]

    @property
    def dead_letter_topic(self) -> str:
        return f"eventfold.dlq.{self.name}"

    def ktable_topic_for(self, version: int) -> str:
        """Version 1 keeps the plain name; a replay's version N writes ``<topic>.vN``."""
        return self.ktable_topic if version <= 1 else f"{self.ktable_topic}.v{version}"

    def handles(self, event_type: str) -> bool:
        return self.event_types is None or event_type in self.event_types

    @property
    def json_columns(self) -> frozenset[str]:
        return frozenset(n for n, t in self.columns.items() if isinstance(t, JSON))

    def spark_type(self, column: str) -> str:
        """The Spark SQL type an aggregated column is computed in."""
        col_type = self.columns[column]
        if isinstance(col_type, Boolean):
            return "boolean"
        if isinstance(col_type, Float | Numeric):
            return "double"
        if isinstance(col_type, Integer):
            return "bigint"
        return "string"


def _options(sources: Iterable[str], event_types: Iterable[str] | None) -> dict[str, Any]:
    return {"sources": tuple(sources),
            "event_types": frozenset(event_types) if event_types is not None else None}


def projection(
    name: str, *, sources: Iterable[str], columns: Mapping[str, TypeEngine[Any]],
    event_types: Iterable[str] | None = None, key_by: str | None = None,
    lookup: Lookup | None = None, derive: Derive | None = None, table: str = "",
    ktable_topic: str = "", indexes: Iterable[str] = (),
) -> Callable[[Fold], Projection]:
    """Decorator: turn a fold function into a Projection. ``indexes`` are the columns the read
    model indexes (the read API sorts on them and on the key)."""

    def wrap(fold: Fold) -> Projection:
        return Projection(
            name=name, columns=dict(columns), apply=fold, key_by=key_by, lookup=lookup,
            derive=derive, table=table, ktable_topic=ktable_topic, indexes=tuple(indexes),
            description=(fold.__doc__ or "").strip(), **_options(sources, event_types),
        )

    return wrap


def aggregation(
    name: str, *, sources: Iterable[str], aggregates: Mapping[str, Aggregate],
    columns: Mapping[str, TypeEngine[Any]], event_types: Iterable[str] | None = None,
    key_by: str | None = None, table: str = "", description: str = "",
    indexes: Iterable[str] = (),
) -> Projection:
    """A projection Spark computes natively: ``{"total": Sum("value"), "sales": Count()}``."""
    return Projection(name=name, columns=dict(columns), aggregates=dict(aggregates),
                      key_by=key_by, table=table, description=description,
                      indexes=tuple(indexes),
                      **_options(sources, event_types))


def stream(
    name: str, *, sources: Iterable[str], event_types: Iterable[str] | None = None,
) -> Callable[[Callable[[Event], Iterable[Derived]]], Projection]:
    """Decorator: a stateless stream of derived events (filter, map, flat-map)."""

    def wrap(transform: Callable[[Event], Iterable[Derived]]) -> Projection:
        def derive(event: Event, _before: State | None, _after: State | None) -> Iterable[Derived]:
            return transform(event)

        return Projection(name=name, derive=derive, description=(transform.__doc__ or "").strip(),
                          **_options(sources, event_types))

    return wrap
