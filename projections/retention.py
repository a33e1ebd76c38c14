"""A run stops rather than fold past events it never read: the source topics' retention
deleted them (``SourceDataLost``), unless the app allows the loss."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.definition.projection import Projection
from eventfold.projections.execution.store_source import STORE_PARTITION
from eventfold.projections.run_settings import RunnerSettings

from eventfold.contract import PartitionKey

log = logging.getLogger(__name__)


class SourceDataLost(RuntimeError):
    """Retention deleted source events a projection had not read yet."""


def check_retained(projection: Projection, version: int, settings: RunnerSettings,
                   committed: Mapping[PartitionKey, int]) -> None:
    """Stop if a source partition no longer holds events this version has not read:
    retention deleted them, and folding on would silently leave them out. A version that
    folded the event store first read them from there."""
    if STORE_PARTITION in committed:
        return
    planner = OffsetPlanner(settings.kafka)
    try:
        beginning = planner.beginning_offsets(planner.partitions(projection.source_topics))
    finally:
        planner.close()
    lost = {key: (committed.get(key, 0), first) for key, first in beginning.items()
            if first > committed.get(key, 0)}
    if not lost:
        return
    events = sum(first - read for read, first in lost.values())
    where = ", ".join(f"{t}[{p}] offsets {read:,}-{first - 1:,}"
                      for (t, p), (read, first) in sorted(lost.items()))
    message = (f"projection {projection.name} v{version}: {events:,} events it never read "
               f"were deleted by the topics' retention ({where}). Rebuild it from the event "
               f"store, which keeps every event: `eventfold projection replay "
               f"{projection.name} --from store`")
    if not settings.allow_data_loss:
        raise SourceDataLost(message + "; or set EVENTFOLD_ALLOW_DATA_LOSS=true to go on "
                             "without them")
    log.warning("%s. Going on without them (EVENTFOLD_ALLOW_DATA_LOSS)", message)
