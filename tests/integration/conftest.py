import gc

import pytest
from sqlalchemy import create_engine


@pytest.fixture(scope="session")
def engine(stack_settings):
    """An SQLAlchemy engine on the stack's database."""
    engine = create_engine(stack_settings.database_url)
    yield engine
    engine.dispose()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster_stack(tmp_path_factory):
    """The cluster stack (``stack up --cluster``): Postgres, three brokers (replication
    factor 3, min.insync.replicas 2), two Connect workers and a Spark standalone master with
    two workers, the sales example set up on it; stopped by PID at the end."""
    from eventfold.local_stack import CLUSTER, LocalStack

    from eventfold.config import Settings
    from examples import sales

    root = tmp_path_factory.mktemp("cluster")
    stack = LocalStack(root / "stack")
    try:
        endpoints = stack.up(CLUSTER, spark_cluster=True)
        settings = Settings(database_url=endpoints.database_url,
                            kafka_bootstrap=endpoints.kafka_bootstrap,
                            connect_url=endpoints.connect_url, stack_dir=root / "stack",
                            checkpoint_dir=root / "checkpoints",
                            trigger_interval="200 milliseconds")
        sales.app.setup(settings)
        yield stack, settings
    finally:
        gc.collect()
        stack.down()
