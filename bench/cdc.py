"""CDC benchmark on a stack of its own: append commit -> topic, for one outbox design. Live
rates while writing (500-event transactions, and single-event commands from 8 writers),
backlog drain after the connector was paused, commit-to-consumer latency of single commands,
and lost events.
Prints figures, then one JSON line.

    .venv/bin/python -m bench.cdc [--events 50000] [--latency-commands 300] [--at-least-once]
        [--outbox-design events_table|outbox_table]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.common import percentile
from eventfold import migrations
from eventfold.contract import event_topic as topic_of
from eventfold.local_stack import LocalStack
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.connector import ConnectClient, OutboxConnectorSpec
from eventfold.outbox.design import DEFAULT_OUTBOX_DESIGN, OutboxDesign
from eventfold.outbox.kafka import OffsetPlanner, consume_available, consumer_config, read_messages
from eventfold.outbox.operations import ConnectorOperations
from eventfold.outbox.switch import switch_design
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.outbox.verify import LoggedEvent, verify_topic
from eventfold.write_model import EventStore
from eventfold.write_model.domain.events import NewEvent

TOPIC = topic_of("Product")


class Arrivals:
    """Tails the topic from its current end and notes when each event id arrives."""

    def __init__(self, kafka: KafkaConnection) -> None:
        planner = OffsetPlanner(kafka)
        partitions = planner.partitions([TOPIC])
        ends = planner.end_offsets(partitions)
        planner.close()
        self.consumer = Consumer(consumer_config(kafka, **{"enable.partition.eof": False}))
        self.consumer.assign([TopicPartition(t, p, ends[(t, p)]) for t, p in partitions])
        self.times: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in consume_available(self.consumer, 10_000, wait_s=0.05):
                if message.error() is None:
                    now = time.perf_counter()
                    event_id = json.loads(message.value())["eventId"]
                    self.times.setdefault(event_id, now)

    def wait_for(self, event_ids: set[str], timeout_s: float = 300) -> float:
        """The arrival time of the last of ``event_ids``."""
        deadline = time.monotonic() + timeout_s
        while not event_ids <= self.times.keys():
            if time.monotonic() > deadline:
                missing = len(event_ids - self.times.keys())
                raise TimeoutError(f"{missing} events not delivered in {timeout_s:.0f} s")
            time.sleep(0.01)
        return max(self.times[e] for e in event_ids)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()


def batch(stream: str, size: int) -> list[NewEvent]:
    return [NewEvent("StockReceived", {"product": stream, "quantity": 1}) for _ in range(size)]


def write_transactions(store: EventStore, prefix: str, events: int, size: int,
                       writers: int = 4, rate: float | None = None) -> set[str]:
    """``events`` in ``size``-event transactions, as fast as possible or paced at ``rate``
    events/s (each transaction starts at its slot in the schedule)."""
    started = time.perf_counter()

    def one(i: int) -> list[str]:
        if rate:
            time.sleep(max(0.0, started + i * size / rate - time.perf_counter()))
        result = store.append("Product", f"{prefix}-{i}", 0, batch(f"{prefix}-{i}", size))
        return [str(e) for e in result.event_ids]

    with ThreadPoolExecutor(writers) as pool:
        return {event_id for ids in pool.map(one, range(events // size)) for event_id in ids}


def write_single_events(store: EventStore, prefix: str, events: int, writers: int) -> set[str]:
    def one(i: int) -> str:
        return str(store.append("Product", f"{prefix}-{i}", 0, batch(f"{prefix}-{i}", 1)
                                ).event_ids[0])

    with ThreadPoolExecutor(writers) as pool:
        return set(pool.map(one, range(events)))



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--latency-commands", type=int, default=300)
    parser.add_argument("--live-rate", type=float, default=12_000,
                        help="offered write rate of the paced live run, events/s")
    parser.add_argument("--outbox-design", choices=list(OutboxDesign),
                        default=DEFAULT_OUTBOX_DESIGN.value,
                        help="how appends reach the WAL: the events table captured directly, "
                             "or an outbox row per event")
    parser.add_argument("--at-least-once", action="store_true",
                        help="run the connector without exactly-once support, to measure what "
                             "the per-poll Kafka transactions cost")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    stack = LocalStack(Path(tempfile.mkdtemp(prefix="eventfold-cdc-")) / "stack")
    endpoints = stack.up()
    kafka = KafkaConnection.of(endpoints.kafka_bootstrap)
    try:
        migrations.upgrade(endpoints.database_url)
        TopicAdmin(kafka).ensure([TOPIC], EVENT_TOPIC_CONFIG, partitions=4)
        operations = ConnectorOperations(
            ConnectClient(endpoints.connect_url),
            OutboxConnectorSpec(database_url=endpoints.database_url, name="bench-outbox",
                                slot_name="bench_outbox", exactly_once=not args.at_least_once,
                                design=OutboxDesign(args.outbox_design)),
            TopicAdmin(kafka))
        switch_design(endpoints.database_url, operations.spec.design, operations)
        operations.apply()
        run(EventStore.from_url(endpoints.database_url, pool_size=8), operations, kafka, args)
    finally:
        stack.down()


def run(store: EventStore, operations: ConnectorOperations, kafka: KafkaConnection,
        args: argparse.Namespace) -> None:
    arrivals = Arrivals(kafka)
    # Warm-up: the connector's first events pay for class loading and connections.
    arrivals.wait_for(write_transactions(store, "warm", 1000, 100))

    started = time.perf_counter()
    ids = write_transactions(store, "burst", args.events, 500)
    written = time.perf_counter()
    live_burst = len(ids) / (arrivals.wait_for(ids) - started)
    print(f"live burst, 500-event transactions from 4 unpaced writers: {len(ids)} events at "
          f"{live_burst:,.0f} events/s, first commit to last arrival (written at "
          f"{len(ids) / (written - started):,.0f}/s, competing for the same cores)", flush=True)

    started = time.perf_counter()
    ids = write_transactions(store, "paced", args.events, 500, rate=args.live_rate)
    written = time.perf_counter()
    last = arrivals.wait_for(ids)
    live_tx = len(ids) / (last - started)
    print(f"live at an offered {args.live_rate:,.0f} events/s (500-event transactions): "
          f"{live_tx:,.0f} events/s delivered, first commit to last arrival; the last event "
          f"arrived {(last - written) * 1000:.0f} ms after the last commit", flush=True)

    single_events = min(args.events, 10_000)
    started = time.perf_counter()
    ids = write_single_events(store, "single", single_events, 8)
    written = time.perf_counter()
    live_single = len(ids) / (arrivals.wait_for(ids) - started)
    print(f"live, single-event commands from 8 writers: {len(ids)} events at "
          f"{live_single:,.0f} events/s (written at {len(ids) / (written - started):,.0f}/s)",
          flush=True)

    operations.pause()
    ids = write_transactions(store, "backlog", args.events, 500)
    resumed = time.perf_counter()
    operations.resume()
    backlog = len(ids) / (arrivals.wait_for(ids) - resumed)
    print(f"backlog: {len(ids)} events written while paused, drained at {backlog:,.0f} "
          "events/s after resume", flush=True)

    latencies = []
    for i in range(args.latency_commands):
        result = store.append("Product", f"lat-{i}", 0, batch(f"lat-{i}", 1))
        committed = time.perf_counter()
        arrived = arrivals.wait_for({str(result.event_ids[0])}, timeout_s=30)
        latencies.append((arrived - committed) * 1000)
        time.sleep(0.02)
    arrivals.stop()
    print(f"commit -> consumer, {len(latencies)} single commands: p50 "
          f"{percentile(latencies, .5):.0f} ms, p95 {percentile(latencies, .95):.0f} ms, "
          f"p99 {percentile(latencies, .99):.0f} ms", flush=True)

    stored = [LoggedEvent(*identity) for identity in store.event_identities("Product")]
    # Every event written by this run: warm-up, burst, paced, single, backlog and latency.
    report = verify_topic(stored, [(k, v) for _, _, k, v in read_messages(kafka, TOPIC)])
    print(f"verify-log: {report.summary()}")
    print(json.dumps({
        "live_events_per_s": round(live_tx),
        "live_burst_events_per_s": round(live_burst),
        "live_single_command_events_per_s": round(live_single),
        "backlog_events_per_s": round(backlog),
        "latency_p50_ms": round(percentile(latencies, .5), 1),
        "latency_p95_ms": round(percentile(latencies, .95), 1),
        "latency_p99_ms": round(percentile(latencies, .99), 1),
        "lost_events": report.missing_count,
        "duplicate_events": report.duplicate_count,
        "exactly_once": not args.at_least_once,
        "outbox_design": args.outbox_design,
    }))


if __name__ == "__main__":
    main()
