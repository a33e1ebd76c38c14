"""Fair turns between the projections one process runs (a host): a live projection catching
up a backlog folds in batches of at most ``fair_batch_rows`` while another live projection of
the process, following its topics closely (its last batch small enough to fold on the
driver), has had records to fold within ``WORK_SEEN_FOR_S``: the other's small batches then
wait for a short batch, not for one of half a million rows. Alone, or beside projections that
have backlogs of their own (all of a host's projections catching up at its start), a
projection folds in batches as large as its settings allow. A replay keeps its large batches
and, while a live projection follows its topics, leaves it a core and rests its tasks between
their chunks of records (``writes.TaskClock``), ``replay_rest_ratio`` seconds for each second
of work, so that the live batches find the cores, the database and the broker mostly free.

A live batch waits for the batch ahead of it: for its tasks in Spark's FIFO live pool, and
for the cores, the database and the driver's interpreter while it folds and commits.
docs/benchmarks.md has what each choice measured, a replay's smaller batches included (they
made the live batches beside it slower).
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

WORK_SEEN_FOR_S = 1.0
"""How long after its last batch with records a live projection still counts as having work:
longer than the pause between two looks of an idle stream thread."""
REPLAY_YIELDS_FOR_S = 60.0
"""How long after a live projection's last batch with records a replay's batch planned in
the process still yields to it: such a batch lasts seconds to minutes, and its tasks cannot
learn of live work that starts meanwhile, so work seen in the last minute counts as going
on."""


class ReplayTurn(NamedTuple):
    """What a batch of a version built beside the active one takes (a live one: the
    defaults)."""

    tasks: int | None = None
    """The most tasks of its jobs (None: one per core)."""
    rest_ratio: float = 0.0
    """How long its tasks rest for each second they work (``writes.TaskClock``)."""


class Turns:
    """Which live projections of this process had records to fold lately."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worked: dict[str, tuple[float, int]] = {}

    def worked(self, projection: str, records: int) -> None:
        """A live batch of ``projection`` had ``records``."""
        with self._lock:
            self._worked[projection] = (time.monotonic(), records)

    def others_following(self, projection: str, small: int,
                         within_s: float = WORK_SEEN_FOR_S) -> bool:
        """Whether another live projection had a batch of at most ``small`` records in the
        last ``within_s`` seconds."""
        since = time.monotonic() - within_s
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

    def replay_turn(self, cores: int, rest_ratio: float, small: int) -> ReplayTurn:
        """What a replay's batch takes while a live projection follows its topics with
        batches of at most ``small`` records (or did within ``REPLAY_YIELDS_FOR_S``): all
        cores but one (its folds, commits and the database keep a core) and tasks that rest
        ``rest_ratio`` seconds for each second they work; all of them and no rest
        otherwise."""
        if self.others_following("", small, REPLAY_YIELDS_FOR_S):
            return ReplayTurn(max(cores - 1, 1), rest_ratio)
        return ReplayTurn(cores, 0.0)


TURNS = Turns()
"""The process's: every runner of a host shares it."""
