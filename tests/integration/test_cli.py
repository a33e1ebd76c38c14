"""The CLI as people run it: `eventfold stack up|status|down`, and a streaming projection
that stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psycopg

from eventfold.contract import libpq_url
from eventfold.local_stack import LocalStack
from eventfold.local_stack.process import free_port, pid_alive, port_is_open, stop_pid, wait_until
from eventfold.outbox.connection import KafkaConnection
from eventfold.projections.state.catalog import ProjectionCatalog
from eventfold.projections.status import projection_status
from tests.support.cli import eventfold, stack_env, start_serving


def test_stack_up_restarts_a_dead_component_and_never_loses_the_event_store(tmp_path) -> None:
    """`stack up` prints the endpoints and `status` the running PIDs; after a component died,
    `stack up` restarts it alone on its port; `down` stops every PID (a second `down` has
    nothing to stop), then `up` keeps the database and the broker's topics; only `reset`
    deletes data."""
    from eventfold import migrations
    from tests.kafka_helpers import produce, read_topic

    stack = LocalStack(tmp_path / "stack")
    env = {**os.environ, "EVENTFOLD_STACK_DIR": str(stack.data_dir)}

    def events() -> int:
        endpoints = stack.endpoints()
        assert endpoints is not None
        with psycopg.connect(libpq_url(endpoints.database_url)) as conn:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])

    try:
        up = eventfold("stack", "up", env=env)
        assert up.returncode == 0, up.stderr[-2000:]
        assert "export EVENTFOLD_DATABASE_URL=postgresql+psycopg://" in up.stdout
        status = json.loads(eventfold("stack", "status", env=env).stdout)
        assert status["running"] is True
        assert all(pid_alive(c["pid"]) for c in status["components"].values())
        first = stack.endpoints()
        assert first is not None
        migrations.upgrade(first.database_url)
        with psycopg.connect(libpq_url(first.database_url)) as conn:
            conn.execute("SELECT eventfold_append_units(%s::jsonb)", (json.dumps([{
                "c": None, "f": None, "p": [{"t": "Product", "s": "kept", "e": 0, "v": [{
                    "i": "0195f0aa-0000-7000-8000-000000000001", "y": "StockReceived",
                    "sv": 1, "d": {"quantity": 1}, "m": {}}]}]}]),))
        os.kill(first.connect_pid, signal.SIGKILL)
        up = eventfold("stack", "up", env=env)
        assert up.returncode == 0, up.stderr[-3000:]
        second = stack.endpoints()
        assert second is not None
        assert second.postgres_pid == first.postgres_pid  # kept running, not rebuilt
        assert second.connect_pid != first.connect_pid and pid_alive(second.connect_pid)
        assert (second.database_url, second.connect_url) == (first.database_url,
                                                             first.connect_url)
        assert events() == 1

        restarted = eventfold("stack", "restart", "postgres", env=env)
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        assert events() == 1

        kafka = KafkaConnection.of(second.kafka_bootstrap)
        produce(kafka, "kept-topic", "k", "v")
        os.kill(second.broker_pid, signal.SIGKILL)
        assert eventfold("stack", "up", env=env).returncode == 0  # the broker alone, again
        assert [r["value"] for r in read_topic(kafka, "kept-topic")] == ["v"]

        pids = [c["pid"] for c in json.loads(eventfold("stack", "status", env=env)
                                             .stdout)["components"].values()]
        down = eventfold("stack", "down", env=env)
        assert down.returncode == 0 and "data kept" in down.stdout
        assert not any(pid_alive(pid) for pid in pids)
        assert json.loads(eventfold("stack", "status", env=env).stdout)["running"] is False
        again = eventfold("stack", "down", env=env)
        assert again.returncode == 0 and again.stdout.count("nothing to stop") == 1
        up_again = eventfold("stack", "up", env=env)
        assert up_again.returncode == 0, up_again.stderr[-3000:]
        assert events() == 1
        assert [r["value"] for r in read_topic(kafka, "kept-topic")] == ["v"]

        reset = eventfold("stack", "reset", env=env)
        assert reset.returncode == 0 and not stack.data_dir.exists()
    finally:
        stack.down()


def test_streaming_projection_stops_cleanly_on_ctrl_c(inventory_app, stack_settings,
                                                     tmp_path, unique) -> None:
    """Ctrl-C (SIGINT to the terminal's whole process group, the Spark JVM and its Python
    workers included) stops as SIGTERM does (tests/integration/test_projection_host.py):
    cleanly, no traceback."""
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds")
    from examples.inventory import ReceiveStock, inventory_totals

    bus = inventory_app.runtime(stack_settings).command_bus()
    bus.execute(ReceiveStock(product=unique, quantity=4))
    log = tmp_path / "run.log"
    runner = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                               "inventory_totals"], env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status = projection_status(inventory_totals, stack_settings.database_url,
                                       stack_settings.kafka)
            if status.lag == 0 and "streaming from" in log.read_text():
                break
            assert runner.poll() is None, log.read_text()
            time.sleep(0.5)
        assert status.lag == 0
        assert "inventory_totals" in str(hosts_alive(env))  # `members` sees the host run it
        os.killpg(runner.pid, signal.SIGINT)
        runner.wait(timeout=90)
        output = log.read_text()
        assert runner.returncode == 0, output[-3000:]
        assert "stopping after the current batch" in output
        assert "stopped after" in output
        assert "Traceback" not in output and "Py4J" not in output, output[-3000:]
        assert "inventory_totals" not in str(hosts_alive(env))  # it left as it stopped
    finally:
        stop_pid(runner.pid, what="projection run")


def hosts_alive(env: dict[str, str]) -> list[dict[str, object]]:
    """``eventfold members --kind projection_host --json``: the live hosts."""
    listed = eventfold("members", "--kind", "projection_host", "--json", env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    return list(json.loads(listed.stdout)["projection_host"])


def test_sigkill_mid_stream_then_restart_and_replay_match_the_event_store(
        stack_settings, tmp_path, unique) -> None:
    """SIGKILL of `projection run --all` (the sales app's two projections as one host) at any
    point loses and doubles nothing once it runs again; `projection replay`, from the topics
    or from the event store (handed to the running host), rebuilds the same state and
    notifies no one again."""
    from examples import sales
    from tests.kafka_helpers import read_table, read_topic
    from tests.pipeline_helpers import wait_for, wait_until_in_topic

    sales.app.runtime(stack_settings).setup()
    bus = sales.app.runtime(stack_settings).command_bus()
    for round_ in range(10):
        for product in range(20):
            bus.execute(sales.RecordSale(product=f"{unique}-{product}", value=250 + round_))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 200)
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="examples.sales:app")
    totals = sales.sales_totals
    # small batches, so that the kill lands between two of them (later runs: the default):
    # twenty, each folded in milliseconds, so that the poll below finds one behind the others
    runner = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                               "--all"], env={**env, "EVENTFOLD_MAX_ROWS_PER_BATCH": "10"},
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status = projection_status(totals, stack_settings.database_url,
                                       stack_settings.kafka)
            if status.batch_id is not None and status.batch_id >= 2 and status.lag > 0:
                break
            assert runner.poll() is None
            time.sleep(0.05)
        os.killpg(runner.pid, signal.SIGKILL)  # the driver, its Spark JVM and Python workers
        runner.wait(30)
    finally:
        stop_pid(runner.pid, what="projection run")
    assert status.lag > 0, "the kill should have landed mid-stream"

    expected = {f"{unique}-{p}": sum(250 + r for r in range(10)) for p in range(20)}

    def folded() -> tuple[dict, dict]:
        with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
            return (dict(conn.execute("SELECT key, total FROM sales_totals WHERE key LIKE %s",
                                      (f"{unique}-%",)).fetchall()),
                    dict(conn.execute("SELECT key, revenue::bigint FROM sales_stats WHERE key "
                                      "LIKE %s", (f"{unique}-%",)).fetchall()))

    def state() -> tuple[dict, dict, dict, list]:
        rows, stats = folded()
        active = ProjectionCatalog(stack_settings.database_url).active(totals.name)
        ktable = {k: v["total"] for k, v in read_table(
            stack_settings.kafka, totals.ktable_topic_for(active)).items()
            if k.startswith(unique)}
        notes = [json.loads(r["value"]) for r in read_topic(
            stack_settings.kafka, sales.NOTIFICATIONS_TOPIC)
            if (r["key"] or "").startswith(unique)]
        return rows, ktable, stats, notes

    # started again, streaming; the replays are then handed to it
    log = tmp_path / "host.log"
    host = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "projection", "run",
                             "--all"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: folded() == (expected, expected), "the host started again to catch up",
                 timeout_s=240)
        rows, ktable, _, notes = state()
        assert rows == expected and ktable == expected
        ids = {n["eventId"]: n["data"]["product"] for n in notes}
        assert sorted(ids.values()) == sorted(expected)  # once per product, copies share ids

        replayed = eventfold("projection", "replay", totals.name, env=env, timeout=300)
        assert replayed.returncode == 0, replayed.stderr[-3000:]
        assert "v2 active" in replayed.stdout
        assert "handed to the host running it" in replayed.stderr
        assert "events/s, ETA" in replayed.stderr  # its progress, as the host reports it
        rows, ktable, _, notes_after = state()
        assert rows == expected and ktable == expected
        assert len(notes_after) == len(notes)  # a replay notifies no one again

        from_store = eventfold("projection", "replay", totals.name, "--from", "store",
                               env=env, timeout=300)
        assert from_store.returncode == 0, from_store.stderr[-3000:]
        assert "v3 active" in from_store.stdout
        assert "from the event store up to position" in log.read_text()
        rows, ktable, _, notes_after = state()
        assert rows == expected and ktable == expected
        assert len(notes_after) == len(notes)
    finally:
        stop_pid(host.pid, what="projection host", timeout_s=90)


def test_cli_mistakes_fail_at_once_saying_what_is_known(stack_settings, tmp_path) -> None:
    env = stack_env(stack_settings, tmp_path)
    started = time.monotonic()
    unknown = eventfold("projection", "run", "nope", env=env)
    assert unknown.returncode == 2
    assert "unknown projection 'nope'; known: inventory_totals" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    assert time.monotonic() - started < 15  # no Spark was started for it
    verify = eventfold("verify-log", "Nope", env=env)
    assert verify.returncode == 2 and "known: Product" in verify.stderr


def test_verify_log_compares_the_store_with_the_topic(stack_settings, tmp_path,
                                                      unique) -> None:
    """`eventfold verify-log` as people run it: every event delivered, a redelivery counted
    as a duplicate (allowed)."""
    from eventfold.contract import event_topic
    from examples import sales
    from tests.kafka_helpers import produce, read_topic
    from tests.pipeline_helpers import wait_until_in_topic

    sales.app.runtime(stack_settings).setup()
    bus = sales.app.runtime(stack_settings).command_bus()
    for product in range(30):
        bus.execute(sales.RecordSale(product=f"{unique}-{product}", value=10))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 30)
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="examples.sales:app")
    verify = eventfold("verify-log", "ProductSales", "--prefix", unique, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert ("30 events in the store, 30 messages on the topic: 0 missing, 0 duplicates, "
            "0 aggregates out of order") in verify.stdout

    topic = event_topic("ProductSales")
    again = next(m for m in read_topic(stack_settings.kafka, topic)
                 if (m["key"] or "").startswith(unique))
    # (a message that is no event would poison the shared topic for other tests' projections:
    # tests/unit/outbox/test_verify_log.py passes one over)
    produce(stack_settings.kafka, topic, again["key"], again["value"])
    verify = eventfold("verify-log", "ProductSales", "--prefix", unique, env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert ("30 events in the store, 31 messages on the topic: 0 missing, 1 duplicates"
            in verify.stdout)


def test_serve_prints_its_url_and_refuses_a_port_in_use(inventory_app, stack_settings,
                                                       tmp_path) -> None:
    port = free_port()
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_COMMAND_API_PORT=str(port))
    log = tmp_path / "serve.log"
    server = start_serving("commands", env, log)
    try:
        wait_until(lambda: port_is_open(port), what="the command API", timeout_s=60)
        assert f"serving the commands API on http://127.0.0.1:{port}" in log.read_text()
        second = eventfold("serve", "commands", env=env, timeout=60)
        assert second.returncode == 2
        assert f"port {port} on 127.0.0.1 is already in use" in second.stderr
        assert server.poll() is None
    finally:
        stop_pid(server.pid, what="serve commands")


def test_projection_list_shows_each_projections_outputs(stack_settings, tmp_path) -> None:
    from examples import sales

    sales.app.runtime(stack_settings).setup()
    listed = eventfold("projection", "list", env=stack_env(
        stack_settings, tmp_path, EVENTFOLD_APP="examples.sales:app"))
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("sales_totals\t"))
    assert "ktable_topic=eventfold.ktable.sales_totals" in line
    assert "dead_letter_topic=eventfold.dlq.sales_totals" in line
    assert "read_model=sales_totals" in line
