"""Compare the event store with an event topic: what is missing, duplicated, out of order.

Used by tests and by ``eventfold verify-log``. At-least-once delivery allows duplicates (after
a crash of the Connect worker); it never allows a missing event or a reordering within one
aggregate.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoggedEvent:
    """An event as seen on the topic: identity, aggregate, version, offset order."""

    event_id: str
    stream_id: str
    stream_version: int


@dataclass
class LogReport:
    expected: int
    delivered: int
    missing: dict[str, list[int]] = field(default_factory=dict)
    duplicated: dict[str, int] = field(default_factory=dict)
    out_of_order: dict[str, list[int]] = field(default_factory=dict)

    @property
    def missing_count(self) -> int:
        return sum(len(v) for v in self.missing.values())

    @property
    def duplicate_count(self) -> int:
        return sum(self.duplicated.values())

    @property
    def ok(self) -> bool:
        return not self.missing and not self.out_of_order

    def summary(self) -> str:
        return (f"{self.expected} events in the store, {self.delivered} messages on the topic: "
                f"{self.missing_count} missing, {self.duplicate_count} duplicates, "
                f"{len(self.out_of_order)} aggregates out of order")


def compare(stored: Iterable[LoggedEvent], delivered: Iterable[LoggedEvent]) -> LogReport:
    """``delivered`` in topic order per partition (an aggregate lives in one partition)."""
    stored = list(stored)
    delivered = list(delivered)
    report = LogReport(expected=len(stored), delivered=len(delivered))
    counts = Counter(e.event_id for e in delivered)
    for event in stored:
        if counts[event.event_id] == 0:
            report.missing.setdefault(event.stream_id, []).append(event.stream_version)
        elif counts[event.event_id] > 1:
            report.duplicated[event.event_id] = counts[event.event_id] - 1
    first_seen: dict[str, list[int]] = {}
    seen_ids: set[str] = set()
    for event in delivered:
        if event.event_id in seen_ids:
            continue  # a redelivery: counted as a duplicate above
        seen_ids.add(event.event_id)
        first_seen.setdefault(event.stream_id, []).append(event.stream_version)
    for stream_id, versions in first_seen.items():
        if versions != sorted(versions):
            report.out_of_order[stream_id] = versions
    return report


def logged_from_message(key: str | None, value: str | None) -> LoggedEvent | None:
    if key is None or value is None:
        return None
    envelope = json.loads(value)
    return LoggedEvent(str(envelope["eventId"]), key, int(envelope["streamVersion"]))


def verify_topic(
    stored: Iterable[LoggedEvent], messages: Iterable[tuple[str | None, str | None]],
    include: Callable[[str], bool] = lambda _: True,
) -> LogReport:
    """Compare ``stored`` events with ``messages`` (key, value) read from the topic."""
    delivered = [event for key, value in messages
                 if (event := logged_from_message(key, value)) and include(event.stream_id)]
    return compare((e for e in stored if include(e.stream_id)), delivered)
