"""Replay a projection from the beginning into a new version, with no read downtime.

1. Build version N+1 from the beginning up to the live version's committed offsets, while the
   live version keeps serving (and folding) as before. Progress: events/s and ETA. The
   beginning is offset 0 of the topics, or, when their retention dropped the head (or
   ``source="store"``), the event store in Postgres up to its newest event, then the topics
   from their first retained offset (``store_source``).
2. Take the registry row (the live version's next commit waits), catch the new version up to
   the live one's offsets exactly, then in the same transaction point the view at it, make it
   active and drop the old tables. The old KTable topic is deleted afterwards.

A live runner whose next commit finds another version active stops with ``VersionSwitched``;
``eventfold projection run`` restarts on the new version. Derived events are not emitted again:
a building version stays behind the live one, which emitted them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import SparkSession
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

from eventfold.contract import PartitionKey
from eventfold.outbox.history import count_events, head_position
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.outbox.topics import TopicAdmin
from eventfold.projections import metrics
from eventfold.projections.definition.projection import Projection
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from eventfold.projections.state.catalog import ProjectionCatalog, written_in_flight
from eventfold.projections.state.stage import StagedBatch
from eventfold.projections.state.store import ReadModelStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayResult:
    projection: str
    old_version: int
    new_version: int
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / max(self.seconds, 1e-9)


class ReplayProgress:
    """Progress of work with a known total (a replay, a catch-up): a live bar with events/s
    and ETA on a terminal, else one log line every ``log_every_s`` and one at the end."""

    def __init__(self, name: str, total: int, what: str = "replay",
                 terminal: bool | None = None, log_every_s: float = 5.0,
                 listener: ProgressListener | None = None) -> None:
        self.name, self.total, self.what = name, max(total, 1), what
        self.done = 0
        self._listener = listener
        self.started = time.monotonic()
        self._log_every_s = log_every_s
        self._logged_at = float("-inf")
        self._bar: RichProgress | None = None
        if sys.stderr.isatty() if terminal is None else terminal:
            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                MofNCompleteColumn(), TextColumn("events"),
                TextColumn("{task.fields[rate]} events/s"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task(f"{what} {name}", total=self.total, rate="-")
            self._bar.start()

    def add(self, batch_id: int, records: int, batch: StagedBatch,
            phases: Mapping[str, float]) -> None:
        self.advance_to(self.done + records)

    def advance_to(self, done: int) -> None:
        self.done = done
        metrics.replay_progress(self.name, self.done, self.total)
        if self._listener is not None:
            self._listener(self.done, self.total)
        rate = self.done / max(time.monotonic() - self.started, 1e-9)
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.done, self.total),
                             rate=f"{rate:,.0f}")
            return
        if time.monotonic() - self._logged_at < self._log_every_s and self.done < self.total:
            return
        self._logged_at = time.monotonic()
        share = min(self.done / self.total, 1.0)
        eta = max(self.total - self.done, 0) / rate if rate else 0
        log.info("%s %s: %3.0f%%, %s of %s events, %s events/s, ETA %.0f s", self.what,
                 self.name, share * 100, f"{self.done:,}", f"{self.total:,}", f"{rate:,.0f}",
                 eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


ReplaySource = Literal["auto", "kafka", "store"]
ProgressListener = Callable[[int, int], None]
"""Told (done, total) after each committed batch; what it raises stops the replay there (an
interrupted replay resumes from that batch when started again)."""


def replay(spark: SparkSession, projection: Projection, settings: RunnerSettings,
           source: ReplaySource = "auto",
           listener: ProgressListener | None = None) -> ReplayResult:
    """``listener``: progress for someone else than this process's terminal (a host reports
    a replay handed to it), which also leaves the terminal's live bar out."""
    started = time.monotonic()
    versions = ProjectionCatalog(settings.database_url)
    old = versions.register(projection.name)
    new = versions.begin_build(projection.name)
    live = ReadModelStore(settings.database_url, projection, old)
    progress = None
    try:
        plan = _plan(live, settings, projection, source)
        log.info("replay %s: building v%d beside live v%d, from %s", projection.name, new, old,
                 plan)
        progress = ReplayProgress(projection.name, plan.events,
                                  terminal=False if listener else None, listener=listener)
        builder = ProjectionRunner(spark, projection, settings, version=new, progress=progress)
        if plan.store_head:
            builder.fold_store_up_to(plan.store_head)
        bound = _caught_up_to_a_short_tail(builder, live, settings, projection, plan.bound)
        with versions.locked(projection.name) as conn:
            # The live version's batch under way wrote its KTable records already: the new
            # version folds them too, so that no reader of its topic sees less.
            in_flight = written_in_flight(conn, projection.name, old, IN_FLIGHT_WAIT_S)
            final = _bound(live.committed_offsets(), settings, projection,
                           at_least=_bound(in_flight, settings, projection, at_least=bound))
            builder.yields_to_live = False  # the live commits wait for this tail, not beside it
            builder.fold_topics_up_to(final)
            builder.store.publish_view(conn)
            versions.activate(conn, projection.name, new, builder.store.committed_offsets())
            live.drop(conn)
            if old != new:
                versions.retire_topic(conn, projection.name, old,
                                      projection.ktable_topic_for(old))
        builder.close()
        log.info("replay %s: v%d active; waiting up to %.0f s for read APIs to move off the "
                 "v%d KTable topic before deleting it", projection.name, new,
                 settings.ktable_retire_wait_s, old)
        versions.delete_retired_topics(TopicAdmin(settings.kafka).delete,
                                       settings.ktable_retire_wait_s)
    finally:
        if progress is not None:
            progress.close()
        live.close()
        versions.close()
    seconds = time.monotonic() - started
    log.info("replay %s: v%d active in %.1f s (%s events/s); v%d dropped", projection.name, new,
             seconds, f"{progress.done / seconds:,.0f}", old)
    return ReplayResult(projection.name, old, new, progress.done, seconds)


IN_FLIGHT_WAIT_S = 60.0
"""How long a switch waits for the live version's batch under way to finish its tasks."""
CATCH_UP_TAIL = 20_000
"""Events of the live version's lead a replay may fold while it holds the registry row (the
live version's commits wait meanwhile): the build catches up without it until its gap is at
most this, as online schema-change tools cut over."""


def _caught_up_to_a_short_tail(builder: ProjectionRunner, live: ReadModelStore,
                               settings: RunnerSettings, projection: Projection,
                               bound: dict[PartitionKey, int]) -> dict[PartitionKey, int]:
    """Fold up to ``bound``, then after the live version again and again while it moves on,
    until what it leads by is a short tail; the offsets the build reached."""
    while True:
        builder.fold_topics_up_to(bound)
        live_now = _bound(live.committed_offsets(), settings, projection, at_least=bound)
        gap = sum(offset - bound.get(key, 0) for key, offset in live_now.items())
        if gap <= CATCH_UP_TAIL:
            return bound
        log.info("replay %s: the live version moved %s events on during the build; catching "
                 "up with it before the switch", projection.name, f"{gap:,}")
        bound = live_now


@dataclass(frozen=True)
class ReplayPlan:
    bound: dict[PartitionKey, int]
    """The live version's offsets: where the build catches up before the switch."""
    store_head: int
    """The event store's newest position when the build reads the store first (else 0)."""
    events: int
    """How many records the build reads: the progress bar's total."""

    def __str__(self) -> str:
        topics = f"the topics up to {_describe(self.bound)}"
        if self.store_head:
            return f"the event store up to position {self.store_head:,}, then {topics}"
        return topics


def _plan(live: ReadModelStore, settings: RunnerSettings, projection: Projection,
          source: ReplaySource) -> ReplayPlan:
    bound = _bound(live.committed_offsets(), settings, projection)
    retained_from = _beginning_offsets(settings, projection)
    events = sum(max(o - retained_from.get(k, 0), 0) for k, o in bound.items())
    store_head = 0
    if reads_event_store(source, retained_from):
        with live.conn.transaction():
            store_head = head_position(live.conn)
            events += count_events(live.conn, projection.sources, 0, store_head)
    return ReplayPlan(bound, store_head, events)


def reads_event_store(source: ReplaySource, retained_from: dict[PartitionKey, int]) -> bool:
    """Whether a replay starts from the event store: asked to, or (``auto``) because some
    source partition no longer starts at offset 0."""
    if source not in ("auto", "kafka", "store"):
        raise ValueError(f"replay source must be auto, kafka or store, not {source!r}")
    return source == "store" or (source == "auto" and any(retained_from.values()))


def _beginning_offsets(settings: RunnerSettings,
                       projection: Projection) -> dict[PartitionKey, int]:
    planner = OffsetPlanner(settings.kafka)
    try:
        return planner.beginning_offsets(planner.partitions(projection.source_topics))
    finally:
        planner.close()


def _bound(live_offsets: dict[PartitionKey, int], settings: RunnerSettings,
           projection: Projection,
           at_least: dict[PartitionKey, int] | None = None) -> dict[PartitionKey, int]:
    """Where the new version must reach: the live version's offsets, or the topics' ends when
    the live version never committed (nothing serves yet, so the whole log is fair game)."""
    if not live_offsets and not at_least:
        planner = OffsetPlanner(settings.kafka)
        try:
            live_offsets = planner.end_offsets(planner.partitions(projection.source_topics))
        finally:
            planner.close()
    merged = dict(at_least or {})
    topics = set(projection.source_topics)  # not the event store's position, if any
    for key, offset in live_offsets.items():
        if key[0] not in topics:
            continue
        merged[key] = max(merged.get(key, 0), offset)
    return merged


def _describe(offsets: dict[PartitionKey, int]) -> str:
    return ", ".join(f"{t}[{p}]@{o:,}" for (t, p), o in sorted(offsets.items())) or "nothing"
