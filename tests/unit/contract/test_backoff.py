"""The one back-off rule: none after no failure, the first pause, then doubling to a cap."""

from __future__ import annotations

from eventfold.contract.backoff import doubled


def test_a_pause_doubles_with_each_failure_in_a_row_up_to_its_cap() -> None:
    assert [doubled(0.5, n, 10.0) for n in range(7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert doubled(2.0, 1_000, 30.0) == 30.0  # a long run of failures does not overflow
