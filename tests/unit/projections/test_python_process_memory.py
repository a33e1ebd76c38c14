"""What Spark's Python processes hold: a worker's first task puts what is in memory then out of
the garbage collector's reach (PySpark collects after every task of a reused worker) while
later tasks' garbage is still collected."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc
from eventfold.projections.execution.executor import executor_task

class Cycle:
    def __init__(self):
        self.me = self

kept = []

@executor_task
def task(n):
    Cycle()  # garbage only the collector frees
    kept.extend([n] for _ in range(10_000))  # what a task leaves alive
    return gc.get_freeze_count()

gc.disable()  # nothing collects but the explicit collect() below
before = gc.get_freeze_count()
first, second = task(1), task(2)
print(before, first, second, gc.collect())
"""


def test_the_first_task_freezes_the_libraries_once_and_later_garbage_is_collected() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, timeout=60)
    before, first, second, collected = (int(n) for n in done.stdout.split())
    assert before == 0
    assert first > 1000  # the imported libraries' objects
    assert second - first < 1_000  # frozen once: not the first task's 10,000 lists
    assert collected >= 2  # the tasks' cycles: made after the freeze, still collected
