"""How Spark hands a task's error to the driver, which the runner relies on."""

from __future__ import annotations

import pytest


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
