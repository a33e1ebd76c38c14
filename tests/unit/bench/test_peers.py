"""The peers' results are checked against the events the bench produced: a peer that lost,
doubled or misread an event fails the bench rather than give a figure."""

from __future__ import annotations

import json

import pytest

from bench.peers.results import Expected, PeerResultWrong, checked


def test_the_expected_sums_of_the_bench_events() -> None:
    # events 1..5 over 2 keys: values 2, 3, 4, 5, 6
    assert Expected.of_bench(5, 2) == Expected(keys=2, total=20, count=5)
    assert Expected.of_bench(3, 10).keys == 3


@pytest.mark.parametrize("peer", ["Kafka Streams (2 threads)", "Quix Streams"])
def test_each_peer_is_checked_and_a_wrong_sum_fails(peer: str) -> None:
    expected = Expected.of_bench(1000, 10)
    right = {"events_per_s": 123456, "keys": 10, "total": expected.total, "count": 1000}
    assert checked(peer, f"log line\n{json.dumps(right)}\n", expected) == 123456
    for wrong in ({"total": expected.total + 1}, {"count": 999}, {"keys": 9}):
        with pytest.raises(PeerResultWrong, match=peer.split(" (")[0]):
            checked(peer, json.dumps({**right, **wrong}), expected)
    with pytest.raises(PeerResultWrong, match="printed no result"):
        checked(peer, "Exception in thread main", expected)
