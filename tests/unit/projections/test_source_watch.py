"""The shared look at the source partitions' ends: one ask per interval for the union of
what the stream threads watch, taken by a thread only when it started after the thread's last
batch, recent, and answered for each of its partitions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner
from eventfold.projections.source_watch import STALE_LOOKS, SourceWatch

KAFKA = KafkaConnection.of("broker:9092")
INTERVAL_S = 0.05


class Planner:
    """Answers every partition's end from ``ends``; counts the asks and what they named."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends
        self.asked: list[frozenset[tuple[str, int]]] = []
        self.failing = False
        self.closed = threading.Event()

    def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        wanted = frozenset(partitions)
        self.asked.append(wanted)
        if self.failing:
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return {key: self.ends[key] for key in wanted}

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def planner() -> Planner:
    return Planner({("a", 0): 5, ("a", 1): 7, ("b", 0): 3})


@pytest.fixture
def watch(planner: Planner) -> Iterator[SourceWatch]:
    def opened(kafka: KafkaConnection) -> OffsetPlanner:
        assert kafka == KAFKA
        return planner  # type: ignore[return-value]

    yield SourceWatch(KAFKA, INTERVAL_S, open_planner=opened)


def test_one_look_per_interval_answers_every_watcher(watch: SourceWatch,
                                                     planner: Planner) -> None:
    before = time.monotonic()
    assert watch.ends([("a", 0)], looked_after=before) is None, "nothing looked at yet"
    watch.watch("first", [("a", 0), ("a", 1)])
    watch.watch("second", [("b", 0)])
    time.sleep(INTERVAL_S * 10)
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0), ("a", 1)], looked_after=before) == {("a", 0): 5, ("a", 1): 7}
    assert watch.ends([("b", 0)], looked_after=before) == {("b", 0): 3}
    union = frozenset({("a", 0), ("a", 1), ("b", 0)})
    assert planner.asked[-1] == union
    assert 5 <= len(planner.asked) <= 12, "one ask per interval, whatever the watchers"


def test_a_look_from_before_the_last_batch_is_not_taken(watch: SourceWatch,
                                                        planner: Planner) -> None:
    watch.watch("thread", [("a", 0)])
    watch.wait_for_look(1.0)
    batch_ended = time.monotonic()
    assert watch.ends([("a", 0)], looked_after=batch_ended) is None
    planner.ends[("a", 0)] = 9
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0)], looked_after=batch_ended) == {("a", 0): 9}


def test_a_partition_the_look_did_not_name_is_asked_for_by_the_thread(
        watch: SourceWatch) -> None:
    watch.watch("thread", [("a", 0)])
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0), ("a", 1)], looked_after=0.0) is None


def test_a_failed_look_sends_each_thread_to_ask_for_itself(watch: SourceWatch,
                                                           planner: Planner) -> None:
    watch.watch("thread", [("a", 0)])
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0)], looked_after=0.0) == {("a", 0): 5}
    planner.failing = True
    watch.wait_for_look(1.0)
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0)], looked_after=0.0) is None
    planner.failing = False
    watch.wait_for_look(1.0)
    watch.wait_for_look(1.0)
    assert watch.ends([("a", 0)], looked_after=0.0) == {("a", 0): 5}


def test_an_old_look_is_not_taken_and_no_client_is_kept_unwatched(
        watch: SourceWatch, planner: Planner) -> None:
    watch.watch("thread", [("a", 0)])
    watch.wait_for_look(1.0)
    watch.unwatch("thread")
    assert planner.closed.wait(1.0), "the watch lets its client go once nothing is watched"
    asked = len(planner.asked)
    time.sleep(STALE_LOOKS * INTERVAL_S + 1.1)  # past where a look is too old to take
    assert len(planner.asked) == asked, "no looks while nothing is watched"
    assert watch.ends([("a", 0)], looked_after=0.0) is None
