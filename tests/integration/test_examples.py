"""The worked examples as acceptance tests on the real stack: commands -> Postgres ->
Debezium -> broker -> Spark projections -> read models, KTables and derived-event topics."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from sqlalchemy import Engine, text

from eventfold.contract import EventEnvelope, event_topic
from eventfold.outbox.design import OutboxDesign
from eventfold.projections import Lookup
from eventfold.projections.replay import replay
from eventfold.projections.state.catalog import ProjectionCatalog, VersionSwitched
from eventfold.projections.state.store import ReadModelStore
from examples import orders, point_of_sale, sales
from tests.kafka_helpers import produce, read_table, read_topic
from tests.pipeline_helpers import (
    catch_up,
    make_runner,
    renamed,
    rows,
    runner_settings,
    wait_for,
    wait_until_in_topic,
)
from tests.support.read_api import get, read_api


def derived(settings, topic: str, prefix: str) -> list[dict]:
    return [json.loads(r["value"]) for r in read_topic(settings.kafka, topic)
            if (r["key"] or "").startswith(prefix)]


def test_sales_targets_notify_once_per_crossing_also_across_a_replay(
        stack_settings, spark, engine, unique) -> None:
    sales.app.runtime(stack_settings).setup()
    totals = renamed(sales.sales_totals, unique)
    bus = sales.app.runtime(stack_settings).command_bus()

    def product(n: int) -> str:
        return f"{unique}-product{n}"

    for n, value in [(2, 1000), (1, 1500), (1, 1000), (2, 1300), (5, 1000)]:
        bus.execute(sales.RecordSale(product=product(n), value=value))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 5)
    expected = {product(1): 2500, product(2): 2300, product(5): 1000}

    def notified() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for event in derived(stack_settings, sales.NOTIFICATIONS_TOPIC, unique):
            assert event["eventType"] == "SalesTargetReached"
            found.setdefault(event["data"]["product"], []).append(event["data"]["total"])
        return found

    live = make_runner(spark, stack_settings, totals)
    query = live.start()
    try:
        wait_for(lambda: rows(engine, totals.table, unique, "total") == expected, "totals")
        wait_for(lambda: notified() == {product(1): [2500], product(2): [2300]},
                 "one notification for product1 and product2")

        # Replay while the live version streams and clients keep reading: never a gap.
        seen_sizes: list[int] = []
        stop = threading.Event()

        def keep_reading() -> None:
            while not stop.is_set():
                seen_sizes.append(len(rows(engine, totals.table, unique, "total")))

        reader = threading.Thread(target=keep_reading)
        reader.start()
        try:
            result = replay(spark, totals, runner_settings(stack_settings))
        finally:
            stop.set()
            reader.join()
        assert (result.old_version, result.new_version) == (1, 2)
        assert len(seen_sizes) > 10 and set(seen_sizes) == {3}
        assert rows(engine, totals.table, unique, "total") == expected
        new_topic = totals.ktable_topic_for(2)
        assert {k: v["total"] for k, v in read_table(stack_settings.kafka,
                                                      new_topic).items()
                if k.startswith(unique)} == expected  # other tests' sales share the topic
        assert notified() == {product(1): [2500], product(2): [2300]}  # not again

        # The old live version stops at its next batch; `projection run` restarts on v2.
        bus.execute(sales.DelistProduct(product=product(1)))
        wait_for(lambda: not query.isActive, "the v1 query to stop after the switch")
        assert isinstance(query.exception(), VersionSwitched)
        assert "v1 is no longer active or building (active: v2)" in str(query.exception())
    finally:
        if query.isActive:
            query.stop()
        live.close()
    assert ProjectionCatalog(stack_settings.database_url).outputs(totals.name) == (
        2, [sales.NOTIFICATIONS_TOPIC])

    catch_up(spark, stack_settings, totals)
    assert product(1) not in rows(engine, totals.table, unique, "total")
    assert product(1) not in read_table(stack_settings.kafka, totals.ktable_topic_for(2))
    bus.execute(sales.RecordSale(product=product(1), value=2000))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 7)
    catch_up(spark, stack_settings, totals)
    assert notified() == {product(1): [2500, 2000], product(2): [2300]}


def test_spark_aggregation_matches_the_event_store(stack_settings, spark, engine,
                                                   unique) -> None:
    sales.app.runtime(stack_settings).setup()
    stats = renamed(sales.sales_stats, unique)
    bus = sales.app.runtime(stack_settings).command_bus()
    values = {f"{unique}-a": [5, 7, 11], f"{unique}-b": [3]}
    for name, amounts in values.items():
        for value in amounts:
            bus.execute(sales.RecordSale(product=name, value=value))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 4)
    catch_up(spark, stack_settings, stats)
    bus.execute(sales.RecordSale(product=f"{unique}-a", value=2))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 5)
    catch_up(spark, stack_settings, stats)  # a second batch merges into the stored aggregate
    assert rows(engine, stats.table, unique, "revenue") == {f"{unique}-a": 25, f"{unique}-b": 3}
    assert rows(engine, stats.table, unique, "sales") == {f"{unique}-a": 4, f"{unique}-b": 1}
    assert rows(engine, stats.table, unique, "largest_sale") == {f"{unique}-a": 11,
                                                                 f"{unique}-b": 3}
    ktable = read_table(stack_settings.kafka, stats.ktable_topic)
    assert ktable[f"{unique}-a"] == {"revenue": 25, "sales": 4, "largest_sale": 11}


def test_poison_events_of_an_aggregation_are_dead_lettered_and_the_rest_counts(
        stack_settings, spark, engine, unique) -> None:
    """The Spark path (each read task decodes and aggregates its partition): each bad record,
    a value that is not UTF-8 among them, is a dead letter of its own, with its raw value and
    reason, and the good ones aggregate."""
    sales.app.runtime(stack_settings).setup()
    stats = renamed(sales.sales_stats, unique)
    bus = sales.app.runtime(stack_settings).command_bus()
    topic = event_topic("ProductSales")
    list_payload = EventEnvelope(event_id=f"{unique}-x", event_type="SaleRecorded",
                                 stream_id=f"{unique}-list", stream_version=1,
                                 global_position=1, recorded_at="", data={}).encode()[1]
    list_payload = list_payload.replace('"payload": "{}"', '"payload": "[1, 2]"')
    produce(stack_settings.kafka, topic, f"{unique}-garbled", "{not json")
    produce(stack_settings.kafka, topic, f"{unique}-list", list_payload)
    # Each of these, handed to Arrow's JSON reader, would kill the Python worker.
    produce(stack_settings.kafka, topic, f"{unique}-null", "null")
    produce(stack_settings.kafka, topic, f"{unique}-null-payload",
            list_payload.replace('"payload": "[1, 2]"', '"payload": "null"'))
    latin1 = EventEnvelope(event_id=f"{unique}-y", event_type="SaleRecorded",
                           stream_id=f"{unique}-latin1", stream_version=1, global_position=2,
                           recorded_at="", data={"product": f"{unique}-a", "value": 100}
                           ).encode()[1].replace('"eventType"', '"note": "\u00e6", "eventType"')
    produce(stack_settings.kafka, topic, f"{unique}-latin1", latin1.encode("latin-1"))
    for value in (5, 7):
        bus.execute(sales.RecordSale(product=f"{unique}-a", value=value))
    wait_until_in_topic(stack_settings, "ProductSales", unique, 7)
    catch_up(spark, stack_settings, stats)

    assert rows(engine, stats.table, unique, "revenue") == {f"{unique}-a": 12}
    letters = {letter["key"]: letter for letter in (
        json.loads(r["value"]) for r in read_topic(stack_settings.kafka,
                                                    stats.dead_letter_topic))}
    assert set(letters) == {f"{unique}-garbled", f"{unique}-list", f"{unique}-latin1",
                            f"{unique}-null", f"{unique}-null-payload"}
    assert letters[f"{unique}-null-payload"]["error"] == "event payload is not a JSON object"
    assert letters[f"{unique}-garbled"]["value"] == "{not json"
    assert "undecodable" in letters[f"{unique}-garbled"]["error"]
    assert letters[f"{unique}-list"]["error"] == "event payload is not a JSON object"
    assert letters[f"{unique}-latin1"]["error"] == "message value is not UTF-8 text"
    assert all(letter["topic"] == topic for letter in letters.values())


@contextmanager
def unpublished(engine: Engine) -> Iterator[None]:
    """What is committed meanwhile never reaches the topics: the table Debezium captures is
    out of the publication (whichever the outbox design)."""
    with engine.begin() as conn:
        table = OutboxDesign(conn.execute(text("SELECT design FROM eventfold_outbox_design"))
                             .scalar_one()).captured_table
        conn.execute(text(f"ALTER PUBLICATION eventfold_outbox DROP TABLE {table}"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER PUBLICATION eventfold_outbox ADD TABLE {table}"))


def kept_count(settings, definition, version: int) -> int | None:
    """The live rows the version's batches kept (a replay's tasks wrote them directly)."""
    store = ReadModelStore(settings.database_url, definition, version)
    try:
        return store.row_count()
    finally:
        store.close()


def view_count(engine, definition) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f'SELECT count(*) FROM "{definition.table}"')).scalar())


def test_replay_from_the_event_store_recovers_what_the_topics_no_longer_hold(
        stack_settings, spark, engine, unique) -> None:
    """Events the topics lost (here: written to the store while it was out of the outbox's
    publication, as if their retention had passed) come back through a replay that reads the
    store first; events of the same streams that are on the topics too count once."""
    sales.app.runtime(stack_settings).setup()
    bus = sales.app.runtime(stack_settings).command_bus()
    old1, old2, new1 = (f"{unique}-{name}" for name in ("old1", "old2", "new1"))
    with unpublished(engine), engine.begin() as conn:
        for product, version, value in [(old1, 1, 700), (old1, 2, 300), (old2, 1, 40)]:
            conn.execute(text(
                "INSERT INTO events (event_id, stream_id, stream_type, stream_version, "
                "event_type, data) VALUES (gen_random_uuid(), :p, 'ProductSales', :v, "
                "'SaleRecorded', CAST(:d AS jsonb))"),
                {"p": product, "v": version,
                 "d": json.dumps({"product": product, "value": value})})
    bus.execute(sales.RecordSale(product=new1, value=5))
    bus.execute(sales.RecordSale(product=old2, value=2))  # version 2, on the topic
    wait_until_in_topic(stack_settings, "ProductSales", unique, 2)
    totals, stats = renamed(sales.sales_totals, unique), renamed(sales.sales_stats, unique)
    for definition in (totals, stats):
        catch_up(spark, stack_settings, definition)  # v1 from the topics: the head is missing
    assert rows(engine, totals.table, unique, "total") == {new1: 5, old2: 2}

    expected = {old1: 1000, old2: 42, new1: 5}  # what a fold of the event store gives
    for definition, column in ((totals, "total"), (stats, "revenue")):
        result = replay(spark, definition, runner_settings(stack_settings), source="store")
        assert result.new_version == 2
        assert rows(engine, definition.table, unique, column) == expected
        ktable = read_table(stack_settings.kafka, definition.ktable_topic_for(2))
        assert {k: v[column] for k, v in ktable.items() if k.startswith(unique)} == expected
        assert kept_count(stack_settings, definition, 2) == view_count(engine, definition)
    assert rows(engine, stats.table, unique, "sales") == {old1: 2, old2: 2, new1: 1}

    bus.execute(sales.RecordSale(product=old1, value=1))  # v2 streams on from the topics
    wait_until_in_topic(stack_settings, "ProductSales", unique, 3)
    catch_up(spark, stack_settings, totals)
    assert rows(engine, totals.table, unique, "total")[old1] == 1001


def test_point_of_sale_shipments_loyalty_and_masked_analytics(
        stack_settings, spark, engine, unique) -> None:
    """Stream projections and a re-keyed fold."""
    point_of_sale.app.runtime(stack_settings).setup()
    bus = point_of_sale.app.runtime(stack_settings).command_bus()
    invoices = [("1", "S1", "C1", "PRIME", "HOME-DELIVERY", 100_000, 2),
                ("2", "S2", "C1", "PRIME", "TAKEAWAY", 50_000, 2),
                ("3", "S1", "C2", "NON-PRIME", "HOME-DELIVERY", 10_000, 3)]
    for number, store, customer, kind, delivery, total, lines in invoices:
        bus.execute(point_of_sale.IssueInvoice(
            invoice_no=f"{unique}-{number}", store_id=f"{unique}-{store}",
            customer_id=f"{unique}-{customer}", customer_type=kind, delivery_type=delivery,
            total_cents=total, customer_name="Ada Lovelace", customer_phone="555-123-4567",
            delivery_address="12 Analytical Street",
            items=[{"item_code": f"I{i}", "item_name": f"item {i}", "price_cents": 250,
                    "quantity": 1} for i in range(lines)]))
    wait_until_in_topic(stack_settings, "Store", unique, 3)
    for definition in (point_of_sale.shipments, point_of_sale.loyalty_points,
                       point_of_sale.invoice_analytics):
        catch_up(spark, stack_settings, renamed(definition, unique))

    shipped = derived(stack_settings, point_of_sale.SHIPMENTS_TOPIC, unique)
    assert sorted(e["data"]["invoice_no"] for e in shipped) == [f"{unique}-1", f"{unique}-3"]
    loyalty = derived(stack_settings, point_of_sale.LOYALTY_TOPIC, unique)
    points = sorted((e["data"]["points_earned"], e["data"]["total_points"]) for e in loyalty)
    assert points == [(10, 30), (20, 20)]  # two stores, one customer, one running total
    stored = rows(engine, f"loyalty_points_{unique}", unique, "points")
    assert stored == {f"{unique}-C1": 30}
    assert {type(p) for pair in points for p in pair} | {type(stored[f"{unique}-C1"])} == {int}
    lines = derived(stack_settings, point_of_sale.ANALYTICS_TOPIC, unique)
    assert len(lines) == 7
    assert {line["data"]["customer_name"] for line in lines} == {"Ad**********"}
    assert all("Analytical" not in json.dumps(line) for line in lines)


def test_orders_left_joined_with_customers_and_counted(stack_settings, spark, engine,
                                                       unique) -> None:
    orders.app.runtime(stack_settings).setup()
    customers = renamed(orders.customers, unique)
    per_customer = renamed(orders.orders_per_customer, unique,
                           lookup=Lookup(customers.table, on="customer_id"))
    bus = orders.app.runtime(stack_settings).command_bus()
    bus.execute(orders.RegisterCustomer(customer_id=f"{unique}-c1", name="Ada"))
    bus.execute(orders.RegisterCustomer(customer_id=f"{unique}-c2", name="Grace"))
    for i, customer in enumerate(["c1", "c2", "c1", "ghost"]):
        bus.execute(orders.PlaceOrder(order_id=f"{unique}-o{i}", customer_id=f"{unique}-{customer}",
                                      amount=10.0))
    wait_until_in_topic(stack_settings, "Customer", unique, 2)
    wait_until_in_topic(stack_settings, "Order", unique, 4)
    catch_up(spark, stack_settings, customers)
    catch_up(spark, stack_settings, per_customer)
    assert rows(engine, per_customer.table, unique, "orders") == {
        f"{unique}-c1": 2, f"{unique}-c2": 1, f"{unique}-ghost": 1}
    assert rows(engine, per_customer.table, unique, "customer_name") == {
        f"{unique}-c1": "Ada", f"{unique}-c2": "Grace", f"{unique}-ghost": None}
    ktable = read_table(stack_settings.kafka, per_customer.ktable_topic)
    assert ktable[f"{unique}-ghost"] == {"orders": 1, "amount": 10.0, "customer_name": None}

    # Read-your-writes on the re-keyed read model: the command wrote to the order's stream,
    # the row is the customer's; the read waits for the order's event to be folded.
    server = read_api([per_customer], stack_settings, "orders")
    row = f"/read-models/{per_customer.name}/rows/{unique}-c1"
    try:
        assert get(server, row, min_version=1, stream=f"{unique}-o0").json()["row"][
            "orders"] == 2
        assert "also pass stream=" in get(server, row, min_version=1).json()["detail"]
        assert get(server, row, min_version=2, stream=f"{unique}-o0",
                   wait_ms=300).status_code == 504  # the order's stream has one event
        bus.execute(orders.PlaceOrder(order_id=f"{unique}-o9", customer_id=f"{unique}-c1",
                                      amount=5.0))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(get, server, row, min_version=1, stream=f"{unique}-o9",
                                  wait_ms=30_000)
            wait_until_in_topic(stack_settings, "Order", unique, 5)
            catch_up(spark, stack_settings, per_customer)
            assert waiting.result(timeout=90).json()["row"]["orders"] == 3
    finally:
        server.stop()
