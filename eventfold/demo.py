"""The worked example end to end: stack up, commands over HTTP, Spark projection, reads, down."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from eventfold.app import app_of
from eventfold.config import Settings
from eventfold.local_stack.process import free_port
from eventfold.projections.running_query import stop_gracefully
from eventfold.serving import BackgroundServer

DELIVERIES = [("apples", 5), ("pears", 3), ("apples", 7), ("plums", 11), ("pears", 4),
              ("apples", 2)]


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def run_demo(settings: Settings) -> int:
    demo_dir = Path(settings.stack_dir).parent / "demo"
    stack = settings.local_stack(demo_dir)
    say(f"starting the local stack in {demo_dir} (PostgreSQL, Apache Kafka, Kafka Connect)")
    started = time.monotonic()
    stack.reset()  # the demo's own directory: every run starts from an empty stack
    endpoints = stack.up()
    try:
        say(f"stack up in {time.monotonic() - started:.1f} s: {endpoints.as_env()}")
        settings = settings.replace(
            app="examples.inventory:app",
            database_url=endpoints.database_url, kafka_bootstrap=endpoints.kafka_bootstrap,
            connect_url=endpoints.connect_url, request_log=False,
        )
        table = _run_example(settings)
    finally:
        say("stopping the stack")
        stack.down()
    say("done: every command reached the read model and the KTable exactly once")
    _print_table(table)
    return 0


Table = list[tuple[str, int, int, int]]
"""(product, read model quantity, KTable quantity, expected)."""


def _run_example(settings: Settings) -> Table:
    runtime = app_of(settings).runtime(settings)
    say("migrating the database, creating event topics, applying the Debezium connector")
    runtime.setup()
    commands = BackgroundServer(runtime.command_api(), "127.0.0.1", free_port()).start()
    reads = BackgroundServer(runtime.read_api(), "127.0.0.1", free_port()).start()
    runner = runtime.projection_runner("inventory_totals")
    query = None
    try:
        say(f"command API at {commands.url}, read API at {reads.url}")
        expected = _post_deliveries(commands.url)
        _show_rejections(commands.url)
        say("starting the inventory_totals projection on Spark (streaming)")
        query = runner.start()
        _wait_for(lambda: _totals(reads.url, expected) == expected, "read model totals", 120)
        _wait_for(lambda: _ktable_totals(reads.url, expected) == expected, "KTable totals", 60)
        expected["apples"] += _show_live_latency(commands.url, reads.url)
        _wait_for(lambda: _ktable_totals(reads.url, expected) == expected, "KTable totals", 60)
        table, ktable = _totals(reads.url, expected), _ktable_totals(reads.url, expected)
    finally:
        # Every Kafka client closes before the broker stops: Spark's Python workers with it.
        if query is not None:
            stop_gracefully(query)
        runner.close()
        runner.spark.stop()
        reads.stop()
        commands.stop()
    return [(product, table[product], ktable[product], expected[product])
            for product in sorted(expected)]


def _post_deliveries(url: str) -> dict[str, int]:
    totals: dict[str, int] = {}
    for product, quantity in DELIVERIES:
        response = requests.post(f"{url}/commands/ReceiveStock",
                                 json={"product": product, "quantity": quantity}, timeout=10)
        response.raise_for_status()
        body = response.json()
        totals[product] = totals.get(product, 0) + quantity
        say(f"ReceiveStock {product} +{quantity} -> {response.status_code}, "
            f"{product} at version {body['version']}, position {body['global_positions'][0]}")
    return totals


def _show_rejections(url: str) -> None:
    cases: list[tuple[str, str, dict[str, Any] | str]] = [
        ("malformed JSON", "ReceiveStock", '{"product": "apples", '),
        ("missing field", "ReceiveStock", {"product": "apples"}),
        ("negative quantity", "ReceiveStock", {"product": "apples", "quantity": -3}),
        ("unknown command", "SellStock", {"product": "apples", "quantity": 1}),
        ("stale expected_version", "ReceiveStock",
         {"product": "apples", "quantity": 1, "expected_version": 1}),
    ]
    for label, command, body in cases:
        kwargs: dict[str, Any] = ({"data": body, "headers": {"content-type": "application/json"}}
                                  if isinstance(body, str) else {"json": body})
        response = requests.post(f"{url}/commands/{command}", timeout=10, **kwargs)
        detail = response.json()
        message = detail.get("errors") or detail.get("detail")
        say(f"rejected ({label}): {response.status_code} {message}")


def _totals(url: str, expected: dict[str, int]) -> dict[str, int]:
    found = {}
    for product in expected:
        response = requests.get(f"{url}/read-models/inventory_totals/rows/{product}", timeout=5)
        if response.status_code == 200:
            found[product] = response.json()["row"]["quantity"]
    return found


def _ktable_totals(url: str, expected: dict[str, int]) -> dict[str, int]:
    found = {}
    for product in expected:
        response = requests.get(f"{url}/ktables/inventory_totals/entries/{product}", timeout=5)
        if response.status_code == 200:
            found[product] = response.json()["value"]["quantity"]
    return found


def _print_table(table: Table) -> None:
    say("how many of each product (read API):")
    print(f"    {'product':<10}{'read model':>12}{'KTable':>10}{'expected':>10}")
    for product, in_table, in_ktable, expected in table:
        print(f"    {product:<10}{in_table:>12}{in_ktable:>10}{expected:>10}")


def _show_live_latency(commands_url: str, reads_url: str) -> int:
    """Read-your-writes: the read waits for the version the command returned. Returns the
    quantity it added."""
    started = time.monotonic()
    response = requests.post(f"{commands_url}/commands/ReceiveStock",
                             json={"product": "apples", "quantity": 10}, timeout=10)
    response.raise_for_status()
    version = response.json()["version"]
    read = requests.get(f"{reads_url}/read-models/inventory_totals/rows/apples",
                        params={"min_version": version, "wait_ms": 30_000}, timeout=40)
    read.raise_for_status()
    say(f"live: ReceiveStock apples +10 -> version {version}; GET ...?min_version={version} "
        f"answered after {(time.monotonic() - started) * 1000:.0f} ms with apples = "
        f"{read.json()['row']['quantity']} (lag {read.json()['freshness']['lag_events']})")
    params: dict[str, str | int] = {"quantity.gte": 1, "sort": "-quantity",
                                    "fields": "quantity", "limit": 2}
    page = requests.get(f"{reads_url}/read-models/inventory_totals/rows", params=params,
                        timeout=10).json()
    say("top 2 by quantity (?quantity.gte=1&sort=-quantity&limit=2): "
        + ", ".join(f"{r['key']} {r['quantity']}" for r in page["rows"]))
    return 10


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout_s:.0f} s")
