"""The RocksDB state store of a KTable topic: one database per topic partition on local
disk, restored at a restart from its checkpoint (the records after it), shared by the HTTP
workers of an instance (``stores`` says how, and when a checkpoint is not used)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import IO, Any, cast

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
)

from eventfold.read_api.state.entry import KTableEntry, MovedAway
from eventfold.read_api.state.locks import try_exclusive
from eventfold.read_api.state.merge import merge_sorted
from eventfold.read_api.state.stores import (
    Change,
    NotHeld,
    StateStore,
    StoreClosed,
    StoreConfig,
    TopicOffsets,
    lower_bound,
)

log = logging.getLogger(__name__)


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
        low, inclusive_low = lower_bound(start, after)
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
