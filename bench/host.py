"""A projection host against separate runs, on a stack of its own: ``--projections`` copies of
one fold over the same topic (bench/host_app.py), run first as that many `eventfold projection
run NAME` processes (a Spark application each), then as one `eventfold projection run --all`.
For each: the memory of the process trees once every projection has caught up, and the summed
streaming throughput of folding ``--events`` new events into every projection; then, in the
host, a live projection's latency (an event's append to Kafka -> its row in the read model)
idle, while a replay of another projection over ``--replay-events``, handed to the host,
runs beside it, and while one more projection of the host (over a topic of its own) catches
up a backlog of ``--backlog`` events produced as fast as the producer goes. The host's cores,
the broker's and Postgres's are measured while every projection is idle, and while the live
probes go to every projection. Prints figures, then one JSON line.

    .venv/bin/python -m bench.host [--projections 10] [--events 100000] [--keys 10000]
        [--replay-events 500000] [--backlog 1000000] [--host-only] [--phases]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import requests
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from bench.common import CoreMeter, own_stack, percentile, tree_rss
from bench.host_app import BACKLOG_SOURCE
from bench.projections import SOURCE, produce_events
from eventfold import migrations
from eventfold.config import Settings
from eventfold.contract import EventEnvelope, event_topic, libpq_url
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.outbox.connection import KafkaConnection

TARGETS = {"host_rss_ratio": 5.0, "host_vs_separate_throughput_ratio": 1.0,
           "live_p50_during_replay_vs_idle": 1.5, "live_p50_during_catchup_vs_idle": 2.0}
WARMUP_EVENTS = 2_000
IDLE_CPU_S = 10.0
"""How long the host's idle CPU is measured, every projection caught up and nothing new."""
PARTITIONS = 4


class Phase:
    """One way of running the projections: its processes, and what they have folded."""

    def __init__(self, settings: Settings, work_dir: Path, suffix: str, projections: int,
                 separate: bool, phases: bool = False) -> None:
        self.settings, self.suffix, self.separate = settings, suffix, separate
        self.metrics_port = free_port() if phases else None
        self.names = [f"bench_totals_{suffix}_{n}" for n in range(projections)]
        self.env = {**os.environ, "EVENTFOLD_APP": "bench.host_app:app",
                    "EVENTFOLD_BENCH_PROJECTIONS": str(projections),
                    "EVENTFOLD_BENCH_SUFFIX": suffix,
                    "EVENTFOLD_DATABASE_URL": settings.database_url,
                    "EVENTFOLD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                    "EVENTFOLD_CONNECT_URL": settings.connect_url,
                    "EVENTFOLD_METRICS": "false", "PYTHONPATH": str(Path.cwd())}
        if self.metrics_port is not None:
            self.env.update({"EVENTFOLD_METRICS": "true",
                             "EVENTFOLD_METRICS_PORT": str(self.metrics_port)})
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


PHASE_FAMILIES = {"eventfold_projection_batch_phase_seconds": None,
                  "eventfold_projection_record_wait_seconds": "record_wait"}
"""The host's metrics a phase profile reads: each batch phase, and the wait before a batch."""


def phase_totals(phase: Phase) -> dict[str, tuple[float, float]]:
    """The live projection's seconds and batches so far in each phase of its batches (and in
    the wait before them), from the host's metrics."""
    text = requests.get(f"http://127.0.0.1:{phase.metrics_port}/metrics", timeout=10).text
    totals: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in PHASE_FAMILIES:
            continue
        for sample in family.samples:
            if sample.labels.get("projection") != phase.names[-1]:
                continue
            name = PHASE_FAMILIES[family.name] or sample.labels["phase"]
            seconds, batches = totals.get(name, (0.0, 0.0))
            if sample.name.endswith("_sum"):
                totals[name] = (seconds + sample.value, batches)
            elif sample.name.endswith("_count"):
                totals[name] = (seconds, batches + sample.value)
    return totals


def phase_means_ms(before: dict[str, tuple[float, float]],
                   after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean ms per batch in each phase between two ``phase_totals``."""
    means = {}
    for name, (seconds, batches) in after.items():
        seconds_before, batches_before = before.get(name, (0.0, 0.0))
        if batches > batches_before:
            means[name] = round((seconds - seconds_before) / (batches - batches_before) * 1000, 1)
    return means


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


@dataclass
class Measured:
    rss_mb: float
    ready_s: float
    events_per_s: float
    replay_s: float | None = None  # a replay handed to the host
    topic_events: int = 0  # on the topic when the live latency is first measured
    live_idle_ms: list[float] = field(default_factory=list)
    live_during_replay_ms: list[float] = field(default_factory=list)
    live_during_catchup_ms: list[float] = field(default_factory=list)
    catchup_events_per_s: float = 0.0
    phases_idle_ms: dict[str, float] = field(default_factory=dict)  # with --phases
    phases_during_replay_ms: dict[str, float] = field(default_factory=dict)
    cores_idle: dict[str, float] = field(default_factory=dict)  # nothing new anywhere
    cores_probed: dict[str, float] = field(default_factory=dict)  # the live probes only


def measure(phase: Phase, kafka: KafkaConnection, topic_events: int, events: int,
            keys: int, backlog: int = 0, replay_events: int = 0) -> Measured:
    """Memory once caught up, time to start and catch up, events/s summed over the
    projections for ``events`` new ones; for a host, a handed replay of at least
    ``replay_events`` and the live latency beside it."""
    with phase.running() as processes:
        started = time.perf_counter()
        phase.wait_until_folded(topic_events, processes)
        ready_s = time.perf_counter() - started
        rss = rss_mb(processes)
        print(f"{phase.suffix}: {len(phase.names)} projections started and caught up with "
              f"{topic_events:,} events in {ready_s:.1f} s; RSS {rss:,.0f} MB", flush=True)
        if not phase.separate:
            meter = CoreMeter({"host": [p.pid for p in processes]})
            time.sleep(IDLE_CPU_S)
            cores_idle = meter.used()
            print(f"host: cores used while every projection is idle: {describe(cores_idle)}",
                  flush=True)
        # From the first event produced: the projections fold while the producer runs.
        producing = time.perf_counter()
        produce_events(kafka, events, keys, PARTITIONS, after=topic_events)
        phase.wait_until_folded(topic_events + events, processes)
        seconds = time.perf_counter() - producing
        rss = max(rss, rss_mb(processes))
        print(f"{phase.suffix}: memory by process: {who_holds(processes)}", flush=True)
        rate = events * len(phase.names) / seconds
        print(f"{phase.suffix}: {events:,} new events into each of {len(phase.names)} "
              f"projections in {seconds:.1f} s: {rate:,.0f} events/s summed; RSS {rss:,.0f} MB",
              flush=True)
        measured = Measured(rss, ready_s, rate, topic_events=topic_events + events)
        if not phase.separate:
            measured.cores_idle = cores_idle
            if replay_events > measured.topic_events:
                # enough for the replay to outlast a few dozen probes
                produce_events(kafka, replay_events - measured.topic_events, keys, PARTITIONS,
                               after=measured.topic_events)
                phase.wait_until_folded(replay_events, processes)
                measured.topic_events = replay_events
            probe = LatencyProbe(phase, kafka, first_position=measured.topic_events + 1)
            profiled = phase.metrics_port is not None
            idle_from = phase_totals(phase) if profiled else {}
            meter = CoreMeter({"host": [p.pid for p in processes]})
            measured.live_idle_ms = probe.sample(seconds=10)
            measured.cores_probed = meter.used()
            print(f"host: cores used while the live probes go to every projection: "
                  f"{describe(measured.cores_probed)}", flush=True)
            replay_from = phase_totals(phase) if profiled else {}
            measured.replay_s, measured.live_during_replay_ms = handed_replay(phase, probe)
            if profiled:
                measured.phases_idle_ms = phase_means_ms(idle_from, replay_from)
                measured.phases_during_replay_ms = phase_means_ms(replay_from,
                                                                  phase_totals(phase))
                print(f"host: {phase.names[-1]}'s batches, mean ms per phase, idle -> during "
                      "the replay: " + ", ".join(
                          f"{name} {ms} -> {measured.phases_during_replay_ms.get(name)}"
                          for name, ms in sorted(measured.phases_idle_ms.items())), flush=True)
            print(f"host: {phase.names[-1]} live, append -> read model: p50 "
                  f"{percentile(measured.live_idle_ms, 0.5):,.0f} ms idle "
                  f"({len(measured.live_idle_ms)} events), "
                  f"{percentile(measured.live_during_replay_ms, 0.5):,.0f} ms while "
                  f"{phase.names[0]} replays ({len(measured.live_during_replay_ms)} events)",
                  flush=True)
            if backlog:
                measured.catchup_events_per_s, measured.live_during_catchup_ms = (
                    caught_up_backlog(phase, kafka, probe, backlog, keys))
                print(f"host: {phase.names[-1]} live, append -> read model: p50 "
                      f"{percentile(measured.live_during_catchup_ms, 0.5):,.0f} ms while "
                      f"bench_backlog_{phase.suffix} catches up {backlog:,} events at "
                      f"{measured.catchup_events_per_s:,.0f} events/s "
                      f"({len(measured.live_during_catchup_ms)} events)", flush=True)
    return measured


def describe(cores: dict[str, float]) -> str:
    return ", ".join([f"{name} {used:.3f}" for name, used in cores.items()]
                     + [f"total {sum(cores.values()):.2f}"])


def caught_up_backlog(phase: Phase, kafka: KafkaConnection, probe: LatencyProbe,
                      backlog: int, keys: int) -> tuple[float, list[float]]:
    """The backlog projection's events/s catching up ``backlog`` events produced as fast as
    the producer goes, and the live projection's latencies meanwhile."""
    name = f"bench_backlog_{phase.suffix}"

    def folded() -> int:
        with psycopg.connect(libpq_url(phase.settings.database_url), autocommit=True) as conn:
            try:
                return int(conn.execute(f'SELECT coalesce(sum(sales), 0) FROM "{name}"')
                           .fetchone()[0])
            except psycopg.errors.UndefinedTable:
                return 0

    producing = threading.Thread(target=produce_events, args=(
        kafka, backlog, keys, PARTITIONS), kwargs={"source": BACKLOG_SOURCE}, daemon=True)
    started = time.perf_counter()
    producing.start()
    during = probe.sample(until=lambda: folded() >= backlog)
    seconds = time.perf_counter() - started
    producing.join()
    return backlog / seconds, during


class LatencyProbe:
    """Events of new keys, ten a second at random instants (a Poisson stream, as independent
    commands arrive), into the topic the projections read; for each,
    the time from its append (acknowledged by the broker) to its row in the live projection's
    read model (the host's last projection). The CDC hop before the append is left out: it
    is the same whatever the host does (bench/cdc.py measures it)."""

    MEAN_INTERVAL_S = 0.1

    def __init__(self, phase: Phase, kafka: KafkaConnection, first_position: int) -> None:
        self.phase, self.position = phase, first_position
        # Sent at a fixed period, every probe met the stream thread's periodic look at one
        # phase for a whole run, and the idle p50 moved with that phase from run to run.
        self.intervals = random.Random(first_position)
        self.view = phase.names[-1]
        self.producer = Producer(kafka.client_config(**{"linger.ms": 0}))

    def sample(self, seconds: float | None = None,
               until: Callable[[], bool] | None = None) -> list[float]:
        """Latencies in ms of probes sent for ``seconds``, or until ``until()``, every probe
        waited for."""
        sent: dict[str, float] = {}
        latencies: list[float] = []
        started = time.monotonic()
        next_send, sending = started, True
        with psycopg.connect(libpq_url(self.phase.settings.database_url),
                             autocommit=True) as conn:
            while sending or sent:
                now = time.monotonic()
                if sending and now >= next_send:
                    sending = (now - started < seconds) if seconds is not None else not (
                        until is not None and until())
                    if sending:
                        sent[self._send()] = time.monotonic()
                        next_send += self.intervals.expovariate(1 / self.MEAN_INTERVAL_S)
                if sent:
                    for (key,) in conn.execute(f'SELECT key FROM "{self.view}" '
                                               "WHERE key = ANY(%s)", (list(sent),)):
                        latencies.append((time.monotonic() - sent.pop(key)) * 1000)
                time.sleep(0.005)
        return latencies

    def _send(self) -> str:
        key = f"probe-{self.position}"
        envelope_key, value = EventEnvelope(
            event_id=f"e{self.position}", event_type="SaleRecorded", stream_id=key,
            stream_version=1, global_position=self.position, recorded_at="",
            data={"product": key, "value": 1}).encode()
        self.position += 1
        self.producer.produce(event_topic(SOURCE), key=envelope_key, value=value)
        self.producer.flush(10)
        return key


def handed_replay(phase: Phase, probe: LatencyProbe) -> tuple[float, list[float]]:
    """Seconds of `eventfold projection replay` of the host's first projection, which the CLI
    hands to the running host, and the live projection's latencies while the host runs it."""
    started = time.perf_counter()
    replaying = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "replay",
                                  phase.names[0]], env=phase.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        wait_for_replay_state(phase, replaying)
        during = probe.sample(until=lambda: replay_state(phase) != "running")
        stdout, stderr = replaying.communicate(timeout=1800)
    finally:
        stop_pid(replaying.pid, what="projection replay", timeout_s=60)
    seconds = time.perf_counter() - started
    if replaying.returncode != 0 or "handed to the host" not in stderr:
        raise RuntimeError(f"the replay was not handed to the host:\n{stderr[-3000:]}")
    print(f"host: {stdout.strip()}; {seconds:.1f} s at the CLI", flush=True)
    if not during:
        raise RuntimeError("the replay ended before a probe saw it run: give it more --events")
    return seconds, during


def replay_state(phase: Phase) -> str | None:
    """The state of the last replay requested of the host's first projection."""
    with psycopg.connect(libpq_url(phase.settings.database_url), autocommit=True) as conn:
        row = conn.execute("SELECT state FROM projection_requests WHERE projection = %s "
                           "ORDER BY id DESC LIMIT 1", (phase.names[0],)).fetchone()
    return None if row is None else str(row[0])


def wait_for_replay_state(phase: Phase, replaying: subprocess.Popen,
                          timeout_s: float = 120) -> None:
    """Until the host runs the replay (or has run it already)."""
    deadline = time.monotonic() + timeout_s
    while replay_state(phase) in (None, "pending"):
        if replaying.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the host did not start the replay of {phase.names[0]}: "
                               f"{replaying.stderr.read()[-3000:] if replaying.stderr else ''}")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--projections", type=int, default=10)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=1_000_000,
                        help="events the backlog projection catches up beside the live ones "
                             "(0: none)")
    parser.add_argument("--replay-events", type=int, default=500_000,
                        help="events on the topic when the host replays a projection (more "
                             "are produced for it after the throughput is measured)")
    parser.add_argument("--host-only", action="store_true",
                        help="measure the host alone (no separate runs, no ratios)")
    parser.add_argument("--phases", action="store_true",
                        help="with the host's metrics on, the live projection's mean time per "
                             "batch phase idle and during the replay (metrics cost a little)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with own_stack("eventfold-bench-host-") as (settings, work_dir):
        migrations.upgrade(settings.database_url)
        kafka = settings.kafka
        produce_events(kafka, WARMUP_EVENTS, args.keys, PARTITIONS)
        # The backlog projection's topic, there before its host starts (and empty till then)
        produce_events(kafka, 0, args.keys, PARTITIONS, source=BACKLOG_SOURCE)
        host = measure(Phase(settings, work_dir, "host", args.projections, False, args.phases),
                       kafka, WARMUP_EVENTS, args.events, args.keys, args.backlog,
                       args.replay_events)
        separate = None if args.host_only else measure(
            Phase(settings, work_dir, "separate", args.projections, True),
            kafka, host.topic_events, args.events, args.keys)
    idle_p50 = percentile(host.live_idle_ms, 0.5)
    during_p50 = percentile(host.live_during_replay_ms, 0.5)
    figures: dict[str, float | int] = {
        "projections": args.projections, "events": args.events,
        "host_rss_mb": round(host.rss_mb), "host_ready_s": round(host.ready_s, 1),
        "host_events_per_s": round(host.events_per_s),
        "handed_replay_s": round(host.replay_s or 0, 1),
        "handed_replay_events": host.topic_events,
        "live_p50_idle_ms": round(idle_p50), "live_p50_during_replay_ms": round(during_p50),
        "live_p99_during_replay_ms": round(percentile(host.live_during_replay_ms, 0.99)),
        "live_p50_during_replay_vs_idle": round(during_p50 / idle_p50, 2)}
    figures.update({f"idle_{name}_cores": used for name, used in host.cores_idle.items()})
    figures["idle_total_cores"] = round(sum(host.cores_idle.values()), 3)
    figures.update({f"probed_{name}_cores": used for name, used in host.cores_probed.items()})
    for name, ms in host.phases_idle_ms.items():
        figures[f"live_{name}_idle_ms"] = ms
        figures[f"live_{name}_during_replay_ms"] = host.phases_during_replay_ms.get(name, 0)
    if host.live_during_catchup_ms:
        catchup_p50 = percentile(host.live_during_catchup_ms, 0.5)
        figures.update({
            "backlog_events": args.backlog,
            "catchup_events_per_s": round(host.catchup_events_per_s),
            "live_p50_during_catchup_ms": round(catchup_p50),
            "live_p99_during_catchup_ms": round(percentile(host.live_during_catchup_ms, 0.99)),
            "live_p50_during_catchup_vs_idle": round(catchup_p50 / idle_p50, 2)})
        print(f"live latency: p50 {figures['live_p50_during_catchup_ms']:,} ms while another "
              f"projection catches up {args.backlog:,} events against "
              f"{figures['live_p50_idle_ms']:,} ms idle: "
              f"{figures['live_p50_during_catchup_vs_idle']}x (target <= "
              f"{TARGETS['live_p50_during_catchup_vs_idle']}x)")
    print(f"live latency: p50 {figures['live_p50_during_replay_ms']:,} ms while another "
          f"projection replays against {figures['live_p50_idle_ms']:,} ms idle: "
          f"{figures['live_p50_during_replay_vs_idle']}x (target <= "
          f"{TARGETS['live_p50_during_replay_vs_idle']}x)")
    if separate is not None:
        figures.update({
            "separate_rss_mb": round(separate.rss_mb),
            "host_rss_ratio": round(separate.rss_mb / host.rss_mb, 2),
            "separate_ready_s": round(separate.ready_s, 1),
            "separate_events_per_s": round(separate.events_per_s),
            "host_vs_separate_throughput_ratio": round(
                host.events_per_s / separate.events_per_s, 2)})
        print(f"memory: one host {figures['host_rss_mb']:,} MB against {args.projections} "
              f"separate runs {figures['separate_rss_mb']:,} MB: {figures['host_rss_ratio']}x "
              f"less (target >= {TARGETS['host_rss_ratio']}x)")
        print(f"throughput: host {figures['host_events_per_s']:,} against separate "
              f"{figures['separate_events_per_s']:,} events/s summed: "
              f"{figures['host_vs_separate_throughput_ratio']}x (target >= "
              f"{TARGETS['host_vs_separate_throughput_ratio']})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
