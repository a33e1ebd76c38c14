"""The event store on real Postgres: atomic appends, optimistic concurrency, empty outbox."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text

from eventfold.contract import libpq_url
from eventfold.outbox.history import STREAM_BUCKETS, bucket_query, read_history
from eventfold.write_model import CommandBus, ConcurrencyError, EventStore, Repository
from eventfold.write_model.domain.events import NewEvent
from examples.inventory import Product, ReceiveStock
from tests.concurrency import run_together


@pytest.fixture(scope="module")
def store(inventory_app, stack_settings) -> EventStore:
    return EventStore.from_url(stack_settings.database_url)


def count(store: EventStore, sql: str, **params) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def test_append_writes_events_and_leaves_outbox_empty(store, unique) -> None:
    stream = f"{unique}-a"
    result = store.append("Product", stream, 0, [NewEvent("StockReceived", {"quantity": 1}),
                                                 NewEvent("StockReceived", {"quantity": 2})])
    assert result.version == 2
    assert len(result.event_ids) == 2
    assert result.global_positions[0] < result.global_positions[1]
    recorded = store.read_stream(stream)
    assert [e.stream_version for e in recorded] == [1, 2]
    assert [e.data["quantity"] for e in recorded] == [1, 2]
    assert recorded[0].event_id == result.event_ids[0]
    assert count(store, "SELECT count(*) FROM outbox") == 0


@pytest.mark.parametrize("expected", [0, 2, 7])
def test_wrong_expected_version_conflicts_and_writes_nothing(store, unique, expected) -> None:
    stream = f"{unique}-c"
    store.append("Product", stream, 0, [NewEvent("StockReceived", {"quantity": 1})])
    with pytest.raises(ConcurrencyError) as info:
        store.append("Product", stream, expected, [NewEvent("StockReceived", {"quantity": 9})])
    assert info.value.current_version == 1
    assert count(store, "SELECT count(*) FROM events WHERE stream_id = :s", s=stream) == 1


def test_concurrent_writers_leave_a_gapless_stream(store, unique) -> None:
    stream = f"{unique}-race"
    conflicts: list[int] = []
    results: list[int] = []

    def writer() -> None:
        for _ in range(5):
            version = store.current_version(stream)
            try:
                results.append(store.append(
                    "Product", stream, version, [NewEvent("StockReceived", {"quantity": 1})]
                ).version)
            except ConcurrencyError as exc:
                conflicts.append(exc.current_version)

    run_together(writer, 8)
    versions = [e.stream_version for e in store.read_stream(stream)]
    assert versions == list(range(1, len(versions) + 1))
    assert sorted(results) == versions
    assert len(results) + len(conflicts) == 40
    assert conflicts, "8 racing writers should have produced at least one conflict"


def test_command_bus_retries_lost_races_without_expected_version(store, inventory_app,
                                                                unique) -> None:
    bus = CommandBus(Repository(store), inventory_app.commands)
    product = f"{unique}-bus"
    def five_commands() -> None:
        for _ in range(5):
            bus.execute(ReceiveStock(product=product, quantity=1))

    run_together(five_commands, 4)
    loaded = Repository(store).load(Product, product)
    assert (loaded.version, loaded.on_hand) == (20, 20)


def test_the_log_read_by_stream_bucket_is_disjoint_complete_and_indexed(
        store, stack_settings, unique) -> None:
    """What each task of a replay from the event store reads: the buckets together hold every
    event of the window once, a stream's events all in one bucket and in position order, and
    a bucket is read through its index, not by scanning the window."""
    stream_type = f"Bucketed{unique}"
    appended = {f"{unique}-{n}": store.append(stream_type, f"{unique}-{n}", 0, [
        NewEvent("Happened", {"n": n, "i": i}) for i in range(3)]).global_positions
        for n in range(40)}
    after, upto = min(min(p) for p in appended.values()) - 1, max(max(p) for p in
                                                                    appended.values())
    with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
        buckets = {bucket: [row for chunk in read_history(conn, [stream_type], after, upto,
                                                          bucket, chunk=7) for row in chunk]
                   for bucket in range(STREAM_BUCKETS)}
        conn.execute("ANALYZE events")
        conn.execute("SET enable_seqscan = off")  # a test's table is small enough to scan
        # The log from its start, as a replay's first window reads it: a window of a hundred
        # positions would rather be read by the primary key's range, whatever the bucket.
        query, params = bucket_query([stream_type], 0, upto, 5)
        plan = "\n".join(row[0] for row in conn.execute(
            sql.SQL("EXPLAIN ") + query, params).fetchall())
    read = [(row[1], row[0]) for rows in buckets.values() for row in rows]
    assert sorted(read) == sorted((stream, p) for stream, ps in appended.items() for p in ps)
    for rows in buckets.values():
        assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    bucket_of = {stream: bucket for bucket, rows in buckets.items() for _, stream, *_ in rows}
    assert len(bucket_of) == len(appended)  # one bucket per stream
    assert len(set(bucket_of.values())) > 10  # and the streams spread over the buckets
    index_conditions = [line for line in plan.splitlines() if "Index Cond" in line]
    assert "events_by_stream_bucket" in plan, plan
    assert any("hashtext(stream_id)" in line for line in index_conditions), plan  # a range
