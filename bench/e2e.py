"""End-to-end benchmark on a stack of its own: latency from command to read model, to KTable
and to a read-your-writes answer, where a live batch's time goes (p50 per phase), and the
rates of each stage for 20,000 events. Prints figures, then one JSON line.

    .venv/bin/python -m bench.e2e [--latency-commands 200] [--events 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import requests
from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.common import own_stack, percentile
from bench.read_api import start_read_api, wait_ready
from eventfold.config import Settings
from eventfold.contract import event_topic, libpq_url
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.outbox.connector import ConnectClient
from eventfold.outbox.kafka import OffsetPlanner, consumer_config
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from eventfold.projections.running_query import stop_gracefully
from eventfold.projections.state.stage import StagedBatch
from eventfold.serving import BackgroundServer
from eventfold.wiring import connector_spec
from examples.inventory import ReceiveStock, app, inventory_totals

WARMUP_COMMANDS = 40


class PhaseLog:
    """The phases of each batch the live projection commits (``Progress``)."""

    def __init__(self) -> None:
        self.batches: list[Mapping[str, float]] = []
        self.recording = False

    def add(self, batch_id: int, records: int, batch: StagedBatch,
            phases: Mapping[str, float]) -> None:
        if self.recording:
            self.batches.append(phases)

    def close(self) -> None:
        """The figures stay readable after the run."""

    def p50_ms(self) -> dict[str, float]:
        names = sorted({name for phases in self.batches for name in phases})
        return {name: percentile([phases.get(name, 0.0) * 1000 for phases in self.batches], .5)
                for name in names}


@dataclasses.dataclass
class Latencies:
    read_model_ms: list[float]
    ktable_ms: list[float]
    min_version_extra_ms: list[float]
    """A ``min_version`` read's answer after the row was there (the poller's view)."""
    phases_p50_ms: dict[str, float]


class KTableWatch:
    """When each ``lat-`` key first shows on the projection's KTable topic."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.seen: dict[str, float] = {}
        self._done = threading.Event()
        planner = OffsetPlanner(settings.kafka)
        try:
            ends = planner.end_offsets(planner.partitions([topic]))
        finally:
            planner.close()
        self._consumer = Consumer(consumer_config(settings.kafka, **{
            "enable.partition.eof": False, "fetch.wait.max.ms": 5}))
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in ends.items()])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            for message in self._consumer.consume(1000, timeout=0.05):
                key = message.key()
                if message.error() is None and key and key.startswith(b"lat-"):
                    self.seen.setdefault(key.decode(), time.perf_counter())

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        self._consumer.close()



def measure_latency(settings: Settings, runner: ProjectionRunner, phases: PhaseLog,
                    commands: int, work_dir: Path) -> Latencies:
    """Commands at ~20/s over HTTP; a poller notes when each product's row appears, a consumer
    when its KTable record does, and a ``min_version`` read sent after each command (to
    ``eventfold serve reads`` in a process of its own, as deployed) when it is answered."""
    server = BackgroundServer(app.runtime(settings).command_api(), "127.0.0.1",
                              free_port()).start()
    reads_pid, reads_url = start_read_api(settings, 1, work_dir / "read_api.log")
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    answered: dict[str, float] = {}
    done = threading.Event()

    def read_own_write(key: str, version: int) -> None:
        requests.get(f"{reads_url}/read-models/inventory_totals/rows/{key}",
                     params={"min_version": version}, timeout=30).raise_for_status()
        answered[key] = time.perf_counter()

    def poll() -> None:
        with psycopg.connect(libpq_url(settings.database_url), autocommit=True) as conn:
            while not done.is_set():
                now = time.perf_counter()
                for (key,) in conn.execute(
                        "SELECT key FROM inventory_totals WHERE key LIKE 'lat-%'"):
                    seen.setdefault(key, now)
                time.sleep(0.002)

    wait_ready(reads_url, reads_pid)
    query = runner.start()
    session = requests.Session()
    # Warm-up: the first micro-batches start Spark's Python workers (seconds each); spread
    # keys over every partition so that all readers are warm before measuring.
    for i in range(WARMUP_COMMANDS):
        session.post(f"{server.url}/commands/ReceiveStock",
                     json={"product": f"warmup-{i}", "quantity": 1}, timeout=10
                     ).raise_for_status()
        time.sleep(0.1)
    with psycopg.connect(libpq_url(settings.database_url), autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM inventory_totals WHERE key LIKE 'warmup-%'"
                           ).fetchone()[0] < WARMUP_COMMANDS:
            time.sleep(0.05)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    ktable = KTableWatch(settings, inventory_totals.ktable_topic_for(runner.version))
    phases.recording = True
    try:
        with ThreadPoolExecutor(8) as readers:
            for i in range(commands):
                key = f"lat-{i:05d}"
                sent[key] = time.perf_counter()
                response = session.post(f"{server.url}/commands/ReceiveStock",
                                        json={"product": key, "quantity": 1}, timeout=10)
                response.raise_for_status()
                readers.submit(read_own_write, key, response.json()["version"])
                time.sleep(0.05)
            deadline = time.monotonic() + 120
            while (len(seen) < commands or len(ktable.seen) < commands) and (
                    time.monotonic() < deadline):
                time.sleep(0.05)
    finally:
        phases.recording = False
        done.set()
        poller.join()
        ktable.stop()
        stop_gracefully(query)
        server.stop()
        stop_pid(reads_pid, what="read API")
    return Latencies(
        [(seen[k] - sent[k]) * 1000 for k in sent if k in seen],
        [(ktable.seen[k] - sent[k]) * 1000 for k in sent if k in ktable.seen],
        [(answered[k] - seen[k]) * 1000 for k in answered if k in seen],
        phases.p50_ms())


def append_commands(settings: Settings, events: int, clients: int) -> float:
    bus = app.runtime(settings).command_bus()
    keys = [f"thr-{i % 1000:04d}" for i in range(events)]
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda k: bus.execute(ReceiveStock(product=k, quantity=1)), keys))
    return events / (time.perf_counter() - started)


def count_on_topic(settings: Settings, prefix: str, expected: int, timeout_s: float = 300,
                   ) -> tuple[int, float]:
    """Consume the event topic until ``expected`` distinct events of ``prefix`` arrived."""
    topic = event_topic("Product")
    planner = OffsetPlanner(settings.kafka)
    partitions = planner.partitions([topic])
    planner.close()
    consumer = Consumer(
        consumer_config(settings.kafka, **{"enable.partition.eof": False}))
    consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
    event_ids: set[str] = set()
    last_arrival = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while len(event_ids) < expected and time.monotonic() < deadline:
        for message in consumer.consume(10_000, timeout=0.2):
            if message.error() and message.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(message.error())
            key = message.key()
            if message.error() is None and key and key.decode().startswith(prefix):
                event_ids.add(json.loads(message.value())["eventId"])
                last_arrival = time.perf_counter()
    consumer.close()
    return len(event_ids), last_arrival


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-commands", type=int, default=200)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with own_stack("eventfold-bench-") as (settings, work_dir):
        run(settings, work_dir, args)


def run(settings: Settings, work_dir: Path, args: argparse.Namespace) -> None:
    app.runtime(settings).setup()
    phases = PhaseLog()
    runner = app.runtime(settings).projection_runner("inventory_totals", phases)
    print(f"stack ready; trigger interval {settings.trigger_interval}", flush=True)

    measured = measure_latency(settings, runner, phases, args.latency_commands, work_dir)
    latencies = measured.read_model_ms
    runner.close()
    for what, values in (("read model row", latencies), ("KTable record", measured.ktable_ms)):
        print(f"command -> {what} visible, {len(values)}/{args.latency_commands} commands: "
              f"p50 {percentile(values, .5):.0f} ms, p95 {percentile(values, .95):.0f} ms, "
              f"p99 {percentile(values, .99):.0f} ms", flush=True)
    print(f"min_version read answered after the row was there: p50 "
          f"{percentile(measured.min_version_extra_ms, .5):.1f} ms, p99 "
          f"{percentile(measured.min_version_extra_ms, .99):.1f} ms", flush=True)
    print(f"a live batch, p50 per phase ({len(phases.batches)} batches): " + ", ".join(
        f"{name} {ms:.1f} ms" for name, ms in measured.phases_p50_ms.items()), flush=True)

    connect = ConnectClient(settings.connect_url)
    connector = connector_spec(settings).name
    connect.pause(connector)
    connect.wait_state(connector, "PAUSED")
    append_rate = append_commands(settings, args.events, args.clients)
    print(f"append: {args.events} single-event commands, {args.clients} clients: "
          f"{append_rate:,.0f} events/s", flush=True)

    resumed = time.perf_counter()
    connect.resume(connector)
    delivered, last_arrival = count_on_topic(settings, "thr-", args.events)
    cdc_rate = delivered / (last_arrival - resumed)
    print(f"CDC: backlog of {args.events} drained to the topic at {cdc_rate:,.0f} events/s "
          f"({delivered} distinct events delivered)", flush=True)

    fold_projection = dataclasses.replace(inventory_totals, name="bench_fold", table="",
                                          ktable_topic="")
    fold_runner = ProjectionRunner(runner.spark, fold_projection, RunnerSettings(
        kafka=settings.kafka, database_url=settings.database_url))
    fold_runner.prepare()
    started = time.perf_counter()
    query = fold_runner.start(once=True)
    query.awaitTermination()
    fold_seconds = time.perf_counter() - started
    fold_runner.close()
    runner.spark.stop()  # its Python workers' Kafka clients close before the broker stops
    total_on_topic = args.latency_commands + WARMUP_COMMANDS + delivered
    fold_rate = total_on_topic / fold_seconds
    print(f"projection fold (catch-up, Postgres + KTable): {total_on_topic} events in "
          f"{fold_seconds:.1f} s = {fold_rate:,.0f} events/s", flush=True)

    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        folded = conn.execute("SELECT coalesce(sum(quantity), 0) FROM bench_fold "
                              "WHERE key LIKE 'thr-%'").fetchone()[0]
    lost = args.events - int(folded)
    print(f"lost events: {lost} (read model total {folded} of {args.events} appended)")
    print(json.dumps({
        "e2e_p50_ms": round(percentile(latencies, .5), 1),
        "e2e_p95_ms": round(percentile(latencies, .95), 1),
        "e2e_p99_ms": round(percentile(latencies, .99), 1),
        "e2e_mean_ms": round(statistics.fmean(latencies), 1),
        "ktable_e2e_p50_ms": round(percentile(measured.ktable_ms, .5), 1),
        "ktable_e2e_p99_ms": round(percentile(measured.ktable_ms, .99), 1),
        "min_version_extra_wait_p50_ms": round(percentile(measured.min_version_extra_ms, .5), 1),
        **{f"phase_{name}_p50_ms": round(ms, 1) for name, ms in measured.phases_p50_ms.items()},
        "append_events_per_s": round(append_rate),
        "cdc_events_per_s": round(cdc_rate),
        "fold_events_per_s": round(fold_rate),
        "lost_events": lost + (args.latency_commands - len(latencies)),
        "ktable_lost_events": args.latency_commands - len(measured.ktable_ms),
    }))


if __name__ == "__main__":
    main()
