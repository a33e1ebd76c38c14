"""The loop of a reaction: read a batch of its sources' events from its own positions, ask
the reaction for each event's commands, send them, record what the domain refused, and save
the positions only once every command of the batch was answered. A process manager's batch
goes the other way round (``process_steps``): its steps are saved first, their commands with
them, and sent after.

Exactly once in effect, not in delivery: a batch read again (the process died before its
positions were saved, or its partitions moved to another process of the reaction mid-batch)
sends the same commands with the same ids, and the command log answers each repeat with
the first result instead of executing it again. Commands to one aggregate are sent one
after the other, in the order of the events that asked for them (no two of a batch race for
its version); commands to different aggregates go concurrently (``sending``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from eventfold.contract import PartitionKey, libpq_url
from eventfold.contract.envelope import EventEnvelope, MalformedEvent
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consume_available, partition_ends
from eventfold.projections.definition.projection import Event
from eventfold.projections.faults import acting_as, crash_point
from eventfold.reactions.batch import ReactionBatch, ReactionCounts
from eventfold.reactions.definition import Declared, Effect, Reaction, topics_of, wants
from eventfold.reactions.effects import call_effects
from eventfold.reactions.operations import SourceIds, SourcesMadeAgain, group_of, place
from eventfold.reactions.parking import Parking, open_parking, save_parking
from eventfold.reactions.positions import (
    PositionsMoved,
    Refusal,
    load_positions,
    save_batch,
)
from eventfold.reactions.process import Process, StateConflict
from eventfold.reactions.process_steps import ProcessSteps
from eventfold.reactions.sending import UNAVAILABLE, CommandSender, Outgoing
from eventfold.write_model import AsyncCommandBus, Command

log = logging.getLogger(__name__)

REPORT_EVERY_S = 10.0


@dataclass(frozen=True)
class ReactionOptions:
    """A reaction runner's settings (``EVENTFOLD_REACTION_*``, docs/configuration.md)."""

    reaction_batch_max_events: int = 500
    reaction_retry_pause_s: float = 2.0
    reaction_session_timeout_s: float = 10.0
    reaction_max_poll_interval_s: float = 300.0
    process_timer_grace_s: float = 2.0


POLL_WAIT_S = 0.5
"""How long an idle runner waits for an event before it looks at its stop flag again."""


class ReactionRunner:
    """Runs one reaction until ``stopping`` is set. Several processes may run one reaction:
    the consumer group ``eventfold.reaction.<name>`` gives each its partitions. ``actor``
    names this runner to fault points (``faults.acting_as``)."""

    def __init__(self, reaction: Declared, bus: AsyncCommandBus, kafka: KafkaConnection,
                 database_url: str, options: ReactionOptions | None = None,
                 actor: str | None = None) -> None:
        if not isinstance(reaction, Reaction | Process | Effect):
            raise TypeError(f"{reaction.name}: a Reaction, a Process or an Effect, not a "
                            f"{type(reaction).__name__}")
        self.reaction = reaction
        self.bus = bus
        self.kafka = kafka
        self.database_url = database_url
        self.options = options or ReactionOptions()
        self.actor = actor or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.topics = topics_of(reaction)
        self._derived = frozenset(reaction.derived_topics)
        self.counts = ReactionCounts()
        self.sender = CommandSender(reaction.name, bus)
        self._conn: psycopg.Connection | None = None
        self.consumer: Consumer | None = None
        """The group member it reads with, while it runs."""
        self._sources = SourceIds(kafka, reaction)
        self._read_from: dict[PartitionKey, int] = {}
        """Where this runner's next batch reads each assigned partition from: the position
        saved when it was assigned, rewound or saved by this runner (0: none saved yet)."""
        self.steps = (ProcessSteps(reaction, self.sender, self._connection, self._command,
                                   self.counts, self.options.reaction_batch_max_events,
                                   self.options.reaction_session_timeout_s, self.topics,
                                   self.options.process_timer_grace_s)
                      if isinstance(reaction, Process) else None)

    @property
    def group(self) -> str:
        return group_of(self.reaction)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(libpq_url(self.database_url), autocommit=True)
        return self._conn

    def _command(self, name: str, fields: dict[str, Any]) -> Command:
        """A command a process saved, from its name and fields."""
        command: Command = self.bus.registry.get(name).command.model_validate(fields)
        return command

    async def run(self, stopping: threading.Event) -> ReactionCounts:
        """Read, react, send, save, until ``stopping`` is set; a failed batch (the broker or
        the database away) is read again from the saved positions after a pause."""
        acting_as(self.actor)
        name = self.reaction.name
        session_ms = int(self.options.reaction_session_timeout_s * 1000)
        consumer = self.consumer = Consumer(self.kafka.client_config(**{
            "group.id": self.group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "log.connection.close": False,
            "enable.partition.eof": True,
            # A runner killed without leaving the group holds its partitions until the
            # broker gives up on it: librdkafka's 45 s default would stall the reaction that
            # long after every SIGKILL.
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(session_ms // 5, 500),
            # A runner whose loop stopped (stuck, frozen) leaves the group after this.
            "max.poll.interval.ms": max(
                int(self.options.reaction_max_poll_interval_s * 1000), session_ms)}))
        try:
            place(self.kafka, self._connection(), self.reaction)
            consumer.subscribe(self.topics, on_assign=self._seek_to_positions)
            log.info("reaction %s: reading %s", name, ", ".join(self.topics))
            reported, reported_counts = time.monotonic(), dataclasses.replace(self.counts)
            while not stopping.is_set():
                try:
                    await self._one_batch(consumer)
                except SourcesMadeAgain as again:
                    log.warning("reaction %s: %s; reading it from its beginning", name, again)
                    place(self.kafka, self._connection(), self.reaction)
                    self._rewind(consumer)
                except (*UNAVAILABLE, StateConflict, PositionsMoved) as exc:
                    log.warning("reaction %s: batch failed (%s); reading it again in %.0f s",
                                name, str(exc).splitlines()[0], self.options.reaction_retry_pause_s)
                    self._drop_connection()
                    self._rewind(consumer)
                    await asyncio.sleep(self.options.reaction_retry_pause_s)
                if (time.monotonic() - reported >= REPORT_EVERY_S
                        and self.counts != reported_counts):
                    reported, reported_counts = time.monotonic(), dataclasses.replace(self.counts)
                    self._report()
        finally:
            # The consumer holds ``on_assign`` (bound to this runner) where the collector
            # cannot see it: a runner still pointing back would keep both, and the clients
            # it owns, alive for the life of a process that runs runners one after another.
            self.consumer = None
            consumer.close()
            self._drop_connection()
        self._report()
        return self.counts

    def _report_parking(self, parking: Parking, retried: int) -> None:
        name = self.reaction.name
        for key, (event_id, reason) in parking.newly.items():
            log.warning("reaction %s: key %r parked at event %s (%s); its later events are "
                        "held until `eventfold dlq retry %s %s`", name, key, event_id, reason,
                        name, key)
        if parking.retried:
            log.info("reaction %s: retried %d held events of %s; %s", name, retried,
                     ", ".join(map(repr, parking.retried)),
                     "parked again: " + ", ".join(map(repr, parking.newly))
                     if set(parking.newly) & set(parking.retried) else "released")

    def _report(self) -> None:
        c = self.counts
        log.info("reaction %s: %d events, %d timers, %d commands sent (%d answered from the "
                 "command log as already executed), %d refused, %d batches",
                 self.reaction.name, c.events, c.timers, c.sent, c.repeated, c.refused,
                 c.batches)

    def _seek_to_positions(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """On assignment: each partition from the reaction's saved position (a partition
        created after the reaction started, from its beginning)."""
        starts = self._saved_starts(partitions)
        consumer.assign(starts)
        log.info("reaction %s: assigned %s", self.reaction.name, ", ".join(
            f"{tp.topic}[{tp.partition}] from {self._read_from[(tp.topic, tp.partition)]}"
            for tp in starts) or "no partition")

    def _rewind(self, consumer: Consumer) -> None:
        """After a failed batch: every assigned partition back to its saved position."""
        try:
            for start in self._saved_starts(consumer.assignment()):
                consumer.seek(start)
        except (psycopg.Error, KafkaException) as exc:
            # Still away: the next batch fails the same way and rewinds again.
            log.debug("reaction %s: rewinding: %s", self.reaction.name, exc)
            self._drop_connection()

    def _saved_starts(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """``partitions`` at the reaction's saved positions (at their beginning where none
        is saved), which the next batch reads from."""
        saved = load_positions(self._connection(), self.reaction.name)
        starts = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._read_from[key] = saved.get(key, 0)
            starts.append(TopicPartition(tp.topic, tp.partition, saved.get(key, OFFSET_BEGINNING)))
        return starts

    async def _one_batch(self, consumer: Consumer) -> None:
        messages = await asyncio.to_thread(consume_available, consumer,
                                           self.options.reaction_batch_max_events,
                                           POLL_WAIT_S)
        if self.steps is not None:
            await self.steps.send_leftovers()
        await self._handle(messages)
        if self.steps is not None:
            # After the batch: a timer fires only once the events recorded before it are
            # stepped, and this batch may hold some.
            await self.steps.fire_due_timers(lambda: partition_ends(consumer))

    async def _handle(self, messages: Sequence[Message]) -> None:
        """The batch's events (and a parked key's held ones, when asked again) acted on and
        saved with their positions."""
        parking, retried = open_parking(self._connection(), self.reaction.name)
        if not messages and not parking.retried:
            return
        batch = self._read(messages)
        if not batch.positions and not parking.retried:
            return
        if batch.events:
            crash_point("reaction.read")
        # Positions read from a topic made again since they were saved count another topic.
        self._sources.check(self._connection())
        batch.parking = parking
        batch.events[:0] = [(event, correlation_id) for _, event, correlation_id in retried]
        if self.steps is not None:
            await self.steps.step_batch(batch, self._read_from)
        else:
            await self._act_and_save(batch)
        for key, offset in batch.positions.items():
            self._read_from[key] = max(self._read_from.get(key, 0), offset)
        self._report_parking(batch.parking, len(retried))
        self.counts.events += len(batch.events)
        self.counts.refused += len(batch.refusals)
        self.counts.batches += bool(batch.events)

    async def _act_and_save(self, batch: ReactionBatch) -> None:
        """A reaction's commands (or an effect's calls), sent before the batch's positions
        are saved: a batch read again sends them again, with the same ids."""
        if isinstance(self.reaction, Reaction):
            self._react(self.reaction, batch)
        elif isinstance(self.reaction, Effect):
            await call_effects(self.reaction, batch, self.counts)
        answered = await self.sender.send(batch.outgoing)
        self.counts.answered(answered)
        if batch.outgoing or batch.called:
            crash_point("reaction.sent")
        if answered.repeated:
            log.info("reaction %s: %d commands of a batch of %d events had been executed "
                     "already (the batch was read again): answered from the command log",
                     self.reaction.name, answered.repeated, len(batch.events))
        conn = self._connection()
        with conn.transaction():
            save_batch(conn, self.reaction.name, batch.positions,
                       [*batch.refusals, *answered.refusals], self._read_from)
            save_parking(conn, self.reaction.name, batch.parking)

    def _read(self, messages: Sequence[Message]) -> ReactionBatch:
        """The batch's events, decoded, and the positions past them."""
        batch = ReactionBatch()
        for message in messages:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if (error := message.error()) is not None:
                if error.code() == KafkaError._PARTITION_EOF and topic is not None:
                    # The partition's end, past any transaction marker after the last event:
                    # saved, so that a reaction that has acted on everything shows no lag.
                    key = (topic, partition or 0)
                    batch.positions[key] = max(batch.positions.get(key, 0), offset or 0)
                elif error.fatal():
                    raise KafkaException(error)
                continue
            assert topic is not None and partition is not None and offset is not None
            batch.positions[(topic, partition)] = offset + 1
            decode = (EventEnvelope.decode_derived if topic in self._derived
                      else EventEnvelope.decode)
            try:
                envelope = decode(message.key(), message.value())
            except MalformedEvent as exc:
                batch.refusals.append(Refusal(f"{topic}:{partition}:{offset}", -1,
                                              "undecodable", "", "", str(exc)))
                continue
            batch.read((topic, partition), envelope.recorded_at)
            if not wants(self.reaction, envelope.event_type):
                continue
            batch.events.append((Event(
                envelope.event_type, envelope.data, envelope.stream_id,
                envelope.stream_version, envelope.event_id, envelope.global_position,
                envelope.recorded_at, schema_version=envelope.schema_version),
                envelope.correlation_id))
        return batch

    @staticmethod
    def _react(reaction: Reaction, batch: ReactionBatch) -> None:
        """Each event's commands, grouped by the aggregate they go to."""
        for event, correlation_id in batch.events:
            if batch.parking.holds(event.stream_id, event, correlation_id):
                continue
            try:
                commands = reaction.commands_for(event)
            except Exception as exc:  # the user's function: recorded, its key parked
                batch.raised(event, exc, parks=(event.stream_id, correlation_id))
                continue
            for index, command in enumerate(commands):
                batch.outgoing.append(Outgoing(command.stream_id(), command, event.event_id,
                                               index, event.type, event.stream_id,
                                               correlation_id))

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
