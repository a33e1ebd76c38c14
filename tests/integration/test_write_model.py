"""The write side on real Postgres: units of work, reads, metadata, upcasting, snapshots,
idempotent commands, and random command sequences against an in-memory model."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from eventfold.contract import libpq_url
from eventfold.write_model import (
    Aggregate,
    ConcurrencyError,
    DomainError,
    DomainEvent,
    EventStore,
    Repository,
    StreamAppend,
    default_registry,
)
from eventfold.write_model.domain.events import NewEvent
from eventfold.write_model.persistence.store import _READ_ALL
from examples.inventory import Product, ReceiveStock, ShipStock
from tests.concurrency import run_together


@pytest.fixture(scope="module")
def store(inventory_app, stack_settings) -> EventStore:
    return EventStore.from_url(stack_settings.database_url)


@pytest.fixture(scope="module")
def bus(inventory_app, stack_settings):
    return inventory_app.runtime(stack_settings).command_bus()


def one(quantity: int = 1) -> list[NewEvent]:
    return [NewEvent("StockReceived", {"product": "x", "quantity": quantity})]


def test_unit_of_work_over_two_streams_is_all_or_nothing(store, unique) -> None:
    store.append("Product", f"{unique}-b", 0, one())
    with pytest.raises(ConcurrencyError):
        store.append_many([StreamAppend("Product", f"{unique}-a", 0, one()),
                           StreamAppend("Product", f"{unique}-b", 0, one())])
    assert store.read_stream(f"{unique}-a") == []
    results = store.append_many([StreamAppend("Product", f"{unique}-a", 0, one()),
                                 StreamAppend("Product", f"{unique}-b", 1, one())])
    assert [r.version for r in results] == [1, 2]


def end_cursor(store: EventStore) -> str:
    cursor = ""
    while True:
        page = store.read_all(cursor, limit=5000)
        if not page.events:
            return cursor
        cursor = page.cursor


def test_read_all_pages_in_commit_safe_order(store, stack_settings, unique) -> None:
    start = end_cursor(store)
    with psycopg.connect(libpq_url(stack_settings.database_url)) as open_tx:
        # A transaction that started first but is still running...
        units = json.dumps([{"c": None, "p": [{"t": "Product", "s": f"{unique}-slow", "e": 0,
                             "v": [{"i": str(uuid.uuid4()), "y": "StockReceived", "sv": 1,
                                    "d": {}, "m": {}}]}]}])
        open_tx.execute("SELECT eventfold_append_units(%s::jsonb)", (units,))
        # ...and later ones that committed: readers must not run past the open one.
        for i in range(25):
            store.append("Product", f"{unique}-{i % 3}", i // 3, one(i))
        assert store.read_all(start, limit=100).events == []
        open_tx.commit()
    cursor, seen = start, []
    while page := store.read_all(cursor, limit=10).events:
        seen.extend(page)
        cursor = store.read_all(cursor, limit=10).cursor
    ours = [e for e in seen if e.stream_id.startswith(unique)]
    assert ours[0].stream_id == f"{unique}-slow"
    assert len(ours) == 26
    assert len({e.event_id for e in ours}) == 26
    per_stream: dict[str, list[int]] = {}
    for event in ours:
        per_stream.setdefault(event.stream_id, []).append(event.stream_version)
    assert all(v == list(range(1, len(v) + 1)) for v in per_stream.values())


def test_a_page_of_the_log_deep_in_it_is_an_index_range(store, stack_settings, unique
                                                         ) -> None:
    """Reading all events page by page costs a page per page, not the log before it:
    counted in the executed plan (sequential and bitmap scans priced out, so that a small
    log cannot hide a missing index)."""
    start = end_cursor(store)
    for i in range(30):
        store.append("Product", f"{unique}-{i}", 0, one(i))
    middle = store.read_all(start, limit=10).cursor  # after every event before ours
    tx_id, position = (int(part) for part in middle.split(":"))
    with psycopg.connect(libpq_url(stack_settings.database_url), autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")  # it reads every match: the same cost
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + _READ_ALL,
                                (tx_id, position, 5)).fetchall()

    def scans(node: dict) -> list[dict]:
        return ([node] if "Scan" in node["Node Type"] else []) + [
            scan for child in node.get("Plans", []) for scan in scans(child)]
    found = scans(plan[0]["Plan"])
    assert found and all("Index" in scan["Node Type"] for scan in found), plan
    assert sum(scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
               for scan in found) <= 6, plan


def test_events_carry_metadata_and_correlation(bus, store, unique) -> None:
    command = ReceiveStock(product=unique, quantity=3, command_id=uuid.uuid4())
    bus.execute(command, metadata={"user": "ann"}, correlation_id="order-42")
    event = store.read_stream(unique)[0]
    assert event.metadata["user"] == "ann"
    assert event.correlation_id == "order-42"
    assert event.causation_id == str(command.command_id)
    assert event.event_type == "StockReceived"
    assert event.schema_version == 1
    assert event.global_position > 0
    assert event.recorded_at.tzinfo is not None


@dataclass(frozen=True)
class PriceSet(DomainEvent):
    """v2: the price in cents and a currency (v1 stored a float ``amount`` in euros)."""

    schema_version = 2
    cents: int
    currency: str


@default_registry.upcaster("PriceSet", from_version=1)
def _price_v1_to_v2(data: dict) -> dict:
    return {"cents": round(data["amount"] * 100), "currency": "EUR"}


class Listing(Aggregate):
    snapshot_every = 10

    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.cents = 0
        self.changes = 0

    def set_price(self, cents: int) -> None:
        self.record(PriceSet(cents=cents, currency="EUR"))

    def apply(self, event: DomainEvent) -> None:
        assert isinstance(event, PriceSet)
        self.cents = event.cents
        self.changes += 1


def test_old_event_versions_are_upcast_on_read_and_never_rewritten(store, unique) -> None:
    store.append("Listing", unique, 0, [NewEvent("PriceSet", {"amount": 12.5}, schema_version=1)])
    listing = Repository(store).load(Listing, unique)
    assert (listing.cents, listing.version) == (1250, 1)
    stored = store.read_stream(unique)[0]
    assert (stored.schema_version, stored.data) == (1, {"amount": 12.5})
    listing.set_price(999)
    Repository(store).save(listing)
    assert store.read_stream(unique)[1].schema_version == 2


def test_snapshots_shortcut_loading_and_stale_ones_are_ignored(store, unique) -> None:
    repository = Repository(store, cache_size=0)
    for i in range(25):
        listing = repository.load(Listing, unique)
        listing.set_price(i)
        repository.save(listing)
    snapshot, events = store.load(unique, snapshot_of=("Listing", Listing.state_version))
    assert snapshot is not None and snapshot.stream_version == 20
    assert [e.stream_version for e in events] == [21, 22, 23, 24, 25]
    loaded = repository.load(Listing, unique)
    assert (loaded.cents, loaded.changes, loaded.version) == (24, 25, 25)

    with store.engine.connect() as conn:  # a snapshot written by an older state schema
        conn.execute(text("UPDATE snapshots SET schema_version = 0, "
                          "state = '{\"cents\": -1, \"changes\": -1}' WHERE stream_id = :s"),
                     {"s": unique})
    snapshot, events = store.load(unique, snapshot_of=("Listing", Listing.state_version))
    assert snapshot is None and len(events) == 25
    assert repository.load(Listing, unique).cents == 24


def test_same_command_id_five_times_concurrently_appends_once(bus, store, unique) -> None:
    command = ReceiveStock(product=unique, quantity=7, command_id=uuid.uuid4())
    results = []
    run_together(lambda: results.append(bus.execute(command)), 5)
    assert len(store.read_stream(unique)) == 1
    assert len({tuple(r.event_ids) for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert bus.execute(command).replayed  # and later, e.g. after a lost response


def test_a_retry_after_the_stream_moved_on_returns_the_first_result(bus, store, unique) -> None:
    first = ReceiveStock(product=unique, quantity=1, command_id=uuid.uuid4())
    original = bus.execute(first)
    bus.execute(ReceiveStock(product=unique, quantity=5))
    retried = bus.execute(first)
    assert retried.event_ids == original.event_ids and retried.version == 1
    assert len(store.read_stream(unique)) == 2


def test_stale_cached_aggregate_is_reloaded_not_trusted(bus, inventory_app, stack_settings,
                                                        unique) -> None:
    other_process = inventory_app.runtime(stack_settings).command_bus()
    bus.execute(ReceiveStock(product=unique, quantity=5))  # bus caches version 1
    other_process.execute(ShipStock(product=unique, quantity=5))  # version 2, 0 on hand
    # The cache says version 1; the store says 2, which is what the client expects.
    result = bus.execute(ReceiveStock(product=unique, quantity=2, expected_version=2))
    assert result.version == 3  # bus caches version 3 with 2 on hand
    other_process.execute(ShipStock(product=unique, quantity=2))  # version 4, 0 on hand
    # The cached aggregate would allow this; the reloaded one must refuse it.
    with pytest.raises(DomainError, match="0 on hand"):
        bus.execute(ShipStock(product=unique, quantity=1))
    assert bus.load(Product, unique).version == 4


commands = st.lists(st.tuples(st.sampled_from(["receive", "ship"]), st.integers(1, 50)),
                    min_size=1, max_size=25)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=commands)
def test_random_command_sequences_match_an_in_memory_model(bus, sequence) -> None:
    product = f"prop-{uuid.uuid4().hex[:12]}"
    on_hand, version = 0, 0
    for action, quantity in sequence:
        command = (ReceiveStock if action == "receive" else ShipStock)(
            product=product, quantity=quantity)
        model_accepts = action == "receive" or (version > 0 and quantity <= on_hand)
        try:
            result = bus.execute(command)
        except (DomainError, LookupError):
            assert not model_accepts, (action, quantity, on_hand)
            continue
        assert model_accepts, (action, quantity, on_hand)
        on_hand += quantity if action == "receive" else -quantity
        version += 1
        assert result.version == version
    loaded = bus.load(Product, product)
    assert (loaded.on_hand, loaded.version) == (on_hand, version)
