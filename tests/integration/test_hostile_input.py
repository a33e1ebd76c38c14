"""Hostile input at the command API: NUL characters, lone surrogates, non-finite numbers and
deep nesting are each a 422 naming the place, never a 500, and write nothing; streams belong
to the aggregate type that created them; a command id reused with another payload is refused.
Property tests post generated hostile bodies to every command route of every example."""

from __future__ import annotations

import json
import uuid

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventfold.write_model import EventStore

DEEP = "{" + '"a":{' * 300 + "}" * 301


@pytest.fixture(scope="module")
def store(stack_settings) -> EventStore:
    return EventStore.from_url(stack_settings.database_url)


@pytest.fixture(scope="module")
def client(inventory_app, stack_settings):
    with TestClient(inventory_app.runtime(stack_settings).command_api()) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def orders_client(stack_settings):
    from examples import orders

    orders.app.runtime(stack_settings).setup()
    with TestClient(orders.app.runtime(stack_settings).command_api()) as test_client:
        yield test_client


def total_events(store: EventStore) -> int:
    with store.connection() as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def post_raw(client: TestClient, command: str, body: str, **headers: str):
    return client.post(f"/commands/{command}", content=body.encode(),
                       headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize(("body", "field", "words"), [
    ('{"product": "a\\u0000b", "quantity": 1}', "product", "NUL"),
    ('{"product": "\\u0000", "quantity": 1}', "product", "NUL"),
    ('{"product": "x", "quantity": 1e999}', "quantity", "valid integer"),
    ('{"product": "x\\ud800", "quantity": 1}', "body", "invalid JSON: unexpected end of hex"),
])
def test_hostile_command_fields_are_422_naming_the_field(client, store, body, field,
                                                         words) -> None:
    before = total_events(store)
    response = post_raw(client, "ReceiveStock", body)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert errors[0]["field"] == field
    assert words in errors[0]["message"]
    assert total_events(store) == before


def test_non_finite_amount_is_422(orders_client, store, unique) -> None:
    before = total_events(store)
    response = post_raw(orders_client, "PlaceOrder",
                        f'{{"order_id": "{unique}", "customer_id": "c", "amount": 1e999}}')
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["field"] == "amount"
    assert total_events(store) == before


@pytest.mark.parametrize(("metadata", "words"), [
    ('{"user": "a\\u0000"}', "NUL"),
    ('{"user": "\\ud800"}', "lone surrogate"),
    (DEEP, "nested deeper"),
    ('{"a": ' * 2000 + "1" + "}" * 2000, "JSON object"),
    ('{"n": 1e999}', "not finite"),
])
def test_hostile_metadata_header_is_422(client, store, unique, metadata, words) -> None:
    before = total_events(store)
    response = post_raw(client, "ReceiveStock", json.dumps({"product": unique, "quantity": 1}),
                        **{"X-Metadata": metadata})
    assert response.status_code == 422, response.text
    (error,) = response.json()["errors"]
    assert error["field"] == "x-metadata" and words in error["message"], error
    assert total_events(store) == before


def test_a_stream_belongs_to_the_aggregate_type_that_created_it(orders_client, store,
                                                                 unique) -> None:
    placed = orders_client.post("/commands/PlaceOrder", json={
        "order_id": unique, "customer_id": "c1", "amount": 5})
    assert placed.status_code == 201
    customer = orders_client.post("/commands/RegisterCustomer", json={
        "customer_id": unique, "name": "Ann"})
    assert customer.status_code == 409, customer.text
    assert customer.json()["owner"] == "Order"
    assert "belongs to aggregate type 'Order'" in customer.json()["detail"]
    renamed = orders_client.post("/commands/RenameCustomer", json={
        "customer_id": unique, "name": "Bo"})
    assert renamed.status_code == 409, renamed.text
    assert [e.stream_type for e in store.read_stream(unique)] == ["Order"]


def test_the_append_itself_refuses_another_types_stream(store, unique) -> None:
    """Also without the aggregate load in front (a racing writer, or another service)."""
    from eventfold.write_model import NewEvent
    from eventfold.write_model.persistence.store import StreamOwnedByAnotherType
    from examples.orders import OrderPlaced

    event = OrderPlaced(customer_id="c", amount=1.0)
    store.append("Order", unique, 0, [NewEvent.of(event, {})])
    with pytest.raises(StreamOwnedByAnotherType) as refused:
        store.append("Customer", unique, 1, [NewEvent.of(event, {})])
    assert refused.value.owner == "Order"
    assert len(store.read_stream(unique)) == 1


def test_a_command_id_reused_with_another_payload_is_409(client, store, unique) -> None:
    key = str(uuid.uuid4())
    first = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1,
                                                        "command_id": key})
    same = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 1,
                                                       "command_id": key})
    other = client.post("/commands/ReceiveStock", json={"product": unique, "quantity": 2},
                        headers={"Idempotency-Key": key})
    assert (first.status_code, same.status_code, other.status_code) == (201, 200, 409)
    assert same.json()["replayed"] is True
    assert "already used with a different payload" in other.json()["detail"]
    assert len(store.read_stream(unique)) == 1


# -- property tests over every command route -----------------------------------------------------
hostile_text = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=8),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfff", "\x01\x1f\x7f", "\u2028", "😀"]),
)
hostile_numbers = st.one_of(
    st.integers(), st.floats(), st.sampled_from(["1e999", "-1e999", "1e-999", "NaN",
                                                 "Infinity", "99999999999999999999999"]),
)


def _leaf(value: object) -> str:
    """JSON text of a leaf; number literals given as strings are written raw (1e999)."""
    if isinstance(value, str) and value[:1] in "-1923456780NI" and value not in ("", "-"):
        try:
            float(value)
            return value
        except ValueError:
            pass
    if (isinstance(value, float) and value != value) or value in (float("inf"), float("-inf")):
        return "1e999"
    return json.dumps(value)


json_text = st.recursive(
    st.one_of(st.none(), st.booleans(), hostile_text, hostile_numbers).map(_leaf),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
        st.dictionaries(hostile_text.map(json.dumps), inner, max_size=3).map(
            lambda d: "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}")),
    max_leaves=8,
)


def _command_routes(app) -> list[tuple[str, list[str]]]:
    """(command name, its body fields) for every command route in the app's OpenAPI."""
    spec = app.openapi()
    routes = []
    for path, operations in spec["paths"].items():
        if not path.startswith("/commands/") or "post" not in operations:
            continue
        ref = operations["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        routes.append((path.rsplit("/", 1)[1], sorted(schema["properties"])))
    return routes


EXAMPLES = ["inventory", "sales", "orders", "point_of_sale"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_generated_hostile_bodies_never_5xx_on_any_command_route(stack_settings, store,
                                                                  example) -> None:
    import importlib

    app = importlib.import_module(f"examples.{example}").app
    app.runtime(stack_settings).setup()
    api = app.runtime(stack_settings).command_api()
    routes = _command_routes(api)
    assert routes, "every example has commands"
    with TestClient(api) as test_client:

        @settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow])
        @given(route=st.sampled_from(routes), data=st.data())
        def check(route: tuple[str, list[str]], data: st.DataObject) -> None:
            command, fields = route
            chosen = data.draw(st.lists(st.sampled_from([*fields, "extra"]), unique=True,
                                        max_size=len(fields) + 1))
            body = "{" + ",".join(f"{json.dumps(f)}:{data.draw(json_text)}"
                                  for f in chosen) + "}"
            metadata = data.draw(st.one_of(st.none(), json_text))
            headers = {"content-type": "application/json"}
            if metadata is not None:
                headers["X-Metadata"] = metadata.encode("ascii", "backslashreplace").decode()
            before = total_events(store)
            response = test_client.post(f"/commands/{command}",
                                        content=body.encode("utf-8", "surrogatepass"),
                                        headers=headers)
            assert response.status_code < 500, (command, body, response.text)
            written = total_events(store) - before
            assert (written > 0) == (response.status_code == 201), (command, body, written)

        check()

