"""The restore of a KTable view's partitions from their topic, as Kafka Streams'
``StoreChangelogReader`` restores a task's stores from their changelogs: each partition is
registered with the offset it restores from (its store's checkpoint, or the topic's first)
and the end offset it must reach (the topic's end when it was registered); it is served once
it gets there, and follows the topic from then on.

Each partition is in one of these states, and moves only as shown (anything else is a bug,
raised as ``IllegalTransition``)::

    (registered) --> RESTORING --(reached its end offset)--> RESTORED
        \\________________________________________________/^     |
         a reader that took the writer's place, with the  |     | its store wiped (a topic
         partition restored as a reader: it stays so      |     v recreated): restored again
                                                        RESTORING

A partition let go of is forgotten; registered again, it starts over.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class RestoreState(enum.Enum):
    RESTORING = "restoring"
    RESTORED = "restored"


_MOVES: dict[RestoreState | None, frozenset[RestoreState]] = {
    None: frozenset({RestoreState.RESTORING, RestoreState.RESTORED}),
    RestoreState.RESTORING: frozenset({RestoreState.RESTORED, RestoreState.RESTORING}),
    RestoreState.RESTORED: frozenset({RestoreState.RESTORING}),
}


class IllegalTransition(RuntimeError):
    """A partition was moved where its state does not allow."""


@dataclass(frozen=True)
class RestoreProgress:
    records: int
    total: int
    restored: bool
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"records": self.records, "total": self.total, "restored": self.restored,
                "seconds": round(self.seconds, 3), "records_per_s": round(self.records_per_s)}


@dataclass
class _Partition:
    state: RestoreState
    position: int
    target: int


class Restoration:
    """The writer's restore of a view's partitions: which are restoring and which restored,
    and how far the restore has come."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._partitions: dict[int, _Partition] = {}
        self._records = 0
        self._total = 0
        self._started_at = time.monotonic()
        self._seconds: float | None = None

    # -- moves ---------------------------------------------------------------------------------
    def register(self, partition: int, start: int, end: int, restored: bool = False) -> None:
        """A partition opened, its store at ``start``, the topic's end at ``end``; it is
        restored at once if it has nothing to catch up, or if ``restored`` (it was served
        restored by this process, as a reader)."""
        if partition in self._partitions:
            raise IllegalTransition(f"ktable {self.topic} partition {partition} is registered "
                                    "already")
        done = restored or start >= end
        state = RestoreState.RESTORED if done else RestoreState.RESTORING
        self._move(partition, state)
        self._partitions[partition] = _Partition(state, start, end)
        if not done:
            self._total += end - start
            self._seconds = None

    def restart(self, partition: int, start: int, end: int) -> None:
        """The partition's store was wiped: it restores again from ``start`` to ``end``."""
        if partition not in self._partitions:
            raise IllegalTransition(f"ktable {self.topic} partition {partition}: unregistered "
                                    "-> restoring again")
        self._move(partition, RestoreState.RESTORING)
        self._partitions[partition] = _Partition(RestoreState.RESTORING, start, end)
        self._total += end - start
        self._seconds = None

    def advance(self, partition: int, position: int, records: int) -> bool:
        """The partition applied ``records`` and reached ``position``; True if that
        restored it just now."""
        found = self._partitions.get(partition)
        if found is None:
            return False
        found.position = max(found.position, position)
        if found.state is not RestoreState.RESTORING:
            return False
        self._records += records
        if found.position < found.target:
            return False
        self._move(partition, RestoreState.RESTORED)
        found.state = RestoreState.RESTORED
        if not self.restoring:
            self._seconds = time.monotonic() - self._started_at
        return True

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions let go of (closed): no longer restored here."""
        for partition in partitions:
            found = self._partitions.pop(partition, None)
            if found is not None and found.state is RestoreState.RESTORING:
                self._total -= max(found.target - found.position, 0)

    def _move(self, partition: int, to: RestoreState) -> None:
        found = self._partitions.get(partition)
        state = None if found is None else found.state
        if to not in _MOVES[state]:
            raise IllegalTransition(f"ktable {self.topic} partition {partition}: "
                                    f"{state.value if state else 'unregistered'} -> {to.value}")

    # -- what it says -------------------------------------------------------------------------
    @property
    def restored(self) -> frozenset[int]:
        return frozenset(p for p, found in self._partitions.items()
                         if found.state is RestoreState.RESTORED)

    @property
    def restoring(self) -> frozenset[int]:
        return frozenset(p for p, found in self._partitions.items()
                         if found.state is RestoreState.RESTORING)

    def state(self, partition: int) -> RestoreState | None:
        found = self._partitions.get(partition)
        return None if found is None else found.state

    def targets(self) -> Mapping[int, int]:
        """The end offsets the restoring partitions must reach."""
        return {p: found.target for p, found in self._partitions.items()
                if found.state is RestoreState.RESTORING}

    def progress(self, restored: bool) -> RestoreProgress:
        seconds = (self._seconds if self._seconds is not None
                   else time.monotonic() - self._started_at)
        return RestoreProgress(self._records, self._total, restored, seconds)
