from hypothesis import given
from hypothesis import strategies as st

from eventfold.config import Settings
from eventfold.contract import flatten_offsets as _flatten
from eventfold.contract import nest_offsets as _to_offsets
from eventfold.projections.execution.jobs import share_out
from eventfold.projections.execution.kafka_source import KafkaSlice, OffsetRange, cap_rows
from eventfold.projections.execution.limits import (
    DRIVER_BATCH_MAX_ROWS,
    FAIR_BATCH_ROWS,
    REPLAY_MAX_ROWS,
    REPLAY_REST_RATIO,
    STREAMING_MAX_ROWS,
)


def test_the_configuration_defaults_are_the_engine_defaults() -> None:
    settings = Settings()
    assert settings.max_rows_per_batch == STREAMING_MAX_ROWS
    assert settings.replay_max_rows_per_batch == REPLAY_MAX_ROWS
    assert settings.driver_batch_max_rows == DRIVER_BATCH_MAX_ROWS
    assert settings.fair_batch_rows == FAIR_BATCH_ROWS
    assert settings.replay_rest_ratio == REPLAY_REST_RATIO


def test_cap_shares_rows_across_partitions() -> None:
    begin = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    end = {("t", 0): 1000, ("t", 1): 110, ("t", 2): 5}
    capped = cap_rows(begin, end, 100)
    assert capped == {("t", 0): 90, ("t", 1): 110, ("t", 2): 5}


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 10_000), st.integers(0, 5_000)),
                       min_size=1), st.integers(1, 20_000))
def test_cap_never_exceeds_limit_or_backlog(parts, max_rows) -> None:
    begin = {("t", p): b for p, (b, _) in parts.items()}
    end = {("t", p): b + n for p, (b, n) in parts.items()}
    capped = cap_rows(begin, end, max_rows)
    taken = sum(capped[k] - begin[k] for k in begin)
    assert taken == min(max_rows, sum(end[k] - begin[k] for k in begin))
    assert all(begin[k] <= capped[k] <= end[k] for k in begin)


def test_offsets_round_trip() -> None:
    flat = {("a", 0): 5, ("a", 1): 7, ("b", 0): 0}
    assert _flatten(_to_offsets(flat)) == flat


def slice_of(partition: int, rows: int) -> KafkaSlice:
    return KafkaSlice("broker:9092", OffsetRange("t", partition, 1_000, 1_000 + rows))


def test_slices_are_shared_out_over_at_most_one_task_per_core_largest_first() -> None:
    slices = [slice_of(0, 100), slice_of(1, 10), slice_of(2, 60), slice_of(3, 50)]
    tasks = share_out(slices, 2)
    assert [[s.range.partition for s in task] for task in tasks] == [[0, 1], [2, 3]]
    assert [[s.range.partition for s in task] for task in share_out(slices, 8)] == [
        [0], [2], [3], [1]]
    assert share_out([], 2) == []
    assert [len(task) for task in share_out([slice_of(0, 0), slice_of(1, 0)], 2)] == [1, 1]


@given(st.lists(st.integers(0, 10_000), max_size=12), st.integers(1, 6))
def test_every_slice_goes_to_exactly_one_task(sizes: list[int], cores: int) -> None:
    slices = [slice_of(p, rows) for p, rows in enumerate(sizes)]
    tasks = share_out(slices, cores)
    assert len(tasks) == min(len(slices), cores)
    assert sorted(s.range.partition for task in tasks for s in task) == list(range(len(sizes)))
    assert all(task for task in tasks)
