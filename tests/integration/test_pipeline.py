"""The whole pipeline on the real stack: command API -> Postgres -> Debezium on Connect ->
broker -> Spark projection -> read model + KTable -> read API."""

from __future__ import annotations

import dataclasses
import json

import requests
from sqlalchemy import text

from eventfold.contract import event_topic
from eventfold.local_stack.process import free_port
from eventfold.projections.running_query import stop_gracefully
from eventfold.projections.status import projection_status
from eventfold.serving import BackgroundServer
from examples.inventory import ReceiveStock, inventory_totals
from tests.kafka_helpers import produce, read_table, read_topic
from tests.pipeline_helpers import (
    catch_up,
    make_runner,
    store_totals,
    topic_records,
    wait_for,
    wait_until_in_topic,
)

PRODUCT_TOPIC = event_topic("Product")


def reference_totals(engine, prefix: str) -> dict[str, int]:
    return store_totals(engine, "Product", "quantity", prefix)


def read_model_totals(engine, table: str, prefix: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT key, quantity FROM "{table}" WHERE key LIKE :p'),
                            {"p": f"{prefix}%"}).all()
    return {key: int(quantity) for key, quantity in rows}


def ktable_totals(settings, topic: str, prefix: str) -> dict[str, int]:
    return {k: v["quantity"] for k, v in read_table(settings.kafka, topic).items()
            if k.startswith(prefix)}


def copy_of(projection, unique: str):
    return dataclasses.replace(projection, name=f"inv_{unique}", table="", ktable_topic="")


def send(bus, prefix: str, deliveries: list[tuple[int, int]]) -> None:
    for product, quantity in deliveries:
        bus.execute(ReceiveStock(product=f"{prefix}-{product}", quantity=quantity))


def test_commands_reach_read_model_and_ktable_through_the_real_stack(
        inventory_app, stack_settings, spark, engine, unique) -> None:
    commands = BackgroundServer(inventory_app.runtime(stack_settings).command_api(), "127.0.0.1",
                                free_port()).start()
    reads = BackgroundServer(inventory_app.runtime(stack_settings).read_api(), "127.0.0.1",
                             free_port()).start()
    runner = make_runner(spark, stack_settings, inventory_totals)
    query = runner.start()
    try:
        expected: dict[str, int] = {}
        written: dict[str, int] = {}
        for i in range(24):
            product, quantity = f"{unique}-{i % 3}", i + 1
            response = requests.post(f"{commands.url}/commands/ReceiveStock",
                                     json={"product": product, "quantity": quantity}, timeout=10)
            assert response.status_code == 201, response.text
            expected[product] = expected.get(product, 0) + quantity
            written[product] = response.json()["version"]

        # Read-your-writes: each read waits until the projection applied the version the
        # command returned, so the very first read already shows the write.
        for product, version in written.items():
            r = requests.get(f"{reads.url}/read-models/inventory_totals/rows/{product}",
                             params={"min_version": version, "wait_ms": 30_000}, timeout=40)
            assert r.status_code == 200, r.text
            assert r.json()["row"]["quantity"] == expected[product]
            assert r.json()["row"]["_version"] == version == 8
        assert read_model_totals(engine, "inventory_totals", unique) == expected
        assert reference_totals(engine, unique) == expected
        # The running version's topic: a replay in an earlier test may have made it v2.
        wait_for(lambda: ktable_totals(stack_settings,
                                       inventory_totals.ktable_topic_for(runner.version),
                                       unique) == expected, "KTable totals (whole topic)")
        product = f"{unique}-0"
        entry = f"{reads.url}/ktables/inventory_totals/entries/{product}"
        # The read API started with this test: until its KTable store has restored, its routes
        # answer 503 with Retry-After (seen once in CI, 503 in 1 ms), which a client retries.
        answers: list[requests.Response] = []
        wait_for(lambda: answers.append(requests.get(entry, params={"min_version": 8},
                                                     timeout=10))
                 or answers[-1].status_code != 503, "the KTable restored", timeout_s=30)
        answered = answers[-1]
        assert answered.status_code == 200, answered.text
        body = answered.json()
        assert body["value"] == {"quantity": expected[product]}
        assert body["version"] == 8
        page = requests.get(f"{reads.url}/read-models/inventory_totals/rows",
                            params={"key.prefix": f"{unique}-", "limit": 2}, timeout=5).json()
        assert [r["key"] for r in page["rows"]] == [f"{unique}-0", f"{unique}-1"]
        rest = requests.get(f"{reads.url}/read-models/inventory_totals/rows",
                            params={"key.prefix": f"{unique}-", "limit": 2,
                                    "cursor": page["next_cursor"]}, timeout=5).json()
        assert [r["key"] for r in rest["rows"]] == [f"{unique}-2"]
        assert rest["next_cursor"] is None
        # the count the Spark tasks' batches kept, as exact as counting the view
        counted = requests.get(f"{reads.url}/read-models/inventory_totals/count",
                               timeout=5).json()
        with engine.connect() as conn:
            rows = conn.execute(text('SELECT count(*) FROM "inventory_totals"')).scalar()
        assert (counted["count"], counted["exact"]) == (rows, True), counted
    finally:
        stop_gracefully(query)
        runner.close()
        reads.stop()
        commands.stop()


def test_restart_gives_exact_totals_with_redelivered_events(
        inventory_app, stack_settings, spark, engine, unique) -> None:
    projection = copy_of(inventory_totals, unique)
    bus = inventory_app.runtime(stack_settings).command_bus()
    send(bus, unique, [(i % 4, i + 1) for i in range(20)])
    wait_until_in_topic(stack_settings, "Product", unique, 20)
    first = catch_up(spark, stack_settings, projection,
                     max_rows_per_batch=topic_records(stack_settings, "Product") // 3 + 1)
    assert first.batches >= 2, "a small batch cap should have split the catch-up"
    assert read_model_totals(engine, projection.table, unique) == reference_totals(engine, unique)

    # While the projection is stopped: more commands, and Debezium-style redelivery of events
    # the projection has already applied (same event, new offsets).
    send(bus, unique, [(i % 5, 100 + i) for i in range(15)])
    already_applied = [r for r in read_topic(stack_settings.kafka, PRODUCT_TOPIC)
                       if (r["key"] or "").startswith(unique)][:6]
    for record in already_applied:
        produce(stack_settings.kafka, PRODUCT_TOPIC, record["key"], record["value"])
    wait_until_in_topic(stack_settings, "Product", unique, 35 + len(already_applied))

    catch_up(spark, stack_settings, projection)
    expected = reference_totals(engine, unique)
    assert len(expected) == 5
    assert read_model_totals(engine, projection.table, unique) == expected
    assert ktable_totals(stack_settings, projection.ktable_topic, unique) == expected


def test_a_catch_up_folds_in_batches_of_at_most_max_rows_and_stops_at_the_end(
        inventory_app, stack_settings, spark, engine, unique) -> None:
    """``--once`` folds the records there were at its start, ``max_rows_per_batch`` at most
    per batch, and stops by itself."""
    projection = copy_of(inventory_totals, unique)
    send(inventory_app.runtime(stack_settings).command_bus(), unique,
         [(i % 3, 1) for i in range(12)])
    wait_until_in_topic(stack_settings, "Product", unique, 12)
    runner = make_runner(spark, stack_settings, projection, max_rows_per_batch=5)
    try:
        query = runner.start(once=True)
        assert query.awaitTermination(600) and query.exception() is None
    finally:
        runner.close()
    read = sum(runner.offsets.values())  # a new projection reads every partition from 0
    assert read >= 12 and runner.batches == -(-read // 5)
    assert read_model_totals(engine, projection.table, unique) == {
        f"{unique}-{i}": 4 for i in range(3)}


def test_poison_event_goes_to_dead_letter_topic_and_projection_continues(
        inventory_app, stack_settings, spark, engine, unique) -> None:
    projection = copy_of(inventory_totals, unique)
    poison_key = f"{unique}-poison"
    produce(stack_settings.kafka, PRODUCT_TOPIC, poison_key, "{this is not json")
    send(inventory_app.runtime(stack_settings).command_bus(), unique, [(1, 5)])
    wait_until_in_topic(stack_settings, "Product", unique, 2)
    catch_up(spark, stack_settings, projection)

    assert read_model_totals(engine, projection.table, unique) == {f"{unique}-1": 5}
    letters = [json.loads(r["value"]) for r in read_topic(stack_settings.kafka,
                                                          projection.dead_letter_topic)]
    ours = [letter for letter in letters if letter["key"] == poison_key]
    assert len(ours) == 1
    assert ours[0]["topic"] == PRODUCT_TOPIC
    assert "undecodable" in ours[0]["error"]
    assert ours[0]["value"] == "{this is not json"
    status = projection_status(projection, stack_settings.database_url,
                               stack_settings.kafka)
    assert status.dead_letters == len(letters)
    assert status.lag == 0 and status.partitions
    assert status.rows is not None and status.rows >= 1
    assert status.batch_id is not None and status.last_batch_at is not None
    assert f"{status.dead_letters:,} dead letters" in status.describe()
