"""What every task of a batch gets besides its rows: picklable, no connections."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eventfold.contract import PartitionKey
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.topics import Replication
from eventfold.projections.plan import Plan


@dataclass(frozen=True)
class BatchContext:
    plan: Plan
    version: int
    database_url: str
    kafka: KafkaConnection
    attempt: str
    """This attempt at the batch: what its tasks stage is marked with it."""
    emit_from: Mapping[PartitionKey, int] | None
    """Derived events are emitted for source offsets from here on (None: not at all)."""
    committed: Mapping[PartitionKey, int]
    replication: Replication = field(default_factory=Replication)
    """Of the derived-event topics the tasks create."""
    derived_topic_config: Mapping[str, str] = field(default_factory=dict)
    """The configs the derived-event topics the tasks create get."""
    fresh: bool = False
    """The version has committed nothing yet: no key has a state or a watermark to load."""
    direct: bool = False
    """Fresh, and built beside the active version, so that no reader sees its table: tasks
    write their rows straight into it (emptied when the attempt began), with no stage and no
    merge."""
    any_parked: bool = False
    """The version has parked keys: tasks ask, per key, whether theirs are."""
    writer: str | None = None
    """The transactional id prefix of the runner holding the version's writer lease
    (``topics.writer_transactional_id``): its tasks produce in transactions (None: plainly,
    as a replay's build does)."""
    writer_epoch: int = 0
    """The lease's epoch that runner holds: a task commits its transaction only while the
    lease is still at it (``lease.guard_kafka_commit``)."""
    writer_lease_s: float = 10.0
    """How long that lease lasts unrenewed: a task frozen inside its commit's check for as
    long has the server end its session."""
    tasks: int | None = None
    """The most tasks a job of the batch that reads in place runs (None: one per core)."""
    rest_ratio: float = 0.0
    """How long its tasks rest between chunks of records for each second they work
    (``writes.TaskClock``): a replay's, beside live projections."""
    ktable_partitions: tuple[int, ...] = ()
    """Every partition count the version's KTable topic has had, oldest first
    (``OutputProducer``)."""
