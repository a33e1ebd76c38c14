"""A run stops rather than fold past events it never read: the source topics' retention
deleted them (``SourceDataLost``), unless the app allows the loss; or a source topic was
deleted and made again under the projection (``SourceTopicRecreated``), whose offsets began
again at 0 while the checkpoint counts those of the topic that is gone."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping

import psycopg

from eventfold.contract import PartitionKey, libpq_url
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.outbox.topics import TopicAdmin
from eventfold.projections.definition.projection import Projection
from eventfold.projections.execution.store_source import STORE_PARTITION
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.state.source_ids import (
    made_again,
    projection_reader,
    record_ids,
    recorded_ids,
)

log = logging.getLogger(__name__)

BEHIND_GRACE_S = 10.0
"""How long a source partition may end before the checkpoint before the run stops: a new
partition leader's high watermark can trail the old one's for a moment."""


class SourceDataLost(RuntimeError):
    """Retention deleted source events a projection had not read yet."""


class SourceTopicRecreated(SourceDataLost):
    """A source topic was deleted (and made again): folding on from the checkpoint would skip
    as many of the new topic's events as the checkpoint counted of the old one's."""


class SourceTopics:
    """The ids of a projection's source topics as this run first saw them; ``check`` raises
    SourceTopicRecreated once one has another, or is gone though it was read from. Asked
    before each batch that has records to fold, so that no batch reads a topic made again
    since the run started. A topic first seen has its id recorded for the version
    (``source_ids``) before any batch reads it, so the runs after this one check it too."""

    def __init__(self, projection: Projection, version: int, settings: RunnerSettings,
                 read_from: Collection[str] = ()) -> None:
        self._projection, self._version = projection, version
        self._database_url = settings.database_url
        self._admin = TopicAdmin(settings.kafka, timeout_s=10)
        self._ids: dict[str, str] = {}
        self._read_from = frozenset(read_from)
        self.check()

    def check(self) -> None:
        first_seen: dict[str, str] = {}
        for topic, shape in self._admin.describe_all(self._projection.source_topics).items():
            if shape is None:
                if topic in self._ids or topic in self._read_from:
                    raise _recreated(self._projection, self._version,
                                     f"{topic}, which it has read from, was deleted")
                continue  # not created yet
            if topic not in self._ids:
                first_seen[topic] = self._ids[topic] = shape.topic_id
            if self._ids[topic] != shape.topic_id:
                raise _recreated(self._projection, self._version,
                                 f"{topic} was deleted and made again (id {shape.topic_id}, "
                                 f"not {self._ids[topic]} as when this run started)")
        if first_seen:
            self._record(first_seen)

    def _record(self, ids: Mapping[str, str]) -> None:
        """Check ``ids`` against those the version's offsets were read from, and record them."""
        reader = projection_reader(self._projection.name, self._version)
        with psycopg.connect(libpq_url(self._database_url)) as conn:
            replaced = {topic: was for topic, was in made_again(recorded_ids(conn, reader),
                                                                 ids).items()
                        if topic in self._read_from}
            if replaced:
                raise _recreated(self._projection, self._version, "; ".join(
                    f"{topic} was deleted and made again while no run was up (id {now}, not "
                    f"{old} as when the checkpoint's offsets were read)"
                    for topic, (old, now) in sorted(replaced.items())))
            record_ids(conn, reader, ids)


def check_sources(projection: Projection, version: int, settings: RunnerSettings,
                  committed: Mapping[PartitionKey, int]) -> SourceTopics:
    """At a run's start: stop if a source partition no longer holds events this version has
    not read (retention deleted them, and folding on would silently leave them out), or ends
    before what it has read (the topic was made again while it was stopped). A version that
    folded the event store first read them from there. The source topics' ids, to watch."""
    sources = SourceTopics(projection, version, settings, read_from={
        topic for (topic, partition), offset in committed.items()
        if offset > 0 and (topic, partition) != STORE_PARTITION})
    if STORE_PARTITION in committed:
        return sources
    planner = OffsetPlanner(settings.kafka)
    try:
        partitions = planner.partitions(projection.source_topics)
        beginning = planner.beginning_offsets(partitions)
        deadline = time.monotonic() + BEHIND_GRACE_S
        while (behind := ends_behind(committed, planner.end_offsets(partitions))) and (
                time.monotonic() < deadline):
            time.sleep(1.0)
    finally:
        planner.close()
    if behind:
        raise _recreated(projection, version, "the topic was deleted and made again: " + ", ".join(
            f"{t}[{p}] ends at offset {end:,}, before offset {read:,} that it had read up to"
            for (t, p), (read, end) in sorted(behind.items())))
    _check_retained(projection, version, settings, committed, beginning)
    return sources


def ends_behind(committed: Mapping[PartitionKey, int], ends: Mapping[PartitionKey, int]
                ) -> dict[PartitionKey, tuple[int, int]]:
    """The partitions that end before the offset the checkpoint has read up to: (read, end)."""
    return {key: (committed[key], end) for key, end in ends.items()
            if committed.get(key, 0) > end}


def _check_retained(projection: Projection, version: int, settings: RunnerSettings,
                    committed: Mapping[PartitionKey, int],
                    beginning: Mapping[PartitionKey, int]) -> None:
    lost = {key: (committed.get(key, 0), first) for key, first in beginning.items()
            if first > committed.get(key, 0)}
    if not lost:
        return
    events = sum(first - read for read, first in lost.values())
    where = ", ".join(f"{t}[{p}] offsets {read:,}-{first - 1:,}"
                      for (t, p), (read, first) in sorted(lost.items()))
    message = (f"projection {projection.name} v{version}: {events:,} events it never read "
               f"were deleted by the topics' retention ({where}). {_rebuild(projection)}")
    if not settings.allow_data_loss:
        raise SourceDataLost(message + "; or set EVENTFOLD_ALLOW_DATA_LOSS=true to go on "
                             "without them")
    log.warning("%s. Going on without them (EVENTFOLD_ALLOW_DATA_LOSS)", message)


def _recreated(projection: Projection, version: int, what: str) -> SourceTopicRecreated:
    return SourceTopicRecreated(
        f"projection {projection.name} v{version}: {what}. Its checkpoint counts offsets of "
        "the topic as it was, and a topic made again begins at offset 0, so it stops rather "
        f"than skip events. {_rebuild(projection)}")


def _rebuild(projection: Projection) -> str:
    return ("Rebuild it from the event store, which keeps every event: `eventfold projection "
            f"replay {projection.name} --from store`")
