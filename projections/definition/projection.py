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
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple, Protocol

from sqlalchemy.types import JSON, BigInteger, Boolean, Float, Integer, Numeric, Text, TypeEngine

from eventfold.contract import DEFAULT_TOPIC_PREFIX, event_topic
from eventfold.projections.definition.aggregates import AggregateFunction, CompositeAggregate
from eventfold.projections.definition.fields import key_text, path_value
from eventfold.projections.definition.typed import Build, Typed, TypedFold, built, typed_builders

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
    schema_version: int = 1
    """The version of its type's schema ``data`` was recorded at: a typed function receives
    it lifted to the class's current version."""


@dataclass(frozen=True, slots=True)
class Derived:
    """An event a projection emits to an output topic, keyed by ``key``."""

    topic: str
    key: str
    type: str
    data: Mapping[str, Any]

    @classmethod
    def of(cls, topic: str, key: str, event: DerivableEvent) -> Derived:
        """One that carries ``event``, an instance of an event class: its type and data (a
        reaction that names the class receives it as one)."""
        return cls(topic, key, event.event_type, event.to_data())


class DerivableEvent(Protocol):
    """An event a projection may derive as an instance of its class (``DomainEvent`` is one)."""

    event_type: ClassVar[str]

    def to_data(self) -> Mapping[str, Any]: ...


Fold = Callable[[State | None, Event], State | None]
Derive = Callable[[Event, State | None, State | None], Iterable[Derived]]
"""``derive(event, state_before, state_after)``: the derived events of one applied event."""
ReceivingDerive = Callable[[Any, State | None, State | None], Iterable[Derived]]
"""A ``Derive`` as its projection's author writes it: its event is what the fold receives (an
instance of its class where the event types were given as classes)."""


class TypedEvent(Protocol):
    """An event class a fold or reaction can receive its events as (``write_model.DomainEvent``
    is one): ``from_data`` is the write side's own decoding."""

    event_type: ClassVar[str]

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Any: ...


class SourceType(Protocol):
    """An aggregate class named as a source (``write_model.Aggregate`` is one)."""

    stream_type: ClassVar[str]


Source = str | type[SourceType]
"""A source: an aggregate type's name, or its class."""
EventType = str | type[TypedEvent]
"""An event type: its stored name (the fold gets the ``Event``), or its class (the fold gets an
instance of it)."""


def source_names(sources: Iterable[Source]) -> tuple[str, ...]:
    """Aggregate types, named or given as aggregate classes."""
    return tuple(s if isinstance(s, str) else s.stream_type for s in sources)


def event_type_names(event_types: Iterable[EventType]) -> frozenset[str]:
    return frozenset(t if isinstance(t, str) else t.event_type for t in event_types)


def on_crossing(condition: Callable[[State], bool],
                emit: Callable[[Any, State], Derived]) -> Derive:
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


class Kind(StrEnum):
    FOLD = "fold"
    AGGREGATION = "aggregation"
    STREAM = "stream"


@dataclass(frozen=True)
class Projection:
    """What every projection kind shares: it reads the event topics of ``sources`` (aggregate
    types) and keeps or emits something per key.

    The key is the aggregate id unless ``key_by`` names an event data field (a dotted path
    reaches into nested objects). ``columns`` declares the read model (each state field is a
    column of that SQL type); ``event_types`` limits the events it sees (others are skipped,
    not dead-lettered). Build one with ``projection``, ``aggregation`` or ``stream``.
    """

    name: str
    sources: tuple[str, ...]
    columns: Mapping[str, TypeEngine[Any]] = field(default_factory=dict)
    derive: Derive | None = None
    key_by: str | None = None
    lookup: Lookup | None = None
    event_types: frozenset[str] | None = None
    indexes: tuple[str, ...] = ()
    table: str = ""
    ktable_topic: str = ""
    ktable_partitions: int | None = None
    """Of the KTable topic a version creates (None: as many as its source topics have). A
    change applies to the next version: a replay."""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    description: str = ""

    kind: ClassVar[Kind]
    has_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if type(self) is Projection:
            raise TypeError("Projection is the base of FoldProjection, AggregationProjection "
                            "and StreamProjection; build one with projection(), aggregation() "
                            "or stream()")
        if not self.name.isidentifier():
            raise ValueError(f"projection name {self.name!r} must be a Python identifier")
        if not self.sources:
            raise ValueError(f"projection {self.name!r} needs at least one source")
        for column in self.columns:
            if not column.isidentifier() or column.startswith("_") or column == "key":
                raise ValueError(f"column {column!r}: use identifiers; 'key' and _names are ours")
        for column in self.indexes:
            if column not in self.columns:
                raise ValueError(f"projection {self.name!r}: index on unknown column {column!r}")
        for path in (self.key_by, self.lookup.on if self.lookup else None):
            if path is not None and not all(part for part in path.split(".")):
                raise ValueError(f"projection {self.name!r}: {path!r} is not a field path")
        if self.ktable_partitions is not None and self.ktable_partitions < 1:
            raise ValueError(f"projection {self.name!r}: ktable_partitions must be at least 1")
        if self.table and not self.table.isidentifier():
            raise ValueError(f"table name {self.table!r} must be an identifier")
        object.__setattr__(self, "table", self.table or self.name)
        ktable_topic = self.ktable_topic or f"eventfold.ktable.{self.name}"
        object.__setattr__(self, "ktable_topic", ktable_topic)

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

    def fold_key(self, stream_id: str, data: Mapping[str, Any]) -> str | None:
        """The key an event folds into: its aggregate id, or the ``key_by`` field as text
        (None: the event has no such field)."""
        if self.key_by is None:
            return stream_id
        return key_text(path_value(data, self.key_by))

    def lookup_key(self, data: Mapping[str, Any]) -> str | None:
        """The key of the looked-up row an event joins with (None: no lookup, or no key)."""
        if self.lookup is None:
            return None
        return key_text(path_value(data, self.lookup.on))

    @property
    def stored_columns(self) -> Mapping[str, TypeEngine[Any]]:
        """The columns the read model table stores: the declared ones, and any of ours."""
        return self.columns

    @property
    def json_columns(self) -> frozenset[str]:
        return frozenset(n for n, t in self.columns.items() if isinstance(t, JSON))

    def sql_type(self, column: str) -> str:
        """The Spark SQL type a column is computed in (one of ``fields.SQL_TYPES``)."""
        col_type = self.columns[column]
        if isinstance(col_type, Boolean):
            return "boolean"
        if isinstance(col_type, Float | Numeric):
            return "double"
        if isinstance(col_type, Integer):
            return "bigint"
        return "string"


@dataclass(frozen=True)
class FoldProjection(Projection):
    """A per-key fold in Python: ``apply(state, event) -> state | None`` (None deletes).

    When ``apply`` (or ``derive``) raises, the event is dead-lettered and its key is parked:
    the key's later events are dead-lettered behind it, unfolded, until ``eventfold dlq
    retry`` folds them in order (or ``dlq discard`` drops the one that failed), so a key's
    state never skips an event. ``park_on_failure=False`` folds them on instead."""

    apply: Fold = field(kw_only=True)
    park_on_failure: bool = field(default=True, kw_only=True)
    kind: ClassVar[Kind] = Kind.FOLD


@dataclass(frozen=True)
class AggregationProjection(Projection):
    """Columns computed natively per key: ``{"total": Sum("value"), "sales": Count()}``."""

    aggregates: Mapping[str, AggregateFunction | CompositeAggregate] = field(kw_only=True)
    kind: ClassVar[Kind] = Kind.AGGREGATION

    def __post_init__(self) -> None:
        super().__post_init__()
        if set(self.aggregates) != set(self.columns):
            raise ValueError(f"projection {self.name!r}: declare one column per aggregate")
        if self.lookup is not None:
            raise ValueError(f"projection {self.name!r}: an aggregation cannot look up rows")
        for column, function in self.aggregates.items():
            if not isinstance(function, AggregateFunction | CompositeAggregate):
                raise TypeError(f"projection {self.name!r}: column {column!r} needs an "
                                f"AggregateFunction (Sum, Count...), not {function!r}")
            if (isinstance(function, CompositeAggregate)
                    and self.sql_type(column) != function.result_type):
                raise ValueError(f"projection {self.name!r}: {type(function).__name__} column "
                                 f"{column!r} must be of a {function.result_type} type")
        self.stored_functions()  # checks that each field is read as one type

    def stored_functions(self) -> dict[str, tuple[AggregateFunction, str]]:
        """Every function whose value is stored, by stored column, with the SQL type its field
        is read as: the declared columns, and the components of composite ones (hidden)."""
        stored: dict[str, tuple[AggregateFunction, str]] = {}
        for column, function in self.aggregates.items():
            kind = self.sql_type(column)
            if isinstance(function, CompositeAggregate):
                for part, component in function.components().items():
                    stored[component_column(column, part)] = (component, kind)
            else:
                stored[column] = (function, kind)
        field_types: dict[str, str] = {}
        for function, kind in stored.values():
            if function.field is None:
                continue
            # A field is decoded once, as one type: its columns must agree on it.
            if field_types.setdefault(function.field, kind) != kind:
                raise ValueError(f"projection {self.name!r}: field {function.field!r} is "
                                 f"aggregated as {field_types[function.field]} and as {kind}; "
                                 f"give its columns one SQL type")
        return stored

    @property
    def stored_columns(self) -> Mapping[str, TypeEngine[Any]]:
        hidden = {column: _COLUMN_TYPES[function.result_type(kind)]
                  for column, (function, kind) in self.stored_functions().items()
                  if column not in self.columns}
        return {**self.columns, **hidden}


def component_column(column: str, part: str) -> str:
    """The hidden column holding one component of a composite aggregate's column."""
    return f"_{column}__{part}"


_COLUMN_TYPES: dict[str, TypeEngine[Any]] = {
    "bigint": BigInteger(), "double": Float(), "boolean": Boolean(), "string": Text()}


@dataclass(frozen=True)
class StreamProjection(Projection):
    """No state: each event becomes zero or more derived events (filter, map, flat-map)."""

    kind: ClassVar[Kind] = Kind.STREAM
    has_state: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.derive is None:
            raise ValueError(f"stream {self.name!r} needs a transform")


Handler = Callable[[State | None, Any], State | None]


class Dispatch:
    """A fold made of one handler per event type, by event class or by type name.

    A handler registered for a class gets the event as an instance of it (built from its
    data); one registered for a type name gets the ``Event``. Events with no handler leave the
    state as it is. Pass a ``Dispatch`` where a fold goes; its types become the projection's
    ``event_types`` unless they are given::

        levels = Dispatch()

        @levels.on(ItemAdded)
        def added(state: State | None, event: ItemAdded) -> State:
            return {"quantity": (state or {}).get("quantity", 0) + event.quantity}
    """

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[Handler, Build | None]] = {}

    def on(self, *event_types: EventType) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            for event_type in event_types:
                (name,) = event_type_names([event_type])
                if name in self._handlers:
                    raise ValueError(f"event type {name!r} already has a handler")
                self._handlers[name] = (handler, typed_builders([event_type]).get(name))
            return handler

        return register

    @property
    def event_types(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def __call__(self, state: State | None, event: Event) -> State | None:
        entry = self._handlers.get(event.type)
        if entry is None:
            return state
        handler, build = entry
        return handler(state, event if build is None else built(build, event))


class _TypedDerive(Typed):
    def __call__(self, event: Event, before: State | None, after: State | None
                 ) -> Iterable[Derived]:
        return self.function(self.typed(event), before, after)  # type: ignore[no-any-return]


def _typed_derive(derive: ReceivingDerive | None, event_types: Iterable[EventType] | None
                  ) -> Derive | None:
    """A fold's ``derive`` receives its events as the fold does: typed where their types were
    given as classes."""
    if derive is None or event_types is None or not typed_builders(event_types):
        return derive
    return _TypedDerive(derive, event_types)


def _options(sources: Iterable[Source], event_types: Iterable[EventType] | None
             ) -> dict[str, Any]:
    return {"sources": source_names(sources),
            "event_types": event_type_names(event_types) if event_types is not None else None}


def projection(
    name: str, *, sources: Iterable[Source], columns: Mapping[str, TypeEngine[Any]],
    event_types: Iterable[EventType] | None = None, key_by: str | None = None,
    lookup: Lookup | None = None, derive: ReceivingDerive | None = None, table: str = "",
    ktable_topic: str = "", indexes: Iterable[str] = (), park_on_failure: bool = True,
    ktable_partitions: int | None = None,
) -> Callable[[Handler], FoldProjection]:
    """Decorator: turn a fold function (or a ``Dispatch``) into a projection. ``sources``:
    aggregate classes or type names. ``event_types`` limits the events folded; those given as
    classes reach the fold as instances of them (``match event: case StockReceived(quantity=q)``),
    decoded by the class's own ``from_data``, and those given by name as the ``Event`` (its
    stream id, version and position). ``indexes`` are the columns the read model indexes (the
    read API sorts on them and on the key); ``park_on_failure`` is ``FoldProjection``'s."""

    def wrap(fold: Handler) -> FoldProjection:
        handled: Iterable[EventType] | None = event_types
        if event_types is None and isinstance(fold, Dispatch):
            handled = fold.event_types
        elif event_types is not None and typed_builders(event_types):
            fold = TypedFold(fold, event_types)
        return FoldProjection(
            name=name, columns=dict(columns), apply=fold, key_by=key_by, lookup=lookup,
            derive=_typed_derive(derive, handled), table=table, ktable_topic=ktable_topic,
            indexes=tuple(indexes), ktable_partitions=ktable_partitions,
            park_on_failure=park_on_failure,
            description=(fold.__doc__ or "").strip(),
            **_options(sources, handled),
        )

    return wrap


def aggregation(
    name: str, *, sources: Iterable[Source], aggregates: Mapping[str, AggregateFunction],
    columns: Mapping[str, TypeEngine[Any]], event_types: Iterable[EventType] | None = None,
    key_by: str | None = None, table: str = "", description: str = "",
    indexes: Iterable[str] = (), ktable_partitions: int | None = None,
) -> AggregationProjection:
    """A projection Spark computes natively: ``{"total": Sum("value"), "sales": Count()}``."""
    return AggregationProjection(name=name, columns=dict(columns), aggregates=dict(aggregates),
                      key_by=key_by, table=table, description=description,
                      indexes=tuple(indexes), ktable_partitions=ktable_partitions,
                      **_options(sources, event_types))


def stream(
    name: str, *, sources: Iterable[Source], event_types: Iterable[EventType] | None = None,
) -> Callable[[Callable[[Any], Iterable[Derived]]], StreamProjection]:
    """Decorator: a stateless stream of derived events (filter, map, flat-map). Event types
    given as classes reach it as instances of them, as a fold's do."""

    def wrap(transform: Callable[[Any], Iterable[Derived]]) -> StreamProjection:
        receive = Typed(transform, event_types or ()).typed

        def derive(event: Event, _before: State | None, _after: State | None) -> Iterable[Derived]:
            return transform(receive(event))

        return StreamProjection(name=name, derive=derive,
                                description=(transform.__doc__ or "").strip(),
                                **_options(sources, event_types))

    return wrap
