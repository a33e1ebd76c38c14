"""A reader's advisory progress in its consumer group: committed at most once a second while
batches come, and whatever is noted when the reader closes."""

from __future__ import annotations

import time
from typing import Any

from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import GroupProgress


class Recorder:
    """Stands in for the group's consumer: keeps what each commit sent."""

    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []
        self.closed = False

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        assert not asynchronous
        self.commits.append([(o.topic, o.partition, o.offset) for o in offsets])

    def close(self) -> None:
        self.closed = True


def test_batches_within_the_interval_are_committed_together_and_at_close() -> None:
    progress = GroupProgress(KafkaConnection.of("127.0.0.1:1"), "g", every_s=0.3)
    progress._consumer.close()
    recorder = progress._consumer = Recorder()  # type: ignore[assignment]
    progress.commit({("t", 0): 5})
    progress.commit({("t", 1): 3})
    progress.commit({("t", 0): 9})
    assert recorder.commits == [[("t", 0, 5)]], "the first at once, the others wait"
    time.sleep(0.35)
    progress.commit({("t", 1): 4})
    assert recorder.commits[1:] == [[("t", 0, 9), ("t", 1, 4)]]
    progress.commit({("t", 0): 12})
    progress.close()
    assert recorder.commits[2:] == [[("t", 0, 12)]], "what is noted goes out at close"
    assert recorder.closed
