"""One batch of a reaction's events, as its runner reads, acts on and saves it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from eventfold.contract import PartitionKey
from eventfold.projections.definition.projection import Event
from eventfold.reactions.parking import Parking
from eventfold.reactions.positions import Refusal
from eventfold.reactions.process import recorded_time
from eventfold.reactions.sending import Answered, Outgoing
from eventfold.write_model import Command


@dataclass
class ReactionCounts:
    """What a runner did since it started."""

    events: int = 0
    sent: int = 0
    repeated: int = 0
    """Commands the command log had already executed (a batch read again)."""
    refused: int = 0
    batches: int = 0
    timers: int = 0

    def answered(self, answered: Answered) -> None:
        """Count a round of sends."""
        self.sent += answered.executed
        self.repeated += answered.repeated
        self.refused += len(answered.refusals)


@dataclass
class ReactionBatch:
    """One batch's events in order, the commands they ask for (in the order each group is
    sent), and what it could not do."""

    positions: dict[PartitionKey, int] = field(default_factory=dict)
    recorded_through: dict[PartitionKey, datetime] = field(default_factory=dict)
    """Each partition's latest recorded time among the batch's events (a process's stream
    time once the batch is stepped)."""
    events: list[tuple[Event, str | None]] = field(default_factory=list)
    """Each event and its correlation id."""
    outgoing: list[Outgoing] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    called: bool = False
    """An effect's calls were made."""
    parking: Parking = field(default_factory=Parking)

    def read(self, key: PartitionKey, recorded_at: str) -> None:
        """An event recorded at ``recorded_at`` was read from partition ``key`` (a derived
        event, with no recorded time, does not move stream time)."""
        at = recorded_time(recorded_at)
        if at is not None and (key not in self.recorded_through
                               or at > self.recorded_through[key]):
            self.recorded_through[key] = at

    def asked(self, group: str, event: Event, commands: Sequence[Command],
              correlation_id: str | None) -> None:
        """``event`` asked for ``commands`` (each with its id), sent in order within
        ``group``."""
        self.outgoing += [Outgoing(group, command, event.event_id, index, event.type,
                                   event.stream_id, correlation_id)
                          for index, command in enumerate(commands)]

    def raised(self, event: Event, error: Exception,
               parks: tuple[str, str | None] | None = None) -> None:
        """The function raised on ``event``: recorded; with ``parks`` (its key and the
        event's correlation id), the key parked, holding the event and its later ones."""
        reason = f"{type(error).__name__}: {error}"
        self.refusals.append(Refusal(event.event_id, -1, "raised", event.type,
                                     event.stream_id, reason))
        if parks is not None:
            self.parking.park(parks[0], event, parks[1], reason)
