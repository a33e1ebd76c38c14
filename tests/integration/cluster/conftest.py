"""Tests on the cluster stack: three brokers, two Connect workers, a Spark standalone
cluster."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(scope="package")
def cluster_stack(tmp_path_factory):
    """The cluster stack (``stack up --cluster``): Postgres, three brokers (replication factor
    3, min.insync.replicas 2), two Connect workers and a Spark standalone master with two
    workers, the sales example set up on it; stopped by PID after this package's tests (a
    cluster idling beside the rest of the suite would slow its timing-sensitive tests)."""
    from eventfold.config import Settings
    from eventfold.local_stack import CLUSTER, LocalStack
    from examples import sales

    root = tmp_path_factory.mktemp("cluster")
    stack = LocalStack(root / "stack")
    try:
        endpoints = stack.up(CLUSTER, spark_cluster=True)
        settings = Settings(database_url=endpoints.database_url,
                            kafka_bootstrap=endpoints.kafka_bootstrap,
                            connect_url=endpoints.connect_url, stack_dir=root / "stack",
                            trigger_interval="200 milliseconds")
        sales.app.runtime(settings).setup()
        yield stack, settings
    finally:
        gc.collect()
        stack.down()
