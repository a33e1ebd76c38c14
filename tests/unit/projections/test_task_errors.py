"""An error crossing Spark's boundary is known by its code, not by a class name in text."""

from __future__ import annotations

from eventfold.projections.state.stage import KeySplitAcrossPartitions, StageLost
from eventfold.projections.task_errors import TaskError, raised_in_task


class _Other(TaskError):
    code = "other"


def test_the_error_itself_and_its_code_in_a_drivers_message_are_recognised() -> None:
    split = KeySplitAcrossPartitions("two tasks staged k")
    assert raised_in_task(split, KeySplitAcrossPartitions)
    # What Spark raises on the driver: its own class, the task's traceback in the message.
    from_spark = RuntimeError(f"Job aborted ... Traceback ...\n{type(split).__name__}: {split}")
    assert raised_in_task(from_spark, KeySplitAcrossPartitions)
    assert not raised_in_task(from_spark, _Other)


def test_a_class_name_without_the_code_is_not_recognised() -> None:
    assert not raised_in_task(RuntimeError("KeySplitAcrossPartitions: duplicate key"),
                              KeySplitAcrossPartitions)
    assert not raised_in_task(StageLost("restarted"), KeySplitAcrossPartitions)
