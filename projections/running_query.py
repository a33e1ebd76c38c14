"""A projection's run as its callers see it (``RunningQuery``, a ``StreamThread``): stopped
between batches, its error said."""

from __future__ import annotations

from eventfold.projections.stream_thread import StreamThread

RunningQuery = StreamThread
"""A running projection; the name its callers know it by."""


def described(error: BaseException) -> str:
    """A run's error as text that names it (Spark's task errors carry the Python traceback in
    their text, others are the exception itself)."""
    text = str(error)
    return text if type(error).__name__ in text else f"{type(error).__name__}: {text}"


def stop_gracefully(query: RunningQuery, timeout_s: float = 60) -> None:
    """Stop between batches: cancelling one mid-flight only wastes its work (the guards make
    its replay safe, but there is no reason to pay for it)."""
    query.stop(timeout_s)
