"""What a task hands the driver: counts of what it wrote, never the keys it folded.

A task's result crosses from a Python worker through the JVM to the driver as an Arrow table
(``mapInArrow``): one row of counts per task, a row per key it held back as parked (the commit
checks they still are; there are few), per derived-event topic it wrote (the catalog lists
them), and per dead letter it wrote, up to a few (the run's log names them). The driver adds
them up into the batch's ``StagedBatch``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import pyarrow as pa

from eventfold.projections.state.producer import LetterNote
from eventfold.projections.state.stage import TASK_PHASES, StagedBatch


class Row(StrEnum):
    COUNTS = "counts"
    HELD = "held"
    TOPIC = "topic"
    LETTER = "letter"


SCHEMA = pa.schema([
    ("kind", pa.string()), ("name", pa.string()), ("new_rows", pa.int64()),
    ("direct_rows", pa.int64()),
    ("known_rows", pa.int64()), ("live_rows_delta", pa.int64()), ("marks", pa.int64()),
    ("applied", pa.int64()),
    ("duplicates", pa.int64()), ("dead_letters", pa.int64()),
    ("server", pa.string()), ("event_id", pa.string()), ("correlation_id", pa.string()),
    ("first_append_ms", pa.int64()),
    *((f"{phase}_s", pa.float64()) for phase in TASK_PHASES),
])


def encode(counts: StagedBatch) -> pa.RecordBatch:
    """One task's summary (``counts.attempt`` and offsets are the driver's own; a task
    stages on one server, if any)."""
    server = next(iter(counts.servers), None)
    rows: list[dict[str, Any]] = [{
        "kind": Row.COUNTS, "new_rows": counts.new_rows, "direct_rows": counts.direct_rows,
        "known_rows": counts.known_rows, "live_rows_delta": counts.live_rows_delta,
        "marks": counts.marks, "applied": counts.applied, "duplicates": counts.duplicates,
        "dead_letters": counts.dead_letters,
        "server": None if server is None else server.isoformat(),
        "first_append_ms": counts.first_append_ms,
        **{f"{phase}_s": counts.seconds.get(phase, 0.0) for phase in TASK_PHASES}}]
    rows += [{"kind": Row.HELD, "name": key} for key in sorted(counts.held)]
    rows += [{"kind": Row.TOPIC, "name": topic} for topic in sorted(counts.topics)]
    rows += [{"kind": Row.LETTER, "name": note.message, "event_id": note.event_id,
              "correlation_id": note.correlation_id} for note in counts.notes]
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def decode(table: pa.Table, attempt: str) -> StagedBatch:
    """The tasks' summaries of one attempt added up."""
    batch = StagedBatch(attempt)
    for row in table.to_pylist():
        if row["kind"] == Row.HELD:
            batch.held.add(row["name"])
        elif row["kind"] == Row.TOPIC:
            batch.topics.add(row["name"])
        elif row["kind"] == Row.LETTER:
            batch.notes.append(LetterNote(row["name"], row["event_id"], row["correlation_id"]))
        else:
            batch.add(StagedBatch(attempt, **{name: row[name] for name in COUNTS}, seconds={
                phase: row[f"{phase}_s"] for phase in TASK_PHASES},
                first_append_ms=row["first_append_ms"]))
            if row["server"] is not None:
                batch.servers.add(datetime.fromisoformat(row["server"]))
    return batch


COUNTS = ("new_rows", "direct_rows", "known_rows", "live_rows_delta", "marks", "applied",
          "duplicates", "dead_letters")
