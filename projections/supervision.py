"""One projection of a host, supervised on a thread of its own (``Supervisor``): it takes
the writer lease (or stands by, warmed up, for it), runs until the run ends, and starts it
again after a failure with growing pauses, after a stall with a doubled bound, or stands by
when a newer runner fenced it; it gives up after ``MAX_FAILED_STARTS`` failures in a row."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from eventfold.contract.backoff import doubled
from eventfold.projections.host_requests import gist
from eventfold.projections.host_wiring import (
    MAX_FAILED_STARTS,
    MAX_STALL_DOUBLINGS,
    GaveUp,
    HostWiring,
    Watch,
    needs_a_person,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.projections.progress import Progress
    from eventfold.projections.runner import ProjectionRunner
    from eventfold.projections.running_query import RunningQuery
    from eventfold.projections.state.lease import WriterLease

log = logging.getLogger("eventfold")


class Hosting(Protocol):
    """What a supervisor asks of the host it runs in (``host.ProjectionHost``)."""

    wiring: HostWiring
    names: list[str]
    once: bool
    standby: bool
    stop_requested: threading.Event


@dataclass(frozen=True)
class RunOutcome:
    batches: int
    error: str | None = None
    switched_to: int | None = None
    """The version a replay made active, when that is what ended the run."""
    fenced: bool = False
    """A newer runner took the projection's writer lease over."""
    stalled: bool = False
    """The watchdog gave the run up: its look or batch went on past the bound."""


class Supervisor:
    """One projection of a host: its runs, and the pauses between failed ones."""

    def __init__(self, host: Hosting, spark: SparkSession, name: str,
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
                           ready: ProjectionRunner | None = None) -> RunOutcome:
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
                return RunOutcome(abandoned.batches, stalled, stalled=True)
            if (error := query.exception()) is None:
                return RunOutcome(runner.batches)
            if isinstance(error, needs_a_person()):
                raise error
            # A writer frozen past its lease fails on whatever it touched first when it
            # wakes (its database session ended, a fenced producer): the lease says why.
            if isinstance(error, WriterFenced | WritesFenced):
                return RunOutcome(runner.batches, described(error), fenced=True)
            if (lost := lease.lost()) is not None:
                return RunOutcome(runner.batches, described(lost), fenced=True)
            active = runner.versions.active(name)
            return RunOutcome(runner.batches, described(error),
                               active if active != runner.version else None)
        except WriterBusy as busy:
            if not self.wrote:
                raise  # a second runner started by mistake: a person has to decide
            # This host wrote it, and lost its lease meanwhile (a database pause, say): the
            # runner that took it over writes on, and this one stands by.
            return RunOutcome(runner.batches if runner else 0, described(busy), fenced=True)
        except needs_a_person():
            raise  # a person has to decide: starting again would only meet it again
        except Exception as exc:  # the broker or the database unreachable while starting
            return RunOutcome(runner.batches if runner else 0, described(exc))
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
