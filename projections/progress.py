"""What a run shows while it works: each phase's time (``PhaseClock``, warning about a phase
that hangs), and one INFO line per interval of batches (``ProgressLog``), or a caller's own
``Progress`` (a bar)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from eventfold.projections.state.stage import StagedBatch

log = logging.getLogger(__name__)

_SLOW_PHASE_S = 15.0
"""A phase of starting a query that takes longer than this is logged while it runs."""
WAITED = "waited"
"""The phase, before a batch starts, from its earliest record's append to Kafka."""


class Progress(Protocol):
    def add(self, batch_id: int, records: int, batch: StagedBatch,
            phases: Mapping[str, float]) -> None:
        """A committed batch: ``phases`` its seconds by phase (``BatchPhases``)."""

    def close(self) -> None: ...


class PhaseClock:
    """How long each phase of a piece of work took. ``watching`` names the work to warn about
    a phase still running after ``_SLOW_PHASE_S``: a start that hangs says where."""

    def __init__(self, watching: str | None = None) -> None:
        self._last = time.perf_counter()
        self._laps: list[tuple[str, float]] = []
        self._watching = watching

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self._laps.append((name, now - self._last))
        self._last = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._last = time.perf_counter()
        alarm = None
        if self._watching is not None:
            alarm = threading.Timer(_SLOW_PHASE_S, log.warning, (
                "%s: %s still running after %.0f s", self._watching, name, _SLOW_PHASE_S))
            alarm.daemon = True
            alarm.start()
        try:
            yield
        finally:
            if alarm is not None:
                alarm.cancel()
            self.lap(name)

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self._laps)

    @property
    def laps(self) -> dict[str, float]:
        return dict(self._laps)

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self._laps)


class ProgressLog:
    """One INFO line per interval, not per micro-batch: rates, duplicates, dead letters."""

    def __init__(self, name: str, interval_s: float = 10.0) -> None:
        self.name = name
        self.interval_s = interval_s
        self._since = time.monotonic()
        self._first = True
        self._counts = [0, 0, 0, 0, 0]  # batches, records, applied, duplicates, dead letters

    def add(self, batch_id: int, records: int, batch: StagedBatch,
            phases: Mapping[str, float]) -> None:
        for i, value in enumerate((1, records, batch.applied, batch.duplicates,
                                   batch.dead_letters)):
            self._counts[i] += value
        elapsed = time.monotonic() - self._since
        if not self._first and elapsed < self.interval_s:
            return
        batches, records, applied, duplicates, dead = self._counts
        log.info("projection %s: %d batches up to #%d, %d records (%.0f/s), %d applied, "
                 "%d duplicates skipped, %d dead letters", self.name, batches, batch_id,
                 records, records / max(elapsed, 1e-6), applied, duplicates, dead)
        self._since, self._first, self._counts = time.monotonic(), False, [0, 0, 0, 0, 0]

    def close(self) -> None:
        """Nothing to let go: each line is complete when logged."""
