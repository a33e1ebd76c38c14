"""The stream thread's idle pause, written as Spark's triggers take it, refused when the
configuration loads if it is not an interval."""

from __future__ import annotations

import pytest

from eventfold.config import ConfigError, Settings
from eventfold.contract import interval_seconds


@pytest.mark.parametrize(("interval", "seconds"), [
    ("500 milliseconds", 0.5), ("1 millisecond", 0.001), ("200 ms", 0.2), ("1 second", 1.0),
    ("2 seconds", 2.0), ("1.5 s", 1.5), ("1 minute", 60.0), ("0 seconds", 0.0)])
def test_intervals_as_spark_writes_them(interval: str, seconds: float) -> None:
    assert interval_seconds(interval) == pytest.approx(seconds)


@pytest.mark.parametrize("interval", ["", "500", "fast", "-1 second", "2 fortnights"])
def test_anything_else_is_refused_with_an_example(interval: str) -> None:
    with pytest.raises(ValueError, match="'500 milliseconds'"):
        interval_seconds(interval)


def test_a_malformed_trigger_interval_is_refused_as_the_configuration_loads() -> None:
    with pytest.raises(ConfigError, match=r"EVENTFOLD_TRIGGER_INTERVAL: not an interval: "
                                          r"'fast' \(say, '500 milliseconds'"):
        Settings.from_env({"EVENTFOLD_TRIGGER_INTERVAL": "fast"})
