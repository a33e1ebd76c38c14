"""Helpers for tests that run projections on the real stack."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from eventfold import Command
from eventfold.contract import event_topic
from eventfold.local_stack.process import stop_pid
from eventfold.projections import Projection
from eventfold.projections.run_settings import RunnerSettings
from eventfold.projections.runner import ProjectionRunner
from tests.kafka_helpers import read_table


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def log_says(log: Path, text: str) -> bool:
    """Whether a process's log file holds ``text`` (yet)."""
    return log.exists() and text in log.read_text(errors="replace")


def frozen(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def stop_processes(processes: Iterable[subprocess.Popen | None], what: str) -> None:
    """Stop each process the test started, by PID, woken first: a frozen one (SIGSTOP) would
    not act on SIGTERM."""
    for process in processes:
        if process is not None:
            process.send_signal(signal.SIGCONT)
            stop_pid(process.pid, what=what)


def wait_for_more(sent: Callable[[], int], more: int, what: str,
                  timeout_s: float = 120) -> None:
    """Until ``more`` commands beyond those sent so far have gone out: time measured in what
    the test is doing, not in seconds."""
    target = sent() + more
    wait_for(lambda: sent() >= target, f"{more} more commands {what}", timeout_s=timeout_s)


def runner_settings(settings, **overrides: Any) -> RunnerSettings:
    return RunnerSettings(
        kafka=settings.kafka, database_url=settings.database_url,
        trigger_interval=settings.trigger_interval,
        **overrides)


def make_runner(spark, settings, projection, **overrides: Any) -> ProjectionRunner:
    return ProjectionRunner(spark, projection, runner_settings(settings, **overrides))


def catch_up(spark, settings, projection, **overrides: Any) -> ProjectionRunner:
    """Run the projection with availableNow until it has folded everything there is."""
    runner = make_runner(spark, settings, projection, **overrides)
    try:
        runner.catch_up(timeout_s=300)
    finally:
        runner.close()
    return runner


def wait_until_in_topic(settings, aggregate_type: str, prefix: str, count: int) -> None:
    """Debezium has published ``count`` events of these streams (CDC is asynchronous). The
    topic is read once up to its end, then only what came after, with one consumer: a wait
    costs the same however many events earlier tests left on the shared topic."""
    from confluent_kafka import Consumer

    from eventfold.outbox.kafka import OffsetPlanner, consumer_config, iter_range

    topic = event_topic(aggregate_type)
    planner, consumer = OffsetPlanner(settings.kafka), Consumer(consumer_config(settings.kafka))
    read: dict = {}
    found = [0]

    def published() -> bool:
        ends = planner.end_offsets(planner.partitions([topic]))
        for partition, end in ends.items():
            for chunk in iter_range(consumer, partition, read.get(partition, 0), end):
                found[0] += sum(1 for m in chunk if (m.key() or b"").startswith(
                    prefix.encode()))
            read[partition] = max(end, read.get(partition, 0))
        return found[0] >= count

    try:
        wait_for(published, f"{count} events of {prefix} on {topic}")
    finally:
        consumer.close()
        planner.close()


def topic_records(settings, aggregate_type: str) -> int:
    """How many records the events topic of ``aggregate_type`` holds (every test's: a new
    projection reads them all, so a batch cap meant to split its catch-up is a share of
    them)."""
    from eventfold.outbox.kafka import OffsetPlanner

    planner = OffsetPlanner(settings.kafka)
    try:
        return sum(planner.end_offsets(planner.partitions([event_topic(aggregate_type)]))
                   .values())
    finally:
        planner.close()


class Materializer:
    """Writes batches of ``projection``'s states through its real sinks (read model table
    and view, KTable topic), as the engine commits a batch; kept open across batches, as a
    running projection is (load flowing)."""

    def __init__(self, settings, projection, version: int = 1) -> None:
        from eventfold.projections.state.catalog import ProjectionCatalog
        from eventfold.projections.state.store import ReadModelStore
        from eventfold.projections.state.topics import TopicSink

        self.catalog = ProjectionCatalog(settings.database_url)
        self.catalog.register(projection.name)
        self.version = version
        self.topic = projection.ktable_topic_for(version)
        self.store = ReadModelStore(settings.database_url, projection, version)
        self.sink = TopicSink(settings.kafka, projection, version)
        self.store.ensure_schema()
        self.sink.ensure_topics()
        self.look_at_partitions()

    def look_at_partitions(self) -> None:
        """As a runner does now and then: the KTable topic's partition count recorded, and
        its producer told every count the topic has had."""
        shape = self.sink.ktable_shape()
        assert shape is not None
        self.sink.output.partition_history = self.catalog.note_partitions(
            self.topic, shape.topic_id, shape.partitions)

    def commit(self, states: dict[str, dict | None], batch_id: int | None = None,
               first_stream_version: int = 1) -> None:
        """One committed batch; the i-th key gets stream version ``first_stream_version + i``
        (the batch id: the next one, unless given)."""
        import uuid

        from eventfold.projections.outcome import KeyState
        from eventfold.projections.state.stage import StagedBatch

        store = self.store
        if batch_id is None:
            checkpoint = store.checkpoint()
            batch_id = 0 if checkpoint is None else checkpoint.batch_id + 1
        changed = {key: KeyState(state, version=first_stream_version + i,
                                 position=first_stream_version + i)
                   for i, (key, state) in enumerate(states.items())}
        stage = store.stage(uuid.uuid4().hex)
        new, known, live = stage.rows(changed.items(), {
            key: loaded.state is not None for key, loaded in store.load(changed).items()})
        marks = (0 if store.plan.watermarks_in_rows else
                 stage.watermarks({key: ks.version for key, ks in changed.items()}))
        self.sink.output.states(changed.items())
        self.sink.output.flush()
        store.commit(batch_id, StagedBatch(stage.attempt, new_rows=new, known_rows=known,
                                           live_rows_delta=live, marks=marks,
                                           applied=len(changed),
                                           servers={store.server_started()}), {})
        if self.version == 1:
            with store.conn.transaction():
                store.publish_view(store.conn)

    def close(self) -> None:
        self.sink.close()
        self.store.close()
        self.catalog.close()


def materialize(settings, projection, states: dict[str, dict | None], version: int = 1,
                batch_id: int = 0, first_stream_version: int = 1) -> None:
    """Write ``states`` as one committed batch of ``projection`` through its real sinks (read
    model table + view + KTable topic), as the engine would; the i-th key gets stream version
    ``first_stream_version + i``."""
    writer = Materializer(settings, projection, version)
    try:
        writer.commit(states, batch_id, first_stream_version)
    finally:
        writer.close()


def rows(engine, table: str, prefix: str, column: str) -> dict[str, object]:
    """``column`` of a read model table by key, for the keys starting with ``prefix``."""
    with engine.connect() as conn:
        found = conn.execute(text(f'SELECT key, "{column}" FROM "{table}" WHERE key LIKE :p'),
                             {"p": f"{prefix}%"}).all()
    return dict(found)


def store_totals(engine, stream_type: str, field: str, prefix: str) -> dict[str, int]:
    """A reference fold of the event store itself: the sum of ``field`` per stream of
    ``stream_type`` whose id starts with ``prefix``."""
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT stream_id, sum((data->>:field)::bigint) FROM events "
            "WHERE stream_type = :type AND stream_id LIKE :p GROUP BY stream_id"),
            {"field": field, "type": stream_type, "p": f"{prefix}%"}).all()
    return {stream: int(total) for stream, total in found}


def sales_totals_of_the_store(engine, prefix: str) -> dict[str, int]:
    """The sales example's running totals of products ``{prefix}-...``, from the store."""
    return store_totals(engine, "ProductSales", "value", f"{prefix}-")


def folded_total(engine, table: str, prefix: str) -> int:
    """The sum of a sales totals table's keys starting with ``prefix``; 0 before the table
    exists (the projection's first batch creates it)."""
    try:
        return sum(int(v) for v in rows(engine, table, prefix, "total").values())
    except ProgrammingError:
        return 0


def ktable_totals(settings, name: str, prefix: str) -> dict[str, int]:
    """The sales totals in projection ``name``'s first KTable topic, keys starting with
    ``prefix``."""
    return {k: v["total"] for k, v in read_table(
        settings.kafka, f"eventfold.ktable.{name}").items() if k.startswith(prefix)}


@contextmanager
def selling(settings, prefix: str) -> Iterator[Callable[[], int]]:
    """Sales commands flowing (the n-th sells product ``{prefix}-{n % 7}`` for n), one every
    ~10 ms, until the block ends; yields how many were sent."""
    from examples import sales

    stop, sent = threading.Event(), [0]

    def sell() -> None:
        bus = sales.app.runtime(settings).command_bus()
        while not stop.is_set():
            bus.execute(sales.RecordSale(product=f"{prefix}-{sent[0] % 7}", value=sent[0] + 1))
            sent[0] += 1
            time.sleep(0.01)

    seller = threading.Thread(target=sell, daemon=True)
    seller.start()
    try:
        yield lambda: sent[0]
    finally:
        stop.set()
        seller.join(timeout=30)


def renamed(projection: Projection, unique: str, **changes) -> Projection:
    """The example's projection under a name of this test's own (tests share the stack)."""
    return dataclasses.replace(projection, name=f"{projection.name}_{unique}", table="",
                               ktable_topic="", **changes)


@contextmanager
def placing(settings, purchases: Sequence[Command], pause_s: float) -> Iterator[list[str]]:
    """``purchases`` (``PlacePurchase`` commands) placed one after the other on a thread,
    ``pause_s`` apart; yields the ids of those placed so far."""
    from examples import fulfilment

    placed: list[str] = []

    def place() -> None:
        bus = fulfilment.app.runtime(settings).command_bus()
        for purchase in purchases:
            bus.execute(purchase)
            placed.append(purchase.stream_id())
            time.sleep(pause_s)

    placing_thread = threading.Thread(target=place, daemon=True)
    placing_thread.start()
    try:
        yield placed
    finally:
        placing_thread.join(timeout=120)
