"""What a projection host is given and what stops its projections: ``HostWiring`` (the
factories of the Spark session, a projection's runner and a replay, and what shows the run to
operators), the errors that need a person (``needs_a_person``) and the bounds on starting
again (``MAX_FAILED_STARTS``, ``MAX_STALL_DOUBLINGS``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.outbox.connection import KafkaConnection
    from eventfold.projections.definition.registry import ProjectionRegistry
    from eventfold.projections.progress import Progress
    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.running_query import RunningQuery
    from eventfold.projections.state.lease import WriterLease

MAX_FAILED_STARTS = 6
"""How often a projection starts again after failures with no batch in between (pauses of 2,
4, 8, 16, 30, 30 s: about a minute and a half of an unreachable broker or database)."""
MAX_STALL_DOUBLINGS = 4
"""How often the watchdog's bound doubles for runs given up as stalled with no batch between
them: a first batch slower than the setting (a cold Spark, a loaded machine) gets up to 16
times it, instead of being cancelled at the same point on every start until the host gives
up."""


class GaveUp(RuntimeError):
    """A run that kept failing stopped: exit code 1, the last failure said."""


class ProjectionsStopped(RuntimeError):
    """Some of a host's projections stopped on errors a person has to look at (each logged
    when it stopped): exit code 1."""


def needs_a_person() -> tuple[type[Exception], ...]:
    """Errors that starting again would only meet again: printed plainly, exit code 1."""
    from eventfold.outbox.topics import ReplicationUnavailable, TopicConfigMismatch
    from eventfold.projections.retention import SourceDataLost
    from eventfold.projections.state.lease import WriterBusy

    return SourceDataLost, TopicConfigMismatch, ReplicationUnavailable, GaveUp, WriterBusy


class Watch(Protocol):
    """What operators are shown of one projection of the host (its ``/health``)."""

    def running(self, runner: ProjectionRunner, query: RunningQuery) -> None: ...
    def stopped(self, state: str) -> None: ...


class Observer(Protocol):
    """What shows a host's run to operators (metrics and health), one ``Watch`` a projection."""

    @property
    def projections(self) -> Mapping[str, Watch]: ...
    def close(self) -> None: ...


class RunnerFactory(Protocol):
    def __call__(self, name: str, progress: Progress | None, spark: SparkSession,
                 lease: WriterLease) -> ProjectionRunner: ...


class ReplayFactory(Protocol):
    def __call__(self, name: str, source: ReplaySource, spark: SparkSession,
                 listener: ProgressListener) -> ReplayResult: ...


@dataclass(frozen=True)
class HostWiring:
    """What a host is given by the composition root that makes it: the app's name and
    projections, where the host keeps its records, and factories of what it runs."""

    app_name: str
    projections: ProjectionRegistry
    database_url: str
    kafka: KafkaConnection
    writer_lease_s: float
    spark_session: Callable[[str], SparkSession]
    """A Spark session named so (one for the host)."""
    runner: RunnerFactory
    replay: ReplayFactory
    observer: Callable[[Sequence[str]], Observer | None]
    """What shows the named projections' run (None: nothing does)."""
    holder: str | None = None
    """The holder of the writer leases the host takes (None: this process,
    ``lease.PROCESS_HOLDER``); hosts of one process that stand in for several processes (a
    fault campaign) each have their own."""
