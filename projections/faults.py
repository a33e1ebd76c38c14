"""Fault points: where tests make a projection or reaction process die or freeze on purpose,
between the steps of a batch, to check that what it leaves behind still comes out exactly once.

``EVENTFOLD_CRASH_AT=<point>`` makes the process that reaches ``<point>`` exit at once, as
SIGKILL would (no cleanup, no flush, no rollback), with ``CRASH_EXIT_CODE``. With
``EVENTFOLD_CRASH_ONCE=<file>`` it does so only if the file does not exist yet, and creates it
first: the process that starts again (a Spark task the query retries, a run started again)
goes through. Spark's Python workers inherit the environment, so task points work on local
executors.

``EVENTFOLD_PAUSE_AT=<point>`` with ``EVENTFOLD_PAUSE_WHEN=<file>`` makes the process that
reaches ``<point>`` while the file exists delete it and stop itself with SIGSTOP, as an
operator's ``kill -STOP`` (or a long GC pause, a frozen VM) would at that moment; the test
sends SIGCONT. A test arms it by creating the file, when the drill is ready for it.

The points are unset in production and cost a dictionary lookup.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

CRASH_EXIT_CODE = 86

POINTS = {
    "task.produced": "a task has staged its rows and handed its records to the producer, "
                     "none flushed yet",
    "task.written": "a task has staged and flushed everything, its summary not yet returned",
    "commit.merged": "the commit has merged the staged rows, inside its transaction",
    "commit.done": "the batch has committed, its progress not yet reported",
}
"""The steps of a projection's batch."""

REACTION_POINTS = {
    "reaction.read": "a reaction has read a batch of events, nothing of it loaded, sent or "
                     "saved yet",
    "reaction.sent": "a reaction has sent every command of a batch (or an effect made its "
                     "calls), its positions not yet saved",
    "timer.sent": "a process manager has sent the commands of its due timers, their firing "
                  "not yet saved",
}
"""The steps of a reaction's batch and of a process manager's timers."""

_ARMED = os.environ.get("EVENTFOLD_CRASH_AT")
_ONCE = os.environ.get("EVENTFOLD_CRASH_ONCE")
_PAUSE_AT = os.environ.get("EVENTFOLD_PAUSE_AT")
_PAUSE_WHEN = os.environ.get("EVENTFOLD_PAUSE_WHEN")


def crash_point(name: str) -> None:
    """Exit (or freeze) here, now, if this is the point armed."""
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
