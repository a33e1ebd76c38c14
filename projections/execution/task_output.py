"""What a fold task hands the driver: its ``FoldOutcome`` as Arrow rows, and back.

A task's result crosses from a Python worker through the JVM to the driver as an Arrow table
(``mapInArrow``), so its parts travel as rows of one schema, told apart by ``kind``: a key's
new state, a dead letter, a derived event, a stream's watermark, a key parked or held, and one
row of counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pyarrow as pa
from eventfold.projections.outcome import (
    DeadLetter,
    Emission,
    FoldOutcome,
    KeyState,
    ParkedKey,
    SourceRecord,
)


class Row(StrEnum):
    STATE = "state"
    DEAD_LETTER = "dlq"
    DERIVED = "derived"
    WATERMARK = "watermark"
    PARKED = "parked"
    HELD = "held"
    COUNTS = "counts"


SCHEMA = pa.schema([
    ("kind", pa.string()), ("key", pa.string()), ("state", pa.string()),
    ("version", pa.int64()), ("position", pa.int64()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.string()),
    ("reason", pa.string()), ("applied", pa.int64()), ("duplicates", pa.int64()),
    ("fold_key", pa.string()), ("event_id", pa.string()), ("parks", pa.bool_()),
])


class KeySplitAcrossPartitions(RuntimeError):
    """Two tasks folded the same key: its events were not all in one partition."""


def encode(outcome: FoldOutcome) -> pa.RecordBatch:
    rows = list(_rows(outcome))
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def _rows(outcome: FoldOutcome) -> Iterator[dict[str, Any]]:
    for key, ks in outcome.changed.items():
        yield {"kind": Row.STATE, "key": key, "version": ks.version, "position": ks.position,
               "state": None if ks.state is None else json.dumps(ks.state, default=str)}
    for letter in outcome.dead_letters:
        r = letter.record
        yield {"kind": Row.DEAD_LETTER, "key": r.key, "topic": r.topic,
               "partition": r.partition, "offset": r.offset, "value": r.value,
               "reason": letter.reason, "fold_key": letter.fold_key,
               "event_id": letter.event_id, "position": letter.position,
               "parks": letter.parks}
    for emission in outcome.emissions:
        yield {"kind": Row.DERIVED, "topic": emission.topic, "key": emission.key,
               "value": emission.value}
    for stream_id, version in outcome.watermarks.items():
        yield {"kind": Row.WATERMARK, "key": stream_id, "version": version}
    for key, head in outcome.parked.items():
        yield {"kind": Row.PARKED, "key": key, "topic": head.topic, "partition": head.partition,
               "offset": head.offset, "value": head.event_id, "reason": head.reason}
    for key in outcome.held:
        yield {"kind": Row.HELD, "key": key}
    yield {"kind": Row.COUNTS, "applied": outcome.applied, "duplicates": outcome.duplicates}


def decode(table: pa.Table) -> FoldOutcome:
    """The tasks' rows merged into one outcome; a key two tasks changed raises
    ``KeySplitAcrossPartitions``."""
    outcome = FoldOutcome()
    for row in table.to_pylist():
        kind, key = row["kind"], row["key"]
        if kind == Row.STATE:
            if key in outcome.changed:
                raise KeySplitAcrossPartitions(key)
            state = row["state"]
            outcome.changed[key] = KeyState(None if state is None else json.loads(state),
                                            row["version"], row["position"])
        elif kind == Row.DEAD_LETTER:
            outcome.dead_letters.append(DeadLetter(SourceRecord(
                row["topic"], row["partition"], row["offset"], key, row["value"]),
                row["reason"], row["fold_key"], row["event_id"], row["position"],
                bool(row["parks"])))
        elif kind == Row.DERIVED:
            outcome.emissions.append(Emission(row["topic"], key, row["value"]))
        elif kind == Row.WATERMARK:
            outcome.see(key, row["version"])
        elif kind == Row.PARKED:
            outcome.parked[key] = ParkedKey(row["topic"], row["partition"], row["offset"],
                                            row["value"], row["reason"])
        elif kind == Row.HELD:
            outcome.held.add(key)
        else:
            outcome.applied += row["applied"]
            outcome.duplicates += row["duplicates"]
    return outcome
