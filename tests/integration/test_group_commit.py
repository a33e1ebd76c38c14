"""Group commit on real Postgres, through the asyncio bus and the blocking store: concurrent
commands share transactions, yet each is checked on its own, and a bad or losing append
never takes the others of its batch down with it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
import pytest

from eventfold.write_model import (
    AsyncCommandBus,
    AsyncEventStore,
    AsyncRepository,
    ConcurrencyError,
    EventStore,
    StreamAppend,
)
from eventfold.write_model.domain.events import NewEvent
from eventfold.write_model.persistence.store import (
    APPEND_UNITS,
    DuplicateCommand,
    UnitOfWork,
    encode_units,
)
from examples.inventory import Product, ReceiveStock, StockReceived
from tests.concurrency import run_together

T = TypeVar("T")


@pytest.fixture(scope="module")
def store(inventory_app, stack_settings) -> EventStore:
    return EventStore.from_url(stack_settings.database_url)


def with_async_bus(stack_settings, inventory_app,
                   scenario: Callable[[AsyncCommandBus], Awaitable[T]]) -> T:
    async def run() -> T:
        async with AsyncEventStore.from_url(stack_settings.database_url) as async_store:
            return await scenario(AsyncCommandBus(AsyncRepository(async_store),
                                                  inventory_app.commands))

    return asyncio.run(run())


def transactions_of(store: EventStore, prefix: str) -> dict[str, int]:
    with store.connection() as conn:
        rows = conn.execute("SELECT stream_id, tx_id::text::bigint FROM events "
                            "WHERE stream_id LIKE %s", (f"{prefix}%",)).fetchall()
    return {stream: tx for stream, tx in rows}


def test_concurrent_commands_share_transactions(inventory_app, stack_settings, store,
                                                unique) -> None:
    async def scenario(bus: AsyncCommandBus) -> list[int]:
        results = await asyncio.gather(*(
            bus.execute(ReceiveStock(product=f"{unique}-{n}", quantity=n + 1))
            for n in range(32)))
        return [r.version for r in results]

    assert with_async_bus(stack_settings, inventory_app, scenario) == [1] * 32
    transactions = transactions_of(store, unique)
    assert len(transactions) == 32
    assert len(set(transactions.values())) < 32, "no two commands shared a transaction"
    for n in range(32):
        assert [e.data["quantity"] for e in store.read_stream(f"{unique}-{n}")] == [n + 1]


def test_eight_async_writers_on_one_aggregate_lose_with_conflicts(
        inventory_app, stack_settings, store, unique) -> None:
    async def scenario(bus: AsyncCommandBus) -> list[int | str]:
        await bus.execute(ReceiveStock(product=unique, quantity=1))

        async def writer() -> int | str:
            try:
                result = await bus.execute(ReceiveStock(product=unique, quantity=1,
                                                        expected_version=1))
            except ConcurrencyError as conflict:
                return f"conflict at {conflict.current_version}"
            return result.version

        return list(await asyncio.gather(*(writer() for _ in range(8))))

    outcomes = with_async_bus(stack_settings, inventory_app, scenario)
    assert sorted(outcomes, key=str) == [2] + ["conflict at 2"] * 7
    assert [e.stream_version for e in store.read_stream(unique)] == [1, 2]


def test_retries_without_expected_version_all_land_in_order(
        inventory_app, stack_settings, store, unique) -> None:
    async def scenario(bus: AsyncCommandBus) -> Product:
        await asyncio.gather(*(bus.execute(ReceiveStock(product=unique, quantity=1))
                               for _ in range(20)))
        return await bus.load(Product, unique)

    product = with_async_bus(stack_settings, inventory_app, scenario)
    assert (product.version, product.on_hand) == (20, 20)
    assert [e.stream_version for e in store.read_stream(unique)] == list(range(1, 21))


def test_same_command_id_five_times_at_once_appends_once(inventory_app, stack_settings,
                                                          store, unique) -> None:
    command = ReceiveStock(product=unique, quantity=3, command_id=uuid.uuid4())

    async def scenario(bus: AsyncCommandBus) -> list[bool]:
        results = await asyncio.gather(*(bus.execute(command) for _ in range(5)))
        assert len({tuple(r.event_ids) for r in results}) == 1
        return sorted(r.replayed for r in results)

    assert with_async_bus(stack_settings, inventory_app, scenario) == [False] + [True] * 4
    assert len(store.read_stream(unique)) == 1


def test_a_failing_append_does_not_fail_its_batch(store, unique) -> None:
    """Threads batch through the blocking store: a conflict, a duplicate and a value
    Postgres refuses (a NUL character) each fail alone; the rest of the batch lands."""
    store.append("Product", f"{unique}-taken", 0, [NewEvent("StockReceived", {"q": 1})])
    command_id = uuid.uuid4()
    store.append("Product", f"{unique}-done", 0, [NewEvent("StockReceived", {"q": 1})],
                 command_id=command_id)
    outcomes: dict[str, object] = {}

    def attempt(name: str, expected: int, data: dict, command: uuid.UUID | None) -> None:
        try:
            outcomes[name] = store.append_many(
                [StreamAppend("Product", f"{unique}-{name}", expected,
                              [NewEvent("StockReceived", data)])], command_id=command)
        except Exception as exc:  # the assertions below sort them
            outcomes[name] = exc

    plans = [("taken", 0, {"q": 2}, None), ("done", 1, {"q": 2}, command_id),
             ("nul", 0, {"q": "\u0000"}, None)] + [(f"ok{n}", 0, {"q": n}, None)
                                                    for n in range(8)]
    index = iter(range(len(plans)))
    run_together(lambda: attempt(*plans[next(index)]), threads=len(plans))
    assert isinstance(outcomes["taken"], ConcurrencyError)
    assert outcomes["taken"].current_version == 1
    assert isinstance(outcomes["done"], DuplicateCommand)
    assert isinstance(outcomes["nul"], psycopg.errors.UntranslatableCharacter)
    assert store.read_stream(f"{unique}-nul") == []
    for n in range(8):
        assert [e.data for e in store.read_stream(f"{unique}-ok{n}")] == [{"q": n}]


def test_a_failing_append_does_not_fail_its_async_batch(stack_settings, store, unique) -> None:
    """The asyncio store drives libpq itself: a value Postgres refuses comes back as psycopg's
    own error for that one append, and the rest of its batch lands."""
    store.append("Product", f"{unique}-taken", 0, [NewEvent("StockReceived", {"q": 1})])

    async def run() -> list[object]:
        async with AsyncEventStore.from_url(stack_settings.database_url) as async_store:
            async def attempt(name: str, expected: int, data: dict) -> object:
                try:
                    return await async_store.append("Product", f"{unique}-{name}", expected,
                                                    [NewEvent("StockReceived", data)])
                except Exception as exc:  # the assertions below sort them
                    return exc

            plans = [("taken", 0, {"q": 2}), ("nul", 0, {"q": "\u0000"})] + [
                (f"ok{n}", 0, {"q": n}) for n in range(6)]
            return await asyncio.gather(*(attempt(*plan) for plan in plans))

    taken, nul, *landed = asyncio.run(run())
    assert isinstance(taken, ConcurrencyError) and taken.current_version == 1
    assert isinstance(nul, psycopg.errors.UntranslatableCharacter)
    assert store.read_stream(f"{unique}-nul") == []
    assert [result.version for result in landed] == [1] * 6
    for n in range(6):
        assert [e.data for e in store.read_stream(f"{unique}-ok{n}")] == [{"q": n}]


def test_the_duplicate_check_looks_commands_up_by_key(store, unique) -> None:
    """A call probes the command log by key. 0006's function hashed the whole log instead
    while it held up to some 20,000 commands (3 ms a call at 20,000, measured), so every
    command paid for the log's length."""
    with store.connection() as conn:
        conn.execute("INSERT INTO command_log (command_id, stream_id, result) "
                     "SELECT gen_random_uuid(), %s, '{}' FROM generate_series(1, 10000)",
                     (f"{unique}-filler",))
        conn.execute("ANALYZE command_log")
        plans: list[str] = []
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        for setting in ("auto_explain.log_min_duration = 0",
                        "auto_explain.log_nested_statements = on",
                        "client_min_messages = log"):
            conn.execute(f"SET {setting}")
        conn.execute("LOAD 'auto_explain'")
        for n in range(3):
            unit = UnitOfWork((StreamAppend("Product", f"{unique}-{n}", 0, [
                NewEvent.of(StockReceived(product=f"{unique}-{n}", quantity=1))]),),
                uuid.uuid4())
            conn.execute(APPEND_UNITS, (encode_units([unit]),))
    probes = [plan for plan in plans if "command_log" in plan and "Insert on" not in plan]
    assert probes, plans
    assert not any("Seq Scan on command_log" in plan for plan in probes), probes
