"""A projection host against separate runs, on a stack of its own: ``--projections`` copies of
one fold over the same topic (bench/host_app.py), run first as that many `eventfold projection
run NAME` processes (a Spark application each), then as one `eventfold projection run --all`.
For each: the memory of the process trees once every projection has caught up, and the summed
streaming throughput of folding ``--events`` new events into every projection; then a replay
of one projection handed to the running host. Prints figures, then one JSON line.

    .venv/bin/python -m bench.host [--projections 10] [--events 100000] [--keys 10000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from eventfold.local_stack.process import stop_pid
from eventfold.outbox.connection import KafkaConnection

from bench.common import own_stack, tree_rss
from bench.projections import produce_events
from eventfold import migrations
from eventfold.config import Settings
from eventfold.contract import libpq_url

TARGETS = {"host_rss_ratio": 5.0, "host_vs_separate_throughput_ratio": 1.0}
WARMUP_EVENTS = 2_000
PARTITIONS = 4


class Phase:
    """One way of running the projections: its processes, and what they have folded."""

    def __init__(self, settings: Settings, work_dir: Path, suffix: str, projections: int,
                 separate: bool) -> None:
        self.settings, self.suffix, self.separate = settings, suffix, separate
        self.names = [f"bench_totals_{suffix}_{n}" for n in range(projections)]
        self.env = {**os.environ, "EVENTFOLD_APP": "bench.host_app:app",
                    "EVENTFOLD_BENCH_PROJECTIONS": str(projections),
                    "EVENTFOLD_BENCH_SUFFIX": suffix,
                    "EVENTFOLD_DATABASE_URL": settings.database_url,
                    "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                    "EVENTFOLD_CONNECT_URL": settings.connect_url,
                    "EVENTFOLD_CHECKPOINT_DIR": str(work_dir / "checkpoints"),
                    "EVENTFOLD_METRICS": "false", "PYTHONPATH": str(Path.cwd())}
        self.log_dir = work_dir / suffix
        self.log_dir.mkdir(parents=True)

    @contextmanager
    def running(self) -> Iterator[list[subprocess.Popen]]:
        runs = [[name] for name in self.names] if self.separate else [["--all"]]
        processes = []
        try:
            for n, names in enumerate(runs):
                log = (self.log_dir / f"run{n}.log").open("w")
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "eventfold.cli", "projection", "run", *names],
                    env=self.env, stdout=log, stderr=subprocess.STDOUT))
            yield processes
        finally:
            for process in processes:
                stop_pid(process.pid, what="projection run", timeout_s=120)

    def folded(self) -> list[int]:
        """Events each projection has folded (0 before its table exists)."""
        counts = []
        with psycopg.connect(libpq_url(self.settings.database_url), autocommit=True) as conn:
            for name in self.names:
                try:
                    counts.append(int(conn.execute(
                        f'SELECT coalesce(sum(sales), 0) FROM "{name}"').fetchone()[0]))
                except psycopg.errors.UndefinedTable:
                    counts.append(0)
        return counts

    def wait_until_folded(self, events: int, processes: list[subprocess.Popen],
                          timeout_s: float = 1800) -> float:
        """Seconds until every projection has folded ``events``."""
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        last_report = 0.0
        while (counts := self.folded()) and min(counts) < events:
            if any(p.poll() is not None for p in processes):
                raise RuntimeError(f"a projection run ended; see {self.log_dir}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.suffix}: folded {counts} of {events} after "
                                   f"{timeout_s:.0f} s")
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                print(f"  {self.suffix}: {sum(counts):,} of {events * len(counts):,} events "
                      "folded", flush=True)
            time.sleep(0.2)
        return time.perf_counter() - started


def rss_mb(processes: list[subprocess.Popen]) -> float:
    return sum(rss for process in processes
               for _, rss in tree_rss(process.pid).values()) / 2**20


def who_holds(processes: list[subprocess.Popen]) -> str:
    """The trees' RSS by process kind: ``java 3 x 1,234 MB, python3 12 x 456 MB``."""
    kinds: dict[str, list[int]] = {}
    for process in processes:
        for name, rss in tree_rss(process.pid).values():
            kinds.setdefault(name, []).append(rss)
    return ", ".join(f"{name} {len(sizes)} x {sum(sizes) / len(sizes) / 2**20:,.0f} MB"
                     for name, sizes in sorted(kinds.items(), key=lambda kv: -sum(kv[1])))


def measure(phase: Phase, kafka: KafkaConnection, topic_events: int, events: int,
            keys: int) -> tuple[float, float, float, float | None]:
    """(RSS in MB once caught up, seconds to start and catch up, events/s summed over the
    projections for ``events`` new ones, seconds of a replay handed to a host)."""
    with phase.running() as processes:
        started = time.perf_counter()
        phase.wait_until_folded(topic_events, processes)
        ready_s = time.perf_counter() - started
        rss = rss_mb(processes)
        print(f"{phase.suffix}: {len(phase.names)} projections started and caught up with "
              f"{topic_events:,} events in {ready_s:.1f} s; RSS {rss:,.0f} MB", flush=True)
        produce_events(kafka, events, keys, PARTITIONS, after=topic_events)
        seconds = phase.wait_until_folded(topic_events + events, processes)
        rss = max(rss, rss_mb(processes))
        print(f"{phase.suffix}: memory by process: {who_holds(processes)}", flush=True)
        rate = events * len(phase.names) / seconds
        print(f"{phase.suffix}: {events:,} new events into each of {len(phase.names)} "
              f"projections in {seconds:.1f} s: {rate:,.0f} events/s summed; RSS {rss:,.0f} MB",
              flush=True)
        replay_s = None if phase.separate else handed_replay(phase)
    return rss, ready_s, rate, replay_s


def handed_replay(phase: Phase) -> float:
    """Seconds of `eventfold projection replay` of the host's first projection, which the CLI
    hands to the running host."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "eventfold.cli", "projection", "replay",
                           phase.names[0]], env=phase.env, capture_output=True, text=True,
                          check=False, timeout=1800)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or "handed to the host" not in done.stderr:
        raise RuntimeError(f"the replay was not handed to the host:\n{done.stderr[-3000:]}")
    print(f"host: {done.stdout.strip()}; {seconds:.1f} s at the CLI", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections", type=int, default=10)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--host-only", action="store_true",
                        help="measure the host alone (no separate runs, no ratios)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with own_stack("eventfold-bench-host-") as (settings, work_dir):
        migrations.upgrade(settings.database_url)
        kafka = settings.kafka
        produce_events(kafka, WARMUP_EVENTS, args.keys, PARTITIONS)
        host = measure(Phase(settings, work_dir, "host", args.projections, False),
                       kafka, WARMUP_EVENTS, args.events, args.keys)
        if args.host_only:
            print(json.dumps({"projections": args.projections, "host_rss_mb": round(host[0]),
                              "host_ready_s": round(host[1], 1),
                              "host_events_per_s": round(host[2]),
                              "handed_replay_s": round(host[3] or 0, 1),
                              "handed_replay_events": WARMUP_EVENTS + args.events}))
            return
        separate = measure(Phase(settings, work_dir, "separate", args.projections, True),
                           kafka, WARMUP_EVENTS + args.events, args.events, args.keys)
    figures = {
        "projections": args.projections, "events": args.events,
        "separate_rss_mb": round(separate[0]), "host_rss_mb": round(host[0]),
        "host_rss_ratio": round(separate[0] / host[0], 2),
        "separate_ready_s": round(separate[1], 1), "host_ready_s": round(host[1], 1),
        "separate_events_per_s": round(separate[2]), "host_events_per_s": round(host[2]),
        "host_vs_separate_throughput_ratio": round(host[2] / separate[2], 2),
        "handed_replay_s": round(host[3] or 0, 1),
        "handed_replay_events": WARMUP_EVENTS + args.events}
    print(f"memory: one host {figures['host_rss_mb']:,} MB against {args.projections} separate "
          f"runs {figures['separate_rss_mb']:,} MB: {figures['host_rss_ratio']}x less (target "
          f">= {TARGETS['host_rss_ratio']}x)")
    print(f"throughput: host {figures['host_events_per_s']:,} against separate "
          f"{figures['separate_events_per_s']:,} events/s summed: "
          f"{figures['host_vs_separate_throughput_ratio']}x (target >= "
          f"{TARGETS['host_vs_separate_throughput_ratio']})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
