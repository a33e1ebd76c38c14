"""The projection host: ``eventfold projection run`` of one projection, several or ``--all``,
in one Spark application, each on a stream thread of its own (``projections.stream_thread``).

Each projection is supervised on a thread of its own. Live batches share one scheduler pool and
are served in the order they came, ahead of replays handed to the host, which run in a pool of
their own (``projections/execution/pools.xml`` says why). A failure
(the broker or the database away) starts that projection again alone, with growing pauses; one
that needs a person (events lost to retention, a topic's wrong configs) or keeps failing stops
alone, and the host says so while the others carry on. SIGTERM and Ctrl-C stop every
projection between batches.

One runner writes a projection (``projections.state.lease``): a projection another live
runner writes is refused (``WriterBusy``), or with ``standby`` waited for and taken over when
that runner ends or dies. A runner fenced by a newer one stops writing and stands by.

A host is given what it runs (``HostWiring``: factories of the Spark session, a projection's
runner and a replay, and of what shows the run to operators) by the composition root that makes
it; it imports nothing of ``eventfold`` outside ``projections`` and ``outbox``.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from eventfold.projections.replay_requests import ReplayCancelled
from eventfold.projections.signals import stop_on_signal

if TYPE_CHECKING:
    from eventfold.outbox.connection import KafkaConnection
    from eventfold.projections.definition.registry import ProjectionRegistry
    from eventfold.projections.progress import Progress
    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.running_query import RunningQuery
    from eventfold.projections.state.lease import WriterLease
    from pyspark.sql import SparkSession

log = logging.getLogger("eventfold")

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


@dataclass(frozen=True)
class _RunOutcome:
    batches: int
    error: str | None = None
    switched_to: int | None = None
    """The version a replay made active, when that is what ended the run."""
    fenced: bool = False
    """A newer runner took the projection's writer lease over."""
    stalled: bool = False
    """The watchdog gave the run up: its look or batch went on past the bound."""


class ProjectionHost:
    """Runs ``names`` (streaming, or ``once``: each catches up and stops) until they end or a
    signal stops them. ``run`` raises the error that stopped a lone projection, and
    ``ProjectionsStopped`` when some of several stopped."""

    def __init__(self, wiring: HostWiring, names: Sequence[str], once: bool = False,
                 standby: bool = False) -> None:
        self.wiring = wiring
        self.names = list(dict.fromkeys(names))
        self.once = once
        self.standby = standby
        self.stop_requested = threading.Event()
        self.stopped_on: dict[str, Exception] = {}

    def run(self) -> None:
        observer = self.wiring.observer(self.names)
        requests: _Requests | None = None
        try:
            spark = self.wiring.spark_session(self._application_name())
            # After Spark started: its SparkContext puts in a SIGINT handler of its own that
            # cancels every job and raises KeyboardInterrupt wherever the main thread is.
            stop_on_signal(self.stop_requested)
            if not self.once:  # a catch-up ends too soon to take work from others
                requests = _Requests(self, spark)
            threads = [threading.Thread(target=self._supervise, name=f"projection-{name}",
                                        args=(spark, name, observer), daemon=True)
                       for name in self.names]
            for thread in threads:
                thread.start()
            # The main thread only waits, in slices, so that signals reach their handler.
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
        finally:
            if requests is not None:
                requests.stop()
            if observer is not None:
                observer.close()
        self._raise_what_stopped()

    def _application_name(self) -> str:
        return (f"eventfold-{self.names[0]}" if len(self.names) == 1
                else f"eventfold-{self.wiring.app_name}-host")

    def _raise_what_stopped(self) -> None:
        if not self.stopped_on:
            return
        if len(self.names) == 1:
            raise self.stopped_on[self.names[0]]
        raise ProjectionsStopped(
            f"{len(self.stopped_on)} of {len(self.names)} projections stopped: " + "; ".join(
                f"{name}: {error}" for name, error in sorted(self.stopped_on.items())))

    def _supervise(self, spark: SparkSession, name: str, observer: Observer | None) -> None:
        from eventfold.projections.execution.spark import LIVE_POOL, SCHEDULER_POOL

        # Jobs of this projection's batches (they run on its stream thread, which inherits
        # this) go to the live pool.
        spark.sparkContext.setLocalProperty(SCHEDULER_POOL, LIVE_POOL)
        watched = observer.projections[name] if observer is not None else None
        try:
            _Supervisor(self, spark, name, watched).run()
        except needs_a_person() as exc:
            self.stopped_on[name] = exc
            if len(self.names) > 1:
                log.error("projection %s stopped: %s. The host's other projections carry on",
                          name, exc)
            if watched is not None:
                watched.stopped(f"stopped: {_gist(str(exc))}")
        except Exception as exc:  # a bug: the thread must not die silently
            log.exception("projection %s stopped on an unexpected error", name)
            self.stopped_on[name] = exc


class _Supervisor:
    """One projection of a host: its runs, and the pauses between failed ones."""

    def __init__(self, host: ProjectionHost, spark: SparkSession, name: str,
                 watched: Watch | None) -> None:
        self.host = host
        self.spark = spark
        self.name = name
        self.watched = watched
        self.standing_by = host.standby
        self.stalls_in_a_row = 0
        """Runs given up as stalled since the last batch committed: each doubles the bound."""

    def run(self) -> None:
        name, stop_requested = self.name, self.host.stop_requested
        failures, batches = 0, 0
        while True:
            lease = self._lease()
            if lease is None:
                break  # stopped while standing by
            outcome = self._run_until_it_ends(lease)
            batches += outcome.batches
            self.stalls_in_a_row = (0 if outcome.batches
                                    else self.stalls_in_a_row + int(outcome.stalled))
            if outcome.error is None or stop_requested.is_set():
                break
            if outcome.fenced:
                log.error("projection %s: %s; standing by to take it over again", name,
                          outcome.error)
                self.standing_by = True
                continue
            if outcome.switched_to is not None:
                log.info("projection %s: a replay made v%d active; continuing on it", name,
                         outcome.switched_to)
                continue
            # A failure (the broker or the database away, a batch the broker refused) is
            # tried again from the last commit, with growing pauses; a run that made progress
            # starts counting afresh, one that keeps failing without any stops.
            failures = 1 if outcome.batches else failures + 1
            if failures > MAX_FAILED_STARTS:
                raise GaveUp(f"projection {name} failed {failures - 1} times in a row without "
                             f"a batch, and stops: {_gist(outcome.error)}")
            pause = min(2.0 ** failures, 30.0)
            log.warning("projection %s failed: %s; starting again in %.0f s", name,
                        _gist(outcome.error), pause)
            if self.watched is not None:
                self.watched.stopped(f"failed, starting again in {pause:.0f} s")
            if stop_requested.wait(pause):
                break
        log.info("projection %s stopped after %d batches", name, batches)
        if self.watched is not None:
            self.watched.stopped("stopped")

    def _lease(self) -> WriterLease | None:
        """The projection's writer lease: a standby waits for it (None: stopped meanwhile);
        otherwise the run takes it as it starts (and is refused while another holds it)."""
        from eventfold.projections.state.lease import WriterLease

        lease = WriterLease(self.host.wiring.database_url, self.name,
                            lease_s=self.host.wiring.writer_lease_s)
        if not self.standing_by:
            return lease
        if self.watched is not None:
            self.watched.stopped("standing by")
        return lease if lease.wait(self.host.stop_requested) is not None else None

    def _run_until_it_ends(self, lease: WriterLease) -> _RunOutcome:
        from eventfold.projections.running_query import described, stop_gracefully
        from eventfold.projections.state.lease import WriterFenced
        from eventfold.projections.state.topics import WritesFenced

        host, name = self.host, self.name
        runner = None
        try:
            runner = started = host.wiring.runner(name, self._catch_up_bar(), self.spark, lease)
            query = runner.start(once=host.once)
            if self.watched is not None:
                self.watched.running(runner, query)
            # Signal handlers only set a flag: the thread may be inside a py4j call, which
            # must not be re-entered from a handler. Wait in slices and stop from here.
            stalled = _await_query(query, host.stop_requested, stop_gracefully,
                                   lambda: self._stalled(started, query))
            if stalled is not None:
                # Its thread may be stuck where nothing can interrupt it: the runner is left
                # to it, and the next run's lease (a new epoch) fences whatever it still does.
                abandoned, runner = runner, None
                return _RunOutcome(abandoned.batches, stalled, stalled=True)
            if (error := query.exception()) is None:
                return _RunOutcome(runner.batches)
            if isinstance(error, needs_a_person()):
                raise error
            # A writer frozen past its lease fails on whatever it touched first when it
            # wakes (its database session ended, a fenced producer): the lease says why.
            if isinstance(error, WriterFenced | WritesFenced):
                return _RunOutcome(runner.batches, described(error), fenced=True)
            if (lost := lease.lost()) is not None:
                return _RunOutcome(runner.batches, described(lost), fenced=True)
            active = runner.versions.active(name)
            return _RunOutcome(runner.batches, described(error),
                               active if active != runner.version else None)
        except needs_a_person():
            raise  # a person has to decide: starting again would only meet it again
        except Exception as exc:  # the broker or the database unreachable while starting
            return _RunOutcome(runner.batches if runner else 0, described(exc))
        finally:
            if runner is not None:
                try:
                    runner.close()
                except Exception as exc:
                    log.warning("projection %s: closing the runner: %s", name, exc)

    def stall_floor_s(self, setting_s: float) -> float:
        """The watchdog's floor for the run under way: the setting, doubled for each run
        given up as stalled since a batch last committed (``MAX_STALL_DOUBLINGS`` at most)."""
        return setting_s * 2.0 ** min(self.stalls_in_a_row, MAX_STALL_DOUBLINGS)

    def _stalled(self, runner: ProjectionRunner, query: RunningQuery) -> str | None:
        """The watchdog, every second of a run: a stream thread whose look or batch has gone
        on past its bound is reported, its Spark jobs cancelled and its run given up (what
        the run ends with, or None while it is well)."""
        from eventfold.projections import metrics
        from eventfold.projections.stream_thread import StreamThread

        if not isinstance(query, StreamThread):
            return None
        if runner.batches:
            metrics.STALLED.labels(self.name).set(0)
        running_s = query.stalled_for(self.stall_floor_s(runner.settings.projection_stall_s))
        if running_s is None:
            return None
        metrics.STALLED.labels(self.name).set(1)
        what = (f"projection {self.name} stalled: its batch or look has gone on for "
                f"{running_s:.0f} s")
        log.error("%s; cancelling its Spark jobs and starting it again from its checkpoint, "
                  "with %s the bound until a batch commits", what,
                  "twice" if self.stalls_in_a_row < MAX_STALL_DOUBLINGS else "the same")
        if self.watched is not None:
            self.watched.stopped("stalled")
        self.spark.sparkContext.cancelJobGroup(query.job_group)
        query.stop(timeout_s=0)
        return what

    def _catch_up_bar(self) -> Progress | None:
        """A live bar for ``--once`` of one projection on a terminal, its total the lag at
        the start (several bars would overwrite each other: a host logs progress lines)."""
        host = self.host
        if not (host.once and len(host.names) == 1 and sys.stderr.isatty()):
            return None
        from eventfold.projections.replay import ReplayProgress
        from eventfold.projections.status import projection_status

        wiring = host.wiring
        lag = projection_status(wiring.projections.get(self.name), wiring.database_url,
                                wiring.kafka).lag
        return ReplayProgress(self.name, lag, what="catching up", terminal=True)


class _Requests:
    """A host's registration and the replays handed to it: a thread that heartbeats, claims
    requests for this host and runs each replay on a thread of its own (its jobs in a pool of
    their own, beside the live batches)."""

    def __init__(self, host: ProjectionHost, spark: SparkSession) -> None:
        from eventfold.projections.state.hosts import HostDirectory
        from eventfold.projections.state.lease import PROCESS_HOLDER

        self.host, self.spark = host, spark
        self.host_id = PROCESS_HOLDER  # the holder of the writer leases its projections take
        self.directory = HostDirectory(host.wiring.database_url)
        self._registered = False
        self._stopped = threading.Event()
        self._replays: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="host-requests", daemon=True)
        # Registered before its projections start: a projection folds within a second of its
        # start, and whoever sees its batches must also see which host runs it.
        try:
            self._register()
        except Exception as exc:  # the database away: the thread tries again
            log.warning("projection host: registering: %s", _gist(str(exc)))
        self._thread.start()

    def _register(self) -> None:
        if not self._registered:
            self.directory.register(self.host_id, self.host.names)
            self._registered = True
            log.info("projection host %s runs %s", self.host_id, ", ".join(self.host.names))

    def _run(self) -> None:
        # Every half second, so that a replay starts soon after it is asked for; each replay
        # reports through a connection of its own.
        while not self._stopped.wait(0.5):
            try:
                self._register()
                self.directory.heartbeat(self.host_id)
                request = self.directory.claim(self.host_id)
            except Exception as exc:  # the database away: the host's projections say so too
                log.warning("projection host: heartbeat: %s", _gist(str(exc)))
                self._stopped.wait(5)
                continue
            if request is not None:
                thread = threading.Thread(target=self._replay, name=f"replay-{request.projection}",
                                          args=(request.id, request.projection, request.source),
                                          daemon=True)
                self._replays.append(thread)
                thread.start()

    def _replay(self, request_id: int, name: str, source: str) -> None:
        from eventfold.projections.execution.spark import REPLAY_POOL, SCHEDULER_POOL
        from eventfold.projections.state.hosts import HostDirectory

        self.spark.sparkContext.setLocalProperty(SCHEDULER_POOL, REPLAY_POOL)
        reports = HostDirectory(self.host.wiring.database_url)
        log.info("projection host: replay of %s requested (request %d)", name, request_id)

        def report(done: int, total: int) -> None:
            if reports.report(request_id, done, total) or self._stopped.is_set():
                raise ReplayCancelled(f"replay of {name} cancelled after {done:,} of "
                                      f"{total:,} events; asked again, it resumes from there")

        try:
            result = self.host.wiring.replay(name, cast("ReplaySource", source), self.spark,
                                             report)
            reports.finish(request_id, "done", result={
                "old_version": result.old_version, "new_version": result.new_version,
                "events": result.events, "seconds": result.seconds})
        except ReplayCancelled as cancelled:
            log.info("projection host: %s", cancelled)
            reports.finish(request_id, "cancelled", error=str(cancelled))
        except Exception as exc:
            log.warning("projection host: replay of %s failed: %s", name, _gist(str(exc)))
            reports.finish(request_id, "failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            reports.close()

    def stop(self) -> None:
        """Replays under way stop after their batch (they resume when asked again); then
        the host leaves the directory."""
        self._stopped.set()
        self._thread.join(10)
        for thread in self._replays:
            thread.join(120)
        try:
            if self._registered:
                self.directory.unregister(self.host_id)
        except Exception as exc:
            log.warning("projection host: leaving the directory: %s", _gist(str(exc)))
        self.directory.close()


def _gist(error: str) -> str:
    """The line of a (Python-in-Java) traceback that says what went wrong."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    causes = [line for line in lines if re.search(r"(Error|Exception)\b.*[:{]", line)
              and not line.startswith(("at ", "File "))]
    return (causes[-1] if causes else lines[0] if lines else "unknown error")[:300]


def _await_query(query: RunningQuery, stop_requested: threading.Event,
                 stop_gracefully: Callable[[RunningQuery], None],
                 stalled: Callable[[], str | None]) -> str | None:
    """Wait for the run to end: by itself (caught up with ``--once``, or failed), on a signal,
    or once ``stalled`` (asked every second) says it is (what it said). A failed query raises
    from ``awaitTermination``; its ``exception()`` says why and the caller decides (a version
    switch is not a failure)."""
    from pyspark.errors import StreamingQueryException

    while True:
        try:
            if query.awaitTermination(1):
                return None
        except StreamingQueryException:
            return None
        if stop_requested.is_set():
            stop_gracefully(query)
            return None
        if (stall := stalled()) is not None:
            return stall
