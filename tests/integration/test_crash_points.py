"""Exactly-once effect at the worst moments: a projection process dies at each step of a
batch's write and commit protocol (``projections.faults``: an executor's Python worker after
it staged its rows and handed its records to the producer, or after it flushed them; the
driver inside the commit's transaction, or right after it), as the CLI runs it. Started again,
it leaves the read model, the KTable and the derived events exactly what a fold of the event
store gives: nothing lost, nothing counted twice (a derived event may be sent twice, with the
same id and content: consumers drop the copy)."""

from __future__ import annotations

import json

import pytest
from eventfold.projections.faults import CRASH_EXIT_CODE, POINTS

from examples import sales
from tests.integration.test_cli import eventfold, stack_env
from tests.kafka_helpers import read_topic
from tests.pipeline_helpers import (
    ktable_totals,
    rows,
    sales_totals_of_the_store,
    wait_until_in_topic,
)

SALES = [("a", 1500), ("b", 1000), ("a", 600), ("c", 2500), ("b", 500), ("d", 700)]
"""a crosses the target (2000) at 2100, c at 2500; b and d stay below."""


@pytest.fixture(scope="module")
def sold(stack_settings, tmp_path_factory) -> str:
    """The sales, once, for every crash point's projection to fold."""
    prefix = f"crash-{tmp_path_factory.mktemp('crash').name}"
    sales.app.setup(stack_settings)
    bus = sales.app.command_bus(stack_settings)
    for product, value in SALES:
        bus.execute(sales.RecordSale(product=f"{prefix}-{product}", value=value))
    bus.execute(sales.DelistProduct(product=f"{prefix}-d"))
    wait_until_in_topic(stack_settings, "ProductSales", prefix, len(SALES) + 1)
    return prefix


@pytest.mark.parametrize("point", sorted(POINTS))
def test_a_crash_at_each_step_of_a_batch_leaves_every_output_exact(
        point, sold, stack_settings, engine, tmp_path) -> None:
    name = f"crash_{point.replace('.', '_')}_{tmp_path.name[-8:]}"
    crashed = tmp_path / "crashed"
    env = stack_env(stack_settings, tmp_path, EVENTFOLD_APP="tests.renamed_app:app",
                    EVENTFOLD_TEST_PROJECTION=name)
    first = eventfold("projection", "run", name, "--once", env={
        **env, "EVENTFOLD_CRASH_AT": point, "EVENTFOLD_CRASH_ONCE": str(crashed)}, timeout=300)
    assert crashed.read_text() == point, first.stderr[-3000:]  # it died where armed
    if point.startswith("commit."):  # the driver died: the run with it
        assert first.returncode == CRASH_EXIT_CODE, first.stderr[-3000:]
    else:  # a Python worker died: its task failed the batch, and the run started again
        assert first.returncode == 0, first.stderr[-3000:]
        assert "starting again" in first.stderr, first.stderr[-3000:]
    again = eventfold("projection", "run", name, "--once", env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]

    expected = sales_totals_of_the_store(engine, sold)
    del expected[f"{sold}-d"]  # delisted: no row, a tombstone
    assert rows(engine, name, sold, "total") == expected
    assert ktable_totals(stack_settings, name, sold) == expected
    notifications = [m for m in read_topic(stack_settings.kafka, sales.NOTIFICATIONS_TOPIC)
                     if (m["key"] or "").startswith(sold)
                     and json.loads(m["value"])["projection"] == name]
    by_id: dict[str, str] = {}
    for message in notifications:  # a copy sent again is the same message
        event_id = json.loads(message["value"])["eventId"]
        assert by_id.setdefault(event_id, message["value"]) == message["value"]
    assert sorted((json.loads(v)["data"]["product"], json.loads(v)["data"]["total"])
                  for v in by_id.values()) == [(f"{sold}-a", 2100), (f"{sold}-c", 2500)]
