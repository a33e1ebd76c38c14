"""What every task Spark runs on a Python worker does first (``executor_task``). Its own module,
importing nothing but the standard library, so that any module can mark its worker-side
functions without loading what the tasks use.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_settled = False

P = ParamSpec("P")
R = TypeVar("R")


def executor_task(task: Callable[P, R]) -> Callable[P, R]:
    """Marks a function Spark runs in a Python worker. The first such task of a worker moves
    everything then in memory (the imported libraries, this task's plan) to the garbage
    collector's permanent generation: PySpark's worker daemon runs a full ``gc.collect()``
    after every task of a reused worker, and walking all of pyspark's, pandas', SQLAlchemy's
    and Eventfold's objects each time cost more than a small batch's fold
    (docs/benchmarks.md). What later tasks leave behind is collected as before."""

    @functools.wraps(task)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        global _settled
        if not _settled:
            gc.freeze()
            _settled = True
        return task(*args, **kwargs)
    return run
