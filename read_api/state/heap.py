"""Handing the memory a restore freed back to the operating system.

A restore allocates and frees a great deal at once: librdkafka's fetch buffers, RocksDB's
memtables and flushes, and the Python objects of every record, on several threads and so in
several of glibc's malloc arenas. glibc keeps what was freed inside an arena for reuse
rather than returning it, so a worker that restored millions of records went on holding
the restore's peak long after (docs/benchmarks.md, "Restores give their memory back").
``malloc_trim`` returns the free pages of every arena; it is called as records are applied,
at most once a second, and after a restore.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_RECORDS = 100_000
"""Records applied, by all the stores of the process, between two trims."""
TRIM_AT_MOST_EVERY_S = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None under another C library (musl returns memory itself)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


class HeapTrimmer:
    """Counts the records a process applies and trims its heap after every
    ``every_records`` of them, not more often than ``at_most_every_s``."""

    def __init__(self, every_records: int = TRIM_EVERY_RECORDS,
                 at_most_every_s: float = TRIM_AT_MOST_EVERY_S,
                 trim: Callable[[int], int] | None = None, enabled: bool = True) -> None:
        self.every_records = every_records
        self.at_most_every_s = at_most_every_s
        self._trim = (trim if trim is not None else _malloc_trim()) if enabled else None
        self._lock = threading.Lock()
        self._pending = 0
        self._last = float("-inf")  # the first trim is never too soon, whatever the uptime
        self.trims = 0

    def applied(self, records: int) -> None:
        """``records`` were applied: trim if enough have been since the last trim."""
        with self._lock:
            self._pending += records
            if (self._pending < self.every_records
                    or time.monotonic() - self._last < self.at_most_every_s):
                return
            self._trim_now()

    def trim(self) -> None:
        """Trim now (a restore has finished), unless nothing was applied since the last."""
        with self._lock:
            if self._pending:
                self._trim_now()

    def _trim_now(self) -> None:
        self._pending = 0
        self._last = time.monotonic()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1


PROCESS_HEAP = HeapTrimmer()
"""The one trimmer of a process: every store's records count towards it."""
UNTRIMMED = HeapTrimmer(enabled=False)
"""Counts and never trims: for stores that keep their heap as it grows."""
