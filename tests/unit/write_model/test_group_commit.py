"""Group commit as pure threading: every submit gets its own outcome, batches never share a
key, and a failing or raising commit never strands a caller. And on asyncio: the callers one
batch woke commit together next time."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence

import pytest

from eventfold.write_model.persistence.group_commit import AsyncGroupCommit, GroupCommit
from tests.concurrency import run_together


class Ledger:
    """A fake commit: records batches, answers each unit with its own value (or error)."""

    def __init__(self, delay_s: float = 0.002) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.delay_s = delay_s
        self.in_commit = 0
        self.most_in_commit = 0
        self._lock = threading.Lock()
        self.in_flight_keys: set[str] = set()
        self.overlaps = 0

    def commit(self, units: Sequence[tuple[str, int]]) -> list[int | Exception]:
        keys = {key for key, _ in units}
        with self._lock:
            self.in_commit += 1
            self.most_in_commit = max(self.most_in_commit, self.in_commit)
            self.overlaps += bool(keys & self.in_flight_keys)
            self.in_flight_keys |= keys
            self.batches.append(list(units))
        time.sleep(self.delay_s * random.random())
        with self._lock:
            self.in_commit -= 1
            self.in_flight_keys -= keys
        return [ValueError(f"odd {n}") if n % 7 == 3 else n * 10 for _, n in units]


def test_each_caller_gets_its_own_outcome_and_keys_never_share_a_batch() -> None:
    ledger = Ledger()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(
        ledger.commit, lambda unit: [unit[0]], max_batch=16, max_concurrent=2)
    outcomes: dict[int, int | str] = {}
    counter = iter(range(10_000))
    lock = threading.Lock()

    def client() -> None:
        for _ in range(60):
            with lock:
                n = next(counter)
            try:
                outcomes[n] = group.submit((f"stream-{n % 5}", n))
            except ValueError as exc:
                outcomes[n] = str(exc)

    run_together(client, threads=12)
    assert len(outcomes) == 720
    for n, outcome in outcomes.items():
        assert outcome == (f"odd {n}" if n % 7 == 3 else n * 10)
    assert all(len({key for key, _ in batch}) == len(batch) for batch in ledger.batches)
    assert ledger.overlaps == 0, "two batches in flight shared a stream"
    assert ledger.most_in_commit <= 2
    assert max(len(batch) for batch in ledger.batches) > 1, "nothing was grouped"
    assert sum(len(batch) for batch in ledger.batches) == 720


def test_a_lone_caller_commits_on_its_own_thread() -> None:
    threads: list[str] = []

    def commit(units: Sequence[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        return list(units)

    group: GroupCommit[int, int] = GroupCommit(commit, lambda unit: [unit])
    assert [group.submit(n) for n in range(3)] == [0, 1, 2]
    assert threads == [threading.current_thread().name] * 3


def test_a_commit_that_raises_fails_its_batch_only() -> None:
    calls = 0

    def commit(units: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database went away")
        return list(units)

    group: GroupCommit[int, int] = GroupCommit(commit, lambda unit: [unit])
    with pytest.raises(ConnectionError):
        group.submit(1)
    assert group.submit(2) == 2


def test_a_wrong_number_of_outcomes_is_an_error_not_a_hang() -> None:
    group: GroupCommit[int, int] = GroupCommit(lambda units: [], lambda unit: [unit])
    with pytest.raises(RuntimeError, match="0 outcomes for 1 units"):
        group.submit(1)


def test_units_on_one_key_are_committed_in_turn_under_contention() -> None:
    ledger = Ledger(delay_s=0.001)
    group: GroupCommit[tuple[str, int], int] = GroupCommit(
        ledger.commit, lambda unit: [unit[0]], max_batch=64, max_concurrent=3)
    results: list[int | str] = []

    def client() -> None:
        for n in range(0, 700, 14):  # multiples of 7: never an "odd" error
            results.append(group.submit(("hot", n)))

    run_together(client, threads=8)
    assert len(results) == 400
    assert all(len(batch) == 1 for batch in ledger.batches)
    assert ledger.overlaps == 0


class Resubmitting:
    """Eight asyncio callers, each submitting again as soon as it has its outcome, 20 times;
    records each batch's size and the most batches in flight at once."""

    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self.batches: list[int] = []
        self.in_flight = self.most_in_flight = 0

    async def commit(self, units: Sequence[int]) -> list[int]:
        self.batches.append(len(units))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        return [n * 10 for n in units]

    def run(self) -> None:
        async def callers() -> list[list[int]]:
            group: AsyncGroupCommit[int, int] = AsyncGroupCommit(
                self.commit, keys=lambda n: [n], max_concurrent=self.max_concurrent)

            async def caller(n: int) -> list[int]:
                return [await group.submit(n) for _ in range(20)]

            return await asyncio.gather(*(caller(n) for n in range(8)))

        assert asyncio.run(callers()) == [[n * 10] * 20 for n in range(8)]
        assert sum(self.batches) == 160


def test_async_callers_woken_by_one_batch_commit_together_in_the_next() -> None:
    """One commit slot: every batch holds all eight callers. Without the leader's turn of the
    loop, the first task woken committed alone and the others waited for it (batches of 1,
    8, 1, 8, ...)."""
    callers = Resubmitting(max_concurrent=1)
    callers.run()
    assert callers.batches == [8] * 20


def test_async_callers_split_evenly_over_free_commit_slots() -> None:
    """Two commit slots: eight waiting callers go out as two batches of four, in flight at
    once, so one half's callers can run while the other half commits. (A leader took every
    waiting unit before: the second slot stayed idle or split batches unevenly.)"""
    callers = Resubmitting(max_concurrent=2)
    callers.run()
    assert callers.batches[:2] == [4, 4]  # later splits depend on which batch returns first
    assert callers.most_in_flight == 2
    assert max(callers.batches) < 8


def test_a_batch_beside_one_in_flight_waits_until_it_is_worth_a_round_trip() -> None:
    """Beside a batch in flight, a second one starts only with at least half as many units:
    a trickle of single units would each pay a round trip's fixed cost. The units that wait
    are never stranded: the batch in flight hands them on."""
    batches: list[list[int]] = []
    release = asyncio.Event()

    async def commit(units: Sequence[int]) -> list[int]:
        batches.append(list(units))
        if len(batches) == 1:
            await release.wait()  # the batch in flight
        return [n * 10 for n in units]

    async def settle() -> None:
        for _ in range(10):
            await asyncio.sleep(0)

    async def run() -> list[int]:
        group: AsyncGroupCommit[int, int] = AsyncGroupCommit(commit, keys=lambda n: [n],
                                                             max_concurrent=2)
        calls = [asyncio.create_task(group.submit(n)) for n in range(8)]
        await settle()
        assert [len(b) for b in batches] == [4, 4]  # the first is held, the second done
        calls.append(asyncio.create_task(group.submit(8)))
        await settle()
        assert len(batches) == 2  # one unit beside four in flight: it waits
        calls.append(asyncio.create_task(group.submit(9)))
        await settle()
        assert batches[2] == [8, 9]  # two are half of four: they go now
        calls.append(asyncio.create_task(group.submit(10)))
        await settle()
        release.set()
        return list(await asyncio.gather(*calls))

    assert asyncio.run(run()) == [n * 10 for n in range(11)]
    assert sorted(n for batch in batches for n in batch) == list(range(11))
