"""Projection engine benchmark on a stack of its own: 1,000,000 events, 10,000 keys, 4
partitions, side by side with a plain single-process Python fold of the same events.

Measures: the streaming fold into Postgres + KTable (steady state, after the first batch),
the same fold receiving the domain's event class instead of the raw ``Event``
(``--typed-only``: those two alone), a replay of that Python-fold projection and of a
Spark-aggregation projection (end to end, switch included), a replay of the Python fold from
the event store (the same events written to it by COPY; the topics, read after it, bring
them all again as duplicates), a plain confluent-kafka loop folding into a dict (in one
process, and in two at once: the engine's two tasks share the machine the same way), and the
peak memory of this process tree (Spark's JVM and Python workers; the stack's own processes
left out). With ``--peers``, Kafka Streams (1 and 2 stream threads) and Quix Streams fold the
same topic in the same run, their totals checked (``bench/peers/``, built once by
``bench/peers/setup.sh``), and every figure of ours is also a ratio to each of them
(``--peers quix``: those named only).
Prints figures, then one JSON line.

    .venv/bin/python -m bench.projections [--events 1000000] [--keys 10000] [--typed-only]
                                          [--peers [PEER,...]]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import BigInteger

from bench import peers
from bench.common import (
    PeakMemory,
    cpu_between,
    cpu_by_component,
    describe_cpu,
    log_projection_runs,
    names_of,
    per_event_us,
    together,
)
from bench.keys import (
    DISTRIBUTIONS,
    Distribution,
    key_indices,
    versions_before,
)
from bench.peers.both_sinks import both_sinks
from eventfold import migrations
from eventfold.config import Settings
from eventfold.contract import EventEnvelope, event_topic, libpq_url
from eventfold.local_stack import LocalStack
from eventfold.metrics import PROCESS_COLLECTORS, exposition
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import consumer_config
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.projections import Count, Event, Max, Projection, State, Sum, aggregation, projection
from eventfold.projections.execution.limits import REPLAY_MAX_ROWS, STREAMING_MAX_ROWS
from eventfold.projections.execution.spark import spark_session
from eventfold.projections.metrics import ProjectionLag
from eventfold.projections.replay import ReplayResult, replay
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from eventfold.projections.running_query import stop_gracefully
from eventfold.projections.state.stage import StagedBatch
from eventfold.wiring import spark_conf

SOURCE = "BenchSale"
TARGETS = {"streaming": 150_000, "replay_aggregation": 250_000, "replay_python_fold": 150_000,
           "peak_rss_mb": 3072}


@projection("bench_totals", sources=[SOURCE],
            columns={"total": BigInteger(), "sales": BigInteger()})
def bench_totals(state: State | None, event: Event) -> State | None:
    current = state or {"total": 0, "sales": 0}
    return {"total": current["total"] + event.data["value"], "sales": current["sales"] + 1}


@dataclass(frozen=True)
class SaleRecorded:
    """The bench's events as a domain's own class (a ``DomainEvent`` is one; this one stays
    out of the write side's registry)."""

    event_type: ClassVar[str] = "SaleRecorded"
    product: str
    value: int

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SaleRecorded:
        return cls(**data)


@projection("bench_totals_typed", sources=[SOURCE], event_types=[SaleRecorded],
            columns={"total": BigInteger(), "sales": BigInteger()})
def bench_totals_typed(state: State | None, event: SaleRecorded) -> State | None:
    current = state or {"total": 0, "sales": 0}
    return {"total": current["total"] + event.value, "sales": current["sales"] + 1}


bench_stats = aggregation(
    "bench_stats", sources=[SOURCE],
    aggregates={"revenue": Sum("value"), "sales": Count(), "largest": Max("value")},
    columns={"revenue": BigInteger(), "sales": BigInteger(), "largest": BigInteger()})


def produce_events(kafka: KafkaConnection, events: int, keys: int, partitions: int,
                   after: int = 0, source: str = SOURCE,
                   distribution: Distribution = "uniform") -> float:
    """Events of aggregate type ``source`` at global positions ``after + 1`` on, each of the
    key ``bench.keys`` gives it (each key's versions go on from the events before ``after``).
    Returns events/s."""
    topic = event_topic(source)
    TopicAdmin(kafka).ensure([topic], EVENT_TOPIC_CONFIG, partitions=partitions)
    producer = Producer(kafka.client_config(**{
        "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
        "queue.buffering.max.messages": 1_000_000}))
    versions = versions_before(after, keys, distribution)
    started = time.perf_counter()
    for position, k in enumerate(key_indices(events, keys, distribution, after), after + 1):
        versions[k] += 1
        key, value = EventEnvelope(
            event_id=f"e{position}", event_type="SaleRecorded", stream_id=f"product-{k}",
            stream_version=versions[k], global_position=position, recorded_at="",
            data={"product": f"product-{k}", "value": position % 97 + 1}).encode()
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=k % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return events / (time.perf_counter() - started)


def write_history(database_url: str, events: int, keys: int,
                  distribution: Distribution = "uniform") -> float:
    """The same events, in the event store only (as if the topics had dropped them), by COPY.
    Returns events/s."""
    versions = [0] * keys
    started = time.perf_counter()
    with psycopg.connect(libpq_url(database_url)) as conn, conn.cursor() as cursor, \
            cursor.copy("COPY events (event_id, stream_id, stream_type, stream_version, "
                        "event_type, data) FROM STDIN") as copy:
        for position, k in enumerate(key_indices(events, keys, distribution), 1):
            versions[k] += 1
            copy.write_row((uuid.uuid4(), f"product-{k}", SOURCE, versions[k], "SaleRecorded",
                            json.dumps({"product": f"product-{k}",
                                        "value": position % 97 + 1})))
    return events / (time.perf_counter() - started)


def plain_python_fold(kafka: KafkaConnection, partitions: Sequence[int],
                      ready: Callable[[], None] = lambda: None) -> tuple[int, float]:
    """The baseline: a confluent-kafka loop folding ``partitions`` into a dict, in this
    process. Calls ``ready`` once connected; returns (events folded, seconds)."""
    consumer = Consumer(consumer_config(kafka, **{"enable.partition.eof": False,
                                                      "fetch.wait.max.ms": 100}))
    topic = event_topic(SOURCE)
    events = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
                 for p in partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    ready()
    states: dict[str, State | None] = {}
    seen = 0
    started = time.perf_counter()
    while seen < events:
        for message in consumer.consume(10_000, 1.0):
            envelope = EventEnvelope.decode(message.key(), message.value())
            event = Event(type=envelope.event_type, data=envelope.data,
                          stream_id=envelope.stream_id, stream_version=envelope.stream_version,
                          event_id=envelope.event_id, global_position=envelope.global_position)
            states[event.stream_id] = bench_totals.apply(states.get(event.stream_id), event)
            seen += 1
    seconds = time.perf_counter() - started
    consumer.close()
    return seen, seconds


def plain_python_fold_parallel(kafka: KafkaConnection, partitions: int, processes: int) -> float:
    """The same loop in ``processes`` processes at once, the partitions shared out: what the
    machine's cores give this work together, to read the engine's figures against."""
    return together(plain_python_fold, [(kafka, list(range(n, partitions, processes)))
                                        for n in range(processes)], timeout_s=600)


class BatchClock:
    """Records when each batch finished and how many events it covered, and with
    ``measure_cpu`` what each component had spent by then (``cpu_by_component``)."""

    def __init__(self, log_each: bool = True, measure_cpu: bool = False) -> None:
        self.batches: list[tuple[float, int]] = []
        self.cpu: list[dict[str, float]] = []
        self.log_each = log_each
        self.measure_cpu = measure_cpu

    def add(self, batch_id: int, records: int, batch: StagedBatch,
            phases: Mapping[str, float]) -> None:
        self.batches.append((time.perf_counter(), records))
        if self.measure_cpu:
            self.cpu.append(cpu_by_component())
        if self.log_each:
            logging.getLogger("bench").info("batch %d: %d events", batch_id, records)

    def close(self) -> None:
        """The figures stay readable after the run."""

    @property
    def events(self) -> int:
        return sum(n for _, n in self.batches)

    def steady_rate(self) -> float:
        """Events per second after the first batch (which pays for Python worker start)."""
        (first_end, _), *rest = self.batches
        return sum(n for _, n in rest) / (rest[-1][0] - first_end) if rest else 0.0

    def steady_cpu_us_per_event(self) -> dict[str, float]:
        """Over the batches ``steady_rate`` counts, the CPU each component spent per event,
        in microseconds (``measure_cpu``)."""
        events = sum(n for _, n in self.batches[1:])
        if len(self.cpu) < 2 or not events:
            return {}
        return per_event_us(cpu_between(self.cpu[0], self.cpu[-1]), events)


def streaming(spark, settings: RunnerSettings, definition: Projection, events: int,  # noqa: ANN001
              clock: BatchClock | None = None) -> float:
    clock = clock or BatchClock()
    runner = ProjectionRunner(spark, definition, settings, progress=clock)
    query = runner.start()
    try:
        while clock.events < events:
            if not query.isActive:
                raise RuntimeError(f"streaming query died: {query.exception()}")
            time.sleep(0.05)
    finally:
        stop_gracefully(query)
        runner.close()
    return clock.steady_rate()


def metrics_on_and_off(spark, settings: RunnerSettings, definition: Projection,  # noqa: ANN001
                       events: int) -> tuple[float, float]:
    """The streaming fold with Prometheus metrics off, then on (each batch recorded, the lag
    collector registered and scraped every second, as Prometheus would), each under a fresh
    name so that both fold every event."""
    off = streaming(spark, dataclasses.replace(settings, metrics=False),
                    renamed(definition, "metrics_off"), events)
    on_definition = renamed(definition, "metrics_on")
    # What the figure says is not checked here (the metrics test does): its cost is what
    # counts, the same whatever the committed offsets.
    lag = ProjectionLag(settings.kafka, on_definition.name, on_definition.source_topics, dict)
    PROCESS_COLLECTORS.register(lag)
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            exposition()
    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        on = streaming(spark, settings, on_definition, events)
    finally:
        stop.set()
        scraper.join()
        PROCESS_COLLECTORS.unregister(lag)
    return on, off


def renamed(definition: Projection, suffix: str) -> Projection:
    return dataclasses.replace(definition, name=f"{definition.name}_{suffix}", table="",
                               ktable_topic="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    add_distribution_argument(parser)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-rows-per-batch", type=int, default=STREAMING_MAX_ROWS)
    parser.add_argument("--replay-max-rows-per-batch", type=int, default=REPLAY_MAX_ROWS)
    parser.add_argument("--master", default="local[2]",
                        help="Spark master: local[2], or a cluster's spark://host:port")
    parser.add_argument("--cluster", action="store_true",
                        help="start a Spark standalone master and two workers (1 core each) "
                             "beside the stack and run on them (the master given is ignored)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG: phase times per batch")
    add_peers_argument(parser)
    parser.add_argument("--typed-only", action="store_true",
                        help="only the streaming fold with raw and with typed events")
    args = parser.parse_args()
    if args.events <= args.max_rows_per_batch:
        parser.error(f"--events {args.events} fit in one batch: the steady-state rate leaves "
                     "the first batch out, so give more events than --max-rows-per-batch "
                     f"({args.max_rows_per_batch})")
    log_projection_runs(args.log_level)
    with tempfile.TemporaryDirectory(prefix="eventfold-bench-") as tmp:
        stack = LocalStack(Path(tmp) / "stack")
        endpoints = stack.up(spark_cluster=args.cluster)
        try:
            migrations.upgrade(endpoints.database_url)
            stack_pids = frozenset({endpoints.postgres_pid, endpoints.broker_pid,
                                    endpoints.connect_pid})
            cluster = stack.spark.state()
            if cluster is not None:
                args.master = cluster.master_url
            run(args, endpoints.database_url, KafkaConnection.of(endpoints.kafka_bootstrap),
                Path(tmp), stack_pids,
                frozenset(node.pid for node in cluster.nodes) if cluster else frozenset())
        finally:
            stack.down()


def run(args: argparse.Namespace, database_url: str, kafka: KafkaConnection, work_dir: Path,
        stack_pids: frozenset[int], cluster_pids: frozenset[int]) -> None:
    produce_rate = produce_events(kafka, args.events, args.keys, args.partitions,
                                  distribution=args.distribution)
    print(f"produced {args.events:,} events ({args.keys:,} keys, {args.distribution}, "
          f"{args.partitions} partitions) "
          f"at {produce_rate:,.0f} events/s", flush=True)
    seen, seconds = plain_python_fold(kafka, range(args.partitions))
    plain = seen / seconds
    print(f"plain Python fold (one process, confluent-kafka loop into a dict): "
          f"{plain:,.0f} events/s", flush=True)
    plain_two = plain_python_fold_parallel(kafka, args.partitions, processes=2)
    print(f"the same loop in two processes at once, the partitions shared out: "
          f"{plain_two:,.0f} events/s ({plain_two / plain:.2f}x one process: what two busy "
          f"cores give here)", flush=True)
    peer_runs = run_peers(kafka, database_url, args) if args.peers else {}

    settings = RunnerSettings(kafka=kafka, database_url=database_url,
                              trigger_interval="200 milliseconds",
                              max_rows_per_batch=args.max_rows_per_batch)
    replay_settings = RunnerSettings(**{**settings.__dict__,
                                        "max_rows_per_batch": args.replay_max_rows_per_batch})
    with PeakMemory(exclude=stack_pids, also=cluster_pids) as memory:
        spark = spark_session(args.master, app_name="eventfold-bench",
                              extra_conf=spark_conf(Settings.from_env()))
        stream_rate = streaming(spark, settings, bench_totals, args.events)
        print(f"streaming Python fold into Postgres + KTable, steady state: "
              f"{stream_rate:,.0f} events/s", flush=True)
        typed_rate = streaming(spark, settings, bench_totals_typed, args.events)
        print(f"the same fold receiving the domain's event class (SaleRecorded): "
              f"{typed_rate:,.0f} events/s ({typed_rate / stream_rate:.2f}x the raw Event)",
              flush=True)
        if args.typed_only:
            spark.stop()
            print(json.dumps({"streaming_events_per_s": round(stream_rate),
                              "streaming_typed_events_per_s": round(typed_rate),
                              "typed_vs_raw_event_ratio": round(typed_rate / stream_rate, 2),
                              **against_peers(peer_runs, {"streaming": stream_rate}),
                              "events": args.events, "keys": args.keys,
                              "distribution": args.distribution}))
            return
        metrics_on, metrics_off = metrics_on_and_off(spark, settings, bench_totals,
                                                     args.events)
        print(f"the same with Prometheus metrics off, then on (batches recorded, lag scraped "
              f"every second): {metrics_off:,.0f} / {metrics_on:,.0f} events/s "
              f"({metrics_on / metrics_off:.3f}x)", flush=True)
        fold_replay = replay(spark, bench_totals, replay_settings)
        report_replay("Python fold", fold_replay)
        agg_stream = streaming(spark, settings, bench_stats, args.events)
        print(f"streaming Spark aggregation, steady state: {agg_stream:,.0f} events/s", flush=True)
        agg_replay = replay(spark, bench_stats, replay_settings)
        report_replay("Spark aggregation", agg_replay)
        history_rate = write_history(database_url, args.events, args.keys, args.distribution)
        print(f"wrote the same {args.events:,} events to the event store at "
              f"{history_rate:,.0f} events/s", flush=True)
        store_replay = replay(spark, bench_totals, replay_settings, source="store")
        print(f"replay of the Python fold from the event store, then the topics (all "
              f"{args.events:,} seen again there, skipped as duplicates): "
              f"{store_replay.seconds:.1f} s, {args.events / store_replay.seconds:,.0f} "
              f"events/s of history", flush=True)
        spark.stop()
    peak_mb = memory.peak / 2**20
    print(f"peak RSS of this process tree (driver, Spark JVM, Python workers"
          f"{'; the cluster master, workers and executors' if cluster_pids else ''}): "
          f"{peak_mb:,.0f} MB"
          f" ({memory.describe_peak()})")
    figures = {
        "streaming_events_per_s": round(stream_rate),
        "streaming_typed_events_per_s": round(typed_rate),
        "streaming_aggregation_events_per_s": round(agg_stream),
        "replay_aggregation_events_per_s": round(agg_replay.events_per_s),
        "replay_python_fold_events_per_s": round(fold_replay.events_per_s),
        "plain_python_fold_events_per_s": round(plain),
        "plain_python_fold_2_processes_events_per_s": round(plain_two),
        "replay_from_store_events_per_s": round(args.events / store_replay.seconds),
        "peak_rss_mb": round(peak_mb),
    }
    for name, target in TARGETS.items():
        key = f"{name}_events_per_s" if name != "peak_rss_mb" else name
        ratio = figures[key] / target
        print(f"  {key}: {figures[key]:,} vs target {target:,} = {ratio:.2f}x")
    print(json.dumps({**figures, "streaming_vs_plain_python_ratio": round(stream_rate / plain, 2),
                      "typed_vs_raw_event_ratio": round(typed_rate / stream_rate, 2),
                      "streaming_metrics_on_events_per_s": round(metrics_on),
                      "streaming_metrics_off_events_per_s": round(metrics_off),
                      "streaming_metrics_on_vs_off_ratio": round(metrics_on / metrics_off, 3),
                      "streaming_vs_plain_python_2_processes_ratio": round(
                          stream_rate / plain_two, 2),
                      **against_peers(peer_runs, {
                          "streaming": stream_rate, "streaming_aggregation": agg_stream,
                          "replay_python_fold": fold_replay.events_per_s,
                          "replay_aggregation": agg_replay.events_per_s}),
                      "master": args.master, "events": args.events, "keys": args.keys,
                      "distribution": args.distribution}))


KAFKA_STREAMS_THREADS = (1, 2)
BOTH_SINKS_PROCESSES = (1, 2)
PEERS = (*(f"kafka_streams_{threads}t" for threads in KAFKA_STREAMS_THREADS), "quix",
         *(f"python_both_sinks_{processes}p" for processes in BOTH_SINKS_PROCESSES))


def add_distribution_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--distribution", choices=DISTRIBUTIONS, default="uniform",
                        help="how events fall to keys: uniform, or zipf (s = 1.1: a few hot "
                             "keys, a long tail, as real key spaces are)")


def add_peers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peers", nargs="?", type=names_of(PEERS, "peer"), const=PEERS, default=(),
        help="also run peers on the same topic (built once by bench/peers/setup.sh): all of "
             f"them, or those named, comma-separated, of {', '.join(PEERS)}")


@dataclass(frozen=True)
class PeerRun:
    events_per_s: float
    cpu_us_per_event: float
    """Every component's CPU (the peer's process, the broker's, ...) over the peer's whole
    run, start-up included, per event."""


def run_peers(kafka: KafkaConnection, database_url: str,
              args: argparse.Namespace) -> dict[str, PeerRun]:
    """The chosen peers (Kafka Streams with 1 and 2 stream threads, Quix Streams, the
    hand-written loop writing both sinks in 1 and 2 processes) over the bench's topic, each
    result checked against the events produced."""
    expected = peers.Expected.of_bench(args.events, args.keys, args.distribution)
    bootstrap, topic = kafka.bootstrap_servers, event_topic(SOURCE)
    runs: dict[str, Callable[[], float]] = {
        f"kafka_streams_{threads}t": partial(peers.kafka_streams, bootstrap, topic, threads,
                                             args.events, expected)
        for threads in KAFKA_STREAMS_THREADS}
    runs["quix"] = partial(peers.quix, bootstrap, topic, args.events, expected)
    for processes in BOTH_SINKS_PROCESSES:
        runs[f"python_both_sinks_{processes}p"] = partial(
            both_sinks, kafka, database_url, topic, args.partitions, processes, expected)
    results: dict[str, PeerRun] = {}
    for name in args.peers:
        before = cpu_by_component()
        rate = runs[name]()
        cpu = per_event_us(cpu_between(before, cpu_by_component()), args.events)
        results[name] = PeerRun(rate, cpu["total"])
        print(f"peer {name}: {rate:,.0f} events/s (its totals checked against the events "
              f"produced); CPU per event over its whole run, start-up included: "
              f"{describe_cpu(cpu)}", flush=True)
    return results


def against_peers(peer_runs: Mapping[str, PeerRun],
                  ours: Mapping[str, float]) -> dict[str, float]:
    """The peers' figures and each of ours as a ratio to each of them."""
    figures: dict[str, float] = {}
    for peer, run in peer_runs.items():
        figures[f"{peer}_events_per_s"] = round(run.events_per_s)
        figures[f"{peer}_cpu_us_per_event"] = run.cpu_us_per_event
    for name, rate in ours.items():
        for peer, run in peer_runs.items():
            figures[f"{name}_vs_{peer}_ratio"] = round(rate / run.events_per_s, 2)
            print(f"  {name} / {peer}: {rate / run.events_per_s:.2f}x")
    return figures


def report_replay(kind: str, result: ReplayResult) -> None:
    print(f"replay of the {kind} projection (v{result.old_version} -> v{result.new_version}, "
          f"switch included): {result.events:,} events in {result.seconds:.1f} s = "
          f"{result.events_per_s:,.0f} events/s", flush=True)


if __name__ == "__main__":
    main()
