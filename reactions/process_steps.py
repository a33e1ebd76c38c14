"""A process manager's steps on its runner: each key's events and due timers through its
process, the steps saved, then their commands sent.

Per batch (``step_batch``): the keys' states are loaded, each event stepped in order; then one
transaction saves the runner's positions, the refusals, the parked keys, the states and
timers, and the commands the steps decided (``outbox``); only then are the commands sent. A
due timer (``fire_due_timers``) is stepped and saved the same way, under a lock on its row
that another runner skips; a timer whose step raises parks its key, holding the timer, and a
parked key's timers wait (its held events come first). A timer is due by the process's
stream time: each batch saves, per partition, the recorded time it stepped through, and a
partition found stepped to its end is stepped through the time it was looked at; a timer
fires once every partition of the process is a grace past its due time, so a runner behind
its events steps those recorded before a timer first. A command the domain refuses comes
back to its key as a ``command_refused`` event, stepped and saved the same way (a command
that such a step sends and that is refused again is only recorded).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import psycopg

from eventfold.contract import PartitionKey
from eventfold.projections.definition.projection import Event
from eventfold.projections.faults import crash_point
from eventfold.reactions.batch import ReactionBatch, ReactionCounts
from eventfold.reactions.outbox import (
    DecodeCommand,
    commands_answered,
    leftover_commands,
    save_commands,
)
from eventfold.reactions.parking import save_parking
from eventfold.reactions.positions import save_at_end, save_batch, save_stepped_through
from eventfold.reactions.process import (
    REFUSAL_EVENT_PREFIX,
    KeyStates,
    Process,
    database_now,
    due_by_the_clock,
    load_states,
    recorded_time,
    refusal_event,
    save_fired,
    save_states,
    take_due_timers,
    timer_event,
)
from eventfold.reactions.sending import CommandSender, Outgoing

log = logging.getLogger(__name__)


class ProcessSteps:
    """Steps ``process`` on its runner's connection (``connection``), sending through
    ``sender``."""

    def __init__(self, process: Process, sender: CommandSender,
                 connection: Callable[[], psycopg.Connection], decode: DecodeCommand,
                 counts: ReactionCounts, batch_max_events: int,
                 leftover_after_s: float, sources: Sequence[str], timer_grace_s: float
                 ) -> None:
        self.process = process
        self.sender = sender
        self.connection = connection
        self.decode = decode
        self.counts = counts
        self.batch_max_events = batch_max_events
        self.leftover_after_s = leftover_after_s
        """How old a saved command must be for this runner to send it as left behind: longer
        than a runner takes to send its own."""
        self.sources = list(sources)
        self.timer_grace_s = timer_grace_s
        """How long past its due time a timer waits for events recorded before it to reach
        Kafka (``EVENTFOLD_PROCESS_TIMER_GRACE_S``)."""
        self._started = False

    async def send_leftovers(self) -> None:
        """Send the commands runners saved and did not get answered (they died, or the
        domain was away): at a runner's start all of them, then those older than a runner
        takes to send its own."""
        conn = self.connection()
        with conn.transaction():
            left = leftover_commands(conn, self.process.name,
                                     self.leftover_after_s if self._started else 0.0,
                                     self.batch_max_events, self.decode)
        self._started = True
        if left:
            repeated = self.counts.repeated
            await self._send(left)
            log.info("process %s: %d saved command(s) left unsent were sent (%d answered "
                     "from the command log as already executed)", self.process.name,
                     len(left), self.counts.repeated - repeated)

    async def step_batch(self, batch: ReactionBatch,
                         read_from: dict[PartitionKey, int]) -> None:
        """Step the batch's events, save everything, then send the commands."""
        conn = self.connection()
        states = self._step_events(conn, batch)
        with conn.transaction():
            save_batch(conn, self.process.name, batch.positions, batch.refusals, read_from)
            save_parking(conn, self.process.name, batch.parking)
            save_states(conn, self.process.name, states)
            save_stepped_through(conn, self.process.name, batch.recorded_through)
            pending = save_commands(conn, self.process.name, batch.outgoing)
        crash_point("process.saved")
        await self._send(pending)

    def _step_events(self, conn: psycopg.Connection, batch: ReactionBatch) -> KeyStates:
        """Each key's events through its process, one after the other."""
        process = self.process
        keyed: list[tuple[str, Event, str | None]] = []
        for event, correlation_id in batch.events:
            try:
                keyed.append((process.key_of(event), event, correlation_id))
            except KeyError as exc:
                batch.raised(event, exc)
        states = load_states(conn, process.name, sorted({k for k, _, _ in keyed}))
        now = database_now(conn)
        for key, event, correlation_id in keyed:
            if batch.parking.holds(key, event, correlation_id):
                continue
            at = recorded_time(event.recorded_at) or now
            self._step(states, batch, key, event, correlation_id, at)
        return states

    def _step(self, states: KeyStates, batch: ReactionBatch, key: str, event: Event,
              correlation_id: str | None, at: datetime) -> None:
        try:
            commands = self.process.step(states.context(key, at), event)
        except Exception as exc:  # the user's function: recorded, its key parked
            batch.raised(event, exc, parks=(key, correlation_id))
            return
        batch.asked(key, event, commands, correlation_id)

    async def fire_due_timers(self, partition_ends: Callable[[], Mapping[PartitionKey, int]]
                              ) -> None:
        """Every due timer of keys not parked, stepped as an event of its key at its due
        time, and saved with its key's state, under a lock on its row (a runner beside this
        one skips it); then its commands are sent. ``partition_ends`` asks the broker where
        this runner's partitions end now: with a timer due by the clock, the partitions
        whose saved positions are there are stepped through the time it was asked."""
        conn = self.connection()
        name = self.process.name
        if not due_by_the_clock(conn, name, self.timer_grace_s):
            return
        observed_at = database_now(conn)
        save_at_end(conn, name, await asyncio.to_thread(partition_ends), observed_at)
        with conn.transaction():
            due = take_due_timers(conn, name, self.batch_max_events, self.sources,
                                  self.timer_grace_s)
            if not due:
                return
            states = load_states(conn, name, sorted({t.key for t in due}))
            batch = ReactionBatch()
            for timer in due:
                event = timer_event(timer.key, timer.name, timer.at)
                if not batch.parking.holds(timer.key, event, None):
                    self._step(states, batch, timer.key, event, None, timer.at)
            save_batch(conn, name, {}, batch.refusals, {})
            save_parking(conn, name, batch.parking)
            save_fired(conn, name, states, due)
            pending = save_commands(conn, name, batch.outgoing)
        crash_point("timer.saved")
        self.counts.timers += len(due)
        log.info("process %s: %d timer(s) fired, %d command(s) to send", name, len(due),
                 len(pending))
        await self._send(pending)

    async def _send(self, pending: Sequence[Outgoing]) -> None:
        """Send saved commands; then, in one transaction, drop them from the outbox, record
        what was refused, and step each refusal as an event of its key."""
        if not pending:
            return
        answered = await self.sender.send(pending)
        crash_point("process.sending")
        self.counts.answered(answered)
        conn, name = self.connection(), self.process.name
        with conn.transaction():
            commands_answered(conn, name, answered.sent)
            batch = ReactionBatch(refusals=answered.refusals)
            refused = [(item, reason) for item, reason in answered.refused
                       if not item.event_id.startswith(REFUSAL_EVENT_PREFIX)]
            states = load_states(conn, name, sorted({item.group for item, _ in refused}))
            now = database_now(conn)
            for item, reason in refused:
                assert item.command.command_id is not None  # every step's command has one
                event = refusal_event(item.group, item.command.command_name,
                                      item.command.command_id, reason, item.event_id, now)
                self._step(states, batch, item.group, event, item.correlation_id, now)
            save_batch(conn, name, {}, batch.refusals, {})
            save_parking(conn, name, batch.parking)
            save_states(conn, name, states)
            more = save_commands(conn, name, batch.outgoing)
        await self._send(more)
