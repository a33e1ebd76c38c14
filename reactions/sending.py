"""Sending what reactions and process managers decided: each command through the command
bus with the metadata that traces it to its event, one group's commands one after the other
(a reaction's: one aggregate's; a process's: one key's), groups concurrently, and what the
domain refused recorded with the event that asked for it."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import KafkaException

from eventfold.reactions.positions import Refusal, RefusalKind
from eventfold.write_model import (
    AsyncCommandBus,
    Command,
    CommandIdReused,
    CommandResult,
    ConcurrencyError,
    DomainError,
    StoreUnavailable,
    StreamNotFound,
    StreamOwnedByAnotherType,
)

log = logging.getLogger(__name__)

REFUSALS = (DomainError, StreamNotFound, ConcurrencyError, CommandIdReused,
            StreamOwnedByAnotherType)
"""What the domain answers a command with when it will not execute it: final, recorded with
the event, and the reaction goes on. A version conflict is final only for a command that
states the version it expects; otherwise the bus retries it, and so does the sender once the
bus gives up."""

UNAVAILABLE = (StoreUnavailable, psycopg.Error, KafkaException, OSError)
"""The database or the broker away: the batch fails and is read again from the saved
positions (a process's saved commands wait in its outbox). Anything else a command raises is
a bug in its handler: recorded (``raised``) with the event, and the reaction goes on."""

CONFLICT_PAUSE_S = 0.05


@dataclass(frozen=True)
class Outgoing:
    """A command to send, and the event that asked for it."""

    group: str
    """What orders it: a reaction's commands to one aggregate, a process's to one key, go in
    the order they were decided."""
    command: Command
    event_id: str
    index: int
    """The command's place among those its event asked for."""
    event_type: str
    stream_id: str
    correlation_id: str | None
    seq: int = 0
    """Its row in a process's outbox (``outbox.process_commands``)."""


@dataclass
class Answered:
    """What came of a round of sends."""

    sent: list[Outgoing] = field(default_factory=list)
    """Every command answered: executed, repeated (answered from the command log) or not."""
    refusals: list[Refusal] = field(default_factory=list)
    refused: list[tuple[Outgoing, str]] = field(default_factory=list)
    """The commands the domain refused, and why."""
    executed: int = 0
    repeated: int = 0


class CommandSender:
    """Sends commands for reaction ``name`` through ``bus``."""

    def __init__(self, name: str, bus: AsyncCommandBus) -> None:
        self.name = name
        self.bus = bus

    async def send(self, outgoing: Sequence[Outgoing]) -> Answered:
        """Send ``outgoing``: each group in order, groups concurrently. Raises one of
        ``UNAVAILABLE`` if the domain is away (what was answered until then is lost to the
        caller, which sends it again: the command log answers the repeats)."""
        groups: dict[str, list[Outgoing]] = defaultdict(list)
        for item in outgoing:
            groups[item.group].append(item)
        answered = Answered()
        await asyncio.gather(*(self._send_in_order(group, answered)
                               for group in groups.values()))
        return answered

    async def _send_in_order(self, group: Sequence[Outgoing], answered: Answered) -> None:
        for item in group:
            command = item.command
            try:
                result = await self._send(item)
            except UNAVAILABLE:
                raise
            except Exception as failed:
                kind: RefusalKind = "refused" if isinstance(failed, REFUSALS) else "raised"
                reason = f"{type(failed).__name__}: {failed}"
                answered.refusals.append(Refusal(item.event_id, item.index, kind,
                                                 item.event_type, item.stream_id, reason,
                                                 command.command_name, command.command_id))
                if kind == "refused":
                    answered.refused.append((item, reason))
                log.log(logging.INFO if kind == "refused" else logging.ERROR,
                        "reaction %s: %s for event %s %s: %s", self.name,
                        command.command_name, item.event_id,
                        "refused" if kind == "refused" else "raised in its handler", failed)
            else:
                answered.executed += 1
                answered.repeated += result.replayed
            answered.sent.append(item)

    async def _send(self, item: Outgoing) -> CommandResult:
        """Execute the command; a version conflict the bus gave up on is tried again (the
        aggregate is busy with other writers), unless the command states its version."""
        while True:
            try:
                return await self.bus.execute(
                    item.command, metadata={"reaction": self.name,
                                            "caused_by_event": item.event_id},
                    correlation_id=item.correlation_id)
            except ConcurrencyError:
                if item.command.expected_version is not None:
                    raise
                await asyncio.sleep(CONFLICT_PAUSE_S)
