"""The HTTP command API against real Postgres: status codes and nothing written on bad input."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from eventfold.contract import libpq_url
from eventfold.write_model.persistence.async_store import AsyncEventStore
from examples.inventory import ReceiveStock
from tests.pipeline_helpers import wait_for


@pytest.fixture(scope="module")
def client(inventory_app, stack_settings):
    with TestClient(inventory_app.runtime(stack_settings).command_api()) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def events_count(inventory_app, stack_settings):
    engine = inventory_app.runtime(stack_settings).event_store().engine

    def count(stream_id: str) -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM events WHERE stream_id = :s"),
                                    {"s": stream_id}).scalar_one())

    return count


def test_accepted_command_returns_version_and_event_ids(client, unique) -> None:
    response = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 4})
    assert response.status_code == 201
    body = response.json()
    assert body["stream_id"] == unique
    assert body["version"] == 1
    assert len(body["event_ids"]) == len(body["global_positions"]) == 1
    second = client.post("/commands/ReceiveStock",
                         json={"product": unique, "quantity": 1, "expected_version": 1})
    assert (second.status_code, second.json()["version"]) == (201, 2)


@pytest.mark.parametrize(("body", "status", "field", "message"), [
    ('{"product": "x", ', 422, "body", "invalid JSON"),
    ('{"product": "x"}', 422, "quantity", "Field required"),
    ('{"product": "x", "quantity": 0}', 422, "quantity", "greater than 0"),
    ('{"product": "x", "quantity": "many"}', 422, "quantity", "valid integer"),
    ('{"product": "x", "quantity": 1, "extra": 1}', 422, "extra", "not permitted"),
    ('[1, 2]', 422, "body", "should be an object"),
])
def test_bad_payloads_are_rejected_with_the_reason(client, events_count, body, status, field,
                                                   message) -> None:
    response = client.post("/commands/ReceiveStock", content=body,
                           headers={"content-type": "application/json"})
    assert response.status_code == status
    errors = response.json()["errors"]
    assert any(e["field"] == field and message in e["message"] for e in errors), errors
    assert events_count("x") == 0


def test_unknown_command_is_404_naming_the_known_ones(client) -> None:
    response = client.post("/commands/SellStock", json={"product": "x", "quantity": 1})
    assert response.status_code == 404
    assert "unknown command 'SellStock'" in response.json()["detail"]
    assert "ReceiveStock" in response.json()["detail"]


def test_version_conflict_is_409_with_current_version(client, events_count, unique) -> None:
    client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1})
    response = client.post("/commands/ReceiveStock",
                           json={"product": unique, "quantity": 1, "expected_version": 0})
    assert response.status_code == 409
    assert response.json()["current_version"] == 1
    assert events_count(unique) == 1


def test_openapi_documents_each_command(client) -> None:
    schema = client.get("/openapi.json").json()
    operation = schema["paths"]["/commands/ReceiveStock"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ReceiveStock"}
    assert {"product", "quantity", "command_id", "expected_version"} <= set(
        schema["components"]["schemas"]["ReceiveStock"]["properties"])
    assert [p["name"] for p in operation["parameters"]] == [
        "Idempotency-Key", "X-Correlation-ID", "X-Metadata"]
    assert {"201", "409", "422", "503"} <= set(operation["responses"])


@pytest.mark.parametrize(("headers", "field"), [
    ({"Idempotency-Key": "not-a-uuid"}, "idempotency-key"),
    ({"X-Correlation-ID": "c" * 201}, "x-correlation-id"),
    ({"X-Metadata": "{not json"}, "x-metadata"),
])
def test_bad_headers_are_rejected_naming_the_header(client, events_count, unique, headers,
                                                    field) -> None:
    response = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1},
                           headers=headers)
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert events_count(unique) == 0


def test_health_and_readiness(client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200


def test_middleware_added_to_the_app_wraps_command_requests_too(inventory_app, stack_settings,
                                                                unique) -> None:
    """Command requests skip the router (RouterBypass), not the app's middleware."""
    seen: list[tuple[str, int]] = []
    app = inventory_app.runtime(stack_settings).command_api()

    @app.middleware("http")
    async def record(request, call_next):
        response = await call_next(request)
        seen.append((request.url.path, response.status_code))
        response.headers["x-seen"] = "yes"
        return response

    with TestClient(app) as client:
        accepted = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1})
        conflict = client.post("/commands/ReceiveStock",
                               json={"product": unique, "quantity": 1, "expected_version": 0})
        client.post("/commands/SellStock", json={"product": unique, "quantity": 1})
        client.get("/health")
    assert (accepted.status_code, accepted.headers["x-seen"]) == (201, "yes")
    assert (conflict.status_code, conflict.headers["x-seen"]) == (409, "yes")
    assert seen == [("/commands/ReceiveStock", 201), ("/commands/ReceiveStock", 409),
                    ("/commands/SellStock", 404), ("/health", 200)]


def test_a_command_mounted_under_a_prefix_is_dispatched(inventory_app, stack_settings,
                                                        unique) -> None:
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    commands = inventory_app.runtime(stack_settings).command_api()

    @asynccontextmanager
    async def lifespan(_: FastAPI):  # Starlette runs no lifespan of a mounted app
        async with commands.router.lifespan_context(commands):
            yield

    outer = FastAPI(lifespan=lifespan)
    outer.mount("/api", commands)
    with TestClient(outer) as client:
        response = client.post("/api/commands/ReceiveStock",
                               json={"product": unique, "quantity": 2})
        assert response.status_code == 201, response.text
        assert client.post("/api/commands/ReceiveStock", content="{",
                           headers={"content-type": "application/json"}).status_code == 422


def test_a_command_id_returns_its_result_for_the_retention_then_appends_again(
        inventory_app, stack_settings, events_count, unique) -> None:
    """The 201 says until when the id holds; within it the same id gets the first result,
    after it the app has forgotten the result (its own pruning, a batch at a time) and the
    same command appends again. Results younger than the retention stay."""
    command_id = str(uuid.uuid4())
    body = {"product": unique, "quantity": 3, "command_id": command_id}
    settings = stack_settings.model_copy(update={"command_id_retention": "2 seconds"})
    with TestClient(inventory_app.runtime(settings).command_api()) as client:
        sent_at = datetime.now(UTC)
        first = client.post("/commands/ReceiveStock", json=body)
        assert first.status_code == 201
        kept_until = datetime.fromisoformat(first.headers["Command-Id-Kept-Until"])
        assert timedelta(seconds=1) <= kept_until - sent_at <= timedelta(seconds=4)
        again = client.post("/commands/ReceiveStock", json=body)
        assert (again.status_code, again.json()["replayed"]) == (200, True)
        assert "Command-Id-Kept-Until" not in again.headers
        wait_for(lambda: not command_result_kept(stack_settings, command_id),
                 "the app to forget the result", timeout_s=15)
        later = client.post("/commands/ReceiveStock", json=body)
        assert (later.status_code, later.json()["version"]) == (201, 2)
        assert events_count(unique) == 2


def test_pruning_forgets_only_results_older_than_the_retention(inventory_app, stack_settings,
                                                                unique) -> None:
    bus = inventory_app.runtime(stack_settings).command_bus()
    old, fresh = uuid.uuid4(), uuid.uuid4()
    for command_id in (old, fresh):
        bus.execute(ReceiveStock(product=f"{unique}-{command_id}", quantity=1,
                                 command_id=command_id))
    with psycopg.connect(libpq_url(stack_settings.database_url)) as conn:
        conn.execute("UPDATE command_log SET recorded_at = now() - interval '8 days' "
                     "WHERE command_id = %s", (old,))

    async def prune() -> int:
        async with AsyncEventStore.from_url(stack_settings.database_url) as store:
            return await store.prune_command_results(7 * 86_400, batch=1)

    assert asyncio.run(prune()) >= 1
    assert not command_result_kept(stack_settings, str(old))
    assert command_result_kept(stack_settings, str(fresh))


def command_result_kept(settings, command_id: str) -> bool:
    with psycopg.connect(libpq_url(settings.database_url)) as conn:
        row = conn.execute("SELECT count(*) FROM command_log WHERE command_id::text = %s",
                           (command_id,)).fetchone()
    return bool(row and row[0])
