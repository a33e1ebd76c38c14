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
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from eventfold.contract.backoff import doubled
from eventfold.projections.host_requests import HostRequests, gist
from eventfold.projections.signals import stop_on_signal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.outbox.connection import KafkaConnection
    from eventfold.projections.definition.registry import ProjectionRegistry
    from eventfold.projections.progress import Progress
    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.running_query import RunningQuery
    from eventfold.projections.state.lease import WriterLease

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
    holder: str | None = None
    """The holder of the writer leases the host takes (None: this process,
    ``lease.PROCESS_HOLDER``); hosts of one process that stand in for several processes (a
    fault campaign) each have their own."""


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
        self._refuse_written()
        if not self._running:
            self._raise_what_stopped()
            return
        observer = self.wiring.observer(self._running)
        requests: HostRequests | None = None
        try:
            spark = self.wiring.spark_session(self._application_name())
            # After Spark started: its SparkContext puts in a SIGINT handler of its own that
            # cancels every job and raises KeyboardInterrupt wherever the main thread is. (A
            # host run on another thread is stopped by ``stop_requested``.)
            if threading.current_thread() is threading.main_thread():
                stop_on_signal(self.stop_requested)
            if not self.once:  # a catch-up ends too soon to take work from others
                requests = HostRequests(self.wiring.database_url, self.wiring.holder,
                                        self._running, self.wiring.replay, spark)
            threads = [threading.Thread(target=self._supervise, name=f"projection-{name}",
                                        args=(spark, name, observer), daemon=True)
                       for name in self._running]
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

    @property
    def _running(self) -> list[str]:
        """The projections not stopped before they started (refused)."""
        return [name for name in self.names if name not in self.stopped_on]

    def _refuse_written(self) -> None:
        """Before Spark starts (a while): a projection another live runner writes is refused
        now, unless this host stands by for it."""
        if self.standby:
            return
        from eventfold.projections.state.lease import WriterLease

        for name in self.names:
            lease = WriterLease(self.wiring.database_url, name,
                                lease_s=self.wiring.writer_lease_s,
                                **({"holder": self.wiring.holder} if self.wiring.holder else {}))
            try:
                busy = lease.live_holder()
            except Exception as exc:  # the database away: the run meets it, and tries again
                log.warning("projection %s: looking at its writer lease: %s", name,
                            gist(str(exc)))
                busy = None
            finally:
                lease.release()
            if busy is not None:
                self.stopped_on[name] = busy
                if len(self.names) > 1:
                    log.error("projection %s: %s. The host's other projections run", name, busy)

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
                watched.stopped(f"stopped: {gist(str(exc))}")
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
        self.wrote = False
        """A run of this host has held the lease: a later start refused is a takeover."""
        self._warmed: dict[WriterLease, ProjectionRunner] = {}
        """The runner a standby made ready while it waited for the lease, by that lease."""

    def run(self) -> None:
        name, stop_requested = self.name, self.host.stop_requested
        failures, batches = 0, 0
        while True:
            lease = self._lease()
            if lease is None:
                break  # stopped while standing by
            outcome = self._run_until_it_ends(lease, self._warmed.pop(lease, None))
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
            if outcome.stalled:
                # Its lease was abandoned: a standby may take it meanwhile, and then this
                # host stands by instead of being refused.
                self.standing_by = True
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
                             f"a batch, and stops: {gist(outcome.error)}")
            pause = doubled(2.0, failures, 30.0)
            log.warning("projection %s failed: %s; starting again in %.0f s", name,
                        gist(outcome.error), pause)
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

        wiring = self.host.wiring
        lease = WriterLease(wiring.database_url, self.name, lease_s=wiring.writer_lease_s,
                            **({"holder": wiring.holder} if wiring.holder else {}))
        if not self.standing_by:
            return lease
        if self.watched is not None:
            self.watched.stopped("standing by")
        self._warm_up(lease)
        if lease.wait(self.host.stop_requested) is not None:
            return lease
        if (warmed := self._warmed.pop(lease, None)) is not None:
            warmed.close()
        return None

    def _warm_up(self, lease: WriterLease) -> None:
        """While a standby waits: its runner made ready (tables, topics, Spark's Python
        workers warm), so that it writes soon after it takes the lease. A failure here is
        only logged: the run after the takeover does the same."""
        try:
            runner = self.host.wiring.runner(self.name, None, self.spark, lease)
        except Exception as exc:
            log.warning("projection %s: warming up the standby: %s", self.name, gist(str(exc)))
            return
        started = time.monotonic()
        try:
            runner.warm_up()
            log.info("projection %s: standby warm (tables, topics, Spark's Python workers) in "
                     "%.1f s", self.name, time.monotonic() - started)
        except Exception as exc:
            log.warning("projection %s: warming up the standby: %s", self.name, gist(str(exc)))
        self._warmed[lease] = runner

    def _run_until_it_ends(self, lease: WriterLease,
                           ready: ProjectionRunner | None = None) -> _RunOutcome:
        """One run, of ``ready`` (a standby's runner, warmed while it waited) or of a new
        runner."""
        from eventfold.projections.running_query import described, stop_gracefully
        from eventfold.projections.state.lease import WriterBusy, WriterFenced
        from eventfold.projections.state.transactions import WritesFenced

        host, name = self.host, self.name
        runner = None
        try:
            runner = started = ready or host.wiring.runner(name, self._catch_up_bar(),
                                                           self.spark, lease)
            query = runner.start(once=host.once)
            self.wrote = True
            if self.watched is not None:
                self.watched.running(runner, query)
            # Signal handlers only set a flag: the thread may be inside a py4j call, which
            # must not be re-entered from a handler. Wait in slices and stop from here.
            stalled = _await_query(query, host.stop_requested, stop_gracefully,
                                   lambda: self._stalled(started, query))
            if stalled is not None:
                # Its thread may be stuck where nothing can interrupt it: the runner is left
                # to it, and the next run's lease (a new epoch) fences whatever it still does.
                # Its lease is no longer renewed: should no next run take it (the host gives
                # up, or stops), it expires and a standby takes the projection over.
                lease.abandon()
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
        except WriterBusy as busy:
            if not self.wrote:
                raise  # a second runner started by mistake: a person has to decide
            # This host wrote it, and lost its lease meanwhile (a database pause, say): the
            # runner that took it over writes on, and this one stands by.
            return _RunOutcome(runner.batches if runner else 0, described(busy), fenced=True)
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
        return doubled(setting_s, self.stalls_in_a_row + 1,
                       setting_s * 2.0 ** MAX_STALL_DOUBLINGS)

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


def _await_query(query: RunningQuery, stop_requested: threading.Event,
                 stop_gracefully: Callable[[RunningQuery], None],
                 stalled: Callable[[], str | None]) -> str | None:
    """Wait for the run to end: by itself (caught up with ``--once``, or failed), on a signal,
    or once ``stalled`` (asked every second) says it is (what it said). A failed run's
    ``exception()`` says why and the caller decides (a version switch is not a failure)."""
    while True:
        if query.awaitTermination(1):
            return None
        if stop_requested.is_set():
            stop_gracefully(query)
            return None
        if (stall := stalled()) is not None:
            return stall
