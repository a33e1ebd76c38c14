"""A restore's freed memory goes back to the operating system (read_api.state.heap)."""

from __future__ import annotations

import subprocess
import sys

from eventfold.read_api.state.heap import HeapTrimmer

PROBE = """
import threading
from eventfold.read_api.state.heap import HeapTrimmer

def rss_mb():
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024

kept = []

def churn():
    # 2,000-byte blocks come from malloc (not Python's small-object arenas), in this
    # thread's arena; keeping one in fifty pins pages across the whole heap, so glibc can
    # give nothing back from its top, as after a restore.
    blocks = [bytes(2000) for _ in range(60_000)]
    kept.extend(blocks[::50])

base = rss_mb()
thread = threading.Thread(target=churn)
thread.start()
thread.join()
held = rss_mb()
trimmer = HeapTrimmer(every_records=1, at_most_every_s=0)
trimmer.applied(60_000)
print(base, held, rss_mb(), trimmer.trims)
"""


def test_a_trim_gives_back_what_a_thread_freed_amid_what_it_kept() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          check=True, timeout=60)
    base, held, trimmed, trims = (int(n) for n in done.stdout.split())
    assert trims == 1
    assert held - base >= 80  # ~120 MB allocated, 2.4 MB of it kept
    assert trimmed - base <= 30


def test_trims_follow_the_records_applied_not_more_often_than_allowed() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(every_records=100, at_most_every_s=3600,
                          trim=lambda pad: calls.append(pad) or 1)
    trimmer.trim()
    assert calls == []  # nothing applied: nothing to give back
    trimmer.applied(99)
    assert calls == []
    trimmer.applied(1)
    assert calls == [0]
    trimmer.applied(500)
    assert calls == [0]  # within the hour
    trimmer.trim()  # a restore finished: trims whatever the interval
    assert calls == [0, 0]
    trimmer.trim()
    assert calls == [0, 0] and trimmer.trims == 2
