"""Map-side partial aggregation, in Arrow: what each task of an aggregation hands the driver.

The task that reads and decodes a source partition also dedupes and aggregates it per key,
as a combiner would, so O(keys), not O(events), leave it and no event is shuffled. The driver
then merges the tasks' partials (``merge_partials``); the store merges the result into the
stored rows.

That is exact as long as every copy of an event is in the partition its stream's key maps
to, which is how every producer here partitions. A stream met by two tasks of one batch
means some producer did not (a repartitioned topic, say): the partials cannot tell copies
apart then, and the engine aggregates that batch from the events themselves.

A task aggregates its partition chunk by chunk (``PartitionAggregate``), so it holds one chunk
of events and O(keys) partials, however large the batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from eventfold.projections.definition.aggregates import AggregateFunction
from eventfold.projections.execution.decode import field_column
from eventfold.projections.execution.guard import dedupe, drop_below
from eventfold.projections.outcome import KeyState, SourceRecord
from eventfold.projections.plan import Plan

GROUP = "fold_key"
DEAD_LETTER_COLUMNS = (*SourceRecord._fields, "reason")


def partial_schema(plan: Plan, decoded: pa.Schema) -> pa.Schema:
    """Partials (kind ``partial``), the streams' last versions (``mark``: a stream id in
    ``fold_key``) and dead letters (``dlq``), in one schema."""
    fields = [pa.field("kind", pa.string()), pa.field(GROUP, pa.string()),
              pa.field("_version", pa.int64()), pa.field("_events", pa.int64()),
              pa.field("_position", pa.int64()),
              *(decoded.field(name) for name in DEAD_LETTER_COLUMNS)]
    for name, function in plan.aggregates.items():
        source = decoded.field(_source(function)).type
        fields.append(pa.field(slot(name), function.partial_type(source)))
        if function.newest_wins:
            fields.append(pa.field(_value_position(name), pa.int64()))
    return pa.schema(fields)


class _Specs:
    """Arrow hash aggregations by output column; a spec two columns share is computed once."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, str]] = []
        self.outputs: dict[str, str] = {}

    def add(self, name: str, column: str, function: str) -> None:
        if (column, function) not in self.specs:
            self.specs.append((column, function))
        self.outputs[name] = f"{column}_{function}"

    def apply(self, table: pa.Table) -> dict[str, pa.ChunkedArray]:
        grouped = table.group_by(GROUP, use_threads=False).aggregate(self.specs)
        return {GROUP: grouped.column(GROUP),
                **{name: grouped.column(out) for name, out in self.outputs.items()}}


def partial_aggregate(events: pa.Table, plan: Plan, schema: pa.Schema) -> pa.Table:
    """One task's decoded events (the watermark guard applied) as partials per key, the last
    version of each stream it met, and its dead letters."""
    letters = events.filter(pc.is_valid(events.column("reason")))
    good = dedupe(events.filter(pc.is_null(events.column("reason"))))
    good = good.take(pc.sort_indices(good.column("globalPosition")))  # "newest" needs order
    specs = _Specs()
    specs.add("_version", "streamVersion", "max")
    specs.add("_events", "globalPosition", "count")
    specs.add("_position", "globalPosition", "max")
    for name, function in plan.aggregates.items():
        column = _source(function)
        specs.add(slot(name), column, function.arrow_partial)
        if function.newest_wins:
            good = good.append_column(_value_position(name), pc.if_else(
                pc.is_valid(good.column(column)), good.column("globalPosition"),
                pa.scalar(None, pa.int64())))
            specs.add(_value_position(name), _value_position(name), "max")
    columns = specs.apply(good)
    parts = [_rows(schema, "partial", columns, len(columns[GROUP])), _rows(
        schema, "dlq", {c: letters.column(c) for c in DEAD_LETTER_COLUMNS}, letters.num_rows)]
    if plan.rekeyed:  # a key gathers many streams: their marks go apart
        parts.append(_mark_rows(schema, good, "key", "streamVersion"))
    return pa.concat_tables(parts)


class PartitionAggregate:
    """The partials of one source partition, added a chunk of decoded events at a time.

    Every copy of an event sits in its stream's partition, and a stream's versions rise with
    offsets there, so an event at or below the version its stream reached in an earlier chunk
    is a copy delivered again; within a chunk, ``partial_aggregate`` dedupes."""

    def __init__(self, plan: Plan, schema: pa.Schema) -> None:
        self.plan = plan
        self.schema = schema
        self._reached: dict[str, int] = {}
        self._partials: pa.Table | None = None

    def add(self, events: pa.Table) -> None:
        events = drop_below(events, self._reached)
        partials = partial_aggregate(events, self.plan, self.schema)
        self._reached.update(stream_marks(partials, self.plan))
        self._partials = (partials if self._partials is None
                          else self._combine(self._partials, partials))

    def result(self) -> pa.Table:
        return self._partials if self._partials is not None else self.schema.empty_table()

    def _combine(self, earlier: pa.Table, partials: pa.Table) -> pa.Table:
        both = pa.concat_tables([earlier, partials])
        kinds = both.column("kind")
        merged = _merge_rows(both.filter(pc.equal(kinds, "partial")), self.plan)
        parts = [_rows(self.schema, "partial", merged, len(merged[GROUP])),
                 both.filter(pc.equal(kinds, "dlq"))]
        if self.plan.rekeyed:
            parts.append(_mark_rows(self.schema, both.filter(pc.equal(kinds, "mark")), GROUP,
                                    "_version"))
        return pa.concat_tables(parts)


def merge_into_stored(rows: pa.Table, stored: Mapping[str, KeyState], plan: Plan) -> pa.Table:
    """A batch's partials (one row per key) merged into the keys' ``stored`` rows: each
    key's values now, its version (re-keyed: the events folded into it so far), its last
    position, and ``_events`` the batch's events. The batch is newer than what is stored, so
    a newest-wins column takes the batch's value whenever it has one."""
    rows = _mergeable(rows, plan)
    if stored:
        rows = pa.concat_tables([_stored_partials(stored, plan, rows.schema), rows])
    merged = _merge_rows(rows, plan)
    if plan.rekeyed:  # the version counts the events folded into the key
        before = pa.array([ks.version for ks in stored.values()], pa.int64())
        at = pc.index_in(merged[GROUP], value_set=pa.array(list(stored), pa.string()))
        merged["_version"] = pc.add(pc.fill_null(pc.take(before, at), 0), merged["_events"])
    return pa.table(merged)


def _mergeable(rows: pa.Table, plan: Plan) -> pa.Table:
    """The columns ``_merge_rows`` reads; a newest-wins value of Spark's aggregation (which
    keeps no value position) is as new as the batch's last position."""
    columns = {name: rows.column(name) for name in (GROUP, "_version", "_events", "_position")}
    for name, function in plan.aggregates.items():
        columns[slot(name)] = rows.column(slot(name))
        if function.newest_wins:
            columns[_value_position(name)] = (
                rows.column(_value_position(name)) if _value_position(name) in rows.column_names
                else pc.if_else(pc.is_valid(rows.column(slot(name))), rows.column("_position"),
                                pa.scalar(None, pa.int64())))
    return pa.table(columns)


def _stored_partials(stored: Mapping[str, KeyState], plan: Plan, schema: pa.Schema) -> pa.Table:
    """The stored rows as partials: no events of this batch, their values as new as the
    newest position the row applied (a newest-wins value of the batch wins when it is
    newer, as a re-keyed key's events from a lagging partition may not be)."""
    states = [ks.state or {} for ks in stored.values()]
    positions = pa.array([ks.position for ks in stored.values()], pa.int64())
    columns: dict[str, pa.Array] = {
        GROUP: pa.array(list(stored), pa.string()),
        "_version": pa.array([ks.version for ks in stored.values()], pa.int64()),
        "_events": pa.array([0] * len(stored), pa.int64()), "_position": positions}
    for name, function in plan.aggregates.items():
        values = pa.array([state.get(name) for state in states],
                          schema.field(slot(name)).type)
        columns[slot(name)] = values
        if function.newest_wins:
            columns[_value_position(name)] = pc.if_else(pc.is_valid(values), positions,
                                                        pa.scalar(None, pa.int64()))
    return pa.Table.from_pydict(columns, schema=schema)


def _merge_rows(rows: pa.Table, plan: Plan) -> dict[str, pa.ChunkedArray]:
    """Partial rows merged per key, as columns."""
    specs = _Specs()
    specs.add("_version", "_version", "max")
    specs.add("_events", "_events", "sum")
    specs.add("_position", "_position", "max")
    for name, function in plan.aggregates.items():
        if function.newest_wins:  # its value is the newest partial's that has one (below)
            specs.add(_value_position(name), _value_position(name), "max")
        else:
            specs.add(slot(name), slot(name), function.arrow_merge)
    merged = specs.apply(rows)
    for name, function in plan.aggregates.items():
        if function.newest_wins:
            merged[slot(name)] = _newest(rows, merged[GROUP], name)
    return merged


def stream_marks(partials: pa.Table, plan: Plan) -> dict[str, int]:
    """The last version of each source stream the batch met."""
    marks = partials.filter(pc.equal(partials.column("kind"),
                                     "mark" if plan.rekeyed else "partial"))
    return dict(zip(marks.column(GROUP).to_pylist(), marks.column("_version").to_pylist(),
                    strict=True))


def _newest(rows: pa.Table, keys: pa.ChunkedArray, name: str) -> pa.Array:
    """Per key, the ``name`` of the partial whose value is newest (null if none has one)."""
    position = _value_position(name)
    ordered = rows.filter(pc.is_valid(rows.column(position)))
    ordered = ordered.take(pc.sort_indices(ordered.column(position)))
    newest = ordered.group_by(GROUP, use_threads=False).aggregate([(slot(name), "last")])
    at = pc.index_in(keys, value_set=newest.column(GROUP))
    return pc.take(newest.column(f"{slot(name)}_last"), at)


def _rows(schema: pa.Schema, kind: str, columns: dict[str, pa.ChunkedArray | pa.Array],
          count: int) -> pa.Table:
    """``count`` rows of ``kind`` with ``columns``, the schema's other columns null."""
    arrays = [pa.array([kind] * count, pa.string()) if f.name == "kind"
              else columns[f.name].cast(f.type) if f.name in columns
              else pa.nulls(count, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _mark_rows(schema: pa.Schema, rows: pa.Table, stream: str, version: str) -> pa.Table:
    """One ``mark`` row per stream of ``rows``: the highest ``version`` it reached."""
    marks = rows.group_by(stream, use_threads=False).aggregate([(version, "max")])
    return _rows(schema, "mark", {GROUP: marks.column(stream),
                                  "_version": marks.column(f"{version}_max")}, marks.num_rows)


def _source(function: AggregateFunction) -> str:
    """The decoded column a function aggregates; one without a field counts positions."""
    return "globalPosition" if function.field is None else field_column(function.field)


def slot(name: str) -> str:
    """The column of aggregate column ``name`` in partials: apart from the columns partials
    carry themselves, whatever the user named it (``value``, ``kind``...)."""
    return f"agg:{name}"


def _value_position(name: str) -> str:
    """The column holding the position of a ``newest_wins`` partial's value."""
    return f"position:{name}"
