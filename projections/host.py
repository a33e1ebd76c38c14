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
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eventfold.projections.host_requests import HostRequests, gist
from eventfold.projections.host_wiring import (
    HostWiring,
    Observer,
    ProjectionsStopped,
    needs_a_person,
)
from eventfold.projections.signals import stop_on_signal
from eventfold.projections.supervision import Supervisor

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("eventfold")


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
            Supervisor(self, spark, name, watched).run()
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
