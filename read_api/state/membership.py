"""The read API instances serving an app's KTables, found by their heartbeats in the
database: members of kind ``KTABLE_MEMBER`` (``contract.members``), by advertised URL.

An instance with an advertised URL renews its row every ``HEARTBEAT_S`` with, per KTable
topic, the partitions it holds restored (and their lag) and those it has stores of on disk;
rows not renewed for ``TIMEOUT_S`` (their ``ttl_s``) are members no more (a crashed instance
leaves within that time, one that stops deletes its row).

An instance only lets members go once its own heartbeats have gone through for ``TIMEOUT_S``
in a row. A database that stalled (a pause, a failover) held every instance's heartbeat at
once; when it answers again every other row is old, and an instance that believed it would
take every partition for itself (a burst of restores, and reads answered 503 meanwhile).
While its heartbeats fail it keeps the members it had: reads forwarded to one that died
meanwhile fail over to the partition's standby.
An instance without an advertised URL is alone: it hosts every partition, as a single
instance always has. Of an instance's HTTP workers only the lead beats
(``read_api.workers``); the others take the members it publishes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import psycopg

from eventfold.contract.members import KTABLE_MEMBER, join, leave, live
from eventfold.read_api.freshness import connect_as_reader
from eventfold.read_api.workers import FOLLOW_S, WorkerLead

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
TIMEOUT_S = 5.0
"""A member whose row is older than this is gone: its partitions move to their standbys."""

@dataclass(frozen=True)
class TopicReport:
    """What a member has of one KTable topic."""

    restored: Mapping[int, int] = field(default_factory=dict)
    """The partitions it holds restored, and each one's lag in records."""
    held: frozenset[int] = frozenset()
    """The partitions it holds as last assigned, restored or restoring."""
    stored: frozenset[int] = frozenset()
    """The partitions it has a store of on disk (held or not)."""

    def as_json(self) -> dict[str, object]:
        return {"restored": {str(p): lag for p, lag in self.restored.items()},
                "held": sorted(self.held), "stored": sorted(self.stored)}

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> TopicReport:
        restored = cast(Mapping[str, int], raw.get("restored") or {})
        return cls({int(p): int(lag) for p, lag in restored.items()},
                   frozenset(int(p) for p in cast(list[int], raw.get("held") or [])),
                   frozenset(int(p) for p in cast(list[int], raw.get("stored") or [])))


Report = Mapping[str, TopicReport]
"""Per KTable topic, what a member has of it."""


@dataclass(frozen=True)
class Member:
    url: str
    tables: Report = field(default_factory=dict)

    def lag(self, topic: str, partition: int) -> int | None:
        """The member's lag on ``partition`` if it holds it restored, else None."""
        report = self.tables.get(topic)
        return None if report is None else report.restored.get(partition)


Listener = Callable[[tuple[Member, ...]], None]


class Membership:
    """This instance's heartbeat, and the live members as of the last one (itself among
    them). Alone (``url`` empty), it is the only member and touches no database."""

    def __init__(self, url: str, report: Callable[[], Report],
                 database_url: str = "", role: str = "", lead: WorkerLead | None = None
                 ) -> None:
        self.url = url
        self.lead = lead or WorkerLead()
        self.report = report
        self.database_url = database_url
        self.role = role
        self._members: tuple[Member, ...] = (Member(url),)
        self._listeners: list[Listener] = []
        self._conn: psycopg.Connection | None = None
        self._beating_since: float | None = None
        """Since when this instance's heartbeats have gone through, each in time."""
        self._last_beat = float("-inf")
        self._refreshed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ktable-membership",
                                        daemon=True)

    @property
    def alone(self) -> bool:
        return not self.url

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> Membership:
        if self.alone:
            self._refreshed.set()
        else:
            self._thread.start()
        return self

    def wait_first(self, timeout_s: float) -> bool:
        return self._refreshed.wait(timeout_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._conn is not None:
            try:  # leave at once: the others rebalance now rather than after TIMEOUT_S
                leave(self._conn, KTABLE_MEMBER, self.url)
            except psycopg.Error as exc:
                log.warning("ktable membership: could not leave: %s", exc)
            self._conn.close()

    def members(self) -> tuple[Member, ...]:
        return self._members

    def member(self, url: str) -> Member | None:
        return next((m for m in self._members if m.url == url), None)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.lead.leads():
                self._follow()
                self._stop.wait(FOLLOW_S)
                continue
            try:
                self._beat()
            except psycopg.Error as exc:
                log.warning("ktable membership: %s (keeping the last members; will retry)",
                            exc)
                self.failed()
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
            self._stop.wait(HEARTBEAT_S)

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since this instance's last heartbeat went through."""
        return time.monotonic() - self._last_beat

    def _beat(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = connect_as_reader(self.database_url, self.role, read_only=False,
                                           purpose="membership")
        join(self._conn, KTABLE_MEMBER, self.url, TIMEOUT_S,
             {topic: report.as_json() for topic, report in self.report().items()})
        seen = live(self._conn, KTABLE_MEMBER)
        self.saw(_members_of((m.member_id, m.detail) for m in seen), time.monotonic())

    def saw(self, seen: tuple[Member, ...], now: float) -> None:
        """A heartbeat went through at ``now`` and found the members ``seen``: they are
        the members, once this instance's heartbeats have gone through in time for
        ``TIMEOUT_S`` (until then, those not seen are kept)."""
        if self._beating_since is None or now - self._last_beat > 2 * HEARTBEAT_S + 1:
            if self._last_beat > float("-inf"):
                log.info("ktable membership: heartbeats go through again after %.1f s; members "
                         "not seen are kept for %.0f s while they renew theirs",
                         now - self._last_beat, TIMEOUT_S)
            self._beating_since = now
        self._last_beat = now
        members = seen
        if now - self._beating_since < TIMEOUT_S:
            members = _kept(self._members, members)
        if not self.lead.alone:
            self.lead.publish("members", orjson.dumps([(m.url, {
                topic: report.as_json() for topic, report in m.tables.items()})
                for m in members]))
        self._changed(members)

    def _follow(self) -> None:
        body = self.lead.latest("members")
        if body is not None:
            self._changed(_members_of(orjson.loads(body)))

    def failed(self) -> None:
        """A heartbeat did not go through: the next one that does starts a new run."""
        self._beating_since = None

    def _changed(self, members: tuple[Member, ...]) -> None:
        before = {m.url for m in self._members}
        self._members = members
        if {m.url for m in members} != before:
            log.info("ktable members: %s", ", ".join(m.url for m in members))
        self._refreshed.set()
        for listener in self._listeners:
            listener(members)


def _kept(before: tuple[Member, ...], seen: tuple[Member, ...]) -> tuple[Member, ...]:
    """The members seen, and those of before that were not (with what they reported last)."""
    found = {m.url: m for m in before if m.url}
    found.update((m.url, m) for m in seen)
    return tuple(found[url] for url in sorted(found))


def _members_of(rows: Iterable[Sequence[Any]]) -> tuple[Member, ...]:
    """Members from (url, tables) pairs, as read or as published."""
    return tuple(Member(url, {topic: TopicReport.from_json(report)
                              for topic, report in tables.items()})
                 for url, tables in rows)
