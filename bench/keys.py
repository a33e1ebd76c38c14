"""Which key each of the benches' events falls to: ``uniform`` (event ``p`` to key
``p % keys``, every key alike) or ``zipf`` (key of rank ``r`` drawn with weight ``r ** -1.1``,
the skew real key spaces have: a few hot keys, a long tail). One sequence for the producer, the
event store's history and the peers' expected results, drawn from a fixed seed so that a run
and its check agree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, get_args

import numpy as np

Distribution = Literal["uniform", "zipf"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)

ZIPF_S = 1.1
_SEED = 20261208


def key_indices(events: int, keys: int, distribution: Distribution = "uniform",
                after: int = 0) -> Iterator[int]:
    """The key (0 .. keys - 1) of each event at positions ``after + 1 .. after + events``,
    lazily: ten million Python ints would weigh more than the events."""
    if distribution == "uniform":
        return (position % keys for position in range(after + 1, after + events + 1))
    return map(int, _zipf(after + events, keys)[after:])


def versions_before(after: int, keys: int, distribution: Distribution = "uniform") -> list[int]:
    """How many of positions ``1 .. after`` fell to each key: where each key's versions go on
    from."""
    if distribution == "uniform":
        return [after // keys + (1 if 0 < k <= after % keys else 0) for k in range(keys)]
    return np.bincount(_zipf(after, keys), minlength=keys).tolist()  # type: ignore[no-any-return]


def distinct_keys(events: int, keys: int, distribution: Distribution = "uniform") -> int:
    """How many keys the first ``events`` events touch."""
    if distribution == "uniform":
        return min(keys, events)
    return int(np.unique(_zipf(events, keys)).size)


def _zipf(events: int, keys: int) -> np.ndarray:
    # One stream of uniform draws mapped through the CDF: the first n draws are the same
    # whatever the length asked, so a later ``after`` continues the sequence.
    weights = np.arange(1, keys + 1, dtype=np.float64) ** -ZIPF_S
    cdf = np.cumsum(weights / weights.sum())
    draws = np.random.default_rng(_SEED).random(events)
    return np.minimum(np.searchsorted(cdf, draws, side="right"), keys - 1)
