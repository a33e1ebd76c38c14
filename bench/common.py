"""Shared by the benchmarks: percentiles and the memory of a process tree."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from eventfold.config import Settings
from local_stack import LocalStack


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


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def tree_rss(root: int, exclude: frozenset[int] = frozenset()) -> dict[int, tuple[str, int]]:
    """Name and RSS of ``root`` and each of its descendants, leaving out the subtrees of
    ``exclude``."""
    tree, found, pending = _children(), {}, [root]
    while pending:
        pid = pending.pop()
        if pid in exclude:
            continue
        found[pid] = (_name(pid), _rss_bytes(pid))
        pending.extend(tree.get(pid, []))
    return found


class PeakMemory:
    """Samples the RSS of this process's tree (minus ``exclude``) in the background."""

    def __init__(self, exclude: frozenset[int] = frozenset(), interval_s: float = 0.25) -> None:
        self.exclude, self.interval_s, self.peak = exclude, interval_s, 0
        self.at_peak: dict[int, tuple[str, int]] = {}
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
            sample = tree_rss(os.getpid(), self.exclude)
            total = sum(rss for _, rss in sample.values())
            if total > self.peak:
                self.peak, self.at_peak = total, sample

    def describe_peak(self) -> str:
        """Who held the memory at the peak: ``java 1,234 MB, python3 456 MB, ...``."""
        parts = sorted(((rss, name) for name, rss in self.at_peak.values()), reverse=True)
        return ", ".join(f"{name} {rss / 2**20:,.0f} MB" for rss, name in parts if rss)


@contextmanager
def own_stack(prefix: str) -> Iterator[tuple[Settings, Path]]:
    """A local stack of the benchmark's own in a new temporary directory (settings pointing at
    it, and the directory); stopped, by PID, on the way out."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    stack = LocalStack(root / "stack")
    endpoints = stack.up()
    try:
        yield Settings(database_url=endpoints.database_url,
                       kafka_bootstrap=endpoints.kafka_bootstrap,
                       connect_url=endpoints.connect_url,
                       checkpoint_dir=root / "checkpoints"), root
    finally:
        stack.down()
