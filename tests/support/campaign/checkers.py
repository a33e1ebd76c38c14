"""Checkers: after a schedule, each judges what was written against one guarantee, as
Jepsen's checkers judge a history. Each returns the violations it found (empty: it holds),
as lines a person can act on."""

from __future__ import annotations

import json
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
import requests
from confluent_kafka import Consumer

from eventfold.contract import KTABLE_VERSION_HEADER, libpq_url
from eventfold.outbox.connection import KafkaConnection
from eventfold.outbox.kafka import OffsetPlanner, consumer_config, iter_range, offset_of
from tests.support.campaign.app import Names

Violations = list[str]


@dataclass(frozen=True)
class Ktable:
    """A KTable topic read to its end, partition by partition."""

    latest: dict[str, dict | None]
    """Each key's last value (None: deleted)."""
    went_back: Violations
    """Records whose key's version is below the one its record before had."""


def read_ktable(kafka: KafkaConnection, topic: str) -> Ktable:
    """Every record of ``topic`` up to each partition's end offset, as a read-committed
    reader sees them; raises if a partition's end is not reached (``iter_range``)."""
    planner = OffsetPlanner(kafka)
    try:
        partitions = planner.partitions([topic])
        ends = planner.end_offsets(partitions)
    finally:
        planner.close()
    consumer = Consumer(consumer_config(kafka))
    latest: dict[str, dict | None] = {}
    went_back: Violations = []
    try:
        for partition in partitions:
            last: dict[str, int] = {}
            for chunk in iter_range(consumer, partition, 0, ends[partition],
                                    stuck_timeout_s=30):
                for message in chunk:
                    key = (message.key() or b"").decode()
                    headers = dict(message.headers() or [])
                    version = int(headers[KTABLE_VERSION_HEADER])
                    if version < last.get(key, 0):
                        went_back.append(f"{topic}[{partition[1]}]@{offset_of(message)}: "
                                         f"{key} v{last[key]} -> v{version}")
                    last[key] = version
                    value = message.value()
                    latest[key] = None if value is None else json.loads(value)
    finally:
        consumer.close()
    return Ktable(latest, went_back)


def ktable_never_goes_back(table: Ktable) -> Violations:
    return table.went_back


def sinks_agree(conn: psycopg.Connection, names: Names, table: Ktable, prefix: str
                ) -> Violations:
    """The read model, the KTable and a fold of the event store hold the same totals."""
    store = {till: (int(total), int(count)) for till, total, count in conn.execute(
        "SELECT stream_id, sum((data->>'amount')::bigint), count(*) FROM events WHERE "
        "stream_type = 'Till' AND stream_id LIKE %s GROUP BY stream_id", (f"{prefix}%",))}
    rows = {key: (int(total), int(count)) for key, total, count in conn.execute(
        f'SELECT key, total, count FROM "{names.projection}" WHERE key LIKE %s',
        (f"{prefix}%",))}
    ktable = {key: (int(value["total"]), int(value["count"]))
              for key, value in table.latest.items()
              if value is not None and key.startswith(prefix)}
    violations = []
    for till in sorted(set(store) | set(rows) | set(ktable)):
        seen = store.get(till), rows.get(till), ktable.get(till)
        if len(set(seen)) > 1:
            violations.append(f"{till}: store {seen[0]}, read model {seen[1]}, "
                              f"KTable {seen[2]} (total, count)")
    return violations


def every_stamp_once(conn: psycopg.Connection, prefix: str) -> Violations:
    """Each round amount rung up was stamped exactly once, and nothing else was."""
    wanted = {str(event_id) for (event_id,) in conn.execute(
        "SELECT event_id FROM events WHERE stream_type = 'Till' AND stream_id LIKE %s AND "
        "(data->>'amount')::bigint %% 5 = 0", (f"{prefix}%",))}
    stamped: dict[str, int] = defaultdict(int)
    for (rung,) in conn.execute("SELECT data->>'rung' FROM events WHERE stream_type = 'Card' "
                                "AND stream_id LIKE %s", (f"card-{prefix}%",)):
        stamped[str(rung)] += 1
    return ([f"rung {rung} stamped {stamped.get(rung, 0)} times"
             for rung in sorted(wanted) if stamped.get(rung, 0) != 1]
            + [f"{rung} stamped, not a round amount" for rung in sorted(set(stamped) - wanted)])


def every_deadline_once(conn: psycopg.Connection, names: Names, prefix: str) -> Violations:
    """Every tab not closed was expired (its timer fired, none lost); every expiry was
    decided by a step whose state was saved (no command of a step rolled back); none
    pending is left (timers, saved commands)."""
    ends: dict[str, list[str]] = defaultdict(list)
    for stream, event_type in conn.execute(
            "SELECT stream_id, event_type FROM events WHERE stream_type = 'Tab' AND "
            "stream_id LIKE %s AND event_type <> 'TabOpened' ORDER BY global_position",
            (f"{prefix}%",)):
        ends[str(stream)].append(str(event_type))
    opened = [str(s) for (s,) in conn.execute(
        "SELECT stream_id FROM events WHERE stream_type = 'Tab' AND stream_id LIKE %s AND "
        "event_type = 'TabOpened'", (f"{prefix}%",))]
    decided = {str(key) for (key,) in conn.execute(
        "SELECT data->>'key' FROM events WHERE stream_type = %s AND data->'state'->>'sent' "
        "= 'expire'", (f"process.{names.process}",))}
    violations = [f"tab {tab}: {ends.get(tab) or 'never ended'}" for tab in sorted(opened)
                  if ends.get(tab) not in (["TabClosed"], ["TabExpired"])]
    violations += [f"tab {tab} expired by no saved step" for tab in sorted(opened)
                   if ends.get(tab) == ["TabExpired"] and tab not in decided]
    left = conn.execute(
        "SELECT (SELECT count(*) FROM process_timers WHERE process = %s), "
        "(SELECT count(*) FROM process_commands WHERE process = %s)",
        (names.process, names.process)).fetchone()
    assert left is not None
    if left[0] or left[1]:
        violations.append(f"{left[0]} timer(s) and {left[1]} saved command(s) left pending")
    return violations


def no_lease_or_lock_left(conn: psycopg.Connection, names: Names, actors: Sequence[str]
                          ) -> Violations:
    """Once every actor stopped: no session of one is inside a transaction or holds a lock
    (a killed one's included; idle connections a Spark worker keeps for its next task are
    none of these), and the projection's lease was let go (a dead holder's expired)."""
    held = [f"{name}: a session {state}, holding {locks} lock(s)" for name, state, locks in
            conn.execute(
                "SELECT a.application_name, a.state, (SELECT count(*) FROM pg_locks l WHERE "
                "l.pid = a.pid AND l.locktype <> 'virtualxid') FROM pg_stat_activity a WHERE "
                "a.application_name = ANY(%s) AND (a.state <> 'idle' OR EXISTS (SELECT 1 FROM "
                "pg_locks l WHERE l.pid = a.pid AND l.locktype <> 'virtualxid'))",
                (list(actors),))]
    row = conn.execute(
        "SELECT writer, writer_renewed_at > now() - make_interval(secs => "
        "coalesce(writer_lease_s, 10)) FROM projection_versions WHERE projection = %s",
        (names.projection,)).fetchone()
    lease = ([f"{names.projection}: the lease is held by {row[0]}, renewed within its "
              "lease, after every actor stopped"] if row and row[0] and row[1] else [])
    return held + lease


class ReadsAfterWrites:
    """A client that reads each acknowledged ring back with ``min_version`` (the read model
    row and the KTable entry, through a read API instance): an answer older than the version
    it asked for is a violation; a wait that timed out (504) is only counted."""

    def __init__(self, base_url: str, names: Names) -> None:
        self.base_url, self.names = base_url, names
        self.asked: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self.violations: Violations = []
        self.answered = self.timed_out = 0
        self._thread = threading.Thread(target=self._read, daemon=True, name="ryw-reader")
        self._thread.start()

    def wrote(self, till: str, version: int) -> None:
        self.asked.put((till, version))

    def _read(self) -> None:
        while (asked := self.asked.get()) is not None:
            till, version = asked
            for route, version_of in (
                    (f"read-models/{self.names.projection}/rows", lambda a: a["row"]["_version"]),
                    (f"ktables/{self.names.projection}/entries", lambda a: a["version"])):
                try:
                    answer = requests.get(f"{self.base_url}/{route}/{till}", timeout=15,
                                          params={"min_version": version, "wait_ms": 3000})
                except requests.RequestException:
                    continue
                if answer.status_code == 504 or answer.status_code == 503:
                    self.timed_out += 1
                elif answer.status_code != 200:
                    self.violations.append(f"{route}/{till}: {answer.status_code} "
                                           f"{answer.text[:200]}")
                elif (found := int(version_of(answer.json()))) < version:
                    self.violations.append(f"{route}/{till}: v{found} answered, v{version} "
                                           "asked for")
                else:
                    self.answered += 1

    def done(self) -> Violations:
        self.asked.put(None)
        self._thread.join(120)
        return self.violations


CHECKERS: dict[str, Callable[..., Violations]] = {
    "ktable_never_goes_back": ktable_never_goes_back,
    "sinks_agree": sinks_agree,
    "every_stamp_once": every_stamp_once,
    "every_deadline_once": every_deadline_once,
    "no_lease_or_lock_left": no_lease_or_lock_left,
    "reads_after_writes": ReadsAfterWrites.done,
}
"""Every invariant a schedule is judged by, by name."""


def connect(database_url: str) -> psycopg.Connection:
    return psycopg.connect(libpq_url(database_url), autocommit=True)
