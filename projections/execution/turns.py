"""Fair turns between the projections one process runs (a host): a live projection catching
up a backlog folds in batches of at most ``fair_batch_rows`` while another live projection of
the process, following its topics closely (its last batch small enough to fold on the
driver), has had records to fold within ``WORK_SEEN_FOR_S``: the other's small batches then
wait for a short batch, not for one of half a million rows. Alone, or beside projections that
have backlogs of their own (all of a host's projections catching up at its start), a
projection folds in batches as large as its settings allow. A replay keeps its large batches
and leaves a core to the live projections while one follows its topics.

A live batch waits for the batch ahead of it: for its tasks in Spark's FIFO live pool, and
for the cores, the database and the driver's interpreter while it folds and commits.
docs/benchmarks.md has what each choice measured, a replay's smaller batches included (they
made the live batches beside it slower).
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
        self._worked: dict[str, tuple[float, int]] = {}

    def worked(self, projection: str, records: int) -> None:
        """A live batch of ``projection`` had ``records``."""
        with self._lock:
            self._worked[projection] = (time.monotonic(), records)

    def others_following(self, projection: str, small: int) -> bool:
        """Whether another live projection had a batch of at most ``small`` records
        lately."""
        since = time.monotonic() - WORK_SEEN_FOR_S
        with self._lock:
            return any(at >= since and records <= small
                       for other, (at, records) in self._worked.items() if other != projection)

    def batch_rows(self, projection: str, largest: int, fair: int, small: int) -> int:
        """The most records ``projection``'s next live batch may take: ``largest``, or
        ``fair`` (when not 0) while another projection follows its topics with batches of
        at most ``small`` records."""
        largest = max(largest, 1)
        if fair and self.others_following(projection, small):
            return min(largest, fair)
        return largest


    def cores_beside(self, cores: int, small: int) -> int:
        """The cores a replay's jobs take: all but one while a live projection follows its
        topics with batches of at most ``small`` records (its folds, commits and the
        database keep a core), all of them otherwise."""
        return max(cores - 1, 1) if self.others_following("", small) else cores


TURNS = Turns()
"""The process's: every runner of a host shares it."""
