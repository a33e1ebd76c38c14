"""State stores of a KTable topic: the contract every store keeps (``StateStore``: its
lifecycle, its writes and its queries, as Kafka Streams' ``StateStore`` and
``ReadOnlyKeyValueStore``) and what configures them; the store is ``rocksdb_store``'s.

A RocksDB store keeps one database per topic partition, as Kafka Streams keeps one store per
task: the partition's entries (keys prefixed ``k``), and beside them, written in the same
write batch, the changelog offset the store has applied up to, its exact key count, the
topic's id, the highest offset its writer saw and when the store was last known to hold
every record written before then (keys prefixed ``m:``). The HTTP workers of one instance
share the databases: the worker that holds the directory's writer lock restores and follows
the topic; the others open the databases as RocksDB secondaries and catch up with the
writer's files, and one of them takes the lock if the writer dies.

A checkpoint is not used when it is not valid for the topic: the topic was recreated, the
checkpoint is past the topic's end or before its first offset, or it is older than the
topic's ``delete.retention.ms`` (the log cleaner may have removed tombstones the store never
saw, and the keys they deleted would be served for ever). The partition's store is then
wiped and restored from the beginning, saying why.
"""

from __future__ import annotations

import logging
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eventfold.read_api.state.entry import KTableEntry, MovedAway

log = logging.getLogger(__name__)

Change = tuple[str, KTableEntry | MovedAway | None]
"""A key and its new entry (None: a tombstone deletes it; ``MovedAway``: one that says the key
went to another partition)."""


@dataclass(frozen=True)
class TopicOffsets:
    """What a store's checkpoints are checked against as its partitions open: the topic's id,
    each partition's first and end offsets now, and how long the topic keeps a tombstone
    (None: unknown, not checked)."""

    topic_id: str
    begin: Mapping[int, int] = field(default_factory=dict)
    end: Mapping[int, int] = field(default_factory=dict)
    delete_retention_ms: int | None = None


@dataclass(frozen=True)
class StoreConfig:
    """Where and how KTable stores are kept (``EVENTFOLD_STATE_DIR``,
    ``EVENTFOLD_KTABLE_CACHE_MB``)."""

    directory: Path
    cache_mb: int
    """RocksDB's cache of blocks and rows, shared by every store of the process."""
    write_buffer_mb: int = 4
    """Each partition database's memtable (two at most): what a store holds in memory
    before it flushes, besides the cache. Every worker holds it twice over for each
    partition, the writer in its memtables and each reader in the memtables it replays
    from the writer's log, so it is kept small: a KTable's records are small, and a restore
    is bound by applying them, not by flushing."""


def scratch_store_config() -> StoreConfig:
    """Stores in a new temporary directory, restored from the topics' beginning: for a read
    app a library user makes without a configuration (the app's read API keeps them under
    ``EVENTFOLD_STATE_DIR``)."""
    return StoreConfig(Path(tempfile.mkdtemp(prefix="eventfold-ktables-")), cache_mb=8)


class StoreClosed(RuntimeError):
    """The store was let go before it opened."""


class NotHeld(LookupError):
    """A partition asked for that the store does not hold (let go of since the question was
    routed here): no answer, where None would say the key has none."""


class StateStore(ABC):
    """One KTable topic's entries across the partitions this process holds, in key order.
    Safe to read from request handlers while the view writes."""

    writer = True
    """Whether this process applies the topic's records (else it reads what the writer
    applied: ``catch_up``)."""

    def open_partitions(self, partitions: Collection[int], offsets: TopicOffsets,
                        continuing: Collection[int] = ()) -> None:
        """Hold ``partitions`` too (their stores, restored from their checkpoints on).
        ``continuing``: partitions this process served restored as a reader until it took
        the writer's place (they stay restored)."""
        return None

    def close_partitions(self, partitions: Collection[int]) -> None:
        """Hold ``partitions`` no more (their files stay, for when they come back)."""
        return None

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions held (open)."""
        return frozenset()

    @abstractmethod
    def positions(self) -> dict[int, int]:
        """Per partition, the next offset to apply: where a restore starts (empty: from the
        beginning)."""

    @abstractmethod
    def write(self, partition: int, changes: Sequence[Change], next_offset: int,
              high_watermark: int, synced_at_ms: int | None = None) -> None:
        """Apply ``changes`` of one partition and record ``next_offset``, atomically;
        ``synced_at_ms``: a time at which the partition held every record written before it
        (it had read to the end), if it did."""

    def synced(self, partition: int, synced_at_ms: int) -> None:
        """The partition, read to its end, held every record written before
        ``synced_at_ms`` (no record came since its last write)."""
        return None

    def restored(self, partitions: Collection[int]) -> None:
        """The restore of ``partitions`` reached the end offsets seen when they opened."""
        return None

    @abstractmethod
    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        """The key's entry (``partition``: the key's partition, when known)."""

    def moved_to(self, key: str, partition: int) -> int | None:
        """The partition the key went to from ``partition``, if a tombstone there said so
        (partitions were added to the topic)."""
        return None

    @abstractmethod
    def range(self, start: str | None = None, end: str | None = None,
              after: str | None = None, limit: int | None = None,
              partitions: Collection[int] | None = None) -> list[tuple[str, KTableEntry]]:
        """Entries with start <= key <= end (either bound optional) and key > after, in key
        order, at most ``limit`` of them (``partitions``: of those partitions only)."""

    @abstractmethod
    def counts(self) -> dict[int, int]:
        """Keys per partition held."""

    def __len__(self) -> int:
        return sum(self.counts().values())

    def chunks(self, start: str | None = None, end: str | None = None, chunk: int = 1000,
               partitions: Collection[int] | None = None
               ) -> Iterator[list[tuple[str, KTableEntry]]]:
        """All entries in range, ``chunk`` at a time (no lock is held across a yield)."""
        after: str | None = None
        while True:
            batch = self.range(start, end, after, chunk, partitions)
            if batch:
                yield batch
            if len(batch) < chunk:
                return
            after = batch[-1][0]

    def close(self) -> None:
        """Let go of the store (its files stay, for the next start)."""
        return None

    def destroy(self) -> None:
        """Close it and delete what it kept (its topic is retired)."""
        self.close()


class UnopenedStore(StateStore):
    """A view's store until its topic's own store opens: it holds nothing, and says so."""

    def positions(self) -> dict[int, int]:
        return {}

    def write(self, partition: int, changes: Sequence[Change], next_offset: int,
              high_watermark: int, synced_at_ms: int | None = None) -> None:
        raise StoreClosed("the view's store has not opened yet")

    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        return None

    def range(self, start: str | None = None, end: str | None = None,
              after: str | None = None, limit: int | None = None,
              partitions: Collection[int] | None = None) -> list[tuple[str, KTableEntry]]:
        return []

    def counts(self) -> dict[int, int]:
        return {}


def lower_bound(start: str | None, after: str | None) -> tuple[str | None, bool]:
    """The range's lower bound and whether it is inclusive."""
    if after is not None and (start is None or after >= start):
        return after, False
    return start, True
