"""Fault points: where tests make a projection or reaction process die or freeze on purpose,
between the steps of its work, to check that what it leaves behind is still exact.

Every step after which a guarantee rests on what was done so far is a point (``POINTS``,
``REACTION_POINTS``): a fault campaign (``tests/support/campaign``) stops a process at each.

From outside a process, through its environment:

- ``EVENTFOLD_CRASH_AT=<point>`` makes the process that reaches ``<point>`` exit at once, as
  SIGKILL would (no cleanup, no flush, no rollback), with ``CRASH_EXIT_CODE``. With
  ``EVENTFOLD_CRASH_ONCE=<file>`` it does so only if the file does not exist yet, and creates
  it first: the process that starts again (a Spark task the query retries, a run started
  again) goes through. Spark's Python workers inherit the environment, so task points work
  on local executors.
- ``EVENTFOLD_PAUSE_AT=<point>`` with ``EVENTFOLD_PAUSE_WHEN=<file>`` makes the process that
  reaches ``<point>`` while the file exists delete it and stop itself with SIGSTOP, as an
  operator's ``kill -STOP`` (or a long GC pause, a frozen VM) would at that moment; the test
  sends SIGCONT. A test arms it by creating the file, when the drill is ready for it.

From inside one (a test running several runners in one process): ``install`` a hook, which
every point calls with its name and the actor of the thread that reached it (``acting_as``:
the threads a runner makes say whose they are). A hook may block (a frozen process) or raise.

The points are unset in production and cost a dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

CRASH_EXIT_CODE = 86

POINTS = {
    "lease.renewing": "a runner's lease thread is about to renew its writer lease",
    "batch.started": "the active version's batch is recorded as under way, nothing folded",
    "task.produced": "a task has staged its rows and handed its records to the producer, "
                     "none flushed yet",
    "task.committing": "a task has flushed its records and checked the writer lease, its "
                       "Kafka transaction not yet committed",
    "task.written": "a task has staged and flushed everything, its summary not yet returned",
    "commit.merged": "the commit has merged the staged rows, inside its transaction",
    "commit.done": "the batch has committed, its progress not yet reported",
    "letters.produced": "the letters a commit decided were produced, not yet marked so",
}
"""The steps of a projection's batch, and of its lease."""

BATCH_POINTS = ("batch.started", "task.produced", "task.committing", "task.written",
                "commit.merged", "commit.done")
"""The steps of every batch, in order."""
TASK_POINTS = frozenset({"task.produced", "task.committing", "task.written"})
"""Points a Spark task reaches on an executor (on the driver too, for a batch it folds)."""

REACTION_POINTS = {
    "reaction.read": "a reaction has read a batch of events, nothing of it loaded, sent or "
                     "saved yet",
    "reaction.sent": "a reaction has sent every command of a batch (or an effect made its "
                     "calls), its positions not yet saved",
    "process.saved": "a process manager has saved its steps' states, timers and commands, "
                     "none of the commands sent yet",
    "process.sending": "a process manager has sent some of its saved commands, not all",
    "timer.saved": "a process manager has saved the steps of its due timers, their "
                   "commands not yet sent",
}
"""The steps of a reaction's batch and of a process manager's steps and timers."""

Hook = Callable[[str, "str | None"], None]
"""Called at every point with its name and the actor of the thread that reached it."""

_ARMED = os.environ.get("EVENTFOLD_CRASH_AT")
_ONCE = os.environ.get("EVENTFOLD_CRASH_ONCE")
_PAUSE_AT = os.environ.get("EVENTFOLD_PAUSE_AT")
_PAUSE_WHEN = os.environ.get("EVENTFOLD_PAUSE_WHEN")
_hooks: list[Hook] = []


class _Actor(threading.local):
    name: str | None = None


_actor = _Actor()


def acting_as(actor: str | None) -> None:
    """This thread works for ``actor`` (a runner's lease holder, a reaction runner): what
    in-process hooks are told at each point it reaches."""
    _actor.name = actor


def current_actor() -> str | None:
    return _actor.name


def install(hook: Hook) -> Callable[[], None]:
    """Call ``hook`` at every point from now on; returns what removes it."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook)


def crash_point(name: str) -> None:
    """Exit, freeze, or call the installed hooks here, now, as armed."""
    for hook in list(_hooks):
        hook(name, _actor.name)
    if name == _PAUSE_AT and _PAUSE_WHEN:
        _pause_if_armed(Path(_PAUSE_WHEN))
    if name != _ARMED:
        return
    if _ONCE:
        marker = Path(_ONCE)
        if marker.exists():
            return
        marker.write_text(name)
    os._exit(CRASH_EXIT_CODE)


def _pause_if_armed(trigger: Path) -> None:
    try:
        trigger.unlink()
    except FileNotFoundError:
        return  # not armed (yet, or any more)
    os.kill(os.getpid(), signal.SIGSTOP)
