"""What a projection host does beside its projections: it registers in the host directory
(``state.hosts``) and heartbeats, and runs the replays handed to it (``eventfold projection
replay`` finds the host streaming the projection and asks it), each on a thread of its own,
its Spark jobs in a pool of their own beside the live batches."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from eventfold.projections.replay_requests import ReplayCancelled

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eventfold.projections.replay import ProgressListener, ReplayResult, ReplaySource

Replay = Callable[[str, "ReplaySource", "SparkSession", "ProgressListener"], "ReplayResult"]
"""A replay of a projection, by name, from a source, on a session, reporting its progress."""

log = logging.getLogger("eventfold")


class HostRequests:
    """A host's registration and the replays handed to it: a thread that heartbeats, claims
    requests for this host and runs each replay on a thread of its own (its jobs in a pool of
    their own, beside the live batches)."""

    def __init__(self, database_url: str, holder: str | None, names: Sequence[str],
                 replay: Replay, spark: SparkSession) -> None:
        from eventfold.projections.state.hosts import HostDirectory
        from eventfold.projections.state.lease import PROCESS_HOLDER

        self.database_url, self.names, self.replay, self.spark = (database_url, names, replay,
                                                                   spark)
        # the holder of the writer leases its projections take
        self.host_id = holder or PROCESS_HOLDER
        self.directory = HostDirectory(database_url)
        self._registered = False
        self._stopped = threading.Event()
        self._replays: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, name="host-requests", daemon=True)
        # Registered before its projections start: a projection folds within a second of its
        # start, and whoever sees its batches must also see which host runs it.
        try:
            self._register()
        except Exception as exc:  # the database away: the thread tries again
            log.warning("projection host: registering: %s", gist(str(exc)))
        self._thread.start()

    def _register(self) -> None:
        if not self._registered:
            self.directory.register(self.host_id, list(self.names))
            self._registered = True
            log.info("projection host %s runs %s", self.host_id, ", ".join(self.names))

    def _run(self) -> None:
        # Every half second, so that a replay starts soon after it is asked for; each replay
        # reports through a connection of its own.
        while not self._stopped.wait(0.5):
            try:
                self._register()
                self.directory.heartbeat(self.host_id)
                request = self.directory.claim(self.host_id)
            except Exception as exc:  # the database away: the host's projections say so too
                log.warning("projection host: heartbeat: %s", gist(str(exc)))
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
        reports = HostDirectory(self.database_url)
        log.info("projection host: replay of %s requested (request %d)", name, request_id)

        def report(done: int, total: int) -> None:
            if reports.report(request_id, done, total) or self._stopped.is_set():
                raise ReplayCancelled(f"replay of {name} cancelled after {done:,} of "
                                      f"{total:,} events; asked again, it resumes from there")

        try:
            result = self.replay(name, cast("ReplaySource", source), self.spark,
                                             report)
            reports.finish(request_id, "done", result={
                "old_version": result.old_version, "new_version": result.new_version,
                "events": result.events, "seconds": result.seconds})
        except ReplayCancelled as cancelled:
            log.info("projection host: %s", cancelled)
            reports.finish(request_id, "cancelled", error=str(cancelled))
        except Exception as exc:
            log.warning("projection host: replay of %s failed: %s", name, gist(str(exc)))
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
            log.warning("projection host: leaving the directory: %s", gist(str(exc)))
        self.directory.close()


def gist(error: str) -> str:
    """The line of a (Python-in-Java) traceback that says what went wrong."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    causes = [line for line in lines if re.search(r"(Error|Exception)\b.*[:{]", line)
              and not line.startswith(("at ", "File "))]
    return (causes[-1] if causes else lines[0] if lines else "unknown error")[:300]
