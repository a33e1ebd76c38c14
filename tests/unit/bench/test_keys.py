"""The benches' key distributions: one sequence for the producer, the event store's history
and the peers' expected results, so a run and its check agree."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.keys import DISTRIBUTIONS, distinct_keys, key_indices, versions_before
from bench.peers.results import Expected


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_a_later_run_goes_on_with_the_keys_and_versions_of_one_long_run(
        distribution: str) -> None:
    whole = list(key_indices(3_000, 500, distribution))  # type: ignore[arg-type]
    later = list(key_indices(1_000, 500, distribution, after=2_000))  # type: ignore[arg-type]
    assert later == whole[2_000:]
    counted = Counter(whole[:2_000])
    assert versions_before(2_000, 500, distribution) == [  # type: ignore[arg-type]
        counted[k] for k in range(500)]


def test_uniform_gives_event_p_to_key_p_mod_keys() -> None:
    assert list(key_indices(7, 3)) == [1, 2, 0, 1, 2, 0, 1]
    assert distinct_keys(2, 10) == 2 and distinct_keys(100, 10) == 10


def test_zipf_is_skewed_towards_the_first_ranks_and_counts_the_keys_it_touches() -> None:
    drawn = list(key_indices(100_000, 100_000, "zipf"))
    counted = Counter(drawn)
    assert counted[0] > counted[1] > counted[9] > 0
    assert sum(n for _, n in counted.most_common(100)) > 0.4 * len(drawn)
    assert distinct_keys(100_000, 100_000, "zipf") == len(counted) < 100_000
    assert Expected.of_bench(100_000, 100_000, "zipf").keys == len(counted)
