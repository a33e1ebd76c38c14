"""A replay beside the live version it replaces, as a projection host runs them: how long the
live version's commits stop while the replay builds and switches.

On a stack of its own: N events over K keys in the topics (4 partitions), folded by the live
version (the stream thread, jobs in the host's ``live`` pool); then new events arrive at a
steady rate (200/s by default, as commands would bring them) while a replay of the whole log
builds the next version (jobs in the ``replays`` pool) and switches to it. Every commit of
either version is timed: the figure is the longest gap between two commits of the projection's
active version, from the replay's start until the first commit after its switch.

    .venv/bin/python -m bench.replay_beside_live [--events 10000000] [--keys 5000000]

Prints figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from bench.common import own_stack, percentile
from bench.keys import versions_before
from bench.projections import SOURCE, BatchClock, bench_totals, produce_events
from eventfold import migrations
from eventfold.config import Settings
from eventfold.contract import EventEnvelope, event_topic
from eventfold.outbox.connection import KafkaConnection
from eventfold.projections.execution.limits import REPLAY_MAX_ROWS, STREAMING_MAX_ROWS
from eventfold.projections.execution.spark import (
    LIVE_POOL,
    REPLAY_POOL,
    SCHEDULER_POOL,
    spark_session,
)
from eventfold.projections.replay import ReplayResult, replay
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from eventfold.projections.running_query import RunningQuery, stop_gracefully
from eventfold.wiring import spark_conf

log = logging.getLogger("bench")


class SteadyEvents:
    """Events after the first ``after`` positions, at ``rate`` per second, on a thread."""

    def __init__(self, kafka: KafkaConnection, after: int, keys: int, partitions: int,
                 rate: float) -> None:
        self.kafka, self.position, self.keys = kafka, after, keys
        self.partitions, self.rate = partitions, rate
        self.versions = versions_before(after, keys)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="steady-events", daemon=True)

    def _version(self, key: int) -> int:
        """The next version of ``key``, whose events so far are those of positions up to
        ``after`` that fell to it (``bench.keys``, uniform) and those sent here."""
        self.versions[key] += 1
        return self.versions[key]

    def _run(self) -> None:
        producer = Producer(self.kafka.client_config(**{"linger.ms": 5}))
        topic, started, sent = event_topic(SOURCE), time.monotonic(), 0
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for _ in range(due - sent):
                self.position += 1
                key = self.position % self.keys
                encoded_key, value = EventEnvelope(
                    event_id=f"e{self.position}", event_type="SaleRecorded",
                    stream_id=f"product-{key}", stream_version=self._version(key),
                    global_position=self.position, recorded_at="",
                    data={"product": f"product-{key}", "value": self.position % 97 + 1}).encode()
                producer.produce(topic, key=encoded_key, value=value,
                                 partition=key % self.partitions)
            sent = max(sent, due)
            producer.poll(0)
            self.stop.wait(0.01)
        producer.flush(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=float, default=200.0, help="new events per second")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "alembic", "eventfold.outbox.topics", "eventfold.projections.runner",
                  "eventfold.projections.progress"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with own_stack("eventfold-replay-live-") as (settings, work_dir):
        migrations.upgrade(settings.database_url)
        run(args, settings.database_url, settings.kafka, work_dir)


def run(args: argparse.Namespace, database_url: str, kafka: KafkaConnection,
        work_dir: Path) -> None:
    rate = produce_events(kafka, args.events, args.keys, args.partitions)
    print(f"produced {args.events:,} events over {args.keys:,} keys at {rate:,.0f} events/s",
          flush=True)
    configured = Settings.from_env()  # the Spark and replay settings a host would take
    settings = RunnerSettings(kafka=kafka, database_url=database_url,
                              max_rows_per_batch=STREAMING_MAX_ROWS,
                              replay_rest_ratio=configured.replay_rest_ratio)
    spark = spark_session(args.master, app_name="eventfold-replay-beside-live",
                          extra_conf=spark_conf(configured))
    live = LiveVersion(spark, settings, BatchClock(log_each=False))
    steady = SteadyEvents(kafka, args.events, args.keys, args.partitions, args.rate)
    try:
        live.supervise_until(lambda: live.commits.events >= args.events)
        print(f"the live version folded the {args.events:,} events; {args.rate:,.0f} new "
              f"events/s from now on", flush=True)
        steady.thread.start()
        live.supervise_for(5.0)  # its steady commits before the replay
        builder = ReplayThread(spark, settings).start()
        live.supervise_until(lambda: not builder.thread.is_alive())
        switched = time.perf_counter()
        live.supervise_for(5.0)  # it notices the switch and commits on the new version
        result = builder.result()
    finally:
        steady.stop.set()
        live.stop()
        spark.stop()
    report(args, live.commits, result, switched)


class LiveVersion:
    """The projection's live run, started again on the new version after a switch, as a
    projection host's supervisor does; its jobs in the live pool."""

    def __init__(self, spark, settings: RunnerSettings, commits: BatchClock  # noqa: ANN001
                 ) -> None:
        self.spark, self.settings, self.commits = spark, settings, commits
        self.runner: ProjectionRunner | None = None
        self.query: RunningQuery | None = None

    def supervise_until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._keep_running()
            time.sleep(0.05)

    def supervise_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        self.supervise_until(lambda: time.monotonic() >= deadline)

    def _keep_running(self) -> None:
        if self.query is not None and self.query.isActive:
            return
        if self.query is not None and self.runner is not None:
            error = self.query.exception()
            if self.runner.versions.active(bench_totals.name) == self.runner.version:
                raise RuntimeError(f"the live version stopped: {error}")
            self.runner.close()
            log.info("a replay made another version active; the live run goes on with it")
        self.spark.sparkContext.setLocalProperty(SCHEDULER_POOL, LIVE_POOL)
        self.runner = ProjectionRunner(self.spark, bench_totals, self.settings,
                                       progress=self.commits)
        self.query = self.runner.start()

    def stop(self) -> None:
        if self.query is not None:
            stop_gracefully(self.query)
        if self.runner is not None:
            self.runner.close()


class ReplayThread:
    """The replay on a thread of its own in the replays' pool, as a host runs it."""

    def __init__(self, spark, settings: RunnerSettings) -> None:  # noqa: ANN001
        self.spark = spark
        self.settings = RunnerSettings(**{**settings.__dict__,
                                          "max_rows_per_batch": REPLAY_MAX_ROWS})
        self.outcome: list[ReplayResult] = []
        self.started = 0.0
        self.thread = threading.Thread(target=self._build, name="replay", daemon=True)

    def start(self) -> ReplayThread:
        self.started = time.perf_counter()
        self.thread.start()
        return self

    def _build(self) -> None:
        self.spark.sparkContext.setLocalProperty(SCHEDULER_POOL, REPLAY_POOL)
        self.outcome.append(replay(self.spark, bench_totals, self.settings))

    def result(self) -> tuple[ReplayResult, float]:
        """The replay's result and when it started."""
        if not self.outcome:
            raise RuntimeError("the replay failed (its error is in the log above)")
        return self.outcome[0], self.started


def report(args: argparse.Namespace, live: BatchClock,
           replayed: tuple[ReplayResult, float], switched: float) -> None:
    result, started = replayed
    times = [t for t, _ in live.batches]
    during = [t for t in times if t >= started]
    first_after = next((t for t in during if t > switched), None)
    window = [started, *[t for t in during if first_after is None or t <= first_after]]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    longest = max(gaps, default=0.0)
    p99 = percentile(gaps, 0.99) if gaps else 0.0
    print(f"replay of {result.events:,} events (v{result.old_version} -> "
          f"v{result.new_version}): {result.seconds:.1f} s, {result.events_per_s:,.0f} "
          f"events/s, beside the live version", flush=True)
    print(f"live version's commits during the replay: {len(window) - 1}; longest gap "
          f"{longest * 1000:,.0f} ms (target <= 2,000 ms), p99 gap {p99 * 1000:,.0f} ms",
          flush=True)
    print(json.dumps({
        "events": args.events, "keys": args.keys, "new_events_per_s": args.rate,
        "replay_events_per_s": round(result.events_per_s),
        "replay_seconds": round(result.seconds, 1),
        "live_commits_during_replay": len(window) - 1,
        "live_longest_commit_gap_ms": round(longest * 1000),
        "live_commit_gap_p99_ms": round(p99 * 1000),
        "master": args.master}))


if __name__ == "__main__":
    main()
