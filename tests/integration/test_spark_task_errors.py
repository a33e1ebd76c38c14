"""Spark's built-in Kafka source and ours fold the same events into the same rows, KTables
and dead letters, and a batch Spark's source hands over again is not counted twice."""

from __future__ import annotations

import pytest

from eventfold.contract import event_topic
from eventfold.projections import Projection
from examples import sales
from tests.kafka_helpers import produce, read_table, read_topic
from tests.pipeline_helpers import (
    catch_up,
    make_runner,
    renamed,
    rows,
    topic_records,
    wait_until_in_topic,
)

SALES = [("a", 1500), ("b", 700), ("a", 1000), ("c", 300), ("b", 2000), ("a", 250)]


def _columns(definition: Projection) -> list[str]:
    return ["total"] if definition is sales.sales_totals else ["revenue", "sales",
                                                                "largest_sale"]


def _state(engine, settings, projection: Projection, columns: list[str], unique: str) -> tuple:
    return ({column: rows(engine, projection.table, unique, column) for column in columns},
            {k: v for k, v in read_table(settings.kafka, projection.ktable_topic_for(1)).items()
             if k.startswith(unique)},
            sorted(r["key"] for r in read_topic(settings.kafka, projection.dead_letter_topic)
                   if (r["key"] or "").startswith(unique)))


@pytest.mark.parametrize("definition", [sales.sales_totals, sales.sales_stats],
                         ids=["fold", "aggregation"])
def test_spark_kafka_source_folds_like_ours(stack_settings, spark, engine, unique,
                                            definition: Projection) -> None:
    sales.app.runtime(stack_settings).setup()
    bus = sales.app.runtime(stack_settings).command_bus()
    for product, value in SALES:
        bus.execute(sales.RecordSale(product=f"{unique}-{product}", value=value))
    bus.execute(sales.DelistProduct(product=f"{unique}-c"))
    topic = event_topic("ProductSales")
    produce(stack_settings.kafka, topic, f"{unique}-poison", b"\xff not an event")
    wait_until_in_topic(stack_settings, "ProductSales", unique, len(SALES) + 2)

    ours = renamed(definition, f"{unique}_ours")
    spark_kafka = renamed(definition, f"{unique}_spark")
    catch_up(spark, stack_settings, ours)
    # Batches smaller than the shared topic: several, each merging into what the last stored.
    catch_up(spark, stack_settings, spark_kafka, streaming_driver="structured_streaming",
             max_rows_per_batch=topic_records(stack_settings, "ProductSales") // 3 + 1)
    columns = _columns(definition)
    expected = _state(engine, stack_settings, ours, columns, unique)
    assert expected[0][columns[0]][f"{unique}-a"] == 2750
    assert expected[2] == [f"{unique}-poison"]
    assert _state(engine, stack_settings, spark_kafka, columns, unique) == expected

    # Spark's source hands over records the store committed, beside new ones (a batch run
    # again after a crash, with events appended since): only the new ones count.
    bus.execute(sales.RecordSale(product=f"{unique}-a", value=5))
    wait_until_in_topic(stack_settings, "ProductSales", unique, len(SALES) + 3)
    catch_up(spark, stack_settings, ours)
    runner = make_runner(spark, stack_settings, spark_kafka,
                         streaming_driver="structured_streaming")
    try:
        whole_topic = (spark.read.format("kafka")
                       .option("kafka.bootstrap.servers", stack_settings.kafka.bootstrap_servers)
                       .option("subscribe", topic).load())
        next_batch = runner.store.checkpoint().batch_id + 1
        runner.process_records(whole_topic, next_batch)
        runner.process_records(whole_topic, next_batch + 1)
    finally:
        runner.close()
    expected = _state(engine, stack_settings, ours, columns, unique)
    assert expected[0][columns[0]][f"{unique}-a"] == 2755
    assert _state(engine, stack_settings, spark_kafka, columns, unique) == expected


def test_an_error_raised_in_a_spark_task_is_known_on_the_driver_by_its_code(spark) -> None:
    """Spark hands the driver its own error, holding the task's traceback as text: the
    runner's fallback after a key found in two partitions knows the task's error by its
    code."""
    from eventfold.projections.state.stage import KeySplitAcrossPartitions
    from eventfold.projections.task_errors import raised_in_task

    def split(_: object) -> None:
        raise KeySplitAcrossPartitions("two tasks staged the key k-1")

    with pytest.raises(Exception) as raised:
        spark.sparkContext.parallelize([1], 1).foreach(split)
    assert not isinstance(raised.value, KeySplitAcrossPartitions)
    assert raised_in_task(raised.value, KeySplitAcrossPartitions)
    assert "two tasks staged the key k-1" in str(raised.value)
    assert not raised_in_task(RuntimeError("KeySplitAcrossPartitions"), KeySplitAcrossPartitions)
