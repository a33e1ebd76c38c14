"""What an operator asks of a projection: how far behind, when it last ran, how much it holds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.definition.projection import Projection
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.state.store import ReadModelStore


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(self.end - self.committed, 0)


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    version: int
    batch_id: int | None
    events_applied: int
    dead_letters: int
    last_batch_at: datetime | None
    rows: int | None  # counted in a small table, else estimated (the table statistics)
    partitions: list[PartitionLag]
    outputs: dict[str, object]
    parked_keys: int = 0
    held_events: int = 0
    """Keys waiting behind an event their fold raised on, and the events they hold."""

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def describe(self) -> str:
        last = self.last_batch_at.isoformat(timespec="seconds") if self.last_batch_at else "never"
        rows = "no read model yet" if self.rows is None else f"{self.rows:,} rows"
        lines = [f"{self.name} v{self.version}: lag {self.lag:,} events, "
                 f"{self.events_applied:,} applied, "
                 f"{self.dead_letters:,} dead letters{self._parked()}, {rows}, "
                 f"last batch {last}"
                 + (f" (#{self.batch_id})" if self.batch_id is not None else "")]
        lines += [f"  {p.topic}[{p.partition}]: at {p.committed:,} of {p.end:,} (lag {p.lag:,})"
                  for p in self.partitions]
        lines += [f"  {what}: {', '.join(v) if isinstance(v, list) else v}"
                  for what, v in self.outputs.items() if v]
        return "\n".join(lines)


    def _parked(self) -> str:
        if not self.parked_keys:
            return ""
        return (f" ({self.parked_keys:,} keys parked, holding {self.held_events:,} events: "
                f"`eventfold dlq list {self.name}`)")


def projection_status(projection: Projection, database_url: str,
                      kafka: KafkaConnection) -> ProjectionStatus:
    versions = ProjectionCatalog(database_url)
    try:
        version, derived = versions.outputs(projection.name)  # never ran: v1, all lag
    finally:
        versions.close()
    with ReadModelStore(database_url, projection, version) as store:
        checkpoint = store.checkpoint()
        committed = checkpoint.offsets if checkpoint else {}
        rows = store.row_count()
        parked, held = store.parked_counts()
    planner = OffsetPlanner(kafka)
    try:
        partitions = planner.partitions(projection.source_topics)
        ends = planner.end_offsets(partitions)
    finally:
        planner.close()
    return ProjectionStatus(
        name=projection.name,
        version=version,
        batch_id=checkpoint.batch_id if checkpoint else None,
        events_applied=checkpoint.events_applied if checkpoint else 0,
        dead_letters=checkpoint.dead_letters if checkpoint else 0,
        last_batch_at=checkpoint.updated_at if checkpoint else None,
        rows=rows,
        partitions=[PartitionLag(t, p, committed.get((t, p), 0), ends[(t, p)])
                    for t, p in partitions],
        outputs=projection_outputs(projection, version, derived),
        parked_keys=parked,
        held_events=held,
    )


def projection_outputs(projection: Projection, version: int,
                       derived_topics: list[str]) -> dict[str, object]:
    """Where a projection's output goes at ``version``: read model view and table, KTable
    topic, derived-event topics (those written so far), dead letters."""
    outputs: dict[str, object] = {}
    if projection.has_state:
        outputs["read_model"] = projection.table
        outputs["ktable_topic"] = projection.ktable_topic_for(version)
    outputs["derived_topics"] = derived_topics
    outputs["dead_letter_topic"] = projection.dead_letter_topic
    return outputs
