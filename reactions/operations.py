"""What operators do with a reaction: see where it is (its lag, what was refused), and move
it on purpose (``reset``), saying how many events it will act on again."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import psycopg
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from eventfold.contract import PartitionKey, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner, consumer_config, iter_range
from eventfold.outbox.topics import TopicAdmin
from eventfold.projections.state.source_ids import (
    current_ids,
    made_again,
    reaction_reader,
    recorded_ids,
)
from eventfold.reactions.definition import Declared, topics_of
from eventfold.reactions.parking import parked_count
from eventfold.reactions.positions import load_positions, move_to, refusal_count
from eventfold.reactions.process import Process, clear_process, process_counts

ResetTo = Literal["beginning", "end"] | datetime

log = logging.getLogger(__name__)


def group_of(reaction: Declared) -> str:
    """The consumer group that shares a reaction's partitions among its runners."""
    return f"eventfold.reaction.{reaction.name}"


@dataclass(frozen=True)
class ReactionReport:
    name: str
    started: bool
    lag: int
    """Events in its sources' topics past its positions."""
    refused: int
    partitions: dict[PartitionKey, tuple[int, int]]
    """Per partition: its position, and the partition's end."""
    processes: tuple[int, int] | None = None
    """A process manager's running keys and pending timers."""
    parked: int = 0
    """Keys holding their events back behind one it raised on (``eventfold dlq retry``)."""


def source_ends(kafka: KafkaConnection, reaction: Declared,
                at: datetime | None = None) -> dict[PartitionKey, tuple[int, int, int]]:
    """Each source partition's first offset, next offset, and (with ``at``) its first offset
    at or after that time (else its first)."""
    planner = OffsetPlanner(kafka)
    try:
        partitions = planner.partitions(topics_of(reaction))
        first, end = planner.beginning_offsets(partitions), planner.end_offsets(partitions)
        since = (planner.offsets_at(partitions, int(at.timestamp() * 1000)) if at is not None
                 else first)
    finally:
        planner.close()
    return {tp: (first[tp], end[tp], since[tp]) for tp in partitions}


def place(kafka: KafkaConnection, conn: psycopg.Connection, reaction: Declared) -> None:
    """Where a runner starts, saved before it reads anything. A reaction that never ran:
    where it says (``Reaction.start``), so that a crash before its first batch cannot move
    its start. A source topic deleted and made again while no runner was up: from its
    beginning, as librdkafka resets a runner that is up (the saved positions count the old
    topic's offsets, and would skip as many events of the new one; the command log answers
    the commands of events acted on before with their first results)."""
    ids = current_ids(TopicAdmin(kafka), topics_of(reaction))
    if load_positions(conn, reaction.name):
        replaced = made_again(recorded_ids(conn, reaction_reader(reaction.name)), ids)
        beginnings = {tp: low for tp, (low, _, _) in source_ends(kafka, reaction).items()
                      if tp[0] in replaced} if replaced else {}
        move_to(conn, reaction.name, beginnings, ids)
        for topic, (old, now) in sorted(replaced.items()):
            log.warning("reaction %s: %s was deleted and made again while no runner was up "
                        "(id %s, not %s); reading it from its beginning", reaction.name,
                        topic, now, old)
        return
    ends = source_ends(kafka, reaction)
    if not ends:
        raise RuntimeError(f"reaction {reaction.name}: its topics "
                           f"({', '.join(topics_of(reaction))}) do not exist yet; `eventfold "
                           "setup` creates them")
    latest = reaction.start == "latest"
    move_to(conn, reaction.name,
            {tp: high if latest else low for tp, (low, high, _) in ends.items()}, ids)
    log.info("reaction %s: first run, acting on events from the %s on", reaction.name,
             "end" if latest else "beginning")


class SourcesMadeAgain(RuntimeError):
    """A source topic was deleted and made again since the reaction's positions were saved:
    they count the topic that is gone."""


class SourceIds:
    """The ids of a reaction's source topics as its saved positions count them: ``check``,
    before a batch's positions are saved, raises ``SourcesMadeAgain`` once a topic has
    another (``place`` then moves the positions to its beginning and records its id)."""

    def __init__(self, kafka: KafkaConnection, reaction: Declared) -> None:
        self._admin = TopicAdmin(kafka, timeout_s=10)
        self._reaction = reaction

    def check(self, conn: psycopg.Connection) -> None:
        recorded = recorded_ids(conn, reaction_reader(self._reaction.name))
        again = made_again(recorded, current_ids(self._admin, topics_of(self._reaction)))
        if again:
            raise SourcesMadeAgain(", ".join(
                f"{topic} was deleted and made again (id {now}, not {was})"
                for topic, (was, now) in sorted(again.items())))


def report(kafka: KafkaConnection, database_url: str, reaction: Declared) -> ReactionReport:
    with psycopg.connect(libpq_url(database_url)) as conn:
        positions = load_positions(conn, reaction.name)
        refused = refusal_count(conn, reaction.name)
        parked = parked_count(conn, [reaction.name]).get(reaction.name, 0)
        processes = (process_counts(conn, reaction.name) if isinstance(reaction, Process)
                     else None)
    ends = source_ends(kafka, reaction)
    partitions = {tp: (positions.get(tp, low), high) for tp, (low, high, _) in ends.items()}
    return ReactionReport(reaction.name, bool(positions),
                          sum(max(high - at, 0) for at, high in partitions.values()), refused,
                          partitions, processes, parked)


class ReactionRunning(RuntimeError):
    """A reset asked for while runners of the reaction are alive."""


def running_members(kafka: KafkaConnection, reaction: Declared) -> int:
    """How many consumers of the reaction's group are alive now."""
    admin = AdminClient(kafka.client_config())
    futures = admin.describe_consumer_groups([group_of(reaction)], request_timeout=10)
    description = futures[group_of(reaction)].result()
    return len(description.members)


class BeyondCommandRetention(RuntimeError):
    """A reset that would act again on events older than the command log keeps ids: their
    commands, no longer known there, would execute a second time."""


def reset(kafka: KafkaConnection, database_url: str, reaction: Declared, to: ResetTo,
          command_id_retention_s: float, dry_run: bool = False, force: bool = False) -> int:
    """Move the reaction's positions to ``to`` (the beginning, the end, or each partition's
    first event at or after a time); how many events it will act on again (negative: how
    many it will skip). Refused while a runner of it is alive (``ReactionRunning``: it would
    save its own positions over these), and, unless ``force``, when the oldest event it would
    act on again is older than the command log keeps ids (``BeyondCommandRetention``)."""
    if (alive := running_members(kafka, reaction)) and not dry_run:
        raise ReactionRunning(f"reaction {reaction.name} has {alive} runner(s) alive: stop "
                              "them first (their positions would overwrite the reset)")
    ends = source_ends(kafka, reaction, to if isinstance(to, datetime) else None)
    target = {tp: low if to == "beginning" else high if to == "end" else since
              for tp, (low, high, since) in ends.items()}
    with psycopg.connect(libpq_url(database_url)) as conn:
        positions = load_positions(conn, reaction.name)
        now = {tp: positions.get(tp, low) for tp, (low, _, _) in ends.items()}
        back = {tp: (target[tp], now[tp]) for tp in target}
        again = (_events_between(kafka, back)
                 - _events_between(kafka, {tp: (now[tp], target[tp]) for tp in target}))
        oldest_ms = _oldest_timestamp_ms(kafka, back)
        if (not force and oldest_ms is not None
                and oldest_ms < (time.time() - command_id_retention_s) * 1000):
            raise BeyondCommandRetention(
                f"reaction {reaction.name} would act again on events from "
                f"{datetime.fromtimestamp(oldest_ms / 1000, UTC):%Y-%m-%d %H:%M} UTC, older "
                f"than the command log keeps command ids ({_span(command_id_retention_s)}, "
                "EVENTFOLD_COMMAND_ID_RETENTION): the commands of those events would execute "
                "again. --force to do it anyway")
        if not dry_run:
            with conn.transaction():
                move_to(conn, reaction.name, target,
                        current_ids(TopicAdmin(kafka), topics_of(reaction)))
                if to == "beginning" and isinstance(reaction, Process):
                    # Every event is stepped again, so from no state: stepped again on the
                    # states they made, they would act twice (a timer scheduled again).
                    states, timers = clear_process(conn, reaction.name)
                    log.info("process %s: %d state(s) and %d timer(s) cleared for the reset",
                             reaction.name, states, timers)
    return again


def _span(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _oldest_timestamp_ms(kafka: KafkaConnection,
                         ranges: dict[PartitionKey, tuple[int, int]]) -> int | None:
    """The broker's timestamp of the first event of each range, the oldest of them."""
    consumer = Consumer(consumer_config(kafka))
    try:
        firsts = [next(iter_range(consumer, tp, start, end))[0].timestamp()[1]
                  for tp, (start, end) in ranges.items() if end > start]
    finally:
        consumer.close()
    return min(firsts, default=None)


def _events_between(kafka: KafkaConnection, ranges: dict[PartitionKey, tuple[int, int]]
                    ) -> int:
    """The events in each partition's offsets [start, end), counted by reading them: offsets
    also number transaction markers, which are no events."""
    consumer = Consumer(consumer_config(kafka))
    try:
        return sum(len(chunk) for tp, (start, end) in ranges.items() if end > start
                   for chunk in iter_range(consumer, tp, start, end))
    finally:
        consumer.close()
