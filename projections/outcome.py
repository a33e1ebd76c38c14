"""What a batch moves: source records, the keys' states, dead letters, derived events and the
batch's outcome. Plain values, with no engine: the fold produces them, the state modules store
them, and every layer above the definitions may read them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from eventfold.contract import PartitionKey
from eventfold.projections.definition.projection import Event, State


class SourceRecord(NamedTuple):
    """One message of a source topic (a named tuple: one is built per event)."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None


@dataclass(frozen=True, slots=True)
class RawRecords:
    """Records of one source partition in offset order, as its reader got them: what a task
    decodes and folds at once. Values stay bytes when the reader had bytes (the JSON parser
    takes them as they are); a key is text, or bytes when it is not UTF-8."""

    topic: str
    partition: int
    offsets: Sequence[int]
    keys: Sequence[str | bytes | None]
    values: Sequence[bytes | str | None]
    first_append_ms: int | None = None
    """When the first of them was appended to Kafka (its timestamp), if known."""
    events: Sequence[Event | None] | None = None
    """The records' events, when the reader decoded them (the event store's rows are columns,
    not envelopes): a None event leaves its record's value to decode, and a decoded event's
    value may be None."""

    def stream_ids(self) -> set[str]:
        """The keys that are text: the streams whose states and watermarks apply."""
        return {key for key in self.keys if isinstance(key, str)}


@dataclass(slots=True)
class KeyState:
    """A key's state (None once deleted), its version and the newest global position applied.

    The version is the last applied stream version when the key is the aggregate id (so a
    client can wait for the version a command returned); for a re-keyed projection it counts
    the events folded into the key.
    """

    state: State | None
    version: int
    position: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: SourceRecord
    reason: str
    fold_key: str | None = None
    """The key it was folded by, when it had one (a re-keyed projection's differs from the
    record's)."""
    event_id: str | None = None
    position: int | None = None
    """The event's id and global position, when it decoded."""
    parks: bool = False
    """Its key is parked behind it or behind an earlier letter: it waits to be retried."""


@dataclass(frozen=True, slots=True)
class ParkedKey:
    """The first event a parked key could not fold: its later events wait behind it."""

    topic: str
    partition: int
    offset: int
    event_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset} (event {self.event_id})"


NO_PARKED_KEYS: Mapping[str, ParkedKey] = MappingProxyType({})
PARKED_BEHIND = "parked behind "


@dataclass(frozen=True, slots=True)
class Emission:
    """A derived event ready to produce: its id is a function of its source event, so a
    re-sent emission is recognisable downstream."""

    topic: str
    key: str
    value: str


@dataclass
class FoldOutcome:
    changed: dict[str, KeyState] = field(default_factory=dict)
    """The rows to write: keys whose state or (keyed by aggregate id) watermark moved."""
    published: set[str] = field(default_factory=set)
    """Of ``changed``, the keys whose state changed: they get a KTable record."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    emissions: list[Emission] = field(default_factory=list)
    watermarks: dict[str, int] = field(default_factory=dict)
    next_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    parked: dict[str, ParkedKey] = field(default_factory=dict)
    """Keys this batch parked."""
    held: set[str] = field(default_factory=set)
    """Keys parked before this batch whose events it dead-lettered behind them: the batch
    may commit only while they are still parked."""
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0

    def see(self, stream_id: str, version: int) -> None:
        if version > self.watermarks.get(stream_id, 0):
            self.watermarks[stream_id] = version


