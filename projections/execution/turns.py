"""Fair turns between the projections one process runs (a host): a projection catching up a
backlog, or a replay, folds in batches of at most ``fair_batch_rows`` while another live
projection of the process has had records to fold within ``WORK_SEEN_FOR_S``, so that the
other's small batches wait for a short batch, not for one of half a million rows. Alone, a
projection folds in batches as large as its settings allow.

Spark's FIFO live pool serves jobs in the order they came, and a job's tasks keep their cores
until they end (``pools.xml``): the length of the batch ahead is what a live batch waits.
"""

from __future__ import annotations

import threading
import time

WORK_SEEN_FOR_S = 1.0
"""How long after its last batch with records a live projection still counts as having work:
longer than the pause between two looks of an idle stream thread."""


class Turns:
    """Which live projections of this process had records to fold lately."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worked: dict[str, float] = {}

    def worked(self, projection: str) -> None:
        """A live batch of ``projection`` had records."""
        with self._lock:
            self._worked[projection] = time.monotonic()

    def others_have_work(self, projection: str) -> bool:
        since = time.monotonic() - WORK_SEEN_FOR_S
        with self._lock:
            return any(at >= since for other, at in self._worked.items()
                       if other != projection)

    def batch_rows(self, projection: str, largest: int, fair: int) -> int:
        """The most records ``projection``'s next batch may take: ``largest``, or ``fair``
        (when not 0) while another projection has work."""
        largest = max(largest, 1)
        return min(largest, fair) if fair and self.others_have_work(projection) else largest


TURNS = Turns()
"""The process's: every runner of a host shares it."""
