"""Projections at the cardinality users have, on a stack of its own: N events over K keys (by
default 1,000,000 over 1,000,000: an aggregate with one event), 4 partitions, beside the same
run's plain single-process confluent-kafka loop folding them into a dict.

For the fold and the aggregation: the streaming run (steady state, after the first batch), a
replay from the topics (end to end, switch included), and a replay of the fold from the event
store (the events written to it by COPY). For each: events/s and its ratio to the plain loop.
And the peak RSS of the driver (this process and its JVM; the producer, the store's loading
and the plain loop run in processes of their own) and of the executors (Spark's Python
workers), to show that the driver's memory does not grow with the keys.
With ``--peers``, Kafka Streams (1 and 2 stream threads) and Quix Streams fold the same
topic in the same run (``bench/peers/``, built once by ``bench/peers/setup.sh``), each checked
against the events produced, and every figure of ours is also a ratio to each of them
(``--peers kafka_streams_1t,kafka_streams_2t``: those named only).
Prints figures, then one JSON line.

    .venv/bin/python -m bench.scale [--events 1000000] [--keys 1000000]
    .venv/bin/python -m bench.scale --events 10000000 --keys 5000000 --skip-store --peers
    .venv/bin/python -m bench.scale --events 10000000 --keys 5000000 --only streaming_aggregation
    .venv/bin/python -m bench.scale --cluster    # on the cluster stack (stack up --cluster)
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.common import (
    PeakMemory,
    describe_cpu,
    in_a_process,
    log_projection_runs,
    names_of,
)
from bench.projections import (
    BatchClock,
    add_distribution_argument,
    add_peers_argument,
    against_peers,
    bench_stats,
    bench_totals,
    plain_python_fold_parallel,
    produce_events,
    run_peers,
    streaming,
    write_history,
)
from eventfold import migrations
from eventfold.config import Settings
from eventfold.local_stack import LocalStack
from eventfold.local_stack.stack import CLUSTER
from eventfold.outbox.connection import KafkaConnection
from eventfold.projections import Projection
from eventfold.projections.execution.limits import REPLAY_MAX_ROWS, STREAMING_MAX_ROWS
from eventfold.projections.execution.spark import spark_session
from eventfold.projections.replay import replay
from eventfold.projections.run_settings import RunnerSettings
from eventfold.wiring import spark_conf

T = TypeVar("T")
log = logging.getLogger("bench")


MODES = ("streaming_fold", "replay_fold", "streaming_aggregation", "replay_aggregation",
         "replay_from_store")


def measured(memory: list[tuple[str, PeakMemory]], name: str, stack_pids: frozenset[int],
             work: Callable[[], T], cluster_pids: frozenset[int] = frozenset()) -> T:
    """``work()``, its process tree's peak memory (and a Spark cluster's, whose executors run
    there) recorded under ``name``."""
    with PeakMemory(exclude=stack_pids, also=cluster_pids) as peak:
        result = work()
    memory.append((name, peak))
    log.info("%s: driver peak %s MB (%s), executors peak %s MB", name,
             f"{peak.driver_peak / 2**20:,.0f}", peak.describe_driver_peak(),
             f"{peak.executor_peak / 2**20:,.0f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    add_distribution_argument(parser)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--cluster", action="store_true",
                        help="run on the cluster stack, as `eventfold stack up --cluster` starts "
                             "it: three brokers, two Connect workers, and a Spark standalone "
                             "master with two workers (1 core each); the master given is ignored")
    parser.add_argument("--skip-store", action="store_true",
                        help="leave out the replay from the event store")
    add_peers_argument(parser)
    parser.add_argument("--log-level", default="INFO", help="DEBUG: phase times per batch")
    parser.add_argument("--only", type=names_of(MODES, "mode"), default=MODES,
                        help="the modes to run, comma-separated, of " + ", ".join(MODES))
    args = parser.parse_args()
    log_projection_runs(args.log_level)
    with tempfile.TemporaryDirectory(prefix="eventfold-scale-") as tmp:
        stack = LocalStack(Path(tmp) / "stack")
        endpoints = stack.up(CLUSTER if args.cluster else None, spark_cluster=args.cluster)
        try:
            migrations.upgrade(endpoints.database_url)
            cluster = stack.spark.state()
            if cluster is not None:
                args.master = cluster.master_url
            run(args, endpoints.database_url, KafkaConnection.of(endpoints.kafka_bootstrap),
                Path(tmp), frozenset({endpoints.postgres_pid, endpoints.broker_pid,
                                      endpoints.connect_pid, *endpoints.more_pids.values()}),
                frozenset(node.pid for node in cluster.nodes) if cluster else frozenset())
        finally:
            stack.down()


def run(args: argparse.Namespace, database_url: str, kafka: KafkaConnection, work_dir: Path,
        stack_pids: frozenset[int], cluster_pids: frozenset[int]) -> None:
    # The bench's own work runs in processes of their own: the producer's buffers and the
    # plain loop's dict of every key would stay in this one's heap and count as the driver's.
    in_a_process(produce_events, kafka, args.events, args.keys, args.partitions,
                 distribution=args.distribution)
    plain = plain_python_fold_parallel(kafka, args.partitions, processes=1)
    print(f"{args.events:,} events over {args.keys:,} keys ({args.distribution}); plain Python "
          f"fold (one process, confluent-kafka loop into a dict): {plain:,.0f} events/s",
          flush=True)
    plain_two = plain_python_fold_parallel(kafka, args.partitions, processes=2)
    print(f"the same loop in two processes, the partitions shared out: {plain_two:,.0f} "
          f"events/s", flush=True)
    peer_runs = run_peers(kafka, database_url, args) if args.peers else {}
    settings = RunnerSettings(kafka=kafka, database_url=database_url,
                              trigger_interval="200 milliseconds",
                              max_rows_per_batch=STREAMING_MAX_ROWS)
    replay_settings = RunnerSettings(**{**settings.__dict__,
                                        "max_rows_per_batch": REPLAY_MAX_ROWS})
    spark = spark_session(args.master, app_name="eventfold-scale",
                          extra_conf=spark_conf(Settings.from_env()))
    memory: list[tuple[str, PeakMemory]] = []
    figures: dict[str, float] = {}
    cpu_figures: dict[str, float] = {}

    def measure(name: str, work: Callable[[], T]) -> T:
        return measured(memory, name, stack_pids, work, cluster_pids)

    def report(name: str, rate: float) -> None:
        figures[f"{name}_events_per_s"] = round(rate)
        print(f"{name.replace('_', ' ')}: {rate:,.0f} events/s ({rate / plain:.2f}x the plain "
              f"loop)", flush=True)

    def replay_from_store() -> float:
        in_a_process(write_history, database_url, args.events, args.keys, args.distribution)
        return float(args.events) / measure("replay from the event store", lambda: replay(
            spark, bench_totals, replay_settings, source="store")).seconds

    def streaming_with_cpu(name: str, definition: Projection) -> float:
        """A streaming run; what each component's CPU cost an event in its steady state."""
        clock = BatchClock(measure_cpu=True)
        rate = measure(name.replace("_", " "), lambda: streaming(
            spark, settings, definition, args.events, clock))
        cpu = clock.steady_cpu_us_per_event()
        cpu_figures.update({f"{name}_cpu_{part}_us_per_event": us for part, us in cpu.items()})
        print(f"{name.replace('_', ' ')}, CPU per event in the steady state: "
              f"{describe_cpu(cpu)}", flush=True)
        return rate

    modes: dict[str, Callable[[], float]] = {
        "streaming_fold": lambda: streaming_with_cpu("streaming_fold", bench_totals),
        "replay_fold": lambda: measure("replay of the fold", lambda: replay(
            spark, bench_totals, replay_settings)).events_per_s,
        "streaming_aggregation": lambda: streaming_with_cpu("streaming_aggregation",
                                                           bench_stats),
        "replay_aggregation": lambda: measure("replay of the aggregation", lambda: replay(
            spark, bench_stats, replay_settings)).events_per_s,
        "replay_from_store": replay_from_store}
    for name, rate in modes.items():
        if name in args.only and not (args.skip_store and name == "replay_from_store"):
            report(name, rate())
    spark.stop()
    driver_mb = max(peak.driver_peak for _, peak in memory) / 2**20
    executor_mb = max(peak.executor_peak for _, peak in memory) / 2**20
    print(f"peak RSS: driver (this process, its JVM) {driver_mb:,.0f} MB, executors (Spark's "
          f"Python workers) {executor_mb:,.0f} MB", flush=True)
    ours = {name.removesuffix("_events_per_s"): rate for name, rate in figures.items()}
    print(json.dumps({
        **figures,
        **{f"{name}_vs_plain_ratio": round(rate / plain, 2) for name, rate in ours.items()},
        **against_peers(peer_runs, ours),
        **cpu_figures,
        "plain_python_fold_events_per_s": round(plain),
        "plain_python_fold_2_processes_events_per_s": round(plain_two), "events": args.events,
        "keys": args.keys, "distribution": args.distribution,
        "driver_peak_rss_mb": round(driver_mb),
        "executor_peak_rss_mb": round(executor_mb), "master": args.master}))


if __name__ == "__main__":
    main()
