"""Shared fixtures, and the suite's tiers. Integration fixtures start the real stack once
per test session (per xdist worker).

Every test is in one tier (docs/testing.md): ``unit`` (tests/unit: no stack), ``stack`` (the
session's shared stack; projections, hosts and reaction runners in this process, on the shared
Spark session, and one CLI smoke test per verb) or ``drill`` (processes of their own killed or
frozen from outside, stacks of their own, the cluster, the first app, the fault campaign: the
modules ``DRILLS`` names, and tests marked ``pytest.mark.drill``). ``scripts/test.sh`` runs
all three, ``scripts/test.sh --fast`` the first two."""

from __future__ import annotations

import gc
import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from eventfold.config import Settings

SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"
"""The suite's JVMs (Spark drivers, brokers, Connect workers; tests' processes inherit the
environment) live seconds to minutes, mostly starting: Java's optimising compiler would spend
more CPU than it saves, on a machine the suite keeps busy. Only the first tier compiles, for
every JVM of the suite and none of a user's (docs/deployment.md has the figures)."""

if SHORT_LIVED_JVM not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(
        filter(None, (os.environ.get("JAVA_TOOL_OPTIONS"), SHORT_LIVED_JVM)))


@pytest.fixture(scope="session")
def stack_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Postgres, Apache Kafka and Kafka Connect on free ports; stopped by PID at the end."""
    from eventfold.local_stack import LocalStack

    for noisy in ("alembic", "httpx", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    root = tmp_path_factory.mktemp("eventfold")
    stack = LocalStack(root / "stack")
    endpoints = stack.up()
    try:
        yield Settings(
            database_url=endpoints.database_url,
            kafka_bootstrap=endpoints.kafka_bootstrap,
            connect_url=endpoints.connect_url,
            stack_dir=root / "stack",
            state_dir=root / "state",
            trigger_interval="200 milliseconds",
        )
    finally:
        # Kafka clients that tests left to the garbage collector go now, while the broker is
        # up: after it stops they would log connection errors at interpreter exit.
        gc.collect()
        stack.down()


@pytest.fixture(scope="session")
def inventory_app(stack_settings: Settings):
    """The inventory example, set up on the stack: migrated, topics created, connector RUNNING."""
    from examples.inventory import app

    app.runtime(stack_settings).setup()
    return app


@pytest.fixture(scope="session")
def spark(stack_settings: Settings):
    from eventfold.projections.execution.spark import spark_session
    from eventfold.wiring import spark_conf

    session = spark_session("local[2]", app_name="eventfold-tests",
                            extra_conf=spark_conf(stack_settings))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def eventfold_wheel(tmp_path_factory: pytest.TempPathFactory):
    """Eventfold's wheel, built once per test run (``tests/packaging.py``)."""
    from tests.packaging import run_dir_of, wheel_of_this_run

    return wheel_of_this_run(run_dir_of(tmp_path_factory.getbasetemp()))


@pytest.fixture
def unique() -> str:
    """A short unique prefix so tests sharing the stack never share keys."""
    return uuid.uuid4().hex[:10]


DRILLS = frozenset({
    "test_campaign", "test_cdc_operations", "test_cli", "test_crash_points", "test_dashboard",
    "test_demo", "test_first_app", "test_ktable_instances", "test_one_writer",
    "test_projection_host", "test_reactions", "test_reactions_frozen",
    "test_read_api_operations", "test_read_side_drills", "test_sales_targets",
    "test_secured_kafka", "test_serving_through_a_replay", "test_node_failures",
    "test_spark_cluster",
})
"""The modules of the ``drill`` tier."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test in its tier (before ``-m`` selects by them): the drill modules' tests and
    those marked ``drill`` are drills, the rest of tests/integration ``stack``, tests/unit
    ``unit``."""
    for item in items:
        if item.path.stem in DRILLS:
            item.add_marker(pytest.mark.drill)
        if item.get_closest_marker("drill") is None:
            unit = "tests/unit/" in item.path.as_posix()
            item.add_marker(pytest.mark.unit if unit else pytest.mark.stack)
