"""The duplicate guard, in the Arrow and Spark forms the engine runs it in.

Delivery is at-least-once (Debezium re-sends after a crash, at new offsets), so every path
drops what it has applied before, by one rule:

- an event's identity is its (stream id, stream version), ``EVENT_IDENTITY``;
- an event at or below its stream's watermark, the last version an earlier batch applied,
  was applied: it is dropped (``drop_applied``, ``drop_below``);
- within a batch, the second copy of an identity is dropped (``dedupe``; in Spark,
  ``dropDuplicates`` on ``EVENT_IDENTITY`` after the shuffle).

Watermarks are per source stream, so the rule holds for re-keyed projections too, where one key
gathers the events of many streams. The plain-Python form is inline in ``fold``'s per-event
loop (``BatchFold.add``, ``KeyFolder.fold``), where a call per event would cost more than the
check. Dead letters always pass: they are reported, never deduped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

EVENT_IDENTITY = ("key", "streamVersion")
"""The decoded columns that identify an event: its stream id (the record key) and version."""
_FIRST_ROW = pa.array([True])


def drop_applied(events: pa.Table,
                 watermarks: Callable[[list[str]], Mapping[str, int]]) -> pa.Table:
    """Drop events at or below their stream's watermark; ``watermarks`` gives those of the
    streams asked for (this chunk's, not every stream's)."""
    streams = pc.unique(events.column("key").drop_null())
    return drop_below(events, watermarks(streams.to_pylist()) if len(streams) else {})


def drop_below(events: pa.Table, marks: Mapping[str, int]) -> pa.Table:
    """Drop events at or below the version ``marks`` holds for their stream (they were
    applied, or met, before); dead letters pass."""
    if not marks:
        return events
    at = pc.index_in(events.column("key"), value_set=pa.array(list(marks), pa.string()))
    mark = pc.fill_null(pc.take(pa.array(list(marks.values()), pa.int64()), at), 0)
    keep = pc.or_(pc.is_valid(events.column("reason")),
                  pc.greater(events.column("streamVersion"), mark))
    return events.filter(pc.fill_null(keep, True))


def dedupe(events: pa.Table) -> pa.Table:
    """One row per (stream, version): a copy delivered twice counts once."""
    if events.num_rows < 2:
        return events
    ordered = events.take(pc.sort_indices(events, [("key", "ascending"),
                                                   ("streamVersion", "ascending")]))
    keys, versions = ordered.column("key"), ordered.column("streamVersion")
    count = ordered.num_rows
    repeat = pc.and_(pc.equal(keys.slice(1), keys.slice(0, count - 1)),
                     pc.equal(versions.slice(1), versions.slice(0, count - 1)))
    keep = pa.chunked_array([_FIRST_ROW, *pc.invert(repeat).chunks], pa.bool_())
    return ordered.filter(keep)
