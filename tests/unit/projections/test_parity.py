"""Parity of the plain-Python harness and the Arrow paths a Spark task runs, on random logs.

Each projection kind (a fold, a re-keyed fold by a dotted path with a lookup, an aggregation,
a re-keyed aggregation, a stream) folds the same records three ways: ``fold_records`` (the
reference), the task that reads a partition and folds it as it decodes (``BatchFold``, what
the in-place fold runs), and the Arrow decoder followed by the shuffled fold or the partial
aggregates merged per key. States, emissions, dead letters and watermarks must be identical.
"""

from __future__ import annotations

from itertools import groupby
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from sqlalchemy import BigInteger, Float, String

from eventfold.projections import Avg, Count, Latest, Max, Sum, aggregation
from eventfold.projections.execution.aggregate_jobs import aggregate_outcome
from eventfold.projections.execution.decode import decode_events, decoded_schema, records_table
from eventfold.projections.execution.fold import EMIT_ALL, KeyFolder, by_partition, fold_records
from eventfold.projections.execution.fold_jobs import columns, decoded_rows
from eventfold.projections.execution.partial import PartitionAggregate, partial_schema
from eventfold.projections.outcome import FoldOutcome, SourceRecord
from eventfold.projections.plan import Plan, compile_projection
from tests.parity import LOOKUP_ROWS, Step, comparable, kinds, logs, records_of

PROJECTIONS = kinds()


def arrow_outcome(plan: Plan, records: list[SourceRecord]) -> FoldOutcome:
    """What Spark's tasks compute, without Spark: decode each partition in Arrow, then fold
    after a shuffle by key, or aggregate per partition and merge the partials."""
    runs = by_partition(records)
    if plan.aggregates:
        schema = partial_schema(plan, decoded_schema(plan))
        partials = []
        for run in runs:
            partition = PartitionAggregate(plan, schema)
            partition.add(decode_events(records_table(run), plan))
            partials.append(partition.result())
        both = pa.concat_tables(partials)
        return aggregate_outcome(both, both.filter(pc.equal(both.column("kind"), "dlq")), {},
                                 plan)
    events = pa.concat_tables([decode_events(records_table(run), plan) for run in runs])
    events = events.take(pc.sort_indices(events, [("fold_key", "ascending"),
                                                  ("globalPosition", "ascending")]))
    outcome = FoldOutcome()
    keyed = list(decoded_rows(columns(events), outcome))
    folder = KeyFolder(plan, outcome, EMIT_ALL)
    for key, group in groupby(keyed, key=itemgetter(0)):
        folder.fold(key, None, [item for _, item in group], LOOKUP_ROWS)
    return outcome


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs)
def test_python_and_arrow_paths_agree(kind: str, log) -> None:
    plan = compile_projection(PROJECTIONS[kind])
    records = records_of(log)
    reference = comparable(fold_records(plan, {}, records, lookup_rows=LOOKUP_ROWS))
    assert comparable(arrow_outcome(plan, records)) == reference


def test_columns_named_like_the_engines_own_fold_right() -> None:
    """Partials and Spark's aggregate carry columns of their own (kind, value, reason...);
    a read model may use those names too."""
    named = aggregation(
        "named", sources=["Till"], aggregates={
            "value": Sum("amount"), "kind": Count(), "reason": Latest("city"),
            "fold_key": Max("amount"), "offset": Avg("price")},
        columns={"value": BigInteger(), "kind": BigInteger(), "reason": String(),
                 "fold_key": BigInteger(), "offset": Float()})
    log = [Step("event", stream, "Sold", {"amount": amount, "city": city, "price": amount})
           for stream, amount, city in [("s1", 5, "north"), ("s2", 7, None), ("s1", 9, "7"),
                                        ("s3", 1, "x")]]
    plan = compile_projection(named)
    records = records_of(log)
    reference = comparable(fold_records(plan, {}, records))
    assert comparable(arrow_outcome(plan, records)) == reference
    assert reference["changed"]["s1"][0] == {
        "value": 14, "kind": 2, "reason": "7", "fold_key": 9, "offset": 7.0,
        "_offset__sum": 14.0, "_offset__count": 2}
