"""Outbox CDC that a team can operate: connector lifecycle through the Connect REST API, and
delivery guarantees when the worker or the database restarts, for each outbox design (the
events table captured directly, and the outbox table; the gentler restarts on the default
design alone, ``GRACEFUL_RESTARTS``), and a switch between them while commands flow. These
tests restart components, so they run on a stack of their own (one per design)."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from eventfold import migrations
from eventfold.contract import event_topic as topic_of
from eventfold.contract import libpq_url
from eventfold.local_stack import LocalStack
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.connector import ConnectClient, OutboxConnectorSpec
from eventfold.outbox.design import OutboxDesign, installed_design
from eventfold.outbox.kafka import read_messages
from eventfold.outbox.operations import ConnectorOperations, ConnectorStatus
from eventfold.outbox.switch import switch_design
from eventfold.outbox.topics import EVENT_TOPIC_CONFIG, TopicAdmin
from eventfold.outbox.verify import LoggedEvent, LogReport, verify_topic
from eventfold.write_model import EventStore, StoreUnavailable
from eventfold.write_model.domain.events import NewEvent

TOPIC = topic_of("Product")


@dataclasses.dataclass
class CdcStack:
    stack: LocalStack
    database_url: str
    kafka: KafkaConnection
    operations: ConnectorOperations
    store: EventStore


GRACEFUL_RESTARTS = {
    "test_sigterm_of_the_worker_mid_stream_loses_and_duplicates_nothing",
    "test_status_right_after_a_worker_restart_reports_running_not_broken",
    "test_postgres_restart_while_the_connector_runs_delivers_everything",
}
"""Run on the default design alone: a worker or database restart resumes from the offsets
Connect committed and the slot's confirmed position, whichever table the slot's publication
captures. The harshest restart, SIGKILL of the worker mid-stream, runs on each design."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cdc" in metafunc.fixturenames:
        designs = ([OutboxDesign.EVENTS_TABLE] if metafunc.function.__name__ in GRACEFUL_RESTARTS
                   else list(OutboxDesign))
        metafunc.parametrize("cdc", designs, indirect=True, scope="module", ids=str)


@pytest.fixture(scope="module")
def cdc(request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdcStack]:
    stack = LocalStack(tmp_path_factory.mktemp("cdc") / "stack")
    endpoints = stack.up()
    kafka = KafkaConnection.of(endpoints.kafka_bootstrap)
    try:
        migrations.upgrade(endpoints.database_url)
        TopicAdmin(kafka).ensure([TOPIC], EVENT_TOPIC_CONFIG, partitions=4)
        spec = OutboxConnectorSpec(database_url=endpoints.database_url, name="cdc-outbox",
                                   slot_name="cdc_outbox", heartbeat_interval_ms=1000,
                                   design=request.param)
        operations = ConnectorOperations(ConnectClient(endpoints.connect_url), spec,
                                         TopicAdmin(kafka))
        switch_design(endpoints.database_url, request.param, operations)  # installs it
        assert operations.apply().action == "created"
        yield CdcStack(stack, endpoints.database_url, kafka, operations,
                       EventStore.from_url(endpoints.database_url))
    finally:
        stack.down()


def write(store: EventStore, prefix: str, transactions: int, per_transaction: int,
          pause_s: float = 0.0) -> None:
    """Append ``transactions`` x ``per_transaction`` events over 8 streams; ride out outages."""
    versions: dict[str, int] = {}
    for i in range(transactions):
        stream = f"{prefix}-{i % 8}"
        events = [NewEvent("StockReceived", {"product": stream, "quantity": 1})
                  for _ in range(per_transaction)]
        while True:
            try:
                versions[stream] = store.append("Product", stream, versions.get(stream, 0),
                                                events).version
                break
            except StoreUnavailable:
                time.sleep(0.2)
        time.sleep(pause_s)


def report(cdc: CdcStack, prefix: str) -> LogReport:
    stored = [LoggedEvent(*identity) for identity in cdc.store.event_identities("Product")]
    messages = [(k, v) for _, _, k, v in read_messages(cdc.kafka, TOPIC)]
    return verify_topic(stored, messages, include=lambda s: s.startswith(f"{prefix}-"))


def delivered(cdc: CdcStack, prefix: str, timeout_s: float = 120) -> LogReport:
    deadline = time.monotonic() + timeout_s
    while True:
        result = report(cdc, prefix)
        if result.missing_count == 0 or time.monotonic() > deadline:
            return result
        time.sleep(1)


def writing_while(cdc: CdcStack, prefix: str, disturb, transactions: int = 60,
                  per_transaction: int = 50) -> LogReport:
    # from a connector that runs: an earlier test's disturbance may still be settling
    cdc.operations.client.wait_running(cdc.operations.spec.name, timeout_s=120)
    writer = threading.Thread(target=write, args=(cdc.store, prefix, transactions,
                                                  per_transaction, 0.05))
    writer.start()
    deadline = time.monotonic() + 60
    while report(cdc, prefix).delivered < 200 and time.monotonic() < deadline:
        time.sleep(0.1)  # mid-stream: events flowing through the connector
    assert writer.is_alive(), "the writer finished before the disturbance"
    disturb()
    writer.join()
    cdc.operations.client.wait_running(cdc.operations.spec.name, timeout_s=120)
    return delivered(cdc, prefix)


def heartbeat_count(cdc: CdcStack) -> int:
    """Heartbeats the connector has sent (every second while it runs)."""
    topic = f"__debezium-heartbeat.{cdc.operations.spec.name}"
    return len(read_messages(cdc.kafka, topic))


def test_apply_is_idempotent_and_a_change_updates_in_place(cdc) -> None:
    assert cdc.operations.apply().action == "unchanged"
    assert cdc.operations.diff() == {}
    changed = ConnectorOperations(
        cdc.operations.client, dataclasses.replace(cdc.operations.spec, poll_interval_ms=60),
        cdc.operations.topics)
    assert changed.diff() == {"poll.interval.ms": ("50", "60")}
    result = changed.apply()
    assert (result.action, result.diff) == ("updated", {"poll.interval.ms": ("50", "60")})
    assert cdc.operations.apply().action == "updated"  # and back
    assert status_once_reassigned(cdc).running


def test_validate_reports_each_error_against_its_key(cdc) -> None:
    assert cdc.operations.validate() == []
    broken = dataclasses.replace(
        cdc.operations.spec, database_url="postgresql://nobody@127.0.0.1:1/none")
    broken_config = {"name": "x", **broken.config(), "snapshot.mode": "sometimes"}
    errors = cdc.operations.client.validate(broken_config)
    assert any(key == "snapshot.mode" for key, _ in errors), errors


def status_once_reassigned(cdc: CdcStack, timeout_s: float = 30) -> ConnectorStatus:
    """The status, once Connect has reassigned the connector after an update (it restarts
    it, so for a moment it is not running), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    status = cdc.operations.status()
    while not status.running and time.monotonic() < deadline:
        time.sleep(0.5)
        status = cdc.operations.status()
    return status


def test_status_shows_tasks_and_retained_wal(cdc) -> None:
    status = status_once_reassigned(cdc)
    assert status.running
    assert status.slot is not None and status.slot.name == "cdc_outbox"
    assert status.slot.retained_wal_bytes >= 0
    warned = cdc.operations.status(wal_warning_bytes=-1)
    assert any("retains" in warning for warning in warned.warnings)


def test_pause_holds_events_and_resume_delivers_them(cdc, unique) -> None:
    cdc.operations.pause()  # returns once the connector and its tasks report PAUSED
    status = cdc.operations.status()
    assert status.connector_state == "PAUSED"
    assert {task["state"] for task in status.tasks} == {"PAUSED"}
    write(cdc.store, unique, 10, 10)
    # Nothing while paused, over ten times what a running connector takes (its p99 is under
    # 100 ms here, docs/architecture.md), measured as heartbeats it did not send either.
    heartbeats = heartbeat_count(cdc)
    time.sleep(1.0)
    assert report(cdc, unique).delivered == 0
    assert heartbeat_count(cdc) == heartbeats
    cdc.operations.resume()
    result = delivered(cdc, unique)
    assert (result.missing_count, result.duplicate_count, result.expected) == (0, 0, 100)
    deadline = time.monotonic() + 30  # and the heartbeats counted above do flow when running
    while heartbeat_count(cdc) == heartbeats and time.monotonic() < deadline:
        time.sleep(0.2)
    assert heartbeat_count(cdc) > heartbeats


def test_restart_touches_only_failed_tasks_by_default(cdc) -> None:
    assert cdc.operations.status().running
    untouched = cdc.operations.restart()  # nothing FAILED: nothing restarts
    assert untouched["connector"]["state"] == "RUNNING"
    assert [task["state"] for task in untouched["tasks"]] == ["RUNNING"]
    everything = cdc.operations.restart(only_failed=False)
    assert everything["connector"]["state"] == "RESTARTING"
    assert [task["state"] for task in everything["tasks"]] == ["RESTARTING"]
    cdc.operations.client.wait_running(cdc.operations.spec.name, timeout_s=120)


def test_sigterm_of_the_worker_mid_stream_loses_and_duplicates_nothing(cdc, unique) -> None:
    result = writing_while(cdc, unique, lambda: cdc.stack.restart_connect(signal.SIGTERM))
    assert result.expected == 3000
    assert (result.missing_count, result.duplicate_count, result.out_of_order) == (0, 0, {})


def test_status_right_after_a_worker_restart_reports_running_not_broken(cdc) -> None:
    cdc.stack.restart_connect(signal.SIGKILL)
    status = cdc.operations.status()
    assert status.running and not status.starting, status
    assert status.slot is not None and status.slot.active
    assert status.warnings == []


def test_sigkill_of_the_worker_mid_stream_loses_and_duplicates_nothing(cdc, unique) -> None:
    result = writing_while(cdc, unique, lambda: cdc.stack.restart_connect(signal.SIGKILL))
    assert result.expected == 3000
    print(f"SIGKILL: {result.summary()}")
    # Exactly-once source support (KIP-618): what the killed worker had not committed was
    # aborted, and the next one resumes from the offsets committed with the records.
    assert (result.missing_count, result.duplicate_count, result.out_of_order) == (0, 0, {})


def test_postgres_restart_while_the_connector_runs_delivers_everything(cdc, unique) -> None:
    result = writing_while(cdc, unique, cdc.stack.restart_postgres)
    assert result.expected == 3000
    assert (result.missing_count, result.duplicate_count, result.out_of_order) == (0, 0, {})


def test_switching_design_while_commands_flow_loses_and_duplicates_nothing(cdc, unique) -> None:
    """The switch holds appends until the connector has published everything written before
    it, installs the other design and reconfigures the connector: each event goes out once,
    by one design or the other, in order."""
    design = cdc.operations.spec.design
    other = next(d for d in OutboxDesign if d is not design)
    switched = ConnectorOperations(cdc.operations.client,
                                   dataclasses.replace(cdc.operations.spec, design=other),
                                   cdc.operations.topics)
    took: list[float] = []

    def switch() -> None:
        started = time.monotonic()
        assert switch_design(cdc.database_url, other, switched) is design
        took.append(time.monotonic() - started)

    try:
        result = writing_while(cdc, unique, switch)
        with psycopg.connect(libpq_url(cdc.database_url)) as conn:
            assert installed_design(conn) is other
        print(f"switch {design} -> {other} in {took[0]:.1f} s: {result.summary()}")
        assert result.expected == 3000
        assert (result.missing_count, result.duplicate_count, result.out_of_order) == (0, 0, {})
    finally:
        switch_design(cdc.database_url, design, cdc.operations)  # back, for what follows
        assert cdc.operations.apply().action == "unchanged"


def test_delete_and_reapply_with_the_same_slot_resumes_without_loss(cdc, unique) -> None:
    assert cdc.operations.delete(keep_slot=True)
    assert cdc.operations.slot() is not None
    write(cdc.store, unique, 20, 10)  # while no connector runs
    assert cdc.operations.apply().action == "created"
    result = delivered(cdc, unique)
    assert (result.missing_count, result.duplicate_count, result.expected) == (0, 0, 200)


def test_idle_outbox_does_not_pin_wal_thanks_to_heartbeats(cdc) -> None:
    with psycopg.connect(libpq_url(cdc.database_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS filler (id BIGSERIAL, pad TEXT)")
        conn.execute("INSERT INTO filler (pad) SELECT repeat('x', 1000) "
                     "FROM generate_series(1, 20000)")  # ~25 MB of WAL, nothing for the outbox
        written = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        slot = cdc.operations.slot()
        assert slot is not None
        if slot.unconfirmed_wal_bytes < 2_000_000:
            break
        time.sleep(0.5)
    assert slot.unconfirmed_wal_bytes < 2_000_000, (written, slot)


def test_delete_drops_the_slot_unless_asked_to_keep_it(cdc) -> None:
    assert cdc.operations.delete()
    assert cdc.operations.slot() is None
    assert cdc.operations.status().connector_state == "ABSENT"
    assert cdc.operations.apply().action == "created"  # leave the stack as we found it
