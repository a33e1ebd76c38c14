"""Shared by the benchmarks: percentiles and the memory of a process tree."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(root: int, exclude: frozenset[int] = frozenset()) -> int:
    """RSS of ``root`` and all its descendants, leaving out the subtrees of ``exclude``."""
    tree, total, pending = _children(), 0, [root]
    while pending:
        pid = pending.pop()
        if pid in exclude:
            continue
        total += _rss_bytes(pid)
        pending.extend(tree.get(pid, []))
    return total


class PeakMemory:
    """Samples the RSS of this process's tree (minus ``exclude``) in the background."""

    def __init__(self, exclude: frozenset[int] = frozenset(), interval_s: float = 0.25) -> None:
        self.exclude, self.interval_s, self.peak = exclude, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, tree_rss_bytes(os.getpid(), self.exclude))
