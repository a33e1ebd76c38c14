"""Where a replay starts: the topics, or the event store when the topics lost their head."""

from __future__ import annotations

import pytest

from eventfold.projections.replay import reads_event_store

TOPIC = "eventfold.events.Sale"


def test_auto_reads_the_store_only_when_a_partition_no_longer_starts_at_zero() -> None:
    assert not reads_event_store("auto", {(TOPIC, 0): 0, (TOPIC, 1): 0})
    assert reads_event_store("auto", {(TOPIC, 0): 0, (TOPIC, 1): 1_000})
    assert not reads_event_store("auto", {})


def test_an_explicit_source_wins() -> None:
    assert reads_event_store("store", {(TOPIC, 0): 0})
    assert not reads_event_store("kafka", {(TOPIC, 0): 1_000})
    with pytest.raises(ValueError, match="auto, kafka or store"):
        reads_event_store("tape", {})  # type: ignore[arg-type]
