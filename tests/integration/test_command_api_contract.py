"""The command API's contract: status codes a client can rely on, under bad input, races,
retries, database outages and shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest
import requests
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from eventfold import migrations
from eventfold.contract import libpq_url
from eventfold.local_stack import postgres
from eventfold.local_stack.process import free_port, port_is_open, stop_pid, wait_until
from eventfold.serving import BackgroundServer
from eventfold.write_model import AsyncCommandBus, AsyncEventStore, AsyncRepository, EventStore
from tests.concurrency import run_together


@pytest.fixture(scope="module")
def client(inventory_app, stack_settings):
    with TestClient(inventory_app.runtime(stack_settings).command_api()) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def store(inventory_app, stack_settings) -> EventStore:
    return EventStore.from_url(stack_settings.database_url)


def total_events(store: EventStore) -> int:
    with store.connection() as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def test_same_command_id_posted_five_times_concurrently_appends_once(
        inventory_app, stack_settings, store, unique) -> None:
    server = BackgroundServer(inventory_app.runtime(stack_settings).command_api(), "127.0.0.1",
                              free_port()).start()
    body = {"product": unique, "quantity": 3, "command_id": str(uuid.uuid4())}
    responses: list[requests.Response] = []

    def post() -> None:
        responses.append(requests.post(f"{server.url}/commands/ReceiveStock", json=body,
                                       timeout=10))

    try:
        run_together(post, 5)
    finally:
        server.stop()
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 200, 201]
    assert len({tuple(r.json()["event_ids"]) for r in responses}) == 1
    assert len(store.read_stream(unique)) == 1


def test_idempotency_key_header_works_like_command_id(client, store, unique) -> None:
    key = str(uuid.uuid4())
    first = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1},
                        headers={"Idempotency-Key": key})
    again = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1},
                        headers={"Idempotency-Key": key})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["replayed"] is True
    assert len(store.read_stream(unique)) == 1


def test_eight_http_writers_on_one_aggregate_lose_with_409(
        inventory_app, stack_settings, store, unique) -> None:
    server = BackgroundServer(inventory_app.runtime(stack_settings).command_api(), "127.0.0.1",
                              free_port()).start()
    statuses: list[int] = []
    conflicts_with_version: list[int] = []

    def writer() -> None:
        session = requests.Session()
        for _ in range(5):
            version = store.current_version(unique)
            response = session.post(f"{server.url}/commands/ReceiveStock", json={
                "product": unique, "quantity": 1, "expected_version": version}, timeout=10)
            statuses.append(response.status_code)
            if response.status_code == 409:
                conflicts_with_version.append(response.json()["current_version"])

    try:
        run_together(writer, 8)
    finally:
        server.stop()
    versions = [e.stream_version for e in store.read_stream(unique)]
    assert set(statuses) <= {201, 409}
    assert statuses.count(201) == len(versions)
    assert versions == list(range(1, len(versions) + 1))
    assert statuses.count(409) == len(conflicts_with_version) > 0
    assert all(v >= 1 for v in conflicts_with_version)


def test_unknown_stream_is_404_for_commands_that_need_one(client, store, unique) -> None:
    response = client.post("/commands/ShipStock", json={"product": unique, "quantity": 1})
    assert response.status_code == 404
    assert unique in response.json()["detail"]
    assert store.read_stream(unique) == []


def test_business_rule_violation_is_409_and_writes_nothing(client, store, unique) -> None:
    client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 2})
    response = client.post("/commands/ShipStock", json={"product": unique, "quantity": 3})
    assert response.status_code == 409
    assert response.json()["refused_by"] == "aggregate"
    assert "2 on hand" in response.json()["detail"]
    assert len(store.read_stream(unique)) == 1


def test_oversized_body_is_413(inventory_app, stack_settings, store) -> None:
    small = stack_settings.replace(max_body_bytes=1000)
    with TestClient(inventory_app.runtime(small).command_api()) as limited:
        before = total_events(store)
        response = limited.post("/commands/ReceiveStock",
                                json={"product": "x" * 5000, "quantity": 1})
        assert response.status_code == 413

        def chunks():  # no Content-Length: the limit applies while the body streams in
            yield b'{"product": "'
            for _ in range(20):
                yield b"y" * 100
            yield b'", "quantity": 1}'

        streamed = limited.post("/commands/ReceiveStock", content=chunks(),
                                headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert total_events(store) == before


def test_bearer_token_is_required_when_configured(inventory_app, stack_settings, unique) -> None:
    secured = stack_settings.replace(api_token="s3cret")
    with TestClient(inventory_app.runtime(secured).command_api()) as api:
        body = {"product": unique, "quantity": 1}
        assert api.post("/commands/ReceiveStock", json=body).status_code == 401
        assert api.post("/commands/ReceiveStock", json=body,
                        headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert api.post("/commands/ReceiveStock", json=body,
                        headers={"Authorization": "Bearer s3cret"}).status_code == 201
        assert api.get("/health").status_code == 200
        schema = api.get("/openapi.json").json()
        assert schema["paths"]["/commands/ReceiveStock"]["post"]["security"] == [
            {"HTTPBearer": []}]
        assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_metadata_header_must_be_a_json_object(client, store, unique) -> None:
    bad = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1},
                      headers={"X-Metadata": "[1]"})
    assert bad.status_code == 422
    good = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1},
                       headers={"X-Metadata": '{"user": "bo"}', "X-Correlation-ID": "c-1"})
    assert good.status_code == 201
    event = store.read_stream(unique)[0]
    assert (event.metadata["user"], event.correlation_id) == ("bo", "c-1")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
payloads = st.one_of(
    st.dictionaries(st.sampled_from(["product", "quantity", "expected_version", "command_id",
                                     "extra"]), json_values, max_size=4),
    json_values,
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["ReceiveStock", "ShipStock", "Nope"]), body=payloads,
       raw=st.binary(max_size=40))
def test_fuzzed_payloads_never_5xx_nor_write_partially(client, store, command, body,
                                                       raw) -> None:
    before = total_events(store)
    response = client.post(f"/commands/{command}", json=body)
    assert response.status_code < 500, response.text
    garbage = client.post(f"/commands/{command}", content=raw,
                          headers={"content-type": "application/json"})
    assert garbage.status_code < 500, garbage.text
    written = total_events(store) - before
    assert written == (1 if response.status_code == 201 else 0) + (
        1 if garbage.status_code == 201 else 0)


@pytest.fixture
def private_postgres(tmp_path):
    """A Postgres of this test's own, so that stopping it harms no other test."""
    port = free_port()
    data, log = tmp_path / "pg", tmp_path / "pg.log"
    postgres.init_cluster(data, log)
    state = {"pid": postgres.start(data, port, log)}
    url = postgres.dsn(port).replace("postgresql://", "postgresql+psycopg://")
    migrations.upgrade(url)

    def stop() -> None:
        stop_pid(state["pid"], what="postgres", sig=signal.SIGINT)

    def start() -> None:
        state["pid"] = postgres.start(data, port, log)

    yield url, stop, start
    stop()


def test_database_down_is_503_and_a_retry_later_succeeds(inventory_app, private_postgres,
                                                         unique) -> None:
    url, stop_database, start_database = private_postgres
    store = EventStore.from_url(url)
    bus = AsyncCommandBus(AsyncRepository(AsyncEventStore.from_url(url, connect_timeout_s=2)),
                          inventory_app.commands)
    from eventfold.write_model.http import create_command_app

    with TestClient(create_command_app(bus)) as api:
        assert api.post("/commands/ReceiveStock",
                        json={"product": unique, "quantity": 1}).status_code == 201
        stop_database()
        body = {"product": unique, "quantity": 2, "command_id": str(uuid.uuid4())}
        down = api.post("/commands/ReceiveStock", json=body)
        assert down.status_code == 503
        assert down.headers["Retry-After"] == "1"
        assert api.get("/ready").status_code == 503
        start_database()
        statuses = []
        for _ in range(5):  # pooled connections to the old server fail once, then go away
            statuses.append(api.post("/commands/ReceiveStock", json=body).status_code)
            if statuses[-1] == 201:
                break
        assert statuses[-1] == 201, statuses
        assert set(statuses[:-1]) <= {503}
        assert [e.data["quantity"] for e in store.read_stream(unique)] == [1, 2]


def test_sigterm_lets_in_flight_commands_finish(stack_settings, store, unique) -> None:
    """Commands the server has received when SIGTERM arrives each get their answer, and
    what they answered is what is stored. They are held in flight on purpose: a lock on the
    events table keeps their appends waiting until the server has begun to shut down."""
    port = free_port()
    env = {**os.environ, "EVENTFOLD_DATABASE_URL": stack_settings.database_url,
           "EVENTFOLD_KAFKA_BOOTSTRAP": stack_settings.kafka_bootstrap,
           "EVENTFOLD_CONNECT_URL": stack_settings.connect_url,
           "EVENTFOLD_COMMAND_API_PORT": str(port)}
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "eventfold.cli", "serve", "commands"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    in_flight = 8
    answers: list[requests.Response | Exception] = []
    try:
        wait_until(lambda: port_is_open(port), what="command API", timeout_s=60, pid=server.pid)

        def send(n: int) -> None:
            try:
                answers.append(requests.post(f"{url}/commands/ReceiveStock", timeout=60,
                                             json={"product": f"{unique}-{n}", "quantity": 1}))
            except requests.RequestException as exc:  # a dropped command: the test fails
                answers.append(exc)

        def received() -> int:
            samples = text_string_to_metric_families(requests.get(f"{url}/metrics",
                                                                  timeout=5).text)
            return int(next(s.value for family in samples for s in family.samples
                            if s.name == "eventfold_http_requests_in_progress")) - 1  # this one

        clients = [threading.Thread(target=send, args=(n,)) for n in range(in_flight)]
        with psycopg.connect(libpq_url(stack_settings.database_url)) as lock, \
                lock.transaction():
            lock.execute("LOCK TABLE events IN SHARE MODE")  # appends wait behind it
            for thread in clients:
                thread.start()
            wait_until(lambda: received() == in_flight, what="8 commands in flight",
                       timeout_s=30)
            server.send_signal(signal.SIGTERM)
            wait_until(lambda: not port_is_open(port), what="the server to stop accepting",
                       timeout_s=30)
            time.sleep(2)  # commands that take a while: the server must wait for them
        # the lock is released: the in-flight appends commit while the server drains
        for thread in clients:
            thread.join(timeout=60)
        assert server.wait(timeout=60) == 0
    finally:
        stop_pid(server.pid, what="command API")
    assert [a.status_code if isinstance(a, requests.Response) else repr(a)
            for a in answers] == [201] * in_flight
    accepted = {event_id for a in answers if isinstance(a, requests.Response)
                for event_id in a.json()["event_ids"]}
    stored = {str(e.event_id) for n in range(in_flight)
              for e in store.read_stream(f"{unique}-{n}")}
    assert accepted == stored and len(stored) == in_flight
