"""Crash points: where tests make a projection process die on purpose, between the steps of a
batch, to check that what it leaves behind still comes out exactly once.

``EVENTFOLD_CRASH_AT=<point>`` makes the process that reaches ``<point>`` exit at once, as
SIGKILL would (no cleanup, no flush, no rollback), with ``CRASH_EXIT_CODE``. With
``EVENTFOLD_CRASH_ONCE=<file>`` it does so only if the file does not exist yet, and creates it
first: the process that starts again (a Spark task the query retries, a run started again)
goes through. Spark's Python workers inherit the environment, so task points work on local
executors; the points are unset in production and cost a dictionary lookup.
"""

from __future__ import annotations

import os
from pathlib import Path

CRASH_EXIT_CODE = 86

POINTS = {
    "task.produced": "a task has staged its rows and handed its records to the producer, "
                     "none flushed yet",
    "task.written": "a task has staged and flushed everything, its summary not yet returned",
    "commit.merged": "the commit has merged the staged rows, inside its transaction",
    "commit.done": "the batch has committed, its progress not yet reported",
}

_ARMED = os.environ.get("EVENTFOLD_CRASH_AT")
_ONCE = os.environ.get("EVENTFOLD_CRASH_ONCE")


def crash_point(name: str) -> None:
    """Exit here, now, if this is the point armed."""
    if name != _ARMED:
        return
    if _ONCE:
        marker = Path(_ONCE)
        if marker.exists():
            return
        marker.write_text(name)
    os._exit(CRASH_EXIT_CODE)
