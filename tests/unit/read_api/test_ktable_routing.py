"""Which partition holds a key (Kafka's partitioner, to the bit) and which instance hosts
which partition (every instance computes the same, in even shares; a member leaving hands
its partitions to the members that hold them restored; one joining takes its share as it
restores it)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator
from operator import itemgetter
from typing import Any

import pytest

from eventfold.contract.partitioner import murmur2, partition_for
from eventfold.read_api.state.assignment import assign, owners
from eventfold.read_api.state.merge import merge_pages


@pytest.mark.parametrize(("key", "signed"), [
    # Kafka's UtilsTest.testMurmur2
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), ("abc", 479470107),
])
def test_murmur2_is_kafkas(key: str, signed: int) -> None:
    assert murmur2(key.encode()) == signed & 0xFFFFFFFF


def test_partition_for_is_the_positive_hash_modulo_the_partitions() -> None:
    assert partition_for("foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12
    assert {partition_for(f"k{i}", 12) for i in range(1000)} == set(range(12))


_BY_KEY = itemgetter("key")
MEMBERS = ["http://a:1", "http://b:1", "http://c:1"]


def _held(hosting) -> dict[str, frozenset[int]]:
    return {m: h.partitions for m, h in hosting.items()}


def test_every_partition_has_one_active_host_and_its_standbys_elsewhere_in_even_shares(
        ) -> None:
    hosting = assign(MEMBERS, range(12), standby_replicas=1)
    actives = Counter(p for h in hosting.values() for p in h.active)
    standbys = Counter(p for h in hosting.values() for p in h.standby)
    assert actives == standbys == Counter(range(12))
    assert all(not (h.active & h.standby) for h in hosting.values())
    assert sorted((len(h.active), len(h.partitions)) for h in hosting.values()) == [(4, 8)] * 3
    assert assign(list(reversed(MEMBERS)), range(12), 1) == hosting  # order does not matter
    assert all(owners(hosting)[p][0] in {m for m, h in hosting.items() if p in h.active}
               for p in range(12))


def test_a_member_leaving_hands_its_partitions_to_members_that_hold_them_restored() -> None:
    before = assign(MEMBERS, range(12), 1)
    after = assign(MEMBERS[:2], range(12), 1, restored=_held(before))
    for partition, (active, standby) in owners(before).items():
        survivors = [m for m in (active, standby) if m != "http://c:1"]
        assert owners(after)[partition][0] in survivors  # it serves at once
    assert all(h.partitions == frozenset(range(12)) for h in after.values())


def test_a_member_joining_takes_its_share_as_it_restores_it() -> None:
    two = assign(MEMBERS[:2], range(12), 1)
    joined = assign(MEMBERS, range(12), 1, restored=_held(two))
    restored_now = _held(two)
    # every partition keeps a holder that has it restored
    assert all(any(p in restored_now.get(m, ()) for m in owners(joined)[p])
               for p in range(12))
    assert joined["http://c:1"].partitions  # the newcomer restores its share meanwhile
    settled = assign(MEMBERS, range(12), 1, restored=_held(joined))
    assert sorted((len(h.active), len(h.partitions)) for h in settled.values()) == [(4, 8)] * 3
    assert assign(MEMBERS, range(12), 1, restored=_held(settled)) == settled  # it stays


def test_alone_a_member_holds_everything_and_no_standby() -> None:
    assert assign(["x"], range(4), 1)["x"].active == frozenset(range(4))
    assert assign(["x"], range(4), 1)["x"].standby == frozenset()


def test_a_restarted_member_takes_back_the_partitions_it_has_stores_of() -> None:
    three = assign(MEMBERS, range(12), 1)
    # c crashed; a and b hold everything; c restarts with its stores on disk
    two = assign(MEMBERS[:2], range(12), 1, restored=_held(three), held=_held(three))
    both = {m: h.partitions for m, h in two.items()}
    again = assign(MEMBERS, range(12), 1, restored=both, held=both,
                   stored={**both, "http://c:1": _held(three)["http://c:1"]})
    assert again["http://c:1"].partitions == three["http://c:1"].partitions
    assert all(any(p in both[m] for m in owners(again)[p] if m in both) for p in range(12))


def test_paged_parts_merge_in_key_order_a_chunk_at_a_time() -> None:
    parts = {0: ["a", "d", "e", "k"], 1: ["b", "c", "f", "g", "h"], 2: [], 3: ["j"]}
    asked: list[tuple[int, int]] = []

    async def pages(part: int) -> AsyncGenerator[list[dict[str, Any]], None]:
        keys = parts[part]
        for at in range(0, len(keys), 2):  # pages of two, each asked for when needed
            asked.append((part, at))
            yield [{"key": k} for k in keys[at:at + 2]]

    async def merged() -> list[list[str]]:
        return [[e["key"] for e in chunk]
                async for chunk in merge_pages([pages(p) for p in parts], _BY_KEY, 3)]

    assert asyncio.run(merged()) == [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "j"], ["k"]]
    assert sorted(asked) == [(0, 0), (0, 2), (1, 0), (1, 2), (1, 4), (3, 0)]

    async def alone() -> list[list[str]]:  # one stream: taken a chunk at a time, unmerged
        return [[e["key"] for e in chunk]
                async for chunk in merge_pages([pages(1), pages(2)], _BY_KEY, 2)]

    assert asyncio.run(alone()) == [["b", "c"], ["f", "g"], ["h"]]
