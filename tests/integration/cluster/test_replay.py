"""A replay on the cluster stack while two read APIs are polled and a run streams."""

from __future__ import annotations

from tests.integration.test_serving_through_a_replay import through_a_replay


def test_the_same_on_the_cluster_stack(cluster_stack, tmp_path, unique) -> None:
    """Three brokers, two Connect workers, and the run and the replay each on one core of the
    Spark standalone cluster."""
    from examples.inventory import app

    stack, settings = cluster_stack
    app.setup(settings)
    spark = stack.spark.state()
    assert spark is not None
    through_a_replay(app, settings, tmp_path, unique,
                     EVENTFOLD_SPARK_MASTER=spark.master_url,
                     EVENTFOLD_SPARK_CONF="spark.cores.max=1,spark.executor.memory=1g")
