"""A node of each distributed part dies while commands flow and a projection streams, on the
cluster stack (three brokers with replication factor 3 and min.insync.replicas 2, two Connect
workers): the broker leading the busiest partition, then the Connect worker running the
outbox connector's task, in one stream. After each, events sent after the kill are folded
(the time to recover is printed); at the end, no event lost, none counted twice (the read
model and the KTable equal a fold of the event store)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import requests
from confluent_kafka.admin import AdminClient
from sqlalchemy import create_engine

from eventfold.config import Settings
from eventfold.contract import event_topic
from eventfold.local_stack.process import stop_pid
from eventfold.outbox.topics import COMPACTED_TOPIC_CONFIG, EVENT_TOPIC_CONFIG, TopicAdmin
from tests.packaging import ROOT
from tests.pipeline_helpers import (
    folded_total,
    ktable_totals,
    rows,
    sales_totals_of_the_store,
    selling,
    wait_for,
    wait_for_more,
    wait_until_in_topic,
)
from tests.support.cli import stack_env

TOPIC = event_topic("ProductSales")


@pytest.fixture(scope="module")
def cluster_engine(cluster_stack):
    engine = create_engine(cluster_stack[1].database_url)
    yield engine
    engine.dispose()


@dataclass(frozen=True)
class Failure:
    """A node to kill mid-stream: ``kill()`` SIGKILLs it and says which it was;
    ``while_down(projection)`` runs after the recovery, before the node is started again."""

    what: str
    kill: Callable[[], str]
    while_down: Callable[[str], None] | None = None


def _survives(cluster_stack, engine, tmp_path, unique: str, failures: list[Failure]) -> None:
    """Stream a projection in a CLI process (as a team runs it: a failed query is started
    again from the last commit) while commands flow; each failure in turn kills its node,
    waits for the pipeline to recover without it, and starts it again. Then: the outcome."""
    stack, settings = cluster_stack
    name = f"sales_totals_{unique}"
    table = f"{name}__v1"
    log_path, supervisor_log = tmp_path / "run.log", tmp_path / "supervise.log"
    env = stack_env(settings, tmp_path, EVENTFOLD_APP="tests.renamed_app:app",
                    EVENTFOLD_TEST_PROJECTION=name, EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    runner = subprocess.Popen(
        [sys.executable, "-m", "eventfold.cli", "projection", "run", name],
        env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
    # As in production, a supervisor restarts FAILED connector tasks (through the second
    # worker's REST API: the first may be the one killed).
    second_worker = stack.status()["components"]["connect-2"]["endpoint"]  # type: ignore[index]
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "eventfold.cli", "connector", "supervise"],
        env={**env, "EVENTFOLD_CONNECT_URL": second_worker}, stdout=supervisor_log.open("wb"),
        stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        with selling(settings, unique) as sent:
            wait_for(lambda: folded_total(engine, table, unique) > 0, "the first batch",
                     timeout_s=180)
            for failure in failures:
                wait_for_more(sent, 50, f"before the {failure.what} dies (mid-stream)")
                victim = failure.kill()
                killed_at = time.monotonic()
                commands_at_kill = sent()
                # Recovered: an event of a command sent after the kill reaches the read
                # model (the n-th command sells for n: the first n total n(n+1)/2).
                before_kill = commands_at_kill * (commands_at_kill + 1) // 2
                try:
                    wait_for(lambda bar=before_kill: folded_total(engine, table, unique) > bar,
                             f"events sent after the {failure.what} died to be folded",
                             timeout_s=300)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}; {_diagnosis(settings, unique)}\n"
                                         f"{log_path.read_text()[-3000:]}\n"
                                         f"{supervisor_log.read_text()[-2000:]}") from None
                print(f"\n{failure.what} {victim} SIGKILLed mid-stream: events sent after it "
                      f"folded {time.monotonic() - killed_at:.1f} s later")
                if failure.while_down is not None:
                    failure.while_down(name)
                wait_for_more(sent, 100, f"after the {failure.what} died")
                stack.up()  # the killed node again, over its data
        wait_until_in_topic(settings, "ProductSales", unique, sent())
        stopped_at = time.monotonic()
        wait_for(lambda: rows(engine, table, unique, "total")
                 == sales_totals_of_the_store(engine, unique),
                 "the read model to equal a fold of the event store", timeout_s=180)
        assert runner.poll() is None, log_path.read_text()[-3000:]
        assert supervisor.poll() is None, supervisor_log.read_text()[-3000:]
        restarts = supervisor_log.read_text().count("restarting them")
        print(f"{sent()} commands; read model equal to the event store's fold "
              f"{time.monotonic() - stopped_at:.1f} s after the last command; the supervisor "
              f"restarted FAILED connector tasks {restarts} time(s)")
        assert ktable_totals(settings, name, unique) == sales_totals_of_the_store(engine, unique)
    finally:
        stop_pid(runner.pid, what="projection run", timeout_s=90)
        stop_pid(supervisor.pid, what="connector supervise", timeout_s=30)
        stack.up()  # whatever node is still down


def test_the_busiest_broker_then_the_outbox_tasks_connect_worker_die(
        cluster_stack, cluster_engine, tmp_path, unique) -> None:
    """One stream through both failures: the broker leading the busiest partition, then (the
    broker back) the Connect worker running the outbox connector's task."""
    stack, settings = cluster_stack

    def kill_leader() -> str:
        admin = AdminClient(settings.kafka.client_config())
        partitions = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        busiest = max(partitions.values(), key=lambda p: _end_offset(settings, p.id))
        name = "broker" if busiest.leader == 1 else f"broker-{busiest.leader}"
        os.kill(stack.pid_of(name), signal.SIGKILL)
        return f"{name} (leader of partition {busiest.id})"

    def topics_still_pass_their_checks(projection: str) -> None:
        # A projection (re)started while a broker is down checks its existing topics: they
        # need the min.insync.replicas their three replicas imply, not the two brokers alive.
        admin = AdminClient(settings.kafka.client_config())
        wait_for(lambda: len(admin.list_topics(timeout=10).brokers) == 2,
                 "the cluster to see two brokers", timeout_s=60)
        topics = TopicAdmin(settings.kafka, settings.replication)
        topics.ensure([TOPIC], EVENT_TOPIC_CONFIG, kind="events", check=True)
        topics.ensure([f"eventfold.ktable.{projection}"], COMPACTED_TOPIC_CONFIG, kind="ktables",
                      check=True)

    def kill_task_worker() -> str:
        status = requests.get(f"{settings.connect_url}/connectors/"
                              f"{settings.connector_name}/status", timeout=10).json()
        worker = status["tasks"][0]["worker_id"]  # host:port of its REST listener
        name = stack.node_listening_on(int(worker.rsplit(":", 1)[1]))
        os.kill(stack.pid_of(name), signal.SIGKILL)
        return f"{name} ({worker}, running the outbox task)"

    _survives(cluster_stack, cluster_engine, tmp_path, unique, [
        Failure("broker", kill_leader, while_down=topics_still_pass_their_checks),
        Failure("Connect worker", kill_task_worker)])


def _diagnosis(settings: Settings, unique: str) -> str:
    from tests.kafka_helpers import read_topic

    try:
        connector = requests.get(f"{settings.connect_url}/connectors/"
                                 f"{settings.connector_name}/status", timeout=5).json()
    except requests.RequestException as exc:
        connector = f"unreachable: {exc}"
    published = sum(1 for r in read_topic(settings.kafka, TOPIC)
                    if (r["key"] or "").startswith(unique))
    return f"connector {connector}; {published} events of this test on {TOPIC}"


def _end_offset(settings: Settings, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka.client_config(), "group.id": "probe"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, partition),
                                                  timeout=10)[1])
    finally:
        consumer.close()
