"""A team's processes side by side through a replay: a streaming `projection run`, two
`serve reads` processes and commands flowing at ~50/s, then `projection replay`, which hands
the replay to the streaming run's host (no second Spark application).

The read model and KTable routes, polled every 100 ms on both readers, never fail, never go
empty and never go backwards; afterwards every process is alive, the streaming run folds new
commands into the new version, and the read model, KTable routes and KTable topic equal a
fold of the event store. The old KTable topic is deleted once both readers have left it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from confluent_kafka.admin import AdminClient

from eventfold.contract import libpq_url
from eventfold.local_stack.process import free_port, stop_pid
from eventfold.projections.state.catalog import ProjectionCatalog
from tests.kafka_helpers import read_table
from tests.pipeline_helpers import wait_for
from tests.support.cli import stack_env

PRODUCTS = 12


@dataclass
class Watch:
    """What one poller saw of one route."""

    requests: int = 0
    failures: list[str] = field(default_factory=list)
    last: dict[str, int] = field(default_factory=dict)


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eventfold.cli", *args], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def reference_fold(settings, prefix: str) -> dict[str, int]:
    """inventory_totals computed from the event store itself."""
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        rows = conn.execute("""
            SELECT stream_id, sum(CASE WHEN event_type = 'StockReceived'
                                       THEN (data->>'quantity')::bigint
                                       ELSE -(data->>'quantity')::bigint END)
            FROM events WHERE stream_type = 'Product' AND stream_id LIKE %s
            GROUP BY stream_id""", (f"{prefix}-%",)).fetchall()
    return {key: int(total) for key, total in rows}


def poll(base: str, prefix: str, stop: threading.Event, read_model: Watch,
         ktable: Watch) -> None:
    with httpx.Client(base_url=base, timeout=10) as client:
        while not stop.is_set():
            _check(client, f"/read-models/inventory_totals/rows?key.prefix={prefix}-&limit=500",
                   read_model, lambda body: {r["key"]: r["quantity"] for r in body["rows"]})
            _check(client, f"/ktables/inventory_totals/entries?from={prefix}-&to={prefix}-~"
                   "&limit=500", ktable,
                   lambda body: {e["key"]: e["value"]["quantity"] for e in body["entries"]})
            time.sleep(0.1)


def _check(client: httpx.Client, url: str, watch: Watch, values) -> None:
    watch.requests += 1
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        watch.failures.append(f"{url}: {exc!r}")
        return
    if response.status_code != 200:
        watch.failures.append(f"{url}: {response.status_code} {response.text[:200]}")
        return
    seen = values(response.json())
    if len(seen) < PRODUCTS:
        watch.failures.append(f"{url}: {len(seen)} of {PRODUCTS} keys")
    for key, quantity in seen.items():
        if quantity < watch.last.get(key, 0):  # stock only arrives in this test
            watch.failures.append(f"{url}: {key} went back from {watch.last[key]} to "
                                  f"{quantity}")
        watch.last[key] = quantity


def test_reads_and_a_streaming_run_carry_on_through_a_replay(inventory_app, stack_settings,
                                                             tmp_path, unique) -> None:
    through_a_replay(inventory_app, stack_settings, tmp_path, unique)


def through_a_replay(inventory_app, stack_settings, tmp_path, unique: str) -> None:
    from examples.inventory import ReceiveStock, inventory_totals

    bus = inventory_app.runtime(stack_settings).command_bus()
    products = [f"{unique}-p{n:02d}" for n in range(PRODUCTS)]
    for product in products:
        bus.execute(ReceiveStock(product=product, quantity=1))
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="examples.inventory:app",
                    EVENTFOLD_TRIGGER_INTERVAL="200 milliseconds", EVENTFOLD_REQUEST_LOG="false")
    ports = [free_port(), free_port()]
    processes: dict[str, subprocess.Popen] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("run", "reads0", "reads1", "replay")}

    def tails() -> str:
        return "\n".join(f"--- {name}\n{path.read_text()[-3000:]}"
                         for name, path in logs.items() if path.exists())

    stop_polling, stop_commands = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        processes["run"] = start(["projection", "run", "inventory_totals"], env, logs["run"])
        for n, port in enumerate(ports):
            processes[f"reads{n}"] = start(["serve", "reads"],
                                           {**env, "EVENTFOLD_READ_API_PORT": str(port)},
                                           logs[f"reads{n}"])
        bases = [f"http://127.0.0.1:{port}" for port in ports]

        def serving() -> bool:
            for base in bases:
                try:
                    body = httpx.get(f"{base}/read-models/inventory_totals/rows"
                                     f"?key.prefix={unique}-&limit=500", timeout=5).json()
                    entries = httpx.get(f"{base}/ktables/inventory_totals/entries"
                                        f"?from={unique}-&to={unique}-~", timeout=5).json()
                except (httpx.HTTPError, ValueError):
                    return False
                if len(body.get("rows", [])) < PRODUCTS or \
                        len(entries.get("entries", [])) < PRODUCTS:
                    return False
            return True

        wait_for(serving, f"both readers to serve all keys\n{tails()}", timeout_s=240)

        watches = {(base, kind): Watch() for base in bases for kind in ("rows", "ktable")}
        for base in bases:
            threads.append(threading.Thread(target=poll, args=(
                base, unique, stop_polling, watches[(base, "rows")],
                watches[(base, "ktable")])))
        commands_sent = [0]

        def send_commands() -> None:
            n = 0
            while not stop_commands.is_set():
                bus.execute(ReceiveStock(product=products[n % PRODUCTS], quantity=1))
                n += 1
                commands_sent[0] = n
                time.sleep(0.02)

        sender = threading.Thread(target=send_commands)
        threads.append(sender)
        for thread in threads:
            thread.start()

        active_before = ProjectionCatalog(stack_settings.database_url).active(
            inventory_totals.name)
        replay = subprocess.run(
            [sys.executable, "-m", "eventfold.cli", "projection", "replay", "inventory_totals"],
            env=env, stdout=subprocess.PIPE, stderr=logs["replay"].open("w"), text=True,
            timeout=400, check=False)
        assert replay.returncode == 0, tails()
        active = ProjectionCatalog(stack_settings.database_url).active(inventory_totals.name)
        assert active == active_before + 1
        # handed to the streaming host, which ran it beside the live query
        assert f"v{active} active" in replay.stdout
        assert "handed to the host running it" in logs["replay"].read_text(), tails()
        assert "replay of inventory_totals requested" in logs["run"].read_text(), tails()

        # The run continues on the new version: commands sent now land in it.
        sent_at_switch = commands_sent[0]
        wait_for(lambda: commands_sent[0] >= sent_at_switch + 100, "commands after the switch")
        stop_commands.set()
        sender.join(timeout=30)  # its last command has committed and been counted
        expected = reference_fold(stack_settings, unique)
        assert sum(expected.values()) == PRODUCTS + commands_sent[0]

        def folded() -> bool:
            return all(watch.last == expected for watch in watches.values())

        wait_for(folded, f"readers to show every command\n{tails()}", timeout_s=120)
        stop_polling.set()
        for thread in threads:
            thread.join(timeout=30)

        for name, process in processes.items():
            assert process.poll() is None, f"{name} exited with {process.returncode}\n{tails()}"
        for (base, kind), watch in watches.items():
            assert watch.requests > 20, (base, kind, watch.requests)
            assert watch.failures == [], (base, kind, watch.failures[:5])
        topic = inventory_totals.ktable_topic_for(active)
        ktable = {k: v["quantity"] for k, v in read_table(stack_settings.kafka,
                                                          topic).items() if k.startswith(unique)}
        assert ktable == expected
        old_topic = inventory_totals.ktable_topic_for(active_before)
        topics = AdminClient(stack_settings.kafka.client_config()
                             ).list_topics(timeout=10).topics
        assert old_topic not in topics, "the readers left the old topic: it should be deleted"
    finally:
        stop_commands.set()
        stop_polling.set()
        for thread in threads:
            thread.join(timeout=30)
        for name, process in processes.items():
            stop_pid(process.pid, what=name)
