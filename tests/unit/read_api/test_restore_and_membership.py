"""The read side's engine in pure logic: a partition's restore moves only as its states allow;
a store too old for its topic's tombstones is wiped (one a reader served goes on, restored);
the active host of a partition is one within the acceptable lag; membership keeps members
through a stalled database."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from eventfold.read_api.state import KTableEntry, RocksDBStore, StoreConfig
from eventfold.read_api.state.assignment import assign
from eventfold.read_api.state.membership import TIMEOUT_S, Member, Membership
from eventfold.read_api.state.restore import IllegalTransition, Restoration, RestoreState
from eventfold.read_api.state.stores import TopicOffsets

TOPIC, TOPIC_ID = "eventfold.ktable.totals.v1", "topic-id-1"


# -- restore ------------------------------------------------------------------------------------
def test_a_partition_restores_to_the_end_offset_it_was_registered_with() -> None:
    restoration = Restoration(TOPIC)
    restoration.register(0, start=10, end=30)
    restoration.register(1, start=5, end=5)  # nothing to catch up: restored at once
    assert (restoration.restoring, restoration.restored) == ({0}, {1})
    assert not restoration.advance(0, 20, records=10)
    assert restoration.advance(0, 31, records=11)  # reached: restored just now
    assert not restoration.advance(0, 40, records=9)  # live from then on
    assert restoration.restored == {0, 1}
    progress = restoration.progress(restored=True)
    assert (progress.records, progress.total) == (21, 20)


def test_a_reader_that_took_the_writers_place_stays_restored() -> None:
    restoration = Restoration(TOPIC)
    restoration.register(3, start=10, end=500, restored=True)
    assert restoration.state(3) is RestoreState.RESTORED
    assert restoration.progress(restored=True).total == 0


def test_moves_the_states_do_not_allow_are_refused() -> None:
    restoration = Restoration(TOPIC)
    restoration.register(0, start=0, end=10)
    with pytest.raises(IllegalTransition, match="registered already"):
        restoration.register(0, start=0, end=10)
    with pytest.raises(IllegalTransition, match="unregistered -> restoring again"):
        restoration.restart(7, 0, 10)
    restoration.advance(0, 10, 10)
    restoration.restart(0, 0, 4)  # its store wiped: restored again
    assert restoration.state(0) is RestoreState.RESTORING
    restoration.forget([0])
    assert restoration.state(0) is None and restoration.restoring == frozenset()


# -- a store's checkpoint against its topic -----------------------------------------------------
def _store(directory: Path, retention_ms: int | None, continuing: tuple[int, ...] = ()
           ) -> RocksDBStore:
    store = RocksDBStore(StoreConfig(directory, cache_mb=8), TOPIC)
    store.open_partitions([0], TopicOffsets(TOPIC_ID, {0: 0}, {0: 100}, retention_ms),
                          continuing)
    return store


def test_a_checkpoint_older_than_the_topics_delete_retention_wipes_the_store(
        tmp_path, caplog) -> None:
    first = _store(tmp_path, None)
    first.write(0, [("deleted-later", KTableEntry(b"1", 1))], 7, 7,
                synced_at_ms=int(time.time() * 1000) - 5_000)
    first.close()
    kept = _store(tmp_path, retention_ms=60_000)  # 5 s old, tombstones kept a minute: fine
    assert kept.positions() == {0: 7}
    kept.close()
    wiped = _store(tmp_path, retention_ms=1_000)
    try:
        assert (wiped.positions(), wiped.get("deleted-later")) == ({}, None)
    finally:
        wiped.close()
    assert "past the topic's delete.retention.ms" in caplog.text


def test_a_checkpoint_that_never_read_to_the_end_is_not_resumed(tmp_path, caplog) -> None:
    first = _store(tmp_path, None)
    first.write(0, [("a", KTableEntry(b"1", 1))], 7, 50)  # restoring: never caught up
    first.close()
    again = _store(tmp_path, retention_ms=86_400_000)
    try:
        assert again.positions() == {}
    finally:
        again.close()
    assert "does not say when it last read the topic to its end" in caplog.text


def test_a_continuing_partition_keeps_its_restored_mark_and_others_lose_it(tmp_path) -> None:
    first = _store(tmp_path, None)
    first.write(0, [("a", KTableEntry(b"1", 1))], 7, 7, synced_at_ms=int(time.time() * 1000))
    first.restored([0])
    first.close()
    continuing = _store(tmp_path, retention_ms=60_000, continuing=(0,))
    assert continuing.restored_partitions(TOPIC_ID) == {0}
    assert continuing.restored_partitions("another-topic-id") == frozenset()
    assert continuing.written_for(0) == TOPIC_ID
    continuing.close()
    cold = _store(tmp_path, retention_ms=60_000)
    try:
        assert cold.restored_partitions() == frozenset()
    finally:
        cold.close()


# -- the active host within the acceptable lag --------------------------------------------------
def test_a_partition_is_active_on_a_holder_within_the_acceptable_lag() -> None:
    members = ["http://a:1", "http://b:1"]
    both = {m: {p: 0 for p in range(4)} for m in members}
    settled = assign(members, range(4), 1, restored=both, acceptable_lag=100)
    a_active = settled["http://a:1"].active
    # a falls far behind on what it is active for: b, caught up, takes those over
    lagging = {**both, "http://a:1": {p: (5_000 if p in a_active else 0) for p in range(4)}}
    moved = assign(members, range(4), 1, restored=lagging, acceptable_lag=100)
    assert a_active and moved["http://b:1"].active >= a_active
    # no holder within the lag: the least bad one that holds it restored serves
    alone = assign(["http://a:1"], range(4), 0, restored={"http://a:1": {p: 9_999 for p in
                                                                         range(4)}},
                   acceptable_lag=100)
    assert alone["http://a:1"].active == frozenset(range(4))


# -- membership through a stalled database ------------------------------------------------------
def test_members_not_seen_right_after_the_database_stalled_are_kept_for_a_timeout() -> None:
    membership = Membership("http://a:1", dict)
    a, b, c = Member("http://a:1"), Member("http://b:1"), Member("http://c:1")
    membership.saw((a, b, c), now=100.0)
    membership.saw((a, b, c), now=101.0)
    for second in range(102, 108):
        membership.saw((a, b, c), now=float(second))
    # the database paused for 10 s; when it answers, b's and c's rows are old
    membership.saw((a,), now=118.0)
    assert [m.url for m in membership.members()] == ["http://a:1", "http://b:1", "http://c:1"]
    for second in range(119, 118 + int(TIMEOUT_S) + 1):  # b renewed; c really is gone
        membership.saw((a, b), now=float(second))
    assert [m.url for m in membership.members()] == ["http://a:1", "http://b:1"]


def test_a_member_that_stops_beating_while_the_database_answers_is_let_go() -> None:
    membership = Membership("http://a:1", dict)
    a, b = Member("http://a:1"), Member("http://b:1")
    for second in range(100, 110):
        membership.saw((a, b), now=float(second))
    membership.saw((a,), now=110.0)
    assert [m.url for m in membership.members()] == ["http://a:1"]
    membership.failed()  # a heartbeat that fails starts the wait again
    membership.saw((a, b), now=111.0)
    membership.saw((a,), now=112.0)
    assert [m.url for m in membership.members()] == ["http://a:1", "http://b:1"]


# -- what an answer says of its freshness -------------------------------------------------------
class _View:
    topic, restored, lag_measured_at = "t", True, None

    def __init__(self, lag: int) -> None:
        self.lag = lag

    def partition_lag(self, partition: int) -> int:
        return self.lag


class _Host:
    def __init__(self, superseded_by: int | None = None) -> None:
        self._superseded_by = superseded_by

    def version_of(self, view: object) -> int:
        return 1

    def superseded_by(self, view: object) -> int | None:
        return self._superseded_by


@pytest.mark.parametrize(("lag", "superseded_by", "stale"), [
    (0, None, False), (5, None, False), (6, None, True), (0, 2, True)])
def test_an_answer_is_stale_past_the_acceptable_lag_or_once_superseded(
        lag: int, superseded_by: int | None, stale: bool) -> None:
    from eventfold.read_api.state.queries import KTableQueries
    from eventfold.read_api.state.routing import Router

    queries = KTableQueries({}, Router(Membership("", dict), 0, acceptable_lag=5), "i", [])
    found = queries.freshness(_Host(superseded_by), _View(lag), partition=0)  # type: ignore[arg-type]
    assert (found["stale"], found["lag_records"]) == (stale, lag)
    assert found.get("superseded_by") == superseded_by
