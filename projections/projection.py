"""Defining a projection: a per-key fold over event topics, with its read model and KTable."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.types import TypeEngine

from outbox import event_topic
from outbox.topics import DEFAULT_TOPIC_PREFIX

State = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    """What a fold sees: one decoded event with its identity and position."""

    type: str
    data: Mapping[str, Any]
    stream_id: str
    stream_version: int
    event_id: str
    global_position: int
    recorded_at: str


Fold = Callable[[State | None, Event], State | None]


@dataclass(frozen=True)
class Projection:
    """A fold ``apply(state, event) -> state | None`` per key (None deletes the key).

    ``sources`` are aggregate types, one event topic each; the key is the aggregate id.
    ``columns`` declares the read model: each state field becomes a column of that SQL type.
    ``event_types`` limits the events the fold sees (others are skipped, not dead-lettered).
    """

    name: str
    sources: tuple[str, ...]
    apply: Fold
    columns: Mapping[str, TypeEngine[Any]]
    event_types: frozenset[str] | None = None
    table: str = ""
    ktable_topic: str = ""
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    description: str = field(default="")

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"projection name {self.name!r} must be a Python identifier")
        if not self.sources:
            raise ValueError(f"projection {self.name!r} needs at least one source")
        for column in self.columns:
            if not column.isidentifier() or column.startswith("_") or column == "key":
                raise ValueError(f"column {column!r}: use identifiers; 'key' and _names are ours")
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

    def handles(self, event_type: str) -> bool:
        return self.event_types is None or event_type in self.event_types


def projection(
    name: str,
    *,
    sources: Iterable[str],
    columns: Mapping[str, TypeEngine[Any]],
    event_types: Iterable[str] | None = None,
    table: str = "",
    ktable_topic: str = "",
) -> Callable[[Fold], Projection]:
    """Decorator: turn a fold function into a Projection."""

    def wrap(fold: Fold) -> Projection:
        return Projection(
            name=name,
            sources=tuple(sources),
            apply=fold,
            columns=dict(columns),
            event_types=frozenset(event_types) if event_types is not None else None,
            table=table,
            ktable_topic=ktable_topic,
            description=(fold.__doc__ or "").strip(),
        )

    return wrap
