"""Schedules drawn from seeds: which fault, at which step, of which process, for how long.
The same seed draws the same schedule, so a seed that failed reproduces its failure."""

from __future__ import annotations

import random
from dataclasses import dataclass

from eventfold.projections.faults import POINTS, REACTION_POINTS, TASK_POINTS

KINDS = ("freeze", "kill", "postgres_pause", "broker_pause")
"""``freeze``: the process stops at the step (SIGSTOP, a VM pause) past its lease, then goes
on as if nothing happened; ``kill``: it dies there (SIGKILL), and a new one starts;
``postgres_pause``, ``broker_pause``: the database or the broker stops right after the step,
for a while."""

LEASE_S = 1.0
"""The writer lease of the campaign's projection: short, so that a schedule runs in
seconds."""

PROJECTION_ACTORS = ("writer", "standby")
REACTION_ACTORS = ("reactions-a", "reactions-b")

_UNREACHABLE = frozenset({"letters.produced"})
"""Steps a schedule's load never reaches (letters of parked keys)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    point: str
    target: str
    """The process it strikes (``PROJECTION_ACTORS``, ``REACTION_ACTORS``)."""
    after_s: float
    """Armed this long after the load began."""
    hold_s: float
    """How long a freeze or a pause lasts (a kill lasts to the end)."""

    def __str__(self) -> str:
        return f"{self.kind} {self.target} at {self.point} (+{self.after_s:.1f} s, " \
               f"{self.hold_s:.1f} s)"


@dataclass(frozen=True)
class Schedule:
    seed: int
    faults: tuple[Fault, ...]
    spark_tasks: bool
    """Batches run as Spark tasks (else folded on the driver, every step in this process)."""
    tills: int
    rings: int
    tabs: int
    broken_tab: bool
    """One tab's deadline handler raises until the load ends (then it is fixed and the
    parked key retried, as an operator would)."""

    def __str__(self) -> str:
        return (f"seed {self.seed}: {'; '.join(map(str, self.faults)) or 'no fault'}; "
                f"{'Spark tasks' if self.spark_tasks else 'driver folds'}")


def draw(seed: int, lease_s: float) -> Schedule:
    """The schedule of ``seed``: a fault at a step of the projection's writer or of a
    reaction runner, and sometimes a second one, at a step of whoever writes the
    projection by then (the standby that took over from a writer frozen or killed)."""
    rng = random.Random(seed)
    spark_tasks = rng.random() < 0.4
    first = _fault(rng, lease_s, spark_tasks, rng.choice(("writer", *REACTION_ACTORS)), 0.0)
    drawn = [first]
    if rng.random() < 0.3:
        drawn.append(_fault(rng, lease_s, spark_tasks, "writer", first.after_s + first.hold_s))
    return Schedule(seed, tuple(drawn), spark_tasks, tills=rng.randint(3, 6),
                    rings=rng.randint(60, 100), tabs=rng.randint(4, 8),
                    broken_tab=rng.random() < 0.3)


def _fault(rng: random.Random, lease_s: float, spark_tasks: bool, target: str,
           not_before_s: float) -> Fault:
    kind = rng.choice(KINDS)
    if target in PROJECTION_ACTORS:
        points = sorted(set(POINTS) - _UNREACHABLE - (TASK_POINTS if spark_tasks else set()))
    else:
        points = sorted(REACTION_POINTS)
    hold_s = (rng.uniform(1.5, 3.0) * lease_s if kind in ("freeze", "kill")
              else rng.uniform(0.5, 1.5) * lease_s)
    return Fault(kind, rng.choice(points), target,
                 after_s=round(not_before_s + rng.uniform(0.0, 1.5), 2), hold_s=round(hold_s, 2))


NAMED = {
    # The writer stops before its batch's tasks start, past its lease; the standby takes
    # over, and stops inside its first commit (its tasks' records are in the KTable, its
    # rows not yet in the read model); the first writer wakes and its tasks (Spark's, each
    # making its producer) fold the batch it had planned onto the rows they find.
    "a zombie's tasks after a takeover": Schedule(
        -1, (Fault("freeze", "batch.started", "writer", 0.0, 10 * LEASE_S),
             Fault("freeze", "commit.merged", "standby", 0.0, 10 * LEASE_S)),
        spark_tasks=True, tills=3, rings=120, tabs=4, broken_tab=False),
    # A deadline's handler raises: its key is parked with the timer held, and fires once
    # the handler is fixed and the key retried.
    "a timer whose handler raises": Schedule(
        -2, (), spark_tasks=False, tills=3, rings=40, tabs=6, broken_tab=True),
    # A runner fires a timer and stops before its commands went (past its session): the
    # other runner takes its partitions and steps the key's next events meanwhile (a
    # timer and an event of one key race); the first wakes and sends.
    "a timer's step frozen before its commands went": Schedule(
        -3, (Fault("freeze", "timer.saved", "reactions-a", 0.0, 10.0),), spark_tasks=False,
        tills=3, rings=60, tabs=8, broken_tab=False),
    # The same, frozen after a batch's steps were saved.
    "a process step frozen after its state was saved": Schedule(
        -5, (Fault("freeze", "process.saved", "reactions-a", 0.2, 8.0),), spark_tasks=False,
        tills=3, rings=60, tabs=8, broken_tab=False),
    # A runner killed between sending a timer's commands and dropping them from its outbox.
    "a process killed while sending": Schedule(
        -4, (Fault("kill", "process.sending", "reactions-b", 0.0, 8.0),), spark_tasks=False,
        tills=3, rings=60, tabs=8, broken_tab=False),
}
"""Schedules written out, one for each hole a reading found (issue 72), beside the drawn
ones."""
