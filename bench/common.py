"""Shared by the benchmarks: percentiles, the memory of a process tree, wrk runs, rounds of
threaded clients and a stack of our own."""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any, TypeVar, cast

from eventfold.config import Settings
from eventfold.local_stack import LocalStack
from eventfold.local_stack.process import process_tree

T = TypeVar("T")

log = logging.getLogger("bench")

PRODUCTS_PER_CLIENT = 200  # each write-side client cycles over this many products of its own


def threaded_round(command: Callable[[int, int], object], clients: int,
                   until: float | None) -> int:
    """Commands done by ``clients`` threads, thread ``n`` calling ``command(n, done)``: one per
    product each when ``until`` is None (the warm-up), else until that ``perf_counter`` time."""
    done_counts: list[int] = []

    def client(n: int) -> None:
        done = 0
        while (done < PRODUCTS_PER_CLIENT) if until is None else time.perf_counter() < until:
            command(n, done)
            done += 1
        done_counts.append(done)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done_counts)


def _call_into(queue: Any, work: Callable[..., T], args: tuple[Any, ...]) -> None:
    queue.put(work(*args))


def _together_in(work: Callable[..., tuple[int, float]], args: tuple[Any, ...], ready: Any,
                 go: Any, results: Any) -> None:
    def wait_for_go() -> None:
        ready.put(True)
        go.wait()

    results.put(work(*args, wait_for_go))


def together(work: Callable[..., tuple[int, float]], shares: Sequence[tuple[Any, ...]],
             timeout_s: float = 1800) -> float:
    """``work(*share, ready)`` for each share in a spawned process of its own, started
    together once each has called ``ready`` (connected); each returns (events, seconds).
    Events/s of them all over the slowest: what the machine's cores give the work at once."""
    context = mp.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    workers = [context.Process(target=_together_in, args=(work, share, ready, go, results))
               for share in shares]
    for worker in workers:
        worker.start()
    outcomes: list[tuple[int, float]] = []
    try:
        for _ in workers:
            ready.get(timeout=120)
        go.set()
        outcomes = [results.get(timeout=timeout_s) for _ in workers]
    finally:
        for worker in workers:
            if not outcomes:
                worker.terminate()  # one failed: stop the others rather than wait
            worker.join()
    return sum(seen for seen, _ in outcomes) / max(seconds for _, seconds in outcomes)


def in_a_process(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in a spawned process of its own, its result back: for a bench's own
    load (producing, loading the store) whose memory must not count as the driver's, since
    freed heap mostly stays in a process's RSS."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_call_into, args=(queue, work, args))
    process.start()
    try:
        while True:
            try:
                return cast(T, queue.get(timeout=1.0))
            except Empty:
                if not process.is_alive():
                    raise RuntimeError(f"{work.__name__} failed in its process (exit code "
                                       f"{process.exitcode})") from None
    finally:
        process.join()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


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
    tree, found, pending = process_tree(), {}, [root]
    while pending:
        pid = pending.pop()
        if pid in exclude:
            continue
        found[pid] = (_name(pid), _rss_bytes(pid))
        pending.extend(tree.get(pid, []))
    return found


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


COMPONENT_MARKS = (("kafka_streams", "dev.eventfold.peers"), ("quix", "peers/quix"),
                   ("broker", "kafka.Kafka"), ("connect", "ConnectDistributed"),
                   ("spark_python", "pyspark.daemon"), ("spark_python", "pyspark.worker"),
                   ("spark_jvm", "org.apache.spark"), ("postgres", "postgres"))
"""How a process's command line names its component (``CoreMeter``, ``cpu_by_component``),
the first mark found winning: a peer's or Spark's command line can name a jar of another."""


def component_of(pid: int) -> str:
    """The component ``pid`` belongs to (``COMPONENT_MARKS``), else ``other``."""
    command = _cmdline(pid)
    return next((name for name, mark in COMPONENT_MARKS if mark in command), "other")


def _reaped_cpu_seconds() -> float:
    """The CPU this process's children used that it has waited for: a peer that ran to its
    end, the bench's own processes."""
    usage = os.times()
    return usage.children_user + usage.children_system


def cpu_by_component(named_roots: Mapping[str, list[int]] | None = None) -> dict[str, float]:
    """CPU seconds spent so far by each component of this process's tree (``component_of``;
    the trees of ``named_roots`` under their names; the children this process reaped as
    ``reaped``). Two of these apart say what a stretch of work cost each component
    (``cpu_between``); a process that ended between them loses what it used since it was
    started or last seen, so only long-lived ones are measured so."""
    tree = process_tree()
    owner = {pid: component_of(pid) for pid in _descendants([os.getpid()], tree)}
    for name, roots in (named_roots or {}).items():
        owner.update(dict.fromkeys(_descendants(roots, tree), name))
    spent: dict[str, float] = {"reaped": _reaped_cpu_seconds()}
    for pid, name in owner.items():
        spent[name] = spent.get(name, 0.0) + _cpu_seconds(pid)
    return spent


def cpu_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each component spent from ``before`` to ``after`` (``cpu_by_component``); a
    component whose processes all ended meanwhile is left out."""
    return {name: max(after[name] - before.get(name, 0.0), 0.0) for name in sorted(after)}


def per_event_us(spent: Mapping[str, float], events: int) -> dict[str, float]:
    """CPU seconds by component as microseconds per event, with their ``total``; the
    components that spent nothing left out."""
    figures = {name: round(seconds / events * 1e6, 2) for name, seconds in spent.items()
               if seconds > 0}
    return {**figures, "total": round(sum(spent.values()) / events * 1e6, 2)}


def describe_cpu(figures: Mapping[str, float]) -> str:
    """``per_event_us``' figures, the largest first: ``total 26.1 µs: postgres 6.2, ...``."""
    parts = sorted(((us, name) for name, us in figures.items() if name != "total"),
                   reverse=True)
    return (f"total {figures.get('total', 0.0):.1f} µs: "
            + ", ".join(f"{name} {us:.1f}" for us, name in parts))


def _descendants(roots: list[int], tree: dict[int, list[int]]) -> set[int]:
    found, pending = set(), list(roots)
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(tree.get(pid, []))
    return found


class CoreMeter:
    """Cores each component of this process's tree uses from the meter's start
    (``cpu_by_component``): the process trees of ``named_roots`` under their names, the
    stack's broker, Connect worker and Postgres by their command lines, the rest (this
    process included) as ``other``."""

    def __init__(self, named_roots: dict[str, list[int]]) -> None:
        self._named_roots = named_roots
        self._started = time.monotonic()
        self._before = cpu_by_component(named_roots)

    def used(self) -> dict[str, float]:
        seconds = time.monotonic() - self._started
        spent = cpu_between(self._before, cpu_by_component(self._named_roots))
        return {name: round(used / seconds, 3) for name, used in spent.items()}


EXECUTOR_MARKS = ("pyspark.daemon", "pyspark.worker", "CoarseGrainedExecutorBackend")
"""What a process's command line holds when it runs tasks: Spark's Python workers, and a
cluster's executor JVMs."""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


class PeakMemory:
    """Samples the RSS of this process's tree (minus ``exclude``, plus the trees of ``also``:
    a Spark cluster's master and workers, whose executors are theirs) in the background: the
    peak of the whole, and apart the peaks of the driver (this process, its JVM) and of the
    executors (Python workers and executor JVMs, with what they start)."""

    def __init__(self, exclude: frozenset[int] = frozenset(), interval_s: float = 0.25,
                 also: frozenset[int] = frozenset()) -> None:
        self.exclude, self.interval_s, self.peak = exclude, interval_s, 0
        self.also = also
        self.driver_peak = self.executor_peak = 0
        self.at_peak: dict[int, tuple[str, int]] = {}
        self.at_driver_peak: dict[int, tuple[str, int]] = {}
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
            for root in self.also:
                sample.update(tree_rss(root, self.exclude))
            total = sum(rss for _, rss in sample.values())
            if total > self.peak:
                self.peak, self.at_peak = total, sample
            executors = _executors(set(sample))
            executor_rss = sum(rss for pid, (_, rss) in sample.items() if pid in executors)
            self.executor_peak = max(self.executor_peak, executor_rss)
            if total - executor_rss > self.driver_peak:
                self.driver_peak = total - executor_rss
                self.at_driver_peak = {pid: found for pid, found in sample.items()
                                       if pid not in executors}

    def describe_peak(self) -> str:
        """Who held the memory at the peak: ``java 1,234 MB, python3 456 MB, ...``."""
        return _describe(self.at_peak)

    def describe_driver_peak(self) -> str:
        """The same at the driver's peak: its Python process and its JVM."""
        return _describe(self.at_driver_peak)


def _describe(sample: dict[int, tuple[str, int]]) -> str:
    parts = sorted(((rss, name) for name, rss in sample.values()), reverse=True)
    return ", ".join(f"{name} {rss / 2**20:,.0f} MB" for rss, name in parts if rss)


def _executors(pids: set[int]) -> set[int]:
    """Of ``pids``, the executor processes (``EXECUTOR_MARKS``) and their descendants."""
    tree = process_tree()
    found: set[int] = set()
    pending = [pid for pid in pids if any(mark in _cmdline(pid) for mark in EXECUTOR_MARKS)]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found.add(pid)
            pending.extend(tree.get(pid, []))
    return found & pids


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
                       connect_url=endpoints.connect_url), root
    finally:
        stack.down()


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def run_wrk(url: str, lua: str, connections: int, seconds: int, workdir: Path,
            threads: int = 1) -> WrkResult:
    """Drive ``url`` with wrk (a C load generator: like pgbench, it leaves the CPU to the
    server under test) running the request script ``lua``."""
    script = workdir / f"wrk-{abs(hash(lua))}.lua"
    script.write_text(lua)
    output = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
         str(script), url], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    socket_errors = re.search(r"Socket errors: (.*)", output)
    if socket_errors:
        log.warning("wrk %s: socket errors %s", url, socket_errors.group(1))
    return WrkResult(
        requests_per_s=float(_found(r"Requests/sec:\s+([\d.]+)", output)),
        p50_ms=_ms(_found(r"\s50%\s+([\d.]+\w+)", output)),
        p99_ms=_ms(_found(r"\s99%\s+([\d.]+\w+)", output)),
        errors=int(errors.group(1)) if errors else 0)


def _found(pattern: str, output: str) -> str:
    match = re.search(pattern, output)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    return match.group(1)


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def names_of(choices: tuple[str, ...], what: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated choice of ``choices``; an unknown name is refused
    by name."""
    def named(text: str) -> tuple[str, ...]:
        chosen = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in chosen if name not in choices]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(
                f"unknown {what}(s) {', '.join(unknown) or '(none given)'}: choose of "
                f"{', '.join(choices)}")
        return chosen
    return named


def log_projection_runs(level: str = "INFO") -> None:
    """The bench's own lines at INFO; the runners' batch lines at ``level`` (DEBUG: each
    batch's phase times, the tasks' included); the chatty libraries at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for running in ("eventfold.projections.runner", "eventfold.projections.progress"):
        logging.getLogger(running).setLevel(level)
    for noisy in ("py4j", "alembic", "eventfold.outbox.topics"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
