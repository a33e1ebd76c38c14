from hypothesis import given
from hypothesis import strategies as st

from outbox.kafka import flatten_offsets as _flatten
from outbox.kafka import nest_offsets as _to_offsets
from projections.kafka_source import cap_rows


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
