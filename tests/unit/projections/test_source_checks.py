"""A partition that ends before the offset a checkpoint has read up to: a topic made again."""

from __future__ import annotations

from eventfold.projections.retention import ends_behind


def test_a_partition_ending_before_the_checkpoint_is_behind_and_one_past_it_is_not() -> None:
    committed = {("t", 0): 5, ("t", 1): 3}
    assert ends_behind(committed, {("t", 0): 2, ("t", 1): 3}) == {("t", 0): (5, 2)}
    assert ends_behind(committed, {("t", 0): 5, ("t", 1): 9}) == {}
    assert ends_behind({}, {("t", 2): 0}) == {}  # a partition never read from
