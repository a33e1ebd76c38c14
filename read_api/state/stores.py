"""State stores of a KTable topic: in memory, or RocksDB on local disk.

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
import os
import re
import shutil
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, Literal, cast

from eventfold.read_api.state.entry import KTableEntry, MovedAway
from eventfold.read_api.state.locks import try_exclusive
from eventfold.read_api.state.merge import merge_sorted
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)
from sortedcontainers import SortedDict

from eventfold.contract.partitioner import partition_for

log = logging.getLogger(__name__)

StoreKind = Literal["rocksdb", "memory"]
STORE_KINDS: tuple[StoreKind, ...] = ("rocksdb", "memory")

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
    """Where and how KTable stores are kept (``EVENTFOLD_KTABLE_STORE``,
    ``EVENTFOLD_STATE_DIR``, ``EVENTFOLD_KTABLE_CACHE_MB``)."""

    kind: StoreKind
    directory: Path
    cache_mb: int
    """RocksDB's cache of blocks and rows, shared by every store of the process."""
    write_buffer_mb: int = 4
    """Each partition database's memtable (two at most): what a store holds in memory
    before it flushes, besides the cache. Every worker holds it twice over for each
    partition, the writer in its memtables and each reader in the memtables it replays
    from the writer's log, so it is kept small: a KTable's records are small, and a restore
    is bound by applying them, not by flushing."""


IN_MEMORY = StoreConfig("memory", Path(), cache_mb=0)
"""Stores in memory: for views a library user makes without a configuration (the app
configures its read API from ``Settings``, whose default is RocksDB)."""


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


def _lower_bound(start: str | None, after: str | None) -> tuple[str | None, bool]:
    """The range's lower bound and whether it is inclusive."""
    if after is not None and (start is None or after >= start):
        return after, False
    return start, True


class MemoryStore(StateStore):
    """Every entry of every partition in a sorted dict: restored from the beginning at every
    start (the design before RocksDB stores, kept to compare with)."""

    def __init__(self) -> None:
        self._entries: SortedDict = SortedDict()
        self._counts: dict[int, int] = {}
        self._partition_count = 1
        self._loading: dict[str, tuple[int, KTableEntry | None]] | None = {}
        self._restoring: set[int] = set()
        self._moves: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def open_partitions(self, partitions: Collection[int], offsets: TopicOffsets,
                        continuing: Collection[int] = ()) -> None:
        self._partition_count = max(self._partition_count, max(partitions, default=0) + 1)
        self._restoring.update(partitions)

    def positions(self) -> dict[int, int]:
        return {}

    def write(self, partition: int, changes: Sequence[Change], next_offset: int,
              high_watermark: int, synced_at_ms: int | None = None) -> None:
        changes = self._note_moves(partition, changes)
        if self._loading is not None:  # restoring: a plain dict, sorted once at the end
            self._loading.update((key, (partition, entry)) for key, entry in changes)
            return
        with self._lock:
            for key, entry in changes:
                existed = (self._entries.pop(key, None) if entry is None
                           else self._entries.get(key))
                if entry is not None:
                    self._entries[key] = entry
                delta = (entry is not None) - (existed is not None)
                self._counts[partition] = self._counts.get(partition, 0) + delta

    def _note_moves(self, partition: int, changes: Sequence[Change]
                    ) -> list[tuple[str, KTableEntry | None]]:
        """The changes with tombstones saying where a key went noted, and made plain."""
        plain: list[tuple[str, KTableEntry | None]] = []
        for key, entry in changes:
            if isinstance(entry, MovedAway):
                self._moves[(key, partition)] = entry.partition
                plain.append((key, None))
            else:
                if entry is None:
                    self._moves.pop((key, partition), None)
                plain.append((key, entry))
        return plain

    def moved_to(self, key: str, partition: int) -> int | None:
        return self._moves.get((key, partition))

    def restored(self, partitions: Collection[int]) -> None:
        self._restoring.difference_update(partitions)
        if self._loading is None or self._restoring:
            return
        loaded = SortedDict({k: e for k, (_, e) in self._loading.items() if e is not None})
        counts: dict[int, int] = {}
        for partition, entry in self._loading.values():
            if entry is not None:
                counts[partition] = counts.get(partition, 0) + 1
        with self._lock:
            self._entries, self._counts, self._loading = loaded, counts, None

    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        entry: KTableEntry | None = self._entries.get(key)
        return entry

    def counts(self) -> dict[int, int]:
        return dict(self._counts)

    def range(self, start: str | None = None, end: str | None = None,
              after: str | None = None, limit: int | None = None,
              partitions: Collection[int] | None = None) -> list[tuple[str, KTableEntry]]:
        low, inclusive_low = _lower_bound(start, after)
        wanted = None if partitions is None else frozenset(partitions)
        with self._lock:
            found = []
            for key in self._entries.irange(low, end, inclusive=(inclusive_low, True)):
                if wanted is not None and partition_for(key, self._partition_count
                                                        ) not in wanted:
                    continue
                found.append((key, self._entries[key]))
                if limit is not None and len(found) >= limit:
                    break
        return found


# -- RocksDB -------------------------------------------------------------------------------------
_DATA = b"k"
_AFTER_DATA = bytes([_DATA[0] + 1])  # the first key past every data key
_LEAST = b"\x00"  # appended to a key: the first key after it
_OFFSET, _COUNT, _TOPIC_ID, _HIGH = b"m:offset", b"m:count", b"m:topic_id", b"m:high"
_RESTORED, _SYNCED = b"m:restored", b"m:synced_at"
_MOVED = b"o"  # before the meta keys and after the data keys' bound (_AFTER_DATA)
_INT = struct.Struct(">q")
_WRITER_WAIT_S = 0.2
_CACHES: dict[int, Cache] = {}
_CACHES_LOCK = threading.Lock()


def _shared_cache(mb: int) -> Cache:
    """One block cache per process and size: the bound on what every store reads into
    memory."""
    with _CACHES_LOCK:
        if mb not in _CACHES:
            _CACHES[mb] = Cache(mb * 1024 * 1024)
        return _CACHES[mb]


def _options(config: StoreConfig, secondary: bool = False) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    table = BlockBasedOptions()
    cache = _shared_cache(config.cache_mb)
    table.set_block_cache(cache)
    # Gets are the hot path: a row found in the row cache skips the index and data blocks
    # (half the time of a get). One cache holds rows and blocks, so their sum stays within
    # ``cache_mb``.
    options.set_row_cache(cache)
    table.set_bloom_filter(10, False)  # a get of a key another partition holds reads no block
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(config.write_buffer_mb * 1024 * 1024)
    options.set_max_write_buffer_number(2)
    # A secondary keeps every table file it reads open, as RocksDB asks of one: with a limit,
    # a file closed for the limit may be gone (compacted by the primary) when read again.
    options.set_max_open_files(-1 if secondary else 256)
    return options


def _int(raw: bytes | None, default: int = 0) -> int:
    return default if raw is None else int(_INT.unpack(raw)[0])


class _Partition:
    """One partition's database, as its writer (primary) or as a reader (secondary)."""

    def __init__(self, path: Path, options: Options, writer: bool) -> None:
        self.path, self.options, self.writer = path, options, writer
        # The writer stamps this file after every write; a reader catches up only when the
        # stamp has changed. Catching up holds the GIL, and every request of the reader's
        # process waited it out, ten times a second, written or not.
        self._stamp_path = path.with_name(f"{path.name}.written")
        self._stamp_fd: int | None = None
        # The writer replaces this file when it makes the database anew (wiped, or first
        # made): a reader that opened the one before sees it has another inode, and opens
        # again (a secondary of a database deleted under it goes on reading the old files).
        self._made_path = path.with_name(f"{path.name}.made")
        if writer:
            self.db = Rdict(str(path), options)
            self._stamp_fd = os.open(self._stamp_path, os.O_RDWR | os.O_CREAT, 0o644)
            self._stamp = int.from_bytes(os.urandom(8))  # unlike any earlier writer's
        else:
            secondary = path.with_name(f"{path.name}.reader-{os.getpid()}")
            self._made = self._made_inode()
            self.db = Rdict(str(path), options,
                            access_type=AccessType.secondary(str(secondary)))
            self._secondary = secondary
            self._seen_stamp: bytes | None = None

    def meta(self, name: bytes) -> bytes | None:
        value: bytes | None = self.db.get(name)
        return value

    def write(self, changes: Sequence[Change], next_offset: int, high_watermark: int,
              synced_at_ms: int | None) -> None:
        batch = WriteBatch(raw_mode=True)
        latest: dict[bytes, KTableEntry | MovedAway | None] = {}
        for key, entry in changes:
            latest[_DATA + key.encode()] = entry
        keys = list(latest)
        existed = cast(list[bytes | None], self.db.get(cast(Any, keys)))
        delta = 0
        for stored_key, before in zip(keys, existed, strict=True):
            entry = latest[stored_key]
            if type(entry) is KTableEntry:
                batch.put(stored_key, entry.encode())
                delta += before is None
                continue
            batch.delete(stored_key)
            delta -= before is not None
            # where a key went, kept beside the data (never counted nor ranged over)
            moved_key = _MOVED + stored_key[1:]
            if isinstance(entry, MovedAway):
                batch.put(moved_key, _INT.pack(entry.partition))
            else:
                batch.delete(moved_key)
        batch.put(_COUNT, _INT.pack(_int(self.meta(_COUNT)) + delta))
        batch.put(_OFFSET, _INT.pack(next_offset))
        batch.put(_HIGH, _INT.pack(max(high_watermark, next_offset)))
        if synced_at_ms is not None:
            batch.put(_SYNCED, _INT.pack(synced_at_ms))
        self._write(batch)

    def mark_restored(self) -> None:
        # out of the memtable into a table file first: only a table's rows reach the row
        # cache, and a restart need not replay the restore's log
        self.db.flush()
        self.put_meta(_RESTORED, b"1")

    def put_meta(self, name: bytes, value: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(name, value)
        self._write(batch)

    def delete_meta(self, name: bytes) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.delete(name)
        self._write(batch)

    def _write(self, batch: WriteBatch) -> None:
        self.db.write(batch)
        if self._stamp_fd is not None:
            self._stamp = (self._stamp + 1) % (1 << 64)
            os.pwrite(self._stamp_fd, self._stamp.to_bytes(8), 0)

    def get(self, key: str) -> KTableEntry | None:
        stored = self.db.get(_DATA + key.encode())
        return None if stored is None else KTableEntry.decode(stored)

    def moved_to(self, key: str) -> int | None:
        moved: bytes | None = self.db.get(_MOVED + key.encode())
        return None if moved is None else _int(moved)

    def stored_items(self, low: str | None, inclusive_low: bool, high: str | None
                     ) -> tuple[Iterator[tuple[bytes, bytes]], ReadOptions]:
        """The stored pairs in range, as kept (keys with their prefix): RocksDB's own
        iterator, bounded at both ends, handing over key and value in one call. The bound
        lives in the options returned beside it, which must outlive the iterator (a
        generator holding them cost more a record than RocksDB's read)."""
        bounds = ReadOptions()
        bounds.set_iterate_upper_bound(_DATA + high.encode() + _LEAST if high is not None
                                       else _AFTER_DATA)
        first = _DATA + (low or "").encode()
        if low is not None and not inclusive_low:
            first += _LEAST
        return cast(Iterator[tuple[bytes, bytes]],
                    self.db.items(from_key=first, read_opt=bounds)), bounds

    def made_anew(self) -> None:
        """The writer: this database was made anew (readers of the one before open again)."""
        staged = self._made_path.with_name(f".{self._made_path.name}.{os.getpid()}")
        staged.write_bytes(os.urandom(8))
        os.replace(staged, self._made_path)

    def _made_inode(self) -> int | None:
        try:
            return os.stat(self._made_path).st_ino
        except FileNotFoundError:
            return None

    def catch_up(self) -> bool:
        """A reader: see the writer's writes since the last catch-up, if it has written;
        False if the writer has made the database anew since this reader opened it."""
        if self._made_inode() != self._made:
            return False
        stamp = self._read_stamp()
        if stamp is not None and stamp == self._seen_stamp:
            return True
        self.db.try_catch_up_with_primary()  # after reading the stamp: a later write changes it
        self._seen_stamp = stamp
        return True

    def _read_stamp(self) -> bytes | None:
        if self._stamp_fd is None:
            try:
                self._stamp_fd = os.open(self._stamp_path, os.O_RDONLY)
            except FileNotFoundError:
                return None  # a writer of before the stamp: catch up every time
        return os.pread(self._stamp_fd, 8, 0) or None

    def close(self) -> None:
        self.db.close()
        if self._stamp_fd is not None:
            os.close(self._stamp_fd)
            self._stamp_fd = None
        if not self.writer:
            shutil.rmtree(self._secondary, ignore_errors=True)


_KEY = itemgetter(0)


def _not_valid(opened: _Partition, partition: int, offsets: TopicOffsets) -> str | None:
    """Why a partition's checkpoint cannot be resumed from (None: it can)."""
    raw = opened.meta(_OFFSET)
    if raw is None:
        return None
    offset, stored_id = _int(raw), opened.meta(_TOPIC_ID)
    begin, end = offsets.begin.get(partition, 0), offsets.end.get(partition, 0)
    if stored_id is not None and stored_id.decode() != offsets.topic_id:
        return "the topic was recreated since it was written"
    if offset > end:
        return f"its checkpoint (offset {offset}) is past the topic's end ({end})"
    if offset < begin:
        return (f"its checkpoint (offset {offset}) is before the topic's first offset "
                f"({begin}): records it never applied are gone")
    retention = offsets.delete_retention_ms
    if retention is not None:
        synced = opened.meta(_SYNCED)
        if synced is None:
            return "it does not say when it last read the topic to its end"
        age_ms = int(time.time() * 1000) - _int(synced)
        if age_ms >= retention:
            return (f"its checkpoint is {age_ms / 1000:,.0f} s old, past the topic's "
                    f"delete.retention.ms ({retention / 1000:,.0f} s): deletes the log "
                    "cleaner has removed since would never reach it")
    return None


def _directory_name(topic: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", topic)


def stored_partitions(config: StoreConfig, topic: str) -> frozenset[int]:
    """The partitions of ``topic`` with a RocksDB database under the state directory."""
    directory = config.directory / _directory_name(topic)
    return frozenset(int(path.parent.name[1:]) for path in directory.glob("p*/CURRENT")
                     if path.parent.name[1:].isdigit())


class RocksDBStore(StateStore):
    """A KTable topic's partitions, each a RocksDB database under
    ``<state dir>/<topic>/p<partition>``; this process holds those it was given."""

    def __init__(self, config: StoreConfig, topic: str, stop: threading.Event | None = None
                 ) -> None:
        self.topic = topic
        self.directory = config.directory / _directory_name(topic)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._options = _options(config)
        self._reader_options = _options(config, secondary=True)
        self._stop = stop or threading.Event()
        self._lock_file: IO[bytes] | None = None
        self.writer = self._take_writer_lock()
        self._partitions: dict[int, _Partition] = {}

    def open_partitions(self, partitions: Collection[int], offsets: TopicOffsets,
                        continuing: Collection[int] = ()) -> None:
        """The writer opens (and checks) each partition's database; a reader waits until the
        writer has created them (or has gone, and this process takes its place: raises
        ``StoreClosed`` if stopped meanwhile; then ``writer`` is set and nothing opened)."""
        if not self.writer:
            self._wait_for_the_writer(partitions)
            if self.writer:
                return  # the writer has gone: the caller opens them again, as the writer
        for partition in partitions:
            before = self._partitions.get(partition)
            if before is None or not before.writer:
                # one reading it goes on serving until its writer has opened (a primary
                # beside a secondary of the same database is allowed)
                self._partitions[partition] = self._open(partition, offsets,
                                                         partition in continuing)
                if before is not None:
                    before.close()

    def close_partitions(self, partitions: Collection[int]) -> None:
        for partition in partitions:
            store = self._partitions.pop(partition, None)
            if store is not None:
                store.close()

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(self._partitions)

    def _wait_for_the_writer(self, partitions: Collection[int]) -> None:
        while not all((self.directory / f"p{p}" / "CURRENT").exists() for p in partitions):
            if self._take_writer_lock():
                self.writer = True
                return
            if self._stop.wait(_WRITER_WAIT_S):
                raise StoreClosed(f"ktable {self.topic}: stopped while waiting for its writer")

    def take_writer_lock(self) -> bool:
        """A reader: take the directory's writer lock if the writer has gone; True if taken
        (then ``become_writer``)."""
        return not self.writer and self._take_writer_lock()

    def become_writer(self) -> None:
        """Holding the writer lock: from now on partitions open as their writer. Those open
        as a reader stay open, and serve, until each is opened again as its writer
        (``open_partitions``)."""
        self.writer = True
        log.info("ktable %s: this process now writes its store (the writer before it is "
                 "gone)", self.topic)

    def _take_writer_lock(self) -> bool:
        """Whether this process is the directory's writer (the lock holds until it exits or
        closes the store)."""
        handle = try_exclusive(self.directory / "writer.lock")
        if handle is None:
            return False
        self._lock_file = handle
        return True

    def _open(self, partition: int, offsets: TopicOffsets, continuing: bool) -> _Partition:
        path = self.directory / f"p{partition}"
        if not self.writer:
            return _Partition(path, self._reader_options, writer=False)
        opened = _Partition(path, self._options, writer=True)
        fresh = opened.meta(_TOPIC_ID) is None
        reason = _not_valid(opened, partition, offsets)
        if reason is not None:
            log.warning("ktable %s partition %d: %s; its store is wiped and restored from the "
                        "beginning", self.topic, partition, reason)
            opened.close()
            Rdict.destroy(str(path), self._options)
            opened = _Partition(path, self._options, writer=True)
        if fresh or reason is not None:
            opened.made_anew()
        if opened.meta(_TOPIC_ID) is None:
            opened.put_meta(_TOPIC_ID, offsets.topic_id.encode())
        if reason is not None or not continuing:
            # Not restored until this writer has caught up again: readers must not serve it
            # as current from what an earlier writer left. A reader that took the place of a
            # writer that died goes on from where it was, restored.
            opened.delete_meta(_RESTORED)
        return opened

    def positions(self) -> dict[int, int]:
        return {p: _int(offset) for p, store in self._partitions.items()
                if (offset := store.meta(_OFFSET)) is not None}

    def high_watermarks(self) -> dict[int, int]:
        """What the writer last saw of each partition's end."""
        return {p: _int(store.meta(_HIGH)) for p, store in self._partitions.items()}

    def write(self, partition: int, changes: Sequence[Change], next_offset: int,
              high_watermark: int, synced_at_ms: int | None = None) -> None:
        store = self._partitions.get(partition)
        if store is not None:  # else closed since the poll that fetched the records
            store.write(changes, next_offset, high_watermark, synced_at_ms)

    def synced(self, partition: int, synced_at_ms: int) -> None:
        store = self._partitions.get(partition)
        if store is not None:
            store.put_meta(_SYNCED, _INT.pack(synced_at_ms))

    def restored(self, partitions: Collection[int]) -> None:
        for partition in partitions:
            if partition in self._partitions:
                self._partitions[partition].mark_restored()

    def restored_partitions(self, topic_id: str | None = None) -> frozenset[int]:
        """The partitions the writer has restored since it opened them (a reader's
        question); with ``topic_id``, only those written for that topic (not for one of its
        name since deleted)."""
        return frozenset(p for p, store in self._partitions.items()
                         if store.meta(_RESTORED) is not None
                         and (topic_id is None or store.meta(_TOPIC_ID) == topic_id.encode()))

    def written_for(self, partition: int) -> str | None:
        """The id of the topic the partition's store holds the records of, if it says."""
        store = self._partitions.get(partition)
        raw = None if store is None else store.meta(_TOPIC_ID)
        return None if raw is None else raw.decode()

    def catch_up(self) -> None:
        """A reader: see what the writer has written since; a partition the writer has made
        anew (wiped) since this reader opened it is opened again."""
        made_anew = [p for p, store in self._partitions.items() if not store.catch_up()]
        for partition in made_anew:
            log.info("ktable %s partition %d: its writer made the store anew; reading the new "
                     "one", self.topic, partition)
            self._partitions.pop(partition).close()
            self._partitions[partition] = _Partition(self.directory / f"p{partition}",
                                                     self._reader_options, writer=False)

    def get(self, key: str, partition: int | None = None) -> KTableEntry | None:
        if partition is not None:
            store = self._partitions.get(partition)
            if store is None:
                raise NotHeld(f"ktable {self.topic}: partition {partition} is not held here")
            return store.get(key)
        for store in self._partitions.values():
            entry = store.get(key)
            if entry is not None:
                return entry
        return None

    def counts(self) -> dict[int, int]:
        return {p: _int(store.meta(_COUNT)) for p, store in self._partitions.items()}

    def moved_to(self, key: str, partition: int) -> int | None:
        store = self._partitions.get(partition)
        return None if store is None else store.moved_to(key)

    def range(self, start: str | None = None, end: str | None = None,
              after: str | None = None, limit: int | None = None,
              partitions: Collection[int] | None = None) -> list[tuple[str, KTableEntry]]:
        low, inclusive_low = _lower_bound(start, after)
        held = self._partitions
        chosen = held.values() if partitions is None else [held[p] for p in partitions
                                                            if p in held]
        opened = [store.stored_items(low, inclusive_low, end) for store in chosen]
        page = merge_sorted([items for items, _bounds in opened], _KEY, limit)
        del opened  # the iterators' bounds, kept until here
        decode = KTableEntry.decode
        return [(key[1:].decode(), decode(value)) for key, value in page]

    def close(self) -> None:
        self.close_partitions(list(self._partitions))
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def destroy(self) -> None:
        was_writer = self.writer
        self.close()
        if was_writer:
            shutil.rmtree(self.directory, ignore_errors=True)
