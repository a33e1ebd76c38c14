"""Compare the event store with an event topic: what is missing, duplicated, out of order.

Used by tests and by ``eventfold verify-log``. At-least-once delivery allows duplicates (after
a crash of the Connect worker); it never allows a missing event or a reordering within one
aggregate.

Both sides are spilled to a private SQLite file as they stream in, and compared there by
index: the log may hold more events than a process holds in memory, so the comparison's
memory is SQLite's page cache, whatever the size of the log.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

DETAIL = 100
"""At most how many aggregates (or events) a report names per kind of problem: the counts are
exact, the names are a sample to start looking from."""

_CACHE_KIB = 16 * 1024
_CHUNK = 10_000


class LoggedEvent(NamedTuple):
    """An event as seen on the topic: identity, aggregate, version, offset order."""

    event_id: str
    stream_id: str
    stream_version: int


@dataclass
class LogReport:
    expected: int
    delivered: int
    missing_count: int = 0
    duplicate_count: int = 0
    out_of_order_count: int = 0
    missing: dict[str, list[int]] = field(default_factory=dict)
    """Versions missing, per aggregate: the first ``DETAIL`` aggregates by id."""
    duplicated: dict[str, int] = field(default_factory=dict)
    """Extra deliveries, per event id: the first ``DETAIL`` events by id."""
    out_of_order: dict[str, list[int]] = field(default_factory=dict)
    """Versions in the order first delivered, per aggregate: the first ``DETAIL`` by id."""

    @property
    def ok(self) -> bool:
        return self.missing_count == 0 and self.out_of_order_count == 0

    def summary(self) -> str:
        return (f"{self.expected} events in the store, {self.delivered} messages on the topic: "
                f"{self.missing_count} missing, {self.duplicate_count} duplicates, "
                f"{self.out_of_order_count} aggregates out of order")


def compare(stored: Iterable[LoggedEvent], delivered: Iterable[LoggedEvent]) -> LogReport:
    """``delivered`` in topic order per partition (an aggregate lives in one partition)."""
    with _Spill() as spill:
        spill.load("stored", stored)
        spill.load("delivered", delivered)
        return spill.report()


def logged_from_message(key: str | None, value: str | None) -> LoggedEvent | None:
    """The event a message carries; None for one that carries none (a poison message is
    the projections' concern: they dead-letter it)."""
    if key is None or value is None:
        return None
    try:
        envelope = json.loads(value)
        return LoggedEvent(str(envelope["eventId"]), key, int(envelope["streamVersion"]))
    except (ValueError, KeyError, TypeError):
        return None


def verify_topic(
    stored: Iterable[LoggedEvent], messages: Iterable[tuple[str | None, str | None]],
    include: Callable[[str], bool] = lambda _: True,
) -> LogReport:
    """Compare ``stored`` events with ``messages`` (key, value) read from the topic."""
    delivered = (event for key, value in messages
                 if (event := logged_from_message(key, value)) and include(event.stream_id))
    return compare((e for e in stored if include(e.stream_id)), delivered)


class _Spill:
    """The two sides in a temporary SQLite database on disk, deleted when closed."""

    def __init__(self) -> None:
        # "" is SQLite's private temporary database: on disk once it outgrows the cache.
        self._db = sqlite3.connect("")
        for pragma in ("journal_mode = OFF", "synchronous = OFF", "temp_store = FILE",
                       f"cache_size = -{_CACHE_KIB}"):
            self._db.execute(f"PRAGMA {pragma}")
        for side in ("stored", "delivered"):
            # seq keeps each side's order: log order, and topic order of delivery.
            self._db.execute(f"CREATE TABLE {side} (seq INTEGER PRIMARY KEY, event_id TEXT, "
                             "stream_id TEXT, version INTEGER)")

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *_: object) -> None:
        self._db.close()

    def load(self, side: str, events: Iterable[LoggedEvent]) -> None:
        rows = iter(events)
        while chunk := list(islice(rows, _CHUNK)):
            self._db.executemany(f"INSERT INTO {side} (event_id, stream_id, version) "
                                 "VALUES (?, ?, ?)", chunk)

    def report(self) -> LogReport:
        db = self._db
        db.execute("CREATE INDEX stored_by_event ON stored (event_id)")
        db.execute("CREATE INDEX delivered_by_event ON delivered (event_id, seq)")
        # Each event's first delivery: the order an aggregate's versions must keep.
        db.execute("CREATE TABLE firsts (stream_id TEXT, seq INTEGER, version INTEGER, "
                   "PRIMARY KEY (stream_id, seq)) WITHOUT ROWID")
        db.execute("INSERT INTO firsts SELECT stream_id, min(seq), version FROM delivered "
                   "GROUP BY event_id")
        report = LogReport(expected=self._one("SELECT count(*) FROM stored"),
                           delivered=self._one("SELECT count(*) FROM delivered"))
        report.missing_count = self._one(f"SELECT count(*) FROM ({_MISSING})")
        report.missing = _grouped(db.execute(f"{_MISSING} ORDER BY stream_id, version"))
        report.duplicate_count = self._one(f"SELECT coalesce(sum(extra), 0) FROM ({_EXTRA})")
        report.duplicated = dict(db.execute(f"{_EXTRA} ORDER BY event_id LIMIT {DETAIL}"))
        report.out_of_order_count = self._one(f"SELECT count(*) FROM ({_DISORDERED})")
        report.out_of_order = _grouped(db.execute(
            f"SELECT f.stream_id, f.version FROM (SELECT stream_id FROM ({_DISORDERED}) "
            f"ORDER BY stream_id LIMIT {DETAIL}) AS d JOIN firsts AS f USING (stream_id) "
            "ORDER BY f.stream_id, f.seq"))
        return report

    def _one(self, query: str) -> int:
        return int(self._db.execute(query).fetchone()[0])


_MISSING = ("SELECT stream_id, version FROM stored AS s WHERE NOT EXISTS "
            "(SELECT 1 FROM delivered AS d WHERE d.event_id = s.event_id)")
_EXTRA = ("SELECT event_id, count(*) - 1 AS extra FROM delivered WHERE event_id IN "
          "(SELECT event_id FROM stored) GROUP BY event_id HAVING count(*) > 1")
_DISORDERED = ("SELECT DISTINCT stream_id FROM (SELECT stream_id, version, lag(version) OVER "
               "(PARTITION BY stream_id ORDER BY seq) AS before FROM firsts) "
               "WHERE before > version")


def _grouped(rows: Iterator[Any], limit: int = DETAIL) -> dict[str, list[int]]:
    """(aggregate, version) rows, ordered by aggregate, as versions per aggregate: the first
    ``limit`` aggregates."""
    grouped: dict[str, list[int]] = {}
    for stream_id, version in rows:
        if stream_id not in grouped and len(grouped) == limit:
            break
        grouped.setdefault(stream_id, []).append(version)
    return grouped
