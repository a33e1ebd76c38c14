"""A projection's run as its callers see it, whichever driver runs it (``RunningQuery``: a
``StreamThread``, or Spark's ``StreamingQuery``): stopped between batches, its error said."""

from __future__ import annotations

import time
from typing import Protocol

from pyspark.sql.streaming import StreamingQuery

from eventfold.projections.stream_thread import StreamThread


def described(error: BaseException) -> str:
    """A run's error as text that names it: Spark's query exceptions carry the Python
    traceback in their text, a stream thread's are the exception itself."""
    text = str(error)
    return text if type(error).__name__ in text else f"{type(error).__name__}: {text}"


class RunningQuery(Protocol):
    """A running projection: a ``StreamThread``, or Spark's ``StreamingQuery`` for Spark's
    Kafka source. What callers use of either."""

    @property
    def isActive(self) -> bool: ...

    def awaitTermination(self, timeout: int | None = None) -> bool | None: ...

    def exception(self) -> BaseException | None: ...

    def stop(self) -> None: ...


def stop_gracefully(query: RunningQuery, timeout_s: float = 60) -> None:
    """Stop between batches: cancelling one mid-flight only wastes its work (the guards make
    its replay safe, but there is no reason to pay for it)."""
    if isinstance(query, StreamThread):
        query.stop(timeout_s)
        return
    assert isinstance(query, StreamingQuery)
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()
