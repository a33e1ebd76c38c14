"""Shared fixtures. Integration fixtures start the real stack once per test session."""

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
            checkpoint_dir=root / "checkpoints",
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


@pytest.fixture
def unique() -> str:
    """A short unique prefix so tests sharing the stack never share keys."""
    return uuid.uuid4().hex[:10]
