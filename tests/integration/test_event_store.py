"""The event store on real Postgres: atomic appends, optimistic concurrency, empty outbox."""

from __future__ import annotations

import pytest
from eventfold.write_model import CommandBus, ConcurrencyError, EventStore, Repository
from eventfold.write_model.domain.events import NewEvent
from sqlalchemy import text

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
