"""The command API's bypass of the router (``command_dispatch``) serves its hot path: for
every request it must answer exactly what the router would. A differential property test
sends the same request to the app both ways (a deterministic bus stands in for the event
store: what is
compared is the HTTP layer, which is all the two paths differ in)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventfold.write_model.commands import Command, CommandRegistry, CommandResult
from eventfold.write_model.domain.aggregate import DomainError
from eventfold.write_model.http import create_command_app
from eventfold.write_model.persistence.store import (
    CommandIdReused,
    ConcurrencyError,
    StoreUnavailable,
    StreamNotFound,
)
from examples import inventory


class _Outcomes:
    """What a command "does", by its fields: every kind of answer the API gives."""

    def __init__(self) -> None:
        self.registry: CommandRegistry = inventory.app.commands

    async def execute(self, command: Command, metadata: dict[str, Any] | None = None,
                      correlation_id: str | None = None) -> CommandResult:
        data = command.model_dump()
        product, quantity = str(data.get("product")), int(data.get("quantity", 0))
        match product[:1]:
            case "c":
                raise ConcurrencyError(product, 1, 2)
            case "d":
                raise DomainError(f"cannot ship {quantity}")
            case "n":
                raise StreamNotFound(product)
            case "r":
                raise CommandIdReused(command.command_id or uuid.UUID(int=0))
            case "u":
                raise StoreUnavailable("the database is down")
            case "z":
                raise RuntimeError("a bug")
        replayed = command.command_id is not None and quantity % 2 == 0
        return CommandResult(stream_id=product, version=quantity,
                             event_ids=[uuid.uuid5(uuid.NAMESPACE_URL, product)] * (quantity % 3),
                             global_positions=[quantity], replayed=replayed)


def _clients() -> tuple[TestClient, TestClient]:
    bus: Any = _Outcomes()
    return tuple(TestClient(create_command_app(bus, api_token=None, skip_router=skip),
                            raise_server_exceptions=False) for skip in (True, False))


FAST, ROUTED = _clients()

_numbers = st.one_of(st.integers(-10, 2_000_000), st.integers(), st.floats(allow_nan=False),
                     st.sampled_from([-0.0, 0.0, 5.0, 1e308, 2.0**63, -1.5]))
_scalars = st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=8),
                     st.sampled_from(["5", "", "\x00", "\ud800", "apples", "c1", "d1", "n1",
                                      "r1", "u1", "z1"]))
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


def _encoded(value: Any) -> bytes:
    """As JSON (lone surrogates escaped, integers of any size: what a client may send)."""
    return json.dumps(value).encode()


_fields = st.fixed_dictionaries({}, optional={
    "product": _scalars, "quantity": _numbers | _scalars,
    "command_id": st.uuids().map(str) | _scalars, "expected_version": _numbers | _scalars,
    "extra": _scalars})
_bodies = st.one_of(_fields.map(_encoded), _json.map(_encoded),
                    st.binary(max_size=20), st.sampled_from([b"", b"{", b"[]", b"null"]))
_header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)
_headers = st.fixed_dictionaries({}, optional={
    "idempotency-key": st.uuids().map(str) | _header_text,
    "x-correlation-id": _header_text | st.just("a" * 300),
    "x-metadata": st.sampled_from(['{"user": "ann"}', "[]", "{", '{"a": "\\u0000"}', "1"]),
    "content-type": st.sampled_from(["application/json", "text/plain"])})
_paths = st.sampled_from(["/commands/ReceiveStock", "/commands/ShipStock", "/commands/Nope",
                          "/commands/ReceiveStock/", "/commands/", "/commands/receivestock"])


def _answer(client: TestClient, path: str, body: bytes, headers: dict[str, str]
            ) -> tuple[int, Any, str | None]:
    response = client.post(path, content=body, headers=headers)
    try:
        content: Any = response.json()
    except ValueError:
        content = response.text
    return response.status_code, content, response.headers.get("retry-after")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_paths, _bodies, _headers)
@example("/commands/ReceiveStock", b'{"product": "x", "quantity": -0.0}', {})
@example("/commands/ReceiveStock", b'{"product": "x", "quantity": 5.0}', {})
@example("/commands/ReceiveStock", b'{"product": "x", "quantity": 1e308}', {})
def test_the_fast_path_answers_what_the_router_would(path: str, body: bytes,
                                                      headers: dict[str, str]) -> None:
    fast = _answer(FAST, path, body, headers)
    assert fast == _answer(ROUTED, path, body, headers)
    assert fast[0] != 500 or (body.find(b'"z') >= 0), fast  # only the bus's own bug is a 500


def test_a_positive_field_given_minus_zero_is_a_422_naming_it() -> None:
    status, content, _ = _answer(FAST, "/commands/ReceiveStock",
                                 b'{"product": "x", "quantity": -0.0}', {})
    assert status == 422, content
    assert [e["field"] for e in content["errors"]] == ["quantity"]
    assert "greater than 0" in content["errors"][0]["message"]
